"""The ray engine for real: a two-node Ray cluster on loopback (`ray.cluster_utils.Cluster`,
both nodes on 127.0.0.1), `megacpp run --engine ray --ray-address` against it, compared
byte for byte with `--engine local`; and a worker node killed in the middle of a stage.
Run by `make test-slow` and `make test-cluster`; needs the `cluster` (or `ray`) extra."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml

# Ray rewrites a 127.0.0.1 cluster address to this host's own address before connecting,
# which a sandboxed host cannot reach; with Ray's "no real cluster" switch it keeps loopback
# (what a laptop gets by default). Read when ray is imported: set before that, here, for this
# process and the `megacpp run` processes it starts. The nodes themselves bind to 127.0.0.1.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
try:
    import ray
    from ray.cluster_utils import Cluster

    from megacpp_pipeline.pipeline.ray_engine import RayExecutor, connect, release
except ImportError:  # the ray (or cluster) extra; deselected tests then report no skip
    ray = None

from megacpp_pipeline.core.gate import GateResult
from megacpp_pipeline.corpus.dedup.config import DedupOrderError
from megacpp_pipeline.pipeline.context import SourceInputs, StageContext
from megacpp_pipeline.pipeline.engine import Engine, EngineKind
from megacpp_pipeline.pipeline.file_stage import GateInputsChanged
from megacpp_pipeline.pipeline.registry import Grain, PreparedGate, Registry, Stage
from megacpp_pipeline.pipeline.runner import checks_of, run_stage
from megacpp_pipeline.pipeline.task_error import TaskFailed
from megacpp_pipeline.stages import default_registry
from megacpp_pipeline.storage.store import NoVersionError, ShardStore
from tests.fixtures.catalogs import load_catalog
from tests.fixtures.failing_tasks import exits, out_of_order, refuse_unpicklably
from tests.fixtures.pipeline_corpus import write_catalog
from tests.fixtures.s3_server import CREDENTIALS as S3_CREDENTIALS
from tests.fixtures.s3_server import moto_bucket

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(
        ray is None, reason="ray is not installed (pip install -e '.[dev,cluster]')"
    ),
]
if ray is not None:
    # pytest imports this file as a top-level module the Ray workers cannot import: the slow
    # gate below travels by value
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

REPO = Path(__file__).resolve().parents[2]
MARKERS_ENV = "MEGACPP_TEST_RAY_MARKERS"


def two_node_cluster() -> Cluster:
    # Ray's workers must import this test module (the slow gate below) and see the markers
    # folder: both come from the environment the nodes are started with.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
    )
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False},
    )
    cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    cluster.wait_for_nodes()
    return cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    # the nodes' workers take their environment from here: the S3 test's keys for moto
    with pytest.MonkeyPatch.context() as mp:
        for key, value in S3_CREDENTIALS.items():
            mp.setenv(key, value)
        c = two_node_cluster()
        try:
            yield c
        finally:
            c.shutdown()


def megacpp_run(
    catalog: Path, data: Path | str, root: Path, *extra: str
) -> subprocess.CompletedProcess:
    env = dict(os.environ, DAGSTER_HOME=str(root / "dagster_home"), MEGACPP_WORKERS="2")
    env.pop("RAY_ADDRESS", None)
    cache = root / f"cache-{data.name if isinstance(data, Path) else 's3'}"
    return subprocess.run(
        [sys.executable, "-m", "assets.cli", "run", "--config", str(catalog),
         "--data-dir", str(data), "--cache-dir", str(cache), *extra],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip


def tree_sha256(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.parent.name in ("train", "validation")
    }


@pytest.fixture(scope="module")
def both_runs(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("parity")
    catalog, _ = write_catalog(root)
    local = megacpp_run(catalog, root / "local", root, "--engine", "local")
    assert local.returncode == 0, local.stderr[-3000:]
    on_ray = megacpp_run(
        catalog, root / "ray", root, "--engine", "ray", "--ray-address", cluster.address
    )
    assert on_ray.returncode == 0, on_ray.stderr[-3000:]
    return {
        "local": Path(local.stdout.strip().splitlines()[-1]),
        "ray": Path(on_ray.stdout.strip().splitlines()[-1]),
        "store": ShardStore(str(root / "ray")),
        "local_store": ShardStore(str(root / "local")),
        "catalog": catalog,
        "root": root,
    }


def test_the_ray_engine_promotes_the_same_snapshot_with_byte_identical_rows(both_runs: dict):
    local, on_ray = both_runs["local"], both_runs["ray"]
    assert on_ray.name == local.name  # the id is a hash of every file of the snapshot
    rows = tree_sha256(local)
    assert rows and any(k.startswith("train/") for k in rows)
    assert tree_sha256(on_ray) == rows


def test_every_per_file_version_records_its_engine_and_both_nodes_did_work(both_runs: dict):
    store, registry = both_runs["store"], default_registry()
    catalog = load_catalog(both_runs["catalog"], registry)
    tasks: Counter[str] = Counter()
    busy: Counter[str] = Counter()
    per_file = [s for s in registry if s.gate is not None and s.per_source]
    assert len(per_file) >= 8
    for stage in per_file:
        for source in catalog.operational:
            m = store.latest(stage.name, source.id)
            assert m.extra["engine"] == "ray", (stage.name, m.extra)
            local = both_runs["local_store"].latest(stage.name, source.id)
            assert local.extra["engine"] == "local"
            assert m.rows == local.rows and m.stats == local.stats | {
                "cached_files": m.stats["cached_files"]
            }, stage.name
            for node, work in m.extra["engine_nodes"].items():
                tasks[node] += work["tasks"]
                busy[node] += work["busy_s"]
    assert len(tasks) == 2, tasks  # the head node and the worker node
    assert all(n > 0 for n in tasks.values()) and all(s > 0 for s in busy.values()), busy


def test_every_corpus_wide_stage_maps_its_work_over_both_nodes(both_runs: dict):
    """Decontamination, the tokenizer's sample, documents and packing run as tasks too, with
    the local engine's output."""
    store, local_store = both_runs["store"], both_runs["local_store"]
    for name in ("decontaminated_files", "documents", "packed_rows"):
        m, local = store.latest(name, None), local_store.latest(name, None)
        assert m.extra["engine"] == "ray" and local.extra["engine"] == "local", name
        # tasks, not the driver, did the work (a handful of tiny tasks may all land on one
        # node: Ray places them where a worker is free)
        tasks = sum(n["tasks"] for n in m.extra["engine_nodes"].values())
        assert tasks >= 2 and "driver" not in m.extra["engine_nodes"], (name, m.extra)
        assert m.rows == local.rows, name
        for table in m.data_tables():
            assert m.tables[table].rows == local.tables[table].rows, (name, table)
            if m.tables[table].rows:
                assert store.read_table(m, table).equals(local_store.read_table(local, table))


