"""The promotion checks' per-shard work, as tasks an executor runs side by side: a file's
bytes and sha256, a rows shard's token ranges and pads, and a rows shard against the pieces
that say what it holds. Each takes a job every task shares and one shard's path, and gives
back counts and the first problems (each naming the file); numpy and pyarrow only, so a
forked worker runs them safely."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from megacpp_pipeline.snapshot import layout
from megacpp_pipeline.snapshot.packed_rows import IGNORE_INDEX, PAD_DOC_ID, fixed_list_to_numpy

Mapper = Callable[[Callable[..., Any], Any, Sequence[Any]], Iterator[Any]]
_CHUNK = 1 << 20
MAX_PROBLEMS = 5


def inline(task: Callable[..., Any], job: Any, items: Iterable[Any]) -> Iterator[Any]:
    """The mapper of a single process: each item in turn."""
    return (task(job, item) for item in items)


@dataclass(frozen=True)
class FileFacts:
    rel: str
    exists: bool
    bytes: int
    sha256: str


def file_facts(root: Path, rel: str) -> FileFacts:
    """A snapshot file's size and sha256, read once."""
    path = root / rel
    if not path.is_file():
        return FileFacts(rel, False, 0, "")
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return FileFacts(rel, True, size, digest.hexdigest())


def token_problems(job: tuple[int, int], path: Path) -> tuple[int, list[str]]:
    """(rows, problems) of one rows shard: every id in [0, vocab); targets in range or
    ignored; pads only after valid_token_count (there: loss masked, doc_ids -1)."""
    vocab, seq = job
    t = pq.read_table(
        path, columns=["input_ids", "target_ids", "loss_mask", "doc_ids", "valid_token_count"]
    )
    ids = fixed_list_to_numpy(t["input_ids"], seq)
    tgt = fixed_list_to_numpy(t["target_ids"], seq)
    mask = fixed_list_to_numpy(t["loss_mask"], seq)
    docs = fixed_list_to_numpy(t["doc_ids"], seq)
    valid = t["valid_token_count"].to_numpy()
    problems: list[str] = []
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        problems.append(f"{path}: input_ids outside [0, {vocab}): min {ids.min()} max {ids.max()}")
    bad_tgt = (tgt != IGNORE_INDEX) & ((tgt < 0) | (tgt >= vocab))
    if bad_tgt.any():
        problems.append(f"{path}: {int(bad_tgt.sum())} target_ids outside the vocabulary")
    if ((valid < 1) | (valid > seq)).any():
        problems.append(f"{path}: valid_token_count outside [1, {seq}]")
    pad = np.arange(seq)[None, :] >= valid[:, None]
    if (docs[pad] != PAD_DOC_ID).any():
        problems.append(f"{path}: doc_ids on pad positions are not {PAD_DOC_ID}")
    if (docs[~pad] < 0).any():
        problems.append(f"{path}: a pad doc id inside the valid prefix")
    if mask[pad].any():
        problems.append(f"{path}: loss counted on pad positions")
    if ((mask == 1) & (tgt == IGNORE_INDEX)).any():
        problems.append(f"{path}: loss counted where the target is ignored")
    return t.num_rows, problems


@dataclass(frozen=True)
class PlacedPieces:
    """Every piece of the snapshot sorted by (pack_id, row_offset): what each row holds."""

    seq_len: int
    pack: np.ndarray
    doc: np.ndarray
    offset: np.ndarray
    length: np.ndarray


def row_problems(job: PlacedPieces, path: Path) -> tuple[int, list[str]]:
    """(rows, problems) of one rows shard against the pieces: each row's doc_ids must be its
    pieces' doc ids over their spans and pads elsewhere, num_docs and valid_token_count must
    agree, and no target may cross a document's last token."""
    seq = job.seq_len
    t = pq.read_table(
        path, columns=["pack_id", "doc_ids", "target_ids", "num_docs", "valid_token_count"]
    )
    n = t.num_rows
    pack_ids = t["pack_id"].to_numpy()
    doc_ids = fixed_list_to_numpy(t["doc_ids"], seq)
    tgt = fixed_list_to_numpy(t["target_ids"], seq)
    valid = t["valid_token_count"].to_numpy()
    num_docs = t["num_docs"].to_numpy()
    lo = np.searchsorted(job.pack, pack_ids, side="left")
    count = np.searchsorted(job.pack, pack_ids, side="right") - lo
    chosen = ranges_of(lo, count)
    row = np.repeat(np.arange(n, dtype=np.int64), count)
    start = row * seq + job.offset[chosen]
    expected = np.full(n * seq, PAD_DOC_ID, dtype=np.int32)
    expected[ranges_of(start, job.length[chosen])] = np.repeat(job.doc[chosen], job.length[chosen])
    expected = expected.reshape(n, seq)
    crossing = np.zeros(n, dtype=bool)
    ends = start + job.length[chosen] - 1
    crossing[row[tgt.reshape(-1)[ends] != IGNORE_INDEX]] = True
    problems: list[str] = []
    for r in np.flatnonzero(count == 0)[:MAX_PROBLEMS].tolist():
        problems.append(f"{path}: row pack_id {pack_ids[r]} has no pieces")
    have = count > 0
    what = (
        (~np.all(expected == doc_ids, axis=1), f"doc_ids disagree with {layout.PIECES}"),
        (
            (count != num_docs) | ((expected != PAD_DOC_ID).sum(axis=1) != valid),
            "num_docs/valid_token_count disagree",
        ),
        (crossing, "a target crosses a document boundary"),
    )
    for bad, message in what:
        for r in np.flatnonzero(bad & have)[:MAX_PROBLEMS].tolist():
            problems.append(f"{path}: pack_id {pack_ids[r]} {message}")
    return n, problems


