"""The dedup stage's blocking check, `no_two_kept_files_share_a_hash`, with the kept hashes
shuffled into partitions counted by tasks: a real version passes whatever the number of
partitions, a kept hash that appears twice (in two sources' tables) is named, and the
check's scratch folder is gone afterwards, pass or fail."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from megacpp_pipeline.core.ledger import LEDGER_SCHEMA
from megacpp_pipeline.core.schemas import DEDUPED_FILES
from megacpp_pipeline.corpus import dedup as dedup_lib
from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.registry import CheckOutcome
from megacpp_pipeline.stages import dedup, names
from tests.fixtures.pipeline_corpus import write_catalog
from tests.fixtures.stage_runs import context, evaluate, rewrite_version, run_through, unchanged

CHECK = "no_two_kept_files_share_a_hash"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> StageContext:
    tmp = tmp_path_factory.mktemp("dedup-check")
    catalog, _ = write_catalog(tmp)
    return run_through(context(tmp, catalog, "built", workers=2), names.DEDUPED_FILES)


def _check(ctx: StageContext) -> CheckOutcome:
    outcome = evaluate(ctx, names.DEDUPED_FILES, CHECK)
    scratch = Path(ctx.store.join("scratch"))
    assert not scratch.exists() or not any(scratch.iterdir())  # the shuffle is cleaned up
    return outcome


def _schemas(ctx: StageContext) -> dict[str, pa.Schema]:
    good = ctx.store.latest(names.DEDUPED_FILES, None)
    fixed = {
        "ledger": LEDGER_SCHEMA,
        "decisions": dedup_lib.DECISIONS_SCHEMA,
        "clusters": dedup_lib.CLUSTERS_SCHEMA,
    }
    return {name: fixed.get(name, DEDUPED_FILES) for name in good.tables}


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


@pytest.fixture
def ctx(built: StageContext) -> Iterator[StageContext]:
    """The built store, its good dedup version the latest again after each test."""
    good = built.store.latest(names.DEDUPED_FILES, None)
    yield built
    if built.store.latest(names.DEDUPED_FILES, None).version != good.version:
        rewrite_version(built, names.DEDUPED_FILES, _schemas(built), unchanged, good)
        assert _check(built).passed


def test_a_hash_kept_twice_is_named(ctx: StageContext, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dedup, "_HASHES_PER_PARTITION", 4)
    good = ctx.store.latest(names.DEDUPED_FILES, None)
    tables = [n for n in good.data_tables() if good.tables[n].rows]
    assert len(tables) >= 2
    first = ctx.store.read_shard(good, good.tables[tables[0]].shards[0])
    twice = first["content_sha256"][0].as_py()
    target = good.tables[tables[1]].shards[0].path

    def change(name: str, path: str, rows: pa.Table) -> pa.Table:
        if path != target:
            return rows
        i = rows.schema.get_field_index("content_sha256")
        values = [twice, *rows["content_sha256"].to_pylist()[1:]]  # another source keeps it
        return rows.set_column(i, rows.schema.field(i), pa.array(values, pa.string()))

    rewrite_version(ctx, names.DEDUPED_FILES, _schemas(ctx), change, good)
    outcome = _check(ctx)
    assert not outcome.passed
    assert outcome.description == f"1 kept files share a hash (one is {twice})"
