"""The removal gate: drops what `removals:` in sources.yaml names (a source, a path glob in a
source, the sha256 of a collected file, or the entries of a request file), right after the
licence gate, so nothing removed is ever scrubbed, enriched or tokenized (seed: honour
removal requests; nothing disappears silently, so each drop names the entry that matched).

The promotion check's pure half lives here too: the removed files' content hashes and
near-dup signatures, looked up in the kept documents of a snapshot.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import re
import unicodedata
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import ValidationError

from megacpp_pipeline.collect.source import glob_to_regex
from megacpp_pipeline.core.catalog import RemovalSpec
from megacpp_pipeline.core.errors import FieldedError
from megacpp_pipeline.core.gate import GateResult
from megacpp_pipeline.core.ledger import DropReason, drops
from megacpp_pipeline.core.schemas import git_blob_sha
from megacpp_pipeline.corpus import minhash
from megacpp_pipeline.corpus.dedup import DedupConfig


class RemovalError(FieldedError, ValueError):
    """A removal entry is wrong; names the file (and line) and the field."""

    def __init__(self, origin: str, field: str, rule: str) -> None:
        super().__init__(f"{origin}: field {field}: {rule}")
        self.origin, self.field, self.rule = origin, field, rule


@dataclass(frozen=True)
class Removal:
    """An entry after loading: where it was written (`sources.yaml removals[2]`,
    `requests.jsonl:14`), and its path glob compiled."""

    spec: RemovalSpec
    origin: str
    pattern: re.Pattern[str] | None = field(default=None, compare=False)

    @property
    def label(self) -> str:
        return f"{self.origin}: {self.spec.describe()}"

    def applies_to(self, source_id: str) -> bool:
        return self.spec.sha256 is not None or self.spec.source == source_id


def load_removals(
    entries: Sequence[RemovalSpec | Mapping[str, Any]],
    base_dir: Path,
    *,
    known_sources: Collection[str] | None = None,
    origin: str = "sources.yaml",
) -> list[Removal]:
    """The entries with every `file:` expanded in place, in order. A wrong entry (a JSONL
    line that is not an entry, an unknown source, a missing file) fails here, before any
    work, naming the file, the line and the field."""
    out: list[Removal] = []
    for i, entry in enumerate(entries):
        where = f"{origin} removals[{i}]"
        spec = _validated(entry, where)
        if spec.file is None:
            out.append(_removal(spec, where, known_sources))
            continue
        path = Path(spec.file).expanduser()
        path = path if path.is_absolute() else (base_dir / path).resolve()
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise RemovalError(where, "file", f"cannot read {path} ({e})") from None
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            at = f"{path}:{number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise RemovalError(at, "(entry)", f"not JSON ({e.msg})") from None
            inner = _validated(record, at)
            if inner.file is not None:
                raise RemovalError(at, "file", "a request file cannot name another file")
            if inner.reason is None and spec.reason is not None:
                inner = inner.model_copy(update={"reason": spec.reason})
            out.append(_removal(inner, at, known_sources))
    return out


def _validated(entry: RemovalSpec | Mapping[str, Any], where: str) -> RemovalSpec:
    if isinstance(entry, RemovalSpec):
        return entry
    if not isinstance(entry, Mapping):
        raise RemovalError(where, "(entry)", "expected a mapping such as {source: ID}")
    try:
        return RemovalSpec.model_validate(dict(entry))
    except ValidationError as e:
        first = e.errors()[0]
        name = ".".join(str(x) for x in first["loc"]) or "(entry)"
        msg = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            msg = "unknown key (typo?)"
        raise RemovalError(where, name, msg) from None


def _removal(spec: RemovalSpec, where: str, known: Collection[str] | None) -> Removal:
    if known is not None and spec.source is not None and spec.source not in known:
        raise RemovalError(where, "source", f"no source {spec.source!r} in the catalog")
    return Removal(spec, where, _path_pattern(spec.path) if spec.path is not None else None)


def _path_pattern(path: str) -> re.Pattern[str]:
    """An entry's path glob as collected paths are spelled (`./` and doubled slashes
    dropped, Unicode NFC: a path typed on one system may be NFD on another), matching a
    folder's files too: `third_party` and `third_party/` remove everything under it, as
    a gitignore pattern that names a folder does."""
    spelled = re.sub(r"/{2,}", "/", unicodedata.normalize("NFC", path))
    while spelled.startswith("./"):
        spelled = spelled[2:]
    spelled = spelled.rstrip("/")
    whole, under = glob_to_regex(spelled), glob_to_regex(spelled + "/**")
    return re.compile(f"(?:{whole.pattern})|(?:{under.pattern})")


def _nfc(path: str) -> str:
    return path if path.isascii() else unicodedata.normalize("NFC", path)


def fingerprint(removals: Sequence[Removal], source_id: str) -> str:
    """The entries that can touch this source, hashed: the gate's cache salt for it, so
    that adding `{source: B}` leaves source A's removal output (and all that follows)
    untouched. A sha256 entry touches every source."""
    h = hashlib.sha256()
    for r in removals:
        if r.applies_to(source_id):
            h.update(r.spec.model_dump_json().encode() + b"\0")
    return h.hexdigest()[:16]


# the gate ---------------------------------------------------------------------------------

REMOVED_FILES_SCHEMA = pa.schema(
    [
        pa.field("source_id", pa.string(), nullable=False),
        pa.field("path", pa.string(), nullable=False),
        pa.field("content_sha256", pa.string(), nullable=False),  # of the text as collected
        # the git blob id of its raw bytes, which every later stage carries: an exact copy is
        # found by it even where scrub changed the copy's text (and so its content_sha256)
        pa.field("blob_sha", pa.string(), nullable=False),
        pa.field("raw_sha256", pa.string()),  # of the raw bytes, when they are reconstructible
        pa.field("entry", pa.string(), nullable=False),  # Removal.label of the first match
        # which form of entry matched: "sha256", "path" or "source" (the stage's removed_by
        # counts are recounted from it over cached rows too)
        pa.field("matched_by", pa.string(), nullable=False),
        pa.field("signature", pa.list_(pa.uint64()), nullable=False),  # MinHash, for promotion
    ],
    metadata={"megacpp.table": "removed_files", "megacpp.schema_version": "2"},
)


def run(
    table: pa.Table,
    removals: Sequence[Removal],
    source_id: str,
    near: DedupConfig | None = None,
) -> GateResult:
    """Kept rows, ledger rows naming the entry that matched each removed file, and the
    `removed` side table (REMOVED_FILES_SCHEMA: hashes and a near-dup signature per removed
    file, never its text) that the promotion check reads.

    `{sha256: H}` matches a file when H is its content_sha256 (the sha256 of its text as
    normalize left it, the hash every later stage and documents.parquet carry) or the
    sha256 of its raw collected bytes (what `sha256sum` prints for the file); the two are
    the same for UTF-8 files with LF line ends and no BOM, and for the others the raw
    bytes are rebuilt from the text and the recorded encoding and proven by the git blob
    id of the raw bytes (blob_sha) before their hash is trusted."""
    mine = [r for r in removals if r.applies_to(source_id)]
    wanted = {r.spec.sha256 for r in mine if r.spec.sha256 is not None}
    if not mine or table.num_rows == 0:
        empty = GateResult(kept=table, extra={"removed": _empty_removed()})
        return replace(empty, stats=summary(empty))
    paths = table["path"].to_pylist()
    content = table["content_sha256"].to_pylist()
    # the raw bytes' hashes are needed for every row only when an entry names content
    raw = _raw_sha256s(table) if wanted else None
    matched: dict[int, tuple[Removal, str]] = {}
    for row, (path, text_hash) in enumerate(zip(paths, content, strict=True)):
        for r in mine:
            spec = r.spec
            if spec.sha256 is not None:
                hit = spec.sha256 == text_hash or (raw is not None and spec.sha256 == raw[row])
            else:
                hit = r.pattern is None or r.pattern.match(_nfc(path)) is not None
            if hit:
                form = "sha256" if spec.sha256 else "path" if spec.path else "source"
                matched[row] = (r, form)
                break
    rows = sorted(matched)
    keep = np.ones(table.num_rows, dtype=bool)
    keep[rows] = False
    taken = table.take(pa.array(rows, pa.int64()))
    labels = [matched[i][0].label for i in rows]
    ledger = drops(
        taken["source_id"].to_pylist(),
        taken["path"].to_pylist(),
        [DropReason.REMOVED_ON_REQUEST] * len(rows),
        details=labels,
    )
    signatures = removed_signatures(
        taken["text"].to_pylist(), near or DedupConfig.model_validate({})
    )
    removed = pa.table(
        {
            "source_id": taken["source_id"],
            "path": taken["path"],
            "content_sha256": taken["content_sha256"],
            "blob_sha": taken["blob_sha"],
            "raw_sha256": pa.array(
                [raw[i] for i in rows] if raw is not None else _raw_sha256s(taken), pa.string()
            ),
            "entry": pa.array(labels, pa.string()),
            "matched_by": pa.array([matched[i][1] for i in rows], pa.string()),
            "signature": pa.array(list(signatures), pa.list_(pa.uint64())),
        },
        schema=REMOVED_FILES_SCHEMA,
    )
    kept = table.filter(pa.array(keep))
    result = GateResult(kept=kept, dropped=ledger, extra={"removed": removed})
    return replace(result, stats=summary(result))


def summary(result: GateResult) -> Counter[str]:
    """The gate's counts, from its output alone (so the stage recounts them over cached rows
    too): files seen, kept, removed, and removed by each form of entry."""
    removed = result.extra["removed"]
    stats = Counter(
        files=result.kept.num_rows + result.dropped.num_rows,
        kept=result.kept.num_rows,
        removed=result.dropped.num_rows,
    )
    stats.update(f"removed_by:{form}" for form in removed["matched_by"].to_pylist())
    return stats


def _empty_removed() -> pa.Table:
    return REMOVED_FILES_SCHEMA.empty_table()


_BOM = {
    "utf-8-sig": codecs.BOM_UTF8,
    "utf-16-le": codecs.BOM_UTF16_LE,
    "utf-16-be": codecs.BOM_UTF16_BE,
    "utf-32-le": codecs.BOM_UTF32_LE,
    "utf-32-be": codecs.BOM_UTF32_BE,
}


def raw_sha256(text: str, encoding: str, size: int, blob_sha: str) -> str | None:
    """The sha256 of the raw bytes a file was collected as, rebuilt from its normalized text
    (encoding, BOM, CRLF or CR line ends) and proven by its git blob id; None when no
    rebuilding gives those bytes (mixed line ends)."""
    codec = "utf-8" if encoding == "utf-8-sig" else encoding
    for newline in ("\n", "\r\n", "\r"):
        try:
            body = text.replace("\n", newline).encode(codec)
        except (UnicodeEncodeError, LookupError):
            return None
        data = _BOM.get(encoding, b"") + body
        if len(data) == size and git_blob_sha(data) == blob_sha:
            return hashlib.sha256(data).hexdigest()
    return None


def _raw_sha256s(table: pa.Table) -> list[str | None]:
    """raw_sha256 per row; for a UTF-8 LF file its content hash, with no work."""
    plain = pc.and_(
        pc.equal(table["encoding"], "utf-8"),
        pc.equal(pc.binary_length(table["text"]), table["size"]),
    ).to_pylist()
    out: list[str | None] = []
    for i, same in enumerate(plain):
        if same:
            out.append(table["content_sha256"][i].as_py())
            continue
        out.append(
            raw_sha256(
                table["text"][i].as_py(),
                table["encoding"][i].as_py(),
                table["size"][i].as_py(),
                table["blob_sha"][i].as_py(),
            )
        )
    return out


# near-dup signatures and the promotion check ----------------------------------------------


def removed_signatures(texts: Sequence[str], config: DedupConfig) -> minhash.U64:
    """MinHash signatures of the texts as dedup signs them (its lexer, shingle size, slots,
    scheme and seed), shape (files, num_perm); a row of EMPTY_HASH has too few shingles."""
    tokens = minhash.token_hashes(list(texts))
    shingles = minhash.shingle_hashes(tokens, config.shingle_size)
    if config.scheme == "affine64":
        sig = minhash.signatures(shingles, *minhash.permutations(config.num_perm, config.seed))
    else:
        sig = minhash.one_permutation_signatures(shingles, config.num_perm, config.seed)
    sig[np.diff(shingles.offsets) < config.min_shingles] = minhash.EMPTY_HASH
    return sig


@dataclass(frozen=True)
class SnapshotFinding:
    """A kept document that carries a removed file: the removed file itself (same source and
    path) or its content are violations; another file that is a near duplicate is reported."""

    removed: str  # "source_id:path" of the removed file, or the sha256 an entry named
    entry: str  # the removals entry
    kept: str  # "source_id:path" of the kept document
    kind: str  # exact (same content hash) | near (signature) | same_path (other content)
    similarity: float | None  # estimated Jaccard (1.0 for exact; None for same_path)
    same_file: bool

    @property
    def violation(self) -> bool:
        return self.same_file or self.kind == "exact"

    @property
    def why(self) -> str:
        if self.same_file:
            return f"{self.kept} was removed by {self.entry} and is in the snapshot"
        if self.kind == "exact":
            return (
                f"{self.kept} has the content of {self.removed}, removed by {self.entry}; "
                "remove it too (a sha256 entry removes every copy)"
            )
        return (
            f"{self.kept} is another file, a near duplicate (estimated Jaccard "
            f"{self.similarity:.2f}) of {self.removed}: entries name files or content, and "
            "this file is neither, so it stays"
        )


def find_in_snapshot(
    removed: pa.Table,
    kept: pa.Table,
    config: DedupConfig | None = None,
    requested: Collection[str] = (),
) -> list[SnapshotFinding]:
    """Every kept document (source_id, path, text, and content_sha256 and blob_sha if known)
    that is a removed file (REMOVED_FILES_SCHEMA rows, from every source), has its content
    hash, its raw bytes (the blob id: scrub may have changed a copy's text) or a hash a
    sha256 entry named (`requested`), or is its near duplicate by signature: an LSH band in
    common and an estimated Jaccard of at least the dedup threshold. Call it per shard of
    the snapshot's documents and concatenate."""
    config = config or DedupConfig.model_validate({})
    if kept.num_rows == 0 or (removed.num_rows == 0 and not requested):
        return []
    keys = _keys(kept)
    texts = kept["text"].to_pylist()
    if "content_sha256" in kept.column_names:
        hashes = kept["content_sha256"].to_pylist()
    else:
        hashes = [hashlib.sha256(t.encode("utf-8")).hexdigest() for t in texts]
    gone = _keys(removed)
    entries = removed["entry"].to_pylist()
    by_hash: dict[str, int] = {}
    for column in ("content_sha256", "raw_sha256"):
        for i, h in enumerate(removed[column].to_pylist()):
            if h is not None:
                by_hash.setdefault(h, i)
    by_key = {k: i for i, k in enumerate(gone)}
    by_blob: dict[str, int] = {}
    if "blob_sha" in removed.column_names:
        for i, b in enumerate(removed["blob_sha"].to_pylist()):
            by_blob.setdefault(b, i)
    blobs = kept["blob_sha"].to_pylist() if "blob_sha" in kept.column_names else [None] * len(keys)
    findings: list[SnapshotFinding] = []
    decided: set[int] = set()
    for row, (key, h, blob) in enumerate(zip(keys, hashes, blobs, strict=True)):
        if h in by_hash or blob in by_blob:
            i = by_hash[h] if h in by_hash else by_blob[blob]
            findings.append(SnapshotFinding(gone[i], entries[i], key, "exact", 1.0, key == gone[i]))
        elif h in requested:
            findings.append(SnapshotFinding(h, f"sha256 {h}", key, "exact", 1.0, False))
        elif key in by_key:
            i = by_key[key]
            findings.append(SnapshotFinding(gone[i], entries[i], key, "same_path", None, True))
        else:
            continue
        decided.add(row)
    for k, r, sim in _near_pairs(removed, texts, config):
        if k not in decided:
            findings.append(SnapshotFinding(gone[r], entries[r], keys[k], "near", sim, False))
    return findings


def _keys(table: pa.Table) -> list[str]:
    return [
        f"{s}:{p}"
        for s, p in zip(table["source_id"].to_pylist(), table["path"].to_pylist(), strict=True)
    ]


def _near_pairs(
    removed: pa.Table, texts: Sequence[str], config: DedupConfig
) -> list[tuple[int, int, float]]:
    """(kept row, removed row, estimated Jaccard) of the pairs that share an LSH band (as
    dedup's candidates do) and clear the dedup threshold."""
    if removed.num_rows == 0:
        return []
    gone = np.asarray(removed["signature"].to_pylist(), dtype=np.uint64).reshape(
        removed.num_rows, -1
    )
    if gone.shape[1] != config.num_perm:
        raise ValueError(
            f"removed files were signed with {gone.shape[1]} slots, the dedup config has "
            f"{config.num_perm}"
        )
    live = np.flatnonzero(~np.all(gone == minhash.EMPTY_HASH, axis=1))
    if len(live) == 0:
        return []
    sig = removed_signatures(texts, config)
    kept_live = ~np.all(sig == minhash.EMPTY_HASH, axis=1)
    gone_bands = minhash.band_hashes(gone[live], config.bands, config.rows)
    kept_bands = minhash.band_hashes(sig, config.bands, config.rows)
    pairs: set[tuple[int, int]] = set()
    for b in range(config.bands):
        order = np.argsort(gone_bands[:, b], kind="stable")
        column = gone_bands[order, b]
        lo = np.searchsorted(column, kept_bands[:, b], side="left")
        hi = np.searchsorted(column, kept_bands[:, b], side="right")
        for k in np.flatnonzero((hi > lo) & kept_live).tolist():
            pairs.update((k, int(live[j])) for j in order[lo[k] : hi[k]].tolist())
    out = []
    for k, r in sorted(pairs):
        sim = float(minhash.estimated_jaccard(sig[k], gone[r]))
        if sim >= config.threshold:
            out.append((k, r, sim))
    return out


def violations(findings: Sequence[SnapshotFinding]) -> list[SnapshotFinding]:
    """What fails the promotion check: a removed file, or removed content, in the snapshot."""
    return [f for f in findings if f.violation]


def remaining_near_duplicates(findings: Sequence[SnapshotFinding]) -> list[SnapshotFinding]:
    """What the report lists: other files that are near duplicates of removed ones, and
    stay, each with why (`SnapshotFinding.why`)."""
    return [f for f in findings if not f.violation]
