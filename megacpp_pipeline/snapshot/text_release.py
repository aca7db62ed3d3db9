"""The text release: every document in a snapshot's rows as its final text (scrubbed,
deduplicated, decontaminated: exactly what the rows decode to) with its metadata, for a team
that tokenizes with a vocabulary of its own. Parquet shards bounded by rows and bytes, one
folder per split (so `datasets.load_dataset("parquet", data_dir=DIR)` finds train and
validation), then `manifest.json` listing them and `_COMPLETE` last (the version folder
format, storage/versions.py). Built from the snapshot alone (snapshot/texts.py decodes the
rows with the snapshot's own tokenizer), so `megacpp export-text` can write it for any
snapshot and the snapshot stage's `text` option writes it beside the rows (`text/`).

`check_release` is the other direction: the release's texts, re-tokenized with the
snapshot's tokenizer, give the snapshot's tokens (a repository document member by member,
its path marker, its file and the separator newline after a file that lacks one encoded
apart, as the documents stage built it)."""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field

from megacpp_pipeline.corpus.repository import marker_text, split_member
from megacpp_pipeline.snapshot import layout
from megacpp_pipeline.snapshot.document_files import read_document_files
from megacpp_pipeline.snapshot.layout import SnapshotManifest
from megacpp_pipeline.snapshot.promote import read_manifest
from megacpp_pipeline.snapshot.texts import (
    DOCS_PER_PASS,
    document_texts,
    document_tokens,
    packed_doc_ids,
)
from megacpp_pipeline.storage.versions import (
    COMPLETE,
    MANIFEST,
    complete_marker,
    recorded_manifest_sha256,
    sha256_file,
    write_parquet_atomic,
)

RELEASE_FORMAT = "megacpp-text-release"
RELEASE_SCHEMA_VERSION = 1
TEXT_DIR = "text"  # where the snapshot stage's `text` option writes it, inside the snapshot
SPLITS = ("train", "validation")

# One row per document in the rows. `files`: the member files, each with its character span
# in `text` (a repository document: its `// <path>` marker line and its file, up to where the
# file ends; one member spanning the whole text in file mode). A file without a final newline
# is followed by the newline its member adds (assemble.separator_text): that one character
# lies between its span and the next one (or the text's end), in no span, so spans tile the
# text exactly when every file ends in a newline. `draws`: the copies of it the rows hold
# (its source's weight; a document its weight left out of the rows is not released).
TEXT_SCHEMA = pa.schema(
    [
        pa.field("doc_id", pa.int32(), nullable=False),
        pa.field("source_id", pa.string(), nullable=False),
        pa.field("path", pa.string(), nullable=False),
        pa.field("revision", pa.string(), nullable=False),
        pa.field("license_expression", pa.string()),
        pa.field("license_source", pa.string(), nullable=False),
        pa.field("language", pa.string()),
        pa.field("vendored", pa.bool_()),
        pa.field("scrub_kinds", pa.list_(pa.string()), nullable=False),
        pa.field("split", pa.string(), nullable=False),
        pa.field("draws", pa.int32(), nullable=False),
        pa.field("content_sha256", pa.string(), nullable=False),  # of `text`, UTF-8
        pa.field("text", pa.string(), nullable=False),
        pa.field(
            "files",
            pa.list_(
                pa.struct(
                    [
                        pa.field("path", pa.string(), nullable=False),
                        pa.field("start", pa.int64(), nullable=False),  # characters of text
                        pa.field("end", pa.int64(), nullable=False),
                    ]
                )
            ),
            nullable=False,
        ),
    ],
    metadata={"megacpp.table": "text_release", "megacpp.schema_version": "1"},
)
_META = [f.name for f in TEXT_SCHEMA if f.name not in ("text", "files", "draws")]


class TextReleaseError(Exception):
    """A text release cannot be written or read; names the folder or file and the rule."""


