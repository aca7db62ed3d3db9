"""Pre-chunk dedup across all sources: decides which files are exact or near duplicates of
an earlier file, so a repeated file is judged whole, with its provenance, before chunking
(seed: "exact duplicates should be removed before chunking; near-duplicate handling is
valuable for vendored and lightly modified code").

Representative rule, for exact and near clusters alike: the member of lowest rank, where a
file that is not vendored ranks before every vendored one, then by doc_index, the position
in the canonical stream (sources in catalog order, then path). So the upstream copy of a
library wins over a project's vendored copy of it, whatever their catalog order, and among
copies of the same kind the earliest operational source's is kept.

Stages, each bounded by a slice of a shard or by one band, never by the corpus:
1. signatures: per slice of a shard (about 2 MB of text), an exact key and a MinHash
   signature per file; texts are dropped as soon as the slice is done (docs/*.parquet,
   signatures.u64, shingles.u64 when verifying);
2. exact: polars groups exact keys; each group's lowest rank is its representative;
3. bands: per slice, (band, band_hash, doc_index) rows as parquet, split into partitions by
   band_hash (bands/p=<n>/), about BAND_ROWS_PER_PARTITION rows each over the corpus;
4. candidates: per partition, polars groups rows by (band, band_hash) into buckets and emits
   (doc, bucket's lowest doc) pairs; a bucket lies in one partition, so partitions are
   independent (the ray engine runs one task each) and their pairs merge into the same set;
   a pair counts when its similarity clears the threshold;
5. clusters: union-find over integer doc ids (scipy connected components) joins exact and
   near pairs; every component keeps its member of lowest rank.
"""

from __future__ import annotations

import math
import os
import shutil
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, model_validator
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from megacpp_pipeline.core.ledger import LEDGER_SCHEMA, DropReason
from megacpp_pipeline.core.schemas import SCRUBBED_FILES
from megacpp_pipeline.corpus import minhash


