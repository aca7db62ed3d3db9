"""`megacpp`: the commands a person types. Errors become one clear line naming the file,
field or check, never a traceback. `run` hands over to the Dagster shell (imported only
then, so the library itself never imports dagster)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def _cmd_run(args: argparse.Namespace) -> int:
    from assets.runner import PipelineFailed, run_pipeline  # the Dagster shell

    try:
        outcome = run_pipeline(Path(args.config), Path(args.data_dir), stop_after=args.stop_after)
    except PipelineFailed as e:
        print(f"megacpp run: FAILED: {e}", file=sys.stderr)
        return 1
    print(f"{len(outcome.runs)} Dagster runs recorded; all blocking checks passed", file=sys.stderr)
    print(outcome.output)
    return 0


def _cmd_jsonl(args: argparse.Namespace) -> int:
    from megacpp_pipeline.collect import jsonl_stream

    return int(jsonl_stream.main_jsonl_to_parquet(args.rest))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="megacpp", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="materialize the whole DAG through Dagster")
    run.add_argument("--config", required=True, help="sources.yaml")
    run.add_argument("--data-dir", default="data", help="where asset versions and snapshots go")
    run.add_argument("--stop-after", default=None, help="stop after this asset (debugging)")
    run.set_defaults(func=_cmd_run)

    jsonl = sub.add_parser(
        "jsonl-to-parquet", help="stream a (growing) JSONL file into bounded parquet shards"
    )
    jsonl.add_argument("rest", nargs=argparse.REMAINDER)
    jsonl.set_defaults(func=_cmd_jsonl)

    for name, register in _EXTRA_COMMANDS.items():
        register(sub.add_parser(name))
    return p


# Commands contributed by library modules (verify, inspect, export-megatron): name -> setup.
_EXTRA_COMMANDS: dict[str, Callable[[argparse.ArgumentParser], None]] = {}


def main(argv: list[str] | None = None) -> int:
    _load_extra_commands()
    args = build_parser().parse_args(argv)
    known = _known_errors()
    try:
        return int(args.func(args))
    except known as e:  # type: ignore[misc]
        print(f"megacpp {args.command}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _known_errors() -> tuple[type[BaseException], ...]:
    from megacpp_pipeline.collect import CollectError
    from megacpp_pipeline.core.catalog import CatalogError
    from megacpp_pipeline.storage.store import StoreError

    errors: list[type[BaseException]] = [CatalogError, CollectError, StoreError, OSError]
    return tuple(errors)


def _load_extra_commands() -> None:
    try:
        from megacpp_pipeline.snapshot import verify
    except ImportError:
        return
    _EXTRA_COMMANDS.update(verify.COMMANDS)


if __name__ == "__main__":
    sys.exit(main())
