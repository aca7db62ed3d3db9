"""Dedup as map and reduce over any executor, its intermediate files in a work folder of the
store (`<version>/_work`, removed before the commit), so every task may run on any host:

1. sign, one task per input slice: each file's exact key and signature (cached by content),
   written as the slice's docs rows (doc, source, path) and signatures, plus exact rows
   split by exact-key hash and band rows split by band hash into P partitions;
2. exact, one task per partition: each exact group's lowest rank is its representative;
   the members come back as (member, representative) rank pairs;
3. bands, one task per partition: each bucket's files pair with its lowest doc, and a pair
   counts when its estimated Jaccard (read from the two slices' signatures) clears the
   threshold; the distinct candidate and similar pairs come back;
4. the driver runs union-find over the pairs only (memory follows duplicates, not files)
   and gives each cluster member its representative;
5. apply, one task per input slice: its kept rows, ledger rows and decisions rows go
   straight into the new version, dup_of named from the representatives' docs rows.
"""

from __future__ import annotations

import contextlib
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from megacpp_pipeline.core import ledger
from megacpp_pipeline.core.gate import GateResult
from megacpp_pipeline.core.ledger import DropReason
from megacpp_pipeline.core.row_runs import rows_where
from megacpp_pipeline.core.schemas import DEDUPED_FILES
from megacpp_pipeline.corpus import minhash
from megacpp_pipeline.corpus.dedup import decisions, grouping, signing
from megacpp_pipeline.corpus.dedup.config import (
    DECISIONS_SCHEMA,
    DedupConfig,
    StreamOrder,
    band_partition_count,
    check_columns,
)
from megacpp_pipeline.snapshot import layout
from megacpp_pipeline.storage import slices
from megacpp_pipeline.storage.file_cache import FileResultCache, cached_gate_call, row_keys
from megacpp_pipeline.storage.store import (
    ShardInfo,
    ShardStore,
    ShardUploader,
    StoreError,
    WrittenSchema,
    conform,
)

_DOCS_SCHEMA = pa.schema(
    [
        pa.field("doc_index", pa.int64(), nullable=False),
        pa.field("source_id", pa.string(), nullable=False),
        pa.field("path", pa.string(), nullable=False),
        pa.field("n_shingles", pa.int64(), nullable=False),
        pa.field("shingle_offset", pa.int64(), nullable=False),  # into the slice's shingles
    ]
)