class DedupConfig(BaseModel):
    """Thresholds of the dedup gate.

    With b bands of r rows, two files of Jaccard J become a candidate pair with probability
    P(J) = 1 - (1 - J**r)**b. For the default 32 bands x 8 rows (knee (1/b)**(1/r) = 0.65):

        J     0.30   0.50   0.60   0.70   0.75   0.80   0.85   0.90
        P(J)  0.002  0.118  0.418  0.850  0.966  0.997  1.000  1.000

    (25 x 10, knee 0.72, gives P(0.8) = 0.942 and P(0.85) = 0.996; 20 x 12 gives
    P(0.8) = 0.759.) The bands are set wide on purpose: a candidate becomes a duplicate
    only when its similarity to the bucket's representative is >= `threshold`, estimated
    from all `num_perm` slots (standard error sqrt(J(1-J)/num_perm) = 0.025 at J = 0.8) or
    computed exactly on shingle sets when `verify_candidates` is on. So the S-curve sets
    recall and the threshold sets precision.

    Defaults as measured by bench/bench_dedup.py on the labelled set (800 files, 400 copies
    at J >= 0.8): one_permutation, affine64 and one_permutation with verification all reach
    recall 1.0 and precision 1.0, so verification stays off (it stores every shingle hash,
    about twice the text on disk, and checks pairs one by one); one_permutation is the
    default scheme because it signs several times faster than 256 true permutations.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    exact_mode: Literal["content", "normalized_tokens"] = Field(
        "content",
        description="content: sha256 of the scrubbed text; normalized_tokens: 128-bit hash "
        "of the C++ token sequence, blind to comments and whitespace",
    )
    near: bool = True
    shingle_size: int = Field(5, ge=1, le=64, description="tokens per shingle")
    num_perm: int = Field(256, ge=16, le=4096, description="signature slots")
    bands: int = Field(32, ge=1)
    rows: int = Field(8, ge=1)
    threshold: float = Field(0.8, gt=0.0, le=1.0, description="Jaccard to call a near dup")
    scheme: Literal["one_permutation", "affine64"] = Field(
        "one_permutation",
        description="one_permutation: one hash per shingle, binned, densified (O(shingles)); "
        "affine64: num_perm permutations, bit-identical to datasketch 2.0 scheme='affine64'",
    )
    seed: int = Field(1, ge=0, lt=2**32)
    verify_candidates: bool = Field(
        False,
        description="check each candidate pair's true shingle Jaccard instead of the "
        "signature estimate (stores every file's shingle hashes under workdir)",
    )
    min_shingles: int = Field(
        1, ge=1, description="files with fewer shingles take part in exact dedup only"
    )

    @model_validator(mode="after")
    def _bands_fit_signature(self) -> DedupConfig:
        if self.bands * self.rows > self.num_perm:
            raise ValueError(
                f"bands x rows = {self.bands * self.rows} exceeds num_perm = {self.num_perm}"
            )
        return self


class DedupOrderError(ValueError):
    """The shard stream is not in canonical order, so 'lowest doc_index' would not mean
    'first source in the catalog, then path' and the kept copy would depend on the run."""

    def __init__(self, source_id: str, path: str, rule: str) -> None:
        super().__init__(f"{source_id}:{path}: {rule}")
        self.source_id = source_id
        self.path = path
        self.rule = rule


class DedupInputError(ValueError):
    """A shard lacks columns of schemas.SCRUBBED_FILES."""

    def __init__(self, shard_no: int, missing: list[str]) -> None:
        super().__init__(f"dedup shard {shard_no}: missing columns {missing}")
        self.shard_no = shard_no
        self.missing = missing


DECISIONS_SCHEMA = pa.schema(
    [
        pa.field("source_id", pa.string(), nullable=False),
        pa.field("path", pa.string(), nullable=False),
        pa.field("doc_index", pa.int64(), nullable=False),
        pa.field("status", pa.string(), nullable=False),  # kept | dropped
        pa.field("reason", pa.string()),  # DropReason value for dropped files
        pa.field("dup_of", pa.string()),  # "source_id:path" of the kept representative
        pa.field("cluster_id", pa.int64()),  # the representative's doc_index
        pa.field("similarity", pa.float32()),  # estimated Jaccard vs the representative
    ],
    metadata={"megacpp.table": "dedup_decisions", "megacpp.schema_version": "1"},
)

CLUSTERS_SCHEMA = pa.schema(
    [
        pa.field("cluster_id", pa.int64(), nullable=False),
        pa.field("size", pa.int64(), nullable=False),
        pa.field("exact", pa.int64(), nullable=False),  # members dropped as exact copies
        pa.field("near", pa.int64(), nullable=False),  # members dropped as near copies
        pa.field("representative", pa.string(), nullable=False),
        pa.field("members_sample", pa.list_(pa.string()), nullable=False),
    ],
    metadata={"megacpp.table": "dedup_clusters", "megacpp.schema_version": "1"},
)

MEMBERS_SAMPLE = 5


@dataclass
class DedupResult:
    decisions: pa.Table  # DECISIONS_SCHEMA, one row per input file, in doc_index order
    stats: Counter[str] = field(default_factory=Counter)
    clusters: pa.Table = field(default_factory=CLUSTERS_SCHEMA.empty_table)  # biggest first


@dataclass
class Workdir:
    root: Path

    @property
    def docs(self) -> Path:
        return self.root / "docs"

    @property
    def bands(self) -> Path:
        return self.root / "bands"

    @property
    def signatures(self) -> Path:
        return self.root / "signatures.u64"

    @property
    def shingles(self) -> Path:
        return self.root / "shingles.u64"

    def band_partition(self, partition: int) -> Path:
        return self.bands / f"p={partition:04d}"

    def reset(self) -> None:
        for d in (self.docs, self.bands):
            if d.exists():
                shutil.rmtree(d)
            d.mkdir(parents=True)
        for f in (self.signatures, self.shingles):
            f.unlink(missing_ok=True)


_DOCS_SCHEMA = pa.schema(
    [
        pa.field("doc_index", pa.int64(), nullable=False),
        pa.field("source_id", pa.string(), nullable=False),
        pa.field("path", pa.string(), nullable=False),
        pa.field("exact_key", pa.string(), nullable=False),
        pa.field("n_shingles", pa.int64(), nullable=False),
        pa.field("shingle_offset", pa.int64(), nullable=False),  # into shingles.u64
        pa.field("vendored", pa.bool_(), nullable=False),  # a vendored copy ranks after upstream
    ]
)


class StreamOrder:
    """Checks the canonical order across shards: a source, once left, never returns, and
    paths strictly increase inside a source."""

    def __init__(self) -> None:
        self.finished: set[str] = set()
        self.current: str | None = None
        self.last_path = ""

    def check(self, sources: pa.ChunkedArray, paths: pa.ChunkedArray) -> None:
        if len(paths) == 0:
            return
        src = sources.combine_chunks()
        pth = paths.combine_chunks()
        same = pc.equal(src[1:], src[:-1]).to_numpy(zero_copy_only=False)
        increasing = pc.less(pth[:-1], pth[1:]).to_numpy(zero_copy_only=False)
        bad = np.flatnonzero(same & ~increasing)
        if len(bad):
            i = int(bad[0]) + 1
            raise DedupOrderError(str(src[i]), str(pth[i]), "paths must increase in a source")
        for i in [0, *(np.flatnonzero(~same) + 1).tolist()]:  # one per source run
            source, path = str(src[i]), str(pth[i])
            if source == self.current:
                if not path > self.last_path:
                    raise DedupOrderError(source, path, "paths must increase in a source")
                continue
            if source in self.finished:
                raise DedupOrderError(source, path, "source appears again after another one")
            if self.current is not None:
                self.finished.add(self.current)
            self.current = source
        self.last_path = str(pth[-1])


# Band rows per partition: a partition's bucket query holds about 70 bytes a row in polars,
# so 1M rows keep it near 70 MB whatever the corpus size.
BAND_ROWS_PER_PARTITION = 1_000_000


def band_partition_count(files: int, config: DedupConfig, at_least: int = 1) -> int:
    """How many band-hash partitions for about `files` input files."""
    return max(1, at_least, min(4096, math.ceil(files * config.bands / BAND_ROWS_PER_PARTITION)))


def find_duplicates(
    shards: Iterable[pa.Table], config: DedupConfig, workdir: Path, *, partitions: int = 1
) -> DedupResult:
    """Exact then near-duplicate decisions for every file of the stream.

    `shards` are tables of schema SCRUBBED_FILES in canonical order, consumed one at a time;
    `workdir` is owned by this call (its dedup subfolders are cleared first). Band rows are
    split into `partitions` by band hash (band_partition_count) and each partition's buckets
    are found on their own, so that step's memory is bounded by a partition."""
    work = Workdir(Path(workdir))
    work.reset()
    stats: Counter[str] = Counter()
    n_docs = _write_signatures(shards, config, work, stats, partitions)
    return decide(work, config, n_docs, stats, local_candidates(work, n_docs))


