"""The dedup stage's blocking check, `no_two_kept_files_share_a_hash`, with the kept hashes
shuffled into partitions counted by tasks: a real version passes whatever the number of
partitions, a kept hash that appears twice (in two sources' tables) is named, and the
check's scratch folder is gone afterwards, pass or fail."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from megacpp_pipeline.core.ledger import LEDGER_SCHEMA
from megacpp_pipeline.core.schemas import DEDUPED_FILES
from megacpp_pipeline.corpus import dedup as dedup_lib
from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.registry import CheckOutcome
from megacpp_pipeline.pipeline.runner import checks_of, run_stage
from megacpp_pipeline.stages import dedup, default_registry, names
from megacpp_pipeline.storage.store import ShardStore
from tests.fixtures.catalogs import load_catalog
from tests.fixtures.pipeline_corpus import write_catalog

CHECK = "no_two_kept_files_share_a_hash"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> StageContext:
    tmp = tmp_path_factory.mktemp("dedup-check")
    catalog, _ = write_catalog(tmp)
    registry = default_registry()
    ctx = StageContext(
        load_catalog(catalog, registry),
        ShardStore(str(tmp / "data")),
        registry,
        tmp / "cache",
        run_id="built",
        workers=2,
    )
    for stage in registry:
        for _ in run_stage(ctx, stage, ctx.partitions(stage)):
            pass
        if stage.name == names.DEDUPED_FILES:
            return ctx
    raise AssertionError("no dedup stage")


def _check(ctx: StageContext) -> CheckOutcome:
    stage = ctx.registry.get(names.DEDUPED_FILES)
    (check,) = [c for c in checks_of(stage) if c.name == CHECK]
    outcome = check.evaluate(ctx, stage, None)
    scratch = Path(ctx.store.join("scratch"))
    assert not scratch.exists() or not any(scratch.iterdir())  # the shuffle is cleaned up
    return outcome


@pytest.mark.parametrize("per_partition", [1_000_000, 3])
def test_a_real_version_passes_in_one_partition_or_many(
    built: StageContext, per_partition: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dedup, "_HASHES_PER_PARTITION", per_partition)
    outcome = _check(built)
    assert outcome.passed, outcome.description
    kept = built.latest(names.DEDUPED_FILES).rows
    assert outcome.metadata["kept_files"] == outcome.metadata["distinct_hashes"] == kept > 6
    assert outcome.metadata["partitions"] == max(2, -(-kept // per_partition))  # 2 workers


def test_a_hash_kept_twice_is_named(built: StageContext, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dedup, "_HASHES_PER_PARTITION", 4)
    good = built.store.latest(names.DEDUPED_FILES, None)
    tables = [n for n in good.data_tables() if good.tables[n].rows]
    assert len(tables) >= 2
    first = built.store.read_shard(good, good.tables[tables[0]].shards[0])
    twice = first["content_sha256"][0].as_py()
    version = built.store.begin(names.DEDUPED_FILES, None, code_version=good.code_version)
    schemas = {"ledger": LEDGER_SCHEMA, "decisions": dedup_lib.DECISIONS_SCHEMA}
    schemas["clusters"] = dedup_lib.CLUSTERS_SCHEMA
    for name, info in good.tables.items():
        writer = version.table(name, schemas.get(name, DEDUPED_FILES))
        for n, shard in enumerate(info.shards):
            rows = built.store.read_shard(good, shard)
            if name == tables[1] and n == 0:  # another source keeps the same content
                i = rows.schema.get_field_index("content_sha256")
                values = [twice, *rows["content_sha256"].to_pylist()[1:]]
                rows = rows.set_column(i, rows.schema.field(i), pa.array(values, pa.string()))
            writer.write(rows)
    version.commit(upstream=good.upstream, stats=good.stats, extra=good.extra)
    try:
        outcome = _check(built)
        assert not outcome.passed
        assert outcome.description == f"1 kept files share a hash (one is {twice})"
    finally:  # the good rows, latest again
        version = built.store.begin(names.DEDUPED_FILES, None, code_version=good.code_version)
        for name, info in good.tables.items():
            writer = version.table(name, schemas.get(name, DEDUPED_FILES))
            for shard in info.shards:
                writer.write(built.store.read_shard(good, shard))
        version.commit(upstream=good.upstream, stats=good.stats, extra=good.extra)
    assert _check(built).passed
