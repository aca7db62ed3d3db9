"""`megacpp run`: materialize the whole DAG through Dagster, in process, recording every run
in the instance under DAGSTER_HOME, stopping at the first failed step or blocking check."""

import os
import shutil
import sys
import time
from dataclasses import dataclass, field
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
    from megacpp_pipeline.catalog import load_catalog

    catalog = load_catalog(config)  # a bad config fails here, before any work
    try:  # and so does a data dir that cannot be one (e.g. a file stands in its place)
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PipelineFailed(f"{data_dir}: cannot be the data dir ({e.strerror or e})") from e
    os.environ["MEGACPP_CONFIG"] = str(config.resolve())
    os.environ["MEGACPP_DATA_DIR"] = str(data_dir.resolve())
    prepare_instance_home()

    import dagster as dg

    import definitions

    instance = dg.DagsterInstance.get()
    outcome = RunOutcome()
    sources = [s.id for s in catalog.operational]
    for grain, keys in definitions.STAGE_PLAN:
        partitions: list[str | None] = list(sources) if grain == "per_source" else [None]
        for partition in partitions:
            label = f"{', '.join(keys)}" + (f" [{partition}]" if partition else "")
            started = time.monotonic()
            print(f"-> {label}", file=log, flush=True)
            result = dg.materialize(
                [*definitions.all_assets, *definitions.all_checks],  # type: ignore[list-item]
                selection=dg.AssetSelection.assets(*keys)
                | dg.AssetSelection.checks_for_assets(*keys),
                partition_key=partition,
                instance=instance,
                resources=definitions.default_resources(),
                raise_on_error=False,
                tags={"megacpp/cli": "run"},
            )
            outcome.runs.append(result.run_id)
            failures = _failures(result)
            if failures:
                raise PipelineFailed(f"{label}: " + "; ".join(failures))
            print(f"   ok in {time.monotonic() - started:.1f}s", file=log, flush=True)
            if stop_after and stop_after in keys:
                break
        if stop_after and stop_after in keys:
            break
    outcome.output = _final_output(data_dir)
    return outcome


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