def decide(
    work: Workdir,
    config: DedupConfig,
    n_docs: int,
    stats: Counter[str],
    candidates: Candidates,
) -> DedupResult:
    """Stages 2 to 5 over a workdir that holds every file's docs row and signature (in
    doc_index order): exact groups, candidate pairs from `candidates` (which owns the band
    rows, wherever they are), the similarity check, union-find, decisions and clusters."""
    docs = pl.read_parquet(work.docs / "*.parquet") if n_docs else _empty_docs()
    rank = _ranks(docs, n_docs)
    exact_rep = _exact_representatives(docs, rank, n_docs)
    edges_u = [np.arange(n_docs, dtype=np.int64)]
    edges_v = [exact_rep]
    if config.near and n_docs:
        with SignatureFile(work.signatures, config.num_perm) as sig:
            u, v = _near_pairs(work, config, docs, exact_rep, sig, candidates, stats)
        edges_u.append(u)
        edges_v.append(v)
    representative = _component_representatives(
        np.concatenate(edges_u), np.concatenate(edges_v), rank
    )
    similarity = _similarity_to_representative(work, config, n_docs, representative)
    decisions = _decisions(docs, exact_rep, representative, similarity)
    dropped = pc.equal(decisions["status"], "dropped")
    stats["files"] += n_docs
    stats["kept"] += n_docs - int(pc.sum(dropped).as_py() or 0)
    for reason in (DropReason.EXACT_DUPLICATE, DropReason.NEAR_DUPLICATE):
        stats[f"dropped_{reason}"] += int(
            pc.sum(pc.equal(decisions["reason"], str(reason))).as_py() or 0
        )
    clusters = _clusters(decisions)
    stats["clusters"] += clusters.num_rows
    return DedupResult(decisions=decisions, stats=stats, clusters=clusters)


