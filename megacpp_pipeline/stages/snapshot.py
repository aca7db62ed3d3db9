"""snapshot: promotion. The packed rows, tokenizer, documents, pieces and the ledger of
every stage become one snapshot directory, promoted only when every promotion check passes;
each check is also its own blocking check with its metrics, so the UI's check history is a
time series per property. The checks bound to the manifest's files (verify.MANIFEST_BOUND)
report what the promotion proved while the promoted manifest is byte for byte the one it
checked and the config is the same (file_checksums re-hashes every listed file each time);
otherwise, and for every other check, the check runs again."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from megacpp_pipeline.core.schemas import DOCUMENT_FILES
from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.executor import Executor, end_light_pool
from megacpp_pipeline.pipeline.memory import release_memory
from megacpp_pipeline.pipeline.registry import (
    Check,
    CheckOutcome,
    Grain,
    Markdown,
    Materialized,
    PathValue,
    Stage,
)
from megacpp_pipeline.snapshot import layout, verify
from megacpp_pipeline.snapshot.card import CardInputs, render_card
from megacpp_pipeline.snapshot.diff import diff_snapshots, render_markdown
from megacpp_pipeline.snapshot.layout import (
    CARD,
    COMPLETE,
    MANIFEST,
    REPORT_DIR,
    SnapshotManifest,
    SourceEntry,
)
from megacpp_pipeline.snapshot.packed_rows import PIECES_SCHEMA
from megacpp_pipeline.snapshot.promote import (
    ShardSource,
    SnapshotConfig,
    SnapshotError,
    SnapshotParts,
    SourceLedgers,
    build_snapshot,
    final_ledger_chunks,
    not_a_snapshot,
    own_cpu_s,
    promoted_in_store,
    read_manifest,
    unlisted_facts,
)
from megacpp_pipeline.snapshot.streams import coalesce, merge
from megacpp_pipeline.snapshot.text_release import TEXT_DIR, write_release
from megacpp_pipeline.stages import names
from megacpp_pipeline.stages.documents import documents_stream
from megacpp_pipeline.stages.packing import pieces_tables
from megacpp_pipeline.stages.removals import loaded_removals, removed_table
from megacpp_pipeline.storage.store import Manifest, ShardInfo, ShardStore, config_hash
from megacpp_pipeline.storage.versions import canonical_json, sha256_file


class SourceRows:
    """A stream of tables ordered by source (catalog order), handed out a source at a time:
    a corpus-wide version's ledger or document files, read once for all sources."""

    def __init__(self, tables: Iterable[pa.Table]) -> None:
        self._tables = iter(tables)
        self._head: pa.Table | None = None

    def of(self, source: str) -> Iterator[pa.Table]:
        while True:
            if self._head is None:
                self._head = next((t for t in self._tables if t.num_rows), None)
                if self._head is None:
                    return
            # the first row of another source (Arrow: no Python object per row)
            other = pc.index(pc.not_equal(self._head["source_id"], source), True).as_py()
            mine = self._head.num_rows if other < 0 else other
            if mine:
                yield self._head.slice(0, mine)
            if mine < self._head.num_rows:
                self._head = self._head.slice(mine)
                return
            self._head = None


def final_ledger_stream(ctx: StageContext) -> Iterator[pa.Table]:
    """The snapshot's ledger a chunk at a time: each source's collect ledger joined with
    every later stage's drops and the source's document files (promote.final_ledger_chunks);
    every stream is read once, in source then path order, its shards read ahead by forked
    workers (a stage's ledger as one stream over every source's version, or its one)."""
    stages = ctx.registry.ledger_stages()

    def ledger_of(name: str) -> SourceRows:
        versions = (
            [ctx.latest(name, s) for s in ctx.sources()]
            if ctx.registry.get(name).per_source
            else [ctx.latest(name, None)]
        )
        return SourceRows(coalesce(read_ahead(ctx, [(m, "ledger") for m in versions])))

    collected = ledger_of(stages[0])
    later = [ledger_of(name) for name in stages[1:]]
    # what the ledger takes of a kept file's row: where it is and its licence
    files = SourceRows(
        coalesce(document_files_stream(ctx, ["source_id", "path", "license_expression"]))
    )

    def sources() -> Iterator[SourceLedgers]:
        for source in ctx.sources():
            mine: Iterable[pa.Table] = files.of(source)
            if str(ctx.latest(names.DOCUMENTS).extra.get("mode", "file")) != "file":
                # repository documents list their files in include order: sort the source's
                mine = [
                    pa.concat_tables(list(mine) or [DOCUMENT_FILES.empty_table()]).sort_by("path")
                ]
            yield SourceLedgers(collected.of(source), [rows.of(source) for rows in later], mine)

    return final_ledger_chunks(sources())


