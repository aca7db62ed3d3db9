"""The promotion checks' per-shard work, as tasks an executor runs side by side: a file's
bytes and sha256, a rows shard's token ranges and pads, and a rows shard against the pieces
that say what it holds. Each takes a job every task shares and one shard's path, and gives
back counts and the first problems (each naming the file); numpy and pyarrow only, so a
forked worker runs them safely."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from megacpp_pipeline.core.identity import Sums, identity_sums
from megacpp_pipeline.corpus.repository import document_files_problems
from megacpp_pipeline.snapshot import layout
from megacpp_pipeline.snapshot.document_files import read_document_files, read_labelled
from megacpp_pipeline.snapshot.packed_rows import (
    IGNORE_INDEX,
    PAD_DOC_ID,
    fixed_list_to_numpy,
    with_copy_column,
)
from megacpp_pipeline.snapshot.streams import read_back

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
    ignored, each the next input token of its row; loss_mask 0/1 exactly where a target
    is; pads only after valid_token_count (there: loss masked, doc_ids -1)."""
    vocab, seq = job
    columns = ["input_ids", "target_ids", "loss_mask", "doc_ids", "valid_token_count"]
    rows, low, high, bad_targets = 0, None, None, 0
    found: dict[str, None] = {}  # the problems found, once each, in the order first seen
    for t in read_back(path, columns):
        rows += t.num_rows
        ids = fixed_list_to_numpy(t["input_ids"], seq)
        tgt = fixed_list_to_numpy(t["target_ids"], seq)
        mask = fixed_list_to_numpy(t["loss_mask"], seq)
        docs = fixed_list_to_numpy(t["doc_ids"], seq)
        valid = t["valid_token_count"].to_numpy()
        if ids.size:
            low = min(int(ids.min()), low) if low is not None else int(ids.min())
            high = max(int(ids.max()), high) if high is not None else int(ids.max())
        bad_targets += int(((tgt != IGNORE_INDEX) & ((tgt < 0) | (tgt >= vocab))).sum())
        if ((valid < 1) | (valid > seq)).any():
            found[f"{path}: valid_token_count outside [1, {seq}]"] = None
        pad = np.arange(seq)[None, :] >= valid[:, None]
        if (docs[pad] != PAD_DOC_ID).any():
            found[f"{path}: doc_ids on pad positions are not {PAD_DOC_ID}"] = None
        if (docs[~pad] < 0).any():
            found[f"{path}: a pad doc id inside the valid prefix"] = None
        if mask[pad].any():
            found[f"{path}: loss counted on pad positions"] = None
        if ((mask == 1) & (tgt == IGNORE_INDEX)).any():
            found[f"{path}: loss counted where the target is ignored"] = None
        if ((mask != 0) & (mask != 1)).any():
            found[f"{path}: loss_mask holds values other than 0 and 1"] = None
        if (mask.astype(bool) != (tgt != IGNORE_INDEX)).any():
            found[f"{path}: loss_mask is not where the targets are"] = None
        # a target is the next input token of its row (a piece's last slot has none)
        following = np.full(ids.shape, IGNORE_INDEX, dtype=np.int64)
        following[:, :-1] = ids[:, 1:]
        if ((tgt != IGNORE_INDEX) & (tgt != following)).any():
            found[f"{path}: target_ids that are not the next input token"] = None
    problems: list[str] = []
    if low is not None and high is not None and (low < 0 or high >= vocab):
        problems.append(f"{path}: input_ids outside [0, {vocab}): min {low} max {high}")
    if bad_targets:
        problems.append(f"{path}: {bad_targets} target_ids outside the vocabulary")
    return rows, problems + list(found)


@dataclass(frozen=True)
class PlacedPieces:
    """Every piece of the snapshot sorted by (pack_id, row_offset): what each row holds."""

    seq_len: int
    pack: np.ndarray
    doc: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    split: np.ndarray  # each piece's split, an index into `splits`
    splits: tuple[str, ...]