class SignatureFile:
    """Rows of a signatures file (doc_index order, num_perm uint64 each), read with pread.

    Not a memory map: the pages of a map count in the process' resident set once touched,
    so checking candidates spread over the whole file would hold the file's size (2 KiB a
    file at 256 slots) resident; pread leaves them to the page cache."""

    def __init__(self, path: Path, num_perm: int) -> None:
        self.num_perm = num_perm
        self.row_bytes = num_perm * 8
        self._fd = os.open(path, os.O_RDONLY)

    def __enter__(self) -> SignatureFile:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)

    def rows(self, index: minhash.I64) -> minhash.U64:
        out = np.empty((len(index), self.num_perm), dtype=np.uint64)
        raw = memoryview(out.data).cast("B")
        size = self.row_bytes
        for i, doc in enumerate(index.tolist()):
            got = os.preadv(self._fd, [raw[i * size : (i + 1) * size]], doc * size)
            if got != size:
                raise OSError(f"signatures: row {doc} is short ({got} of {size} bytes)")
        return out


def _empty_docs() -> pl.DataFrame:
    return pl.from_arrow(_DOCS_SCHEMA.empty_table())  # type: ignore[return-value]


def _slices(shard: pa.Table) -> list[tuple[int, int]]:
    """Row ranges of about minhash.TOKEN_BATCH_BYTES of text each (at least one row), so the
    gate's working memory is bounded by that, not by however large upstream made a shard."""
    sizes = pc.binary_length(shard["text"]).to_numpy(zero_copy_only=False).astype(np.int64)
    bounds, start, acc = [], 0, 0
    for i, size in enumerate(sizes.tolist()):
        if i > start and acc + size > minhash.TOKEN_BATCH_BYTES:
            bounds.append((start, i))
            start, acc = i, 0
        acc += size
    if start < len(sizes):
        bounds.append((start, len(sizes)))
    return bounds


@dataclass
class SignedSlice:
    """What signing one slice of a shard yields: its files' signatures (rows in doc order),
    their shingle hashes (kept only when candidates are verified), docs rows and band rows."""

    sig: minhash.U64
    shingles: minhash.U64
    docs: pa.Table  # _DOCS_SCHEMA; shingle_offset counts from the `shingle_offset` given
    bands: pa.Table | None  # BAND_SCHEMA rows of the files with shingles, or None


def check_columns(shard: pa.Table, shard_no: int) -> None:
    missing = set(SCRUBBED_FILES.names) - set(shard.column_names)
    if missing:
        raise DedupInputError(shard_no, sorted(missing))


def sign_table(
    shard: pa.Table,
    config: DedupConfig,
    first_doc: int,
    shingle_offset: int,
    stats: Counter[str],
) -> Iterator[SignedSlice]:
    """Stages 1 and 3 for one shard (or a row range of one), slice by slice of about
    minhash.TOKEN_BATCH_BYTES of text: working memory is bounded by that."""
    for lo, hi in _slices(shard):
        piece = shard.slice(lo, hi - lo)
        sig, shingles, docs = _sign(piece, config, first_doc, shingle_offset, stats)
        bands = band_rows(config, sig, docs["doc_index"].to_numpy())
        yield SignedSlice(sig, shingles.hashes, docs, bands)
        first_doc += piece.num_rows
        shingle_offset += len(shingles.hashes)