def document_files_stream(
    ctx: StageContext, columns: list[str] | None = None
) -> Iterator[pa.Table]:
    """The documents version's document_files rows in doc_id order, read ahead (`columns`:
    only these)."""
    return read_ahead(ctx, [(ctx.latest(names.DOCUMENTS), "document_files")], columns)


# Consecutive shards read by one task up to this many bytes on disk: a ledger shard of a
# later stage holds tens of rows, and at demo 64x the snapshot's ledger writer read 1,216
# of them, each a task whose hand-out, pickled table and unpickling cost the writer's own
# process more than the rows did.
READ_BATCH_BYTES = 4 << 20
READ_BATCH_SHARDS = 8

_ShardRef = tuple[str, ShardInfo, list[str] | None]


def read_ahead(
    ctx: StageContext, tables: list[tuple[Manifest, str]], columns: list[str] | None = None
) -> Iterator[pa.Table]:
    """The shards of these versions' tables, in order, read and verified by a forked worker
    of this host (the process's light pool), consecutive small shards a task together (at
    most READ_BATCH_SHARDS of them and READ_BATCH_BYTES on disk, or one larger shard), at
    most four tasks ahead of the consumer (inline with one worker); `columns`: only these
    are decoded and sent."""
    batches: list[list[_ShardRef]] = []
    size = 0
    for m, table in tables:
        if table not in m.tables:
            continue
        vdir = ctx.store.version_dir(m)
        for shard in m.tables[table].shards:
            if (
                not batches
                or len(batches[-1]) >= READ_BATCH_SHARDS
                or size + shard.bytes > READ_BATCH_BYTES
            ):
                batches.append([])
                size = 0
            batches[-1].append((vdir, shard, columns))
            size += shard.bytes
    read = ctx.host_executor().stream(_read_shards, ctx.store, batches, ahead=4, workers=1)
    for tables_read in read:
        yield from tables_read


def _read_shards(store: ShardStore, refs: list[_ShardRef]) -> list[pa.Table]:
    """The shards `refs`, in order, those of one schema in a row as one table of one
    chunk."""
    runs: list[list[pa.Table]] = []
    for ref in refs:
        table = store.read_shard(*ref)
        if runs and table.schema == runs[-1][0].schema:
            runs[-1].append(table)
        else:
            runs.append([table])
    return [pa.concat_tables(run).combine_chunks() for run in runs]


def collected_sources(ctx: StageContext) -> dict[str, SourceEntry]:
    """Each operational source's kind and the revision its latest collection read."""
    out = {}
    for source in ctx.sources():
        raw = ctx.latest(ctx.registry.collection(), source)
        spec = ctx.catalog.source(source)
        out[source] = SourceEntry(
            kind=spec.kind,
            revision=str(raw.extra.get("revision", "")),
            declared_license=spec.declared_license,
        )
    return out


def summed_stats(ctx: StageContext, stage: str, prefix: str) -> dict[str, float]:
    """A stage's stats with this prefix over its versions (every source's, or its one)."""
    total: Counter[str] = Counter()
    partitions = ctx.partitions(stage)
    for partition in partitions:
        stats = ctx.latest(stage, partition).stats
        total.update({k: v for k, v in stats.items() if k.startswith(prefix)})
    return dict(total)


