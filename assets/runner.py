"""`megacpp run`: materialize the whole DAG through Dagster in a handful of runs whatever the
number of sources. The plan comes from the asset graph: its assets in dependency order, cut
wherever the grain changes (per source / global), so each run takes every partition of its
per-source assets at once. Each run after the first is a forked process of its own, so what
a stage group allocates goes back to the system when it ends and its peak is its own; every
run is recorded in the instance under DAGSTER_HOME; the first failed step or blocking check
stops the pipeline with one line naming it, and so does SIGINT or SIGTERM (assets/interrupts.py:
the running group's processes are stopped before the command exits). The library's warnings
(a version replaced because it failed verification, a result-cache entry discarded) reach
the console as one line each."""

import contextlib
import fcntl
import gc
import importlib.util
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TextIO

import dagster as dg

from assets.console import RunConsole
from assets.defs import DEFAULT_CACHE_DIR, build_defs
from assets.factory import PARTITION_RANGE_END, PARTITION_RANGE_START
from assets.interrupts import Interrupts, become_group_leader
from megacpp_pipeline.pipeline import progress
from megacpp_pipeline.pipeline.engine import Engine
from megacpp_pipeline.pipeline.parallel import (
    cpu_count,
    end_with_parent,
    polars_threads_run,
    workers_from,
)
from megacpp_pipeline.pipeline.registry import Registry
from megacpp_pipeline.plan.sizing import MB
from megacpp_pipeline.stages import default_registry

REPO = Path(__file__).resolve().parent.parent


QUIET_CONSOLE: dict[str, Any] = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}


class PipelineFailed(Exception):
    """A step or blocking check failed; the message names the asset, the check and why."""


class PipelineInterrupted(PipelineFailed):
    """SIGINT or SIGTERM stopped the run; `signal` is the first one (None: Dagster caught
    it in this process and did not say which)."""

    def __init__(self, message: str, signum: int | None) -> None:
        super().__init__(message)
        self.signal = signum


# Dagster's error class when a signal interrupted a step it ran in this process.
_DAGSTER_INTERRUPTED = "DagsterExecutionInterruptedError"


@dataclass(frozen=True)
class RunGroup:
    """Assets materialized in one Dagster run: all per-source (over every source) or all
    global."""

    keys: tuple[str, ...]
    per_source: bool

    def label(self, sources: int) -> str:
        return ", ".join(self.keys) + (f" [{sources} sources]" if self.per_source else "")


@dataclass
class RunOutcome:
    runs: list[str] = field(default_factory=list)
    output: str | None = None


def run_plan(defs: dg.Definitions) -> list[RunGroup]:
    """The asset graph in dependency order, cut into as few runs as its grains allow: a group
    takes every asset of its grain whose parents are done or in the group."""
    graph = defs.resolve_asset_graph()
    order = [k.to_user_string() for k in graph.toposorted_asset_keys]
    parents = {
        k.to_user_string(): {p.to_user_string() for p in graph.get(k).parent_keys}
        for k in graph.toposorted_asset_keys
    }
    per_source = {
        k.to_user_string(): graph.get(k).partitions_def is not None
        for k in graph.toposorted_asset_keys
    }
    done: set[str] = set()
    groups: list[RunGroup] = []
    while len(done) < len(order):
        grain = next(per_source[k] for k in order if k not in done and parents[k] <= done)
        group: list[str] = []
        grew = True
        while grew:
            grew = False
            for k in order:
                if k in done or k in group or per_source[k] != grain:
                    continue
                if parents[k] <= done | set(group):
                    group.append(k)
                    grew = True
        groups.append(RunGroup(tuple(group), grain))
        done.update(group)
    return groups


def open_instance() -> dg.DagsterInstance:
    """The Dagster instance of DAGSTER_HOME (default .dagster_home/ in the repo), with the
    repo's dagster.yaml in it. Both under an exclusive lock on a file of that folder (which
    Dagster requires to be local): two runs starting at once on a fresh home would each copy
    the yaml and create the SQLite schema, and alembic then finds two heads."""
    chosen = os.environ.get("DAGSTER_HOME")
    home = Path(chosen or REPO / ".dagster_home").resolve()
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".megacpp-instance.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        src = REPO / "dagster.yaml"
        dst = home / "dagster.yaml"
        # A DAGSTER_HOME the user chose keeps its own dagster.yaml (e.g. a deployment's
        # Postgres storage, deploy/dagster.postgres.yaml); the repo's default home follows
        # the repo's.
        if src.exists() and (
            not dst.exists() or (not chosen and dst.read_bytes() != src.read_bytes())
        ):
            shutil.copyfile(src, dst)
        os.environ["DAGSTER_HOME"] = str(home)
        return dg.DagsterInstance.get()