def _write_signatures(
    shards: Iterable[pa.Table],
    config: DedupConfig,
    work: Workdir,
    stats: Counter[str],
    partitions: int,
) -> int:
    """Stage 1 and 3: per shard, exact keys, signatures and band rows to disk."""
    order = StreamOrder()
    n_docs = 0
    shingle_offset = 0
    stats["shards"] += 0  # recorded even for an empty stream, as the ray engine records it
    with open(work.signatures, "wb") as sig_out:
        shingle_out = open(work.shingles, "wb") if config.verify_candidates else None  # noqa: SIM115
        try:
            for shard_no, shard in enumerate(shards):
                check_columns(shard, shard_no)
                order.check(shard["source_id"], shard["path"])
                stats["shards"] += 1
                for part, signed in enumerate(
                    sign_table(shard, config, n_docs, shingle_offset, stats)
                ):
                    sig_out.write(signed.sig.tobytes())
                    if shingle_out is not None:
                        shingle_out.write(signed.shingles.tobytes())
                    name = f"part-{shard_no:05d}-{part:04d}.parquet"
                    pq.write_table(signed.docs, work.docs / name)
                    if signed.bands is not None:
                        for p, rows in band_partitions(signed.bands, partitions):
                            folder = work.band_partition(p)
                            folder.mkdir(exist_ok=True)
                            pq.write_table(rows, folder / name)
                    shingle_offset += len(signed.shingles)
                    n_docs += signed.docs.num_rows
        finally:
            if shingle_out is not None:
                shingle_out.close()
    return n_docs


def _sign(
    piece: pa.Table, config: DedupConfig, first_doc: int, shingle_offset: int, stats: Counter[str]
) -> tuple[minhash.U64, minhash.TokenHashes, pa.Table]:
    """Signatures, shingles and the docs rows of one slice of a shard."""
    stats["bytes"] += int(pc.sum(pc.binary_length(piece["text"])).as_py() or 0)
    tokens = minhash.token_hashes(piece["text"].to_pylist())
    shingles = minhash.shingle_hashes(tokens, config.shingle_size)
    if config.exact_mode == "content":
        exact_key = piece["content_sha256"].combine_chunks()
    else:
        keys = minhash.token_sequence_keys(tokens)
        exact_key = pa.array([k.tobytes().hex() for k in keys], pa.string())
    if config.scheme == "affine64":
        sig = minhash.signatures(shingles, *minhash.permutations(config.num_perm, config.seed))
    else:
        sig = minhash.one_permutation_signatures(shingles, config.num_perm, config.seed)
    n_shingles = np.diff(shingles.offsets)
    # Too few shingles: an empty signature keeps the file out of the bands.
    sig[n_shingles < config.min_shingles] = minhash.EMPTY_HASH
    stats["tokens"] += len(tokens.hashes)
    stats["empty_signatures"] += int(np.count_nonzero(n_shingles < config.min_shingles))
    docs = pa.table(
        {
            "doc_index": np.arange(first_doc, first_doc + piece.num_rows, dtype=np.int64),
            "source_id": piece["source_id"].combine_chunks(),
            "path": piece["path"].combine_chunks(),
            "exact_key": exact_key,
            "n_shingles": n_shingles,
            "shingle_offset": shingle_offset + shingles.offsets[:-1],
            "vendored": piece["vendored"].combine_chunks()
            if "vendored" in piece.column_names
            else pa.array(np.zeros(piece.num_rows, dtype=bool)),
        },
        schema=_DOCS_SCHEMA,
    )
    return sig, shingles, docs


BAND_SCHEMA = pa.schema(
    [
        pa.field("band", pa.int16(), nullable=False),
        pa.field("band_hash", pa.uint64(), nullable=False),
        pa.field("doc_index", pa.int64(), nullable=False),
    ]
)


def band_rows(config: DedupConfig, sig: minhash.U64, doc_index: minhash.I64) -> pa.Table | None:
    """(band, band_hash, doc_index) rows of the files that have shingles, sorted by band.
    Bands never need each other until union-find, so the rows can be split by band hash
    (band_partitions) and each part's buckets found on its own."""
    live = ~np.all(sig == minhash.EMPTY_HASH, axis=1)
    if not config.near or not live.any():
        return None
    hashes = minhash.band_hashes(sig[live], config.bands, config.rows)  # (docs, bands)
    n_live = hashes.shape[0]
    return pa.table(
        {
            "band": np.repeat(np.arange(config.bands, dtype=np.int16), n_live),
            "band_hash": hashes.T.reshape(-1),
            "doc_index": np.tile(doc_index[live], config.bands),
        },
        schema=BAND_SCHEMA,
    )


