"""`megacpp diff OLD NEW`: what changed between two snapshots, from their files alone: the
sources whose revision moved (or that came or went), the files added, removed and changed
per source (by the sha256 of their collected bytes; a file whose sha256 one ledger lacks,
as ledgers written before they had one do, is reported as not comparable rather than
changed), kept documents and tokens, licences,
what scrub replaced, and whether the tokenizer changed. The nightly refresh attaches it to
the new snapshot's materialization and its dataset card."""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from megacpp_pipeline.snapshot import layout
from megacpp_pipeline.snapshot.card import tokenizer_origin
from megacpp_pipeline.snapshot.layout import SnapshotManifest
from megacpp_pipeline.snapshot.promote import read_manifest
from megacpp_pipeline.snapshot.streams import Cursor, OutOfOrderError, in_order, read_back


@dataclass
class SourceChange:
    source_id: str
    old_revision: str | None
    new_revision: str | None
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    # in both, but a ledger (one written before ledgers had sha256s) does not say its bytes
    unknown: list[str] = field(default_factory=list)
    old_documents: int = 0
    new_documents: int = 0
    old_weight: float | None = None  # None: not in that snapshot
    new_weight: float | None = None

    @property
    def moved(self) -> bool:
        return self.old_revision != self.new_revision

    @property
    def reweighted(self) -> bool:
        return None not in (self.old_weight, self.new_weight) and self.old_weight != self.new_weight


@dataclass
class SnapshotDiff:
    old_id: str
    new_id: str
    sources: list[SourceChange]
    documents: tuple[int, int]
    tokens: dict[str, tuple[int, int]]  # split -> (old, new)
    licences: dict[str, tuple[int, int]]  # expression -> documents (old, new), changed only
    scrub: dict[str, tuple[int, int]]  # kind -> documents (old, new), changed only
    tokenizer_changed: bool
    # where the new snapshot's tokenizer came from (its manifest's tokenizer_policy)
    tokenizer_policy: dict[str, Any] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return (
            not any(
                s.moved or s.reweighted or s.added or s.removed or s.changed or s.unknown
                for s in self.sources
            )
            and self.documents[0] == self.documents[1]
            and not self.tokenizer_changed
        )


_KEY = ["source_id", "path"]
_WHAT = ("added", "removed", "changed", "unknown")


def _ledger(snap: Path) -> pa.Table:
    """Every collected file of a snapshot and the sha256 of its bytes (null in a ledger
    written before it had one)."""
    present = pq.read_schema(snap / layout.LEDGER).names
    columns = [c for c in [*_KEY, "sha256"] if c in present]
    table = pq.read_table(snap / layout.LEDGER, columns=columns)
    if "sha256" not in table.column_names:
        table = table.append_column("sha256", pa.nulls(table.num_rows, pa.string()))
    return table.select([*_KEY, "sha256"]).cast(_LEDGER_SCHEMA)


def _file_changes(old: Path, new: Path) -> dict[str, dict[str, list[str]]]:
    """Per source, the paths added, removed, changed (another sha256) and unknown (a sha256
    missing on either side) from `old` to `new`, each sorted. A merge of the two ledgers a
    chunk at a time, source by source (every snapshot writes a source's ledger rows in path
    order): memory follows a row group and
    the changes found, not the corpus. Ledgers not in that order (a snapshot from before it
    was kept) are joined whole."""
    try:
        return _merged_changes(old, new)
    except OutOfOrderError:  # a ledger whose rows are not in path order
        return _joined_changes(old, new)


