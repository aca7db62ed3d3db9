"""The one resource every generated asset and check uses: where the catalog, the store and
the cache are, turned into the library's StageContext (no logic of its own)."""

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import dagster as dg

from megacpp_pipeline.pipeline.catalog import load_catalog
from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.engine import Engine
from megacpp_pipeline.pipeline.parallel import workers_from
from megacpp_pipeline.pipeline.registry import Registry
from megacpp_pipeline.storage.store import ShardStore


class PipelineResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    """sources.yaml, the data dir (a local path or a pyarrow filesystem URI) and the cache."""

    config_path: str
    data_dir: str
    cache_dir: str
    max_rows_per_shard: int = 20_000
    # A gate holds about three shards at once (input, pending output, the shard being
    # written), so this is what bounds a stage's memory; 16 MiB is ~2,500 C++ files.
    max_bytes_per_shard: int = 16 << 20
    workers: int | None = None  # forked workers of this host (None: MEGACPP_WORKERS or every CPU)
    # where per-file stages run: "local" or "ray" (None: MEGACPP_ENGINE, else local), and the
    # Ray cluster (None: RAY_ADDRESS, else a local Ray instance)
    engine: str | None = None
    ray_address: str | None = None

    def store(self) -> ShardStore:
        return ShardStore(
            self.data_dir,
            max_rows_per_shard=self.max_rows_per_shard,
            max_bytes_per_shard=self.max_bytes_per_shard,
        )

    def stage_context(
        self,
        registry: Registry,
        *,
        run_id: str | None = None,
        pins: Mapping[str, str] | None = None,
        log: Callable[[str], None] | None = None,
        ahead: Iterable[str] = (),
    ) -> StageContext:
        return StageContext(
            catalog=load_catalog(self.config_path, registry),
            store=self.store(),
            registry=registry,
            cache_dir=Path(self.cache_dir),
            run_id=run_id,
            pins=dict(pins or {}),
            log=log or (lambda message: None),
            # the environment is read here, at the edge, once per context
            workers=self.workers if self.workers is not None else workers_from(os.environ),
            engine=Engine.choose(self.engine, self.ray_address, os.environ),
            ahead=frozenset(ahead),
        )