def test_dedup_signs_and_bands_on_the_cluster_with_the_local_engines_decisions(both_runs: dict):
    store, local_store = both_runs["store"], both_runs["local_store"]
    m, local = store.latest("deduped_files", None), local_store.latest("deduped_files", None)
    assert m.extra["engine"] == "ray" and local.extra["engine"] == "local"
    # one signing task per slice of every input shard, one band task per partition, both
    # nodes used; the scratch under _work is gone before the commit
    assert m.extra["sign_tasks"] >= m.stats["shards"] >= 2, m.extra
    assert m.extra["band_partitions"] >= 2, m.extra  # at least one per CPU of the cluster
    assert len(m.extra["engine_nodes"]) == 2, m.extra["engine_nodes"]
    assert not list(Path(store.version_dir(m)).glob("_work*"))
    for table in ("decisions", "clusters", "ledger"):
        assert store.read_table(m, table).equals(local_store.read_table(local, table)), table
    assert m.stats == local.stats | {"cached_files": m.stats["cached_files"]}
    assert m.rows == local.rows
    assert m.stats["dropped_near_duplicate"] + m.stats["dropped_exact_duplicate"] > 0


def test_run_tags_name_the_engine(both_runs: dict) -> None:
    import dagster as dg

    instance = dg.DagsterInstance.from_config(str(both_runs["root"] / "dagster_home"))
    try:
        runs = instance.get_runs()
        engines = Counter(r.tags.get("megacpp/engine") for r in runs)
        assert engines == {"local": 5, "ray": 5}, engines
    finally:
        instance.dispose()


