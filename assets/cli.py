"""The installed `megacpp` command: the library's commands plus `run`, which materializes
the whole DAG through Dagster (this shell), and `cache verify|prune` over the result cache
where `run` keeps it. `python -m assets.cli` is the same."""

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import pyarrow.fs as pafs

from assets.defs import DEFAULT_CACHE_DIR
from megacpp_pipeline import cli
from megacpp_pipeline.collect.source import CollectError
from megacpp_pipeline.plan import command as plan_command
from megacpp_pipeline.plan.rates import RatesError
from megacpp_pipeline.plan.table import render
from megacpp_pipeline.storage import file_cache_audit
from megacpp_pipeline.storage.store import ShardStore


def _cmd_run(args: argparse.Namespace) -> int:
    if not args.no_plan:  # the same check as `megacpp plan`, before any work
        try:
            plan = plan_command.plan_from_args(args, run_here=True)
        except (RatesError, CollectError) as e:  # no rates, or a source it cannot list: say
            # so and run unchecked; the run's own source checks then name what is wrong (a
            # pinned revision that does not exist fails the source catalog's check)
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
            workers=args.workers,
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


def _stage_name(text: str) -> str:
    """A stage of the registry, refused at parse time (before the plan sizes any source)."""
    from megacpp_pipeline.stages import default_registry

    stages = default_registry().names()
    if text not in stages:
        raise argparse.ArgumentTypeError(f"{text!r} is no stage; the stages: {', '.join(stages)}")
    return text


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
    p.add_argument(
        "--workers",
        type=plan_command.worker_count,
        default=None,
        help="forked workers and concurrent steps on this host (default: MEGACPP_WORKERS, "
        "else every CPU this process may use; 1 runs everything in the step's process)",
    )
    plan_command.add_arguments(p, workers=False)  # the run's --workers is the plan's
    p.add_argument(
        "--no-plan",
        action="store_true",
        help="start without the pre-flight check (megacpp plan) that refuses a run which "
        "would not fit the memory or disk it has",
    )
    p.add_argument(
        "--stop-after",
        type=_stage_name,
        default=None,
        help="stop after this stage (debugging); a name that is no stage is refused",
    )
    p.add_argument("--verbose", action="store_true", help="Dagster's event log on the console too")
    p.set_defaults(func=_cmd_run)


def _cache_location(args: argparse.Namespace) -> tuple[pafs.FileSystem, str]:
    """Where `megacpp run` keeps the per-file result cache for these dirs: in the store's
    `file-results/` when the data dir is an object store, else under the cache dir. The
    store's own answer decides, as the run's (StageContext.file_cache): a `file://` data
    dir is local disk, its cache under the cache dir."""
    store = ShardStore(str(args.data_dir))
    if not store.is_local:
        return store.fs, store.join("file-results")
    return pafs.LocalFileSystem(), str((Path(args.cache_dir) / "file-results").resolve())


def _current_code_versions(config: str) -> dict[str, set[str]]:
    """Per-file stage -> the code version the catalog's sources run it at now."""
    from megacpp_pipeline.pipeline.catalog import load_catalog
    from megacpp_pipeline.stages import default_registry

    registry = default_registry()
    catalog = load_catalog(config, registry)
    return {s.name: {registry.code_version(s, catalog)} for s in registry if s.gate is not None}


def _cmd_cache(args: argparse.Namespace) -> int:
    fs, root = _cache_location(args)
    current = _current_code_versions(args.config) if getattr(args, "config", None) else None
    found = file_cache_audit.audit(fs, root, current=current)
    summary = f"result cache {root}: {found.entries} entries for {found.files} files proved"
    if args.action == "verify":
        for path, why in found.broken:
            print(f"{path}: {why}")
        debris = f"; {len(found.debris)} objects a writer left" if found.debris else ""
        stale = f"; {len(found.stale)} folders no run reads" if found.stale else ""
        print(f"{summary}, {len(found.broken)} broken{debris}{stale}", file=sys.stderr)
        if found.broken or found.debris or found.stale:
            print("megacpp cache prune removes what is broken or left over", file=sys.stderr)
        return 1 if found.broken else 0
    removed = file_cache_audit.prune(fs, found, dry_run=args.dry_run)
    for line in removed:
        print(line)
    verb = "would remove" if args.dry_run else "removed"
    print(f"{summary}; {verb} {len(removed)}", file=sys.stderr)
    return 0


def _register_cache(p: argparse.ArgumentParser) -> None:
    p.description = (
        "check (verify) or trim (prune) the per-file result cache: every entry proven as a "
        "run proves it; prune removes broken entries, what a crashed writer left, and (with "
        "--config) the code versions no stage runs any more"
    )
    actions = p.add_subparsers(dest="action", required=True)
    for action in ("verify", "prune"):
        sub = actions.add_parser(action)
        sub.add_argument("--data-dir", default="data", help="as given to megacpp run")
        sub.add_argument(
            "--cache-dir",
            default=os.environ.get("MEGACPP_CACHE_DIR", str(DEFAULT_CACHE_DIR)),
            help="as megacpp run uses it (default: MEGACPP_CACHE_DIR or .cache/)",
        )
        if action == "prune":
            sub.add_argument(
                "--config", help="sources.yaml: also remove code versions no stage runs now"
            )
            sub.add_argument("--dry-run", action="store_true", help="only list what would go")
    p.set_defaults(func=_cmd_cache)


def main(argv: Sequence[str] | None = None) -> int:
    return cli.main(argv, extra={"run": _register_run, "cache": _register_cache})


if __name__ == "__main__":
    sys.exit(main())
