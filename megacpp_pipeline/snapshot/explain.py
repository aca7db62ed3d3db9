"""`megacpp explain`: where a file went, from a snapshot alone. For a collected file, the
revision it was collected at, each stage it passed, where and why it was dropped (for a
duplicate: its cluster and the file kept instead), its licence and where that was decided,
what scrub replaced in it, and for a kept file its document: doc_id, split, tokens and the
rows that hold it. For content (a sha256, or a local file): the collected files with those
bytes or that text, and the kept documents that are near duplicates of it (The Stack's
"Am I in the Stack?" question, answered offline).
"""

from __future__ import annotations

import argparse
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from megacpp_pipeline.collect.source import is_utf8, name_of, unescape_name
from megacpp_pipeline.corpus import minhash
from megacpp_pipeline.corpus.dedup import DedupConfig
from megacpp_pipeline.gates.removals import removed_signatures
from megacpp_pipeline.snapshot import layout
from megacpp_pipeline.snapshot.document_files import read_document_files
from megacpp_pipeline.snapshot.layout import SnapshotManifest
from megacpp_pipeline.snapshot.promote import read_manifest
from megacpp_pipeline.snapshot.texts import FileText, file_texts


@dataclass
class Journey:
    """One collected file's way through the pipeline, as the snapshot records it."""

    source_id: str
    path: str
    found: bool  # collected by this snapshot's sources
    status: str = "not collected"  # kept | dropped | not collected
    revision: str | None = None
    stage: str | None = None  # where it was dropped ("snapshot" when kept)
    reason: str | None = None
    detail: str | None = None
    dup_of: str | None = None
    license_expression: str | None = None
    sha256: str | None = None
    passed: list[str] = field(default_factory=list)  # stages it was kept by
    document: dict[str, Any] | None = None  # a kept file's document row and its rows

    @property
    def in_corpus(self) -> bool:
        return self.status == "kept"


@dataclass
class ContentMatch:
    """A kept document near (or equal) to some content, with how near."""

    source_id: str
    path: str
    doc_id: int
    jaccard: float


def _key(source_id: str, path: str) -> str:
    return f"{source_id}:{path}"


def explain_path(snapshot_dir: Path, source_id: str, path: str) -> Journey:
    snap = Path(snapshot_dir)
    manifest = read_manifest(snap)
    ledger = pq.read_table(snap / layout.LEDGER)
    mask = pc.and_(pc.equal(ledger["source_id"], source_id), pc.equal(ledger["path"], path))
    rows = ledger.filter(mask).to_pylist()
    source = manifest.sources.get(source_id)
    if not rows:
        return Journey(source_id, path, False, revision=source.revision if source else None)
    row = rows[0]
    journey = Journey(
        source_id,
        path,
        True,
        status=row["status"],
        revision=source.revision if source else None,
        stage=row["stage"],
        reason=row["reason"],
        detail=row["detail"],
        dup_of=row["dup_of"],
        license_expression=row["license_expression"],
        sha256=row.get("sha256"),
    )
    stages = manifest.ledger_stages
    if row["status"] == "kept":
        journey.passed = list(stages)
        journey.document = _document(snap, manifest, source_id, path)
    elif row["stage"] in stages:
        journey.passed = stages[: stages.index(row["stage"])]
    return journey


def _document(
    snap: Path, manifest: SnapshotManifest, source_id: str, path: str
) -> dict[str, Any] | None:
    """A kept file's document row, the rows holding it, and where the file sits in it
    (`member`: its position and token span, from document_files.parquet)."""
    files = read_document_files(snap)
    mask = pc.and_(pc.equal(files["source_id"], source_id), pc.equal(files["path"], path))
    found = files.filter(mask).to_pylist()
    if not found:
        return None
    member = found[0]
    documents = pq.read_table(snap / layout.DOCUMENTS)
    doc = documents.filter(pc.equal(documents["doc_id"], member["doc_id"])).to_pylist()[0]
    doc["member"] = member
    pieces = pq.read_table(snap / layout.PIECES)
    mine = pieces.filter(pc.equal(pieces["doc_id"], doc["doc_id"]))
    doc["pack_ids"] = sorted(set(mine["pack_id"].to_pylist()))
    return doc


