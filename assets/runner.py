"""`megacpp run`: materialize the whole DAG through Dagster, one run per stage group (and
source), each in a forked process, recording every run in the instance under DAGSTER_HOME
and stopping at the first failed step or blocking check."""

import gc
import multiprocessing
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TextIO

REPO = Path(__file__).resolve().parent.parent


class PipelineFailed(Exception):
    """A step or blocking check failed; the message names the asset, the check and why."""


@dataclass
class RunOutcome:
    runs: list[str] = field(default_factory=list)
    output: str | None = None


def prepare_instance_home(home: Path | None = None) -> Path:
    """DAGSTER_HOME (default .dagster_home/ in the repo) with the repo's dagster.yaml in it."""
    home = Path(os.environ.get("DAGSTER_HOME") or home or REPO / ".dagster_home").resolve()
    home.mkdir(parents=True, exist_ok=True)
    src = REPO / "dagster.yaml"
    dst = home / "dagster.yaml"
    if src.exists() and (not dst.exists() or dst.read_bytes() != src.read_bytes()):
        shutil.copyfile(src, dst)
    os.environ["DAGSTER_HOME"] = str(home)
    return home


def run_pipeline(
    config: Path,
    data_dir: Path,
    *,
    log: TextIO = sys.stderr,
    stop_after: str | None = None,
) -> RunOutcome:
    from megacpp_pipeline.core.catalog import load_catalog

    catalog = load_catalog(config)  # a bad config fails here, before any work
    try:  # and so does a data dir that cannot be one (e.g. a file stands in its place)
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PipelineFailed(f"{data_dir}: cannot be the data dir ({e.strerror or e})") from e
    os.environ["MEGACPP_CONFIG"] = str(config.resolve())
    os.environ["MEGACPP_DATA_DIR"] = str(data_dir.resolve())
    prepare_instance_home()

    import definitions

    outcome = RunOutcome()
    sources = [s.id for s in catalog.operational]
    for grain, keys in definitions.STAGE_PLAN:
        partitions: list[str | None] = list(sources) if grain == "per_source" else [None]
        for partition in partitions:
            label = f"{', '.join(keys)}" + (f" [{partition}]" if partition else "")
            started = time.monotonic()
            print(f"-> {label}", file=log, flush=True)
            # The first run (the small source_catalog) runs here: it pays Dagster's lazy
            # imports and instance set-up once, and every forked run after inherits them.
            if outcome.runs:
                step = _materialize_in_child(keys, partition)
            else:
                step = _materialize(keys, partition)
            if step.run_id:
                outcome.runs.append(step.run_id)
            if step.failures:
                raise PipelineFailed(f"{label}: " + "; ".join(step.failures))
            print(
                f"   ok in {time.monotonic() - started:.1f}s, peak RSS {step.peak_rss_mb:.0f} MB",
                file=log,
                flush=True,
            )
            if stop_after and stop_after in keys:
                break
        if stop_after and stop_after in keys:
            break
    outcome.output = _final_output(data_dir)
    return outcome


@dataclass
class StepOutcome:
    run_id: str | None
    failures: list[str]
    peak_rss_mb: float  # the child's own high-water mark: this stage group's peak


def _materialize_in_child(keys: list[str], partition: str | None) -> StepOutcome:
    """One Dagster run for `keys` in a forked child, as Dagster's multiprocess executor runs
    a step in its own process: what a stage group allocates is returned to the system when
    it ends, so memory stays bounded by the largest group, and the child's high-water mark
    is that group's peak. Forking after the imports keeps the per-run cost at milliseconds.
    """
    ctx = multiprocessing.get_context("fork")
    gc.collect()
    gc.freeze()  # the child's collector then never writes to (and so copies) inherited pages
    receive, send = ctx.Pipe(duplex=False)
    sys.stdout.flush()
    sys.stderr.flush()
    child = ctx.Process(target=_child_main, args=(keys, partition, send), daemon=False)
    child.start()
    send.close()
    try:
        outcome: StepOutcome = receive.recv()
    except EOFError:  # the child died before reporting (killed, out of memory, ...)
        child.join()
        code = child.exitcode or 0
        why = f"signal {-code}" if code < 0 else f"exit {code}"
        return StepOutcome(None, [f"the run's process ended without a result ({why})"], 0.0)
    finally:
        receive.close()
    child.join()
    return outcome


def _child_main(keys: list[str], partition: str | None, send: Connection) -> None:
    try:
        outcome = _materialize(keys, partition)
    except BaseException as e:  # reported, never swallowed: the parent fails the pipeline
        outcome = StepOutcome(None, [f"{type(e).__name__}: {e}"], _peak_rss_mb())
    send.send(outcome)
    send.close()


def _materialize(keys: list[str], partition: str | None) -> StepOutcome:
    import dagster as dg

    import definitions

    result = dg.materialize(
        [*definitions.all_assets, *definitions.all_checks],  # type: ignore[list-item]
        selection=dg.AssetSelection.assets(*keys) | dg.AssetSelection.checks_for_assets(*keys),
        partition_key=partition,
        instance=dg.DagsterInstance.get(),
        resources=definitions.default_resources(),
        raise_on_error=False,
        tags={"megacpp/cli": "run"},
    )
    return StepOutcome(result.run_id, _failures(result), _peak_rss_mb())


def _peak_rss_mb() -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _failures(result: object) -> list[str]:
    import dagster as dg

    assert isinstance(result, dg.ExecuteInProcessResult)
    out: list[str] = []
    for check in result.get_asset_check_evaluations():
        if not check.passed:
            why = check.description or ", ".join(
                f"{k}={getattr(v, 'value', v)}" for k, v in (check.metadata or {}).items()
            )
            out.append(
                f"asset {check.asset_key.to_user_string()} check {check.check_name} failed: {why}"
            )
    for ev in result.all_events:
        if ev.event_type_value == "STEP_FAILURE":
            err = ev.step_failure_data.error if ev.step_failure_data else None
            msg = err.message.strip().splitlines()[-1] if err and err.message else "failed"
            if err and err.cause and err.cause.message:
                msg = err.cause.message.strip().splitlines()[-1]
            out.append(f"step {ev.step_key} failed: {msg}")
    if not result.success and not out:
        out.append("run failed (see the Dagster UI for the run's logs)")
    return out


def _final_output(data_dir: Path) -> str:
    """The promoted snapshot when there is one, else the newest asset output."""
    snapshots = data_dir / "snapshots"
    if snapshots.is_dir():
        done = sorted(
            (p for p in snapshots.iterdir() if (p / "_COMPLETE").exists()),
            key=lambda p: (p / "_COMPLETE").stat().st_mtime,
        )
        if done:
            return str(done[-1].resolve())
    return str((data_dir / "assets").resolve())
