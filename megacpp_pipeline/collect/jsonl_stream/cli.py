"""`megacpp jsonl-to-parquet` (and `python -m megacpp_pipeline.collect.jsonl_stream`): the
command line edge of the converter. It reads its options and the environment once, and turns
every conversion error into one line.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from pydantic import ValidationError

from megacpp_pipeline.collect.jsonl_stream.config import JsonlConverterConfig
from megacpp_pipeline.collect.jsonl_stream.convert import convert
from megacpp_pipeline.collect.jsonl_stream.crash import CrashPlan, CrashPlanError
from megacpp_pipeline.collect.jsonl_stream.errors import JsonlIngestError
from megacpp_pipeline.collect.jsonl_stream.output import COMPLETE_FILE, REJECTS_FILE


def _build_parser() -> argparse.ArgumentParser:
    defaults = JsonlConverterConfig()
    parser = argparse.ArgumentParser(
        prog="megacpp jsonl-to-parquet",
        description="Convert a (possibly still growing) JSONL file of {path, content[, license, "
        f"revision]}} records into validated parquet shards, a manifest and {COMPLETE_FILE}.",
    )
    parser.add_argument("input", type=Path, metavar="INPUT")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR")
    parser.add_argument("--rows-per-file", type=int, required=True, metavar="N")
    parser.add_argument(
        "--follow", action="store_true", help="keep tailing INPUT until it stops growing"
    )
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=defaults.idle_timeout_s,
        metavar="S",
        help="with --follow: seconds without growth that end the stream (default %(default)s)",
    )
    parser.add_argument("--poll-interval", type=float, default=None, metavar="S")
    parser.add_argument(
        "--validation-rows",
        type=int,
        default=0,
        metavar="N",
        help="hold the last N records out as the validation shard",
    )
    return parser


def main_jsonl_to_parquet(argv: list[str], environ: Mapping[str, str] | None = None) -> int:
    """Run the command; `environ` (os.environ when None) is read here and nowhere below."""
    try:
        args = _build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse already printed its one-line usage error
        return int(exc.code or 0)
    prog = "jsonl-to-parquet"
    try:
        poll = args.poll_interval
        if poll is None:
            poll = min(JsonlConverterConfig().poll_interval_s, args.idle_timeout / 4)
        config = JsonlConverterConfig(
            rows_per_file=args.rows_per_file,
            follow=args.follow,
            idle_timeout_s=args.idle_timeout,
            poll_interval_s=poll,
            validation_rows=args.validation_rows,
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "config"
        print(f"{prog}: error: invalid option {where}: {err['msg']}", file=sys.stderr)
        return 2
    try:
        crash = CrashPlan.from_environ(os.environ if environ is None else environ)
    except CrashPlanError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    try:
        report = convert(args.input, args.out, config, crash=crash)
    except JsonlIngestError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"{prog}: error: {exc.filename or args.input}: {exc.strerror}", file=sys.stderr)
        return 1
    for reject in report.first_rejects:
        print(f"{prog}: rejected {reject.describe(args.input)}", file=sys.stderr)
    if report.rejects > len(report.first_rejects):
        more = report.rejects - len(report.first_rejects)
        print(f"{prog}: ... {more} more in {args.out / REJECTS_FILE}", file=sys.stderr)
    status = "already complete" if report.already_complete else "complete"
    print(
        f"{prog}: {status}: {report.rows} rows ({report.train_shards} train shards, "
        f"{report.validation_rows} validation rows), {report.rejects} rejected lines, "
        f"{report.consumed_bytes} bytes consumed -> {args.out}"
    )
    return 0
