"""The decontamination gate over an Arrow table: every file that shares a window with a task
is dropped (ledgered) or excised, the `matches` side table says which tasks it matched; the
rescan the blocking check runs, and the markdown the UI shows.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from megacpp_pipeline.core.gate import GateResult
from megacpp_pipeline.core.ledger import DropReason, drops
from megacpp_pipeline.core.schemas import TextLayoutError, text_digests, text_sha256
from megacpp_pipeline.corpus import minhash
from megacpp_pipeline.corpus.decontaminate.config import DecontaminateConfig
from megacpp_pipeline.corpus.decontaminate.excise import excise
from megacpp_pipeline.corpus.decontaminate.index import BenchmarkIndex, Contamination

MATCHES_SCHEMA = pa.schema(
    [
        pa.field("source_id", pa.string(), nullable=False),
        pa.field("path", pa.string(), nullable=False),
        pa.field("action", pa.string(), nullable=False),  # dropped | excised
        pa.field("benchmark_id", pa.string(), nullable=False),
        pa.field("task_ids", pa.list_(pa.string()), nullable=False),
        pa.field("shared_sequences", pa.int32(), nullable=False),
        pa.field("excised_spans", pa.int32()),  # excise: cut spans after merging
        pa.field("excised_bytes", pa.int64()),
    ],
    metadata={"megacpp.table": "decontamination_matches", "megacpp.schema_version": "1"},
)


@dataclass(frozen=True)
class RescanFinding:
    source_id: str
    path: str
    benchmark_id: str
    task_ids: tuple[str, ...]
    shared: int

    def __str__(self) -> str:
        tasks = ", ".join(self.task_ids[:5])
        return f"{self.source_id}:{self.path}: {self.benchmark_id} tasks {tasks}"


def _slices(table: pa.Table) -> list[tuple[int, int]]:
    """Row ranges of about minhash.TOKEN_BATCH_BYTES of text (at least one row each)."""
    sizes = pc.binary_length(table["text"]).to_numpy(zero_copy_only=False).astype(np.int64)
    ends = np.cumsum(sizes)
    bounds, lo = [], 0
    while lo < len(sizes):
        base = ends[lo - 1] if lo else 0
        hi = max(int(np.searchsorted(ends, base + minhash.TOKEN_BATCH_BYTES, side="right")), lo + 1)
        bounds.append((lo, hi))
        lo = hi
    return bounds


def _matches(table: pa.Table, index: BenchmarkIndex) -> list[Contamination]:
    out: list[Contamination] = []
    for lo, hi in _slices(table):
        texts = table["text"].slice(lo, hi - lo).to_pylist()
        out += [
            Contamination(c.row + lo, c.benchmark_id, c.task_ids, c.token_spans)
            for c in index.match(texts)
        ]
    return out


def run(table: pa.Table, index: BenchmarkIndex, config: DecontaminateConfig) -> GateResult:
    """Kept rows (excised text where the action is excise), ledger rows for dropped files,
    stats, and the `matches` side table (MATCHES_SCHEMA)."""
    stats: Counter[str] = Counter()
    stats["files"] += table.num_rows
    stats["bytes"] += int(pc.sum(pc.binary_length(table["text"])).as_py() or 0)
    found = _matches(table, index)
    by_row: dict[int, list[Contamination]] = {}
    for c in found:
        by_row.setdefault(c.row, []).append(c)
    texts = table["text"]
    replaced: dict[int, str] = {}
    dropped: dict[int, str] = {}  # row -> ledger detail
    records: list[dict[str, Any]] = []
    for row, matches in by_row.items():
        detail = "; ".join(c.detail() for c in matches)
        cut = None
        if config.action == "excise":
            cut = excise(texts[row].as_py(), matches, config, index)
        if cut is None:
            dropped[row] = detail
        else:
            replaced[row] = cut.text
            detail = f"excised {cut.spans} spans ({cut.bytes} bytes): {detail}"
        for c in matches:
            records.append(
                {
                    "source_id": table["source_id"][row].as_py(),
                    "path": table["path"][row].as_py(),
                    "action": "dropped" if cut is None else "excised",
                    "benchmark_id": c.benchmark_id,
                    "task_ids": list(c.task_ids),
                    "shared_sequences": c.shared,
                    "excised_spans": None if cut is None else cut.spans,
                    "excised_bytes": None if cut is None else cut.bytes,
                }
            )
            verdict = "dropped" if cut is None else "excised"
            stats[f"benchmark:{c.benchmark_id}:files_{verdict}"] += 1
        if cut is not None:
            stats["excised_files"] += 1
            stats["excised_bytes"] += cut.bytes
    stats[f"dropped_{DropReason.BENCHMARK_CONTAMINATION}"] += len(dropped)
    stats["kept"] += table.num_rows - len(dropped)
    keep = np.ones(table.num_rows, dtype=bool)
    keep[list(dropped)] = False
    kept = _with_texts(table, replaced).filter(pa.array(keep))
    rows = sorted(dropped)
    ledger = drops(
        table["source_id"].take(pa.array(rows, pa.int64())).to_pylist(),
        table["path"].take(pa.array(rows, pa.int64())).to_pylist(),
        [DropReason.BENCHMARK_CONTAMINATION] * len(rows),
        details=[dropped[r] for r in rows],
    )
    matches = pa.Table.from_pylist(records, schema=MATCHES_SCHEMA)
    result = GateResult(kept=kept, dropped=ledger, stats=stats, extra={"matches": matches})
    result.scanned_clean = _scanned_clean(table, index, replaced, keep)
    return result


def _scanned_clean(
    table: pa.Table, index: BenchmarkIndex, replaced: Mapping[int, str], keep: np.ndarray
) -> list[str | None] | None:
    """The sha256 of each kept text the index matched nothing in (its input bytes, which
    the blocking check's rescan would read again); None for an excised one, which the check
    inspects. None when the index is empty (the check then lexes nothing either) or the text
    is not laid out as the schema's string."""
    if index.empty:
        return None
    try:
        digests = text_digests(table["text"])
    except TextLayoutError:
        return None
    return [None if r in replaced else digests[r] for r in np.flatnonzero(keep).tolist()]


def rescan(table: pa.Table, index: BenchmarkIndex) -> list[RescanFinding]:
    """The blocking check's scan: every kept file that still shares a sequence with a task."""
    return [
        RescanFinding(
            table["source_id"][c.row].as_py(),
            table["path"][c.row].as_py(),
            c.benchmark_id,
            c.task_ids,
            c.shared,
        )
        for c in _matches(table, index)
    ]


def _with_texts(table: pa.Table, replaced: Mapping[int, str]) -> pa.Table:
    if not replaced:
        return table
    texts = table["text"].to_pylist()
    hashes = table["content_sha256"].to_pylist()
    for row, text in replaced.items():
        texts[row] = text
        hashes[row] = text_sha256(text)
    out = table.set_column(
        table.schema.get_field_index("text"),
        table.schema.field("text"),
        pa.array(texts, pa.string()),
    )
    i = out.schema.get_field_index("content_sha256")
    return out.set_column(i, out.schema.field(i), pa.array(hashes, pa.string()))


def markdown_table(matches: pa.Table, index: BenchmarkIndex | None = None, top: int = 5) -> str:
    """Per benchmark: tasks matched, files dropped and excised, and the files with the most
    shared sequences (from the gate's `matches` side tables)."""
    rows = matches.to_pylist()
    benchmarks = list(index.benchmarks) if index is not None else []
    benchmarks += sorted({r["benchmark_id"] for r in rows} - set(benchmarks))
    if not benchmarks:
        return "no benchmark configured"
    lines = [
        "| benchmark | tasks | tasks matched | files dropped | files excised | top files |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name in benchmarks:
        mine = [r for r in rows if r["benchmark_id"] == name]
        tasks = {t for r in mine for t in r["task_ids"]}
        worst = sorted(mine, key=lambda r: (-r["shared_sequences"], r["source_id"], r["path"]))
        files = "<br>".join(
            f"`{r['source_id']}:{r['path']}` ({r['shared_sequences']}; "
            f"{', '.join(r['task_ids'][:3])})"
            for r in worst[:top]
        )
        total = index.stats.get(f"{name}:tasks", "") if index is not None else ""
        lines.append(
            f"| {name} | {total} | {len(tasks)} "
            f"| {sum(r['action'] == 'dropped' for r in mine)} "
            f"| {sum(r['action'] == 'excised' for r in mine)} | {files or '-'} |"
        )
    return "\n".join(lines)
