"""A snapshot's documents as text again, from the snapshot alone: each document's pieces
gathered from the packed rows through pieces.parquet, FIM order restored, BOS/EOS stripped,
decoded with the snapshot's own tokenizer.json; or each kept file's text, cut from its
document by document_files.parquet. The round-trip promotion check compares the results with
the documents' and the files' content_sha256; `megacpp explain --file` signs file texts for
near-dup lookups. Documents are gathered a bounded number at a time (every shard is read once per
group), so memory follows the group, not the snapshot."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from megacpp_pipeline.corpus.packing import restore_fim_order
from megacpp_pipeline.corpus.repository import split_member
from megacpp_pipeline.corpus.tokenizer import SpecialIds
from megacpp_pipeline.snapshot import layout
from megacpp_pipeline.snapshot.document_files import read_document_files
from megacpp_pipeline.snapshot.layout import SnapshotManifest
from megacpp_pipeline.snapshot.packed_rows import fixed_list_to_numpy, with_copy_column
from megacpp_pipeline.snapshot.streams import read_back

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
    # a weighted document packed more than once has identical copies: its first one will do
    # (Arrow only: a check that rebuilds documents runs in a forked worker, where polars may
    # hang)
    pieces = with_copy_column(pq.read_table(snap / layout.PIECES))
    pieces = pieces.filter(
        pc.and_(
            pc.is_in(pieces["doc_id"], pa.array(sorted(wanted), pieces["doc_id"].type)),
            pc.equal(pieces["copy"], 0),
        )
    )
    by_pack: dict[int, list[tuple[int, int, int, int]]] = {}
    columns = ("pack_id", "doc_id", "piece_index", "row_offset", "length")
    for pack, doc, index, offset, length in zip(
        *(pieces[c].to_pylist() for c in columns), strict=True
    ):
        by_pack.setdefault(pack, []).append((doc, index, offset, length))
    parts: dict[int, dict[int, np.ndarray]] = {}
    for split in manifest.splits.values():
        for rel in split.shards:
            for t in read_back(snap / rel, ["pack_id", "input_ids"]):  # a row group at a time
                ids = fixed_list_to_numpy(t["input_ids"], manifest.seq_len)
                for r, pack_id in enumerate(t["pack_id"].to_pylist()):
                    for doc_id, idx, off, length in by_pack.get(pack_id, ()):
                        # a copy, so the row group's token matrix is freed once it is done
                        parts.setdefault(doc_id, {})[idx] = ids[r, off : off + length].copy()
    return parts


@dataclass(frozen=True)
class FileText:
    """One kept file's text, cut from its document (its path marker line removed)."""

    doc_id: int
    position: int
    source_id: str
    path: str
    text: str


def _members(snap: Path, wanted: Iterable[int] | None) -> dict[int, list[tuple[int, int]]]:
    """doc_id -> its members' (start_token, num_tokens), in position order."""
    files = read_document_files(snap, ["doc_id", "position", "start_token", "num_tokens"])
    if wanted is not None:
        files = files.filter(pc.is_in(files["doc_id"], pa.array(list(wanted), pa.int32())))
    out: dict[int, list[tuple[int, int]]] = {}
    for doc_id, _, start, n in sorted(
        zip(*(files[c].to_pylist() for c in files.column_names), strict=True)
    ):
        out.setdefault(doc_id, []).append((start, n))
    return out


def packed_doc_ids(snap: Path) -> list[int]:
    """The documents that are in the rows: all of them, but for those their source's weight
    drew no copy of (`draws` 0 in documents.parquet)."""
    present = pq.read_schema(snap / layout.DOCUMENTS).names
    docs = pq.read_table(
        snap / layout.DOCUMENTS, columns=[c for c in ("doc_id", "draws") if c in present]
    )
    if "draws" in docs.column_names:
        docs = docs.filter(pc.greater(docs["draws"], 0))
    return [int(d) for d in docs["doc_id"].to_pylist()]


