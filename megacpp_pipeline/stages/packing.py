"""packed_rows: BOS + tokens + EOS per document (the documents stage's, doc_ids and all), cut
into pieces of at most seq_len and packed best-fit into rows of exactly seq_len tokens (train
and validation apart), with the pieces table that says where every piece of every document
sits. FIM stays inside one member file of a repository document.

Windows of documents are packed independently, so each split's windows are cut into blocks
(`packing.block_windows`: at most 64 per split, at most 16 windows each, unless
`windows_per_task` is set) and a task packs one block wherever it runs; the driver adopts the
blocks' shards in order and merges their telemetry.

Source weights apply here, where documents are drawn into rows, and nowhere before: the
documents stage, documents.parquet, document_files and the ledger hold every kept document
once, whatever its weight. Each split is packed in passes: pass k holds the documents drawn
more than k times (corpus/packing.py: document_draws, keyed by source and path), so pass 0
is every document drawn at all and a source of weight 2.5 takes part in passes 0, 1 and 2.
The block plan cuts each pass's input rows into blocks as before, and a task keeps the rows
its pass draws, so the blocks and their rows are the same on any engine; the pieces name the
copy (the pass), and a document's copies never share a row."""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from megacpp_pipeline.corpus import packing, repository, tokenizer
from megacpp_pipeline.pipeline.checks import RowCheck, inspect_rows, nothing_left
from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.executor import Executor, ending
from megacpp_pipeline.pipeline.metadata import summary_metadata
from megacpp_pipeline.pipeline.registry import (
    Check,
    CheckOutcome,
    Grain,
    Markdown,
    Materialized,
    Stage,
)
from megacpp_pipeline.snapshot import layout
from megacpp_pipeline.snapshot import packed_rows as rows_contract
from megacpp_pipeline.stages import names
from megacpp_pipeline.stages.documents import split_tables
from megacpp_pipeline.storage import slices
from megacpp_pipeline.storage.store import (
    Manifest,
    ShardInfo,
    ShardStore,
    ShardUploader,
    VersionWriter,
    WrittenSchema,
)

UTILIZATION_PNG = "utilization_train.png"
# what the packer reads of the documents stage's token streams
_PACKED_COLUMNS = [
    "doc_id",
    "source_id",
    "path",
    "num_tokens",
    "split",
    "member_starts",
    "token_ids",
    "chunk_kind",
]


def pieces_table(split: str, copy: int = 0) -> str:
    """The packed version's table of one split's pieces of one pass (the documents' copy
    `copy`), in (doc_id, piece_index) order: a pass's blocks go through the split in doc
    order, but a later pass starts over, so each pass has its own table."""
    return f"pieces:{split}" if copy == 0 else f"pieces:{split}:copy{copy}"


def pieces_tables(packed: Manifest) -> list[str]:
    """The packed version's pieces tables, pass by pass (copy 0 first), each split's."""
    found = []
    for name in packed.tables:
        split, _, copy = name.removeprefix("pieces:").partition(":copy")
        if name.startswith("pieces:") and split in packing.SPLITS:
            found.append((int(copy or 0), packing.SPLITS.index(split), name))
    return [name for *_, name in sorted(found)]


@dataclass(frozen=True)
class _Job:
    store: ShardStore
    config: packing.PackingConfig
    out_dir: str


@dataclass(frozen=True)
class _Block:
    split: str
    block: int
    pieces: tuple[slices.Piece, ...]
    copy: int = 0  # the pass: documents drawn more than this many times are packed again


@dataclass
class _Packed:
    shards: list[tuple[str, pa.Schema, ShardInfo, WrittenSchema]]
    stats: Counter[str]
    telemetry: packing.PackingTelemetry | None
    whole: repository.WholeDocumentRows | None


def _drawn(config: packing.PackingConfig, docs: pa.Table, copy: int) -> pa.Table:
    """The documents of a table (one source's) that the pass `copy` packs."""
    if docs.num_rows == 0:
        return docs
    source = docs["source_id"][0].as_py()
    weight = config.weight(source)
    if weight == 1.0:  # every document exactly once: no draw to compute
        return docs if copy == 0 else docs.slice(0, 0)
    keys = packing.draw_keys(docs["source_id"].to_pylist(), docs["path"].to_pylist())
    draws = packing.document_draws(keys, weight, config.seed)
    return docs.filter(pa.array(draws > copy))