@dataclass(frozen=True)
class WorkArea:
    """A folder on a pyarrow filesystem (the store's, or a local one) for dedup's shuffles."""

    fs: pafs.FileSystem
    root: str

    def path(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    def _parent(self, path: str) -> None:
        if isinstance(self.fs, pafs.LocalFileSystem):
            self.fs.create_dir(path.rsplit("/", 1)[0], recursive=True)

    def write_table(self, rel: str, table: pa.Table) -> None:
        path = self.path(rel)
        try:
            self._parent(path)
            pq.write_table(table, path, filesystem=self.fs)
        except OSError as e:
            raise StoreError(f"{path}: write failed ({e})") from e

    def write_bytes(self, rel: str, data: bytes) -> None:
        path = self.path(rel)
        try:
            self._parent(path)
            with self.fs.open_output_stream(path) as f:
                f.write(data)
        except OSError as e:
            raise StoreError(f"{path}: write failed ({e})") from e

    def read_table(self, rel: str, columns: list[str] | None = None) -> pa.Table:
        return pq.read_table(self.path(rel), filesystem=self.fs, columns=columns)

    def tables_under(self, rel: str) -> pa.Table | None:
        """Every parquet file under `rel`, in name order, as one table (None: no file)."""
        infos = self.fs.get_file_info(pafs.FileSelector(self.path(rel), allow_not_found=True))
        files = sorted(i.path for i in infos if i.path.endswith(".parquet"))
        if not files:
            return None
        return pa.concat_tables(pq.read_table(f, filesystem=self.fs) for f in files)

    def remove(self, rel: str | None = None) -> None:
        """The folder `rel` under the area, or the whole area; one already gone is not an
        error."""
        try:
            self.fs.delete_dir(self.path(rel) if rel else self.root)
        except (FileNotFoundError, OSError):
            pass


# what the tasks write under a work area: per slice, its docs, signatures and shingles, and
# its rows of each band partition (exact keys, band keys) in that partition's folder
_SLICE_KINDS = ("docs", "sig", "shingles")
_PARTITIONED_KINDS = ("exact", "bands")


def _area_folders(partitions: int) -> list[str]:
    """Every folder the tasks write into, each removed by a task of its own (a folder of
    one kind holds a file per slice: at 64x the driver's own removal of them all took
    0.56 CPU s, and grows with the corpus)."""
    return [
        *_SLICE_KINDS,
        *(f"{kind}/p={k:04d}" for kind in _PARTITIONED_KINDS for k in range(partitions)),
    ]


def clear_task(area: WorkArea, rel: str) -> None:
    area.remove(rel)


def _part(kind: str, index: int, suffix: str = "parquet") -> str:
    assert kind in _SLICE_KINDS
    return f"{kind}/part-{index:05d}.{suffix}"


def _partition(kind: str, p: int, index: int) -> str:
    assert kind in _PARTITIONED_KINDS
    return f"{kind}/p={p:04d}/part-{index:05d}.parquet"


@dataclass(frozen=True)
class DedupJob:
    """What every task of one dedup run needs; inherited by forked workers, or put into
    Ray's object store once per map."""

    store: ShardStore
    config: DedupConfig
    area: WorkArea
    out_dir: str  # the new version's folder: apply writes its shards there
    n_docs: int
    partitions: int
    bounds: minhash.I64  # the first doc of every slice, then n_docs
    open_cache: Callable[[str], FileResultCache] | None = None  # per source
    ledger_stage: str = ""  # the stage name the ledger rows carry
    exact_members: minhash.I64 = field(default_factory=lambda: np.empty(0, np.int64))


@dataclass(frozen=True)
class SliceOfSource:
    index: int
    source: str
    pieces: tuple[slices.Piece, ...]
    first_doc: int


@dataclass
class SignResult:
    runs: list[tuple[str, str, str]]  # (source, first path, last path) of each source run
    stats: Counter[str]


# --- 1. sign ---------------------------------------------------------------------------------

_CACHES: dict[tuple[str, str], FileResultCache] = {}  # per process: (job, source)


def _signed(job: DedupJob, task: SliceOfSource, table: pa.Table) -> tuple[pa.Table, int]:
    config = job.config
    if job.open_cache is None:
        return signing.sign_files(table, config), 0
    key = (job.out_dir, task.source)
    if key not in _CACHES:
        _CACHES.clear()
        _CACHES[key] = job.open_cache(task.source)
    schemas = {"kept": signing.signed_schema(config), "dropped": ledger.LEDGER_SCHEMA}

    def gate(rows: pa.Table) -> GateResult:
        return GateResult(kept=signing.sign_files(rows, config))

    result, hits = cached_gate_call(_CACHES[key], table, row_keys(table, "text"), gate, schemas)
    return result.kept, hits


def sign_task(job: DedupJob, task: SliceOfSource) -> SignResult:
    table = slices.read(job.store, task.pieces)
    check_columns(table, f"slice {task.index} of {task.source}")
    StreamOrder().check(table["source_id"], table["path"])  # inside the slice
    config, area, n = job.config, job.area, table.num_rows
    signed, hits = _signed(job, task, table)
    sig = signing.signatures(signed, config.num_perm)
    n_shingles = signed["n_shingles"].to_numpy().astype(np.int64)
    doc = np.arange(task.first_doc, task.first_doc + n, dtype=np.int64)
    vendored = (
        table["vendored"].to_numpy(zero_copy_only=False).astype(bool)
        if "vendored" in table.column_names
        else np.zeros(n, dtype=bool)
    )
    rank = vendored.astype(np.int64) * job.n_docs + doc
    offsets = np.concatenate([[0], np.cumsum(n_shingles)[:-1]]).astype(np.int64)
    area.write_table(
        _part("docs", task.index),
        pa.table(
            {
                "doc_index": doc,
                "source_id": table["source_id"].combine_chunks(),
                "path": table["path"].combine_chunks(),
                "n_shingles": n_shingles,
                "shingle_offset": offsets,
            },
            schema=_DOCS_SCHEMA,
        ),
    )
    area.write_bytes(_part("sig", task.index, "u64"), np.ascontiguousarray(sig).tobytes())
    if config.verify_candidates:
        flat = pc.list_flatten(signed["shingles"]).to_numpy(zero_copy_only=False)
        area.write_bytes(_part("shingles", task.index, "u64"), flat.astype(np.uint64).tobytes())
    exact = signing.exact_rows(signed["exact_key"], rank)
    parts = signing.key_partitions(signed["exact_key"], job.partitions)
    for p, rows in signing.split_partitions(exact, parts, job.partitions):
        area.write_table(_partition("exact", p, task.index), rows)
    bands = signing.band_rows(config, sig, rank)
    if bands is not None:
        for p, rows in signing.band_partitions(bands, job.partitions):
            area.write_table(_partition("bands", p, task.index), rows)
    stats: Counter[str] = Counter(
        bytes=int(pc.sum(pc.binary_length(table["text"])).as_py() or 0),
        tokens=int(pc.sum(signed["n_tokens"]).as_py() or 0),
        empty_signatures=int(np.count_nonzero(n_shingles < config.min_shingles)),
        cached_files=hits,
    )
    return SignResult(_source_runs(table), stats)


def _source_runs(table: pa.Table) -> list[tuple[str, str, str]]:
    sources = table["source_id"].to_pylist()
    paths = table["path"].to_pylist()
    runs: list[tuple[str, str, str]] = []
    for i, source in enumerate(sources):
        if not runs or runs[-1][0] != source:
            runs.append((source, paths[i], paths[i]))
        else:
            runs[-1] = (source, runs[-1][1], paths[i])
    return runs


# --- reading other slices' signatures, shingles and names ------------------------------------


def _by_slice(job: DedupJob, docs: minhash.I64) -> Iterator[tuple[int, minhash.I64, minhash.I64]]:
    """(slice, positions in `docs`, rows within the slice) for each slice `docs` touch."""
    which = np.searchsorted(job.bounds, docs, side="right") - 1
    order = np.argsort(which, kind="stable")
    cuts = np.flatnonzero(np.diff(which[order])) + 1
    for group in np.split(order, cuts):
        if len(group):
            s = int(which[group[0]])
            yield s, group, docs[group] - job.bounds[s]


def signature_rows(job: DedupJob, docs: minhash.I64) -> minhash.U64:
    """The signatures of `docs` (any slices'), read from the slices' signature files."""
    width = job.config.num_perm * 8
    out = np.empty((len(docs), job.config.num_perm), dtype=np.uint64)
    for s, where, rows in _by_slice(job, docs):
        path = job.area.path(_part("sig", s, "u64"))
        with job.area.fs.open_input_file(path) as f:
            if len(rows) * 4 >= job.bounds[s + 1] - job.bounds[s]:  # most of it: read it all
                whole = np.frombuffer(f.read(), dtype=np.uint64).reshape(-1, job.config.num_perm)
                out[where] = whole[rows]
                continue
            for i, row in zip(where.tolist(), rows.tolist(), strict=True):
                raw = f.read_at(width, row * width)
                out[i] = np.frombuffer(raw, dtype=np.uint64)
    return out


def shingle_sets(job: DedupJob, docs: minhash.I64) -> list[minhash.U64]:
    """Every shingle hash of each of `docs` (when candidates are verified)."""
    out: list[minhash.U64] = [np.empty(0, np.uint64)] * len(docs)
    for s, where, rows in _by_slice(job, docs):
        meta = job.area.read_table(_part("docs", s), ["n_shingles", "shingle_offset"])
        count = meta["n_shingles"].to_numpy()
        offset = meta["shingle_offset"].to_numpy()
        with job.area.fs.open_input_file(job.area.path(_part("shingles", s, "u64"))) as f:
            for i, row in zip(where.tolist(), rows.tolist(), strict=True):
                raw = f.read_at(int(count[row]) * 8, int(offset[row]) * 8)
                out[i] = np.frombuffer(raw, dtype=np.uint64)
    return out


def names_of(job: DedupJob, docs: minhash.I64) -> dict[int, str]:
    """The name ("source:path") of each of `docs`, from their slices' docs rows."""
    names: dict[int, str] = {}
    for s, _where, rows in _by_slice(job, np.unique(docs)):
        meta = job.area.read_table(_part("docs", s), ["source_id", "path"])
        keys = pc.binary_join_element_wise(meta["source_id"], meta["path"], ":")
        picked = keys.take(pa.array(rows)).to_pylist()
        base = int(job.bounds[s])
        names.update(zip((base + rows).tolist(), picked, strict=True))
    return names


def similarity(job: DedupJob, u: minhash.I64, v: minhash.I64) -> npt.NDArray[np.float32]:
    """Estimated Jaccard of each doc pair (u[i], v[i]) from their signatures."""
    out = np.empty(len(u), dtype=np.float32)
    step = 4096  # bounded: step x num_perm x 8 bytes per side
    for s in range(0, len(u), step):
        out[s : s + step] = minhash.estimated_jaccard(
            signature_rows(job, u[s : s + step]), signature_rows(job, v[s : s + step])
        )
    return out


# --- 2. exact, 3. bands ----------------------------------------------------------------------


def exact_task(job: DedupJob, p: int) -> tuple[minhash.I64, minhash.I64]:
    rows = job.area.tables_under(f"exact/p={p:04d}")
    if rows is None:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return grouping.exact_edges(rows)


@dataclass
class BandResult:
    candidates: minhash.I64  # pair keys (grouping.pair_keys) of every candidate
    similar_u: minhash.I64  # ranks of the pairs that clear the threshold
    similar_v: minhash.I64


def band_task(job: DedupJob, p: int) -> BandResult:
    rows = job.area.tables_under(f"bands/p={p:04d}")
    empty = np.empty(0, np.int64)
    if rows is None:
        return BandResult(empty, empty, empty)
    n = job.n_docs
    u, v = grouping.bucket_pairs(rows, job.exact_members, n)
    if job.config.verify_candidates:
        a, b = shingle_sets(job, u % n), shingle_sets(job, v % n)
        sim = np.array([minhash.jaccard(x, y) for x, y in zip(a, b, strict=True)], np.float32)
    else:
        sim = similarity(job, u % n, v % n)
    keep = sim >= job.config.threshold
    return BandResult(grouping.pair_keys(u, v, n), u[keep], v[keep])


# --- 5. apply --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ApplyTask:
    slice: SliceOfSource
    member_doc: minhash.I64  # the slice's files that are in a cluster
    member_rep: minhash.I64  # their representatives' docs
    member_exact: npt.NDArray[np.bool_]  # an earlier-ranked file has their exact key
    named: minhash.I64  # the slice's docs whose names the clusters summary needs


@dataclass
class ApplyResult:
    source: str
    shards: dict[str, tuple[pa.Schema, ShardInfo, WrittenSchema]]
    names: dict[int, str]


def apply_task(job: DedupJob, task: ApplyTask) -> ApplyResult:
    piece = task.slice
    table, places = slices.read_located(job.store, piece.pieces)
    dropped = task.member_rep != task.member_doc
    sim = np.full(len(task.member_doc), np.nan, dtype=np.float32)
    if dropped.any():
        sim[dropped] = similarity(job, task.member_doc[dropped], task.member_rep[dropped])
    names = names_of(job, task.member_rep[dropped])
    rows = decisions.decision_rows(
        table, piece.first_doc, task.member_doc, task.member_rep, task.member_exact, sim, names
    )
    keep = pc.equal(rows["status"], "kept").to_numpy(zero_copy_only=False)
    uploader = ShardUploader(job.store, job.out_dir)
    shards: dict[str, tuple[pa.Schema, ShardInfo, WrittenSchema]] = {}
    outputs = [
        (layout.data_table(piece.source), rows_where(table, keep), DEDUPED_FILES),
        (
            "ledger",
            ledger.stamp(decisions.ledger_rows(rows), job.ledger_stage),
            ledger.LEDGER_SCHEMA,
        ),
        ("decisions", rows, DECISIONS_SCHEMA),
    ]
    for name, out, schema in outputs:
        out = conform(out, schema, f"{job.out_dir}: table {name!r}")
        if out.num_rows:
            relpath = f"{name.replace(':', '-')}-{piece.index:05d}.parquet"
            if schema is DEDUPED_FILES:  # the kept files' text stays where it is held
                shard, written, _ = uploader.write_kept(relpath, out, table, places)
            else:
                shard, written = uploader.write_parquet(relpath, out)
            shards[name] = (schema, shard, written)
    keys = pc.binary_join_element_wise(rows["source_id"], rows["path"], ":")
    local = task.named - piece.first_doc
    named = dict(zip(task.named.tolist(), keys.take(pa.array(local)).to_pylist(), strict=True))
    return ApplyResult(piece.source, shards, named)


# --- the driver ------------------------------------------------------------------------------


@dataclass
class DedupOutcome:
    applied: list[ApplyResult]  # per slice, in input order: the shards to adopt
    clusters: pa.Table
    stats: Counter[str]
    partitions: int


Map = Callable[[Callable[..., object], object, Sequence[object]], Iterator[object]]


def deduplicate(
    store: ShardStore,
    run: Map,
    workers: int,
    plan: Sequence[SliceOfSource],
    n_docs: int,
    config: DedupConfig,
    out_dir: str,
    *,
    shards: int,
    open_cache: Callable[[str], FileResultCache] | None = None,
    partitions: int | None = None,
    ledger_stage: str = "",
    clear: Map | None = None,
) -> DedupOutcome:
    """Dedup decisions for the slices of `plan` (canonical order, `n_docs` files), their
    shards written into `out_dir`; `run` is an executor's map. The work folder goes away
    whatever happens, after every map's tasks have ended (a failure here, the driver's own
    included, ends those still running instead of leaving them writing into it): once the
    decisions are made, a folder a task by `clear` (an executor's light map) where given,
    and what is left of it (all of it after a failure) by this process."""
    p = partitions or band_partition_count(n_docs, config, at_least=workers)
    bounds = np.array([s.first_doc for s in plan] + [n_docs], dtype=np.int64)
    area = WorkArea(store.fs, f"{out_dir}/_work-{uuid.uuid4().hex[:8]}")
    job = DedupJob(store, config, area, out_dir, n_docs, p, bounds, open_cache, ledger_stage)
    # every counter recorded, zero included: an empty corpus reports the same keys
    stats: Counter[str] = Counter(
        shards=shards, files=n_docs, bytes=0, tokens=0, empty_signatures=0, cached_files=0
    )
    with contextlib.ExitStack() as ending:
        ending.callback(area.remove)  # last, once every map below is closed

        def mapped(task: Callable[..., object], items: Sequence[object]) -> Iterator[object]:
            """`run` over the job, closed when the block is left."""
            results = run(task, job, items)
            close = getattr(results, "close", None)
            if close is not None:
                ending.callback(close)
            return results

        order = StreamOrder()
        for signed in mapped(sign_task, plan):
            assert isinstance(signed, SignResult)
            for source, first, last in signed.runs:  # the slices' boundaries, in stream order
                paths = [first] if first == last else [first, last]
                order.check(pa.chunked_array([[source] * len(paths)]), pa.chunked_array([paths]))
            stats.update(signed.stats)
        exact_u, exact_v = _concat(mapped(exact_task, range(p)))
        job = replace(job, exact_members=np.sort(exact_u))
        near_u, near_v = [exact_u], [exact_v]
        if config.near and n_docs:
            candidates, similar = [], []
            for band in mapped(band_task, range(p)):
                assert isinstance(band, BandResult)
                candidates.append(band.candidates)
                similar.append(grouping.pair_keys(band.similar_u, band.similar_v, n_docs))
                near_u.append(band.similar_u)
                near_v.append(band.similar_v)
            stats["candidate_pairs"] += len(np.unique(np.concatenate(candidates)))
            stats["similar_pairs"] += len(np.unique(np.concatenate(similar)))
        nodes, reps = grouping.components(np.concatenate(near_u), np.concatenate(near_v))
        member_doc, member_rep = nodes % max(1, n_docs), reps % max(1, n_docs)
        member_exact = grouping.in_sorted(nodes, job.exact_members)
        named = decisions.cluster_samples(member_doc, member_rep)
        tasks = _apply_tasks(plan, member_doc, member_rep, member_exact, named)
        applied = [a for a in mapped(apply_task, tasks) if isinstance(a, ApplyResult)]
        names = {k: v for a in applied for k, v in a.names.items()}
        clusters = decisions.clusters_table(member_doc, member_rep, member_exact, names)
        if clear is not None:
            for _ in clear(clear_task, area, _area_folders(p)):
                pass
    dropped = member_rep != member_doc
    exact = int(np.count_nonzero(dropped & member_exact))
    stats[f"dropped_{DropReason.EXACT_DUPLICATE}"] += exact
    stats[f"dropped_{DropReason.NEAR_DUPLICATE}"] += int(np.count_nonzero(dropped)) - exact
    stats["kept"] += n_docs - int(np.count_nonzero(dropped))
    stats["clusters"] += clusters.num_rows
    return DedupOutcome(applied, clusters, stats, p)


def _concat(pairs: Iterator[object]) -> tuple[minhash.I64, minhash.I64]:
    us, vs = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
    for pair in pairs:
        assert isinstance(pair, tuple)
        us.append(pair[0])
        vs.append(pair[1])
    return np.concatenate(us), np.concatenate(vs)


def _apply_tasks(
    plan: Sequence[SliceOfSource],
    member_doc: minhash.I64,
    member_rep: minhash.I64,
    member_exact: npt.NDArray[np.bool_],
    named: minhash.I64,
) -> list[ApplyTask]:
    """Each slice's share of the cluster members (what it must decide) and of the docs to
    name; the slices are in doc order, so both split by searchsorted."""
    order = np.argsort(member_doc, kind="stable")
    doc, rep, exact = member_doc[order], member_rep[order], member_exact[order]
    tasks = []
    ends = [s.first_doc for s in plan[1:]] + ([np.iinfo(np.int64).max] if plan else [])
    for s, end in zip(plan, ends, strict=True):
        lo, hi = np.searchsorted(doc, [s.first_doc, end])
        nlo, nhi = np.searchsorted(named, [s.first_doc, end])
        tasks.append(ApplyTask(s, doc[lo:hi], rep[lo:hi], exact[lo:hi], named[nlo:nhi]))
    return tasks


# --- in one process, for tests and benchmarks -----------------------------------------------


@dataclass
class DedupResult:
    decisions: pa.Table  # DECISIONS_SCHEMA, one row per input file, in doc order
    stats: Counter[str] = field(default_factory=Counter)
    clusters: pa.Table = field(
        default_factory=lambda: decisions.clusters_table(
            np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, bool), {}
        )
    )


