"""The license gate over an Arrow table: per file, the licence it rests on (SPDX tags, REUSE
metadata, a standard notice, the repository's declared licence, none, in that order), the
policy's decision, the kept table with the licence columns, the ledger and the stats.

A licence the file's record declares (a JSONL export's `license` field) is another party's
word on the file, like the source's declared licence: where the file says nothing itself it
takes that licence's place (when the policy lets declared licences count), and where the file
does say, both must allow the file (their AND is decided), so a record can narrow what a file
may be used for but never widen it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc

from megacpp_pipeline.core import schemas
from megacpp_pipeline.core.errors import FieldedError
from megacpp_pipeline.core.gate import GateResult
from megacpp_pipeline.core.ledger import DropReason, drops
from megacpp_pipeline.gates.license.config import LicenseConfig
from megacpp_pipeline.gates.license.expressions import combine_and, parse_expression
from megacpp_pipeline.gates.license.header import comment_text, find_spdx_identifiers
from megacpp_pipeline.gates.license.notices import notices_in
from megacpp_pipeline.gates.license.policy import Decision, LicensePolicy, decide
from megacpp_pipeline.gates.license.reuse import (
    ReuseFinding,
    ReuseMetadataError,
    covered_by_reuse,
    reuse_findings,
)
from megacpp_pipeline.gates.license.spdx import spdx_lists

LicenseSource = Literal["file", "reuse", "notice-text", "record", "repo-declared", "none"]


class LicenseInputError(FieldedError, ValueError):
    def __init__(self, missing: list[str]) -> None:
        super().__init__(f"license input lacks normalized_files column(s): {', '.join(missing)}")
        self.missing = missing


_Finding = tuple[LicenseSource, str, tuple[str, ...]]  # (source, origin, expressions)


def _notice_finding(comments: str) -> _Finding | None:
    found = notices_in(comments)
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
    record_licenses: Mapping[str, str] | None = None,
) -> GateResult:
    """Keep the files whose licence policy allows (their columns plus the licence ones,
    schemas.LICENSE_FIELDS); ledger the rest
    with the expression and the reason. `reuse_files` maps POSIX paths relative to the
    source root to the bytes of every REUSE.toml, .reuse/dep5 and *.license file;
    `record_licenses` maps a path to the expression its record declares (module docstring)."""
    missing = [name for name in schemas.NORMALIZED_FILES.names if name not in table.column_names]
    if missing:
        raise LicenseInputError(missing)
    policy = config.policy
    paths: list[str] = table.column("path").to_pylist()
    texts = table.column("text")
    text_values: list[str] = texts.to_pylist()

    # Tags and notices sit in the leading comments: read those once per file, lowercase, and
    # let `in` tests pick the few files worth the exact scans (every notice names one of
    # notices.py's _NOTICE_WORDS; a tag has "pdx-l" in it, and maybe a long s for its s
    # under IGNORECASE).
    comments = [comment_text(t, config.notice_scan_chars) for t in text_values]
    tag_comments = comments  # a shorter head's comments are contained in these
    if config.tag_scan_chars > config.notice_scan_chars:
        tag_comments = [comment_text(t, config.tag_scan_chars) for t in text_values]
    file_tags: dict[int, list[str]] = {}  # the rows that have tags
    maybe_tagged = [k for k, found in enumerate(tag_comments) if "pdx-l" in found]
    if maybe_tagged:
        # Which heads get scanned stays RE2's call (its case folding differs from sre's).
        head = pc.utf8_slice_codeunits(texts.take(maybe_tagged), 0, config.tag_scan_chars)
        tagged = pc.match_substring(head, "spdx-license-identifier", ignore_case=True)
        for k, flag in zip(maybe_tagged, tagged.to_pylist(), strict=True):
            if flag and (tags := find_spdx_identifiers(text_values[k], config.tag_scan_chars)):
                file_tags[k] = tags

    reuse: dict[int, ReuseFinding | None] = {}  # row -> finding, for rows REUSE covers
    reuse_error: str | None = None
    if reuse_files:
        covered = [k for k, flag in enumerate(covered_by_reuse(paths, reuse_files)) if flag]
        try:
            found = reuse_findings(
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

    if record_licenses:
        for k, path in enumerate(paths):
            if (declared := record_licenses.get(path)) is not None:
                findings[k] = _with_record(findings[k], declared, policy)

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


def _with_record(finding: _Finding, declared: str, policy: LicensePolicy) -> _Finding:
    """`finding` once the file's record declares `declared` (the module docstring's rule)."""
    source, origin, expressions = finding
    said = "the licence its JSONL record declares"
    if source in ("repo-declared", "none"):
        if not policy.allow_repo_declared:
            return finding
        return ("record", said, (declared,))
    if not expressions:  # REUSE metadata that cannot be read: invalid whatever the record says
        return finding
    return (source, f"{origin}, and {said}", (*expressions, declared))


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