def test_an_unknown_engine_or_an_address_without_ray_is_refused() -> None:
    with pytest.raises(ValueError, match="engine 'spark': expected one of local, ray"):
        Engine.choose("spark", None, {})
    with pytest.raises(ValueError, match="with the local engine"):
        Engine.choose("local", "127.0.0.1:6379", {})
    assert Engine.choose("ray", "127.0.0.1:6379", {}).kind is EngineKind.RAY


# --- a worker node killed in the middle of a stage ------------------------------------------
def _slow_gate(inputs: SourceInputs) -> PreparedGate:
    markers = Path(os.environ[MARKERS_ENV])

    def gate(table: pa.Table) -> GateResult:
        node = ray.get_runtime_context().get_node_id()
        (markers / f"{node}-{uuid.uuid4().hex}").touch()
        time.sleep(1.5)  # long enough to be running when the node goes
        return GateResult(kept=table)

    return PreparedGate(gate)


SLOW = Stage(
    name="slow_files",
    grain=Grain.PER_SOURCE,
    group="gates",
    description="Every file, slowly (a stage to kill a node under).",
    code=(__name__,),
    schema=default_registry().get("raw_files").schema,
    content_column="blob_sha",
    writes_ledger=True,
    gate=_slow_gate,
)


def test_a_worker_node_killed_mid_stage_is_retried_and_the_version_is_the_same(
    tmp_path: Path,
) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    os.environ[MARKERS_ENV] = str(markers)
    catalog, _ = write_catalog(tmp_path)
    registry: Registry = default_registry().insert(SLOW, after="raw_files")
    store = ShardStore(str(tmp_path / "data"))

    def ctx(engine: Engine, cache: str) -> StageContext:
        return StageContext(
            catalog=load_catalog(catalog, registry), store=store, registry=registry,
            cache_dir=tmp_path / cache, workers=1, engine=engine,
        )  # fmt: skip

    local = ctx(Engine(), "cache-local")
    list(run_stage(local, registry.get("raw_files"), local.partitions("raw_files")))
    expected = {
        s: store.read_table(store.latest("raw_files", s))
        for s in local.sources()  # the slow gate keeps every row
    }
    c = two_node_cluster()
    try:
        worker = next(n for n in c.list_all_nodes() if n is not c.head_node)
        worker_id = worker.node_id
        # 1-row slices: a dozen tasks of 1.5 s, so the worker node is busy when it dies
        on_ray = ctx(Engine(EngineKind.RAY, c.address, task_bytes=1), "cache-ray")
        connect(on_ray.engine, 1)  # from this (the main) thread
        done: list = []
        failed: list[BaseException] = []

        def run() -> None:
            try:
                slow = registry.get(SLOW.name)  # as inserted: reading raw_files
                done.extend(run_stage(on_ray, slow, on_ray.partitions(slow)))
            except BaseException as e:
                failed.append(e)

        thread = threading.Thread(target=run)
        thread.start()
        deadline = time.monotonic() + 120
        while not any(m.name.startswith(worker_id) for m in markers.iterdir()):
            assert time.monotonic() < deadline and thread.is_alive(), failed
            time.sleep(0.1)
        c.remove_node(worker)  # its raylet and workers are killed
        thread.join(timeout=600)
        assert not thread.is_alive() and not failed, failed
    finally:
        release()
        c.shutdown()
    assert [d.partition for d in done] == local.sources()
    for source, table in expected.items():
        m = store.latest("slow_files", source)
        assert store.verify(m) == []
        assert store.read_table(m).equals(table), source
        assert int(m.stats["input_files"]) == table.num_rows == m.rows
    ran_on = {m.name.split("-", 1)[0] for m in markers.iterdir()}
    assert worker_id in ran_on and len(ran_on) == 2  # it did start work, then died


