"""Where a stage's map tasks run: the one executor protocol every stage is written against
(plan -> map over tasks -> reduce -> commit), with two implementations that differ only in
where a task runs. `LocalExecutor`: forked worker processes of this host, which inherit the
job (the stage's context, its prepared gates, an index) instead of receiving it pickled;
`RayExecutor` (pipeline/ray_engine.py): one Ray task each, on any node of a cluster, the job
put into Ray's object store once. A task gets the job and one small item (a slice's address,
a partition number) and returns a small result (shard names and hashes, counters, integer
arrays); text never travels through the executor.

Results come back in item order whatever order the tasks finish in, so the reduce, and so
every version and the snapshot, is the same on either executor and any number of workers.
A task whose worker dies (killed, out of memory) runs again, up to `retries` times for each
task (as Ray's `max_retries`): the deaths are charged to the task the dead worker ran; a task
that raises fails the map with its own exception (a gate error still names its file), carried
back by the worker as a result (pipeline/task_error.py), so it is never mistaken for a dead
worker and run again.
"""

from __future__ import annotations

import gc
import itertools
import multiprocessing
import multiprocessing.util
import os
import pickle
import signal
import socket
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from megacpp_pipeline.pipeline.memory import bound_malloc, keep_heap_top
from megacpp_pipeline.pipeline.parallel import cpu_count, worker_init
from megacpp_pipeline.pipeline.task_error import TaskError, TaskFailed

J = TypeVar("J")
T = TypeVar("T")
R = TypeVar("R")
Task = Callable[[J, T], R]
TASK_RETRIES = 3  # a task whose worker died runs again, this many times


class TaskLost(RuntimeError):
    """A task's worker died more than `retries` times (or workers died that often with no
    task to charge); names the task."""


@dataclass
class NodeWork:
    """What one node (a host, a Ray node) did for a map: tasks run and seconds busy."""

    tasks: int = 0
    busy_s: float = 0.0


@dataclass
class MapStats:
    """Per-node figures of every map an executor ran (the manifest's `engine_nodes`)."""

    nodes: dict[str, NodeWork] = field(default_factory=dict)
    retried: int = 0

    def count(self, node: str, busy_s: float) -> None:
        work = self.nodes.setdefault(node, NodeWork())
        work.tasks += 1
        work.busy_s += busy_s

    def figures(self) -> dict[str, dict[str, Any]]:
        return {
            node[:12]: {"tasks": w.tasks, "busy_s": round(w.busy_s, 3)}
            for node, w in sorted(self.nodes.items())
        }


class Executor(Protocol):
    """Runs `task(job, item)` for every item; yields the results in item order (`map`), or
    each with where and how long it ran (`map_timed`)."""

    @property
    def workers(self) -> int: ...

    @property
    def distributed(self) -> bool: ...

    def map(self, task: Task[J, T, R], job: J, items: Sequence[T]) -> Iterator[R]: ...

    def map_timed(self, task: Task[J, T, R], job: J, items: Sequence[T]) -> Iterator[Timed]: ...

    def map_light(self, task: Task[J, T, R], job: J, items: Sequence[T]) -> Iterator[R]: ...

    def run_apart(self, task: Task[J, T, R], job: J, item: T) -> R: ...

    def describe(self) -> dict[str, Any]: ...

    stats: MapStats


@dataclass(frozen=True)
class Timed:
    """A task's result with where and how long it ran (the executor unwraps it)."""

    value: Any
    node: str
    busy_s: float


@dataclass(frozen=True)
class Packed:
    """A forked worker's outcome, pickled by the worker itself: one the driver cannot read
    back fails its own task, by number, instead of breaking the pool as a dead worker."""

    blob: bytes


# what a worker sends back for a task: its result, timed, or its error (never raised there)
Outcome = Timed | TaskError | Packed


def run_timed(task: Task[J, T, R], job: J, item: T, node: str) -> Timed:
    started = time.perf_counter()
    value = task(job, item)
    return Timed(value, node, time.perf_counter() - started)


def run_carried(task: Task[J, T, R], job: J, item: T, node: str) -> Timed | TaskError:
    """`run_timed` in a worker: the task's error comes back as its result, whole (a
    SystemExit too: task code that exits fails its task, not the driver's process)."""
    try:
        return run_timed(task, job, item, node)
    except (Exception, SystemExit) as error:
        return TaskError.of(error)


