"""The ray engine: the executor protocol (pipeline/executor.py) on a Ray cluster. Each task
of a map is one Ray task on any node; the job (the stage's context, an index) is put into
Ray's object store once and every task of the map shares it. A task gets an address (a
slice of a version, a band partition), reads its rows from the store and writes its shards
there under names unique to the task, so a retried task rewrites the same objects; only
names, hashes, counters and integer arrays come back. Every task of a map is submitted
before the first result is taken, and results are taken in item order, so the driver's
reduce and commit are the local engine's, and so is the snapshot.

A task whose worker or node dies is retried by Ray (`max_retries`); a task that raises (a
gate error naming a file) fails the map with that error, carried back as the task's result
(pipeline/task_error.py): Ray would otherwise hand the driver an error whose class does not
pickle as an UnserializableException, its type lost.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

from megacpp_pipeline.pipeline.engine import Engine
from megacpp_pipeline.pipeline.executor import (
    TASK_RETRIES,
    J,
    MapStats,
    R,
    T,
    Task,
    Timed,
    run_carried,
    run_timed,
    taken,
)
from megacpp_pipeline.pipeline.memory import bound_malloc, keep_heap_top
from megacpp_pipeline.pipeline.task_error import TaskError

try:
    import ray
except ImportError as e:  # the `ray` extra is optional
    raise ImportError("the ray engine needs Ray: pip install -e '.[ray]' (ray==2.60.0)") from e


# the address of the local instance a process holds for the runs it forks (ray_holder.py);
# a forked run inherits it and joins that instance instead of starting one of its own
_held_address: str | None = None


def connect(engine: Engine, local_cpus: int) -> None:
    """Join the engine's cluster once per process; with no address (and no RAY_ADDRESS), the
    local instance the process that forked this one holds, else a local Ray instance of
    `local_cpus`, on loopback, started for this process whatever cluster already runs on
    the host."""
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    kwargs: dict[str, Any] = {"log_to_driver": False, "configure_logging": False}
    if engine.address:
        ray.init(address=engine.address, **kwargs)
    elif _held_address:
        # a local instance on this host: its raylet is at the address's own IP (loopback
        # or the host's, as Ray chose), which a driver resolving its own may not pick
        host = _held_address.rsplit(":", 1)[0]
        # the holder started it as Ray starts any local instance: with token authentication
        # unless RAY_AUTH_MODE (inherited here too) says otherwise. A driver joining by
        # address turns it on only when RAY_AUTH_MODE says so before Ray is imported, which
        # a forked run cannot arrange: Ray's own check (token there, mode unset: token
        # mode) does it here (ray==2.60.0, pinned by the `ray` extra).
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )

        maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
        ray.init(address=_held_address, _node_ip_address=host, **kwargs)
    else:
        # "local": a new instance of our own, even where `ray start` left a cluster on this
        # host (with no address Ray joins that one, and refuses our num_cpus). Ray otherwise
        # resolves the host's own address, which a sandboxed or firewalled host may not route
        # back to itself; a local instance needs nothing beyond loopback.
        ray.init(
            address="local",
            num_cpus=local_cpus,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            **kwargs,
        )


def joined_address() -> str:
    """The address of the cluster this process has joined, for another process to join."""
    return str(ray.get_runtime_context().gcs_address)


def hold_for_forked_runs(address: str | None) -> None:
    """Runs this process forks from now on join the local instance at `address` (None: each
    starts its own again)."""
    global _held_address
    _held_address = address


def release() -> None:
    """Leave the cluster (a local instance ends with it), e.g. before this process forks."""
    if ray.is_initialized():
        ray.shutdown()


@ray.remote(max_retries=TASK_RETRIES, num_cpus=1)
def _run(job: tuple[Any, Any], item: Any) -> Timed | TaskError:
    bound_malloc()  # once per worker process
    keep_heap_top()
    task, value = job
    return run_carried(task, value, item, ray.get_runtime_context().get_node_id())


class RayExecutor:
    """Maps as Ray tasks on the engine's cluster, joined on first use in this process (a
    stage that maps nothing, or the process `megacpp run` forks its runs from, never
    connects: a process forked with Ray's threads running cannot connect again)."""

    distributed = True

    def __init__(self, engine: Engine, local_cpus: int) -> None:
        self.engine = engine
        self.local_cpus = local_cpus  # a local instance's size (no cluster address)
        self.stats = MapStats()

    @property
    def workers(self) -> int:
        connect(self.engine, self.local_cpus)
        return max(1, int(ray.cluster_resources().get("CPU", 1)))

    def describe(self) -> dict[str, Any]:
        return self.engine.describe()

    def map(self, task: Task[J, T, R], job: J, items: Sequence[T]) -> Iterator[R]:
        for timed in self.map_timed(task, job, items):
            yield timed.value

    def map_light(self, task: Task[J, T, R], job: J, items: Sequence[T]) -> Iterator[R]:
        """`map`: a Ray task costs the driver no fork, light job or not."""
        return self.map(task, job, items)

    def run_apart(self, task: Task[J, T, R], job: J, item: T) -> R:
        """One task on the cluster, not in the driver."""
        connect(self.engine, self.local_cpus)
        timed = taken(ray.get(_run.remote(ray.put((task, job)), item)))
        self.stats.count(timed.node, timed.busy_s)
        value: R = timed.value
        return value

    def map_timed(self, task: Task[J, T, R], job: J, items: Sequence[T]) -> Iterator[Timed]:
        items = list(items)
        if len(items) < 2:  # one task is cheaper here than a round trip to the cluster
            for item in items:
                timed = run_timed(task, job, item, "driver")
                self.stats.count(timed.node, timed.busy_s)
                yield timed
            return
        connect(self.engine, self.local_cpus)
        job_ref = ray.put((task, job))
        refs = [_run.remote(job_ref, item) for item in items]
        done = 0
        try:
            for ref in refs:
                result = ray.get(ref)
                done += 1
                timed = taken(result)  # a task's error raised here, whole
                self.stats.count(timed.node, timed.busy_s)
                yield timed
        finally:
            # a failed or abandoned map leaves nothing running (only the tasks not taken:
            # cancelling a finished one can trip Ray's own task bookkeeping)
            for ref in refs[done:]:
                ray.cancel(ref)
