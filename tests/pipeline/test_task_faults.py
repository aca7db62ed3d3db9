"""A map task killed in every stage that maps tasks (the per-file gates, collection, dedup's
four steps and the clearing of its work folder, decontamination, the tokenizer's sample,
documents, packing, the checks that rescan rows, the snapshot's single files, copies and
checks, the Megatron export) is run again, and the run promotes the same snapshot as a run
where no task died."""

from __future__ import annotations

import itertools
import os
import signal
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from megacpp_pipeline.collect import directory
from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.engine import Engine
from megacpp_pipeline.pipeline.executor import Executor, LocalExecutor
from megacpp_pipeline.pipeline.runner import run_all
from megacpp_pipeline.snapshot.promote import latest_snapshot
from megacpp_pipeline.stages import default_registry
from megacpp_pipeline.storage.store import ShardStore
from tests.fixtures.catalogs import load_catalog
from tests.fixtures.pipeline_corpus import write_catalog


def _dies_once(task: Any, marker: Path, driver: int, job: Any, item: Any) -> Any:
    """`task`, except that the first task of its map to start in a worker kills that
    worker (SIGKILL: no cleanup, no exception) before doing anything."""
    if os.getpid() != driver:
        try:
            marker.touch(exist_ok=False)
        except FileExistsError:
            pass
        else:
            os.kill(os.getpid(), signal.SIGKILL)
    return task(job, item)


_MAPS = itertools.count()


class KillingExecutor(LocalExecutor):
    """Forked workers, one of which dies at the start of every map that forks."""

    def __init__(self, workers: int, markers: Path) -> None:
        super().__init__(workers, cap=False)
        self.markers = markers

    def map_timed(self, task: Any, job: Any, items: Any) -> Any:
        # `map` comes here too; the per-file gates call map_timed themselves
        name = f"{getattr(task, '__qualname__', 'task')}-{next(_MAPS):04d}"
        killing = partial(_dies_once, task, self.markers / name, os.getpid())
        return super().map_timed(killing, job, items)

    def run_apart(self, task: Any, job: Any, item: Any) -> Any:
        # a step in a worker of its own (the promotion checks, the card): it dies once
        name = f"{getattr(task, '__qualname__', 'task')}-{next(_MAPS):04d}"
        killing = partial(_dies_once, task, self.markers / name, os.getpid())
        return super().run_apart(killing, job, item)

    def map_light(self, task: Any, job: Any, items: Any) -> Any:
        # the checks' maps: a worker of the process's long-lived pool dies, and a new pool
        # runs the rest (the wrapped task pickles: a partial of module-level names)
        name = f"{getattr(task, '__qualname__', 'task')}-{next(_MAPS):04d}"
        killing = partial(_dies_once, task, self.markers / name, os.getpid())
        return super().map_light(killing, job, items)


@dataclass
class KillingContext(StageContext):
    markers: Path | None = None

    def executor(self) -> Executor:
        assert self.markers is not None
        return KillingExecutor(2, self.markers)

    def host_executor(self) -> Executor:
        return self.executor()


def _run(root: Path, catalog: Path, markers: Path | None) -> Path:
    registry = default_registry()
    ctx = StageContext(
        load_catalog(catalog, registry),
        ShardStore(str(root / "data")),
        registry,
        root / "cache",
        workers=2,
        engine=Engine(task_bytes=4096),  # small slices: every map has several tasks
    )
    if markers is not None:
        fields = {f: getattr(ctx, f) for f in ctx.__dataclass_fields__}
        ctx = KillingContext(**fields, markers=markers)
    run_all(ctx)
    snap = latest_snapshot(root / "data")
    assert snap is not None
    return snap


@pytest.mark.slow
def test_a_task_killed_in_every_map_is_rerun_and_the_snapshot_is_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    catalog, _ = write_catalog(tmp_path)
    # the directory source in slices of a few files: several digest and collect tasks
    monkeypatch.setattr(directory, "SLICE_FILES", 4)
    data = yaml.safe_load(catalog.read_text())
    # windows of a few documents: several packing blocks and rows shards to kill tasks in
    data.setdefault("stages", {})["packing"] = {"window_docs": 3, "windows_per_task": 1}
    catalog.write_text(yaml.safe_dump(data))
    clean = _run(tmp_path / "clean", catalog, None)
    markers = tmp_path / "markers"
    markers.mkdir()
    chaos = _run(tmp_path / "chaos", catalog, markers)
    assert chaos.name == clean.name  # the id hashes every file of the snapshot
    killed = {m.name.rsplit("-", 1)[0] for m in markers.iterdir()}
    # every kind of map task died at least once and was run again
    for task in (
        "gate_slice",
        "_first_task",  # collection: a directory's walk, or a git source whole
        "_digest_task",  # a directory slice hashed for the revision
        "_collect_task",  # a directory slice read and written
        "sign_task",
        "exact_task",
        "band_task",
        "apply_task",
        "clear_task",  # dedup's work folder, a folder a task
        "_sample_task",
        "_file_task",
        "_pack_task",
        "_inspect_task",
        "_verify_shards",
        "file_facts",
        "_copy_shard",
        "_scatter_shard",
        "_write_single",  # a snapshot's single file
        "_checks_apart",  # the promotion checks in a worker of their own
        "_card_apart",  # the dataset card in a worker of its own
    ):
        assert task in killed, (task, sorted(killed))
