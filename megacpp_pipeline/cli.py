"""`megacpp`: the library's commands (plan, verify, inspect, explain, diff, export-megatron,
export-text, jsonl-to-parquet), which need no Dagster. Errors become one clear line naming
the file, field or check, never a traceback. The orchestrating `run` command belongs to the
Dagster shell (assets/cli.py), which adds it to this parser; the installed `megacpp` script
is that one."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence

from megacpp_pipeline.collect import CollectError, jsonl_stream
from megacpp_pipeline.core.catalog import CatalogError
from megacpp_pipeline.pipeline.parallel import WorkersError
from megacpp_pipeline.plan import command as plan_command
from megacpp_pipeline.plan.rates import RatesError
from megacpp_pipeline.snapshot import diff, explain, verify
from megacpp_pipeline.storage.store import StoreError

Register = Callable[[argparse.ArgumentParser], None]
KNOWN_ERRORS: tuple[type[BaseException], ...] = (
    CatalogError,
    CollectError,
    StoreError,
    RatesError,
    WorkersError,
    OSError,
)


def _cmd_jsonl(args: argparse.Namespace) -> int:
    return int(jsonl_stream.main_jsonl_to_parquet(args.rest))


def _register_jsonl(p: argparse.ArgumentParser) -> None:
    p.description = "stream a (growing) JSONL file into bounded parquet shards"
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=_cmd_jsonl)


COMMANDS: dict[str, Register] = {
    "plan": plan_command.register,
    **verify.COMMANDS,
    "explain": verify.with_one_line_errors(explain.register),
    "diff": verify.with_one_line_errors(diff.register),
    "jsonl-to-parquet": _register_jsonl,
}


def build_parser(extra: Mapping[str, Register] | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="megacpp", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    for name, register in {**(extra or {}), **COMMANDS}.items():
        register(sub.add_parser(name, help=None))
    return p


def main(
    argv: Sequence[str] | None = None,
    *,
    extra: Mapping[str, Register] | None = None,
    known_errors: tuple[type[BaseException], ...] = (),
) -> int:
    args = build_parser(extra).parse_args(argv)
    try:
        return int(args.func(args))
    except (*KNOWN_ERRORS, *known_errors) as e:
        print(f"megacpp {args.command}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
