"""A snapshot's documents as text again, from the snapshot alone: each document's pieces
gathered from the packed rows through pieces.parquet, FIM order restored, BOS/EOS stripped,
decoded with the snapshot's own tokenizer.json. The round-trip promotion check compares the
result with each document's content_sha256; `megacpp explain --file` signs it for near-dup
lookups. Documents are gathered a bounded number at a time (every shard is read once per
group), so memory follows the group, not the snapshot."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from megacpp_pipeline.corpus.packing import restore_fim_order
from megacpp_pipeline.corpus.tokenizer import SpecialIds
from megacpp_pipeline.snapshot.packed_rows import fixed_list_to_numpy
from megacpp_pipeline.snapshot.promote import SnapshotManifest

DOCS_PER_PASS = 20_000
DECODE_BATCH_TOKENS = 1 << 20  # Python int lists cost ~36 bytes a token: decode in batches


@dataclass(frozen=True)
class DocumentText:
    doc_id: int
    text: str | None  # None when the document could not be rebuilt (see problem)
    problem: str | None = None


def _tokens(
    snap: Path, manifest: SnapshotManifest, wanted: set[int]
) -> dict[int, dict[int, np.ndarray]]:
    pieces = pl.DataFrame(pq.read_table(snap / "pieces.parquet")).filter(
        pl.col("doc_id").is_in(list(wanted))
    )
    by_pack = pieces.partition_by("pack_id", as_dict=True)
    parts: dict[int, dict[int, np.ndarray]] = {}
    for split in manifest.splits.values():
        for rel in split.shards:
            t = pq.read_table(snap / rel, columns=["pack_id", "input_ids"])
            ids = fixed_list_to_numpy(t["input_ids"], manifest.seq_len)
            for r, pack_id in enumerate(t["pack_id"].to_pylist()):
                ps = by_pack.get((pack_id,))
                if ps is None:
                    continue
                for doc_id, idx, off, length in ps.select(
                    ["doc_id", "piece_index", "row_offset", "length"]
                ).iter_rows():
                    # a copy, so the shard's token matrix is freed once this shard is done
                    parts.setdefault(doc_id, {})[idx] = ids[r, off : off + length].copy()
    return parts


def document_texts(
    snapshot_dir: Path, manifest: SnapshotManifest, doc_ids: Iterable[int] | None = None
) -> Iterator[DocumentText]:
    """Each document's text (all of them, or `doc_ids`), in doc_id order."""
    from tokenizers import Tokenizer

    snap = Path(snapshot_dir)
    tok = Tokenizer.from_file(str(snap / "tokenizer.json"))
    special = manifest.tokenizer.get("special_tokens", {})
    bos, eos = int(special.get("<|bos|>", 0)), int(special.get("<|eos|>", 1))
    if doc_ids is None:
        doc_ids = pq.read_table(snap / "documents.parquet", columns=["doc_id"])[
            "doc_id"
        ].to_pylist()
    ordered = sorted(set(doc_ids))
    for lo in range(0, len(ordered), DOCS_PER_PASS):
        group = ordered[lo : lo + DOCS_PER_PASS]
        parts = _tokens(snap, manifest, set(group))
        batch: list[list[int]] = []
        batch_ids: list[int] = []
        pending = 0
        for doc_id in group:
            pieces_of = parts.pop(doc_id, None)
            if not pieces_of:
                yield DocumentText(doc_id, None, "no tokens found in the rows")
                continue
            tokens = np.concatenate([pieces_of[i] for i in sorted(pieces_of)])
            if tokens[0] != bos or tokens[-1] != eos:
                yield DocumentText(doc_id, None, "not framed by BOS ... EOS")
                continue
            tokens = restore_fim_order(tokens, SpecialIds())  # FIM rows hold PRE/SUF/MID order
            batch.append(tokens[1:-1].tolist())
            batch_ids.append(doc_id)
            pending += tokens.size
            if pending >= DECODE_BATCH_TOKENS:
                yield from _decoded(tok, batch_ids, batch)
                batch, batch_ids, pending = [], [], 0
        if batch:
            yield from _decoded(tok, batch_ids, batch)


def _decoded(tok: object, doc_ids: list[int], ids: list[list[int]]) -> Iterator[DocumentText]:
    texts = tok.decode_batch(ids, skip_special_tokens=False)  # type: ignore[attr-defined]
    for doc_id, text in zip(doc_ids, texts, strict=True):
        yield DocumentText(doc_id, text)