def ranges_of(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The indices start..start+length-1 of every (start, length), one after another."""
    total = int(lengths.sum())
    if total == 0:
        return np.empty(0, dtype=np.int64)
    first = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return first + np.arange(total, dtype=np.int64)


@dataclass(frozen=True)
class RoundTripJob:
    """What every shard's round-trip task needs: the snapshot (its tokenizer) and framing."""

    root: Path
    seq_len: int
    bos: int
    eos: int


@dataclass(frozen=True)
class RoundTripShard:
    """One rows shard and the sampled documents whose pieces all lie in it."""

    rel: str
    doc: np.ndarray  # per piece, sorted by (doc, piece_index)
    index: np.ndarray
    pack: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    members: dict[int, list[int]]  # doc -> member start tokens (repository documents)
    sha256: dict[int, str]  # doc -> the scrubbed text's sha256
    path: dict[int, str]  # doc -> its file, to name in a problem


_TOKENIZERS: dict[str, Any] = {}  # per process: the snapshot's tokenizer, loaded once


def _tokenizer(root: Path) -> Any:
    from tokenizers import Tokenizer

    key = str(root)
    if key not in _TOKENIZERS:
        _TOKENIZERS.clear()
        _TOKENIZERS[key] = Tokenizer.from_file(str(root / layout.TOKENIZER))
    return _TOKENIZERS[key]


def round_trip_shard(job: RoundTripJob, shard: RoundTripShard) -> tuple[int, list[str], list[int]]:
    """(documents checked, problems, documents whose rows are not all here): each sampled
    document of the shard rebuilt from its pieces, FIM order restored, BOS/EOS stripped,
    decoded with the snapshot's tokenizer and hashed against its text's sha256."""
    from megacpp_pipeline.corpus.packing import restore_fim_order
    from megacpp_pipeline.corpus.tokenizer import SpecialIds

    t = pq.read_table(job.root / shard.rel, columns=["pack_id", "input_ids"])
    row_of = {int(p): r for r, p in enumerate(t["pack_id"].to_numpy().tolist())}
    ids = fixed_list_to_numpy(t["input_ids"], job.seq_len)
    problems: list[str] = []
    unresolved: list[int] = []
    decodable: list[tuple[int, list[int]]] = []
    starts = np.flatnonzero(np.r_[True, shard.doc[1:] != shard.doc[:-1]])
    ends = np.r_[starts[1:], len(shard.doc)]
    for lo, hi in zip(starts.tolist(), ends.tolist(), strict=True):
        doc = int(shard.doc[lo])
        parts = []
        for k in range(lo, hi):
            row = row_of.get(int(shard.pack[k]))
            if row is None:  # its footer's pack_id range lied: the driver looks everywhere
                unresolved.append(doc)
                break
            off, n = int(shard.offset[k]), int(shard.length[k])
            parts.append(ids[row, off : off + n])
        else:
            tokens = np.concatenate(parts)
            if tokens[0] != job.bos or tokens[-1] != job.eos:
                problems.append(f"doc {doc} ({shard.path[doc]}): not framed by BOS ... EOS")
                continue
            member_starts = shard.members.get(doc)
            starts_of = member_starts if member_starts and len(member_starts) > 1 else None
            body = restore_fim_order(tokens, SpecialIds(), starts_of)[1:-1]
            decodable.append((doc, body.tolist()))
    tok = _tokenizer(job.root)
    texts = tok.decode_batch([b for _, b in decodable], skip_special_tokens=False)
    for (doc, _), text in zip(decodable, texts, strict=True):
        if hashlib.sha256(text.encode("utf-8")).hexdigest() != shard.sha256[doc]:
            problems.append(f"doc {doc} ({shard.path[doc]}): decoded text differs from the source")
    return len(decodable), problems[:MAX_PROBLEMS], unresolved