def card_inputs(ctx: StageContext, removed: CheckOutcome) -> CardInputs:
    """The stage figures the dataset card reports besides the snapshot's own files."""
    dedup = ctx.latest(names.DEDUPED_FILES).stats
    decontaminated = ctx.latest(names.DECONTAMINATED_FILES)
    index_stats = decontaminated.extra.get("index_stats") or {}
    found = decontaminated.stats
    benchmarks = [
        {
            "id": b.id,
            "tasks": int(index_stats.get(f"{b.id}:tasks", 0)),
            "files_dropped": int(found.get(f"benchmark:{b.id}:files_dropped", 0)),
            "files_excised": int(found.get(f"benchmark:{b.id}:files_excised", 0)),
        }
        for b in ctx.catalog.benchmarks
    ]
    packed = ctx.latest(names.PACKED_ROWS).extra
    telemetry = (packed.get("telemetry") or {}).get("train") or {}
    whole = (packed.get("whole_documents") or {}).get("train") or {}
    return CardInputs(
        scrub_kinds={
            k.removeprefix("kind:"): int(v)
            for k, v in summed_stats(ctx, names.SCRUBBED_FILES, "kind:").items()
        },
        dedup={
            "exact": int(dedup.get("dropped_exact_duplicate", 0)),
            "near": int(dedup.get("dropped_near_duplicate", 0)),
            "clusters": int(dedup.get("clusters", 0)),
        },
        benchmarks=benchmarks,
        removals={
            "entries": len(loaded_removals(ctx.catalog)),
            "files": int(sum(summed_stats(ctx, names.REMOVED_FILES, "removed_by:").values())),
            "near_remaining": int(removed.metadata.get("near_duplicates_remaining", 0)),
        },
        utilization=telemetry.get("utilization"),
        whole_document_rows=whole.get("one_whole_document_share"),
        lengths=ctx.latest(names.DOCUMENTS).extra.get("lengths") or {},
        checks=[f"{c.name}: {c.description}" for c in STAGE.checks],
    )


def previous_snapshot(ctx: StageContext) -> Path | None:
    """The snapshot the latest `snapshot` version promoted, if it is still there."""
    if not ctx.store.has_version(names.SNAPSHOT):
        return None
    path = snapshot_dir_of(ctx)
    return path if (path / COMPLETE).exists() else None


def prune_store_snapshots(store: ShardStore, current: SnapshotManifest, keep: int) -> list[str]:
    """Older snapshots of the same name in the store's snapshots/ beyond the newest `keep`
    (the current one counts), by the `created_at` their manifests record (an object store
    has no trustworthy folder times); each loses `_COMPLETE` first, so no reader ever sees
    a partly deleted snapshot as whole. The removed folders."""
    done = [
        path
        for path, manifest in promoted_in_store(store, current.name)
        if manifest.snapshot_id != current.snapshot_id
    ]
    removed = done[: max(0, len(done) - (keep - 1))]
    for path in removed:
        store.delete_file(f"{path}/{COMPLETE}")
        store.delete_dir(path)
    return removed


def upload_beside_snapshot(ctx: StageContext, local: Path, *parts: str) -> str | None:
    """On an object store, put a folder built locally after promotion (the report, the
    Megatron export) at `<data dir>/<parts>`; its URI, or None on a local store."""
    store = ctx.store
    if store.is_local:
        return None
    target = store.join(*parts)
    store.upload_dir(local, target)
    return store.uri_of(target)


def megatron_dir(ctx: StageContext, snapshot_id: str) -> Path:
    """Where a snapshot's Megatron export is built: the promotion check exports there once
    and the megatron stage takes it."""
    return ctx.store.local_root(ctx.cache_dir) / "megatron" / snapshot_id


def snapshot_dir_of(ctx: StageContext) -> Path:
    """The directory of the snapshot the latest `snapshot` version promoted."""
    return Path(ctx.latest(names.SNAPSHOT, None).extra["snapshot_dir"])


def merged_pieces(ctx: StageContext, packed: Manifest) -> Iterator[pa.Table]:
    """Every pieces table of the packed version as one stream in (doc_id, copy, piece_index)
    order: each table is in doc_id order, and a document's copies come pass by pass (the
    merge keeps the earlier stream's rows first where a doc_id is in both). Each table's
    shards are read ahead by forked workers."""
    stream: Iterable[pa.Table] = iter(())
    for table in pieces_tables(packed):
        stream = merge(
            stream, coalesce(read_ahead(ctx, [(packed, table)])), "doc_id", PIECES_SCHEMA
        )
    return iter(stream)