def document_tokens(
    snap: Path, manifest: SnapshotManifest, doc_ids: Iterable[int] | None
) -> Iterator[tuple[int, np.ndarray | str, list[tuple[int, int]]]]:
    """(doc_id, the document's own tokens in reading order, its members) per document, in
    doc_id order; a problem string instead of tokens when it could not be rebuilt."""
    special = manifest.tokenizer.get("special_tokens", {})
    bos, eos = int(special.get("<|bos|>", 0)), int(special.get("<|eos|>", 1))
    if doc_ids is None:
        doc_ids = packed_doc_ids(snap)
    ordered = sorted(set(doc_ids))
    for lo in range(0, len(ordered), DOCS_PER_PASS):
        group = ordered[lo : lo + DOCS_PER_PASS]
        parts = _tokens(snap, manifest, set(group))
        members = _members(snap, group)
        for doc_id in group:
            pieces_of = parts.pop(doc_id, None)
            mine = members.get(doc_id, [])
            if not pieces_of:
                yield doc_id, "no tokens found in the rows", mine
                continue
            tokens = np.concatenate([pieces_of[i] for i in sorted(pieces_of)])
            if tokens[0] != bos or tokens[-1] != eos:
                yield doc_id, "not framed by BOS ... EOS", mine
                continue
            # FIM rows hold PRE/SUF/MID order, per member file in a repository document
            starts = [start for start, _ in mine] if len(mine) > 1 else None
            yield doc_id, restore_fim_order(tokens, SpecialIds(), starts)[1:-1], mine


def _batched(
    items: Iterable[tuple[Any, np.ndarray]],
) -> Iterator[list[tuple[Any, np.ndarray]]]:
    """Token arrays in batches of about DECODE_BATCH_TOKENS (Python int lists cost ~36
    bytes a token)."""
    batch: list[tuple[Any, np.ndarray]] = []
    pending = 0
    for item in items:
        batch.append(item)
        pending += item[1].size
        if pending >= DECODE_BATCH_TOKENS:
            yield batch
            batch, pending = [], 0
    if batch:
        yield batch


def document_texts(
    snapshot_dir: Path, manifest: SnapshotManifest, doc_ids: Iterable[int] | None = None
) -> Iterator[DocumentText]:
    """Each document's text (all of them, or `doc_ids`), in doc_id order."""
    from megacpp_pipeline.corpus.tokenizer import read_artifact

    snap = Path(snapshot_dir)
    tok = read_artifact(snap / layout.TOKENIZER, str(manifest.tokenizer.get("sha256", "")))
    pending: list[tuple[int, np.ndarray]] = []

    def decoded() -> Iterator[DocumentText]:
        for batch in _batched(pending):
            texts = tok.decode_batch([t.tolist() for _, t in batch], skip_special_tokens=False)
            for (doc_id, _), text in zip(batch, texts, strict=True):
                yield DocumentText(doc_id, text)
        pending.clear()

    size = 0
    for doc_id, tokens, _ in document_tokens(snap, manifest, doc_ids):
        if isinstance(tokens, str):
            yield from decoded()
            size = 0
            yield DocumentText(doc_id, None, tokens)
            continue
        pending.append((doc_id, tokens))
        size += tokens.size
        if size >= DECODE_BATCH_TOKENS:
            yield from decoded()
            size = 0
    yield from decoded()


def file_texts(
    snapshot_dir: Path, manifest: SnapshotManifest, doc_ids: Iterable[int] | None = None
) -> Iterator[FileText]:
    """Each kept file's text, cut from its document by document_files' token spans (the
    path marker line, and the newline after a file that lacks one, dropped in repository
    mode: split_member), in doc_id then position order. Documents that cannot be rebuilt
    are skipped (the round-trip check names them)."""
    from megacpp_pipeline.corpus.tokenizer import read_artifact

    snap = Path(snapshot_dir)
    tok = read_artifact(snap / layout.TOKENIZER, str(manifest.tokenizer.get("sha256", "")))
    files = read_document_files(snap, ["doc_id", "position", "source_id", "path", "content_sha256"])
    where = {
        (d, p): (s, f, sha)
        for d, p, s, f, sha in zip(*(files[c].to_pylist() for c in files.column_names), strict=True)
    }
    marked = manifest.document_mode == "repository"

    def spans() -> Iterator[tuple[tuple[int, int], np.ndarray]]:
        for doc_id, tokens, members in document_tokens(snap, manifest, doc_ids):
            if isinstance(tokens, str):
                continue
            for position, (start, n) in enumerate(members):
                yield (doc_id, position), tokens[start : start + n]

    for batch in _batched(spans()):
        texts = tok.decode_batch([t.tolist() for _, t in batch], skip_special_tokens=False)
        for ((doc_id, position), _), text in zip(batch, texts, strict=True):
            source_id, path, sha = where[(doc_id, position)]
            if marked:  # the member is its `// <path>` line, its file, maybe a separator
                text = split_member(text, sha)[1]
            yield FileText(doc_id, position, source_id, path, text)