class _Runs:
    """A ledger's rows of each source, read a row group at a time: where each source's runs
    of rows are (from the source_id column alone), then those rows on demand."""

    def __init__(self, snap: Path) -> None:
        self.path = snap / layout.LEDGER
        self.file = pq.ParquetFile(self.path)
        present = self.file.schema_arrow.names
        self.columns = [c for c in [*_KEY, "sha256"] if c in present]
        self.runs: dict[str, list[tuple[int, int, int]]] = {}  # source -> (group, start, end)
        labels = pq.ParquetFile(self.path, read_dictionary=["source_id"])
        for group in range(self.file.num_row_groups):
            column = labels.read_row_group(group, ["source_id"])["source_id"].combine_chunks()
            names = column.dictionary.to_pylist()
            ids = column.indices.to_numpy()
            cut = np.flatnonzero(ids[1:] != ids[:-1]) + 1
            for start, end in zip(np.r_[0, cut], np.r_[cut, len(ids)], strict=True):
                if end > start:
                    self.runs.setdefault(names[ids[start]], []).append((group, start, end))
        self._cached: tuple[int, pa.Table] | None = None

    def rows(self, source: str) -> Iterator[pa.Table]:
        """The source's rows (source_id, path, sha256), refused unless in path order."""
        return in_order(self._rows(source), "path", f"{self.path} [{source}]")

    def _rows(self, source: str) -> Iterator[pa.Table]:
        for group, start, end in self.runs.get(source, []):
            if self._cached is None or self._cached[0] != group:
                self._cached = (group, self.file.read_row_group(group, self.columns))
            table = self._cached[1].slice(start, end - start)
            if "sha256" not in table.column_names:
                table = table.append_column("sha256", pa.nulls(table.num_rows, pa.string()))
            yield table.select([*_KEY, "sha256"]).cast(_LEDGER_SCHEMA)


_LEDGER_SCHEMA = pa.schema(
    [("source_id", pa.string()), ("path", pa.string()), ("sha256", pa.string())]
)


def _merged_changes(old_dir: Path, new_dir: Path) -> dict[str, dict[str, list[str]]]:
    old, new = _Runs(old_dir), _Runs(new_dir)
    out: dict[str, dict[str, list[str]]] = {}
    for source in dict.fromkeys([*new.runs, *old.runs]):
        found: dict[str, list[str]] = {w: [] for w in _WHAT}
        before = Cursor(old.rows(source), "path", _LEDGER_SCHEMA)
        for chunk in _whole_paths(new.rows(source)):
            _compare(before.upto(chunk["path"][-1].as_py()), chunk, found)
        for rest in before.rest():
            found["removed"] += rest["path"].to_pylist()
        out[source] = {
            what: sorted(set(paths)) for what, paths in found.items() if paths
        }  # a path ledgered twice (ambiguous copies) is named once
    return out


def _whole_paths(chunks: Iterable[pa.Table]) -> Iterator[pa.Table]:
    """`chunks` (sorted by path) re-cut so that no path's rows span two of them: a source's
    ledger can name a path twice (every copy of an ambiguous name is ledgered), and a row
    group may end between those rows."""
    held: pa.Table | None = None
    for chunk in chunks:
        if held is not None:
            chunk = pa.concat_tables([held, chunk])
        last = chunk["path"][-1]
        tail = pc.equal(chunk["path"], last)
        held = chunk.filter(tail)
        if held.num_rows < chunk.num_rows:
            yield chunk.filter(pc.invert(tail))
    if held is not None:
        yield held


def _compare(old: pa.Table, new: pa.Table, found: dict[str, list[str]]) -> None:
    """The paths of `new` not in `old` (added), of `old` not in `new` (removed), in both with
    another sha256 (changed) or without one on either side (unknown), by two hash lookups.
    A path ledgered more than once compares the sorted sha256s of all its rows."""
    old, new = _one_row_per_path(old), _one_row_per_path(new)
    at = pc.index_in(new["path"], value_set=old["path"])
    found["added"] += new["path"].filter(pc.is_null(at)).to_pylist()
    back = pc.index_in(old["path"], value_set=new["path"])
    found["removed"] += old["path"].filter(pc.is_null(back)).to_pylist()
    both = pc.is_valid(at)
    was = pc.take(old["sha256"], at.filter(both))
    now = new["sha256"].filter(both)
    paths = new["path"].filter(both)
    unknown = pc.or_(pc.is_null(was), pc.is_null(now))
    found["unknown"] += paths.filter(unknown).to_pylist()
    differs = pc.and_(pc.invert(unknown), pc.not_equal(was, now))
    found["changed"] += paths.filter(differs).to_pylist()


