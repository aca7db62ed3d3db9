"""What dedup is configured with and what it writes: the thresholds (DedupConfig), the
decisions and clusters tables, the errors that name a file, the canonical stream order the
representative rule relies on, and how many partitions the shuffles use."""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field, model_validator

from megacpp_pipeline.core.errors import FieldedError
from megacpp_pipeline.core.schemas import SCRUBBED_FILES


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


class DedupOrderError(FieldedError, ValueError):
    """The shard stream is not in canonical order, so 'lowest doc_index' would not mean
    'first source in the catalog, then path' and the kept copy would depend on the run."""

    def __init__(self, source_id: str, path: str, rule: str) -> None:
        super().__init__(f"{source_id}:{path}: {rule}")
        self.source_id = source_id
        self.path = path
        self.rule = rule


class DedupInputError(FieldedError, ValueError):
    """A shard lacks columns of schemas.SCRUBBED_FILES; names the shard."""

    def __init__(self, where: str, missing: list[str]) -> None:
        super().__init__(f"dedup input {where}: missing columns {missing}")
        self.where = where
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


# Band rows per partition: a partition's bucket step holds about 40 bytes a row (the rows
# and their sort order), so 1M rows keep a task near 40 MB whatever the corpus size.
BAND_ROWS_PER_PARTITION = 1_000_000


def band_partition_count(files: int, config: DedupConfig, at_least: int = 1) -> int:
    """How many band-hash (and exact-key) partitions for about `files` input files: about
    BAND_ROWS_PER_PARTITION band rows each, and at least `at_least` (one per worker)."""
    return max(1, at_least, min(4096, math.ceil(files * config.bands / BAND_ROWS_PER_PARTITION)))


def check_columns(shard: pa.Table, where: str) -> None:
    missing = set(SCRUBBED_FILES.names) - set(shard.column_names)
    if missing:
        raise DedupInputError(where, sorted(missing))
