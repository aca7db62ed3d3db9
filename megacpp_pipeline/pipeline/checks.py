"""The checks the registry gives every stage (its version verifies from disk; a per-file
stage accounts for every input file) and the corpus-wide one that stops a run with nothing
left, with the one line that says where every file went."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.registry import Check, CheckOutcome, Markdown, Stage
from megacpp_pipeline.storage import slices
from megacpp_pipeline.storage.store import Manifest, ShardStore


class CheckFailed(Exception):
    """A blocking check failed; the message names the stage, the check and the problem."""


# at most this many problems travel back from one slice, and are kept for a check
MAX_PROBLEMS = 50


@dataclass(frozen=True)
class RowCheck:
    """A check whose verdict is made row by row: each slice of the version is inspected in a
    task of its own (the run's executor), so rescanning a corpus costs the driver nothing.
    `state` is what every slice needs (a config, an index, a tokenizer): built once by the
    driver, inherited by forked workers or shipped once to Ray; `inspect(state, rows)` gives
    the slice's problems, each naming its file."""

    columns: tuple[str, ...] | None
    inspect: Callable[[Any, pa.Table], list[str]]


@dataclass(frozen=True)
class _RowJob:
    store: ShardStore
    check: RowCheck
    state: Any


def _inspect_task(job: _RowJob, pieces: tuple[slices.Piece, ...]) -> tuple[int, list[str]]:
    columns = list(job.check.columns) if job.check.columns else None
    rows = slices.read(job.store, pieces, columns)
    return rows.num_rows, job.check.inspect(job.state, rows)[:MAX_PROBLEMS]


def inspect_rows(
    ctx: StageContext,
    manifest: Manifest,
    check: RowCheck,
    state: Any,
    tables: Sequence[str] | None = None,
) -> tuple[int, list[str]]:
    """(rows inspected, the first problems) of `check` over the version's data tables (or
    `tables`), one task per slice on the run's executor."""
    executor = ctx.executor()
    names = list(tables) if tables is not None else manifest.data_tables()
    inputs = [(manifest, n) for n in names]
    task_bytes = slices.task_bytes_for(
        slices.total_bytes(inputs), executor.workers, ctx.engine.task_bytes
    )
    plan = [s.pieces for s in slices.plan(ctx.store, inputs, task_bytes, cut=False)]
    rows, problems = 0, list[str]()
    for n, found in executor.map_light(_inspect_task, _RowJob(ctx.store, check, state), plan):
        rows += n
        problems += found[: MAX_PROBLEMS - len(problems)]
    return rows, problems


def standard_checks(stage: Stage) -> tuple[Check, ...]:
    """What the registry gives every stage: its version verifies from disk (when it writes
    one), and for a per-file stage, every input file is kept or in its ledger."""
    checks: list[Check] = []
    if stage.manifest_check:
        checks.append(MANIFEST_VERIFIES)
    if stage.gate is not None:
        checks.append(EVERY_INPUT_ACCOUNTED)
    return tuple(checks)


def _manifest_verifies(ctx: StageContext, stage: Stage, partition: str | None) -> CheckOutcome:
    manifest = ctx.store.latest(stage.name, partition)
    executor = ctx.executor()
    problems = ctx.store.verify(manifest, check_sha256=True, mapper=executor.map_light)
    return CheckOutcome(
        passed=not problems,
        metadata={
            "shards_verified": len(manifest.all_shards()),
            "rows": manifest.rows,
            "problems": Markdown("\n".join(f"- {p}" for p in problems[:50]) or "none"),
        },
        description=problems[0] if problems else None,
    )


MANIFEST_VERIFIES = Check(
    "manifest_verifies_from_disk",
    "Every shard listed in the manifest exists on disk with its sha256, row count and schema.",
    _manifest_verifies,
)


def _every_input_accounted(ctx: StageContext, stage: Stage, source: str | None) -> CheckOutcome:
    """The version's own counts add up (in == kept + ledger), and when it consumed the
    latest upstream version, `in` is that version's row count for this source (for a
    corpus-wide gate: for every source)."""
    assert stage.input is not None
    manifest = ctx.store.latest(stage.name, source)
    sources = [source] if source is not None else ctx.sources()
    up_rows = 0
    consumed = True
    for s in sources:
        up = ctx.latest(stage.input, s)
        table = up.tables.get(ctx.input_table(stage, s))
        up_rows += table.rows if table is not None else 0
        key = f"{up.asset}/{up.partition}"
        consumed = consumed and manifest.upstream.get(key) == ctx.store.manifest_sha256(up)
    files_in = int(manifest.stats["input_files"])
    dropped = manifest.tables["ledger"].rows if "ledger" in manifest.tables else 0
    passed = files_in == manifest.rows + dropped and (not consumed or files_in == up_rows)
    where = source or "every source"
    return CheckOutcome(
        passed=passed,
        metadata={"input_files": files_in, "kept": manifest.rows, "dropped": dropped},
        description=None
        if passed
        else f"{where}: {files_in} files in, {manifest.rows} kept + {dropped} in the ledger"
        + ("" if files_in == up_rows or not consumed else f"; {stage.input} holds {up_rows}"),
    )


EVERY_INPUT_ACCOUNTED = Check(
    "every_input_file_kept_or_in_ledger",
    "Every file the input version holds for this source is kept here or in this version's "
    "ledger with a reason (nothing disappears silently).",
    _every_input_accounted,
)


def checks_of(stage: Stage) -> tuple[Check, ...]:
    return standard_checks(stage) + stage.checks


def corpus_funnel(
    ctx: StageContext, upto: str | None = None
) -> tuple[int, list[tuple[str, str, int]]]:
    """Files collected over every source, and the drops of every ledger stage (up to and
    including `upto`) by reason, from the versions' stats alone (no ledger is read)."""
    collected = 0
    drops: list[tuple[str, str, int]] = []
    for name in ctx.registry.ledger_stages():
        stage = ctx.registry.get(name)
        partitions = ctx.partitions(stage)
        counts: Counter[str] = Counter()
        for partition in partitions:
            if not ctx.store.has_version(name, partition):
                continue
            stats = ctx.store.latest(name, partition).stats
            if name == ctx.registry.collection():
                collected += int(stats.get("files_seen", 0))
            counts.update({k: int(v) for k, v in stats.items() if k.startswith("ledger:")})
        drops += [(name, k.removeprefix("ledger:"), n) for k, n in sorted(counts.items()) if n]
        if name == upto:
            break
    return collected, drops


def nothing_left(ctx: StageContext, upto: str) -> str:
    """The one line that says a corpus has nothing left, where it went, and where to read
    the ledgers."""
    collected, drops = corpus_funnel(ctx, upto)
    where = "; ".join(f"{stage}: {n} {reason}" for stage, reason, n in drops) or "none dropped"
    return (
        f"nothing left to promote: none of the {collected} collected files is left after "
        f"{upto} ({where}); every file's reason is in the ledgers under "
        f"{ctx.store.join('assets')}/<stage>/<source>/"
    )


def _some_file_is_left(ctx: StageContext, stage: Stage, partition: str | None) -> CheckOutcome:
    manifest = ctx.store.latest(stage.name, None)
    return CheckOutcome(
        passed=manifest.rows > 0,
        metadata={"files_left": manifest.rows},
        description=None if manifest.rows else nothing_left(ctx, stage.name),
    )


SOME_FILE_IS_LEFT = Check(
    "some_file_is_left",
    "The corpus still holds at least one file; with none, the run stops here with the reason "
    "of every drop instead of training a tokenizer or packing rows on nothing.",
    _some_file_is_left,
)