@dataclass(frozen=True)
class _CheckApart:
    """What the promotion checks need in a worker of their own: the build, the config, where
    the Megatron export goes, and the host's executor, whose light maps their per-shard tasks
    run on (inherited through the fork; in the child they fork a pool of its own)."""

    snap: Path
    config: SnapshotConfig
    megatron_dir: Path
    executor: Executor


def _checks_apart(
    job: _CheckApart, names: tuple[str, ...]
) -> list[tuple[verify.CheckOutcome, float]]:
    """The promotion checks `names`, one after another in this (forked) process, each one's
    per-shard tasks on one pool as wide as the host, forked once for all of them: every
    check's shards spread over every core, and what stays in one process is each check's
    reduce (at demo 16x 0.24 CPU s or less). Each outcome, and this process's CPU seconds
    for it. (Side by side, each check had a share of the host's workers, ceil(W / 10) with
    W workers: the token-range check's shards at 1 TB took some 6,000 CPU s over 2 of them
    on 16 cores, while the short checks' shares sat idle.)"""
    mapper = job.executor.map_light
    done = []
    for name in names:
        start = own_cpu_s()
        outcome = verify.run_check(
            name, job.snap, job.config, mapper=mapper, megatron_dir=job.megatron_dir
        )
        done.append((outcome, own_cpu_s() - start))
        release_memory()  # the next check starts near what is live
    end_light_pool()  # its workers reaped
    return done


def _card_apart(inputs: CardInputs, built: tuple[Path, SnapshotManifest]) -> tuple[str, float]:
    """The dataset card, in a process of its own: it counts the snapshot's per-file tables
    (documents, their files, the ledger), and the pages Arrow's allocator takes to read them
    stay with the process that read them: in the driver, its peak rose by 40 MB at demo 16x
    and by 66 MB at 64x. The markdown and this process's CPU seconds for it."""
    start = own_cpu_s()
    markdown = render_card(*built, inputs)
    return markdown, own_cpu_s() - start


def _changes_apart(previous: Path, build_dir: Path) -> tuple[str, float]:
    """The card's changes since the previous snapshot (both ledgers merged), in a process
    of its own; the markdown and this process's CPU seconds for it."""
    start = own_cpu_s()
    markdown = render_markdown(diff_snapshots(previous, build_dir))
    release_memory()
    return markdown, own_cpu_s() - start


