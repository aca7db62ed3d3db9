"""The license gate: decides, per file, which licence governs it and whether policy lets it
into the corpus (seed rule: repository badges are too coarse; read machine-parseable
file-level metadata, parse the expression and validate every id and exception against the
real SPDX lists). Sources, in order: SPDX tags, REUSE metadata, a standard notice,
the repository's declared licence, none.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Literal

import license_expression
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field, field_validator

from megacpp_pipeline.core import schemas
from megacpp_pipeline.core.gate import GateResult
from megacpp_pipeline.core.ledger import DropReason, drops

LicenseSource = Literal["file", "reuse", "notice-text", "repo-declared", "none"]
DecisionKind = Literal["allowed", "denied", "invalid", "unknown"]

_REF = r"[A-Za-z0-9.\-]+"
_LICENSE_REF = re.compile(rf"^(?:DocumentRef-{_REF}:)?LicenseRef-{_REF}$")
_ADDITION_REF = re.compile(rf"^(?:DocumentRef-{_REF}:)?AdditionRef-{_REF}$")

# Deprecated ids whose replacement is not the mechanical "-only" / "-or-later" one.
_DEPRECATED_RENAMES = {
    "BSD-2-Clause-FreeBSD": "BSD-2-Clause",
    "BSD-2-Clause-NetBSD": "BSD-2-Clause",
    "StandardML-NJ": "SMLNJ",
    "bzip2-1.0.5": "bzip2-1.0.6",
}


# ---------------------------------------------------------------------------------------
# The pinned SPDX lists


@dataclass(frozen=True)
class SpdxLists:
    """The official SPDX licence and exception ids, as pinned in megacpp_pipeline/spdx."""

    version: str
    licenses: Mapping[str, str]  # lower-case id -> canonical id
    exceptions: Mapping[str, str]
    deprecated: Mapping[str, str | None]  # canonical deprecated id -> replacement, if one


@cache
def spdx_lists() -> SpdxLists:
    data = resources.files("megacpp_pipeline.gates") / "spdx"
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
def _licensing() -> license_expression.Licensing:
    """A license-expression parser that knows only SPDX ids (not ScanCode's keys)."""
    lists = spdx_lists()
    symbols = [license_expression.LicenseSymbol(key) for key in lists.licenses.values()]
    symbols += [
        license_expression.LicenseSymbol(key, is_exception=True)
        for key in lists.exceptions.values()
    ]
    return license_expression.Licensing(symbols)


# ---------------------------------------------------------------------------------------
# Expressions


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


@cache
def _parse_cached(text: str) -> ParsedExpression:
    if not text:
        return ParsedExpression(text, None, ("empty expression",))
    try:
        raw = _licensing().parse(text, validate=False, strict=False)
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
    if _LICENSE_REF.match(key):
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
    if _ADDITION_REF.match(key):
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


# ---------------------------------------------------------------------------------------
# Where a file's licence is written


# What may precede or hold the licence in a C/C++ file's head: whitespace, comments and
# preprocessor lines (include guards often come before the licence comment). A block
# comment ends at the first `*/` or at the end of the head; it is spelled as character-class
# runs rather than `/\*.*?\*/` because sre scans those in a tight C loop instead of
# trying the terminator after every character (3x faster over the demo corpus).
_BLOCK = r"/\*[^*]*(?:\*+[^*/][^*]*)*(?:\*+/|\*+\Z|\Z)"
_DIRECTIVE = (
    r"\#[ \t]*(?=/[/*])"  # Boost.Preprocessor's `# /* ... */`: a null directive + comment
    r"|\#[^\n]*(?:\\\n[^\n]*)*"
)
# Each match: directives, then a block comment or a whole run of line comments (a licence
# header is one run: sre's cost per match, not its scanning, is what such heads spent their
# time on). The match after the last comment has neither group.
_HEAD_COMMENTS = re.compile(
    rf"(?:\s*(?:{_DIRECTIVE}))*\s*(?:(//[^\n]*(?:\n\s*//[^\n]*)*)|({_BLOCK}))?"
)
_LINE_COMMENT_BREAK = re.compile(r"\n\s*//")  # between two line comments of a run
_SPDX_TAG = re.compile(r"SPDX-License-Identifier\s*:\s*(?P<value>.*)", re.IGNORECASE)


def leading_comments(text: str, limit: int = 4096) -> list[str]:
    """The comments before the first line of code, within the first `limit` characters.
    What follows the first code token (string literals included) is not the header."""
    comments: list[str] = []
    pos = 0
    while True:
        match = _HEAD_COMMENTS.match(text, pos, limit)  # as if the text ended at `limit`
        lines, block = match.groups()  # type: ignore[union-attr]  # all of it is optional
        if lines:
            comments += _LINE_COMMENT_BREAK.split(lines[2:])
        elif block:
            comments.append(block[2:].removesuffix("*/"))
        else:
            return comments
        pos = match.end()  # type: ignore[union-attr]


def find_spdx_identifiers(text: str, limit: int = 4096) -> list[str]:
    """Every `SPDX-License-Identifier:` value in the leading comment block (REUSE reads the
    head of the file), in order, duplicates removed. Several values apply together (AND)."""
    found: list[str] = []
    for comment in leading_comments(text, limit):
        for line in comment.splitlines():
            match = _SPDX_TAG.search(line)
            if match is None:
                continue
            value = match.group("value").strip().removesuffix("*/").strip().rstrip("*").strip()
            if value and value not in found:
                found.append(value)
    return found


_NOTICES: list[tuple[str, str, tuple[str, ...]]] = [
    # (expression, notice name, regexes that must all match the flattened lowercase comment)
    (
        "Apache-2.0 WITH LLVM-exception",
        "LLVM Project header",
        (r"part of the llvm project, under the apache license v2\.0 with llvm exceptions",),
    ),
    (
        "MIT OR NCSA",
        "LLVM dual MIT/UIUC header",
        (r"dual licensed under the mit and the university of illinois open source licenses",),
    ),
    (
        "BSL-1.0",
        "Boost Software License reference",
        (r"boost software license,? (?:- )?version 1\.0", r"license_1_0\.txt"),
    ),
    (
        "BSL-1.0",
        "Boost Software License text",
        (
            r"boost software license - version 1\.0",
            r"permission is hereby granted, free of charge, to any person or organization "
            r"obtaining a copy of the software and accompanying documentation covered by "
            r"this license",
        ),
    ),
    (
        "Apache-2.0",
        "Apache License 2.0 header",
        (
            r"licensed under the apache license,? version 2\.0",
            r"you may not use this file except in compliance with the license",
        ),
    ),
    (
        "MPL-2.0",
        "MPL 2.0 header",
        (
            r"this source code form is subject to the terms of the mozilla public license,? "
            r"v\. ?2\.0",
        ),
    ),
    (
        "MIT",
        "MIT licence text",
        (
            r"permission is hereby granted, free of charge, to any person obtaining a copy of "
            r"this software and associated documentation files",
            r"the above copyright notice and this permission notice shall be included in all "
            r"copies or substantial portions of the software",
        ),
    ),
    (
        "Zlib",
        "zlib licence text",
        (
            r"provided 'as-is', without any express or implied warranty",
            r"permission is granted to anyone to use this software for any purpose, including "
            r"commercial applications, and to alter it and redistribute it freely",
            r"the origin of this software must not be misrepresented",
        ),
    ),
    (
        "ISC",
        "ISC licence text",
        (
            r"permission to use, copy, modify, and(?:/or)? distribute this software for any "
            r"purpose with or without fee is hereby granted, provided that the above copyright "
            r"notice and this permission notice appear in all copies",
            r"provided .as is. and the authors? disclaims? all warranties",
        ),
    ),
    (
        "BSD-3-Clause",
        "BSD 3-Clause reference",
        (r"distributed under the terms of the bsd 3-clause license",),
    ),
]
_BSD_CORE = (
    r"redistribution and use in source and binary forms, with or without modification, are "
    r"permitted provided that the following conditions are met",
    r"redistributions of source code must retain the above copyright notice",
    r"redistributions in binary form must reproduce the above copyright notice",
)
_BSD_ENDORSE = r"may (?:not )?be used to endorse or promote products"
_BSD_ADVERTISING = r"all advertising materials mentioning features or use of this software"
# Decoration at a line's start (` * `, `//`, `# `), matched with the newline before it so
# that sre can jump from newline to newline instead of testing `^` at every character.
_LINE_DECOR = re.compile(r"\n[ \t]*\#?[ \t]*(?:\*+|//+|/\*+)?")
_NOTICE_WORDS = ("licen", "permission", "redistribution")  # every notice names one


def match_notice(text: str, limit: int = 8192) -> str | None:
    """The SPDX expression of a standard licence notice in the leading comment, or None.
    Conservative: the notice's defining sentences must be there verbatim (modulo comment
    decoration, case and line wrapping); a 'BSD-style licence' mention is not enough."""
    found = _recognise_notices(text, limit)
    if not found:
        return None
    return " AND ".join(dict.fromkeys(expression for expression, _ in found))


def _recognise_notices(text: str, limit: int) -> list[tuple[str, str]]:
    return _notices_in(_comment_text(text, limit))


def _comment_text(text: str, limit: int) -> str:
    return "\n".join(leading_comments(text, limit)).lower()


def _notices_in(joined: str) -> list[tuple[str, str]]:
    """(expression, notice name) of every notice in the lowercase joined comments."""
    if not any(word in joined for word in _NOTICE_WORDS):
        return []
    flat = _flatten(joined)
    flat = flat.replace("\u2019", "'").replace("\u201c", '"').replace("\u201d", '"')
    # Most notices fail on their first sentence: test it before building a generator.
    found = [
        (expression, name)
        for expression, name, (first, *rest) in _NOTICE_PATTERNS
        if first.search(flat) and all(pattern.search(flat) for pattern in rest)
    ]
    if all(pattern.search(flat) for pattern in _BSD_CORE_PATTERNS):
        if re.search(_BSD_ADVERTISING, flat):
            found.append(("BSD-4-Clause", "BSD 4-Clause licence text"))
        elif re.search(_BSD_ENDORSE, flat):
            found.append(("BSD-3-Clause", "BSD 3-Clause licence text"))
        else:
            found.append(("BSD-2-Clause", "BSD 2-Clause licence text"))
    return found


def _flatten(joined: str) -> str:
    """Comment text without line decoration, every whitespace run one space (what
    `re.sub(r"\\s+", " ", ...)` gives: str.split and `\\s` share Python's whitespace)."""
    undecorated = _LINE_DECOR.sub("\n", "\n" + joined)[1:]
    words = undecorated.split()
    flat = " ".join(words)
    if undecorated[:1].isspace():
        flat = " " + flat
    if words and undecorated[-1].isspace():
        flat += " "
    return flat


_NOTICE_PATTERNS = [
    (expression, name, tuple(re.compile(p) for p in patterns))
    for expression, name, patterns in _NOTICES
]
_BSD_CORE_PATTERNS = tuple(re.compile(p) for p in _BSD_CORE)


# ---------------------------------------------------------------------------------------
# Policy and decision


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
        lists = spdx_lists()
        out = []
        for item in value:
            canonical = lists.licenses.get(item.lower())
            if canonical is None:
                raise ValueError(f"{item!r} is not an SPDX licence id (list {lists.version})")
            out.append(canonical)
        return out

    @field_validator("allowed_exceptions")
    @classmethod
    def _real_exception_ids(cls, value: list[str]) -> list[str]:
        lists = spdx_lists()
        out = []
        for item in value:
            canonical = lists.exceptions.get(item.lower())
            if canonical is None and not _ADDITION_REF.match(item):
                raise ValueError(f"{item!r} is not an SPDX exception id (list {lists.version})")
            out.append(canonical or item)
        return out

    @field_validator("allowed_licenserefs")
    @classmethod
    def _refs(cls, value: list[str]) -> list[str]:
        for item in value:
            if not (_LICENSE_REF.match(item) or _ADDITION_REF.match(item)):
                raise ValueError(f"{item!r} is not a LicenseRef-/AdditionRef- reference")
        return value


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


def _evaluate(node: ExpressionNode, policy: LicensePolicy) -> tuple[bool, str]:
    if isinstance(node, LicenseTerm):
        refs = {ref.lower() for ref in policy.allowed_licenserefs}
        if _LICENSE_REF.match(node.license):
            if node.license.lower() not in refs:
                return False, f"{node.license} is not an allowed LicenseRef"
        elif node.license not in policy.allowed_licenses:
            return False, f"{node.license} is not on the allow list"
        if node.exception is not None:
            exceptions = set(policy.allowed_exceptions) | {
                ref for ref in policy.allowed_licenserefs if _ADDITION_REF.match(ref)
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


# ---------------------------------------------------------------------------------------
# REUSE metadata (FSFE's reuse package reads it; we only hand it the files)


def is_reuse_metadata_path(path: str) -> bool:
    """Files the collector must hand to this gate: REUSE.toml anywhere, the root
    .reuse/dep5, and `<file>.license` sidecars."""
    name = PurePosixPath(path).name
    return (
        name == "REUSE.toml"
        or path == ".reuse/dep5"
        or (name.endswith(".license") and name != ".license")
    )


class ReuseMetadataError(ValueError):
    """REUSE.toml / .reuse/dep5 of a source cannot be read; names the file and the cause."""


@dataclass(frozen=True)
class _ReuseFinding:
    expressions: tuple[str, ...]
    source: LicenseSource  # "file" when only the file's own tags were found
    detail: str


def _reuse_findings(
    paths: list[str], file_tags: list[list[str]], reuse_files: Mapping[str, bytes]
) -> list[_ReuseFinding | None]:
    """Resolve every file through reuse's Project so that REUSE's precedence rules
    (sidecar replaces the file's own tags; REUSE.toml closest / aggregate / override;
    dep5 aggregates) are the library's, not ours. The project is a scratch directory
    holding the metadata files and, for each C/C++ file, a stub carrying only the tags we
    accepted from its leading comment."""
    from reuse.exceptions import ReuseError
    from reuse.project import Project

    with tempfile.TemporaryDirectory(prefix="megacpp-reuse-") as scratch:
        root = Path(scratch)
        for rel, content in reuse_files.items():
            target = _inside(root, rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
        for rel, tags in zip(paths, file_tags, strict=True):
            target = _inside(root, rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("".join(f"SPDX-License-Identifier: {tag}\n" for tag in tags))
        try:
            project = Project.from_directory(root)
        except (ReuseError, UnicodeDecodeError, OSError) as error:
            where = getattr(error, "source", None) or "REUSE metadata"
            # name files as the source does, never by the scratch dir (the ledger must be
            # the same on every run)
            message = f"{where}: {error}".replace(f"{root}/", "").replace(str(root), ".")
            raise ReuseMetadataError(message) from error
        findings: list[_ReuseFinding | None] = []
        for rel in paths:
            infos = project.reuse_info_of(root / rel)
            expressions: list[str] = []
            origins: list[str] = []
            only_header = True
            for info in infos:
                if not info.spdx_expressions:
                    continue
                expressions.extend(sorted(str(expr) for expr in info.spdx_expressions))
                kind = info.source_type.value if info.source_type else "unknown"
                only_header &= kind == "file-header"
                origins.append(f"{info.source_path} ({kind})")
            if not expressions:
                findings.append(None)
                continue
            source: LicenseSource = "file" if only_header else "reuse"
            findings.append(_ReuseFinding(tuple(expressions), source, "; ".join(origins)))
        return findings


def _covered_by_reuse(paths: list[str], reuse_files: Mapping[str, bytes]) -> list[bool]:
    """Which files REUSE metadata can speak for: a sidecar, dep5 (covers everything), or an
    annotation of some REUSE.toml matching (reuse's own glob matcher decides). The rest
    skip the scratch project, which costs about 2 ms a file."""
    from reuse.exceptions import ReuseError
    from reuse.global_licensing import ReuseTOML

    if ".reuse/dep5" in reuse_files:
        return [True] * len(paths)
    sidecars = {rel.removesuffix(".license") for rel in reuse_files if rel.endswith(".license")}
    tomls: list[tuple[str, ReuseTOML]] = []
    for rel, content in reuse_files.items():
        if PurePosixPath(rel).name != "REUSE.toml":
            continue
        try:
            toml = ReuseTOML.from_toml(content.decode("utf-8"), rel)
        except (ReuseError, UnicodeDecodeError):
            return [True] * len(paths)  # the project load reports the error for every file
        directory = PurePosixPath(rel).parent.as_posix()
        tomls.append(("" if directory == "." else directory + "/", toml))
    return [
        path in sidecars
        or any(
            path.startswith(prefix) and toml.find_annotations_item(path[len(prefix) :]) is not None
            for prefix, toml in tomls
        )
        for path in paths
    ]


def _inside(root: Path, rel: str) -> Path:
    pure = PurePosixPath(rel)
    if pure.is_absolute() or ".." in pure.parts or not pure.parts:
        raise ReuseMetadataError(f"{rel!r}: path escapes the source root")
    return root.joinpath(*pure.parts)


# ---------------------------------------------------------------------------------------
# The gate


class LicenseConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    policy: LicensePolicy = Field(default_factory=LicensePolicy)
    tag_scan_chars: int = Field(4096, gt=0)  # REUSE reads SPDX tags from the file's head
    recognise_notices: bool = True
    notice_scan_chars: int = Field(8192, gt=0)  # a full BSD/MIT text fits comfortably


class LicenseInputError(ValueError):
    def __init__(self, missing: list[str]) -> None:
        super().__init__(f"license input lacks normalized_files column(s): {', '.join(missing)}")
        self.missing = missing


_Finding = tuple[LicenseSource, str, tuple[str, ...]]  # (source, origin, expressions)


def _notice_finding(comments: str) -> _Finding | None:
    found = _notices_in(comments)
    if not found:
        return None
    names = ", ".join(name for _, name in found)
    return ("notice-text", f"notice: {names}", tuple(expression for expression, _ in found))


_DROP_REASON = {
    "denied": DropReason.LICENSE_DENIED,
    "invalid": DropReason.LICENSE_INVALID,
    "unknown": DropReason.LICENSE_UNKNOWN,
}


def run(
    table: pa.Table,
    config: LicenseConfig,
    *,
    declared_license: str | None,
    reuse_files: Mapping[str, bytes] | None = None,
) -> GateResult:
    """Keep the files whose licence policy allows (their columns plus the licence ones,
    schemas.LICENSE_FIELDS); ledger the rest
    with the expression and the reason. `reuse_files` maps POSIX paths relative to the
    source root to the bytes of every REUSE.toml, .reuse/dep5 and *.license file."""
    missing = [name for name in schemas.NORMALIZED_FILES.names if name not in table.column_names]
    if missing:
        raise LicenseInputError(missing)
    policy = config.policy
    paths: list[str] = table.column("path").to_pylist()
    texts = table.column("text")
    text_values: list[str] = texts.to_pylist()

    # Tags and notices sit in the leading comments: read those once per file, lowercase, and
    # let `in` tests pick the few files worth the exact scans (every notice names one of
    # _NOTICE_WORDS; a tag has "pdx-l" in it, and maybe a long s for its s under IGNORECASE).
    comments = [_comment_text(t, config.notice_scan_chars) for t in text_values]
    tag_comments = comments  # a shorter head's comments are contained in these
    if config.tag_scan_chars > config.notice_scan_chars:
        tag_comments = [_comment_text(t, config.tag_scan_chars) for t in text_values]
    file_tags: dict[int, list[str]] = {}  # the rows that have tags
    maybe_tagged = [k for k, found in enumerate(tag_comments) if "pdx-l" in found]
    if maybe_tagged:
        # Which heads get scanned stays RE2's call (its case folding differs from sre's).
        head = pc.utf8_slice_codeunits(texts.take(maybe_tagged), 0, config.tag_scan_chars)
        tagged = pc.match_substring(head, "spdx-license-identifier", ignore_case=True)
        for k, flag in zip(maybe_tagged, tagged.to_pylist(), strict=True):
            if flag and (tags := find_spdx_identifiers(text_values[k], config.tag_scan_chars)):
                file_tags[k] = tags

    reuse: dict[int, _ReuseFinding | None] = {}  # row -> finding, for rows REUSE covers
    reuse_error: str | None = None
    if reuse_files:
        covered = [k for k, flag in enumerate(_covered_by_reuse(paths, reuse_files)) if flag]
        try:
            found = _reuse_findings(
                [paths[k] for k in covered], [file_tags.get(k, []) for k in covered], reuse_files
            )
        except ReuseMetadataError as error:
            reuse_error = str(error)
        else:
            reuse = dict(zip(covered, found, strict=True))

    # What each row's licence rests on. A source repeats few of these (and its headers), so
    # each distinct one is recognised, parsed, decided and worded once.
    if declared_license and policy.allow_repo_declared:
        fallback: _Finding = ("repo-declared", "the source's declared licence", (declared_license,))
    else:
        fallback = ("none", "no SPDX tag, REUSE entry or known notice", ())
    notice_findings: dict[str, _Finding | None] = {}  # by leading comment text
    findings: list[_Finding] = []
    for k, comment in enumerate(comments):
        finding = reuse.get(k)
        if reuse_error is not None:
            findings.append(("reuse", reuse_error, ()))
        elif finding is not None:
            findings.append((finding.source, finding.detail, finding.expressions))
        elif k in file_tags and k not in reuse:
            origin = "SPDX-License-Identifier in the leading comment"
            findings.append(("file", origin, tuple(file_tags[k])))
        elif config.recognise_notices:
            if comment not in notice_findings:
                notice_findings[comment] = _notice_finding(comment)
            findings.append(notice_findings[comment] or fallback)
        else:
            findings.append(fallback)

    verdicts: dict[_Finding, _Verdict] = {}
    decided: dict[str, Decision] = {}
    stats: Counter[str] = Counter()
    for finding_key, count in Counter(findings).items():  # first-seen order, as rows come
        source, origin, exprs = finding_key
        verdict = _verdict(exprs, origin, policy, decided, reuse_error is not None)
        verdicts[finding_key] = verdict
        stats[f"decision:{verdict.decision.decision}"] += count
        stats[f"source:{source}"] += count
        shown = verdict.expression if verdict.expression is not None else "(none)"
        stats[f"expr:{shown}"] += count
        if verdict.deprecated:
            stats["deprecated_ids"] += count
    rows = [verdicts[finding_key] for finding_key in findings]

    keep = [row.decision.decision == "allowed" for row in rows]
    base = table
    if not all(keep):  # filtering copies every column, texts included
        base = base.filter(pa.array(keep, pa.bool_()))
    kept_idx = [k for k, flag in enumerate(keep) if flag]
    kept = schemas.extend(
        base,
        {
            "license_expression": pa.array([rows[k].expression for k in kept_idx], pa.string()),
            "license_source": pa.array([findings[k][0] for k in kept_idx], pa.string()),
            "license_decision": pa.array(
                [rows[k].decision.decision for k in kept_idx], pa.string()
            ),
            "license_detail": pa.array([rows[k].detail for k in kept_idx], pa.string()),
        },
        schemas.LICENSE_FIELDS,
        "licensed_files",
    )
    dropped_idx = [k for k, flag in enumerate(keep) if not flag]
    source_ids = table.column("source_id").to_pylist()
    dropped = drops(
        [source_ids[k] for k in dropped_idx],
        [paths[k] for k in dropped_idx],
        [_DROP_REASON[rows[k].decision.decision] for k in dropped_idx],
        details=[f"{findings[k][0]}: {rows[k].detail}" for k in dropped_idx],
        license_expressions=[rows[k].expression for k in dropped_idx],
    )
    stats["files_in"] = table.num_rows
    stats["files_kept"] = kept.num_rows
    return GateResult(kept=kept, dropped=dropped, stats=stats)


@dataclass(frozen=True)
class _Verdict:
    expression: str | None  # as the table and the ledger show it
    decision: Decision
    detail: str
    deprecated: bool


def _verdict(
    expressions: tuple[str, ...],
    origin: str,
    policy: LicensePolicy,
    decided: dict[str, Decision],
    reuse_unreadable: bool,
) -> _Verdict:
    parsed = combine_and(parse_expression(e) for e in expressions) if expressions else None
    if reuse_unreadable:
        decision = Decision("invalid", "REUSE metadata unreadable")
    elif parsed is None:
        decision = decide(None, policy)
    else:  # distinct findings can share an expression: decide each text once
        decision = decided.get(parsed.text) or decided.setdefault(
            parsed.text, decide(parsed, policy)
        )
    detail = f"{origin}: {decision.reason}"
    if parsed is not None and parsed.deprecated:
        detail += "; deprecated: " + ", ".join(parsed.deprecated)
    shown = None if parsed is None else (parsed.normalized or parsed.text)
    if parsed is not None and not parsed.is_valid:
        shown = parsed.text  # keep what was written, so the ledger shows the typo
    return _Verdict(shown, decision, detail, parsed is not None and bool(parsed.deprecated))


def markdown_summary(stats: Mapping[str, int], top: int = 15) -> str:
    """Decisions, licence sources and the most common expressions, as markdown tables."""

    def table(title: str, prefix: str, limit: int | None = None) -> str:
        rows = sorted(
            ((key.removeprefix(prefix), count) for key, count in stats.items()
             if key.startswith(prefix)),
            key=lambda item: (-item[1], item[0]),
        )  # fmt: skip
        if limit is not None:
            rows = rows[:limit]
        lines = [f"| {title} | files |", "|---|---:|"]
        lines += [f"| `{name}` | {count} |" for name, count in rows]
        return "\n".join(lines)

    parts = [
        f"**{stats.get('files_kept', 0)} of {stats.get('files_in', 0)} files allowed** "
        f"(SPDX list {spdx_lists().version})",
        table("decision", "decision:"),
        table("license_source", "source:"),
        table(f"expression (top {top})", "expr:", top),
    ]
    return "\n\n".join(parts) + "\n"