def row_problems(job: PlacedPieces, shard: tuple[str, Path]) -> tuple[int, list[str]]:
    """(rows, problems) of one rows shard (its split, its path) against the pieces: each
    row's pieces must be of the shard's split, its doc_ids their doc ids over their spans
    and pads elsewhere, num_docs and valid_token_count must agree, and no target may cross
    a document's last token."""
    split, path = shard
    columns = ["pack_id", "doc_ids", "target_ids", "num_docs", "valid_token_count"]
    rows = 0
    no_pieces: list[str] = []
    other_split: list[str] = []
    kinds = (
        f"doc_ids disagree with {layout.PIECES}",
        "num_docs/valid_token_count disagree",
        "a target crosses a document boundary",
    )
    found: dict[str, list[str]] = {kind: [] for kind in kinds}
    for t in read_back(path, columns):
        rows += t.num_rows
        pack_ids, bad = _group_row_problems(job, t)
        no_pieces += [f"{path}: row pack_id {p} has no pieces" for p in pack_ids[bad[0]].tolist()]
        lo = np.searchsorted(job.pack, pack_ids, side="left")
        held = lo < len(job.pack)
        held[held] = job.pack[lo[held]] == pack_ids[held]
        code = job.splits.index(split) if split in job.splits else -1
        wrong = np.flatnonzero(held)[job.split[lo[held]] != code][:MAX_PROBLEMS]
        other_split += [
            f"{path}: row pack_id {p} is packed for split {job.splits[job.split[i]]!r}, "
            f"in a {split!r} shard"
            for p, i in zip(pack_ids[wrong].tolist(), lo[wrong].tolist(), strict=True)
        ]
        for kind, rows_bad in zip(kinds, bad[1:], strict=True):
            found[kind] += [f"{path}: pack_id {p} {kind}" for p in pack_ids[rows_bad].tolist()]
    problems = no_pieces[:MAX_PROBLEMS] + other_split[:MAX_PROBLEMS]
    for kind in kinds:
        problems += found[kind][:MAX_PROBLEMS]
    return rows, problems


def _group_row_problems(job: PlacedPieces, t: pa.Table) -> tuple[np.ndarray, list[np.ndarray]]:
    """(pack_ids, [rows without pieces, then rows whose doc_ids, counts or targets disagree],
    each cut to MAX_PROBLEMS) of one row group."""
    seq = job.seq_len
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
    have = count > 0
    bad = [
        count == 0,
        ~np.all(expected == doc_ids, axis=1) & have,
        ((count != num_docs) | ((expected != PAD_DOC_ID).sum(axis=1) != valid)) & have,
        crossing & have,
    ]
    return pack_ids, [np.flatnonzero(b)[:MAX_PROBLEMS] for b in bad]


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
    tokenizer_sha256: str  # the manifest's: the snapshot's tokenizer.json must hash to it


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


def _tokenizer(job: RoundTripJob) -> tuple[Any, Any]:
    """The snapshot's tokenizer, its bytes checked against the manifest's sha256, and its
    token bytes table (both built once per process per artifact)."""
    from megacpp_pipeline.corpus.encoders import TokenBytes
    from megacpp_pipeline.corpus.tokenizer import read_artifact

    tok = read_artifact(job.root / layout.TOKENIZER, job.tokenizer_sha256)
    return tok, TokenBytes.of_artifact(tok, job.tokenizer_sha256)


def _pieces_tokens(job: RoundTripJob, shard: RoundTripShard) -> dict[int, np.ndarray]:
    """The tokens of each of the shard's sampled pieces (by their index in `shard`) that a
    row of the shard holds, read row group by row group, only the groups that hold one."""
    parquet = pq.ParquetFile(job.root / shard.rel)
    pack_ids = parquet.read(columns=["pack_id"])["pack_id"].to_numpy()
    if not len(pack_ids):
        return {}
    order = np.argsort(pack_ids, kind="stable")
    at = np.searchsorted(pack_ids[order], shard.pack)
    found = at < len(order)
    found[found] = pack_ids[order[at[found]]] == shard.pack[found]
    row = np.where(found, order[np.minimum(at, len(order) - 1)], -1)
    meta = parquet.metadata
    bounds = np.cumsum([0] + [meta.row_group(g).num_rows for g in range(meta.num_row_groups)])
    group_of = np.searchsorted(bounds, row, side="right") - 1
    held: dict[int, np.ndarray] = {}
    for g in np.unique(group_of[found]).tolist():
        t = parquet.read_row_group(g, columns=["input_ids"])
        ids = fixed_list_to_numpy(t["input_ids"], job.seq_len)
        for k in np.flatnonzero(found & (group_of == g)).tolist():
            off, n = int(shard.offset[k]), int(shard.length[k])
            held[k] = ids[row[k] - bounds[g], off : off + n].copy()
    return held


