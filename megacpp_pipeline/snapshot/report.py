"""The quality dashboard of a promoted snapshot: one HTML page with PNG plots of where files
went (the ledger funnel), licenses, scrubbing, duplicates, structure, tokens and row fill.
Seed rule: nothing disappears silently, so every number on the page is read back from the
snapshot's own tables or the stage stats handed in, and the same inputs give the same bytes.
"""

from __future__ import annotations

import hashlib
import html
import io
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field

from megacpp_pipeline.gates.enrich import KIND_NAMES
from megacpp_pipeline.snapshot import layout
from megacpp_pipeline.snapshot.document_files import read_labelled
from megacpp_pipeline.snapshot.layout import SnapshotManifest
from megacpp_pipeline.snapshot.packed_rows import fixed_list_to_numpy
from megacpp_pipeline.snapshot.shard_checks import Mapper, inline
from megacpp_pipeline.storage.versions import write_bytes_atomic

if TYPE_CHECKING:  # matplotlib is imported where a report is drawn: about 0.5 CPU s a
    # process, and every process that imports the stages (a Ray worker, each job) paid it
    from matplotlib.axes import Axes
    from matplotlib.axis import Axis
    from matplotlib.figure import Figure

# Dagster runs log at DEBUG; matplotlib's font lookup would add a "findfont" line per
# missing math font to every report run.
logging.getLogger("matplotlib.font_manager").setLevel(logging.WARNING)

REPORT_HTML = "quality_report.html"
# PNG names are part of the page's contract: the HTML links them by these relative names.
PLOT_FILES = {
    "files_per_stage": "files_per_stage.png",
    "licenses": "licenses.png",
    "scrub": "scrub_counts.png",
    "dedup": "duplicate_clusters.png",
    "chunk_kinds": "chunk_kind_coverage.png",
    "tokens_per_source": "tokens_per_source.png",
    "row_utilization": "row_utilization.png",
}
SPLIT_ORDER = layout.SPLITS


class ReportInputError(Exception):
    """The snapshot directory lacks a table the report reads; the message names the file."""


class ReportConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    utilization_bins: int = Field(default=20, ge=1)  # equal bins of valid_token_count / seq_len
    top_n: int = Field(default=15, ge=1)  # bars per categorical plot; the rest become "other"
    dpi: int = Field(default=100, ge=50, le=300)
    batch_rows: int = Field(default=1024, ge=1)  # packed rows decoded at once (bounds memory)


@dataclass(frozen=True)
class ReportInputs:
    snapshot_dir: Path
    license_stats: Mapping[str, float] = field(default_factory=dict)  # decision:/source:/expr:
    scrub_stats: Mapping[str, float] = field(default_factory=dict)  # kind:<detector>
    dedup_clusters: pa.Table | None = None  # cluster_id, size, ...; None: derived from dup_of
    chunk_kind_bytes: Mapping[str, float] | None = None  # None or {}: counted from the rows
    packing_telemetry: Mapping[str, Any] | None = None
    stages: Sequence[str] = ()  # the pipeline's stage order (the registry's), for the funnel
    # every operational source, catalog order: one with nothing collected is listed too
    sources: Sequence[str] = ()
    # per benchmark: id, tasks, files_dropped, files_excised; removals: entries, files, and
    # the lines saying why near duplicates of removed files stay
    benchmarks: Sequence[Mapping[str, Any]] = ()
    removals: Mapping[str, Any] = field(default_factory=dict)
    removal_notes: str = ""


@dataclass(frozen=True)
class WrittenFile:
    path: Path
    sha256: str


@dataclass(frozen=True)
class ReportResult:
    html: Path
    files: list[WrittenFile]  # the HTML page and every PNG, in write order
    markdown: str  # key numbers and the plot list, for the Dagster UI
    metrics: dict[str, float]  # flat numbers behind the markdown, for asset metadata


@dataclass(frozen=True)
class Funnel:
    """Ledger counts: every collected file is kept or dropped at one stage for one reason."""

    collected: int
    kept: int
    dropped: int
    stages: list[str]  # funnel order: the pipeline's stages, then any unknown stage names
    drops: list[tuple[str, str, int]]  # (stage, reason, files), funnel order then most first

    def remaining_after(self) -> list[int]:
        by_stage = {s: 0 for s in self.stages}
        for stage, _reason, count in self.drops:
            by_stage[stage] += count
        return (self.collected - np.cumsum([by_stage[s] for s in self.stages])).tolist()