def find_by_sha256(snapshot_dir: Path, digest: str) -> list[tuple[str, str]]:
    """Collected files whose bytes (ledger sha256) or kept text (document_files
    content_sha256) have this sha256."""
    snap = Path(snapshot_dir)
    digest = digest.lower()
    hits: list[tuple[str, str]] = []
    if "sha256" in pq.read_schema(snap / layout.LEDGER).names:  # older ledgers lack it
        ledger = pq.read_table(snap / layout.LEDGER, columns=["source_id", "path", "sha256"])
        found = ledger.filter(pc.equal(ledger["sha256"], digest))
        hits += list(zip(found["source_id"].to_pylist(), found["path"].to_pylist(), strict=True))
    files = read_document_files(snap, ["source_id", "path", "content_sha256"])
    found = files.filter(pc.equal(files["content_sha256"], digest))
    hits += list(zip(found["source_id"].to_pylist(), found["path"].to_pylist(), strict=True))
    return list(dict.fromkeys(hits))


def normalized_text(data: bytes) -> str:
    """A local file's text as normalize would leave it: UTF-8 without a BOM, LF line ends."""
    text = data.decode("utf-8", errors="replace").removeprefix("\ufeff")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def near_documents(
    snapshot_dir: Path, text: str, config: DedupConfig | None = None, top: int = 5
) -> list[ContentMatch]:
    """Kept files whose estimated Jaccard with `text` (MinHash over C++ tokens, as dedup
    signs files) reaches dedup's threshold, nearest first; each file's text is cut from its
    document, so a repository document is compared file by file."""
    config = config or DedupConfig.model_validate({})
    snap = Path(snapshot_dir)
    manifest = read_manifest(snap)
    query = removed_signatures([text], config)[0]
    if np.all(query == minhash.EMPTY_HASH):
        return []
    matches: list[ContentMatch] = []
    batch: list[FileText] = []

    def flush() -> None:
        sigs = removed_signatures([f.text for f in batch], config)
        for f, sig in zip(batch, sigs, strict=True):
            j = float(minhash.estimated_jaccard(query, sig))
            if j >= config.threshold:
                matches.append(ContentMatch(f.source_id, f.path, f.doc_id, j))
        batch.clear()

    for f in file_texts(snap, manifest):
        batch.append(f)
        if len(batch) >= 512:
            flush()
    if batch:
        flush()
    return sorted(matches, key=lambda m: (-m.jaccard, m.doc_id, m.path))[:top]


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def render(journey: Journey) -> str:
    """The journey as a person reads it."""
    lines = [_key(journey.source_id, journey.path)]
    if not journey.found:
        at = f" at revision {journey.revision}" if journey.revision else ""
        lines.append(f"  not collected: no such file in source {journey.source_id}{at}")
        return "\n".join(lines)
    lines.append(f"  collected   at revision {journey.revision}, sha256 {journey.sha256}")
    if "\\" in journey.path:
        lines.append(
            f"  on disk     {unescape_name(journey.path)!r} (the ledger path above is its "
            "escaped spelling)"
        )
    if journey.passed:
        lines.append("  kept by     " + " -> ".join(journey.passed))
    if journey.status == "kept":
        doc = journey.document or {}
        member = doc.get("member") or {}
        lines.append(
            f"  in corpus   doc {doc.get('doc_id')}, split {doc.get('split')}, "
            f"{doc.get('num_tokens')} tokens in {doc.get('num_pieces')} piece(s), "
            f"rows (pack_id) {doc.get('pack_ids')}"
        )
        draws = doc.get("draws")
        if draws is not None and draws != 1:  # its source's weight repeats or leaves it out
            lines.append(
                f"  weighted    packed {draws} time(s) (its source's weight)"
                + ("; not in the rows" if draws == 0 else "")
            )
        if (doc.get("num_files") or 1) > 1 or doc.get("path") != journey.path:
            start = member.get("start_token", 0)
            end = start + member.get("num_tokens", 0)
            lines.append(
                f"  in document {doc.get('path') or '(root)'}: file "
                f"{member.get('position', 0) + 1} of {doc.get('num_files')}, its tokens "
                f"{start}..{end} (its path marker, and a closing newline if the file lacks one, "
                "included)"
            )
        lines.append(
            f"  licence     {member.get('license_expression', doc.get('license_expression'))} "
            f"(decided from {doc.get('license_source')})"
        )
        kinds = doc.get("scrub_kinds") or []
        lines.append(f"  scrubbed    {', '.join(kinds) if kinds else 'nothing replaced'}")
        if "language" in doc:
            lines.append(
                f"  language    {doc['language']}, "
                f"vendored: {'yes' if doc.get('vendored') else 'no'}"
            )
    else:
        lines.append(f"  dropped at  {journey.stage}: {journey.reason}")
        if journey.detail:
            lines.append(f"  because     {journey.detail}")
        if journey.dup_of:
            lines.append(f"  kept copy   {journey.dup_of}")
        if journey.license_expression:
            lines.append(f"  licence     {journey.license_expression}")
    return "\n".join(lines)


