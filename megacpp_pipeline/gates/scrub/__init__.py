"""Scrub gate: decides which spans of a file's text are personal data or secrets and replaces
them with stable placeholders. Seed rule: "normalize emails, IP addresses, API keys, SSH keys,
and machine-local paths into stable placeholders before the shard is tokenized".

Regex PII over-fires on code (BigCode measured 69.8% precision for a naive email regex), so
every detector pairs a pattern with C++-aware filters. This module is the gate over Arrow
tables (run, the residual check, the audit, the UI sample); the detectors live beside it:
config.py (every threshold), detectors.py (the registry and how overlaps resolve), screen.py
(one RE2 pass that says which finders a text needs), personal.py, keys.py, vendor_tokens.py,
vendor_rules.py (gitleaks' pinned rule file), issuer_tokens.py, credentials.py (the finders),
re2_bytes.py and plausibility.py (when a matched value is a look-alike, not a secret).
"""

from __future__ import annotations

import hashlib
import hmac
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from megacpp_pipeline.core import schemas
from megacpp_pipeline.core.errors import FieldedError
from megacpp_pipeline.core.gate import GateResult
from megacpp_pipeline.core.ledger import DropReason, drops
from megacpp_pipeline.gates.scrub.config import Placeholders, ScrubConfig
from megacpp_pipeline.gates.scrub.detectors import DETECTORS, Detector, detect
from megacpp_pipeline.gates.scrub.hits import Hit, Kind

__all__ = [
    "AUDIT_SCHEMA",
    "Finding",
    "Kind",
    "Placeholders",
    "ScrubConfig",
    "ScrubError",
    "markdown_sample",
    "residual_findings",
    "residual_table",
    "run",
    "scrub_text",
]


@dataclass(frozen=True)
class Finding:
    kind: Kind
    detector: str
    start_byte: int  # UTF-8 byte offsets in the scrubbed function's input text
    end_byte: int
    value_hash: str  # HMAC-SHA256(audit_salt, value); the value itself is never kept