def _settled_count(folder: Path, quiet_s: float = 3.0, guard_s: float = 120.0) -> int:
    """How many files `folder` holds once none has appeared for `quiet_s` (a slice lasts
    1.5 s); `guard_s` is a hang guard."""
    count, since, start = -1, time.monotonic(), time.monotonic()
    while time.monotonic() - since < quiet_s:
        assert time.monotonic() - start < guard_s, "the markers never settled"
        now = len(list(folder.iterdir()))
        if now != count:
            count, since = now, time.monotonic()
        time.sleep(0.1)
    return count


_DRIVER = """
import sys
import tempfile
from pathlib import Path
sys.path.insert(0, {here!r})
import test_ray_engine as t
from tests.fixtures.catalogs import load_catalog
from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.engine import Engine, EngineKind
from megacpp_pipeline.pipeline.runner import checks_of, run_stage
from megacpp_pipeline.pipeline.task_error import TaskFailed
from megacpp_pipeline.stages import default_registry
from megacpp_pipeline.storage.store import ShardStore

registry = default_registry().insert(t.SLOW, after="raw_files")
ctx = StageContext(
    catalog=load_catalog({catalog!r}, registry), store=ShardStore({data!r}), registry=registry,
    cache_dir=Path({cache!r}), workers=1, engine=Engine(EngineKind.RAY, {address!r}, task_bytes=1),
)
slow = registry.get("slow_files")
for done in run_stage(ctx, slow, ctx.partitions(slow)):
    print("committed", done.partition, flush=True)
"""


def test_a_killed_driver_leaves_the_last_version_whole_and_a_rerun_reuses_finished_slices(
    tmp_path: Path,
) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    os.environ[MARKERS_ENV] = str(markers)
    catalog, _ = write_catalog(tmp_path)
    registry: Registry = default_registry().insert(SLOW, after="raw_files")
    data, cache = tmp_path / "data", tmp_path / "cache-ray"
    store = ShardStore(str(data))
    local = StageContext(
        catalog=load_catalog(catalog, registry), store=store, registry=registry,
        cache_dir=tmp_path / "cache-local", workers=1,
    )  # fmt: skip
    list(run_stage(local, registry.get("raw_files"), local.partitions("raw_files")))
    rows = sum(store.latest("raw_files", s).rows for s in local.sources())
    c = two_node_cluster()
    try:
        script = _DRIVER.format(
            here=str(Path(__file__).parent), catalog=str(catalog), data=str(data),
            cache=str(cache), address=c.address,
        )  # fmt: skip
        driver = subprocess.Popen([sys.executable, "-c", script], cwd=REPO)
        deadline = time.monotonic() + 180
        # on 2 CPUs a 3rd slice starts only once one has finished (and cached its files)
        while len(list(markers.iterdir())) < 3:
            assert time.monotonic() < deadline and driver.poll() is None
            time.sleep(0.1)
        driver.kill()
        driver.wait(timeout=60)
        started_first = _settled_count(markers)  # Ray ends the dead driver's tasks
        assert started_first < rows  # killed before the stage was done
        # nothing half-written is visible: no version of the stage, or only whole ones
        for source in local.sources():
            if store.has_version("slow_files", source):
                assert store.verify(store.latest("slow_files", source)) == []
        rerun = StageContext(
            catalog=load_catalog(catalog, registry), store=store, registry=registry,
            cache_dir=cache, workers=1, engine=Engine(EngineKind.RAY, c.address, task_bytes=1),
        )  # fmt: skip
        connect(rerun.engine, 1)
        slow = registry.get(SLOW.name)
        done = list(run_stage(rerun, slow, rerun.partitions(slow)))
    finally:
        release()
        c.shutdown()
    assert [d.partition for d in done] == local.sources()
    cached = sum(int(d.stats["cached_files"]) for d in done)
    assert cached > 0  # slices the killed driver's tasks finished are not gated again
    assert len(list(markers.iterdir())) - started_first == rows - cached
    for source in local.sources():
        m = store.latest("slow_files", source)
        assert store.verify(m) == []
        assert store.read_table(m).equals(store.read_table(store.latest("raw_files", source)))