# the command ------------------------------------------------------------------------------
def _cmd(args: argparse.Namespace) -> int:
    """Exit 0 when the file or content is in the corpus (a kept document, or a near
    duplicate of one), 1 when it is not."""
    snap = Path(args.snapshot_dir)
    read_manifest(snap)
    if args.file:
        data = Path(args.file).read_bytes()
        text = normalized_text(data)
        hits = find_by_sha256(snap, hashlib.sha256(data).hexdigest()) + find_by_sha256(
            snap, sha256_text(text)
        )
        journeys = [explain_path(snap, s, p) for s, p in dict.fromkeys(hits)]
        for j in journeys:
            print(render(j))
        near = near_documents(snap, text)
        for m in near:
            print(
                f"near duplicate of {m.source_id}:{m.path} "
                f"(doc {m.doc_id}, estimated Jaccard {m.jaccard:.2f})"
            )
        found = any(j.in_corpus for j in journeys) or bool(near)
        if not journeys and not near:
            print(
                f"{args.file}: not in {snap.name} (no collected file has these bytes or "
                "this text, no kept document is a near duplicate)"
            )
        return 0 if found else 1
    if args.sha256:
        hits = find_by_sha256(snap, args.sha256)
        if not hits:
            print(f"sha256 {args.sha256}: no collected file or kept document has it")
            return 1
        journeys = [explain_path(snap, s, p) for s, p in hits]
    else:
        if not args.file_id or ":" not in args.file_id:
            raise SystemExit(
                "megacpp explain: give SOURCE:PATH, --sha256 HASH or --file LOCAL_FILE"
            )
        source, _, path = args.file_id.partition(":")
        journeys = _by_name(snap, source, path)
    for j in journeys:
        print(render(j))
    # several files can match (copies under other names, a name in two spellings): the
    # answer is whether any of them reached the corpus
    return 0 if any(j.in_corpus for j in journeys) else 1


def _by_name(snap: Path, source: str, path: str) -> list[Journey]:
    """The file a SOURCE:PATH names. PATH is first the path as the ledger writes it (a name
    that is not UTF-8 or holds a backslash is escaped there, collect.escape_name), then the
    name as it is on disk (the bytes the shell passed). When both name a collected file and
    they differ, both are shown, the ledger's spelling first."""
    candidates = []
    if is_utf8(path):
        candidates.append(path)
    on_disk = name_of(path)
    if on_disk not in candidates:
        candidates.append(on_disk)
    found = [j for j in (explain_path(snap, source, p) for p in candidates) if j.found]
    return found or [explain_path(snap, source, candidates[0])]


def register(p: argparse.ArgumentParser) -> None:
    p.description = (
        "where a file went: collected, each stage's decision, its document "
        "(exit 0 if it is in the corpus, 1 if not)"
    )
    p.add_argument("snapshot_dir")
    p.add_argument("file_id", nargs="?", help="SOURCE:PATH of a collected file")
    p.add_argument("--sha256", help="the sha256 of a file's bytes or of a kept document's text")
    p.add_argument("--file", help="a local file: is its content in the corpus (exact or near)?")
    p.set_defaults(func=_cmd)