@dataclass
class RowStats:
    """What the packed rows say, accumulated shard by shard."""

    seq_len: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    valid_tokens: dict[str, int] = field(default_factory=dict)
    utilization_hist: dict[str, np.ndarray] = field(default_factory=dict)
    kind_tokens: np.ndarray = field(default_factory=lambda: np.zeros(256, np.int64))

    def utilization(self) -> float:
        capacity = sum(self.rows.values()) * self.seq_len
        return sum(self.valid_tokens.values()) / capacity if capacity else 0.0


def ledger_funnel(ledger: pa.Table, stages: Sequence[str] = ()) -> Funnel:
    """Collected, kept and dropped counts of a final ledger (one row per collected file);
    drops in the pipeline's stage order (`stages`, the registry's), unknown stages last."""
    status = ledger.column("status")
    dropped_rows = ledger.filter(pc.equal(status, "dropped"))
    reasons = pc.fill_null(_plain(dropped_rows.column("reason")), "(none)")
    grouped = (
        pa.table({"stage": _plain(dropped_rows.column("stage")), "reason": reasons})
        .group_by(["stage", "reason"])
        .aggregate([("stage", "count")])
        .to_pylist()
    )
    known = list(stages)
    extra = sorted({row["stage"] for row in grouped} - set(known))
    stages = known + extra
    rank = {s: i for i, s in enumerate(stages)}
    drops = sorted(
        ((row["stage"], row["reason"], int(row["stage_count"])) for row in grouped),
        key=lambda d: (rank[d[0]], -d[2], d[1]),
    )
    return Funnel(
        collected=ledger.num_rows,
        kept=int(pc.sum(pc.equal(status, "kept")).as_py() or 0),
        dropped=dropped_rows.num_rows,
        stages=stages,
        drops=drops,
    )


@dataclass(frozen=True)
class SourceRow:
    """One source's line in the report: what was collected, what became documents, and the
    main reasons for the rest."""

    source: str
    collected: int
    documents: int
    tokens: int
    why: str  # the top drop reasons, "stage: reason count; ..."


def source_rows(
    ledger: pa.Table, documents: pa.Table, sources: Sequence[str] = (), top: int = 3
) -> list[SourceRow]:
    """Every source (the given ones first, in order, then any other the ledger names) with
    its counts; a source with no documents says why."""
    named = pc.unique(ledger.column("source_id"))
    if pa.types.is_dictionary(named.type):
        named = named.dictionary_decode()
    known = list(dict.fromkeys([*sources, *named.to_pylist()]))
    collected = _count_by(ledger, "source_id")
    docs = _count_by(documents, "source_id")
    tokens = {
        r["source_id"]: int(r["num_tokens_sum"] or 0)
        for r in documents.group_by("source_id").aggregate([("num_tokens", "sum")]).to_pylist()
    }
    dropped = ledger.filter(pc.equal(ledger.column("status"), "dropped"))
    reasons = (
        pa.table(
            {
                "source_id": _plain(dropped.column("source_id")),
                "why": pc.binary_join_element_wise(
                    _plain(dropped.column("stage")),
                    pc.fill_null(_plain(dropped.column("reason")), "(none)"),
                    ": ",
                ),
            }
        )
        .group_by(["source_id", "why"])
        .aggregate([("why", "count")])
        .to_pylist()
    )
    out = []
    for source in known:
        mine = sorted(
            ((r["why"], r["why_count"]) for r in reasons if r["source_id"] == source),
            key=lambda kv: (-kv[1], kv[0]),
        )
        why = "; ".join(f"{w} {n}" for w, n in mine[:top]) or (
            "nothing collected" if not collected.get(source) else ""
        )
        out.append(
            SourceRow(
                source,
                int(collected.get(source, 0)),
                int(docs.get(source, 0)),
                tokens.get(source, 0),
                why,
            )
        )
    return out


def _read_table(
    snapshot_dir: Path, name: str, columns: list[str], labels: Sequence[str] = ()
) -> pa.Table:
    """`columns` of a snapshot table, its low-cardinality ones (`labels`) dictionary-encoded:
    a few bytes a row where a string per file would be held."""
    path = snapshot_dir / name
    if not path.is_file():
        raise ReportInputError(f"{path}: missing; a promoted snapshot always has it")
    schema = pq.read_schema(path)
    absent = [c for c in columns if c not in schema.names]
    if absent:
        raise ReportInputError(f"{path}: columns {absent} missing")
    return read_labelled(path, columns, [c for c in labels if c in columns])


