"""The local executor: tasks on forked workers give what the inline loop gives, in item
order; a worker inherits the job without pickling it; a killed worker's task runs again; a
task's error is raised with its own type and message; workers end even when the parent
defers SIGTERM as Dagster does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path

import pyarrow as pa
import pytest

from megacpp_pipeline.corpus.dedup.config import DedupOrderError
from megacpp_pipeline.gates import normalize
from megacpp_pipeline.pipeline import executor as executor_module
from megacpp_pipeline.pipeline.executor import LocalExecutor, TaskLost
from megacpp_pipeline.pipeline.parallel import WorkersError, cpu_count, workers_from
from megacpp_pipeline.pipeline.task_error import TaskFailed
from tests.fixtures.failing_tasks import exits, out_of_order, refuse_unpicklably
from tests.gates.test_normalize import HEADER, raw_table


def _corpus(n: int) -> dict[str, bytes]:
    """Real-looking headers of varied size, with files every normalize rule drops mixed in."""
    files: dict[str, bytes] = {}
    for i in range(n):
        body = HEADER.replace("span", f"span{i}") * (1 + i % 7)
        files[f"include/example/span{i}.hpp"] = body.encode()
        if i % 9 == 0:
            files[f"include/example/blob{i}.h"] = b"\x00\x01binary" * 40
        if i % 11 == 0:
            files[f"include/example/gen{i}.pb.h"] = b"// generated\nint x;\n"
    return files


def _normalize_slice(job: tuple[pa.Table, normalize.NormalizeConfig], bounds: tuple[int, int]):
    table, config = job
    lo, hi = bounds
    result = normalize.run(table.slice(lo, hi - lo), config)
    return result.kept["path"].to_pylist(), result.dropped["reason"].to_pylist(), os.getpid()


def test_normalize_over_forked_workers_equals_the_inline_loop():
    table = raw_table(_corpus(200))
    job = (table, normalize.NormalizeConfig())
    bounds = [(lo, min(lo + 17, table.num_rows)) for lo in range(0, table.num_rows, 17)]
    inline = list(LocalExecutor(1).map(_normalize_slice, job, bounds))
    forked = list(LocalExecutor(2, cap=False).map(_normalize_slice, job, bounds))
    assert [r[:2] for r in inline] == [r[:2] for r in forked]
    assert {r[2] for r in inline} == {os.getpid()}
    assert os.getpid() not in {r[2] for r in forked}  # the work ran in the workers
    assert sum(len(r[1]) for r in forked) > 0


def test_a_worker_inherits_a_job_that_cannot_be_pickled():
    job = {"scale": lambda x: x * 3}  # a lambda: pickle refuses it, a fork inherits it
    out = list(LocalExecutor(2, cap=False).map(lambda j, x: j["scale"](x), job, range(20)))
    assert out == [3 * x for x in range(20)]


def _die_once(marker: str, x: int) -> int:
    if x == 5 and not Path(marker).exists():
        Path(marker).touch()
        os.kill(os.getpid(), signal.SIGKILL)
    return x * x


def test_a_task_whose_worker_is_killed_runs_again(tmp_path: Path):
    executor = LocalExecutor(2, cap=False)
    out = list(executor.map(_die_once, str(tmp_path / "killed"), range(12)))
    assert out == [x * x for x in range(12)]
    assert (tmp_path / "killed").exists()
    assert executor.stats.retried >= 1


def _always_die(job: None, x: int) -> int:
    if x == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def test_a_task_that_always_kills_its_worker_is_lost_with_its_number():
    with pytest.raises(TaskLost, match=r"task 4 of 6: its worker died 2 times"):
        list(LocalExecutor(2, retries=1, cap=False).map(_always_die, None, range(6)))


def _each_dies_once(markers: str, x: int) -> int:
    """Every task's worker dies once, on the task's first run."""
    marker = Path(markers, f"item-{x}")
    if not marker.exists():
        marker.touch()
        time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGKILL)
    return x


@pytest.mark.parametrize("light", [False, True], ids=["map", "light map"])
def test_the_retries_are_each_tasks_own_not_the_maps(tmp_path: Path, light: bool):
    """Ten workers die, each running another task: no task died more than once, so the map
    finishes (as Ray's per-task max_retries would), with one retry allowed."""
    executor = LocalExecutor(2, retries=1, cap=False)
    run = executor.map_light if light else executor.map
    assert list(run(_each_dies_once, str(tmp_path), range(10))) == list(range(10))
    assert len(list(tmp_path.iterdir())) == 10  # every task's first worker died


def _slow_first_and_one_always_dies(job: None, x: int) -> int:
    if x == 0:
        time.sleep(1.0)  # still running, unfinished, whenever task 7's worker dies
    if x == 6:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def test_a_lost_task_is_the_one_whose_worker_died_not_the_first_unfinished():
    with pytest.raises(TaskLost, match=r"^task 7 of 8: its worker died 2 times$"):
        list(
            LocalExecutor(2, retries=1, cap=False).map(
                _slow_first_and_one_always_dies, None, range(8)
            )
        )


class _DiesWhenSent:
    """A result whose pickling kills its worker (as running out of memory while a large
    result is copied out would)."""

    def __reduce__(self) -> tuple[object, ...]:
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")


def _dies_sending_its_result(job: None, x: int) -> object:
    if x == 0:
        return _DiesWhenSent()
    time.sleep(1.0)  # task 2 runs, innocent, while task 1's worker dies
    return x


@pytest.mark.parametrize("light", [False, True])
def test_a_worker_dying_as_its_result_is_sent_is_charged_to_that_task(light: bool):
    """The worker's slot was cleared when the task returned, before its result was sent:
    the death fell on the task the other worker was running."""
    executor = LocalExecutor(2, retries=1, cap=False)
    run = executor.map_light if light else executor.map
    with pytest.raises(TaskLost, match=r"^task 1 of 2: its worker died 2 times$"):
        list(run(_dies_sending_its_result, None, [0, 1]))


class _KeywordOnly(Exception):
    def __init__(self, *, path: str) -> None:
        super().__init__(f"bad file {path}")


def _returns_what_does_not_unpickle(job: None, x: int) -> object:
    if x == 0:
        return [_KeywordOnly(path="src/a.cpp")]  # a value, not raised: pickles, never back
    return x


def test_a_result_the_driver_cannot_read_back_fails_its_task_not_the_pool():
    """It broke the pool as a dead worker would: run four times, then a TaskLost saying
    workers died, the real error thrown away."""
    with pytest.raises(TaskFailed, match="could not be read back") as failed:
        list(LocalExecutor(2, cap=False).map(_returns_what_does_not_unpickle, None, [0, 1]))
    assert isinstance(failed.value.__cause__, TypeError)


@pytest.mark.parametrize("light", [False, True])
def test_a_task_that_exits_fails_its_map_and_not_the_driver(light: bool):
    executor = LocalExecutor(2, cap=False)
    run = executor.map_light if light else executor.map
    with pytest.raises(TaskFailed, match=r"builtins.SystemExit: an argparse-like exit"):
        list(run(exits, None, [0, 1, 2]))


def _refuse(job: None, x: int) -> int:
    if x == 7:
        raise ValueError(f"include/a{x}.hpp: refused by the test gate")
    return x


def test_a_task_error_is_raised_with_its_type_and_message():
    with pytest.raises(ValueError, match=r"include/a7.hpp: refused by the test gate"):
        list(LocalExecutor(2, cap=False).map(_refuse, None, range(10)))


@pytest.mark.parametrize("light", [False, True], ids=["map", "light map"])
def test_a_gate_error_built_from_fields_reaches_the_driver_whole_and_is_not_rerun(light: bool):
    executor = LocalExecutor(2, cap=False)
    run = executor.map_light if light else executor.map
    with pytest.raises(DedupOrderError) as raised:
        list(run(out_of_order, None, range(8)))
    assert str(raised.value) == "tree:src/a.cc: paths must increase in a source"
    assert raised.value.path == "src/a.cc"
    assert "out_of_order" in str(raised.value.__cause__)  # the worker's traceback
    assert executor.stats.retried == 0  # an error is not a dead worker


@pytest.mark.parametrize("light", [False, True], ids=["map", "light map"])
def test_an_error_that_cannot_be_rebuilt_is_raised_naming_its_type_and_message(light: bool):
    executor = LocalExecutor(2, cap=False)
    run = executor.map_light if light else executor.map
    with pytest.raises(TaskFailed) as raised:
        list(run(refuse_unpicklably, None, range(8)))
    assert raised.value.type_name == "tests.fixtures.failing_tasks.Unpicklable"
    assert str(raised.value) == (
        "tests.fixtures.failing_tasks.Unpicklable: "
        "include/a4.hpp: refused by a gate whose error does not pickle"
    )
    assert "refuse_unpicklably" in str(raised.value.__cause__)
    assert executor.stats.retried == 0


def _started(folder: str, x: int) -> pa.Table:
    """A task that leaves a mark when it starts and returns a table (what a stream is for)."""
    Path(folder, f"{x:04d}").touch()
    return pa.table({"x": [x] * 100})


def test_a_stream_hands_out_no_more_than_its_window_ahead_of_the_consumer(tmp_path: Path):
    executor = LocalExecutor(2, cap=False)
    seen = []
    for k, table in enumerate(executor.stream(_started, str(tmp_path), range(40), ahead=3)):
        started = len(list(tmp_path.iterdir()))
        # item k is out; at most the window past it has been handed to the pool
        assert started <= k + 1 + 3, (k, started)
        seen.append(table["x"][0].as_py())
    assert seen == list(range(40))
    assert len(list(tmp_path.iterdir())) == 40


class _Blob:
    """A result that can be watched with a weak reference (a table cannot)."""

    def __init__(self, x: int) -> None:
        self.x = x


def _blob(job: None, x: int) -> _Blob:
    return _Blob(x)


def test_a_stream_holds_no_result_it_has_handed_out():
    seen: list[weakref.ref[_Blob]] = []
    for blob in LocalExecutor(2, cap=False).stream(_blob, None, range(30), ahead=3):
        seen.append(weakref.ref(blob))
        del blob
        # every earlier result is gone: memory follows the window, not the items
        assert all(ref() is None for ref in seen[:-1]), len(seen)
    assert len(seen) == 30


def _die_once_table(marker: str, x: int) -> pa.Table:
    if x == 9 and not Path(marker).exists():
        Path(marker).touch()
        os.kill(os.getpid(), signal.SIGKILL)
    return pa.table({"x": [x]})


def test_a_stream_runs_again_the_tasks_of_a_killed_worker_and_keeps_the_order(tmp_path: Path):
    executor = LocalExecutor(2, cap=False)
    out = executor.stream(_die_once_table, str(tmp_path / "killed"), range(30), ahead=4)
    assert [t["x"][0].as_py() for t in out] == list(range(30))
    assert (tmp_path / "killed").exists()
    assert executor.stats.retried >= 1


def test_a_stream_left_early_ends_its_workers(tmp_path: Path):
    stream = LocalExecutor(2, cap=False).stream(_started, str(tmp_path), range(50), ahead=2)
    assert next(stream)["x"][0].as_py() == 0
    stream.close()  # the consumer stops: the pool is ended, not left running the rest
    assert len(list(tmp_path.iterdir())) <= 1 + 2 + 2  # the window, and a worker's start


def _square_and_pid(job: int, x: int) -> tuple[int, int]:
    return job * x * x, os.getpid()


def _light_workers() -> set[int]:
    light = executor_module._LIGHT
    assert light is not None and light[0] == os.getpid()
    return set(light[2]._processes)  # the pool's worker processes, by pid


def test_light_maps_reuse_one_pool_forked_once():
    executor = LocalExecutor(2, cap=False)
    first = list(executor.map_light(_square_and_pid, 3, range(20)))
    workers = _light_workers()
    second = list(executor.map_light(_square_and_pid, 5, range(20)))
    assert [v for v, _ in first] == [3 * x * x for x in range(20)]
    assert [v for v, _ in second] == [5 * x * x for x in range(20)]  # each map its own job
    assert len(workers) == 2 and os.getpid() not in workers
    # the same two workers ran both maps: nothing was forked for the second
    assert _light_workers() == workers
    assert {p for _, p in first} | {p for _, p in second} <= workers


def test_a_light_map_whose_job_does_not_pickle_forks_a_pool_of_its_own():
    job = {"scale": lambda x: x * 3}
    out = list(LocalExecutor(2, cap=False).map_light(lambda j, x: j["scale"](x), job, range(9)))
    assert out == [3 * x for x in range(9)]


def test_a_light_map_survives_a_killed_worker_and_the_next_light_map_runs(tmp_path: Path):
    executor = LocalExecutor(2, cap=False)
    out = list(executor.map_light(_die_once, str(tmp_path / "killed"), range(12)))
    assert out == [x * x for x in range(12)]
    assert (tmp_path / "killed").exists()
    assert executor.stats.retried >= 1
    assert [v for v, _ in executor.map_light(_square_and_pid, 1, range(4))] == [0, 1, 4, 9]


def test_a_light_map_raises_a_task_error_and_the_next_light_map_runs():
    executor = LocalExecutor(2, cap=False)
    with pytest.raises(ValueError, match=r"include/a7.hpp: refused by the test gate"):
        list(executor.map_light(_refuse, None, range(10)))
    assert [v for v, _ in executor.map_light(_square_and_pid, 2, range(3))] == [0, 2, 8]


def test_one_worker_or_one_item_runs_inline():
    assert list(LocalExecutor(1).map(lambda j, x: os.getpid(), None, range(3))) == [os.getpid()] * 3
    assert list(LocalExecutor(4).map(lambda j, x: os.getpid(), None, [0])) == [os.getpid()]


def test_no_more_workers_than_cpus_unless_asked():
    from megacpp_pipeline.pipeline.parallel import cpu_count

    assert LocalExecutor(cpu_count() + 14).workers == cpu_count()
    assert LocalExecutor(cpu_count() + 14, cap=False).workers == cpu_count() + 14


def test_workers_come_from_the_environment_the_edge_hands_over():
    assert workers_from({"MEGACPP_WORKERS": "3"}) == 3
    assert workers_from({}) == cpu_count()
    for bad in ("many", "0", "-3", "1.5"):  # refused as --workers is, never read as 1
        with pytest.raises(WorkersError) as caught:
            workers_from({"MEGACPP_WORKERS": bad})
        assert (
            str(caught.value) == f"MEGACPP_WORKERS={bad!r}: a whole number of workers, at least 1"
        )


def test_workers_end_even_when_the_parent_defers_sigterm_as_dagster_does():
    # Dagster's run process defers SIGTERM/SIGINT; forked workers inherit that. A pool that
    # ends its workers by signal (terminate) then hung forever in a real run.
    script = """
import signal
from megacpp_pipeline.pipeline.executor import LocalExecutor
signal.signal(signal.SIGTERM, lambda *a: None)
signal.signal(signal.SIGINT, lambda *a: None)
for _ in range(5):
    assert list(LocalExecutor(2, cap=False).map(lambda j, x: x, None, range(8))) == list(range(8))
def bad(j, x):
    if x == 3:
        raise RuntimeError("a.hpp: refused")
    import time; time.sleep(0.2)
    return x
try:
    list(LocalExecutor(2, cap=False).map(bad, None, range(8)))
except RuntimeError as e:
    print("raised:", e)
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "raised: a.hpp: refused"


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return not any(line.startswith("State:\tZ") for line in f)  # a zombie has ended
    except OSError:
        return False


def test_a_light_pools_workers_end_when_their_process_ends_without_ending_them():
    # os._exit skips the finalizer that ends the pool (as a killed process would): the
    # workers must not wait on their task queue forever
    script = """
import os
from megacpp_pipeline.pipeline import executor
out = executor.LocalExecutor(2, cap=False).map_light(pow, 2, range(6))
assert list(out) == [1, 2, 4, 8, 16, 32]
print(" ".join(str(pid) for pid in executor._LIGHT[2]._processes))
os._exit(0)
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    workers = [int(pid) for pid in out.stdout.split()]
    assert len(workers) == 2
    deadline = time.monotonic() + 30
    while any(_running(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_running(pid) for pid in workers)


def test_polars_threads_are_seen_once_a_query_ran_and_not_before():
    # a fresh interpreter: this test process has run polars queries already
    script = (
        "import polars as pl\n"
        "from megacpp_pipeline.pipeline.parallel import polars_threads_run\n"
        "before = polars_threads_run()\n"
        "pl.DataFrame({'a': [1, 2, 2]}).group_by('a').len()\n"
        "print(before, polars_threads_run())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.split() == ["False", "True"]


def test_a_check_over_a_store_that_kept_manifests_stays_a_light_map(tmp_path: Path) -> None:
    """A store's verify job (the store itself) goes pickled to the light pool, or to Ray: a
    store that kept parsed manifests must still pickle, or every check over it would fork a
    pool of its own (and fail on Ray)."""
    import pyarrow as pa

    from megacpp_pipeline.storage.store import ShardStore, _verify_shards

    store = ShardStore(str(tmp_path), max_rows_per_shard=1)
    v = store.begin("deduped_files", None, code_version="t")
    schema = pa.schema([pa.field("n", pa.int64())])
    for source in range(200):  # a manifest of a table per source, parsed once and kept
        v.table(f"data:s{source:03d}", schema).write(pa.table({"n": [source]}, schema=schema))
    v.commit()
    manifest = store.latest("deduped_files")
    assert store.latest("deduped_files") is manifest
    job = (store, store.version_dir(manifest), True)
    assert executor_module._light_job(_verify_shards, job) is not None
    assert not store.verify(manifest, mapper=LocalExecutor(2).map_light)