def _pack_task(job: _Job, task: _Block) -> _Packed:
    """One block of one split's windows packed, its rows and pieces written, one shard of
    each per window (a window's rows are bounded by window_docs)."""
    config = job.config
    schema = rows_contract.packed_rows_schema(config.seq_len)
    uploader = ShardUploader(job.store, job.out_dir)
    out = _Packed([], Counter(), None, None)
    if task.copy == 0:
        out.stats["documents"] = sum(p.rows for p in task.pieces)

    def drawn() -> Iterator[pa.Table]:
        for table in slices.read_each(job.store, task.pieces, _PACKED_COLUMNS):
            kept = _drawn(config, table, task.copy)
            if kept.num_rows:
                source = kept["source_id"][0].as_py()
                out.stats[f"sequences:{source}"] += kept.num_rows
                out.stats[f"document_tokens:{source}"] += int(
                    pc.sum(kept["num_tokens"]).as_py() or 0
                )
            yield kept

    special = tokenizer.special_ids()
    row_group_rows = rows_contract.row_group_rows(config.seq_len)
    batches = packing.pack_block(drawn(), task.split, task.block, config, special, task.copy)
    for window, batch in enumerate(batches):
        name = f"{task.split}-{task.block:05d}-{window:04d}.parquet"
        # a window's pieces in document order: each split's pieces tables then come sorted
        # by (doc_id, piece_index), the order the snapshot streams them in
        placed = batch.pieces.sort_by([("doc_id", "ascending"), ("piece_index", "ascending")])
        for table, rows, rows_schema, group in (
            (layout.data_table(task.split), batch.rows, schema, row_group_rows),
            (pieces_table(task.split, task.copy), placed, rows_contract.PIECES_SCHEMA, None),
        ):
            options = {"row_group_size": group} if group else {}
            rel = f"{table.replace(':', '-')}-{name}"
            shard, written = uploader.write_parquet(rel, rows, **options)
            out.shards.append((table, rows_schema, shard, written))
        out.stats[f"rows:{task.split}"] += batch.rows.num_rows
        out.stats["valid_tokens"] += int(pc.sum(batch.rows["valid_token_count"]).as_py() or 0)
        if batch.telemetry is not None:
            t = batch.telemetry
            out.telemetry = out.telemetry.merge(t) if out.telemetry else t
        whole = repository.whole_document_rows([batch], config.seq_len)
        out.whole = out.whole.merge(whole) if out.whole else whole
    return out


def _plan(ctx: StageContext, upstream: Manifest, config: packing.PackingConfig) -> list[_Block]:
    """Each split's documents, in doc order, cut into blocks of whole windows
    (`packing.block_windows`: from the pass's size unless configured), pass after pass
    (pass k: the sources whose weight can draw a document more than k times): the same
    blocks whatever the engine or the number of workers."""
    passes = max((packing.max_draws(config.weight(s)) for s in ctx.sources()), default=1)
    blocks: list[_Block] = []
    for split in packing.SPLITS:
        numbered = 0  # a split's blocks are numbered on across its passes (their pack_ids)
        for copy in range(passes):
            sources = [s for s in ctx.sources() if packing.max_draws(config.weight(s)) > copy]
            tables = [(upstream, t) for t in split_tables(upstream, sources, split)]
            documents = sum(
                shard.rows
                for m, t in tables
                if (info := m.tables.get(t)) is not None
                for shard in info.shards
            )
            rows = config.window_docs * packing.block_windows(config, documents)
            for s in slices.plan_rows(ctx.store, tables, rows):
                blocks.append(_Block(split, numbered, s.pieces, copy))
                numbered += 1
    return blocks


def _body(ctx: StageContext, stage: Stage, partition: str | None) -> Materialized:
    assert stage.input is not None
    config = ctx.config(stage)
    upstream = ctx.latest(stage.input)
    executor = ctx.executor()
    version = ctx.begin(stage, None, config)
    with version:
        schema = rows_contract.packed_rows_schema(config.seq_len)
        for split in packing.SPLITS:  # both exist even when a split has no document
            version.table(layout.data_table(split), schema)
        for split in packing.SPLITS:
            version.table(pieces_table(split), rows_contract.PIECES_SCHEMA)
        telemetry: dict[str, packing.PackingTelemetry] = {}
        whole: dict[str, repository.WholeDocumentRows] = {}
        stats: Counter[str] = Counter(documents=0, valid_tokens=0)
        blocks = _plan(ctx, upstream, config)
        job = _Job(ctx.store, config, version.dir)
        # a failure here ends the tasks before the version is aborted
        with ending(executor.map(_pack_task, job, blocks)) as results:
            for block, out in zip(blocks, results, strict=True):
                for table, table_schema, shard, written in out.shards:
                    version.table(table, table_schema).adopt(shard, written)
                stats.update(out.stats)
                split = block.split
                if out.telemetry is not None:
                    prev = telemetry.get(split)
                    telemetry[split] = prev.merge(out.telemetry) if prev else out.telemetry
                if out.whole is not None:
                    merged = whole[split].merge(out.whole) if split in whole else out.whole
                    whole[split] = merged
        return _commit(ctx, stage, config, version, upstream, stats, telemetry, whole, executor)