class ReleaseConfig(BaseModel):
    """How big a release shard may grow (rows, and bytes of text)."""

    model_config = ConfigDict(extra="forbid")
    max_rows: int = Field(default=10_000, ge=1)
    max_bytes: int = Field(default=64 << 20, ge=1)


class ReleaseFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str
    sha256: str
    bytes: int
    rows: int


class ReleaseSplit(BaseModel):
    model_config = ConfigDict(extra="forbid")
    documents: int
    text_bytes: int
    shards: list[str]


class TextReleaseManifest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: str = RELEASE_FORMAT
    schema_version: int = RELEASE_SCHEMA_VERSION
    snapshot_id: str
    name: str
    created_at: str
    tokenizer_sha256: str  # the tokenizer whose tokens the texts give back
    document_mode: str
    documents: int  # released: every document in the snapshot's rows
    not_in_rows: int  # the snapshot's documents a source's weight left out of the rows
    splits: dict[str, ReleaseSplit]
    files: list[ReleaseFile]


@dataclass
class _SplitWriter:
    """One split's rows, cut into shards of at most max_rows rows and max_bytes of text."""

    folder: Path
    split: str
    config: ReleaseConfig
    rows: list[dict[str, Any]] = field(default_factory=list)
    pending_bytes: int = 0
    files: list[ReleaseFile] = field(default_factory=list)
    documents: int = 0
    text_bytes: int = 0

    def add(self, row: dict[str, Any], size: int) -> None:
        if self.rows and (
            len(self.rows) >= self.config.max_rows
            or self.pending_bytes + size > self.config.max_bytes
        ):
            self.flush()
        self.rows.append(row)
        self.pending_bytes += size
        self.documents += 1
        self.text_bytes += size

    def flush(self) -> None:
        if not self.rows:
            return
        rel = f"{self.split}/part-{len(self.files):05d}.parquet"
        path = self.folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        table = pa.Table.from_pylist(self.rows, schema=TEXT_SCHEMA)
        write_parquet_atomic(table, path)
        self.files.append(
            ReleaseFile(
                path=rel, sha256=sha256_file(path), bytes=path.stat().st_size, rows=len(self.rows)
            )
        )
        self.rows, self.pending_bytes = [], 0


def _documents(snap: Path) -> dict[int, dict[str, Any]]:
    docs = pq.read_table(snap / layout.DOCUMENTS)
    wanted = [c for c in (*_META, "draws") if c in docs.column_names]
    out = {}
    for row in docs.select(wanted).to_pylist():
        row.setdefault("draws", 1)  # a snapshot from before source weights: every one once
        out[int(row["doc_id"])] = row
    return out


def _members(snap: Path, doc_ids: list[int]) -> dict[int, list[tuple[str, int, str]]]:
    """doc_id -> its members' (path, num_tokens, content_sha256), in position order."""
    files = read_document_files(
        snap, ["doc_id", "position", "path", "num_tokens", "content_sha256"]
    )
    files = files.filter(pc.is_in(files["doc_id"], pa.array(doc_ids, pa.int32())))
    out: dict[int, list[tuple[str, int, str]]] = {}
    rows = sorted(zip(*(files[c].to_pylist() for c in files.column_names), strict=True))
    for doc_id, _, path, n, sha in rows:
        out.setdefault(doc_id, []).append((path, n, sha))
    return out


def _repository_texts(
    tok: Any, snap: Path, manifest: SnapshotManifest, group: list[int]
) -> Iterator[tuple[int, str | None, str | None, list[dict[str, Any]]]]:
    """(doc_id, text, problem, member spans) of repository documents: the members' tokens
    are separate encodings laid end to end, so each member decodes on its own, and the
    document's text is its members' texts in order. A member's span ends where its file
    does (split_member: the file's content_sha256 tells a separator from a file's own final
    newline), before the separator."""
    members = _members(snap, group)
    for doc_id, tokens, _ in document_tokens(snap, manifest, group):
        if isinstance(tokens, str):
            yield doc_id, None, tokens, []
            continue
        spans, parts = [], []
        start_token = start_char = 0
        for path, n, sha in members.get(doc_id, []):
            part = tok.decode(
                tokens[start_token : start_token + n].tolist(), skip_special_tokens=False
            )
            marker, file, _ = split_member(part, sha)
            end = start_char + len(marker) + len(file)
            spans.append({"path": path, "start": start_char, "end": end})
            parts.append(part)
            start_token += n
            start_char += len(part)
        yield doc_id, "".join(parts), None, spans