# --- the parity: ray engine + object store against local engine + local dir ----------
def test_ray_engine_with_the_store_on_s3_promotes_the_local_runs_snapshot(
    cluster: Cluster, both_runs: dict, tmp_path: Path
) -> None:
    pytest.importorskip("moto.server", reason="moto[server] is not installed")
    with moto_bucket("megacpp-ray") as endpoint:
        uri = f"s3://megacpp-ray/run?endpoint_override={endpoint}&scheme=http"
        out = megacpp_run(
            both_runs["catalog"], uri, tmp_path, "--engine", "ray",
            "--ray-address", cluster.address,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
        printed = out.stdout.strip().splitlines()[-1]
        local = both_runs["local"]
        assert printed == f"s3://megacpp-ray/run/snapshots/{local.name}"
        store = ShardStore(uri)
        remote_dir = store.join("snapshots", local.name)
        for rel, sha in tree_sha256(local).items():  # every train/validation shard
            got = hashlib.sha256(store.read_bytes(f"{remote_dir}/{rel}")).hexdigest()
            assert got == sha, rel
        m = store.latest("tokenized_docs", "repo")
        assert m.extra["engine"] == "ray" and store.verify(m) == []


def test_a_source_with_nothing_to_gate_gets_a_complete_empty_version_on_ray(
    cluster: Cluster, tmp_path: Path
) -> None:
    catalog, _ = write_catalog(tmp_path)
    (tmp_path / "empty").mkdir()  # collects zero files
    empty = "  - id: empty\n    kind: dir\n    uri: empty\n    declared_license: MIT\n"
    text = catalog.read_text().replace("split:", empty + "split:")
    catalog.write_text(text)
    registry = default_registry()
    store = ShardStore(str(tmp_path / "data"))
    ctx = StageContext(
        catalog=load_catalog(catalog, registry), store=store, registry=registry,
        cache_dir=tmp_path / "cache", workers=1,
        engine=Engine(EngineKind.RAY, cluster.address),
    )  # fmt: skip
    assert ctx.sources() == ["tree", "repo", "empty"]
    list(run_stage(replace(ctx, engine=Engine()), registry.get("raw_files"), ctx.sources()))
    connect(ctx.engine, 1)
    try:
        stage = registry.get("normalized_files")
        done = {d.partition: d for d in run_stage(ctx, stage, ctx.sources())}
        outcomes = [c.evaluate(ctx, stage, "empty") for c in checks_of(stage)]
    finally:
        release()
    m = store.latest("normalized_files", "empty")
    assert m.rows == 0 and m.stats["input_files"] == 0 and m.stats["kept_files"] == 0
    assert {"data", "ledger"} <= m.tables.keys() and store.verify(m) == []
    assert m.extra["engine"] == "ray" and m.extra["engine_nodes"] == {}
    assert done["empty"].stats["input_files"] == 0 and done["tree"].stats["input_files"] > 0
    assert all(o.passed for o in outcomes), [o.description for o in outcomes]


@pytest.mark.parametrize("only_empty", [False, True])
def test_dedup_on_ray_with_an_empty_source_or_no_file_at_all_matches_the_local_engine(
    cluster: Cluster, tmp_path: Path, only_empty: bool
) -> None:
    catalog, _ = write_catalog(tmp_path)
    (tmp_path / "empty").mkdir()  # collects zero files
    data = yaml.safe_load(catalog.read_text())
    empty = {"id": "empty", "kind": "dir", "uri": "empty", "declared_license": "MIT"}
    # only_empty: the catalog's own sources go; only the empty one is left
    data["sources"] = [empty] if only_empty else [*data["sources"], empty]
    catalog.write_text(yaml.safe_dump(data, sort_keys=False))
    registry = default_registry()
    store = ShardStore(str(tmp_path / "data"))
    local = StageContext(
        catalog=load_catalog(catalog, registry), store=store, registry=registry,
        cache_dir=tmp_path / "cache", workers=1,
    )  # fmt: skip
    for stage in registry:
        if stage.name == "deduped_files":
            break
        list(run_stage(local, stage, local.partitions(stage)))
    dedup_stage = registry.get("deduped_files")
    list(run_stage(local, dedup_stage, [None]))
    by_local = store.latest("deduped_files")
    # reuse off: the local version's inputs are the ray run's, so it would stand
    on_ray = replace(local, engine=Engine(EngineKind.RAY, cluster.address), reuse=False)
    connect(on_ray.engine, 1)
    try:
        list(run_stage(on_ray, dedup_stage, [None]))
        outcomes = [c.evaluate(on_ray, dedup_stage, None) for c in checks_of(dedup_stage)]
    finally:
        release()
    m = store.latest("deduped_files")
    assert m.version != by_local.version and m.extra["engine"] == "ray"
    # the ray run finds the local run's signatures in the shared cache: only that differs
    assert m.stats == by_local.stats | {"cached_files": m.stats["cached_files"]}
    assert store.verify(m) == []
    assert "data:empty" in m.tables and m.tables["data:empty"].rows == 0
    decisions = [list(store.iter_tables(v, "decisions")) for v in (m, by_local)]
    assert [t.to_pylist() for t in decisions[0]] == [t.to_pylist() for t in decisions[1]]
    assert not list(Path(store.version_dir(m)).glob("_work*"))
    if only_empty:
        assert m.rows == 0 and m.extra["sign_tasks"] == 0
        # an empty version is sound; only the check that stops a run on nothing fails
        verdicts = {c.name: o.passed for c, o in zip(checks_of(dedup_stage), outcomes, strict=True)}
        assert verdicts.pop("some_file_is_left") is False
        assert verdicts and all(verdicts.values()), verdicts
    else:
        assert m.rows > 0 and all(o.passed for o in outcomes), [o.description for o in outcomes]


# --- a Ray worker that dies in every corpus-wide map -----------------------------------------
def _dies_once_on_ray(task: Any, marker: str, job: Any, item: Any) -> Any:
    """`task`, except that the first of its map's tasks to start kills its Ray worker
    process (os._exit: no cleanup, no exception); Ray runs the task again elsewhere."""
    try:
        Path(marker).touch(exist_ok=False)
    except FileExistsError:
        return task(job, item)
    os._exit(1)


if ray is not None:

    class _KillingRay(RayExecutor):
        def __init__(self, engine: Engine, markers: Path) -> None:
            super().__init__(engine, 1)
            self.markers = markers

        def map_timed(self, task: Any, job: Any, items: Any) -> Any:
            name = f"{getattr(task, '__qualname__', 'task')}-{uuid.uuid4().hex}"
            killing = partial(_dies_once_on_ray, task, str(self.markers / name))
            return super().map_timed(killing, job, items)


@dataclass
class _KillingContext(StageContext):
    markers: Path | None = None

    def executor(self) -> Any:
        assert self.markers is not None
        return _KillingRay(self.engine, self.markers)


def test_a_ray_worker_killed_in_every_corpus_wide_map_is_retried_to_the_local_versions(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Dedup's four maps, decontamination, the tokenizer's sample, documents and packing
    each lose a worker on the two-node cluster; every version equals the local engine's."""
    catalog, _ = write_catalog(tmp_path)
    registry = default_registry()
    markers = tmp_path / "markers"
    markers.mkdir()

    def ctx(data: str, engine: Engine) -> StageContext:
        return StageContext(
            catalog=load_catalog(catalog, registry), store=ShardStore(str(tmp_path / data)),
            registry=registry, cache_dir=tmp_path / f"cache-{data}", workers=2, engine=engine,
        )  # fmt: skip

    local = ctx("local", Engine(task_bytes=4096))
    on_ray = ctx("ray", Engine(EngineKind.RAY, cluster.address, task_bytes=4096))
    fields = {f: getattr(on_ray, f) for f in on_ray.__dataclass_fields__}
    on_ray_killing = _KillingContext(**fields, markers=markers)
    wanted = ("deduped_files", "decontaminated_files", "tokenizer", "documents", "packed_rows")
    try:
        for stage in registry:
            list(run_stage(local, stage, local.partitions(stage)))
            run_with = on_ray_killing if stage.name in wanted else replace(on_ray, engine=Engine())
            list(run_stage(run_with, stage, run_with.partitions(stage)))
            if stage.name == "packed_rows":
                break
    finally:
        release()
    killed = {m.name.rsplit("-", 1)[0] for m in markers.iterdir()}
    for task in ("sign_task", "exact_task", "band_task", "apply_task", "gate_slice",
                 "_train_bytes_task", "_sample_task", "_file_task", "_pack_task"):  # fmt: skip
        assert task in killed, (task, sorted(killed))
    for name in wanted:
        m, base = on_ray.store.latest(name, None), local.store.latest(name, None)
        for table in m.tables:
            assert m.tables[table].rows == base.tables[table].rows, (name, table)
            if m.tables[table].rows:
                got = on_ray.store.read_table(m, table)
                assert got.equals(local.store.read_table(base, table)), (name, table)
        assert [f.sha256 for f in m.files] == [f.sha256 for f in base.files], name


# --- a task's error, and a local instance beside a cluster ----------------------------------
@pytest.fixture
def local_instance() -> Iterator[RayExecutor]:
    """The ray engine with no address: a local Ray instance of two CPUs, ended after."""
    try:
        yield RayExecutor(Engine(EngineKind.RAY), 2)
    finally:
        release()


def test_a_gate_error_on_ray_reaches_the_driver_with_its_own_type(local_instance: RayExecutor):
    with pytest.raises(DedupOrderError) as raised:
        list(local_instance.map(out_of_order, None, range(6)))
    assert type(raised.value) is DedupOrderError  # not Ray's wrapper, not a lost type
    assert str(raised.value) == "tree:src/a.cc: paths must increase in a source"
    assert "out_of_order" in str(raised.value.__cause__)  # the worker's traceback


def test_an_error_that_does_not_pickle_on_ray_is_raised_naming_its_type_and_message(
    local_instance: RayExecutor,
):
    with pytest.raises(TaskFailed) as raised:
        list(local_instance.map(refuse_unpicklably, None, range(6)))
    assert raised.value.type_name.endswith(".Unpicklable")
    assert str(raised.value).endswith(
        ".Unpicklable: include/a4.hpp: refused by a gate whose error does not pickle"
    )


def test_a_task_that_exits_on_ray_fails_its_map_once_not_as_a_dead_worker(
    local_instance: RayExecutor,
):
    """Ray took the exit for its worker's death and ran the task four times, the message
    left in the raylet's log."""
    with pytest.raises(TaskFailed, match=r"builtins.SystemExit: an argparse-like exit"):
        list(local_instance.map(exits, None, range(4)))


def test_with_no_address_the_engine_starts_its_own_instance_beside_a_hosts_cluster(
    local_instance: RayExecutor,
):
    """A `ray start` cluster on the host (Ray records it in /tmp/ray/ray_current_cluster)
    is not joined by a run that gave no address: it gets its own local instance."""
    hosts = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False},
    )
    try:
        assert local_instance.workers == 2  # its own two CPUs, not the cluster's one
        assert list(local_instance.map(out_of_order, None, range(3))) == [0, 1, 2]
        assert ray.get_runtime_context().gcs_address != hosts.address
    finally:
        release()
        hosts.shutdown()