def _row_shards(snapshot_dir: Path, manifest: SnapshotManifest) -> Iterator[tuple[str, Path]]:
    splits = manifest.splits
    names = sorted(splits, key=lambda s: (SPLIT_ORDER.index(s) if s in SPLIT_ORDER else 99, s))
    for split in names:
        for rel in splits[split].shards:
            yield split, snapshot_dir / rel


def scan_rows(
    snapshot_dir: Path, manifest: SnapshotManifest, config: ReportConfig, *, kinds: bool
) -> RowStats:
    """Utilization histogram and (when `kinds`) per-kind valid-token counts, streaming each
    shard in batches of `config.batch_rows` and decoding only the columns needed."""
    stats = RowStats(seq_len=manifest.seq_len)
    for split, path in _row_shards(snapshot_dir, manifest):
        shard = pq.ParquetFile(path)
        schema = shard.schema_arrow
        seq_len = int(schema.field("input_ids").type.list_size)
        stats.seq_len = stats.seq_len or seq_len
        with_kinds = kinds and "chunk_kind" in schema.names
        columns = ["valid_token_count"] + (["chunk_kind"] if with_kinds else [])
        hist = stats.utilization_hist.setdefault(split, np.zeros(config.utilization_bins, np.int64))
        for batch in shard.iter_batches(batch_size=config.batch_rows, columns=columns):
            valid = batch.column("valid_token_count").to_numpy().astype(np.int64)
            stats.rows[split] = stats.rows.get(split, 0) + len(valid)
            stats.valid_tokens[split] = stats.valid_tokens.get(split, 0) + int(valid.sum())
            hist += np.histogram(valid / seq_len, bins=config.utilization_bins, range=(0, 1))[0]
            if with_kinds:
                # pad slots carry kind 0 by contract; count only the valid prefix
                kind = fixed_list_to_numpy(batch.column("chunk_kind"), seq_len)
                in_prefix = np.arange(seq_len)[None, :] < valid[:, None]
                stats.kind_tokens += np.bincount(kind[in_prefix], minlength=256)[:256]
    return stats


def _prefixed(stats: Mapping[str, float], prefix: str) -> dict[str, float]:
    return {k[len(prefix) :]: float(v) for k, v in stats.items() if k.startswith(prefix) and v}


def _top(counts: Mapping[str, float], n: int) -> list[tuple[str, float]]:
    """The n largest entries (ties by name), the rest folded into one "other" bar."""
    items = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    if len(items) <= n:
        return items
    rest = items[n - 1 :]
    return [*items[: n - 1], (f"(other {len(rest)})", sum(v for _, v in rest))]