def _rows(snap: Path, manifest: SnapshotManifest) -> Iterator[tuple[dict[str, Any], int]]:
    """(row, text bytes) per document in the rows, in doc_id order."""
    from megacpp_pipeline.corpus.tokenizer import read_artifact

    documents = _documents(snap)
    packed = packed_doc_ids(snap)
    repository = manifest.document_mode != "file"
    tok = read_artifact(snap / layout.TOKENIZER, str(manifest.tokenizer.get("sha256", "")))
    for lo in range(0, len(packed), DOCS_PER_PASS):
        group = packed[lo : lo + DOCS_PER_PASS]
        texts = (
            _repository_texts(tok, snap, manifest, group)
            if repository
            else ((d.doc_id, d.text, d.problem, []) for d in document_texts(snap, manifest, group))
        )
        for doc_id, text, problem, spans in texts:
            if text is None:
                raise TextReleaseError(f"{snap}: doc {doc_id}: {problem}")
            meta = documents[doc_id]
            data = text.encode("utf-8")
            if hashlib.sha256(data).hexdigest() != meta["content_sha256"]:
                raise TextReleaseError(
                    f"{snap}: doc {doc_id} ({meta['source_id']}:{meta['path']}) decodes to "
                    "other text than its content_sha256"
                )
            row = {name: meta.get(name) for name in _META}
            row.update(
                text=text,
                files=spans or [{"path": meta["path"], "start": 0, "end": len(text)}],
                draws=int(meta["draws"]),
            )
            row["scrub_kinds"] = list(row.get("scrub_kinds") or [])
            yield row, len(data)