def taken(result: Outcome) -> Timed:
    """A worker's result, or its task's error raised here."""
    if isinstance(result, Packed):
        try:
            result = pickle.loads(result.blob)
        except Exception as error:
            raise TaskFailed(
                f"{type(error).__module__}.{type(error).__qualname__}",
                f"the task's result could not be read back in the driver: {error}",
            ) from error
    if isinstance(result, TaskError):
        raise result.error()
    assert isinstance(result, Timed)
    return result


class _Running:
    """Which task each worker of a pool is running, in memory the pool's workers share with
    the driver: a worker writes its pid when it starts, and its map and item around each
    task. When a worker dies, the pool fails every pending task alike; this says which task
    the dead worker ran, so the death is charged to that task alone."""

    def __init__(self, workers: int) -> None:
        context = multiprocessing.get_context("fork")
        self.workers = workers
        self._slots = context.RawArray("q", 3 * workers)  # per worker: pid, map, item + 1
        self._claimed = context.Value("i", 0)

    def claim(self) -> None:
        """In a worker, at its start: take a slot of its own."""
        global _SLOT
        with self._claimed.get_lock():
            slot = self._claimed.value
            self._claimed.value += 1
        if slot < self.workers:
            self._slots[3 * slot] = os.getpid()
            _SLOT = (self, slot)

    def mark(self, slot: int, key: int, item: int | None) -> None:
        self._slots[3 * slot + 1] = key
        self._slots[3 * slot + 2] = 0 if item is None else item + 1

    def tasks(self, key: int) -> dict[int, int]:
        """The items of map `key` a worker was running when it stopped: pid -> item."""
        slots = self._slots
        return {
            slots[3 * s]: slots[3 * s + 2] - 1
            for s in range(self.workers)
            if slots[3 * s] and slots[3 * s + 2] and slots[3 * s + 1] == key
        }


@contextmanager
def ending(results: Iterator[R]) -> Iterator[Iterator[R]]:
    """A map's results, for a block that consumes them: leaving the block (a failure of the
    driver's own, a return) ends the tasks still running, there and then. A body that maps
    inside `with version:` takes its results through this inside that block, so no worker
    is left writing into a version the failure aborts (a map merely dropped ends its
    workers only when collected, and a kept traceback keeps it)."""
    try:
        yield results
    finally:
        close = getattr(results, "close", None)
        if close is not None:
            close()


# A forked worker's job, set by its initializer (never in the parent: the pool hands the job
# to each worker it forks, as an argument the fork carries over without pickling).
_JOB: tuple[Callable[..., Any], Any] | None = None
# in a worker: its pool's `_Running` and its own slot there
_SLOT: tuple[_Running, int] | None = None
_HOST = socket.gethostname()


def _worker_init(task: Callable[..., Any], job: Any, running: _Running) -> None:
    global _JOB
    worker_init()
    bound_malloc()
    keep_heap_top()  # a worker's freed blocks stay for its next file
    running.claim()
    _JOB = (task, job)


def _run_in_worker(i: int, item: Any) -> Outcome:
    assert _JOB is not None, "worker started without a fork"
    task, job = _JOB
    return _run_marked(0, i, task, job, item)


