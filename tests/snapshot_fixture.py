"""Builds a small but real promoted snapshot directory (DESIGN section 4) for consumer tests.

Rows are random but valid packed rows: documents start with BOS and end with EOS, long
documents are split into pieces across rows, some rows end in padding, and rows are written
in a shuffled order so a consumer has to use `pack_id` and `pieces.parquet` to find things.
It does not depend on the rest of the pipeline; the lead may reuse it for `verify` tests.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tokenizers import Tokenizer
from tokenizers.models import WordLevel

from megacpp_pipeline.ledger import LEDGER_SCHEMA, Stage
from megacpp_pipeline.packed_rows import (
    IGNORE_INDEX,
    PACKED_SCHEMA_VERSION,
    PAD_DOC_ID,
    PIECES_SCHEMA,
    packed_rows_schema,
)

PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
# spelled as the tokenizer module spells them, so verify's round-trip check finds them
SPECIAL_TOKENS = {"<|pad|>": PAD_ID, "<|bos|>": BOS_ID, "<|eos|>": EOS_ID}
SPLITS = ("train", "validation")

DOCUMENTS_SCHEMA = pa.schema(
    [
        pa.field("doc_id", pa.int32(), nullable=False),
        pa.field("source_id", pa.string(), nullable=False),
        pa.field("path", pa.string(), nullable=False),
        pa.field("revision", pa.string(), nullable=False),
        pa.field("blob_sha", pa.string(), nullable=False),
        pa.field("license_expression", pa.string()),
        pa.field("license_source", pa.string(), nullable=False),
        pa.field("structure_source", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),
        pa.field("num_tokens", pa.int32(), nullable=False),
        pa.field("num_pieces", pa.int32(), nullable=False),
        pa.field("content_sha256", pa.string()),  # of the decoded text between BOS and EOS
    ]
)


@dataclass
class SplitTruth:
    """What the fixture wrote for one split, in `pack_id` order (row i has pack_id_base + i)."""

    pack_id_base: int
    columns: dict[str, np.ndarray]  # column -> [rows, seq_len] or [rows]
    shards: list[str]
    doc_ids: np.ndarray  # doc ids of this split, ascending


@dataclass
class SnapshotFixture:
    path: Path
    seq_len: int
    vocab_size: int
    documents: dict[int, np.ndarray]  # doc_id -> its tokens (BOS ... EOS), as packed
    splits: dict[str, SplitTruth] = field(default_factory=dict)

    def rows_by_pack_id(self, split: str, pack_ids: np.ndarray, column: str) -> np.ndarray:
        truth = self.splits[split]
        return truth.columns[column][np.asarray(pack_ids) - truth.pack_id_base]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fixed(values: np.ndarray, seq_len: int, dtype: pa.DataType) -> pa.FixedSizeListArray:
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1), type=dtype), seq_len)


def _pack_split(
    rng: np.random.Generator,
    doc_ids: np.ndarray,
    documents: dict[int, np.ndarray],
    seq_len: int,
    new_row_probability: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Lay documents out in one token stream of whole rows: (input_ids, doc_ids) flat.

    A document continues into the next row when it does not fit (so pieces span rows);
    sometimes a document starts a fresh row instead, leaving padding behind.
    """
    order = rng.permutation(doc_ids)  # packing order differs from doc_id order on purpose
    lengths = np.array([len(documents[int(d)]) for d in order], dtype=np.int64)
    starts = np.empty(len(order), dtype=np.int64)
    position = 0
    fresh_row = rng.random(len(order)) < new_row_probability
    for i, length in enumerate(lengths):
        if fresh_row[i] and position % seq_len:
            position += seq_len - position % seq_len
        starts[i] = position
        position += int(length)
    total = -(-position // seq_len) * seq_len
    tokens = np.full(total, PAD_ID, dtype=np.int32)
    owners = np.full(total, PAD_DOC_ID, dtype=np.int32)
    if len(order):
        first = np.cumsum(lengths) - lengths
        slots = np.repeat(starts, lengths) + (np.arange(lengths.sum()) - np.repeat(first, lengths))
        tokens[slots] = np.concatenate([documents[int(d)] for d in order])
        owners[slots] = np.repeat(order.astype(np.int32), lengths)
    return tokens, owners


def _pieces(owners: np.ndarray, seq_len: int, pack_id_base: int, split: str) -> pa.Table:
    slots = np.flatnonzero(owners != PAD_DOC_ID)
    doc = owners[slots]
    row = slots // seq_len
    new_piece = np.ones(len(slots), dtype=bool)
    new_piece[1:] = (doc[1:] != doc[:-1]) | (row[1:] != row[:-1]) | (np.diff(slots) != 1)
    starts = np.flatnonzero(new_piece)
    lengths = np.diff(np.append(starts, len(slots)))
    piece_doc = doc[starts]
    # the stream holds each document contiguously, so pieces of a doc are consecutive here
    new_doc = np.ones(len(starts), dtype=bool)
    new_doc[1:] = piece_doc[1:] != piece_doc[:-1]
    doc_first = np.maximum.accumulate(np.where(new_doc, np.arange(len(starts)), 0))
    return pa.table(
        {
            "doc_id": pa.array(piece_doc, pa.int32()),
            "piece_index": pa.array(np.arange(len(starts)) - doc_first, pa.int32()),
            "pack_id": pa.array(row[starts] + pack_id_base, pa.int64()),
            "row_offset": pa.array(slots[starts] % seq_len, pa.int32()),
            "length": pa.array(lengths, pa.int32()),
            "split": pa.array([split] * len(starts), pa.string()),
        },
        schema=PIECES_SCHEMA,
    )


def _rows(
    rng: np.random.Generator, tokens: np.ndarray, owners: np.ndarray, seq_len: int, base: int
) -> dict[str, np.ndarray]:
    input_ids = tokens.reshape(-1, seq_len)
    doc_ids = owners.reshape(-1, seq_len)
    same_doc = (doc_ids[:, :-1] == doc_ids[:, 1:]) & (doc_ids[:, :-1] != PAD_DOC_ID)
    target_ids = np.full_like(input_ids, IGNORE_INDEX)
    target_ids[:, :-1] = np.where(same_doc, input_ids[:, 1:], IGNORE_INDEX)
    row_starts_piece = np.ones(doc_ids.shape, dtype=bool)
    row_starts_piece[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    row_starts_piece &= doc_ids != PAD_DOC_ID
    chunk_kind = rng.integers(0, 8, size=input_ids.shape, dtype=np.uint8)
    chunk_kind[doc_ids == PAD_DOC_ID] = 0
    return {
        "pack_id": np.arange(len(input_ids), dtype=np.int64) + base,
        "input_ids": input_ids,
        "target_ids": target_ids,
        "loss_mask": (target_ids != IGNORE_INDEX).astype(np.uint8),
        "doc_ids": doc_ids,
        "valid_token_count": (doc_ids != PAD_DOC_ID).sum(axis=1).astype(np.int32),
        "num_docs": row_starts_piece.sum(axis=1).astype(np.int32),
        "chunk_kind": chunk_kind,
    }


def _tokenizer(vocab_size: int) -> Tokenizer:
    vocab = dict(SPECIAL_TOKENS)
    vocab.update({f"t{i}": i for i in range(3, vocab_size)})
    return Tokenizer(WordLevel(vocab=vocab, unk_token="<|pad|>"))


def build_snapshot(
    root: Path,
    *,
    seq_len: int = 32,
    vocab_size: int = 512,
    docs_per_split: dict[str, int] | None = None,
    max_doc_tokens: int | None = None,
    rows_per_shard: int = 16,
    row_group_rows: int = 4,
    new_row_probability: float = 0.3,
    with_chunk_kind: bool = True,
    compression: str = "zstd",
    complete: bool = True,
    content_hashes: bool = True,
    seed: int = 0,
) -> SnapshotFixture:
    """Write `root` as a snapshot directory (created; must not exist) and return its truth."""
    rng = np.random.default_rng(seed)
    docs_per_split = docs_per_split or {"train": 40, "validation": 8}
    max_doc_tokens = max_doc_tokens or 3 * seq_len
    root.mkdir(parents=True)
    fixture = SnapshotFixture(root, seq_len, vocab_size, {})
    schema = packed_rows_schema(seq_len, with_optional=with_chunk_kind)

    documents: dict[int, np.ndarray] = {}
    doc_split: dict[int, str] = {}
    split_doc_ids: dict[str, np.ndarray] = {}
    next_doc = 0
    for split in SPLITS:
        count = docs_per_split.get(split, 0)
        ids = np.arange(next_doc, next_doc + count, dtype=np.int32)
        next_doc += count
        lengths = rng.integers(3, max_doc_tokens + 1, size=count)
        for doc_id, length in zip(ids, lengths, strict=True):
            body = rng.integers(3, vocab_size, size=int(length) - 2, dtype=np.int32)
            documents[int(doc_id)] = np.concatenate([[BOS_ID], body, [EOS_ID]]).astype(np.int32)
            doc_split[int(doc_id)] = split
        split_doc_ids[split] = ids
    fixture.documents = documents

    manifest_splits: dict[str, dict[str, object]] = {}
    pieces_tables = []
    pack_id_base = 0
    for split in SPLITS:
        tokens, owners = _pack_split(
            rng, split_doc_ids[split], documents, seq_len, new_row_probability
        )
        columns = _rows(rng, tokens, owners, seq_len, pack_id_base)
        pieces_tables.append(_pieces(owners, seq_len, pack_id_base, split))
        n_rows = len(columns["pack_id"])
        order = rng.permutation(n_rows)  # rows are stored shuffled; pack_id stays the key
        (root / split).mkdir()
        shards = []
        for shard_no, lo in enumerate(range(0, n_rows, rows_per_shard)):
            take = order[lo : lo + rows_per_shard]
            arrays = []
            for field_ in schema:
                values = columns[field_.name][take]
                if pa.types.is_fixed_size_list(field_.type):
                    arrays.append(_fixed(values, seq_len, field_.type.value_type))
                else:
                    arrays.append(pa.array(values, field_.type))
            relpath = f"{split}/part-{shard_no:05d}.parquet"
            pq.write_table(
                pa.Table.from_arrays(arrays, schema=schema),
                root / relpath,
                row_group_size=row_group_rows,
                compression=compression,
            )
            shards.append(relpath)
        if not with_chunk_kind:
            del columns["chunk_kind"]
        fixture.splits[split] = SplitTruth(pack_id_base, columns, shards, split_doc_ids[split])
        manifest_splits[split] = {
            "rows": n_rows,
            "shards": shards,
            "documents": len(split_doc_ids[split]),
            "tokens": int((owners != PAD_DOC_ID).sum()),
        }
        pack_id_base += n_rows

    pieces = pa.concat_tables(pieces_tables)
    pq.write_table(pieces, root / "pieces.parquet")
    num_pieces = np.bincount(pieces.column("doc_id").to_numpy(), minlength=max(next_doc, 1)).astype(
        np.int32
    )
    doc_ids = np.arange(next_doc, dtype=np.int32)
    paths = [f"include/fixture/doc_{i:05d}.hpp" for i in doc_ids]
    tokenizer = _tokenizer(vocab_size)
    tokenizer.save(str(root / "tokenizer.json"))
    content_sha256: list[str | None] = [None] * next_doc
    if content_hashes:  # decoding is the slow part of a big fixture; benchmarks skip it
        texts = tokenizer.decode_batch(
            [documents[int(i)][1:-1].tolist() for i in doc_ids], skip_special_tokens=False
        )
        content_sha256 = [hashlib.sha256(t.encode()).hexdigest() for t in texts]
    pq.write_table(
        pa.table(
            {
                "doc_id": doc_ids,
                "source_id": ["fixture"] * next_doc,
                "path": paths,
                "revision": ["0" * 40] * next_doc,
                "blob_sha": [hashlib.sha1(p.encode()).hexdigest() for p in paths],
                "license_expression": ["MIT"] * next_doc,
                "license_source": ["file"] * next_doc,
                "structure_source": ["syntax"] * next_doc,
                "split": [doc_split[int(i)] for i in doc_ids],
                "num_tokens": np.array([len(documents[int(i)]) for i in doc_ids], np.int32),
                "num_pieces": num_pieces[:next_doc],
                "content_sha256": content_sha256,
            },
            schema=DOCUMENTS_SCHEMA,
        ),
        root / "documents.parquet",
    )
    pq.write_table(
        pa.table(
            {
                "source_id": ["fixture"] * next_doc,
                "path": paths,
                "stage": [str(Stage.PACK)] * next_doc,
                "status": ["kept"] * next_doc,
                "reason": [None] * next_doc,
                "detail": [None] * next_doc,
                "dup_of": [None] * next_doc,
                "license_expression": ["MIT"] * next_doc,
            },
            schema=LEDGER_SCHEMA,
        ),
        root / "ledger.parquet",
    )

    files = sorted(
        p for p in root.rglob("*") if p.is_file() and p.name not in ("manifest.json", "_COMPLETE")
    )
    # the fields of megacpp_pipeline.snapshot.SnapshotManifest, so verify tests can reuse this
    manifest = {
        "schema_version": 1,
        "packed_schema_version": PACKED_SCHEMA_VERSION,
        "snapshot_id": f"fixture-{seed}",
        "name": "fixture",
        "created_at": "2026-01-01T00:00:00Z",
        "code_version": "fixture",
        "config_hash": "0" * 64,
        "seq_len": seq_len,
        "vocab_size": vocab_size,
        "tokenizer": {
            "sha256": _sha256(root / "tokenizer.json"),
            "vocab_size": vocab_size,
            "special_tokens": SPECIAL_TOKENS,
        },
        "splits": manifest_splits,
        "documents": next_doc,
        "ledger": {"fixture": {"collected": next_doc, "kept": next_doc, "dropped": 0}},
        "inputs": {},
        "files": [
            {
                "path": p.relative_to(root).as_posix(),
                "sha256": _sha256(p),
                "bytes": p.stat().st_size,
            }
            for p in files
        ],
    }
    tmp = root / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    os.replace(tmp, root / "manifest.json")
    if complete:
        (root / "_COMPLETE").write_text("")
    return fixture