def round_trip_shard(job: RoundTripJob, shard: RoundTripShard) -> tuple[int, list[str], list[int]]:
    """(documents checked, problems, documents whose rows are not all here): each sampled
    document of the shard rebuilt from its pieces, FIM order restored, BOS/EOS stripped,
    decoded with the snapshot's tokenizer and hashed against its text's sha256."""
    from megacpp_pipeline.corpus.encoders import decoded_sha256
    from megacpp_pipeline.corpus.packing import restore_fim_order
    from megacpp_pipeline.corpus.tokenizer import SpecialIds, TokenizerArtifactError

    held = _pieces_tokens(job, shard)
    try:
        tok, table = _tokenizer(job)
    except TokenizerArtifactError as e:  # nothing decodes: every sampled document is open
        return 0, [str(e)], []
    problems: list[str] = []
    unresolved: list[int] = []
    checked = 0
    starts = np.flatnonzero(np.r_[True, shard.doc[1:] != shard.doc[:-1]])
    ends = np.r_[starts[1:], len(shard.doc)]
    for lo, hi in zip(starts.tolist(), ends.tolist(), strict=True):
        doc = int(shard.doc[lo])
        parts = []
        for k in range(lo, hi):
            if k not in held:  # its footer's pack_id range lied: the driver looks everywhere
                unresolved.append(doc)
                break
            parts.append(held.pop(k))
        else:
            tokens = np.concatenate(parts)
            if tokens[0] != job.bos or tokens[-1] != job.eos:
                problems.append(f"doc {doc} ({shard.path[doc]}): not framed by BOS ... EOS")
                continue
            member_starts = shard.members.get(doc)
            starts_of = member_starts if member_starts and len(member_starts) > 1 else None
            body = restore_fim_order(tokens, SpecialIds(), starts_of)[1:-1]
            checked += 1
            if decoded_sha256(tok, table, body) != shard.sha256[doc]:
                problems.append(
                    f"doc {doc} ({shard.path[doc]}): decoded text differs from the source"
                )
    return checked, problems[:MAX_PROBLEMS], unresolved


@dataclass(frozen=True)
class DrawJob:
    """What every task of the draws check shares: documents.parquet, each source's weight
    (1.0 for one the manifest does not list) and the snapshot's draw seed."""

    documents: Path
    weights: dict[str, float]
    seed: int


# Documents per task of the draws check: a snapshot of tens of thousands of documents is
# still checked by several forked workers (a map of one item runs in the driver).
DRAW_ROWS = 16384


def draw_items(documents: Path) -> list[tuple[int, int, int]]:
    """(row group, first row, end row) of documents.parquet, DRAW_ROWS rows at most each."""
    meta = pq.ParquetFile(documents).metadata
    return [
        (g, lo, min(lo + DRAW_ROWS, n))
        for g in range(meta.num_row_groups)
        for n in [meta.row_group(g).num_rows]
        for lo in range(0, n, DRAW_ROWS)
    ]


def draw_problems_in(job: DrawJob, item: tuple[int, int, int]) -> list[str]:
    """Documents of one part of documents.parquet (draw_items) whose copies in the rows are
    not the draws their source's weight and the seed give (corpus/packing.py:
    document_draws)."""
    from megacpp_pipeline.corpus.packing import document_draws, draw_keys

    group, lo, hi = item
    rows = (
        pq.ParquetFile(job.documents)
        .read_row_group(group, columns=["doc_id", "source_id", "path", "draws"])
        .slice(lo, hi - lo)
    )
    sources = np.array(rows["source_id"].to_pylist(), dtype=object)
    paths = rows["path"].to_pylist()
    keys = draw_keys(sources.tolist(), paths)
    got = rows["draws"].to_numpy()
    out: list[str] = []
    for source in dict.fromkeys(sources.tolist()):  # in their order of appearance
        at = np.flatnonzero(sources == source)
        weight = job.weights.get(str(source), 1.0)
        want = document_draws(keys[at], weight, job.seed)
        for j in np.flatnonzero(got[at] != want)[: MAX_PROBLEMS - len(out)].tolist():
            i = int(at[j])
            out.append(
                f"{layout.DOCUMENTS}: doc {rows['doc_id'][i]} ({source}:{paths[i]}) is packed "
                f"{got[i]} times; weight {weight} draws it {want[j]} times"
            )
        if len(out) >= MAX_PROBLEMS:
            break
    return out