# --- a gate prepared on a Ray worker is the driver's ----------------------------------------
def test_a_request_file_edited_while_the_stage_runs_on_ray_is_refused_not_half_applied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver prepares the removals gate from the request file as it is, and records
    that in the version's inputs; a Ray worker prepares its own gate and must refuse when
    the file has changed since, instead of committing removals the inputs do not record."""
    catalog, _ = write_catalog(tmp_path)
    request = tmp_path / "requests.jsonl"
    request.write_text("")  # nothing to remove when the stage starts
    data = yaml.safe_load(catalog.read_text())
    data["removals"] = [{"file": request.name}]
    catalog.write_text(yaml.safe_dump(data, sort_keys=False))
    registry = default_registry()
    ctx = StageContext(
        load_catalog(catalog, registry), ShardStore(str(tmp_path / "data")), registry,
        tmp_path / "cache", workers=2, engine=Engine(task_bytes=4096),
    )  # fmt: skip
    stage = registry.get("removed_files")
    for s in registry:
        if s is stage:
            break
        list(run_stage(ctx, s, ctx.partitions(s)))
    on_ray = replace(ctx, engine=Engine(EngineKind.RAY, task_bytes=4096))
    map_timed = RayExecutor.map_timed

    def edited_meanwhile(self: RayExecutor, task: Any, job: Any, items: Any) -> Any:
        # after the driver prepared its gates, before any task prepares its own
        takedown = {"source": "tree", "path": "src/lib0.cc", "reason": "takedown"}
        request.write_text(json.dumps(takedown) + "\n")
        return map_timed(self, task, job, items)

    try:
        with monkeypatch.context() as patched:
            patched.setattr(RayExecutor, "map_timed", edited_meanwhile)
            with pytest.raises(GateInputsChanged, match=r"removed_files \[tree\]: .* salt"):
                list(run_stage(on_ray, stage, ["tree"]))
        with pytest.raises(NoVersionError):  # nothing was committed
            ctx.store.latest("removed_files", "tree")
        # with the file as the driver reads it, the tasks' gates agree and the stage commits
        list(run_stage(on_ray, stage, ["tree"]))
    finally:
        release()
    m = ctx.store.latest("removed_files", "tree")
    assert "src/lib0.cc" not in ctx.store.read_table(m, "data")["path"].to_pylist()


# --- with no address, one local instance for the whole `megacpp run` ------------------------
def test_with_no_address_every_run_joins_one_local_instance_that_ends_with_the_command(
    both_runs: dict, tmp_path: Path
) -> None:
    """Each Dagster run of `megacpp run --engine ray` started (and ended) a local Ray
    instance of its own: seconds of wall a run group. One is started for the command, every
    run joins it, and it is gone when the command ends; the rows are the local engine's."""
    sessions = Path(tempfile.gettempdir()) / "ray"
    before = set(sessions.glob("session_2*")) if sessions.exists() else set()
    run = megacpp_run(both_runs["catalog"], tmp_path / "data", tmp_path, "--engine", "ray")
    assert run.returncode == 0, run.stderr[-3000:]
    started = set(sessions.glob("session_2*")) - before
    assert len(started) == 1, sorted(p.name for p in started)  # not one per run group
    snapshot = Path(run.stdout.strip().splitlines()[-1])
    assert tree_sha256(snapshot) == tree_sha256(both_runs["local"])
    store = ShardStore(str(tmp_path / "data"))
    assert store.latest("normalized_files", "tree").extra["engine"] == "ray"
    holders = subprocess.run(
        ["pgrep", "-f", "megacpp_pipeline.pipeline.ray_holder"], capture_output=True, text=True
    )
    assert holders.stdout.strip() == "", "the holder outlived the command"
