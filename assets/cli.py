"""The installed `megacpp` command: the library's commands plus `run`, which materializes
the whole DAG through Dagster (this shell). `python -m assets.cli` is the same."""

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from assets.defs import DEFAULT_CACHE_DIR
from megacpp_pipeline import cli


def _cmd_run(args: argparse.Namespace) -> int:
    try:
        from assets.runner import PipelineFailed, PipelineInterrupted, run_pipeline

        outcome = run_pipeline(
            Path(args.config),
            args.data_dir,
            cache_dir=args.cache_dir,
            stop_after=args.stop_after,
            verbose=args.verbose,
            engine=args.engine,
            ray_address=args.ray_address,
        )
    except KeyboardInterrupt:  # before the run's own handlers were installed
        print("megacpp run: interrupted before any stage started", file=sys.stderr)
        return 128 + signal.SIGINT
    except PipelineInterrupted as e:
        print(f"megacpp run: {e}", file=sys.stderr)
        return 128 + (e.signal or signal.SIGINT)
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
    p.add_argument("--stop-after", default=None, help="stop after this asset (debugging)")
    p.add_argument("--verbose", action="store_true", help="Dagster's event log on the console too")
    p.set_defaults(func=_cmd_run)


def main(argv: Sequence[str] | None = None) -> int:
    return cli.main(argv, extra={"run": _register_run})


if __name__ == "__main__":
    sys.exit(main())
