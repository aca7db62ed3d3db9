"""A stage body that fails in the driver while its map still runs (documents, packing, dedup,
the tokenizer's training) ends the map's workers before its version is aborted: none is left
running, and none writes into the aborted version afterwards, even while the error (and so
the failed body's frames) is still held, as a caller that reports or chains it holds it."""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from megacpp_pipeline.corpus.dedup import work as dedup_work
from megacpp_pipeline.corpus.dedup.config import DedupOrderError
from megacpp_pipeline.pipeline import executor as executor_module
from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.engine import Engine
from megacpp_pipeline.pipeline.executor import Executor, LocalExecutor
from megacpp_pipeline.pipeline.runner import run_stage
from megacpp_pipeline.stages import tokenizer as tokenizer_stage
from megacpp_pipeline.storage.store import TableWriter
from tests.fixtures.pipeline_corpus import write_catalog
from tests.fixtures.stage_runs import context


def _slowly(task: Any, job: Any, item: Any) -> Any:
    time.sleep(0.2)  # every task still running, or queued, when the first result is out
    return task(job, item)


class SlowExecutor(LocalExecutor):
    """Forked workers whose every task takes a while."""

    def map_timed(self, task: Any, job: Any, items: Any) -> Any:
        return super().map_timed(partial(_slowly, task), job, items)


@dataclass
class SlowContext(StageContext):
    def executor(self) -> Executor:
        return SlowExecutor(2, cap=False)


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> StageContext:
    """Every stage up to packing run once, in small slices: each body below maps several
    tasks."""
    root = tmp_path_factory.mktemp("body_failure")
    catalog, _ = write_catalog(root)
    ctx = context(root, catalog, "first", workers=2, engine=Engine(task_bytes=4096))
    for stage in ctx.registry:
        list(run_stage(ctx, stage, ctx.partitions(stage)))
        if stage.name == "packed_rows":
            break
    return ctx


def _fail_in_driver(monkeypatch: pytest.MonkeyPatch, stage: str) -> type[BaseException]:
    """A failure of the driver's own at the body's first result (what it raises)."""
    driver = os.getpid()
    if stage in ("documents", "packed_rows"):

        def adopt(self: TableWriter, *args: Any) -> None:
            raise RuntimeError("adopting a shard failed")

        monkeypatch.setattr(TableWriter, "adopt", adopt)
        return RuntimeError
    if stage == "deduped_files":
        check = dedup_work.StreamOrder.check

        def out_of_order(self: Any, *args: Any) -> None:
            if os.getpid() == driver:  # a task checks its own slice's order too
                raise DedupOrderError("tree", "src/a.cc", "paths must increase in a source")
            check(self, *args)

        monkeypatch.setattr(dedup_work.StreamOrder, "check", out_of_order)
        return DedupOrderError
    assert stage == "tokenizer"
    sizes: Callable[..., int] = tokenizer_stage._train_bytes_task

    def no_size_first(job: Any, pieces: Any) -> Any:
        return "no size" if pieces[0].lo == 0 else sizes(job, pieces)  # a shard's first slice

    monkeypatch.setattr(tokenizer_stage, "_train_bytes_task", no_size_first)
    return TypeError  # the driver's sum of the sizes


def _versions(ctx: StageContext, stage: str) -> set[str]:
    folder = Path(ctx.store.partition_dir(stage, None))
    return {p.name for p in folder.iterdir() if p.is_dir()} if folder.exists() else set()


def _light_workers() -> set[int]:
    light = executor_module._LIGHT
    return set(light[2]._processes or {}) if light is not None else set()


@pytest.mark.parametrize("stage", ["documents", "packed_rows", "deduped_files", "tokenizer"])
def test_a_body_failing_while_its_map_runs_leaves_no_worker_writing(
    ran: StageContext, stage: str, monkeypatch: pytest.MonkeyPatch
):
    fields = {f: getattr(ran, f) for f in ran.__dataclass_fields__}
    ctx = SlowContext(**{**fields, "run_id": f"failing-{stage}", "reuse": False})
    s = ctx.registry.get(stage)
    before = _versions(ctx, stage)
    children = {p.pid for p in multiprocessing.active_children()}
    raises = _fail_in_driver(monkeypatch, stage)
    with pytest.raises(raises) as failed:  # kept: the failed body's frames stay alive
        list(run_stage(ctx, s, ctx.partitions(s)))
    monkeypatch.undo()
    left = {p.pid for p in multiprocessing.active_children()} - children - _light_workers()
    assert left == set(), f"{stage}: workers still running after the body failed"
    time.sleep(1.0)  # what a worker left running would write meanwhile
    assert _versions(ctx, stage) == before, f"{stage}: a worker wrote into the aborted version"
    assert failed.value is not None
