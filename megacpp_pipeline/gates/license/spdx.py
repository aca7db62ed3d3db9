"""The pinned SPDX licence and exception lists (megacpp_pipeline/gates/spdx/*.json): which ids
are real, their canonical spelling, and what a deprecated id is replaced by. The seed rule
validates every id and exception of an expression against these lists, not against a guess.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources

import license_expression

_REF = r"[A-Za-z0-9.\-]+"
LICENSE_REF = re.compile(rf"^(?:DocumentRef-{_REF}:)?LicenseRef-{_REF}$")
ADDITION_REF = re.compile(rf"^(?:DocumentRef-{_REF}:)?AdditionRef-{_REF}$")

# Deprecated ids whose replacement is not the mechanical "-only" / "-or-later" one.
_DEPRECATED_RENAMES = {
    "BSD-2-Clause-FreeBSD": "BSD-2-Clause",
    "BSD-2-Clause-NetBSD": "BSD-2-Clause",
    "StandardML-NJ": "SMLNJ",
    "bzip2-1.0.5": "bzip2-1.0.6",
}


@dataclass(frozen=True)
class SpdxLists:
    """The official SPDX licence and exception ids, as pinned in megacpp_pipeline/gates/spdx."""

    version: str
    licenses: Mapping[str, str]  # lower-case id -> canonical id
    exceptions: Mapping[str, str]
    deprecated: Mapping[str, str | None]  # canonical deprecated id -> replacement, if one


# the folder of SPDX's license and exception lists (data, no module: the licence stage
# names it among its code, so a new list makes its cached decisions stale)
SPDX_DATA = "megacpp_pipeline.gates.spdx"


@cache
def spdx_lists() -> SpdxLists:
    data = resources.files(SPDX_DATA)
    lic = json.loads((data / "spdx-licenses.json").read_text(encoding="utf-8"))
    exc = json.loads((data / "spdx-exceptions.json").read_text(encoding="utf-8"))
    licenses = {item["licenseId"].lower(): item["licenseId"] for item in lic["licenses"]}
    exceptions = {
        item["licenseExceptionId"].lower(): item["licenseExceptionId"] for item in exc["exceptions"]
    }
    deprecated: dict[str, str | None] = {}
    for item in lic["licenses"]:
        if not item["isDeprecatedLicenseId"]:
            continue
        old = item["licenseId"]
        if old.endswith("+"):
            candidate = f"{old[:-1]}-or-later"
        else:
            candidate = _DEPRECATED_RENAMES.get(old, f"{old}-only")
        deprecated[old] = licenses.get(candidate.lower())
    for item in exc["exceptions"]:
        if item["isDeprecatedLicenseId"]:
            deprecated[item["licenseExceptionId"]] = None
    return SpdxLists(lic["licenseListVersion"], licenses, exceptions, deprecated)


@cache
def licensing() -> license_expression.Licensing:
    """A license-expression parser that knows only SPDX ids (not ScanCode's keys)."""
    lists = spdx_lists()
    symbols = [license_expression.LicenseSymbol(key) for key in lists.licenses.values()]
    symbols += [
        license_expression.LicenseSymbol(key, is_exception=True)
        for key in lists.exceptions.values()
    ]
    return license_expression.Licensing(symbols)
