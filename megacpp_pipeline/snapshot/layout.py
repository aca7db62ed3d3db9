"""The snapshot's format: the name of every file and table a promoted snapshot holds, and the
typed manifest that lists them. Writers in every layer, the checks and the loader read these
names from here and nowhere else, so this module imports nothing from the library but the
packed-row contract (the other format module)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from megacpp_pipeline.snapshot.packed_rows import PACKED_SCHEMA_VERSION

# 2: document_files.parquet and document_mode (repository documents)
# 3: source weights: pieces.copy, documents.draws, sources' weight, documents and sequences,
#    splits' sequences, draw_seed; tokenizer_policy
SCHEMA_VERSION = 3
SPLITS = ("train", "validation")

MANIFEST = "manifest.json"
COMPLETE = "_COMPLETE"  # written last; holds the manifest's sha256
TOKENIZER = "tokenizer.json"
DOCUMENTS = "documents.parquet"
DOCUMENT_FILES = "document_files.parquet"
PIECES = "pieces.parquet"
LEDGER = "ledger.parquet"
CARD = "README.md"  # the dataset card: describes the contract, not in the manifest's files
# The quality report is derived after promotion and is not part of the training contract:
# it lives in this folder, outside the manifest's file list.
REPORT_DIR = "report"


def shard(split: str, index: int) -> str:
    """A rows shard's path inside the snapshot."""
    return f"{split}/part-{index:05d}.parquet"


# Table names inside a store version: "data" in a per-source version, "data:<key>" in a
# corpus-wide one (key: the source, the split, or source:split for documents).
DATA = "data"


def data_table(key: str | None = None) -> str:
    return DATA if key is None else f"{DATA}:{key}"


def is_data_table(name: str) -> bool:
    return name == DATA or name.startswith(f"{DATA}:")


class FileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str
    sha256: str
    bytes: int
    rows: int | None = None


def snapshot_id_of(
    name: str, files: Iterable[FileEntry], code_version: str, config_hash: str, seq_len: int
) -> str:
    """A snapshot's id: its name and a hash of every listed file's path and sha256 with the
    code version, config hash and row length. Promotion names the snapshot by it; the
    file check recomputes it, so a manifest whose id does not name its content fails."""
    content = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.path):
        content.update(f"{f.path}\0{f.sha256}\n".encode())
    content.update(f"{code_version}\0{config_hash}\0{seq_len}".encode())
    return f"{name}-{content.hexdigest()[:16]}"


class SplitEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rows: int
    documents: int
    tokens: int  # valid (non-pad) tokens in the split's rows
    shards: list[str]
    # document copies packed into the rows (the sum of the documents' draws): what an epoch
    # over the rows trains on and what the Megatron export holds; None before source weights
    # (then every document once: `documents`)
    sequences: int | None = None


class SourceEntry(BaseModel):
    """A source as this snapshot collected it: what kind, at which revision, and its share of
    the mixture: its weight, its documents and the copies of them packed (`sequences`)."""

    model_config = ConfigDict(extra="forbid")
    kind: str
    revision: str
    declared_license: str | None = None
    weight: float = 1.0
    documents: int | None = None
    sequences: int | None = None


class SnapshotManifest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schema_version: int = SCHEMA_VERSION
    packed_schema_version: str = PACKED_SCHEMA_VERSION
    snapshot_id: str
    name: str
    created_at: str
    code_version: str
    config_hash: str
    seq_len: int
    vocab_size: int
    tokenizer: dict[str, Any]
    # where the tokenizer came from: mode (reuse | train | pinned), decision (reused |
    # trained | pinned), from_snapshot, reason; the card and `megacpp diff` say it
    tokenizer_policy: dict[str, Any] = Field(default_factory=dict)
    splits: dict[str, SplitEntry]
    documents: int
    # what a document is: "file" (one kept file) or "repository" (a source's files in
    # #include order, each after a `// <path>` line); DOCUMENT_FILES lists the files
    document_mode: str = "file"
    # the seed of the weighted draws (corpus/packing.py: document_draws), with each source's
    # weight: verify recomputes every document's draws from them
    draw_seed: int = 0
    # where the run that promoted it ran its per-file stages (pipeline/engine.py); not part
    # of the content: the same files give the same snapshot id on any engine
    engine: dict[str, Any] = Field(default_factory=lambda: {"engine": "local"})
    ledger: dict[str, dict[str, int]]  # source -> {collected, kept, dropped}
    ledger_stages: list[str] = Field(default_factory=list)  # the pipeline's stages, in order
    sources: dict[str, SourceEntry] = Field(default_factory=dict)  # every operational source
    inputs: dict[str, str]  # upstream asset manifests' sha256
    files: list[FileEntry]  # every file but MANIFEST and COMPLETE