AUDIT_SCHEMA = pa.schema(
    [
        pa.field("source_id", pa.string(), nullable=False),
        pa.field("path", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("detector", pa.string(), nullable=False),
        pa.field("start_byte", pa.int64(), nullable=False),  # in the gate's input text
        pa.field("end_byte", pa.int64(), nullable=False),
        pa.field("value_hash", pa.string(), nullable=False),
    ],
    metadata={"megacpp.table": "scrub_audit", "megacpp.schema_version": schemas.SCHEMA_VERSION},
)


class ScrubError(FieldedError, ValueError):
    """A file whose scrubbed text still trips a detector (names the file and the detector)."""

    def __init__(self, path: str, finding: Finding) -> None:
        super().__init__(
            f"{path}: {finding.kind} still detected by {finding.detector} "
            f"at bytes {finding.start_byte}-{finding.end_byte} after scrubbing"
        )
        self.path = path
        self.finding = finding


def _value_hash(value: str, config: ScrubConfig) -> str:
    return hmac.new(config.audit_salt.encode(), value.encode(), hashlib.sha256).hexdigest()


def _findings(text: str, hits: list[Hit], config: ScrubConfig) -> list[Finding]:
    findings = []
    ascii_only = text.isascii()
    char_pos = byte_pos = 0
    for hit in hits:
        if ascii_only:
            start_byte, end_byte = hit.start, hit.end
        else:
            byte_pos += len(text[char_pos : hit.start].encode())
            char_pos = hit.start
            start_byte = byte_pos
            end_byte = start_byte + len(text[hit.start : hit.end].encode())
        value = text[hit.start : hit.end]
        findings.append(
            Finding(hit.kind, hit.detector, start_byte, end_byte, _value_hash(value, config))
        )
    return findings


def _replace(text: str, hits: list[Hit], config: ScrubConfig) -> str:
    parts = []
    pos = 0
    for hit in hits:
        parts.append(text[pos : hit.start])
        parts.append(config.placeholders.for_kind(hit.kind))
        pos = hit.end
    parts.append(text[pos:])
    return "".join(parts)


def _scrub(
    text: str, config: ScrubConfig, detectors: Sequence[Detector]
) -> tuple[str, list[Finding]]:
    hits = detect(text, config, detectors)
    if not hits:
        return text, []
    return _replace(text, hits, config), _findings(text, hits, config)


# --------------------------------------------------------------------------- public surface


def scrub_text(text: str, config: ScrubConfig) -> tuple[str, list[Finding]]:
    """The text with every detected value replaced by its kind's placeholder, and what was
    replaced (byte spans in `text`). Deterministic; text already scrubbed comes back as is."""
    return _scrub(text, config, DETECTORS)


def residual_findings(text: str, config: ScrubConfig) -> list[Finding]:
    """What the detectors still find in (scrubbed) text, placeholders excepted: the blocking
    check's evidence, empty for every kept file."""
    return _findings(text, detect(text, config, DETECTORS), config)


def _scan(
    texts: pa.Array | pa.ChunkedArray, config: ScrubConfig, replace: bool
) -> list[tuple[int, str, list[Finding]]]:
    """(row, text after replacement, findings) for every row where a detector fires."""
    out = []
    for row, text in enumerate(texts.to_pylist()):
        hits = detect(text, config, DETECTORS)
        if hits:
            new_text = _replace(text, hits, config) if replace else text
            out.append((row, new_text, _findings(text, hits, config)))
    return out


def _audit_table(
    source_ids: Sequence[str], paths: Sequence[str], findings: Sequence[Sequence[Finding]]
) -> pa.Table:
    cols: dict[str, list[object]] = {name: [] for name in AUDIT_SCHEMA.names}
    for source_id, path, row_findings in zip(source_ids, paths, findings, strict=True):
        for f in row_findings:
            cols["source_id"].append(source_id)
            cols["path"].append(path)
            cols["kind"].append(str(f.kind))
            cols["detector"].append(f.detector)
            cols["start_byte"].append(f.start_byte)
            cols["end_byte"].append(f.end_byte)
            cols["value_hash"].append(f.value_hash)
    return pa.table(cols, schema=AUDIT_SCHEMA)


def residual_table(table: pa.Table, config: ScrubConfig) -> pa.Table:
    """Every detector hit left in a table's `text` (placeholders excepted) as AUDIT_SCHEMA
    rows, spans in that text: the scrubbed_files blocking check passes iff it is empty."""
    texts = table.column("text")
    hits = _scan(texts, config, replace=False)
    sources = table.column("source_id").to_pylist()
    paths = table.column("path").to_pylist()
    return _audit_table(
        [sources[r] for r, _, _ in hits], [paths[r] for r, _, _ in hits], [f for _, _, f in hits]
    )


def run(table: pa.Table, config: ScrubConfig) -> GateResult:
    """Scrub one shard of licensed files (text and content_sha256 replaced, the rest carried
    through, scrub_replacements added), with the audit
    table in extra["audit"]. A file whose output still trips a detector is dropped as
    SCRUB_FAILED rather than kept with a secret in it."""
    missing = [n for n in schemas.LICENSED_FILES.names if n not in table.column_names]
    if missing and not set(missing) <= {f.name for f in schemas.CLASS_FIELDS}:
        raise ValueError(f"scrub input lacks column(s) {', '.join(missing)}")
    texts = table.column("text")
    n = table.num_rows
    source_ids = table.column("source_id").to_pylist()
    paths = table.column("path").to_pylist()

    scrubbed_rows = _scan(texts, config, replace=True)
    residual = _scan(pa.array([t for _, t, _ in scrubbed_rows], pa.string()), config, False)
    failed = {
        scrubbed_rows[i][0]: str(ScrubError(paths[scrubbed_rows[i][0]], findings[0]))
        for i, _, findings in residual
    }
    replaced = [(row, t, f) for row, t, f in scrubbed_rows if row not in failed]

    counts = np.zeros(n, dtype=np.int32)
    kinds: list[list[str]] = [[] for _ in range(n)]
    for row, _, findings in replaced:
        counts[row] = len(findings)
        kinds[row] = sorted({str(f.kind) for f in findings})
    new_texts: pa.Array | pa.ChunkedArray = texts
    new_shas: pa.Array | pa.ChunkedArray = table.column("content_sha256")
    if replaced:
        changed = np.zeros(n, dtype=bool)
        changed[[row for row, _, _ in replaced]] = True
        mask = pa.array(changed)
        new_texts = pc.replace_with_mask(texts, mask, pa.array([t for _, t, _ in replaced]))
        shas = [schemas.text_sha256(t) for _, t, _ in replaced]
        new_shas = pc.replace_with_mask(new_shas, mask, pa.array(shas, pa.string()))

    scrubbed = schemas.extend(
        table,
        {
            "text": new_texts,
            "content_sha256": new_shas,
            "scrub_replacements": pa.array(counts, pa.int32()),
            "scrub_kinds": pa.array(kinds, pa.list_(pa.string())),
        },
        [
            schemas.SCRUBBED_FILES.field("text"),
            schemas.SCRUBBED_FILES.field("content_sha256"),
            *schemas.SCRUB_FIELDS,
        ],
        "scrubbed_files",
    )

    dropped_rows = sorted(failed)
    keep = np.ones(n, dtype=bool)
    keep[dropped_rows] = False
    kept = scrubbed.filter(pa.array(keep)) if dropped_rows else scrubbed
    licenses = table.column("license_expression")
    dropped = drops(
        [source_ids[i] for i in dropped_rows],
        [paths[i] for i in dropped_rows],
        [DropReason.SCRUB_FAILED] * len(dropped_rows),
        details=[failed[i] for i in dropped_rows],
        license_expressions=[licenses[i].as_py() for i in dropped_rows],
    )
    audit = _audit_table(
        [source_ids[row] for row, _, _ in replaced],
        [paths[row] for row, _, _ in replaced],
        [f for _, _, f in replaced],
    )
    result = GateResult(kept=kept, dropped=dropped, extra={"audit": audit})
    result.stats = summary(result)
    result.scanned_clean = _scanned_clean(texts, replaced, keep)
    return result


def _scanned_clean(
    texts: pa.Array | pa.ChunkedArray,
    replaced: Sequence[tuple[int, str, list[Finding]]],
    keep: np.ndarray,
) -> list[str | None] | None:
    """The sha256 of each kept text as `run` inspected it: the input's bytes where no
    detector fired, the replacement where one did (its second pass found nothing left).
    None when the text is not laid out as the schema's string (nothing is vouched for)."""
    try:
        digests = schemas.text_digests(texts)
    except schemas.TextLayoutError:
        return None
    for row, new_text, _ in replaced:
        digests[row] = schemas.text_sha256(new_text)
    out: list[str | None] = [digests[i] for i in np.flatnonzero(keep).tolist()]
    return out


def summary(result: GateResult) -> Counter[str]:
    """The gate's counts, from its output alone (so the stage recounts them over cached rows
    too): files in, kept, scrubbed and failed, the replacements, and each kind's."""
    replacements = result.kept["scrub_replacements"]
    stats: Counter[str] = Counter(
        files_in=result.kept.num_rows + result.dropped.num_rows,
        files_kept=result.kept.num_rows,
        files_scrubbed=int(pc.sum(pc.greater(replacements, 0)).as_py() or 0),
        replacements=int(pc.sum(replacements).as_py() or 0),
        scrub_failed=result.dropped.num_rows,
    )
    stats.update(f"kind:{k}" for k in result.extra["audit"]["kind"].to_pylist())
    return stats


def _markdown_cell(value: str, limit: int = 160) -> str:
    value = value.strip()
    if len(value) > limit:
        value = value[: limit - 1] + "…"
    return value.replace("|", "\\|").replace("`", "'")


def markdown_sample(kept: pa.Table, config: ScrubConfig, max_lines: int | None = None) -> str:
    """A markdown table of redacted lines (after redaction) for the materialization's UI:
    what the placeholders look like in context, never what they replaced."""
    limit = config.sample_lines if max_lines is None else max_lines
    placeholders = [config.placeholders.for_kind(k) for k in Kind]
    rows = ["| file | line | redacted text |", "|---|---:|---|"]
    if kept.num_rows and limit > 0:
        touched = kept.filter(pc.greater(kept.column("scrub_replacements"), 0))
        for path, text in zip(
            touched.column("path").to_pylist(), touched.column("text").to_pylist(), strict=True
        ):
            for lineno, line in enumerate(text.splitlines(), start=1):
                if any(ph in line for ph in placeholders):
                    rows.append(
                        f"| `{_markdown_cell(path, 80)}` | {lineno} | `{_markdown_cell(line)}` |"
                    )
                    if len(rows) - 2 >= limit:
                        return "\n".join(rows)
    if len(rows) == 2:
        return "_no redactions in this partition_"
    return "\n".join(rows)
