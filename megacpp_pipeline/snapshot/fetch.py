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

from megacpp_pipeline.snapshot.layout import CARD, COMPLETE, MANIFEST, SnapshotManifest
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


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    tmp.write_bytes(data)
    os.replace(tmp, path)
