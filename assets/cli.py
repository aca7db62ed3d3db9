"""The installed `megacpp` command: the library's commands plus `run`, which materializes
the whole DAG through Dagster (this shell). `python -m assets.cli` is the same."""

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from assets.defs import DEFAULT_CACHE_DIR
from megacpp_pipeline import cli
from megacpp_pipeline.plan import command as plan_command
from megacpp_pipeline.plan.rates import RatesError
from megacpp_pipeline.plan.table import render


def _cmd_run(args: argparse.Namespace) -> int:
    if not args.no_plan:  # the same check as `megacpp plan`, before any work
        try:
            plan = plan_command.plan_from_args(args)
        except RatesError as e:  # no rates to plan with: say so, and run unchecked
            print(f"plan: not checked ({e})", file=sys.stderr)
            return _run(args)
        problems = plan.problems()
        if problems:
            print(render(plan), file=sys.stderr)
            print(f"megacpp run: does not fit, not started: {problems[0]}", file=sys.stderr)
            return plan_command.EXIT_DOES_NOT_FIT
        print(
            f"plan: {plan.files:,} files, {plan.mb_in:,.1f} MB; about {plan.wall_s:,.0f} s on "
            f"{plan.workers} workers, peak {plan.peak_mb:,.0f} of {plan.memory_mb:,.0f} MB, "
            f"{plan.local_mb:,.0f} MB of disk: fits (megacpp plan for the table)",
            file=sys.stderr,
        )
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    from assets.runner import PipelineFailed, run_pipeline

    try:
        outcome = run_pipeline(
            Path(args.config),
            args.data_dir,
            cache_dir=args.cache_dir,
            stop_after=args.stop_after,
            verbose=args.verbose,
            engine=args.engine,
            ray_address=args.ray_address,
            workers=args.workers,
        )
    except PipelineFailed as e:
        print(f"megacpp run: FAILED: {e}", file=sys.stderr)
        return 1
    print(f"{len(outcome.runs)} Dagster runs recorded; all blocking checks passed", file=sys.stderr)
    print(outcome.output)
    return 0


def _register_run(p: argparse.ArgumentParser) -> None:
    p.description = "materialize the whole DAG through Dagster"
    p.add_argument("--config", required=True, help="sources.yaml")
    p.add_argument("--data-dir", default="data", help="where asset versions and snapshots go")
    p.add_argument(
        "--cache-dir",
        default=os.environ.get("MEGACPP_CACHE_DIR", str(DEFAULT_CACHE_DIR)),
        help="per-file results, fetched archives and git mirrors (default: MEGACPP_CACHE_DIR "
        "or .cache/ in the repository)",
    )
    p.add_argument(
        "--engine",
        choices=["local", "ray"],
        default=None,
        help="where per-file stages run: local forked workers, or Ray tasks on a cluster "
        "(default: MEGACPP_ENGINE, else local; ray needs the `ray` extra)",
    )
    p.add_argument(
        "--ray-address",
        default=None,
        help="the Ray cluster for --engine ray (default: RAY_ADDRESS, else a local Ray "
        "instance sized to this machine)",
    )
    plan_command.add_arguments(p)
    p.add_argument(
        "--no-plan",
        action="store_true",
        help="start without the pre-flight check (megacpp plan) that refuses a run which "
        "would not fit the memory or disk it has",
    )
    p.add_argument("--stop-after", default=None, help="stop after this asset (debugging)")
    p.add_argument("--verbose", action="store_true", help="Dagster's event log on the console too")
    p.set_defaults(func=_cmd_run)


def main(argv: Sequence[str] | None = None) -> int:
    return cli.main(argv, extra={"run": _register_run})


if __name__ == "__main__":
    sys.exit(main())