def run_pipeline(
    config: Path,
    data_dir: Path | str,
    *,
    cache_dir: Path | str = DEFAULT_CACHE_DIR,
    registry: Registry | None = None,
    log: TextIO = sys.stderr,
    stop_after: str | None = None,
    workers: int | None = None,
    verbose: bool = False,
    live: bool | None = None,
    engine: str | None = None,
    ray_address: str | None = None,
) -> RunOutcome:
    """Materialize every stage; a bad config fails before any work, and so does a data dir
    that cannot be one. Progress goes to `log` (a live view on a terminal unless `live` says
    otherwise), the finished stages' table last. `engine`/`ray_address`: where per-file
    stages run (pipeline/engine.py; default MEGACPP_ENGINE / RAY_ADDRESS, else local).
    `stop_after`: the last stage to materialize; a name that is no stage fails before any
    work (it would otherwise run, and promote, the whole DAG)."""
    stages = (registry or default_registry()).names()
    if stop_after is not None and stop_after not in stages:
        raise PipelineFailed(
            f"--stop-after {stop_after!r} is no stage; the stages: {', '.join(stages)}"
        )
    try:
        chosen = Engine.choose(engine, ray_address, os.environ)
    except ValueError as e:
        raise PipelineFailed(str(e)) from e
    if chosen.distributed and importlib.util.find_spec("ray") is None:
        raise PipelineFailed("--engine ray needs Ray: pip install -e '.[ray]' (ray==2.60.0)")
    if chosen.distributed:
        # imported once here, never connected here: every run this process forks inherits
        # Ray's modules instead of importing them again (about 0.3 CPU s a run, counted in
        # the run's own process) and joins the cluster on its first map
        importlib.import_module("megacpp_pipeline.pipeline.ray_engine")
    defs = build_defs(
        config,
        data_dir,
        cache_dir=cache_dir,
        registry=registry,
        workers=workers,
        engine=chosen.kind.value,
        ray_address=chosen.address,
    )
    if "://" not in str(data_dir):
        try:  # e.g. a file stands where the data dir should be
            Path(data_dir).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise PipelineFailed(f"{data_dir}: cannot be the data dir ({e.strerror or e})") from e
    sources = _sources(defs)
    if not sources:
        raise PipelineFailed(f"{config}: no operational source to materialize")
    asked, cpus = workers or workers_from(os.environ), cpu_count()
    if not chosen.distributed and asked > cpus:
        print(f"megacpp run: {asked} workers asked, {cpus} CPUs here: {cpus} run", file=log)
    instance = open_instance()
    # Dagster's event log always goes to the instance (the UI shows it); to the console only
    # when asked: its DEBUG lines are hundreds per run, and formatting them costs per event
    run_config = {} if verbose else QUIET_CONSOLE
    outcome = RunOutcome()
    ray_instance = contextlib.ExitStack()
    if chosen.distributed and not chosen.address:  # no cluster given: one for every run
        ray_instance.enter_context(_local_ray(asked))
    console = RunConsole(log, live)
    # the library's warnings become console lines, in forked runs and workers too
    library_log = logging.getLogger("megacpp_pipeline")
    notices, propagate = progress.NoticeHandler(), library_log.propagate
    library_log.addHandler(notices)
    library_log.propagate = False
    try:
        tags = {"megacpp/cli": "run"} | {
            f"megacpp/{k}": str(v) for k, v in chosen.describe().items()
        }
        with Interrupts() as interrupts, progress.sending_to(console.event):
            _run_groups(
                defs, instance, sources, run_config, console, outcome, stop_after, tags, interrupts
            )
    finally:
        library_log.removeHandler(notices)
        library_log.propagate = propagate
        console.close()
        ray_instance.close()
    console.summary()
    outcome.output = final_output(defs, data_dir)
    return outcome