def find_duplicates(
    shards: Sequence[pa.Table] | Iterator[pa.Table],
    config: DedupConfig,
    workdir: Path,
    *,
    partitions: int = 1,
    clear: Map | None = None,
) -> DedupResult:
    """Dedup decisions for a stream of SCRUBBED_FILES tables in canonical order, in this
    process: the same tasks as a pipeline run, each table one slice, the work folder and
    outputs under `workdir` (`clear`: as `deduplicate`'s)."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    store = ShardStore(str(workdir))
    plan: list[SliceOfSource] = []
    first = 0
    for i, shard in enumerate(shards):
        check_columns(shard, f"shard {i}")
        if shard.num_rows == 0:
            continue
        path = workdir / "input" / f"part-{i:05d}.parquet"
        path.parent.mkdir(exist_ok=True)
        pq.write_table(shard, path)
        source = str(shard["source_id"][0])
        plan.append(
            SliceOfSource(
                len(plan), source, (slices.Piece("", None, 0, shard.num_rows, str(path)),), first
            )
        )
        first += shard.num_rows
    out = str(workdir / "out")
    Path(out).mkdir(exist_ok=True)

    def run(task: Callable[..., object], job: object, items: Sequence[object]) -> Iterator[object]:
        return (task(job, item) for item in items)

    outcome = deduplicate(
        store, run, 1, plan, first, config, out, shards=len(plan), partitions=partitions,
        clear=clear,
    )  # fmt: skip
    parts = [
        pq.read_table(f"{out}/{a.shards['decisions'][1].path}")
        for a in outcome.applied
        if "decisions" in a.shards
    ]
    table = pa.concat_tables(
        [DECISIONS_SCHEMA.empty_table(), *(t.cast(DECISIONS_SCHEMA) for t in parts)]
    )
    return DedupResult(table, outcome.stats, outcome.clusters)
