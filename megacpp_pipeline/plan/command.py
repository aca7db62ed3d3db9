"""`megacpp plan` and the plan options `megacpp run` shares: where the run would write, on
how many workers, with how much memory and disk; exit 3 when it does not fit. The edge of
the library: it reads MEGACPP_WORKERS, MEGACPP_ENGINE and MEGACPP_CACHE_DIR once."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from megacpp_pipeline.pipeline.catalog import load_catalog
from megacpp_pipeline.pipeline.context import DEFAULT_CACHE_DIR
from megacpp_pipeline.pipeline.parallel import (
    WorkersError,
    cpu_count,
    parse_workers,
    workers_from,
)
from megacpp_pipeline.pipeline.registry import Registry
from megacpp_pipeline.plan.forecast import Forecast, plan_run
from megacpp_pipeline.plan.rates import load_rates
from megacpp_pipeline.plan.table import render

EXIT_DOES_NOT_FIT = 3


def _workers(raw: int | None, run_here: bool) -> int:
    """The workers to plan for: as given (a plan may be for another host), and for a run on
    this host no more than its CPUs, as `megacpp run` caps them."""
    asked = raw if raw is not None else workers_from(os.environ)
    return min(asked, cpu_count()) if run_here else asked


def worker_count(text: str) -> int:
    """`--workers` of plan and run, refused as MEGACPP_WORKERS is (parse_workers)."""
    try:
        return parse_workers(text)
    except WorkersError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_arguments(p: argparse.ArgumentParser, workers: bool = True) -> None:
    """The options `megacpp plan` and `megacpp run` share for a plan (`megacpp run` has its
    own --workers, which its plan reads)."""
    if workers:
        p.add_argument(
            "--workers",
            type=worker_count,
            default=None,
            help="workers (cores) to plan for (default: MEGACPP_WORKERS, else every CPU)",
        )
    p.add_argument(
        "--memory-mb",
        type=float,
        default=None,
        help="memory a stage group may use (default: this host's)",
    )
    p.add_argument(
        "--disk-mb",
        type=float,
        default=None,
        help="local disk the run may write (default: what is free where it writes)",
    )
    p.add_argument("--rates", default=None, help="a rates.json of your own (bench_plan writes one)")


def plan_from_args(
    args: argparse.Namespace, registry: Registry | None = None, run_here: bool = False
) -> Forecast:
    """The forecast for the parsed options; `run_here`: for `megacpp run` on this host."""
    from megacpp_pipeline.stages import default_registry

    registry = registry or default_registry()
    catalog = load_catalog(args.config, registry)
    return plan_run(
        catalog,
        registry,
        data_dir=str(args.data_dir),
        cache_dir=Path(args.cache_dir),
        workers=_workers(args.workers, run_here),
        engine=args.engine or os.environ.get("MEGACPP_ENGINE") or "local",
        rates=load_rates(args.rates) if args.rates else None,
        memory_mb=args.memory_mb,
        disk_mb=args.disk_mb,
    )


def _cmd(args: argparse.Namespace) -> int:
    f = plan_from_args(args)
    print(json.dumps(f.as_dict(), indent=2) if args.json else render(f))
    problems = f.problems()
    if problems:
        print(f"megacpp plan: does not fit: {problems[0]}", file=sys.stderr)
        return EXIT_DOES_NOT_FIT
    return 0


def register(p: argparse.ArgumentParser) -> None:
    p.description = (
        "size every source without collecting it and forecast each stage group's CPU, wall, "
        "memory and disk from the bench's measured rates; exit 3 when the run does not fit"
    )
    p.add_argument("--config", required=True, help="sources.yaml")
    p.add_argument("--data-dir", default="data", help="where the run writes (a path or s3://)")
    p.add_argument(
        "--cache-dir",
        default=os.environ.get("MEGACPP_CACHE_DIR", str(DEFAULT_CACHE_DIR)),
        help="per-file results, fetched archives and git mirrors (default: MEGACPP_CACHE_DIR "
        "or .cache/ in the repository, as megacpp run)",
    )
    p.add_argument("--engine", choices=["local", "ray"], default=None)
    add_arguments(p)
    p.add_argument("--json", action="store_true", help="the forecast as JSON")
    p.set_defaults(func=_cmd)