def _one_row_per_path(table: pa.Table) -> pa.Table:
    """`table` with the rows of a path named more than once folded into one, its sha256 the
    sorted sha256s of those rows, null if one lacks it (rare: every copy of an ambiguous
    name is ledgered)."""
    if pc.count_distinct(table["path"]).as_py() == table.num_rows:
        return table
    hashes: dict[str, list[str | None]] = {}
    first: dict[str, str] = {}
    columns = (table[c].to_pylist() for c in ("source_id", "path", "sha256"))
    for source, path, digest in zip(*columns, strict=True):
        first.setdefault(path, source)
        hashes.setdefault(path, []).append(digest)
    return pa.table(
        {
            "source_id": list(first.values()),
            "path": list(first),
            "sha256": [
                None if None in d else ",".join(sorted(x for x in d if x is not None))
                for d in hashes.values()
            ],
        },
        schema=_LEDGER_SCHEMA,
    )


def _joined_changes(old: Path, new: Path) -> dict[str, dict[str, list[str]]]:
    """_file_changes over the two whole ledgers, a source at a time (Arrow only: the diff
    runs in forked workers, where polars may hang)."""
    before, after = _ledger(old), _ledger(new)
    out: dict[str, dict[str, list[str]]] = {}
    sources = pc.unique(
        pa.chunked_array([*before["source_id"].chunks, *after["source_id"].chunks], pa.string())
    )
    for source in sorted(sources.to_pylist()):
        found: dict[str, list[str]] = {w: [] for w in _WHAT}
        _compare(
            before.filter(pc.equal(before["source_id"], source)),
            after.filter(pc.equal(after["source_id"], source)),
            found,
        )
        out[source] = {what: sorted(paths) for what, paths in found.items() if paths}
    return out


def _documents(snap: Path) -> tuple[Counter[str], Counter[str], Counter[str]]:
    """Documents per source, per licence expression and per scrub kind, counted a row group
    at a time."""
    present = pq.read_schema(snap / layout.DOCUMENTS).names
    wanted = ["source_id", "license_expression", "scrub_kinds"]
    per_source: Counter[str] = Counter()
    licences: Counter[str] = Counter()
    scrub: Counter[str] = Counter()

    def count(into: Counter[str], column: pa.ChunkedArray | pa.Array) -> None:
        for row in pc.value_counts(column).to_pylist():
            into[row["values"]] += row["counts"]

    for docs in read_back(snap / layout.DOCUMENTS, [c for c in wanted if c in present]):
        count(per_source, docs["source_id"])
        licence = docs["license_expression"]
        count(licences, pc.fill_null(pc.if_else(pc.equal(licence, ""), None, licence), "(none)"))
        if "scrub_kinds" in docs.column_names:
            count(scrub, pc.drop_null(pc.list_flatten(docs["scrub_kinds"])))
    return per_source, licences, scrub


def _deltas(old: Counter[str], new: Counter[str]) -> dict[str, tuple[int, int]]:
    return {k: (old[k], new[k]) for k in sorted(set(old) | set(new)) if old[k] != new[k]}


def diff_snapshots(old_dir: Path, new_dir: Path) -> SnapshotDiff:
    old, new = Path(old_dir), Path(new_dir)
    om, nm = read_manifest(old), _manifest(new)
    files = _file_changes(old, new)
    old_docs, old_lic, old_scrub = _documents(old)
    new_docs, new_lic, new_scrub = _documents(new)
    sources = []
    for sid in sorted(set(om.sources) | set(nm.sources) | set(files)):
        change = files.get(sid, {})
        sources.append(
            SourceChange(
                sid,
                om.sources[sid].revision if sid in om.sources else None,
                nm.sources[sid].revision if sid in nm.sources else None,
                added=change.get("added", []),
                removed=change.get("removed", []),
                changed=change.get("changed", []),
                unknown=change.get("unknown", []),
                old_documents=old_docs[sid],
                new_documents=new_docs[sid],
                old_weight=om.sources[sid].weight if sid in om.sources else None,
                new_weight=nm.sources[sid].weight if sid in nm.sources else None,
            )
        )
    return SnapshotDiff(
        old_id=om.snapshot_id,
        new_id=nm.snapshot_id,
        sources=sources,
        documents=(om.documents, nm.documents),
        tokens={
            split: (
                om.splits[split].tokens if split in om.splits else 0,
                nm.splits[split].tokens if split in nm.splits else 0,
            )
            for split in sorted(set(om.splits) | set(nm.splits))
        },
        licences=_deltas(old_lic, new_lic),
        scrub=_deltas(old_scrub, new_scrub),
        tokenizer_changed=om.tokenizer.get("sha256") != nm.tokenizer.get("sha256"),
        tokenizer_policy=dict(nm.tokenizer_policy),
    )