def band_partitions(rows: pa.Table, partitions: int) -> Iterator[tuple[int, pa.Table]]:
    """The rows of each non-empty partition `band_hash % partitions`: a bucket (band,
    band_hash) lies in one partition, so partitions find their candidates independently."""
    part = np.asarray(rows["band_hash"].to_numpy() % np.uint64(partitions), dtype=np.int64)
    order = np.argsort(part, kind="stable")
    cuts = np.searchsorted(part[order], np.arange(partitions + 1))
    for p in range(partitions):
        if cuts[p + 1] > cuts[p]:
            yield p, rows.take(pa.array(order[cuts[p] : cuts[p + 1]]))


Candidates = Callable[[minhash.I64], tuple[minhash.I64, minhash.I64]]


def local_candidates(work: Workdir, n_docs: int) -> Candidates:
    """Candidate pairs from the band rows under work.bands, one partition at a time."""

    def find(reps: minhash.I64) -> tuple[minhash.I64, minhash.I64]:
        folders = sorted(work.bands.glob("p=*"))
        parts = (
            candidate_pairs(pl.scan_parquet(sorted(f.glob("*.parquet"))), reps) for f in folders
        )
        return merge_pairs(parts, n_docs)

    return find


def candidate_pairs(bands: pl.LazyFrame, reps: minhash.I64) -> tuple[minhash.I64, minhash.I64]:
    """(doc, bucket's lowest doc) for every representative in a bucket that is not its
    lowest, sorted and distinct. Exact duplicates follow their representative through the
    exact edges, so only representatives (`reps`) meet in buckets. Buckets are keyed by
    (band, band_hash), so a part of the band rows split by band hash gives its own pairs;
    polars' streaming engine runs the window min (half the peak memory of list aggregation)."""
    found = (
        bands.join(pl.DataFrame({"doc_index": reps}).lazy(), on="doc_index", how="semi")
        .with_columns(pl.col("doc_index").min().over("band", "band_hash").alias("root"))
        .filter(pl.col("doc_index") != pl.col("root"))
        .select("doc_index", "root")
        .unique()
        .sort("doc_index", "root")
        .collect(engine="streaming")
    )
    return (
        found["doc_index"].to_numpy().astype(np.int64),
        found["root"].to_numpy().astype(np.int64),
    )


def merge_pairs(
    parts: Iterable[tuple[minhash.I64, minhash.I64]], n_docs: int
) -> tuple[minhash.I64, minhash.I64]:
    """The distinct pairs of several partitions' candidates, sorted as one query sorts them
    (a pair whose files share buckets in two partitions is found by both)."""
    keys = [u * n_docs + v for u, v in parts if len(u)]
    if not keys:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    merged = np.unique(np.concatenate(keys))
    return merged // n_docs, merged % n_docs


def _ranks(docs: pl.DataFrame, n_docs: int) -> minhash.I64:
    """Each doc's place in the representative rule: upstream copies (not vendored) first,
    then canonical order (catalog, then path). The lowest rank of a cluster is kept."""
    if n_docs == 0:
        return np.empty(0, dtype=np.int64)
    ordered = docs.sort("doc_index")
    vendored = ordered["vendored"].to_numpy().astype(np.int64)
    return vendored * n_docs + ordered["doc_index"].to_numpy().astype(np.int64)


def _exact_representatives(docs: pl.DataFrame, rank: minhash.I64, n_docs: int) -> minhash.I64:
    """Stage 2: for every doc, the doc of lowest rank with the same exact key."""
    if n_docs == 0:
        return np.empty(0, dtype=np.int64)
    ranked = docs.sort("doc_index").with_columns(rank=pl.Series(rank))
    best = ranked.select(pl.col("rank").min().over("exact_key").alias("best"))["best"]
    return (best.to_numpy().astype(np.int64) % n_docs).astype(np.int64)


def _near_pairs(
    work: Workdir,
    config: DedupConfig,
    docs: pl.DataFrame,
    exact_rep: minhash.I64,
    sig: SignatureFile,
    candidates: Candidates,
    stats: Counter[str],
) -> tuple[minhash.I64, minhash.I64]:
    """Stage 4: candidate pairs band by band, then the similarity check."""
    u, v = candidates(np.flatnonzero(exact_rep == np.arange(len(exact_rep))))
    stats["candidate_pairs"] += len(u)
    if config.verify_candidates:
        similar = _true_jaccard(work, docs, u, v) >= config.threshold
    else:
        similar = _estimated_jaccard(sig, u, v) >= config.threshold
    stats["similar_pairs"] += int(np.count_nonzero(similar))
    return u[similar], v[similar]


