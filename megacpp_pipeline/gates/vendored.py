"""Vendored code: files a source carries from another project (pythran's copy of Boost, a
`third_party/` tree). Decided from the path alone: the usual directory names, plus the path
prefixes a source's catalog entry declares for copies that sit under no such name.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

VENDORED_DIRS = (
    "third_party",
    "third-party",
    "thirdparty",
    "3rdparty",
    "3rd_party",
    "3rd-party",
    "vendor",
    "vendored",
    "external",
    "extern",
    "deps",
)  # compared case-insensitively with every directory of the path (not the file name)


def is_vendored(
    path: str, extra_prefixes: Sequence[str] = (), dirs: Collection[str] = VENDORED_DIRS
) -> bool:
    """Does `path` (POSIX, relative to the source root) lie in a vendored tree?"""
    directories = path.split("/")[:-1]
    wanted = {d.lower() for d in dirs}
    if any(part.lower() in wanted for part in directories):
        return True
    return any(_under(path, prefix) for prefix in extra_prefixes)


def vendored_mask(
    paths: pa.Array, extra_prefixes: Sequence[str] = (), dirs: Collection[str] = VENDORED_DIRS
) -> np.ndarray:
    """is_vendored over a whole column, as one RE2 pass (same answers)."""
    alternatives = []
    if dirs:
        names = "|".join(re.escape(d.lower()) for d in dirs)
        alternatives.append(f"(?i:(?:^|/)(?:{names})/)")
    for prefix in extra_prefixes:
        bare = prefix.strip("/")
        if bare:
            alternatives.append(f"^{re.escape(bare)}(?:/|$)")
        else:
            alternatives.append("^")  # an empty prefix declares the whole source vendored
    if not alternatives:
        return np.zeros(len(paths), dtype=bool)
    hits = pc.match_substring_regex(paths, "|".join(f"(?:{a})" for a in alternatives))
    return np.asarray(hits.to_numpy(zero_copy_only=False), dtype=bool)


def _under(path: str, prefix: str) -> bool:
    bare = prefix.strip("/")
    return not bare or path == bare or path.startswith(bare + "/")