@contextlib.contextmanager
def _local_ray(cpus: int) -> Iterator[None]:
    """One local Ray instance of `cpus` CPUs that every run forked from here joins while the
    block runs (pipeline/ray_holder.py), instead of each run starting and ending its own."""
    from megacpp_pipeline.pipeline import ray_engine
    from megacpp_pipeline.pipeline.ray_holder import HolderError, LocalInstance

    try:
        held = LocalInstance(cpus)
    except HolderError as e:
        raise PipelineFailed(str(e)) from e
    ray_engine.hold_for_forked_runs(held.address)
    try:
        yield
    finally:
        ray_engine.hold_for_forked_runs(None)
        held.close()


def _run_groups(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    sources: list[str],
    run_config: dict[str, Any],
    console: RunConsole,
    outcome: RunOutcome,
    stop_after: str | None,
    run_tags: dict[str, str],
    interrupts: Interrupts | None = None,
) -> None:
    for group in run_plan(defs):
        if interrupts is not None and interrupts.signal is not None:
            raise _interrupted(interrupts.signal, console)
        keys = list(group.keys)
        if stop_after and stop_after in keys:
            keys = keys[: keys.index(stop_after) + 1]
        label = RunGroup(tuple(keys), group.per_source).label(len(sources))
        started = time.monotonic()
        console.group_started(keys, label)
        tags = dict(run_tags)
        if group.per_source:
            tags |= {PARTITION_RANGE_START: sources[0], PARTITION_RANGE_END: sources[-1]}
        # The first run (the small source_catalog) runs here: it pays Dagster's lazy imports
        # and the instance's set-up once, and every forked run after inherits them. Where
        # polars' threads already run in this process (a caller's own queries), a forked run
        # would hang at its first polars query, so the run stays in this process.
        if outcome.runs and not polars_threads_run():
            step = _materialize_in_child(
                defs, instance, keys, tags, run_config, console.event, interrupts
            )
        else:
            step = _materialize(defs, instance, keys, tags, run_config)
        if step.run_id:
            outcome.runs.append(step.run_id)
        if interrupts is not None and interrupts.signal is not None:
            raise _interrupted(interrupts.signal, console)
        if any(_DAGSTER_INTERRUPTED in f for f in step.failures):
            raise _interrupted(None, console)  # Dagster caught it in this process
        if step.failures:
            where = f"run {step.run_id}" if step.run_id else "no run recorded"
            url = ui_url()
            if url and step.run_id:
                where += f"; {url}/runs/{step.run_id}"
            raise PipelineFailed("; ".join(step.failures) + f" (the log: {where})")
        console.group_done(time.monotonic() - started, step.peak_rss_mb)
        if stop_after and stop_after in keys:
            break


def _interrupted(signum: int | None, console: RunConsole) -> PipelineInterrupted:
    """The one line an interrupted run ends with: what stopped and how to resume."""
    what = f" by {signal.Signals(signum).name}" if signum else ""
    stage = console.running_stage()
    if stage is None:
        where = "before any stage started"
    else:
        where = f"while {stage} was running; it and its processes are stopped and nothing more "
        where += "is written"
    return PipelineInterrupted(
        f"interrupted{what} {where}. Run the same command again to resume: the stages that "
        "finished are in the store, and the files already done come from the result cache",
        signum,
    )


def ui_url(host: str = "127.0.0.1", port: int = 3000) -> str | None:
    """Where `dagster dev` serves the UI, when it is up (the failure line then links it)."""
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return f"http://{host}:{port}"
    except OSError:
        return None


def _sources(defs: dg.Definitions) -> list[str]:
    graph = defs.resolve_asset_graph()
    for key in graph.toposorted_asset_keys:
        partitions = graph.get(key).partitions_def
        if partitions is not None:
            return list(partitions.get_partition_keys())
    return []


@dataclass
class StepOutcome:
    run_id: str | None
    failures: list[str]
    peak_rss_mb: float  # the process's own high-water mark: this stage group's peak