def _manifest(snap: Path) -> SnapshotManifest:
    """The manifest of a promoted snapshot, or of one being built (no _COMPLETE yet)."""
    return (
        read_manifest(snap)
        if (snap / layout.COMPLETE).exists()
        else SnapshotManifest.model_validate_json((snap / layout.MANIFEST).read_bytes())
    )


def _signed(old: int, new: int) -> str:
    return f"{old:,} -> {new:,} ({new - old:+,})"


def render_markdown(d: SnapshotDiff, limit: int = 10) -> str:
    """The diff as markdown: a paragraph per kind of change, lists cut at `limit` names."""
    lines = [f"From `{d.old_id}` to `{d.new_id}`.", ""]
    moved = [s for s in d.sources if s.moved]
    if moved:
        lines += ["| source | old revision | new revision |", "|---|---|---|"]
        lines += [f"| {s.source_id} | `{s.old_revision}` | `{s.new_revision}` |" for s in moved]
        lines.append("")
    weights = [s for s in d.sources if s.reweighted or (s.new_weight or 1.0) != 1.0]
    if weights:
        lines += ["| source | old weight | new weight |", "|---|---:|---:|"]
        lines += [f"| {s.source_id} | {s.old_weight} | {s.new_weight} |" for s in weights]
        lines.append("")
    touched = [
        s
        for s in d.sources
        if s.added or s.removed or s.changed or s.unknown or s.old_documents != s.new_documents
    ]
    if touched:
        unknown = any(s.unknown for s in touched)  # its column only when a ledger lacks hashes
        lines += [
            "| source | files added | removed | changed |"
            + (" not comparable |" if unknown else "")
            + " documents |",
            "|---|---:|---:|---:|" + ("---:|" if unknown else "") + "---|",
        ]
        lines += [
            f"| {s.source_id} | {len(s.added)} | {len(s.removed)} | {len(s.changed)} | "
            + (f"{len(s.unknown)} | " if unknown else "")
            + f"{_signed(s.old_documents, s.new_documents)} |"
            for s in touched
        ]
        lines.append("")
        for s in touched:
            for what, names in (
                ("added", s.added),
                ("removed", s.removed),
                ("changed", s.changed),
                ("not comparable", s.unknown),
            ):
                if names:
                    shown = ", ".join(f"`{n}`" for n in names[:limit])
                    more = f" and {len(names) - limit} more" if len(names) > limit else ""
                    lines.append(f"- {s.source_id} {what}: {shown}{more}")
        if unknown:
            lines.append(
                "- not comparable: in both snapshots, but a ledger records no sha256 for them "
                "(it was written before ledgers had one), so whether they changed is unknown"
            )
        lines.append("")
    lines.append(f"Documents: {_signed(*d.documents)}.")
    for split, (a, b) in d.tokens.items():
        lines.append(f"Tokens ({split}): {_signed(a, b)}.")
    for title, table in (
        ("Licences (documents)", d.licences),
        ("Scrub kinds (documents)", d.scrub),
    ):
        if table:
            lines += ["", f"{title}:", ""] + [
                f"- {k}: {_signed(a, b)}" for k, (a, b) in table.items()
            ]
    origin = f" ({tokenizer_origin(d.tokenizer_policy)})" if d.tokenizer_policy else ""
    lines += ["", f"Tokenizer changed: {'yes' if d.tokenizer_changed else 'no'}{origin}."]
    return "\n".join(lines)


def _cmd(args: argparse.Namespace) -> int:
    print(render_markdown(diff_snapshots(Path(args.old), Path(args.new))))
    return 0


def register(p: argparse.ArgumentParser) -> None:
    p.description = "what changed between two snapshots (sources, files, documents, tokens)"
    p.add_argument("old")
    p.add_argument("new")
    p.set_defaults(func=_cmd)