def _body(ctx: StageContext, stage: Stage, partition: str | None) -> Materialized:
    assert stage.input is not None
    config = ctx.config(stage)
    store = ctx.store
    packed = ctx.latest(stage.input)
    tok = ctx.latest(names.TOKENIZER)
    documents = ctx.latest(names.DOCUMENTS)
    vdir = store.version_dir(packed)
    info = tok.extra["tokenizer"]
    parts = SnapshotParts(
        name=ctx.catalog.snapshot,
        seq_len=int(packed.extra["seq_len"]),
        vocab_size=int(info["vocab_size"]),
        tokenizer_json=store.read_bytes(f"{store.version_dir(tok)}/{layout.TOKENIZER}"),
        tokenizer_info=info,
        tokenizer_policy=dict(tok.extra.get("policy") or {}),
        rows={
            split: [
                ShardSource(store.fs, f"{vdir}/{s.path}", s.sha256, s.bytes)
                for s in packed.tables[name].shards
            ]
            for split in layout.SPLITS
            if (name := layout.data_table(split)) in packed.tables
        },
        # opened by each single file's writer, a forked worker reading what it needs itself
        documents=lambda: documents_stream(ctx),
        document_files=lambda: document_files_stream(ctx),
        document_mode=str(documents.extra.get("mode", "file")),
        engine=ctx.engine.describe(),
        pieces=lambda: merged_pieces(ctx, packed),
        ledger=lambda: final_ledger_stream(ctx),
        ledger_stages=ctx.registry.ledger_stages(),
        sources={
            sid: entry.model_copy(
                update={"weight": float((packed.extra.get("source_weights") or {}).get(sid, 1.0))}
            )
            for sid, entry in collected_sources(ctx).items()
        },
        draw_seed=int(packed.extra.get("draw_seed", 0)),
        inputs=ctx.upstream_hashes([packed, documents, tok]),
        code_version=ctx.code_version(stage),
        config_hash=config_hash(ctx.catalog),
    )

    removed = _no_removed_content(ctx, stage, None)  # needs the store, not the build
    inputs = card_inputs(ctx, removed)

    previous = previous_snapshot(ctx)
    changes: list[str] = []

    host = ctx.host_executor()  # the build is a folder of this host
    # the CPU seconds of each step that ran in a process of its own: a single file's writer,
    # a promotion check, the card and its diff (bench_driver projects each to 1 TB)
    steps: dict[str, float] = {}

    def card(build_dir: Path, manifest: SnapshotManifest) -> str:
        release_memory()  # what writing the single files freed
        if previous is not None and previous.name != manifest.snapshot_id:
            markdown, steps["diff"] = host.run_apart(_changes_apart, previous, build_dir)
            changes.append(markdown)
        inputs.changes = changes[0] if changes else None
        markdown, steps["card"] = host.run_apart(_card_apart, inputs, (build_dir, manifest))
        return markdown

    checked: list[tuple[SnapshotManifest, list[verify.CheckOutcome]]] = []  # by the gate

    def gate(build_dir: Path) -> list[str]:
        if config.text:  # the text release beside the rows, checked with everything else
            release = write_release(build_dir, build_dir / TEXT_DIR)
            ctx.log(f"snapshot: text release of {release.documents} documents in {TEXT_DIR}/")
        failures = []
        outcomes: list[verify.CheckOutcome] = []
        exports = megatron_dir(ctx, read_manifest(build_dir).snapshot_id)
        job = _CheckApart(build_dir, config, exports, host)
        checks = tuple(verify.ALL_CHECKS)
        for outcome, cpu_s in host.run_apart(_checks_apart, job, checks):
            outcomes.append(outcome)
            steps[f"check {outcome.name}"] = cpu_s
        for outcome in outcomes:
            ctx.log(f"promotion check {outcome.name}: {'pass' if outcome.passed else 'FAIL'}")
            if not outcome.passed:
                failures.append(f"{outcome.name}: {outcome.problems[0]}")
        release_memory()  # what the checks' results held
        checked.append((read_manifest(build_dir), outcomes))
        ctx.log(f"promotion check no_removed_content: {'pass' if removed.passed else 'FAIL'}")
        if not removed.passed:
            failures.append(f"no_removed_content_in_snapshot: {removed.description}")
        return failures

    root = store.local_root(ctx.cache_dir)
    writers: dict[str, float] = {}  # each single file's writer's own CPU seconds
    snap = build_snapshot(
        root, parts, keep=config.keep_snapshots, gate=gate, card=card, mapper=host.map_light,
        figures=writers,
    )  # fmt: skip
    steps.update({f"write {rel}": cpu_s for rel, cpu_s in writers.items()})
    manifest = read_manifest(snap)
    recorded: dict[str, object] = {}  # what the promotion proved, for the Dagster checks
    # the snapshot kept may be one promoted before with the same content, whose manifest
    # differs only in when and from what it was made: what the checks proved holds for it
    if checked and verify.same_checked_facts(manifest, checked[-1][0]):
        recorded = promotion_record(snap, config, checked[-1][1])
    uploaded: dict[str, str] = {}
    if not store.is_local:  # the promoted snapshot goes to the store too, _COMPLETE last
        target = store.join("snapshots", manifest.snapshot_id)
        store.upload_dir(snap, target)
        uploaded["snapshot_uri"] = store.uri_of(target)
        pruned = prune_store_snapshots(store, manifest, config.keep_snapshots)
        if pruned:
            ctx.log(f"snapshot: removed {len(pruned)} older snapshot(s) from the store")
    version = ctx.begin(stage, None, config)
    listed = [f.path for f in manifest.files]
    version.commit(
        upstream=parts.inputs,
        extra={
            "snapshot_dir": str(snap),
            "snapshot_id": manifest.snapshot_id,
            # what a later run that keeps this folder checks beside the listed files
            UNLISTED: unlisted_facts(snap, listed, host.map_light),
            **uploaded,
            # for the report: what the card says of benchmarks and removals
            "benchmarks": list(inputs.benchmarks),
            "removals": dict(inputs.removals),
            "removal_notes": str(removed.metadata.get("why", "")),
            "promotion_checks": recorded,
            "single_process_steps_cpu_s": {k: round(v, 3) for k, v in sorted(steps.items())},
        },
    )
    return Materialized(
        None,
        {
            **_described(snap, manifest),
            "changes": Markdown(changes[0] if changes else "no previous snapshot of other content"),
        },
    )


