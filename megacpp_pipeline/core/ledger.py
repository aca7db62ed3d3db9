"""The ledger: one row for every file a stage keeps or drops, so that
collected == kept + sum(dropped by reason) holds exactly (seed: nothing disappears silently).

Drop reasons are an enum so a typo cannot invent a new reason. A gate does not know which
stage it runs as: its rows leave `stage` empty and the stage runner stamps the stage's
registry name on them (`stamp`), so the ledger's stage vocabulary is the registry's.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

import pyarrow as pa


class DropReason(StrEnum):
    # collect
    NOT_INCLUDED = "not_included"  # outside include globs / inside exclude globs
    UNSAFE_PATH = "unsafe_path"  # `..`, absolute, escaping symlink, device file
    SYMLINK = "symlink"  # links are never followed, even inside the root
    ARCHIVE_LIMIT = "archive_limit"  # uncompressed size or file count bound (zip bomb)
    UNREADABLE = "unreadable"
    MALFORMED_RECORD = "malformed_record"  # a JSONL line that is not a valid record
    # a stand-in for content kept elsewhere: a Git LFS pointer, a git-annex link or pointer
    POINTER_FILE = "pointer_file"
    # normalize
    BINARY = "binary"
    UNDECODABLE = "undecodable"
    EMPTY = "empty"
    TOO_LARGE = "too_large"  # over max_file_bytes (sources.yaml, per source overridable)
    LONG_LINES = "long_lines"  # max line length over the limit (minified / data-like)
    MEAN_LINE_LENGTH = "mean_line_length"
    LOW_ALNUM = "low_alnum"
    GENERATED_FILE = "generated_file"
    NOT_CPP = "not_cpp"  # not a C/C++ source extension, or C-only content under keep_c: false
    # quality rules (published code pipelines' per-language filters)
    LOW_QUALITY = "low_quality"  # detail: the rule and its measured value
    # license
    LICENSE_DENIED = "license_denied"
    LICENSE_INVALID = "license_invalid"
    LICENSE_UNKNOWN = "license_unknown"
    # removal requests
    REMOVED_ON_REQUEST = "removed_on_request"  # detail: the removals entry that matched
    # scrub
    SCRUB_FAILED = "scrub_failed"
    # dedup
    EXACT_DUPLICATE = "exact_duplicate"
    NEAR_DUPLICATE = "near_duplicate"
    # benchmark decontamination
    BENCHMARK_CONTAMINATION = "benchmark_contamination"  # detail: benchmark id and task ids
    # enrich
    PARSE_ERROR_RATIO = "parse_error_ratio"
    PARSE_TIMEOUT = "parse_timeout"
    # tokenize
    ROUND_TRIP_FAILED = "round_trip_failed"
    EMPTY_AFTER_TOKENIZE = "empty_after_tokenize"


LEDGER_SCHEMA = pa.schema(
    [
        pa.field("source_id", pa.string(), nullable=False),
        pa.field("path", pa.string(), nullable=False),
        pa.field("stage", pa.string(), nullable=False),
        pa.field("status", pa.string(), nullable=False),  # "kept" | "dropped"
        pa.field("reason", pa.string()),  # DropReason value for dropped rows
        pa.field("detail", pa.string()),  # human-readable: the rule, the expression, ...
        pa.field("dup_of", pa.string()),  # "source_id:path" of the kept representative
        pa.field("license_expression", pa.string()),
        # sha256 of the file's bytes as collected (collect's rows; null where it was not read):
        # what `megacpp explain --sha256` and `diff` look files up by
        pa.field("sha256", pa.string()),
    ],
    metadata={"megacpp.table": "ledger", "megacpp.schema_version": "2"},
)


def drops(
    source_ids: Sequence[str],
    paths: Sequence[str],
    reasons: Sequence[str],
    details: Sequence[str | None] | None = None,
    dup_of: Sequence[str | None] | None = None,
    license_expressions: Sequence[str | None] | None = None,
) -> pa.Table:
    """Ledger rows for dropped files (stage not yet stamped); every sequence is aligned
    with `paths`."""
    n = len(paths)
    empty: list[str | None] = [None] * n
    return pa.table(
        {
            "source_id": pa.array(list(source_ids), pa.string()),
            "path": pa.array(list(paths), pa.string()),
            "stage": pa.array([""] * n, pa.string()),
            "status": pa.array(["dropped"] * n, pa.string()),
            "reason": pa.array([str(r) for r in reasons], pa.string()),
            "detail": pa.array(list(details) if details is not None else empty, pa.string()),
            "dup_of": pa.array(list(dup_of) if dup_of is not None else empty, pa.string()),
            "license_expression": pa.array(
                list(license_expressions) if license_expressions is not None else empty,
                pa.string(),
            ),
            "sha256": pa.nulls(n, pa.string()),
        },
        schema=LEDGER_SCHEMA,
    )


def empty_ledger() -> pa.Table:
    return LEDGER_SCHEMA.empty_table()


def stamp(table: pa.Table, stage: str) -> pa.Table:
    """`table`'s ledger rows as written by `stage` (the registry name of the stage)."""
    column = pa.array([stage] * table.num_rows, pa.string())
    return table.set_column(table.schema.get_field_index("stage"), "stage", column)
