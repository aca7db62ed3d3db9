"""Where a data dir lives: a local path or any pyarrow filesystem URI (`s3://bucket/prefix`,
`gs://...`, `file://...`). For S3 the endpoint comes from the standard AWS variables
(`AWS_ENDPOINT_URL` included, which pyarrow's AWS SDK reads itself) or from the URI's query,
`s3://bucket/prefix?endpoint_override=127.0.0.1:9000&scheme=http`; credentials and region
likewise (`AWS_ACCESS_KEY_ID`, `AWS_DEFAULT_REGION`, `?region=`).

S3 objects are opened with `allow_delayed_open=true` unless the URI says otherwise: a small
object (a lease, a manifest, `_COMPLETE`) is then one PUT instead of a three-request multipart
upload (44 -> 32 requests per one-shard version on moto); large shards still go multipart.
"""

from __future__ import annotations

import os

import pyarrow.fs as pafs

_OBJECT_STORES = ("s3", "gcs")  # no directories, no rename; errors name the bucket


def resolve(uri: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem and the root path inside it (query parameters consumed)."""
    if "://" not in uri:
        return pafs.LocalFileSystem(), os.path.abspath(uri)
    if uri.startswith("s3://") and "allow_delayed_open=" not in uri:
        uri += ("&" if "?" in uri else "?") + "allow_delayed_open=true"
    try:
        fs, path = pafs.FileSystem.from_uri(uri)
    except (OSError, ValueError) as e:
        raise ValueError(f"{uri}: not a filesystem URI pyarrow can open ({e})") from e
    return fs, path.rstrip("/")


def is_local(fs: pafs.FileSystem) -> bool:
    """Local disk: a rename is atomic and cheap there, and directories must exist."""
    return isinstance(fs, pafs.LocalFileSystem)


def needs_directories(fs: pafs.FileSystem) -> bool:
    """Object stores have no directories to create (a prefix exists once an object does)."""
    return fs.type_name not in _OBJECT_STORES


def describe(fs: pafs.FileSystem, path: str) -> str:
    """A path as an error message names it: on an object store the bucket and the key
    (`s3 bucket 'b', key 'p/x'`), so a failure says which bucket; locally the path."""
    if fs.type_name not in _OBJECT_STORES:
        return path
    bucket, _, key = path.partition("/")
    return f"{fs.type_name} bucket {bucket!r}, key {key!r}"


def bucket_exists(fs: pafs.FileSystem, path: str) -> bool:
    """Whether the bucket `path` lies in exists (always True off object stores): a listing
    of a deleted bucket looks empty, which must not read as "nothing written yet"."""
    if fs.type_name not in _OBJECT_STORES:
        return True
    try:
        return fs.get_file_info(path.split("/", 1)[0]).type != pafs.FileType.NotFound
    except OSError:
        return False
