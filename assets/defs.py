"""`build_defs`: the whole Definitions object from a catalog path and a data dir, built from
the stage registry. Nothing is read at import: the CLI and the tests call this in-process,
and definitions.py hands it to `dagster dev` lazily."""

import os
from collections.abc import Mapping
from pathlib import Path

import dagster as dg

from assets.factory import build_assets
from assets.schedules import build_refresh
from megacpp_pipeline.pipeline.catalog import load_catalog
from megacpp_pipeline.pipeline.context import DEFAULT_CACHE_DIR
from megacpp_pipeline.pipeline.engine import Engine
from megacpp_pipeline.pipeline.no_pandas import skip_pandas_probe
from megacpp_pipeline.pipeline.parallel import cpu_count, workers_from
from megacpp_pipeline.pipeline.registry import Registry
from megacpp_pipeline.stages import default_registry
from resources.pipeline import PipelineResource

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO / "examples" / "demo" / "sources.yaml"
DEFAULT_DATA_DIR = REPO / "data"
# what the step processes of a UI or scheduled run fork from already has imported: this module
# imports dagster and, through the stage registry, every library a stage uses
PRELOADED = __name__
# and no process of the pipeline imports pandas for pyarrow (pipeline/no_pandas.py): neither
# the step processes forked from here nor `megacpp run` and the runs it forks
skip_pandas_probe()


def concurrent_steps(
    workers: int | None, engine: str | None, ray_address: str | None, environ: Mapping[str, str]
) -> int:
    """How many steps a run launched from the UI or the schedule runs at once: its workers
    (`workers`, else MEGACPP_WORKERS, else the CPUs), but on the local engine never more than
    the CPUs this process may use, as its forked pools are capped (16 asked on 2 CPUs would
    run 16 steps, each forking its own pool). On Ray a step's work runs on the cluster."""
    asked = workers if workers is not None else workers_from(environ)
    try:
        distributed = Engine.choose(engine, ray_address, environ).distributed
    except ValueError:  # the pipeline resource names a bad engine when a step starts
        distributed = False
    return asked if distributed else min(asked, cpu_count())


def build_defs(
    config_path: str | Path = DEFAULT_CONFIG,
    data_dir: str | Path = DEFAULT_DATA_DIR,
    *,
    cache_dir: str | Path = DEFAULT_CACHE_DIR,
    registry: Registry | None = None,
    workers: int | None = None,
    engine: str | None = None,
    ray_address: str | None = None,
) -> dg.Definitions:
    """Every stage's asset and checks, the pipeline resource, the nightly refresh, and an
    executor sized to this machine (or to `workers`). A bad sources.yaml fails here, naming
    the field."""
    registry = registry or default_registry()
    catalog = load_catalog(config_path, registry)
    assets, checks, sources = build_assets(registry, catalog)
    job, schedule, cascade = build_refresh(
        registry, catalog, sources, Path(cache_dir), origin=str(config_path)
    )
    return dg.Definitions(
        assets=assets,
        asset_checks=checks,
        resources={
            "pipeline": PipelineResource(
                config_path=str(Path(config_path).resolve()),
                data_dir=str(data_dir) if "://" in str(data_dir) else str(Path(data_dir).resolve()),
                cache_dir=str(Path(cache_dir).resolve()),
                workers=workers,
                engine=engine,
                ray_address=ray_address,
            )
        },
        jobs=[job],
        schedules=[schedule],
        sensors=[cascade],
        # as many concurrent steps as the run has workers (concurrent_steps): most steps fan
        # their work out over the workers themselves, and the rest (checks, small global
        # stages) are light. Each
        # step of a run launched from the UI or the schedule forks from a server that has
        # imported dagster and this library once: spawned, every step paid ~2.2 CPU seconds
        # of imports (a whole run has ~70 steps); `megacpp run` forks its runs itself.
        executor=dg.multiprocess_executor.configured(
            {
                "max_concurrent": concurrent_steps(workers, engine, ray_address, os.environ),
                "start_method": {"forkserver": {"preload_modules": [PRELOADED]}},
            }
        ),
    )
