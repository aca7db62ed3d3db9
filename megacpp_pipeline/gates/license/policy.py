"""The licence policy: which licences, exceptions and LicenseRefs may enter the corpus, and
the decision (allowed / denied / invalid / unknown) it gives a parsed expression.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from megacpp_pipeline.gates.license.expressions import (
    ExpressionNode,
    LicenseTerm,
    ParsedExpression,
    parse_expression,
)
from megacpp_pipeline.gates.license.spdx import ADDITION_REF, LICENSE_REF, spdx_lists

DecisionKind = Literal["allowed", "denied", "invalid", "unknown"]

_DEFAULT_ALLOWED = [
    "MIT", "BSD-2-Clause", "BSD-3-Clause", "Apache-2.0", "BSL-1.0",
    "ISC", "Zlib", "Unlicense", "CC0-1.0", "MPL-2.0",
]  # fmt: skip


class LicensePolicy(BaseModel):
    """Which licences may enter the corpus. Ids are validated against the SPDX lists, so a
    typo in the allow list fails when the config loads, not silently at decision time."""

    model_config = ConfigDict(extra="forbid")

    allowed_licenses: list[str] = Field(default_factory=lambda: list(_DEFAULT_ALLOWED))
    allowed_exceptions: list[str] = Field(default_factory=lambda: ["LLVM-exception"])
    allowed_licenserefs: list[str] = Field(default_factory=list)  # LicenseRef-/AdditionRef-
    allow_repo_declared: bool = True

    @field_validator("allowed_licenses")
    @classmethod
    def _real_license_ids(cls, value: list[str]) -> list[str]:
        return _replaced(_canonical_ids(value, spdx_lists().licenses, "licence"))

    @field_validator("allowed_exceptions")
    @classmethod
    def _real_exception_ids(cls, value: list[str]) -> list[str]:
        return _canonical_ids(value, spdx_lists().exceptions, "exception", ADDITION_REF)

    @field_validator("allowed_licenserefs")
    @classmethod
    def _refs(cls, value: list[str]) -> list[str]:
        for item in value:
            if not (LICENSE_REF.match(item) or ADDITION_REF.match(item)):
                raise ValueError(f"{item!r} is not a LicenseRef-/AdditionRef- reference")
        return value


def _canonical_ids(
    values: list[str], ids: Mapping[str, str], what: str, reference: re.Pattern[str] | None = None
) -> list[str]:
    """Each id in its canonical SPDX spelling (`ids`: lower-case id -> canonical); one that is
    neither in the list nor a `reference` fails, naming the list's version."""
    out = []
    for item in values:
        canonical = ids.get(item.lower())
        if canonical is None and not (reference is not None and reference.match(item)):
            raise ValueError(f"{item!r} is not an SPDX {what} id (list {spdx_lists().version})")
        out.append(canonical or item)
    return out


def _replaced(ids: list[str]) -> list[str]:
    """Deprecated licence ids as a file's expression reads them (`GPL-2.0` -> `GPL-2.0-only`,
    `GPL-2.0+` -> `GPL-2.0-or-later`): an allow list and an expression must name a licence
    alike, or `allowed_licenses: [GPL-2.0]` would deny a file saying `GPL-2.0`."""
    out: list[str] = []
    for item in ids:
        parsed = parse_expression(item)
        term = parsed.tree
        if parsed.is_valid and isinstance(term, LicenseTerm) and term.exception is None:
            item = term.license + ("+" if term.or_later else "")
        if item not in out:
            out.append(item)
    return out


@dataclass(frozen=True)
class Decision:
    decision: DecisionKind
    reason: str


def decide(expression: ParsedExpression | str | None, policy: LicensePolicy) -> Decision:
    """allowed / denied / invalid / unknown. OR passes if some branch passes, AND needs
    every part, WITH needs both the licence and the exception allowed; `X+` passes when X
    does (the licensee may pick X itself)."""
    if expression is None:
        return Decision("unknown", "no licence found")
    parsed = parse_expression(expression) if isinstance(expression, str) else expression
    if not parsed.is_valid or parsed.tree is None:
        return Decision("invalid", "; ".join(parsed.errors) or "does not parse")
    passes, reason = _evaluate(parsed.tree, policy)
    return Decision("allowed" if passes else "denied", reason)


def _later_of_allowed(license_id: str, policy: LicensePolicy) -> bool:
    """`X-or-later` passes when `X-only` does, as `X+` passes when X does: the licensee may
    pick X itself."""
    base = license_id.removesuffix("-or-later")
    return base != license_id and f"{base}-only" in policy.allowed_licenses


def _evaluate(node: ExpressionNode, policy: LicensePolicy) -> tuple[bool, str]:
    if isinstance(node, LicenseTerm):
        refs = {ref.lower() for ref in policy.allowed_licenserefs}
        if LICENSE_REF.match(node.license):
            if node.license.lower() not in refs:
                return False, f"{node.license} is not an allowed LicenseRef"
        elif node.license not in policy.allowed_licenses and not _later_of_allowed(
            node.license, policy
        ):
            return False, f"{node.license} is not on the allow list"
        if node.exception is not None:
            exceptions = set(policy.allowed_exceptions) | {
                ref for ref in policy.allowed_licenserefs if ADDITION_REF.match(ref)
            }
            if node.exception not in exceptions:
                return False, f"exception {node.exception} is not allowed"
        return True, f"{node.render()} is allowed"
    results = [_evaluate(part, policy) for part in node.parts]
    if node.operator == "OR":
        for (passes, _), part in zip(results, node.parts, strict=True):
            if passes:
                return True, f"allowed via {part.render()}"
        return False, "no branch allowed: " + "; ".join(reason for _, reason in results)
    failing = [reason for passes, reason in results if not passes]
    if failing:
        return False, "; ".join(failing)
    return True, "every part allowed"