def _described(snap: Path, manifest: SnapshotManifest) -> dict[str, Any]:
    return {
        "snapshot_dir": PathValue(str(snap)),
        "snapshot_id": manifest.snapshot_id,
        "documents": manifest.documents,
        "rows": sum(s.rows for s in manifest.splits.values()),
        "card": PathValue(str(snap / CARD)),
        "quality_report": PathValue(str(snap / REPORT_DIR / "quality_report.html")),
        **{f"{k}_rows": v.rows for k, v in manifest.splits.items()},
        **{f"{k}_tokens": v.tokens for k, v in manifest.splits.items()},
    }


def _still_whole(ctx: StageContext, version: Manifest) -> dict[str, Any] | None:
    """The snapshot a standing `snapshot` version promoted, described, when it is still
    there byte for byte (its manifest, marker and card, every file it lists with its sha256,
    and on an object store its uploaded copy's marker); None when it is not, so it is built
    again. A snapshot that stands is the one a new build would give: the same inputs, code
    and config make the same files and the same id (build_snapshot keeps the promoted one)."""
    snap = Path(str(version.extra.get("snapshot_dir", "")))
    why, manifest = _not_whole(ctx, version, snap)
    if why is not None or manifest is None:
        ctx.log(f"snapshot: {snap}: {why}; it is built again")
        return None
    return {**_described(snap, manifest), "changes": Markdown("none: its inputs did not change")}


def _removal_requests(ctx: StageContext) -> str:
    """The removal entries as the requests expand them now: the card counts them."""
    entries = [r.spec.model_dump(mode="json") for r in loaded_removals(ctx.catalog)]
    return "removals:" + hashlib.sha256(canonical_json(entries)).hexdigest()


UNLISTED = "unlisted_files"  # the version's extra: rel -> sha256 of the folder's other files


def _not_whole(
    ctx: StageContext, version: Manifest, snap: Path
) -> tuple[str | None, SnapshotManifest | None]:
    """(why the folder `version` promoted is not whole, None when it is; its manifest).
    Whole: every file its manifest lists at its size and sha256, nothing else but the
    manifest, its marker, the card and the text release, each the bytes the version
    recorded (the report aside, rendered again); on an object store, the uploaded copy the
    same bytes too."""
    if (why := not_a_snapshot(snap)) is not None:
        return why, None
    try:
        manifest = read_manifest(snap)
    except SnapshotError as e:
        return str(e), None
    if manifest.snapshot_id != version.extra.get("snapshot_id"):
        return f"its manifest names {manifest.snapshot_id}", None
    mapper = ctx.host_executor().map_light
    files = verify.check_files(snap, manifest, mapper)
    if not files.passed:
        return files.problems[0], None
    listed = [f.path for f in manifest.files]
    recorded: dict[str, str] = version.extra.get(UNLISTED) or {}
    if CARD not in recorded:
        return f"its version records no {CARD} (promoted by older code)", None
    found = unlisted_facts(snap, listed, mapper)
    if found != recorded:
        missing = sorted(set(recorded) - set(found))
        changed = sorted(r for r in set(found) & set(recorded) if found[r] != recorded[r])
        if missing:
            return f"{missing[0]}: missing", None
        if changed:
            return f"{changed[0]}: sha256 mismatch", None
        return f"{sorted(set(found) - set(recorded))[0]}: not the promoted folder's", None
    store = ctx.store
    if not store.is_local:  # the uploaded copy, its marker among the recorded files
        wanted = sorted(({f.path: f.sha256 for f in manifest.files} | recorded).items())
        job = (store, manifest.snapshot_id)
        problems = [p for p in mapper(_uploaded_problem, job, wanted) if p is not None]
        if problems:  # each object read and hashed in a task of the host's light pool
            return problems[0], None
    return None, manifest


