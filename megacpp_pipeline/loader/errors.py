"""Every error the loader raises on purpose: each names the snapshot, shard, field or option
it is about, so a trainer's log says what to fix in one line."""

from __future__ import annotations

from pathlib import Path

from megacpp_pipeline.core.errors import FieldedError


class LoaderError(FieldedError):
    """Base of every error the loader raises on purpose."""


class SnapshotIncompleteError(LoaderError):
    def __init__(self, snapshot_dir: Path, missing: str) -> None:
        super().__init__(f"{snapshot_dir}: not a promoted snapshot ({missing} is missing)")
        self.snapshot_dir = snapshot_dir
        self.missing = missing


class SnapshotManifestError(LoaderError):
    def __init__(self, manifest: Path, field: str, rule: str) -> None:
        super().__init__(f"{manifest}: field {field!r}: {rule}")
        self.manifest = manifest
        self.field = field
        self.rule = rule


class ShardChecksumError(LoaderError):
    def __init__(self, shard: str, expected: str | None, actual: str) -> None:
        super().__init__(f"{shard}: sha256 {actual} does not match the manifest's {expected}")
        self.shard = shard
        self.expected = expected
        self.actual = actual


class ShardSchemaError(LoaderError):
    def __init__(self, shard: str, column: str, rule: str) -> None:
        super().__init__(f"{shard}: column {column!r}: {rule}")
        self.shard = shard
        self.column = column
        self.rule = rule


class LoaderConfigError(LoaderError):
    def __init__(self, field: str, rule: str) -> None:
        super().__init__(f"loader option {field!r}: {rule}")
        self.field = field
        self.rule = rule


class LoaderStateError(LoaderError):
    def __init__(self, field: str, expected: object, found: object) -> None:
        super().__init__(f"state_dict field {field!r} is {found!r}, this loader has {expected!r}")
        self.field = field
        self.expected = expected
        self.found = found