def write_release(
    snapshot_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    config: ReleaseConfig | None = None,
) -> TextReleaseManifest:
    """The snapshot's text release at `out_dir` (which must not hold anything yet): built
    beside it and renamed into place, `_COMPLETE` last."""
    config = config or ReleaseConfig()
    snap = Path(snapshot_dir)
    out = Path(out_dir)
    manifest = read_manifest(snap)
    if out.exists() and any(out.iterdir()):
        raise TextReleaseError(f"{out}: not empty; a text release goes into a new folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    work = out.with_name(f".{out.name}.building-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    work.mkdir()
    try:
        writers = {split: _SplitWriter(work, split, config) for split in SPLITS}
        for row, size in _rows(snap, manifest):
            writers[row["split"]].add(row, size)
        for writer in writers.values():
            writer.flush()
        documents = pq.read_table(snap / layout.DOCUMENTS, columns=["doc_id"]).num_rows
        released = sum(w.documents for w in writers.values())
        release = TextReleaseManifest(
            snapshot_id=manifest.snapshot_id,
            name=manifest.name,
            created_at=datetime.now(UTC).isoformat(),
            tokenizer_sha256=str(manifest.tokenizer.get("sha256", "")),
            document_mode=manifest.document_mode,
            documents=released,
            not_in_rows=documents - released,
            splits={
                split: ReleaseSplit(
                    documents=w.documents,
                    text_bytes=w.text_bytes,
                    shards=[f.path for f in w.files],
                )
                for split, w in writers.items()
            },
            files=[f for w in writers.values() for f in w.files],
        )
        raw = release.model_dump_json(indent=2).encode()
        (work / MANIFEST).write_bytes(raw)
        (work / COMPLETE).write_bytes(complete_marker(release.snapshot_id, raw))
        if out.exists():
            out.rmdir()  # empty (checked above)
        os.replace(work, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return release


def read_release(release_dir: str | os.PathLike[str]) -> TextReleaseManifest:
    folder = Path(release_dir)
    if not (folder / COMPLETE).is_file():
        raise TextReleaseError(f"{folder}: no {COMPLETE}; not a text release")
    try:
        release = TextReleaseManifest.model_validate_json((folder / MANIFEST).read_bytes())
    except (OSError, ValueError) as e:
        raise TextReleaseError(f"{folder / MANIFEST}: unreadable manifest ({e})") from e
    if release.format != RELEASE_FORMAT:
        raise TextReleaseError(
            f"{folder / MANIFEST}: format {release.format!r} is not a text release"
        )
    return release


@dataclass
class ReleaseCheck:
    """What checking a release against its snapshot found."""

    documents_checked: int = 0
    files_checked: int = 0
    problems: list[str] = field(default_factory=list)


def check_release(
    release_dir: str | os.PathLike[str],
    snapshot_dir: str | os.PathLike[str],
    sample: int = 1000,
    seed: int = 0,
) -> ReleaseCheck:
    """The release is whole (its files' sha256, every document of the rows once), belongs to
    the snapshot, and a seeded sample of its texts, re-tokenized with the snapshot's own
    tokenizer (its sha256 checked), gives exactly the snapshot's tokens for each document.

    A repository document is re-encoded as the documents stage encoded it, member by member:
    its path marker, its file and its separator, each apart. Where each file ends is what
    the release's spans say, and it is checked, not inferred: the spans list the snapshot's
    members (document_files) in order, each starts where the last one's separator ends, the
    one character a span may leave before the next is a separator newline, and the file in
    each span hashes to its document_files content_sha256. The tokens alone could not pin
    it: a file `x\n` and a file `x` with its separator can encode to the same ids. Whether a
    file should have a separator is not re-decided here; the snapshot's tokens say whether
    it has one, so a snapshot from before separators still verifies against its release."""
    from megacpp_pipeline.corpus import tokenizer as tokenizers_

    folder, snap = Path(release_dir), Path(snapshot_dir)
    out = ReleaseCheck()
    release = read_release(folder)
    manifest = read_manifest(snap)
    recorded = recorded_manifest_sha256((folder / COMPLETE).read_bytes())
    if recorded is None:
        out.problems.append(f"{folder / COMPLETE}: records no manifest sha256 (an older marker)")
    elif sha256_file(folder / MANIFEST) != recorded:
        out.problems.append(f"{folder / MANIFEST}: sha256 differs from the one {COMPLETE} recorded")
    # a reader of the folder (`load_dataset("parquet", data_dir=...)`) takes every file in
    # it, listed or not
    listed = {f.path for f in release.files} | {MANIFEST, COMPLETE}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.relative_to(folder).as_posix() not in listed:
            out.problems.append(f"{p}: not listed in the release's manifest")
    if release.snapshot_id != manifest.snapshot_id:
        out.problems.append(
            f"{folder / MANIFEST}: a release of {release.snapshot_id}, "
            f"not of {manifest.snapshot_id}"
        )
    if release.tokenizer_sha256 != manifest.tokenizer.get("sha256"):
        out.problems.append(f"{folder / MANIFEST}: tokenizer sha256 is not the snapshot's")
    for f in release.files:
        p = folder / f.path
        if not p.is_file():
            out.problems.append(f"{p}: missing")
        elif sha256_file(p) != f.sha256:
            out.problems.append(f"{p}: sha256 mismatch")
    if out.problems:
        return out
    shards = [folder / f.path for f in release.files]
    ids = (
        pa.concat_tables([pq.read_table(p, columns=["doc_id"]) for p in shards])["doc_id"]
        if shards
        else pa.array([], pa.int32())
    )
    released = sorted(int(d) for d in ids.to_pylist())
    want = packed_doc_ids(snap)
    if released != sorted(want):
        missing = sorted(set(want) - set(released))[:5]
        extra = sorted(set(released) - set(want))[:5]
        out.problems.append(
            f"{folder}: {len(released)} documents released, the rows hold {len(want)}"
            + (f"; missing doc {missing}" if missing else "")
            + (f"; not in the rows: doc {extra}" if extra else "")
        )
        return out
    rng = np.random.default_rng(seed)
    chosen = sorted(rng.choice(released, size=min(sample, len(released)), replace=False).tolist())
    wanted = pa.array(chosen, pa.int32())
    table = pa.concat_tables(
        [t.filter(pc.is_in(t["doc_id"], wanted)) for t in (pq.read_table(p) for p in shards)]
    )
    rows = {int(r["doc_id"]): r for r in table.to_pylist()}
    tok = tokenizers_.load_tokenizer(snap / layout.TOKENIZER, str(manifest.tokenizer["sha256"]))

    def encode(texts: list[str]) -> list[list[int]]:
        return [e.ids for e in tok.encode_batch_fast(texts, add_special_tokens=False)]

    repository = manifest.document_mode != "file"
    members_of = _members(snap, chosen) if repository else {}
    for doc_id, tokens, _ in document_tokens(snap, manifest, chosen):
        row = rows[doc_id]
        where = f"{folder}: doc {doc_id} ({row['source_id']}:{row['path']})"
        if isinstance(tokens, str):
            out.problems.append(f"{where}: the snapshot's rows: {tokens}")
            continue
        out.documents_checked += 1
        text = row["text"]
        if hashlib.sha256(text.encode("utf-8")).hexdigest() != row["content_sha256"]:
            out.problems.append(f"{where}: text differs from its content_sha256")
            continue
        members = row["files"]
        if repository:
            parts, problems = _member_parts(text, members, members_of.get(doc_id, []))
            out.problems += [f"{where}: {p}" for p in problems]
            got = [i for ids in encode(parts) for i in ids]
        else:
            got = encode([text])[0]
        out.files_checked += max(1, len(members))
        if got != tokens.tolist():
            out.problems.append(f"{where}: re-tokenized text differs from the snapshot's tokens")
    return out


def _member_parts(
    text: str, spans: list[dict[str, Any]], listed: list[tuple[str, int, str]]
) -> tuple[list[str], list[str]]:
    """A repository document's text as the documents stage encoded it (each member's path
    marker, file and separator, in order), and what is wrong with the release's spans of
    it against the snapshot's members (`listed`: document_files' path, num_tokens and
    content_sha256)."""
    problems: list[str] = []
    if [s["path"] for s in spans] != [path for path, _, _ in listed]:
        problems.append("its files are not the snapshot's members of it, in order")
    shas = [sha for _, _, sha in listed] if len(listed) == len(spans) else [None] * len(spans)
    parts: list[str] = []
    at = 0
    ends = [s["start"] for s in spans[1:]] + [len(text)]
    for span, next_start, sha in zip(spans, ends, shas, strict=True):
        path = span["path"]
        if span["start"] != at:
            problems.append(f"member {path} does not start where the last one ends")
        member, separator = text[span["start"] : span["end"]], text[span["end"] : next_start]
        marker = marker_text(path)
        if not member.startswith(marker):
            problems.append(f"member {path} lacks its path marker")
        file = member[len(marker) :]
        if separator not in ("", "\n") or span["end"] > next_start:
            problems.append(f"member {path} is followed by text that is no separator")
        if sha is not None and hashlib.sha256(file.encode("utf-8")).hexdigest() != sha:
            problems.append(f"member {path}: the file's text differs from its content_sha256")
        parts += [marker, file, separator]
        at = next_start
    if at != len(text):
        problems.append("its members do not cover the text")
    return parts, problems
