"""ConfigurableResources around the library's store and catalog (no logic of their own)."""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg

from megacpp_pipeline.core.catalog import Catalog, load_catalog
from megacpp_pipeline.storage.store import ShardStore

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO / "examples" / "demo" / "sources.yaml"


def config_path() -> str:
    return os.environ.get("MEGACPP_CONFIG", str(DEFAULT_CONFIG))


def data_dir() -> str:
    return os.environ.get("MEGACPP_DATA_DIR", str(REPO / "data"))


def cache_dir() -> str:
    return os.environ.get("MEGACPP_CACHE_DIR", str(REPO / ".cache"))


class CatalogResource(dg.ConfigurableResource):
    """The validated `sources.yaml` (a bad file fails here, before any work)."""

    config_path: str

    def load(self) -> Catalog:
        return load_catalog(self.config_path)


class ShardStoreResource(dg.ConfigurableResource):
    """Where every asset writes its versions: a local path or a pyarrow filesystem URI."""

    data_dir: str
    cache_dir: str
    max_rows_per_shard: int = 20_000
    # A gate holds about three shards at once (input, pending output, the shard being
    # written), so this is what bounds a stage's memory; 16 MiB is ~2,500 C++ files.
    max_bytes_per_shard: int = 16 << 20

    def open(self) -> ShardStore:
        return ShardStore(
            self.data_dir,
            max_rows_per_shard=self.max_rows_per_shard,
            max_bytes_per_shard=self.max_bytes_per_shard,
        )

    def cache(self) -> Path:
        path = Path(self.cache_dir)
        path.mkdir(parents=True, exist_ok=True)
        return path


def default_resources() -> dict[str, dg.ConfigurableResource]:
    return {
        "catalog": CatalogResource(config_path=config_path()),
        "store": ShardStoreResource(data_dir=data_dir(), cache_dir=cache_dir()),
    }