def _estimated_jaccard(
    sig: SignatureFile, u: minhash.I64, v: minhash.I64
) -> npt.NDArray[np.float32]:
    out = np.empty(len(u), dtype=np.float32)
    step = 4096  # bounded: step x num_perm x 8 bytes per side
    for s in range(0, len(u), step):
        out[s : s + step] = minhash.estimated_jaccard(
            sig.rows(u[s : s + step]), sig.rows(v[s : s + step])
        )
    return out


def _true_jaccard(
    work: Workdir, docs: pl.DataFrame, u: minhash.I64, v: minhash.I64
) -> npt.NDArray[np.float32]:
    offsets = docs.sort("doc_index")["shingle_offset"].to_numpy()
    counts = docs.sort("doc_index")["n_shingles"].to_numpy()
    store = np.memmap(work.shingles, dtype=np.uint64, mode="r")
    out = np.empty(len(u), dtype=np.float32)
    # One pair at a time: each pair's sets are small and read straight from the memmap.
    for i, (x, y) in enumerate(zip(u.tolist(), v.tolist(), strict=True)):
        out[i] = minhash.jaccard(
            store[offsets[x] : offsets[x] + counts[x]], store[offsets[y] : offsets[y] + counts[y]]
        )
    return out


def _component_representatives(u: minhash.I64, v: minhash.I64, rank: minhash.I64) -> minhash.I64:
    """Stage 5: union-find over doc ids; each component's representative is its doc of
    lowest rank."""
    n_docs = len(rank)
    if n_docs == 0:
        return np.empty(0, dtype=np.int64)
    graph = coo_matrix((np.ones(len(u), dtype=np.int8), (u, v)), shape=(n_docs, n_docs))
    _, label = connected_components(graph, directed=False)
    lowest = np.full(label.max() + 1, 2 * n_docs, dtype=np.int64)
    np.minimum.at(lowest, label, rank)
    return lowest[label] % n_docs


def _similarity_to_representative(
    work: Workdir, config: DedupConfig, n_docs: int, representative: minhash.I64
) -> npt.NDArray[np.float32]:
    sim = np.full(n_docs, np.nan, dtype=np.float32)
    members = np.flatnonzero(representative != np.arange(n_docs))
    if len(members) == 0:
        return sim
    with SignatureFile(work.signatures, config.num_perm) as sig:
        sim[members] = _estimated_jaccard(sig, members, representative[members])
    return sim


def _decisions(
    docs: pl.DataFrame,
    exact_rep: minhash.I64,
    representative: minhash.I64,
    similarity: npt.NDArray[np.float32],
) -> pa.Table:
    n = len(representative)
    index = np.arange(n, dtype=np.int64)
    ordered = docs.sort("doc_index")
    source_id = ordered["source_id"].to_arrow().cast(pa.string())
    path = ordered["path"].to_arrow().cast(pa.string())
    dropped = representative != index
    # A file identical to an earlier one is an exact duplicate even when that earlier copy
    # is itself a near duplicate; dup_of always names the file that is kept.
    reason = pa.array(
        np.where(
            exact_rep != index, str(DropReason.EXACT_DUPLICATE), str(DropReason.NEAR_DUPLICATE)
        ),
        pa.string(),
        mask=~dropped,
    )
    cluster_size = np.bincount(representative, minlength=n)[representative]
    in_cluster = cluster_size > 1
    keys = pc.binary_join_element_wise(source_id, path, ":")
    dup_of = pc.if_else(pa.array(dropped), pc.take(keys, pa.array(representative)), None)
    return pa.table(
        {
            "source_id": source_id,
            "path": path,
            "doc_index": index,
            "status": pa.array(np.where(dropped, "dropped", "kept"), pa.string()),
            "reason": reason,
            "dup_of": dup_of.cast(pa.string()),
            "cluster_id": pa.array(representative, pa.int64(), mask=~in_cluster),
            "similarity": pa.array(similarity, pa.float32(), mask=~dropped),
        },
        schema=DECISIONS_SCHEMA,
    )


