"""The libraries a module's code imports, by installed version: what decides besides our own
code. A stage's code version carries those of its modules (pipeline/registry.py), and a
version's inputs id those of the whole library (pipeline/reuse.py), so an upgrade of
tree-sitter-cpp, tiktoken or google-re2 neither lets the result cache serve the old
decisions nor lets a version computed before it stand. The list is read off the imports, not
kept by hand: a library a gate starts to import is versioned from then on."""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import inspect
import re
import sys
from collections.abc import Sequence
from pathlib import Path


def library_versions(modules: Sequence[str]) -> list[str]:
    """`name==version` of each installed distribution the modules import anywhere in their
    source (a lazy import inside a function too), sorted; Python's `major.minor` first (the
    standard library's codecs, unicodedata and re decide as well). An import that is not
    installed reads `name==absent` (an optional extra: its code path is then another one);
    one that no installed distribution provides, `name==local` (a project's own module on
    the path, a gate added there: versioned as code only where a stage lists it in `code`)."""
    out = {f"python=={sys.version_info.major}.{sys.version_info.minor}"}
    for module in modules:
        out.update(_module_libraries(module))
    return sorted(out, key=lambda x: (not x.startswith("python=="), x))


@functools.cache
def _module_libraries(name: str) -> frozenset[str]:
    found: set[str] = set()
    for top in _imported_names(name):
        if top in sys.stdlib_module_names or top == __name__.split(".")[0]:
            continue
        if importlib.util.find_spec(top) is None:
            found.add(f"{top}==absent")
            continue
        try:  # most distributions are named as what they install (tree-sitter: tree_sitter)
            dists = [importlib.metadata.distribution(top)]
        except importlib.metadata.PackageNotFoundError:
            dists = _distributions_of(top)  # google-re2 installs re2
        if not dists:
            found.add(f"{top}==local")
            continue
        found.update(f"{d.metadata['Name'].lower()}=={d.version}" for d in dists)
    return frozenset(found)


def _distributions_of(top: str) -> list[importlib.metadata.Distribution]:
    """The installed distributions that install the top-level module `top` (by their
    top_level.txt, else their RECORD): `packages_distributions()` parses every
    distribution's metadata for that, 0.14-0.45 CPU s a process."""
    found = []
    for dist in importlib.metadata.distributions():
        tops = dist.read_text("top_level.txt")
        if tops is not None:
            hit = top in tops.split()
        else:
            record = "\n" + (dist.read_text("RECORD") or "")
            hit = f"\n{top}/" in record or f"\n{top}." in record
        if hit:
            found.append(dist)
    return found


# an import statement's top-level name, at the start of a line (a lazy import inside a
# function too); a regex, not ast: parsing every stage's code cost 0.45 CPU s a process
_NAME = rb"[\w.]+(?:[ \t]+as[ \t]+\w+)?"  # `a.b` or `a.b as c`
_IMPORT = re.compile(
    rb"^[ \t]*(?:import[ \t]+(" + _NAME + rb"(?:[ \t]*,[ \t]*" + _NAME + rb")*)"
    rb"|from[ \t]+([A-Za-z_][\w.]*)[ \t]+import\b)",
    re.M,
)


def _imported_names(name: str) -> set[str]:
    """The top-level names a module (or every .py file of a package) imports."""
    module = importlib.import_module(name)
    paths = getattr(module, "__path__", None)
    files = (
        [Path(inspect.getfile(module))]
        if paths is None
        else sorted(f for p in paths for f in Path(p).rglob("*.py"))
    )
    tops: set[str] = set()
    for f in files:
        for m in _IMPORT.finditer(f.read_bytes()):
            names = m.group(1).split(b",") if m.group(1) else [m.group(2)]
            tops.update(n.split()[0].split(b".")[0].decode() for n in names)
    return tops