@dataclass(frozen=True)
class DocumentsJob:
    """What every window of the documents check shares: the snapshot and which columns its
    documents.parquet has (older schema versions lack some)."""

    snap: Path
    columns: tuple[str, ...]  # of documents.parquet, of those the check reads
    documents: int  # rows of documents.parquet


@dataclass
class DocumentsWindow:
    """What one window of documents.parquet proved: its documents were doc_ids first..first
    +count-1, its files per source and their identity sums, its figures, and what is wrong
    (the first few of each kind: DOCUMENT_FILES_FAULT, then each of DOCUMENT_FAULTS)."""

    first: int
    count: int
    files: Counter[str]
    sums: Sums
    sequences: int
    pieces: int
    problems: dict[str, list[str]]


# The kinds of fault a window reports, in report order: its files against its documents,
# then its documents against their pieces.
DOCUMENT_FILES_FAULT = layout.DOCUMENT_FILES
DOCUMENT_FAULTS = (
    "has no pieces",
    f"has pieces but is not in {layout.DOCUMENTS}",
    f"copies in {layout.PIECES} are not 0..draws-1",
    "pieces are not 0..n-1",
    f"num_pieces disagrees with {layout.PIECES}",
    "pieces are in another split than the document",
)


def document_windows(documents: Path) -> list[tuple[int, int, int, int]]:
    """(row group, first row, end row, the first row's index in the file) of documents.parquet,
    DRAW_ROWS rows at most each: the windows of the documents check. A file without rows has
    one empty window (row group -1), which still takes every piece and file: none belongs."""
    rows = DRAW_ROWS
    meta = pq.ParquetFile(documents).metadata
    out, at = [], 0
    for g in range(meta.num_row_groups):
        n = meta.row_group(g).num_rows
        for lo in range(0, n, rows):
            out.append((g, lo, min(lo + rows, n), at + lo))
        at += n
    return out or [(-1, 0, 0, 0)]


def documents_window(job: DocumentsJob, item: tuple[int, int, int, int]) -> DocumentsWindow:
    """One window of documents.parquet against the pieces and document_files rows of its
    doc_ids, read by their doc_id (parquet statistics skip the row groups of other windows):
    the window of rows k..k+n-1 must hold doc_ids k..k+n-1, and the first and last windows
    also take the pieces and files of doc_ids below 0 or past the last document."""
    group, lo, hi, first = item
    parquet = pq.ParquetFile(job.snap / layout.DOCUMENTS)
    docs = (
        parquet.read_row_group(group, columns=list(job.columns)).slice(lo, hi - lo)
        if group >= 0
        else parquet.schema_arrow.empty_table().select(list(job.columns))
    )
    end = first + docs.num_rows
    ids = (first or None, end if end < job.documents else None)
    pieces = with_copy_column(read_labelled(job.snap / layout.PIECES, None, ["split"], ids))
    ids_np = docs["doc_id"].to_numpy().astype(np.int64)
    draws = (
        docs["draws"].to_numpy().astype(np.int64)
        if "draws" in docs.column_names
        else np.ones(docs.num_rows, np.int64)  # before source weights: every document once
    )
    problems: dict[str, list[str]] = {DOCUMENT_FILES_FAULT: []}
    for what, found in zip(
        DOCUMENT_FAULTS, _piece_faults(docs, ids_np, draws, pieces), strict=True
    ):
        problems[what] = [f"{layout.DOCUMENTS}: doc {d} {what}" for d in found[:MAX_PROBLEMS]]
    file_problems = problems[DOCUMENT_FILES_FAULT]
    files = read_document_files(
        job.snap,
        ["doc_id", "position", "source_id", "path", "start_token", "num_tokens"],
        dictionary=True,
        doc_ids=ids,
    )
    file_ids = files["doc_id"].to_numpy().astype(np.int64)
    outside = np.flatnonzero((file_ids < first) | (file_ids >= end))
    if outside.size:
        row = int(outside[0])
        file_problems.append(
            f"{layout.DOCUMENT_FILES}: {files['source_id'][row]}:{files['path'][row]} is in doc "
            f"{int(file_ids[row])}, which is not in {layout.DOCUMENTS}"
        )
        files = files.take(np.flatnonzero((file_ids >= first) & (file_ids < end)))
    num_files = (  # schema version 1: a document was one file
        docs["num_files"]
        if "num_files" in docs.column_names
        else pa.array(np.ones(docs.num_rows, np.int32))
    )
    own = pa.table(
        {"doc_id": docs["doc_id"], "num_files": num_files, "num_tokens": docs["text_tokens"]}
    )
    file_problems += [
        f"{layout.DOCUMENT_FILES}: {p}" for p in document_files_problems(own, files, None, first)
    ]
    sources = files["source_id"].cast(pa.string()).to_pylist()
    return DocumentsWindow(
        first,
        docs.num_rows,
        Counter(sources),
        identity_sums(sources, files["path"].to_pylist()),
        int(draws.sum()),
        pieces.num_rows,
        problems,
    )