def _clusters(decisions: pa.Table) -> pa.Table:
    frame = pl.from_arrow(decisions)
    assert isinstance(frame, pl.DataFrame)
    grouped = (
        frame.filter(pl.col("cluster_id").is_not_null())
        .with_columns(key=pl.col("source_id") + ":" + pl.col("path"))
        .sort("doc_index")
        .group_by("cluster_id", maintain_order=True)
        .agg(
            size=pl.len().cast(pl.Int64),
            exact=(pl.col("reason") == str(DropReason.EXACT_DUPLICATE)).sum().cast(pl.Int64),
            near=(pl.col("reason") == str(DropReason.NEAR_DUPLICATE)).sum().cast(pl.Int64),
            representative=pl.col("key").filter(pl.col("status") == "kept").first(),
            members_sample=pl.col("key").slice(1, MEMBERS_SAMPLE),
        )
        .sort(["size", "cluster_id"], descending=[True, False])
    )
    return grouped.to_arrow().cast(CLUSTERS_SCHEMA)


def markdown_top_clusters(result: DedupResult, n: int = 10) -> str:
    """The n biggest clusters as a markdown table (for the asset's UI metadata)."""
    top = result.clusters.slice(0, n).to_pylist()
    lines = [
        f"{result.stats['dropped_exact_duplicate']} exact and "
        f"{result.stats['dropped_near_duplicate']} near duplicates in "
        f"{result.clusters.num_rows} clusters; the {len(top)} biggest:",
        "",
        "| cluster | files | exact | near | kept | sample of dropped |",
        "|---:|---:|---:|---:|---|---|",
    ]
    for row in top:
        sample = "<br>".join(f"`{m}`" for m in row["members_sample"])
        more = row["size"] - 1 - len(row["members_sample"])
        if more > 0:
            sample += f"<br>… and {more} more"
        lines.append(
            f"| {row['cluster_id']} | {row['size']} | {row['exact']} | {row['near']} "
            f"| `{row['representative']}` | {sample} |"
        )
    return "\n".join(lines)


def ledger_rows(decisions: pa.Table, include_kept: bool = False) -> pa.Table:
    """Ledger rows (ledger.LEDGER_SCHEMA; the runner stamps the stage) for the dropped
    files, with dup_of, and for every file when `include_kept`. Cluster id and estimated
    similarity ride in `detail` ("cluster 12; estimated jaccard 0.91")."""
    rows = decisions
    if not include_kept:
        rows = decisions.filter(pc.equal(decisions["status"], "dropped"))
    cluster = pc.cast(rows["cluster_id"], pa.string())
    dropped_detail = pc.binary_join_element_wise(
        "cluster ",
        cluster,
        "; estimated jaccard ",
        pc.cast(pc.round(rows["similarity"], 3), pa.string()),
        "",
    )
    kept_detail = pc.binary_join_element_wise("representative of cluster ", cluster, "")
    detail = pc.if_else(pc.equal(rows["status"], "dropped"), dropped_detail, kept_detail)
    return pa.table(
        {
            "source_id": rows["source_id"],
            "path": rows["path"],
            "stage": pa.array([""] * rows.num_rows, pa.string()),
            "status": rows["status"],
            "reason": rows["reason"],
            "detail": detail,
            "dup_of": rows["dup_of"],
            "license_expression": pa.nulls(rows.num_rows, pa.string()),
            "sha256": pa.nulls(rows.num_rows, pa.string()),
        },
        schema=LEDGER_SCHEMA,
    )


def kept_rows(shard: pa.Table, decisions: pa.Table) -> pa.Table:
    """The rows of one shard that dedup keeps, in their original order."""
    kept = decisions.filter(pc.equal(decisions["status"], "kept"))
    kept_keys = pc.binary_join_element_wise(kept["source_id"], kept["path"], "\x00")
    shard_keys = pc.binary_join_element_wise(shard["source_id"], shard["path"], "\x00")
    return shard.filter(pc.is_in(shard_keys, value_set=kept_keys))