def _commit(
    ctx: StageContext,
    stage: Stage,
    config: packing.PackingConfig,
    version: VersionWriter,
    upstream: Manifest,
    stats: Counter[str],
    telemetry: dict[str, packing.PackingTelemetry],
    whole: dict[str, repository.WholeDocumentRows],
    executor: Executor,
) -> Materialized:
    extra: dict[str, Any] = {
        "seq_len": config.seq_len,
        "policy": str(config.policy),
        # the mixture: every source's weight and the seed of the draws (the snapshot records
        # them, and verify recomputes every document's draws from them)
        "source_weights": {s: config.weight(s) for s in ctx.sources()},
        "draw_seed": config.seed,
        **executor.describe(),
        "engine_nodes": executor.stats.figures(),
    }
    meta: dict[str, Any] = {}
    if whole:  # rows that hold one document end to end (the point of repository mode)
        extra["whole_documents"] = {k: v.model_dump() for k, v in whole.items()}
        if "train" in whole:
            meta["rows_one_whole_document"] = round(whole["train"].one_whole_document_share, 4)
    if telemetry:
        extra["telemetry"] = {k: v.model_dump() for k, v in telemetry.items()}
        if "train" in telemetry:
            version.write_file(UTILIZATION_PNG, utilization_png(telemetry["train"]))
            t = telemetry["train"]
            meta.update(
                utilization=round(t.utilization, 4),
                docs_per_row=round(t.docs_per_row, 3),
                avg_doc_tokens=round(t.avg_doc_tokens, 1),
                cropped_doc_frac=round(t.cropped_doc_frac, 4),
            )
    manifest = version.commit(upstream=ctx.upstream_hashes([upstream]), stats=stats, extra=extra)
    if UTILIZATION_PNG in {f.path for f in manifest.files}:
        png = f"{ctx.store.version_dir(manifest)}/{UTILIZATION_PNG}"
        meta["utilization_histogram"] = Markdown(f"![row utilization]({png})\n\n`{png}`")
    return Materialized(
        None, summary_metadata(ctx.store, manifest, documents=int(stats["documents"]), **meta)
    )


def utilization_png(telemetry: packing.PackingTelemetry) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    edges = telemetry.histogram_edges()
    fig, ax = plt.subplots(figsize=(6, 3), dpi=100)
    ax.bar(edges[:-1], telemetry.histogram, width=edges[1] - edges[0], align="edge")
    ax.set_xlabel("row utilization (valid tokens / seq_len)")
    ax.set_ylabel("rows")
    ax.set_title(f"{telemetry.policy}, seq_len {telemetry.seq_len}: {telemetry.utilization:.3f}")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def _row_problems(state: tuple[int, int], rows: pa.Table) -> list[str]:
    seq_len, vocab = state
    return rows_contract.validate_rows(rows, seq_len, vocab)


_ROWS = RowCheck(None, _row_problems)


def _every_row_is_seq_len(ctx: StageContext, stage: Stage, partition: str | None) -> CheckOutcome:
    manifest = ctx.latest(stage.name, None)
    vocab = int(ctx.latest(names.TOKENIZER, None).extra["tokenizer"]["vocab_size"])
    seq_len = int(manifest.extra["seq_len"])
    rows, problems = inspect_rows(ctx, manifest, _ROWS, (seq_len, vocab))
    return CheckOutcome(
        passed=not problems and rows > 0,
        metadata={"rows": rows, "seq_len": seq_len, "problems": "; ".join(problems[:5]) or "none"},
        description=problems[0] if problems else None if rows else nothing_left(ctx, stage.name),
    )


STAGE = Stage(
    name=names.PACKED_ROWS,
    grain=Grain.GLOBAL,
    group="tokens",
    description="BOS + tokens + EOS per document, cut into pieces of at most seq_len and "
    "packed best-fit into rows of exactly seq_len tokens (train and validation apart), with "
    "the pieces table that says where every piece of every document sits.",
    input=names.DOCUMENTS,
    reads=(names.TOKENIZER,),
    config_key="packing",
    config=packing.PackingConfig,
    catalog_defaults=lambda catalog: {
        "seq_len": catalog.seq_len,
        "source_weights": {s.id: s.weight for s in catalog.operational if s.weight != 1.0},
    },
    code=(packing.__name__, rows_contract.__name__, __name__),
    body=_body,
    reusable=True,
    checks=(
        Check(
            "every_row_is_exactly_seq_len",
            "Every row has the seven required columns at exactly seq_len, token ids in range, "
            "targets the next input token, loss masked exactly where no target is, pads only "
            "after valid_token_count (rows against the pieces table: the snapshot's "
            "document_consistency check).",
            _every_row_is_seq_len,
        ),
    ),
    kinds=("parquet", "numpy"),
)