def _piece_faults(
    docs: pa.Table, ids: np.ndarray, draws: np.ndarray, pieces: pa.Table
) -> list[list[int]]:
    """The doc_ids of each of DOCUMENT_FAULTS, ascending: `docs` (doc_id, split, num_pieces)
    against `pieces` (doc_id, copy, piece_index, split), vectorized."""
    if not pieces.num_rows:
        return [sorted(ids[draws > 0].tolist()), [], [], [], [], []]
    order = np.lexsort(
        [pieces[c].to_numpy().astype(np.int64) for c in ("piece_index", "copy", "doc_id")]
    )
    doc = pieces["doc_id"].to_numpy().astype(np.int64)[order]
    copy = pieces["copy"].to_numpy().astype(np.int64)[order]
    index = pieces["piece_index"].to_numpy().astype(np.int64)[order]
    split = _labels(pieces["split"])[order]
    if not len(ids):  # every piece is an orphan
        return [[], sorted(set(doc.tolist())), [], [], [], []]
    by_id = np.argsort(ids, kind="stable")
    at = by_id[np.minimum(np.searchsorted(ids[by_id], doc), len(ids) - 1)]
    known = ids[at] == doc
    # one group per (doc, copy): its pieces must be 0..n-1, n of them, in the doc's split
    new = np.r_[True, (doc[1:] != doc[:-1]) | (copy[1:] != copy[:-1])]
    start = np.flatnonzero(new)
    end = np.r_[start[1:], len(doc)]
    n = end - start
    distinct = np.add.reduceat(np.r_[True, new[1:] | (index[1:] != index[:-1])].astype(int), start)
    g_known, g_row = known[start], at[start]
    gaps = g_known & ((index[start] != 0) | (index[end - 1] != n - 1) | (distinct != n))
    wrong_count = g_known & (n != docs["num_pieces"].to_numpy()[g_row])
    other_split = (known & (split != _labels(docs["split"])[at])).astype(int)
    wrong_split = g_known & (np.add.reduceat(other_split, start) > 0)
    # one group per doc: its copies must be 0..draws-1
    g_doc, g_copy = doc[start], copy[start]
    d_start = np.flatnonzero(np.r_[True, g_doc[1:] != g_doc[:-1]])
    d_end = np.r_[d_start[1:], len(g_doc)]
    copies = d_end - d_start
    d_known, d_row = g_known[d_start], g_row[d_start]
    wrong_copies = d_known & (
        (copies != draws[d_row]) | (g_copy[d_start] != 0) | (g_copy[d_end - 1] != copies - 1)
    )
    has_pieces = np.zeros(len(ids), bool)
    has_pieces[d_row[d_known]] = True
    faults = [
        ids[~has_pieces & (draws > 0)],
        doc[~known],
        g_doc[d_start][wrong_copies],
        g_doc[gaps],
        g_doc[wrong_count],
        g_doc[wrong_split],
    ]
    return [sorted(set(f.tolist())) for f in faults]


def _labels(column: pa.ChunkedArray) -> np.ndarray:
    """A string column (dictionary-encoded or not) as a numpy array of Python strings."""
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    return np.asarray(column.to_pylist(), dtype=object)


def ledger_groups(ledger: Path) -> list[int]:
    """The row groups of ledger.parquet: one task of ledger_kept each."""
    return list(range(pq.ParquetFile(ledger).metadata.num_row_groups))


def ledger_kept(ledger: Path, group: int) -> tuple[Counter[str], Sums]:
    """The files one row group of ledger.parquet keeps: per source, and their identity sums."""
    rows = pq.ParquetFile(ledger).read_row_group(group, columns=["source_id", "path", "status"])
    kept = rows.filter(pa.compute.equal(rows["status"], "kept"))
    sources = kept["source_id"].to_pylist()
    return Counter(sources), identity_sums(sources, kept["path"].to_pylist())