def _uploaded_problem(job: tuple[ShardStore, str], item: tuple[str, str]) -> str | None:
    """Why the uploaded copy of one file of a snapshot is not the promoted bytes, if not."""
    store, snapshot_id = job
    rel, sha = item
    path = store.join("snapshots", snapshot_id, rel)
    if not store.exists(path) or store.sha256_of(path) != sha:
        return f"{store.uri_of(path)}: missing or not the promoted bytes"
    return None


_DESCRIPTIONS = {
    "file_checksums": "Every file of the snapshot has the sha256 and size its manifest lists.",
    "schema_contract": "The seven required packed-row columns with their exact Arrow types and "
    "length seq_len; optional columns known to the schema version.",
    "token_range_and_pads": "Every id in [0, vocab_size); pads only after valid_token_count.",
    "document_consistency": f"doc_ids match {layout.DOCUMENTS} and {layout.PIECES}; every "
    f"document's pieces are present, in order; {layout.DOCUMENT_FILES} lists every kept file "
    "once, its members' token spans tiling each document.",
    "round_trip_decode": "Documents rebuilt from their pieces decode to exactly the scrubbed text.",
    "ledger_completeness": "Per source: collected == kept + dropped; kept == the files "
    f"{layout.DOCUMENT_FILES} lists.",
    "consumer_smoke_read": "The static-shape loader reads batches from each split.",
    "megatron_read_back": "The .bin/.idx export read back by an independent reader has the "
    "snapshot's document count and tokens.",
    "dataset_card": f"{layout.CARD} is a Hugging Face dataset card whose figures (documents, rows, "
    "tokens, tokenizer) and data files are the manifest's.",
    "text_release": "The text release in text/ (the snapshot stage's `text` option) lists every "
    "document in the rows once, its files' sha256 match, and a sample of its texts "
    "re-tokenized with the snapshot's tokenizer gives the snapshot's tokens; none: passes.",
}


def promotion_record(
    snap: Path, config: SnapshotConfig, outcomes: list[verify.CheckOutcome]
) -> dict[str, object]:
    """What a promotion proved that holds for as long as the promoted manifest's bytes and
    the config do: the passed outcomes of the manifest-bound checks (verify.MANIFEST_BOUND)
    with their metrics, beside that manifest's sha256 and the config's hash."""
    return {
        "manifest_sha256": sha256_file(snap / MANIFEST),
        "config": config_hash(config),
        "passed": {
            o.name: {k: v for k, v in o.metrics.items() if isinstance(v, (int, float, str))}
            for o in outcomes
            if o.passed and o.name in verify.MANIFEST_BOUND
        },
    }


def _recorded(ctx: StageContext, stage: Stage, snap: Path, name: str) -> dict[str, Any] | None:
    """The metrics the promotion recorded for check `name`, when the snapshot there has the
    manifest it checked (byte for byte) and the stage's config is the one it ran with."""
    record = ctx.latest(names.SNAPSHOT, None).extra.get("promotion_checks") or {}
    passed = record.get("passed") or {}
    if name not in passed or record.get("config") != config_hash(ctx.config(stage)):
        return None
    manifest = snap / MANIFEST
    if not manifest.is_file() or sha256_file(manifest) != record.get("manifest_sha256"):
        return None
    return dict(passed[name])


def _promotion_check(name: str) -> Check:
    def evaluate(ctx: StageContext, stage: Stage, partition: str | None) -> CheckOutcome:
        snap = snapshot_dir_of(ctx)
        metrics = _recorded(ctx, stage, snap, name)
        if metrics is not None:  # the same bytes the promotion checked: its outcome stands
            return CheckOutcome(
                passed=True,
                metadata={
                    **metrics,
                    "problems": Markdown("none"),
                    "checked": "at promotion, over this manifest's bytes (file_checksums "
                    "re-hashes every file it lists on each evaluation)",
                },
            )
        host = ctx.host_executor()
        exports = megatron_dir(ctx, read_manifest(snap).snapshot_id)
        job = _CheckApart(snap, ctx.config(stage), exports, host)
        [(outcome, _)] = host.run_apart(_checks_apart, job, (name,))  # in a worker of its own
        return CheckOutcome(
            passed=outcome.passed,
            metadata={
                **{k: v for k, v in outcome.metrics.items() if isinstance(v, (int, float, str))},
                "problems": Markdown("\n".join(f"- {p}" for p in outcome.problems) or "none"),
            },
            description=outcome.problems[0] if outcome.problems else None,
        )

    return Check(name, _DESCRIPTIONS[name], evaluate)