def _plain(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A string column as plain strings, were it dictionary-encoded."""
    return column.cast(pa.string()) if pa.types.is_dictionary(column.type) else column


def _count_by(table: pa.Table, column: str) -> dict[str, float]:
    values = pc.fill_null(_plain(table.column(column)), "(none)")
    counted = pc.value_counts(values).to_pylist()
    return {str(row["values"]): float(row["counts"]) for row in counted}


def duplicate_cluster_sizes(clusters: pa.Table | None, ledger: pa.Table) -> np.ndarray:
    """Cluster sizes: from the dedup stage's cluster table, or else from the ledger, where
    each dropped duplicate names its kept representative in dup_of."""
    if clusters is not None:
        sizes = clusters.column("size").to_numpy(zero_copy_only=False).astype(np.int64)
        return sizes[sizes > 1]  # a file alone in its cluster has no duplicate
    dup_of = ledger.column("dup_of").drop_null()
    if len(dup_of) == 0:
        return np.zeros(0, np.int64)
    return np.asarray(pc.value_counts(dup_of).field("counts"), np.int64) + 1


# --- plotting -------------------------------------------------------------------------------


def _integer_ticks(axis: Axis) -> None:
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def _no_data(ax: Axes, title: str, message: str = "no data") -> None:
    ax.set_title(title)
    ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=14, color="0.4")
    ax.set_axis_off()


def _barh(ax: Axes, items: list[tuple[str, float]], title: str, xlabel: str) -> None:
    if not items:
        _no_data(ax, title)
        return
    labels = [label for label, _ in items][::-1]
    values = [value for _, value in items][::-1]
    bars = ax.barh(labels, values, color="C0")
    ax.bar_label(bars, labels=[f"{v:,.0f}" for v in values], padding=2, fontsize=8)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    _integer_ticks(ax.xaxis)
    ax.margins(x=0.15)


def plot_funnel(fig: Figure, funnel: Funnel, config: ReportConfig) -> None:
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.2]})
    if funnel.collected == 0:
        _no_data(left, "files per stage")
        _no_data(right, "dropped files by reason")
        return
    labels = ["collected"] + [f"after {s}" for s in funnel.stages] + ["kept"]
    values = [funnel.collected, *funnel.remaining_after(), funnel.kept]
    _barh(left, list(zip(labels, values, strict=True)), "files per stage", "files")
    drops = [(f"{stage}: {reason}", float(n)) for stage, reason, n in funnel.drops]
    if drops:
        _barh(right, _top(dict(drops), config.top_n), "dropped files by reason", "files")
    else:
        _no_data(right, "dropped files by reason", "no files dropped")


def plot_licenses(
    fig: Figure,
    decisions: dict[str, float],
    sources: dict[str, float],
    expressions: dict[str, float],
    config: ReportConfig,
    *,
    from_documents: bool = False,
) -> None:
    axes = fig.subplots(1, 3, gridspec_kw={"width_ratios": [1, 1, 1.4]})
    origin = " (kept documents)" if from_documents else ""
    _barh(axes[0], _top(decisions, config.top_n), "license decisions", "files")
    _barh(axes[1], _top(sources, config.top_n), f"license sources{origin}", "files")
    _barh(axes[2], _top(expressions, config.top_n), f"license expressions{origin}", "files")


def plot_counts(
    fig: Figure, counts: dict[str, float], title: str, xlabel: str, config: ReportConfig
) -> None:
    _barh(fig.subplots(), _top(counts, config.top_n), title, xlabel)


def plot_dedup(fig: Figure, sizes: np.ndarray) -> None:
    ax = fig.subplots()
    if sizes.size == 0:
        _no_data(ax, "duplicate clusters", "no duplicate clusters")
        return
    size_values, clusters = np.unique(sizes, return_counts=True)
    bars = ax.bar([str(s) for s in size_values.tolist()], clusters, color="C1")
    ax.bar_label(bars, padding=2, fontsize=8)
    ax.set_title(f"duplicate clusters ({sizes.size:,} clusters, {int(sizes.sum()):,} files)")
    ax.set_xlabel("cluster size (files)")
    ax.set_ylabel("clusters")
    _integer_ticks(ax.yaxis)
    if clusters.max() > 100 * max(clusters.min(), 1):
        ax.set_yscale("log")


def plot_chunk_kinds(fig: Figure, kinds: dict[str, float], unit: str) -> None:
    ax = fig.subplots()
    total = sum(kinds.values())
    if not total:
        _no_data(ax, "chunk-kind coverage")
        return
    items = sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0]))
    labels = [k for k, _ in items][::-1]
    shares = [100.0 * v / total for _, v in items][::-1]
    bars = ax.barh(labels, shares, color="C2")
    ax.bar_label(bars, labels=[f"{s:.1f}%" for s in shares], padding=2, fontsize=8)
    ax.set_title(f"chunk-kind coverage (share of {unit})")
    ax.set_xlabel(f"% of {unit}")
    ax.margins(x=0.15)


def plot_tokens_per_source(
    fig: Figure, by_source_split: dict[tuple[str, str], float], config: ReportConfig
) -> None:
    ax = fig.subplots()
    totals: dict[str, float] = {}
    for (source, _split), tokens in by_source_split.items():
        totals[source] = totals.get(source, 0.0) + tokens
    if not sum(totals.values()):
        _no_data(ax, "tokens per source")
        return
    shown = [s for s, _ in _top(totals, config.top_n)]
    named = set(shown)
    splits = sorted(
        {split for _, split in by_source_split},
        key=lambda s: (SPLIT_ORDER.index(s) if s in SPLIT_ORDER else 99, s),
    )
    labels = shown[::-1]
    left = np.zeros(len(labels))
    for i, split in enumerate(splits):
        values = np.zeros(len(labels))
        for (source, s), tokens in by_source_split.items():
            if s == split:
                key = source if source in named else shown[-1]
                values[labels.index(key)] += tokens
        ax.barh(labels, values, left=left, label=split, color=f"C{i}")
        left += values
    ax.set_title(f"tokens per source ({layout.DOCUMENTS})")
    ax.set_xlabel("tokens")
    ax.legend(loc="lower right", fontsize=8)


def plot_utilization(fig: Figure, rows: RowStats, config: ReportConfig) -> None:
    ax = fig.subplots()
    if not sum(rows.rows.values()):
        _no_data(ax, "row utilization")
        return
    edges = np.linspace(0.0, 1.0, config.utilization_bins + 1)
    width = edges[1] - edges[0]
    bottom = np.zeros(config.utilization_bins)
    for i, (split, hist) in enumerate(rows.utilization_hist.items()):
        ax.bar(
            edges[:-1], hist, width=width, bottom=bottom, align="edge", label=split, color=f"C{i}"
        )
        bottom += hist
    ax.set_title(f"row utilization (mean {rows.utilization():.1%}, seq_len {rows.seq_len})")
    ax.set_xlabel("valid_token_count / seq_len")
    ax.set_ylabel("rows")
    _integer_ticks(ax.yaxis)
    ax.set_xlim(0, 1)
    ax.legend(loc="upper left", fontsize=8)


# --- writing --------------------------------------------------------------------------------


def _write_atomic(path: Path, data: bytes) -> WrittenFile:
    write_bytes_atomic(path, data)
    return WrittenFile(path, hashlib.sha256(data).hexdigest())


def _render_png(
    path: Path, size: tuple[float, float], draw: Callable[[Figure], None], dpi: int
) -> WrittenFile:
    # The object API with an explicit Agg canvas: no pyplot global state, no GUI backend.
    # The default style ignores any matplotlibrc; dropping "Software" keeps the bytes stable.
    import matplotlib.style
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    with matplotlib.style.context("default"):
        fig = Figure(figsize=size, dpi=dpi, layout="constrained")
        FigureCanvasAgg(fig)
        draw(fig)
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=dpi, metadata={"Software": None})
    return _write_atomic(path, buffer.getvalue())


def _render_one(
    drawings: list[tuple[Path, tuple[float, float], Callable[[Figure], None], int]], index: int
) -> WrittenFile:
    """One plot of the report, a task of its own (the drawings reach a forked worker with
    the job, unpickled)."""
    return _render_png(*drawings[index])


def _fmt(value: float) -> str:
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.4g}"
    return f"{int(value):,}"


_SOURCE_HEADER = (
    "<tr><th>source</th><th>collected</th><th>documents</th><th>tokens</th>"
    "<th>main drop reasons</th></tr>"
)


def _exclusions_html(inputs: ReportInputs) -> str:
    esc = html.escape
    rows = "\n".join(
        f"<tr><td>{esc(str(b['id']))}</td><td>{b.get('tasks', 0)}</td>"
        f"<td>{b.get('files_dropped', 0)}</td><td>{b.get('files_excised', 0)}</td></tr>"
        for b in inputs.benchmarks
    )
    table = (
        "<table><tr><th>benchmark</th><th>tasks</th><th>files dropped</th>"
        f"<th>files excised</th></tr>\n{rows}\n</table>"
        if inputs.benchmarks
        else "<p>No benchmark was pinned for decontamination.</p>"
    )
    r = inputs.removals
    notes = "".join(
        f"<li>{esc(line.removeprefix('- '))}</li>"
        for line in inputs.removal_notes.splitlines()
        if line.startswith("- ")
    )
    return (
        f"<h2>Benchmarks and removal requests</h2>\n{table}\n"
        f"<p>{r.get('entries', 0)} removal entries; {r.get('files', 0)} files removed on "
        f"request.</p>\n" + (f"<ul>{notes}</ul>\n" if notes else "")
    )


def _html_page(
    title: str,
    rows: list[tuple[str, str]],
    plots: list[tuple[str, str]],
    sources: Sequence[SourceRow] = (),
    extra: str = "",
) -> str:
    esc = html.escape
    table = "\n".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows)
    source_table = "\n".join(
        f"<tr><td>{esc(s.source)}</td><td>{s.collected}</td><td>{s.documents}</td>"
        f'<td>{s.tokens}</td><td class="why">{esc(s.why)}</td></tr>'
        for s in sources
    )
    figures = "\n".join(
        f'<figure><img src="{esc(name)}" alt="{esc(caption)}">'
        f"<figcaption>{esc(caption)}</figcaption></figure>"
        for name, caption in plots
    )
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{esc(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }}
table {{ border-collapse: collapse; margin-bottom: 2em; }}
th, td {{ border: 1px solid #ccc; padding: 0.25em 0.75em; text-align: left; }}
td {{ text-align: right; font-variant-numeric: tabular-nums; }}
td.why {{ text-align: left; }}
figure {{ margin: 0 0 2em 0; }}
img {{ max-width: 100%; border: 1px solid #eee; }}
figcaption {{ color: #555; font-size: 0.9em; }}
</style>
</head>
<body>
<h1>{esc(title)}</h1>
<table>
{table}
</table>
<h2>Sources</h2>
<table>
{_SOURCE_HEADER}
{source_table}
</table>
{extra}
{figures}
</body>
</html>
"""


def render_report(
    inputs: ReportInputs,
    out_dir: Path,
    config: ReportConfig | None = None,
    mapper: Mapper = inline,
) -> ReportResult:
    """Write `out_dir/quality_report.html` and its PNGs; return the files and a summary. The
    plots are drawn by tasks of `mapper` (an executor's map on this host: matplotlib's
    layout and rasterizing were nearly all of the report's time, one plot after another)."""
    config = config or ReportConfig()
    snap = Path(inputs.snapshot_dir)
    manifest_path = snap / layout.MANIFEST
    if not manifest_path.is_file():
        raise ReportInputError(f"{manifest_path}: missing; not a promoted snapshot")
    try:
        manifest = SnapshotManifest.model_validate_json(manifest_path.read_bytes())
    except ValueError as e:
        raise ReportInputError(f"{manifest_path}: not a snapshot manifest ({e})") from e
    labels = ["source_id", "stage", "status", "reason", "split", "license_source"]
    labels.append("license_expression")
    ledger = _read_table(
        snap, layout.LEDGER, ["source_id", "stage", "status", "reason", "dup_of"], labels
    )
    documents = _read_table(
        snap,
        layout.DOCUMENTS,
        ["source_id", "split", "num_tokens", "license_source", "license_expression"],
        labels,
    )

    funnel = ledger_funnel(ledger, inputs.stages)
    decisions = _prefixed(inputs.license_stats, "decision:")
    sources = _prefixed(inputs.license_stats, "source:")
    expressions = _prefixed(inputs.license_stats, "expr:")
    licenses_from_documents = not sources and not expressions and documents.num_rows > 0
    if licenses_from_documents:
        # no stage stats handed in: the kept documents still say where their license came from
        sources = _count_by(documents, "license_source")
        expressions = _count_by(documents, "license_expression")
    scrub_kinds = _prefixed(inputs.scrub_stats, "kind:")
    sizes = duplicate_cluster_sizes(inputs.dedup_clusters, ledger)
    kinds_given = bool(inputs.chunk_kind_bytes)
    rows = scan_rows(snap, manifest, config, kinds=not kinds_given)
    if kinds_given:
        assert inputs.chunk_kind_bytes is not None
        kinds = {k: float(v) for k, v in inputs.chunk_kind_bytes.items() if v}
        kind_unit = "bytes"
    else:
        kinds = {
            (KIND_NAMES[i] if i < len(KIND_NAMES) else f"kind_{i}"): float(n)
            for i, n in enumerate(rows.kind_tokens.tolist())
            if n
        }
        kind_unit = "tokens"
    per_source = (
        documents.group_by(["source_id", "split"]).aggregate([("num_tokens", "sum")]).to_pylist()
    )
    by_source_split = {
        (r["source_id"], r["split"]): float(r["num_tokens_sum"] or 0) for r in per_source
    }

    metrics: dict[str, float] = {
        "files_collected": funnel.collected,
        "files_kept": funnel.kept,
        "files_dropped": funnel.dropped,
    }
    labelled: list[tuple[str, str]] = [
        ("files collected", _fmt(funnel.collected)),
        ("files kept", _fmt(funnel.kept)),
        ("files dropped", _fmt(funnel.dropped)),
    ]
    for stage, reason, count in funnel.drops:
        metrics[f"dropped:{stage}:{reason}"] = count
        labelled.append((f"dropped at {stage}: {reason}", _fmt(count)))
    tokens = int(pc.sum(documents.column("num_tokens")).as_py() or 0)
    metrics |= {
        "documents": documents.num_rows,
        "document_tokens": tokens,
        "sources": len({s for s, _ in by_source_split}),
        "packed_rows": sum(rows.rows.values()),
        "row_utilization": round(rows.utilization(), 6),
        "duplicate_clusters": int(sizes.size),
        "files_in_duplicate_clusters": int(sizes.sum()),
        "scrub_replacements": sum(scrub_kinds.values()),
    }
    mode = manifest.document_mode
    labelled += [
        ("documents", f"{_fmt(metrics['documents'])} ({mode} mode)"),
        ("document tokens", _fmt(tokens)),
        ("sources", _fmt(metrics["sources"])),
        ("packed rows", _fmt(metrics["packed_rows"])),
        ("row utilization", f"{rows.utilization():.1%}"),
        ("duplicate clusters", _fmt(sizes.size)),
        ("files in duplicate clusters", _fmt(int(sizes.sum()))),
        ("scrub replacements", _fmt(metrics["scrub_replacements"])),
    ]
    for decision, files in sorted(decisions.items()):
        metrics[f"license:{decision}"] = files
        labelled.append((f"license {decision}", _fmt(files)))
    telemetry = inputs.packing_telemetry or {}
    for key in ("utilization", "docs_per_row", "cropped_doc_frac"):
        if isinstance(telemetry.get(key), int | float):
            metrics[f"packing:{key}"] = float(telemetry[key])
            labelled.append((f"packing {key.replace('_', ' ')}", _fmt(float(telemetry[key]))))

    out_dir.mkdir(parents=True, exist_ok=True)
    P = PLOT_FILES
    plan: list[tuple[str, str, tuple[float, float], Callable[[Figure], None]]] = [
        (
            P["files_per_stage"],
            "files per stage: the ledger funnel from collected to kept, and drops by reason",
            (12, 5),
            lambda f: plot_funnel(f, funnel, config),
        ),
        (
            P["licenses"],
            "license decisions, where each license came from, and the expressions",
            (14, 4.5),
            lambda f: plot_licenses(
                f, decisions, sources, expressions, config, from_documents=licenses_from_documents
            ),
        ),
        (
            P["scrub"],
            "scrub replacements per detector kind",
            (8, 4),
            lambda f: plot_counts(f, scrub_kinds, "scrub counts per kind", "replacements", config),
        ),
        (
            P["dedup"],
            "duplicate cluster sizes (each cluster keeps one representative)",
            (8, 4),
            lambda f: plot_dedup(f, sizes),
        ),
        (
            P["chunk_kinds"],
            f"chunk-kind coverage, share of {kind_unit}",
            (8, 4.5),
            lambda f: plot_chunk_kinds(f, kinds, kind_unit),
        ),
        (
            P["tokens_per_source"],
            "tokens per source and split",
            (9, 4.5),
            lambda f: plot_tokens_per_source(f, by_source_split, config),
        ),
        (
            P["row_utilization"],
            "row utilization: valid tokens per packed row over seq_len",
            (8, 4),
            lambda f: plot_utilization(f, rows, config),
        ),
    ]
    drawings = [(out_dir / name, size, draw, config.dpi) for name, _, size, draw in plan]
    import matplotlib.figure  # noqa: F401  here, so that forked workers drawing plots inherit it

    written = list(mapper(_render_one, drawings, range(len(drawings))))
    snapshot_id = manifest.snapshot_id
    title = f"Quality report: snapshot {snapshot_id}"
    by_source = source_rows(ledger, documents, inputs.sources)
    plots = [(name, caption) for name, caption, _, _ in plan]
    page = _html_page(title, labelled, plots, by_source, _exclusions_html(inputs))
    html_file = _write_atomic(out_dir / REPORT_HTML, page.encode())
    written.append(html_file)

    md_rows = "\n".join(f"| {k} | {v} |" for k, v in labelled)
    plot_list = ", ".join(f"`{name}`" for name, _, _, _ in plan)
    markdown = (
        f"**{title}** — {funnel.collected:,} files collected, {funnel.kept:,} kept "
        f"(`{REPORT_HTML}`)\n\n| metric | value |\n| --- | --- |\n{md_rows}\n\n"
        f"Plots: {plot_list}\n"
    )
    return ReportResult(html=html_file.path, files=written, markdown=markdown, metrics=metrics)