def _materialize_in_child(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    keys: list[str],
    tags: dict[str, str],
    run_config: dict[str, Any],
    on_event: progress.Sink,
    interrupts: Interrupts | None = None,
) -> StepOutcome:
    """One Dagster run in a forked child, as Dagster's multiprocess executor runs a step in
    its own process. Forking after the imports keeps the per-run cost at milliseconds. The
    child's stage events come back through the pipe before its outcome."""
    ctx = multiprocessing.get_context("fork")
    gc.collect()
    gc.freeze()  # the child's collector then never writes to (and so copies) inherited pages
    receive, send = ctx.Pipe(duplex=False)
    sys.stdout.flush()
    sys.stderr.flush()
    child = ctx.Process(
        target=_child_main, args=(defs, instance, keys, tags, run_config, send), daemon=False
    )
    child.start()
    assert child.pid is not None
    if interrupts is not None:
        interrupts.started(child.pid)
    send.close()
    try:
        while True:
            message = receive.recv()
            if isinstance(message, StepOutcome):
                outcome = message
                break
            on_event(message)
    except EOFError:  # the child died before reporting (killed, out of memory, ...)
        child.join()
        code = child.exitcode or 0
        why = f"signal {-code}" if code < 0 else f"exit {code}"
        return StepOutcome(None, [f"the run's process ended without a result ({why})"], 0.0)
    finally:
        receive.close()
        child.join()
        if interrupts is not None:
            interrupts.ended(child.pid)
    return outcome


def _child_main(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    keys: list[str],
    tags: dict[str, str],
    run_config: dict[str, Any],
    send: Connection,
) -> None:
    become_group_leader()
    # a `megacpp run` killed outright takes its run with it (a process group of its own
    # escapes the kill): not a run that goes on writing until it next reports
    end_with_parent()
    try:
        with progress.sending_to(send.send):  # back to the parent, which shows them
            outcome = _materialize(defs, instance, keys, tags, run_config)
    except BaseException as e:  # reported, never swallowed: the parent fails the pipeline
        outcome = StepOutcome(None, [f"{type(e).__name__}: {e}"], _peak_rss_mb())
    try:
        send.send(outcome)
        send.close()
    except OSError:
        pass  # the parent is gone (killed): nobody is left to tell


def _materialize(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    keys: Sequence[str],
    tags: dict[str, str],
    run_config: dict[str, Any] | None = None,
) -> StepOutcome:
    try:
        result = dg.materialize(
            [*(defs.assets or []), *(defs.asset_checks or [])],  # type: ignore[list-item]
            selection=dg.AssetSelection.assets(*keys) | dg.AssetSelection.checks_for_assets(*keys),
            instance=instance,
            resources=defs.resources,
            raise_on_error=False,
            tags=tags,
            run_config=run_config or {},
        )
    finally:
        # A forked run ends with os._exit (no atexit): leave a Ray cluster explicitly, so a
        # local instance this run started ends with it; an in-process run must not fork
        # the next one with Ray's threads running.
        ray_engine = sys.modules.get("megacpp_pipeline.pipeline.ray_engine")
        if ray_engine is not None:
            ray_engine.release()
    return StepOutcome(result.run_id, failures(result), _peak_rss_mb())


def _peak_rss_mb() -> float:
    """This process's high-water mark in MB of 10^6 bytes, as the plan forecasts it and the
    console counts every other figure (VmHWM is in KiB)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024 / MB
    except OSError:
        pass
    return 0.0


def failures(result: Any) -> list[str]:
    """Every failed blocking check and step of a run, one line each."""
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
            if err and err.cls_name == "DagsterAssetCheckFailedError":
                continue  # a blocking check that failed: its evaluation is reported above
            msg = err.message.strip().splitlines()[-1] if err and err.message else "failed"
            if err and err.cause and err.cause.message:
                msg = err.cause.message.strip().splitlines()[-1]
            out.append(f"step {ev.step_key} failed: {msg}")
    if not result.success and not out:
        out.append("run failed (see the Dagster UI for the run's logs)")
    return out


def final_output(defs: dg.Definitions, data_dir: Path | str) -> str:
    """The snapshot the latest `snapshot` version promoted when there is one, else where the
    asset versions are (a run stopped early)."""
    store = (defs.resources or {})["pipeline"].store()
    if store.has_version("snapshot"):
        extra = store.latest("snapshot").extra
        # on an object store, the promoted snapshot's copy there (the build stays in the cache)
        return str(extra.get("snapshot_uri") or extra["snapshot_dir"])
    return store.join("assets")