def _run_marked(key: int, i: int, task: Callable[..., Any], job: Any, item: Any) -> Outcome:
    """Item `i` of map `key`, packed; this worker's slot names it from now until the worker
    takes its next task, so a death while its result is on the way back is charged to it
    (the driver charges only items whose result never arrived)."""
    if _SLOT is not None:
        running, slot = _SLOT
        running.mark(slot, key, i)
    outcome = run_carried(task, job, item, _HOST)
    try:
        return Packed(pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception as error:  # a result that does not pickle fails its task
        return Packed(pickle.dumps(TaskError.of(error), protocol=pickle.HIGHEST_PROTOCOL))


class LocalExecutor:
    """Map tasks over forked workers of this host (inline with one worker, or one task).

    The pool is forked per map, after the job is set, so a worker inherits the job (and
    whatever the driver prepared: compiled gates, a benchmark index) without pickling it;
    only items and results cross the pipes. Task code must not use polars: a process
    forked after polars' threads started would hang at its first query."""

    distributed = False

    def __init__(self, workers: int, *, retries: int = TASK_RETRIES, cap: bool = True) -> None:
        # never more workers than CPUs this process may use (unless `cap` is off): the
        # tasks are CPU-bound, and oversubscribed cores only add forks, copied pages and
        # switches (measured: 16 workers on 2 cores took 1.7x the CPU of 2, demo at 4x)
        self.asked = max(1, workers)
        self._workers = min(self.asked, cpu_count()) if cap else self.asked
        self.retries = retries
        self.stats = MapStats()

    @property
    def workers(self) -> int:
        return self._workers

    def describe(self) -> dict[str, Any]:
        return {"engine": "local", "workers": self._workers}

    def map(self, task: Task[J, T, R], job: J, items: Sequence[T]) -> Iterator[R]:
        for timed in self.map_timed(task, job, items):
            yield timed.value

    def map_light(self, task: Task[J, T, R], job: J, items: Sequence[T]) -> Iterator[R]:
        """`map` for a job that is small and whole when pickled (a check's store, version
        folder and config; nothing the driver set up for forked workers to inherit): its
        tasks run on this process's long-lived pool (`_light_pool`), forked once and reused
        by every light map after it, with the job sent pickled; a job that does not pickle,
        or pickles to more than LIGHT_JOB_BYTES, gets a pool forked for its map as `map`
        does. A forked pool costs this process about 15 ms of CPU per worker (copying its
        page tables; bench/bench_fork.py), and a run makes dozens of small check maps."""
        items = list(items)
        if self._inline(items):
            yield from self.map(task, job, items)
            return
        for timed in self._map_forked(task, job, items, light=_light_job(task, job)):
            yield timed.value

    def _inline(self, items: list[Any]) -> bool:
        """Whether a map runs in this process: one worker, one item, or no fork here."""
        return self._workers < 2 or len(items) < 2 or "fork" not in _start_methods()

    def run_apart(self, task: Task[J, T, R], job: J, item: T) -> R:
        """One task in a worker of its own even with one worker: a bounded step that would
        otherwise load the driver (training the tokenizer on its sample)."""
        if "fork" not in _start_methods():
            return task(job, item)
        for timed in self._map_forked(task, job, [item]):
            value: R = timed.value
            return value
        raise TaskLost("the task gave no result")

    def map_timed(self, task: Task[J, T, R], job: J, items: Sequence[T]) -> Iterator[Timed]:
        items = list(items)
        if self._inline(items):
            for item in items:
                timed = run_timed(task, job, item, _HOST)
                self.stats.count(timed.node, timed.busy_s)
                yield timed
            return
        yield from self._map_forked(task, job, items)

    def stream(
        self,
        task: Task[J, T, R],
        job: J,
        items: Sequence[T],
        ahead: int | None = None,
        workers: int | None = None,
    ) -> Iterator[R]:
        """`map` for tasks whose results are large (tables a consumer writes as they come):
        at most `ahead` tasks (default: two per worker) are handed out beyond the result the
        consumer waits for, so results never pile up in this process faster than it takes
        them; memory follows the window, not the number of items. A light job (see
        `map_light`) runs on the process's light pool; another gets a pool forked for it, of
        `workers` when that is fewer than the executor's (one worker reading ahead of a
        consumer that is slower anyway). With one worker allowed in all, the tasks run
        here."""
        items = list(items)
        if self._inline(items):
            yield from self.map(task, job, items)
            return
        pool = min(self._workers, workers or self._workers)
        window = max(1, ahead if ahead is not None else 2 * pool)
        blob = _light_job(task, job)  # the process's light pool, the window still the bound
        for timed in self._map_forked(task, job, items, window, pool, light=blob):
            yield timed.value

    def _map_forked(
        self,
        task: Task[J, T, R],
        job: J,
        items: list[T],
        window: int | None = None,
        workers: int | None = None,
        light: bytes | None = None,
    ) -> Iterator[Timed]:
        """Every item's task on a pool forked for this map (or, `light`: the pickled task
        and job, on the process's long-lived pool), results in item order; with a `window`,
        no item more than `window` past the next one out is handed to the pool. When a
        worker dies, what finished is kept and a new pool runs the rest; the death is charged
        to the task the worker ran, and a task charged more than `retries` times is lost."""
        n = len(items)
        width = n if window is None else window
        results: dict[int, Outcome] = {}
        next_out = 0
        deaths: dict[int, int] = {}  # item -> workers that died running it
        uncharged = 0  # deaths with no task to charge (a worker dying as it starts)
        while next_out < n:
            waiting = deque(i for i in range(next_out, n) if i not in results)
            first = []
            while waiting and waiting[0] < next_out + width:
                first.append(waiting.popleft())
            size = max(1, workers or self._workers)
            mine: multiprocessing.util.Finalize | None = None  # a pool of this map's own
            end: Callable[[], Any]
            lkey = None if light is None else (next(_LIGHT_MAPS), light)
            if lkey is None:
                pool, futures, mine, running = _start_pool(task, job, items, first, size)
                end = mine
            else:
                pool, end, running = _light_pool(self._workers)
                futures = {}
                for i in first:
                    if not _submit(pool, lkey, items[i], futures, i):
                        break
            charged: list[int] = []
            # a pool breaks when a worker dies, which a submit may be the first to see
            broken = next_out not in futures and next_out not in results
            try:
                while not broken and next_out < n:
                    if next_out not in results:
                        try:
                            # popped: a consumed result must not stay referenced here
                            results[next_out] = futures.pop(next_out).result()
                        except BrokenProcessPool:
                            broken = True
                            break
                    timed = taken(results.pop(next_out))
                    self.stats.count(timed.node, timed.busy_s)
                    next_out += 1
                    yield timed
                    while waiting and waiting[0] < next_out + width:
                        i = waiting.popleft()
                        if not _submit(pool, lkey, items[i], futures, i):
                            broken = True
                            break
                if broken:  # a worker died: keep what finished, fail on a real error
                    for i, future in futures.items():
                        if i in results or not future.done() or future.cancelled():
                            continue
                        exc = future.exception()
                        if exc is None:
                            results[i] = future.result()
                            taken(results[i])  # a task's error fails the map now
                        elif not isinstance(exc, BrokenProcessPool):
                            raise exc
                    came_back = set(results) | set(range(next_out))
                    charged = _died_running(
                        pool, running, 0 if lkey is None else lkey[0], came_back.__contains__
                    )
            except BaseException:
                end()  # terminates the pool, once
                raise
            if not broken:
                if mine is not None:  # the light pool stays for the next light map
                    pool.shutdown(wait=True)
                    mine.cancel()
                break
            end()
            left = [i for i in range(next_out, n) if i not in results]
            self.stats.retried += len(left)
            for i in charged:
                deaths[i] = deaths.get(i, 0) + 1
                if deaths[i] > self.retries:
                    raise TaskLost(f"task {i + 1} of {n}: its worker died {deaths[i]} times")
            if not charged:
                uncharged += 1
                if uncharged > self.retries:
                    raise TaskLost(
                        f"task {left[0] + 1} of {n}: workers died {uncharged} times, "
                        "none of them running a task"
                    )


def _died_running(
    pool: ProcessPoolExecutor, running: _Running, key: int, done: Callable[[int], bool]
) -> list[int]:
    """The items of map `key` whose workers died in a broken pool, their results never
    back (`done` says which items are). The pool, once it sees a worker die, ends the
    others with SIGTERM: a worker that ended otherwise (killed, out of memory, crashed)
    died on its own, and its item is charged, unless its result had arrived (it died
    between tasks: nothing to charge). Only when no worker can be told apart (a SIGTERM
    from outside) is every item still running charged."""
    manager = getattr(pool, "_executor_manager_thread", None)
    if manager is not None:  # it ends and joins every worker of a broken pool
        manager.join(timeout=10)
    processes = getattr(pool, "_processes", None) or {}
    at = {pid: i for pid, i in running.tasks(key).items() if not done(i)}
    own = [
        pid for pid, process in processes.items() if process.exitcode not in (None, -signal.SIGTERM)
    ]
    if own:
        return sorted(at[pid] for pid in own if pid in at)
    return sorted(at.values())


def _start_pool(
    task: Callable[..., Any], job: Any, items: list[Any], todo: list[int], workers: int
) -> tuple[
    ProcessPoolExecutor, dict[int, Future[Outcome]], multiprocessing.util.Finalize, _Running
]:
    """A pool forked now, the job handed to its workers through the fork, and every item of
    `todo` submitted to it (a fork-context pool forks all its workers at the first submit);
    more items may be submitted later."""
    # the children's collector then never writes to (and so copies) the inherited objects;
    # no gc.collect() first: on a Dagster run's heap it costs more than the map it precedes
    gc.freeze()
    try:
        size = min(workers, max(1, len(todo)))
        running = _Running(size)
        pool = ProcessPoolExecutor(
            max_workers=size,
            mp_context=multiprocessing.get_context("fork"),
            initializer=_worker_init,
            initargs=(task, job, running),
        )
        # A map whose consumer failed and never closed it must not keep a process from
        # exiting: a forked process's exit joins its children (after the finalizers with an
        # exit priority, which end the pool first).
        end = multiprocessing.util.Finalize(pool, _terminate, args=(pool,), exitpriority=10)
        futures: dict[int, Future[Outcome]] = {}
        for i in todo:  # a worker that dies this early breaks the pool: the map sees it
            if not _submit(pool, None, items[i], futures, i):
                break
    finally:
        gc.unfreeze()
    return pool, futures, end, running


# A light map's pickled job is at most this big; a bigger one is inherited through a fork.
LIGHT_JOB_BYTES = 1 << 20
_LIGHT_MAPS = itertools.count()
# this process's long-lived pool for light maps: (its pid, workers, the pool, its finalizer,
# what its workers run); a process forked from this one sees another pid and forks its own
_LIGHT: tuple[int, int, ProcessPoolExecutor, multiprocessing.util.Finalize, _Running] | None = None
# in a light pool's worker: the last light map's (key, task, job), unpickled once per map
_LIGHT_JOB: tuple[int, Callable[..., Any], Any] | None = None


def _light_job(task: Callable[..., Any], job: Any) -> bytes | None:
    """The task and job pickled, when they pickle to at most LIGHT_JOB_BYTES."""
    try:
        blob = pickle.dumps((task, job), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # a closure, a lock: inherited through a fork instead
        return None
    return blob if len(blob) <= LIGHT_JOB_BYTES else None


def _light_pool(workers: int) -> tuple[ProcessPoolExecutor, Callable[[], None], _Running]:
    """This process's pool for light maps, forked at the first one (all its workers at
    once, the heap frozen as `_start_pool` does), and what ends it: a light map that fails
    or whose worker died ends the pool, and the next light map forks a new one."""
    global _LIGHT
    if _LIGHT is not None and (
        _LIGHT[0] != os.getpid() or _LIGHT[1] != workers or getattr(_LIGHT[2], "_broken", False)
    ):
        if _LIGHT[0] == os.getpid():
            _LIGHT[3]()
        _LIGHT = None
    if _LIGHT is None:
        gc.freeze()
        try:
            running = _Running(workers)
            pool = ProcessPoolExecutor(
                max_workers=workers,
                mp_context=multiprocessing.get_context("fork"),
                initializer=_light_init,
                initargs=(running,),
            )
            finalize = multiprocessing.util.Finalize(
                pool, _terminate, args=(pool,), exitpriority=10
            )
            pool.submit(int).result()  # a fork-context pool forks every worker at the first
        finally:
            gc.unfreeze()
        _LIGHT = (os.getpid(), workers, pool, finalize, running)
    light = _LIGHT

    def end() -> None:
        global _LIGHT
        light[3]()
        if _LIGHT is light:
            _LIGHT = None

    return light[2], end, light[4]


def end_light_pool() -> None:
    """End this process's light pool now, its workers exiting and reaped (a process's
    RUSAGE_CHILDREN then holds their CPU); the next light map forks a new one."""
    global _LIGHT
    if _LIGHT is not None and _LIGHT[0] == os.getpid():
        pool, finalize = _LIGHT[2], _LIGHT[3]
        _LIGHT = None
        finalize.cancel()
        pool.shutdown(wait=True)


def _light_init(running: _Running) -> None:
    worker_init()
    bound_malloc()
    keep_heap_top()  # a worker's freed blocks stay for its next file
    running.claim()


def _submit(
    pool: ProcessPoolExecutor,
    light: tuple[int, bytes] | None,
    item: Any,
    futures: dict[int, Future[Outcome]],
    i: int,
) -> bool:
    """Item `i` handed to the pool (into `futures`); False when the pool is broken."""
    try:
        if light is None:  # the pool forked for this map holds the job
            futures[i] = pool.submit(_run_in_worker, i, item)
        else:
            futures[i] = pool.submit(_run_light, light[0], light[1], i, item)
    except BrokenProcessPool:
        return False
    return True


def _run_light(key: int, blob: bytes, i: int, item: Any) -> Outcome:
    global _LIGHT_JOB
    if _LIGHT_JOB is None or _LIGHT_JOB[0] != key:
        task, job = pickle.loads(blob)
        _LIGHT_JOB = (key, task, job)
    _, task, job = _LIGHT_JOB
    return _run_marked(key, i, task, job, item)


def _terminate(pool: ProcessPoolExecutor) -> None:
    """End a pool's workers now (a failed or broken map must not leave them running). They
    are killed, not asked: a worker stopped while it holds the task queue's lock would
    leave the others waiting on it forever, and a task is safe to run again."""
    table = getattr(pool, "_processes", None) or {}  # shutdown drops the pool's reference
    processes = list(table.values())
    for process in processes:
        if process.is_alive():
            process.kill()
    pool.shutdown(wait=False, cancel_futures=True)
    # a worker started meanwhile (a submit from the thread still mapping, before the
    # shutdown refused the next one) is killed too
    late = [p for p in list(table.values()) if p not in processes]
    for process in late:
        if process.is_alive():
            process.kill()
    for process in [*processes, *late]:
        process.join(timeout=5)


def _start_methods() -> list[str]:
    return multiprocessing.get_all_start_methods()
