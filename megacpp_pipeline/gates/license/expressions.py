"""SPDX licence expressions: parsed per the SPDX grammar into a canonical tree (AND binds
tighter than OR, `X+`, `WITH`), every id and exception checked against the pinned lists, and
deprecated ids replaced. Bad input never raises; what is wrong is in `.errors`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from typing import Literal

import license_expression

from megacpp_pipeline.gates.license.spdx import (
    ADDITION_REF,
    LICENSE_REF,
    licensing,
    spdx_lists,
)


@dataclass(frozen=True)
class LicenseTerm:
    """One licence, optionally `+` (or later) and optionally `WITH` an exception."""

    license: str  # canonical SPDX id, or a LicenseRef-/DocumentRef- reference
    or_later: bool = False
    exception: str | None = None

    def render(self) -> str:
        text = self.license + ("+" if self.or_later else "")
        return f"{text} WITH {self.exception}" if self.exception else text


@dataclass(frozen=True)
class Combination:
    operator: Literal["AND", "OR"]
    parts: tuple[LicenseTerm | Combination, ...]

    def render(self) -> str:
        rendered = []
        for part in self.parts:
            text = part.render()
            # AND binds tighter than OR: only an OR inside an AND needs parentheses
            if isinstance(part, Combination) and part.operator == "OR" and self.operator == "AND":
                text = f"({text})"
            rendered.append(text)
        return f" {self.operator} ".join(rendered)


ExpressionNode = LicenseTerm | Combination


@dataclass(frozen=True)
class ParsedExpression:
    """An expression as written, its canonical tree, and everything wrong with it."""

    text: str
    tree: ExpressionNode | None
    errors: tuple[str, ...] = ()
    deprecated: tuple[str, ...] = ()  # "GPL-2.0+ -> GPL-2.0-or-later", ...

    @property
    def is_valid(self) -> bool:
        return self.tree is not None and not self.errors

    @property
    def normalized(self) -> str | None:
        return self.tree.render() if self.tree is not None else None


def parse_expression(text: str) -> ParsedExpression:
    """Parse per the SPDX grammar and validate every id and exception against the pinned
    SPDX lists. Never raises on bad input: what is wrong is in `.errors`."""
    return _parse_cached(text.strip())


# An operator with no operand on one side: license-expression drops a trailing one once
# there are two operands (`MIT AND BSD-3-Clause AND` parses as `MIT AND BSD-3-Clause`), where
# SPDX's grammar (SPDX 2.3, Annex D) has both operands of AND, OR and WITH required.
_OPERATOR = r"(?<![^\s()])(?:AND|OR|WITH)(?![^\s()])"  # a word of its own (not LicenseRef-x-AND)
_DANGLING = re.compile(rf"(?i)(?:^|\()\s*{_OPERATOR}|{_OPERATOR}\s*(?:$|\)|{_OPERATOR})")


@cache
def _parse_cached(text: str) -> ParsedExpression:
    if not text:
        return ParsedExpression(text, None, ("empty expression",))
    if (dangling := _DANGLING.search(text)) is not None:
        where = dangling.group().strip(" (")
        return ParsedExpression(text, None, (f"does not parse: {where!r} lacks an operand",))
    try:
        raw = licensing().parse(text, validate=False, strict=False)
    except Exception as error:  # the parser raises several unrelated types on bad input
        return ParsedExpression(text, None, (f"does not parse: {error}",))
    if raw is None:
        return ParsedExpression(text, None, ("empty expression",))
    errors: list[str] = []
    deprecated: list[str] = []
    tree = _convert(raw, errors, deprecated)
    return ParsedExpression(text, tree, tuple(errors), tuple(deprecated))


def combine_and(expressions: Iterable[ParsedExpression]) -> ParsedExpression:
    """Several expressions that all apply to one file (several tag lines, REUSE sources)."""
    items = list(expressions)
    if len(items) == 1:
        return items[0]
    text = " AND ".join(f"({item.text})" for item in items)
    errors = tuple(error for item in items for error in item.errors)
    deprecated = tuple(dep for item in items for dep in item.deprecated)
    trees = [item.tree for item in items]
    if any(tree is None for tree in trees):
        return ParsedExpression(text, None, errors or ("does not parse",), deprecated)
    return ParsedExpression(text, _join("AND", trees), errors, deprecated)  # type: ignore[arg-type]


def _join(operator: Literal["AND", "OR"], parts: Iterable[ExpressionNode]) -> ExpressionNode:
    flat: list[ExpressionNode] = []
    for part in parts:
        if isinstance(part, Combination) and part.operator == operator:
            flat.extend(part.parts)
        elif part not in flat:  # `MIT AND MIT` says nothing more than `MIT`
            flat.append(part)
    return flat[0] if len(flat) == 1 else Combination(operator, tuple(flat))


def _convert(node: object, errors: list[str], deprecated: list[str]) -> ExpressionNode:
    if isinstance(node, license_expression.LicenseWithExceptionSymbol):
        term = _license_term(node.license_symbol.key, errors, deprecated)
        exception = _exception_id(node.exception_symbol.key, errors, deprecated)
        return LicenseTerm(term.license, term.or_later, exception)
    if isinstance(node, license_expression.LicenseSymbol):
        return _license_term(node.key, errors, deprecated)
    if isinstance(node, license_expression.AND | license_expression.OR):
        operator: Literal["AND", "OR"] = "AND" if isinstance(node, license_expression.AND) else "OR"
        return _join(operator, (_convert(arg, errors, deprecated) for arg in node.args))
    raise TypeError(f"unexpected node {node!r} from license-expression")


def _license_term(key: str, errors: list[str], deprecated: list[str]) -> LicenseTerm:
    if LICENSE_REF.match(key):
        return LicenseTerm(key)
    lists = spdx_lists()
    or_later = False
    canonical = lists.licenses.get(key.lower())
    if canonical is None and key.endswith("+"):
        canonical = lists.licenses.get(key[:-1].lower())
        or_later = canonical is not None
    if canonical is None:
        if key.lower() in lists.exceptions:
            errors.append(f"{key!r} is an exception, used as a licence")
        else:
            errors.append(f"{key!r} is not an SPDX licence id (list {lists.version})")
        return LicenseTerm(key)
    if canonical in lists.deprecated:
        replacement = lists.deprecated[canonical]
        if or_later and replacement is not None and replacement.endswith("-only"):
            replacement = replacement.removesuffix("-only") + "-or-later"
            or_later = False
        shown = canonical + ("+" if or_later else "")
        if replacement is None:
            deprecated.append(f"{shown} (deprecated, no single replacement)")
        else:
            deprecated.append(f"{shown} -> {replacement}")
            canonical = replacement
    return LicenseTerm(canonical, or_later)


def _exception_id(key: str, errors: list[str], deprecated: list[str]) -> str:
    if ADDITION_REF.match(key):
        return key
    lists = spdx_lists()
    canonical = lists.exceptions.get(key.lower())
    if canonical is None:
        if key.lower() in lists.licenses:
            errors.append(f"{key!r} is a licence, used as a WITH exception")
        else:
            errors.append(f"{key!r} is not an SPDX exception id (list {lists.version})")
        return key
    if canonical in lists.deprecated:
        deprecated.append(f"{canonical} (deprecated exception)")
    return canonical
