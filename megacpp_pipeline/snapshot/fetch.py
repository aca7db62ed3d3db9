"""A snapshot named by URI (`s3://bucket/prefix/snapshots/<id>`, any pyarrow filesystem URI)
as a local directory the readers take: `megacpp verify`, `inspect`, `export-megatron` and the
loader. The copy goes under a cache folder named by the snapshot id, file by file from the
snapshot's own manifest (a file already there with its recorded sha256 is not fetched again);
`manifest.json`, the card and `_COMPLETE` come last, so a copy cut short is not a snapshot.
A local path is returned as it is."""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path

import pyarrow.fs as pafs

from megacpp_pipeline.snapshot.layout import CARD, COMPLETE, MANIFEST, REPORT_DIR, SnapshotManifest
from megacpp_pipeline.storage.filesystem import resolve

CACHE_ENV = "MEGACPP_CACHE_DIR"


class SnapshotFetchError(Exception):
    """The URI names no promoted snapshot, or one of its files cannot be read."""


def default_cache() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "megacpp") / "snapshots"


def local_snapshot(
    where: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None
) -> Path:
    """`where` if it is a local path; else a local copy of the snapshot at that URI.
    Bytes are copied as they are: `megacpp verify` then judges them against the manifest."""
    text = os.fspath(where)
    if "://" not in text:
        return Path(text)
    try:
        fs, root = resolve(text)
    except ValueError as e:
        raise SnapshotFetchError(str(e)) from e

    def read(name: str) -> bytes:
        try:
            with fs.open_input_stream(f"{root}/{name}") as f:
                return bytes(f.read())
        except OSError as e:
            raise SnapshotFetchError(f"{text}: cannot read {name} ({e})") from e

    complete = read(COMPLETE)  # a folder without it is not a promoted snapshot
    raw = read(MANIFEST)
    try:
        manifest = SnapshotManifest.model_validate_json(raw)
    except ValueError as e:
        raise SnapshotFetchError(f"{text}: {MANIFEST} is not a snapshot manifest ({e})") from e
    snapshot_id = manifest.snapshot_id
    local = Path(cache_dir) if cache_dir is not None else default_cache()
    local = local / snapshot_id
    marker = local / COMPLETE
    # what else the folder holds comes too: a reader of the folder takes every file in it
    # (the card's `train/*.parquet`, `load_dataset` on text/), so verify must see them;
    # only the report, derived and rebuilt, is left
    for rel, size in _unlisted(fs, root, manifest):
        path = local / rel
        if not (path.is_file() and path.stat().st_size == size):
            marker.unlink(missing_ok=True)
            _write(path, read(rel))
    if marker.exists() and marker.read_bytes() == complete:
        return local
    marker.unlink(missing_ok=True)
    for entry in manifest.files:
        path = local / entry.path
        if path.exists() and hashlib.sha256(path.read_bytes()).hexdigest() == entry.sha256:
            continue
        _write(path, read(entry.path))
    try:
        _write(local / CARD, read(CARD))
    except SnapshotFetchError:
        pass  # a snapshot from before the card
    _write(local / MANIFEST, raw)
    _write(marker, complete)
    return local


def _unlisted(fs: pafs.FileSystem, root: str, manifest: SnapshotManifest) -> list[tuple[str, int]]:
    """(path, size) of every file under `root` that the manifest does not list."""
    try:
        infos = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    except OSError as e:
        raise SnapshotFetchError(f"{root}: cannot list the snapshot's folder ({e})") from e
    listed = {f.path for f in manifest.files} | {MANIFEST, COMPLETE, CARD}
    out = []
    for info in infos:
        rel = info.path[len(root.rstrip("/")) + 1 :]
        if (
            info.type == pafs.FileType.File
            and rel not in listed
            and not rel.startswith(f"{REPORT_DIR}/")
        ):
            out.append((rel, info.size or 0))
    return sorted(out)


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    tmp.write_bytes(data)
    os.replace(tmp, path)