def _no_removed_content(ctx: StageContext, stage: Stage, partition: str | None) -> CheckOutcome:
    """No removed file, and no copy of removed content, is among the documents; another
    file that is only a near duplicate of a removed one is listed with why it stays."""
    from megacpp_pipeline.gates import removals

    removed = removed_table(ctx)
    requested = {r.sha256 for r in ctx.catalog.removals if r.sha256}
    near = ctx.config(names.DEDUPED_FILES)
    findings = []
    if removed.num_rows or requested:
        for source in ctx.sources():
            kept = ctx.latest(names.TOKENIZED_DOCS, source)
            texts = ctx.latest(names.ENRICHED_FILES, source)
            documents = {
                p
                for t in ctx.store.iter_tables(kept, columns=["path"])
                for p in t["path"].to_pylist()
            }
            for t in ctx.store.iter_tables(
                texts, columns=["source_id", "path", "text", "content_sha256", "blob_sha"]
            ):
                t = t.filter(pa.array([p in documents for p in t["path"].to_pylist()]))
                findings += removals.find_in_snapshot(removed, t, near, requested)
    bad = removals.violations(findings)
    remaining = removals.remaining_near_duplicates(findings)
    # an entry that removed nothing passes (the file may be gone upstream) but is named: a
    # takedown spelled otherwise than the path it means must not go unseen
    matched = set(removed["entry"].to_pylist())
    idle = [r.label for r in loaded_removals(ctx.catalog) if r.label not in matched]
    return CheckOutcome(
        passed=not bad,
        metadata={
            "removed_files": removed.num_rows,
            "entries_that_removed_nothing": len(idle),
            "idle_entries": Markdown("\n".join(f"- {e}" for e in idle[:20]) or "none"),
            "violations": len(bad),
            "near_duplicates_remaining": len(remaining),
            "why": Markdown("\n".join(f"- {f.why}" for f in [*bad, *remaining][:20]) or "none"),
        },
        description=bad[0].why if bad else None,
    )


STAGE = Stage(
    name=names.SNAPSHOT,
    grain=Grain.GLOBAL,
    group="snapshot",
    description=f"The promoted training snapshot: {layout.MANIFEST}, {layout.TOKENIZER}, "
    f"documents, document_files, pieces, ledger, train/ and validation/ packed rows (and "
    f"with `text: true` the text release in text/), {layout.COMPLETE} last. "
    "Built beside its final place and renamed in only when schema, token range, document "
    "consistency, round-trip, ledger, loader and Megatron checks all pass.",
    input=names.PACKED_ROWS,
    reads=(
        names.TOKENIZER,
        names.DOCUMENTS,
        names.REMOVED_FILES,  # the removal check and the card
        names.SCRUBBED_FILES,  # the card's scrub kinds
        names.DEDUPED_FILES,  # the card's dedup figures
        names.DECONTAMINATED_FILES,  # the card's benchmarks
        names.ENRICHED_FILES,  # the removal check reads the kept texts
        names.TOKENIZED_DOCS,
    ),
    reads_ledgers=True,  # the snapshot's ledger joins every stage's
    config_reads=(names.DEDUPED_FILES,),  # near duplicates of removed files
    config_key="snapshot",
    config=SnapshotConfig,
    code=(
        "megacpp_pipeline.snapshot.promote",
        "megacpp_pipeline.snapshot.text_release",
        verify.__name__,
        __name__,
    ),
    body=_body,
    reusable=True,
    still_whole=_still_whole,
    inputs_salt=_removal_requests,
    checks=(
        *(_promotion_check(name) for name in verify.ALL_CHECKS),
        Check(
            "no_removed_content_in_snapshot",
            "No file a removals entry names, and no copy of its content, is a document; near "
            "duplicates in other files are listed with why they stay.",
            _no_removed_content,
        ),
    ),
    manifest_check=False,
)
