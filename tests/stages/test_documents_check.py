"""The documents stage's blocking check, `every_kept_file_in_one_document`, run as tasks: a
version written by several tasks passes, and each way a stored version can be wrong is named
by the task's output that holds it: a file listed twice in place of another (the counts
still agree), a file in a document another task wrote, doc_ids that skip a number."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from megacpp_pipeline.core.schemas import DOCUMENT_FILES, DOCUMENT_TOKENS
from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.engine import Engine
from megacpp_pipeline.pipeline.registry import CheckOutcome
from megacpp_pipeline.stages import names
from megacpp_pipeline.storage.store import Manifest
from tests.fixtures.pipeline_corpus import write_catalog
from tests.fixtures.stage_runs import (
    Change,
    context,
    evaluate,
    rewrite_version,
    run_through,
    unchanged,
)

CHECK = "every_kept_file_in_one_document"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> StageContext:
    """Every stage up to documents, with tasks of ~2 KB of input: several tasks write it."""
    tmp = tmp_path_factory.mktemp("documents-check")
    catalog, _ = write_catalog(tmp)
    engine = replace(Engine(), task_bytes=2_000)
    return run_through(context(tmp, catalog, "built", workers=2, engine=engine), names.DOCUMENTS)


def _check(ctx: StageContext) -> CheckOutcome:
    return evaluate(ctx, names.DOCUMENTS, CHECK)


SCHEMAS = {"document_files": DOCUMENT_FILES}


def _rewritten(ctx: StageContext, change: Change, good: Manifest | None = None) -> None:
    """A new documents version: every shard of `good` (default: the latest version) under its
    own name, through `change(table name, shard path, rows)`."""
    good = good or ctx.store.latest(names.DOCUMENTS, None)
    schemas = {name: SCHEMAS.get(name, DOCUMENT_TOKENS) for name in good.tables}
    rewrite_version(ctx, names.DOCUMENTS, schemas, change, good)


def _set(rows: pa.Table, column: str, row: int, value: object) -> pa.Table:
    values = rows[column].to_pylist()
    values[row] = value
    i = rows.schema.get_field_index(column)
    return rows.set_column(i, rows.schema.field(i), pa.array(values, rows.schema.field(i).type))


def _file_shards(ctx: StageContext) -> list[str]:
    good = ctx.store.latest(names.DOCUMENTS, None)
    return [s.path for s in good.tables["document_files"].shards]


def test_a_version_written_by_several_tasks_passes(built: StageContext) -> None:
    outcome = _check(built)
    assert outcome.passed, outcome.description
    assert outcome.metadata["tasks"] >= 3
    kept = sum(built.latest(names.TOKENIZED_DOCS, s).rows for s in built.sources())
    assert outcome.metadata["files"] == kept > 0
    assert outcome.metadata["documents"] == built.latest(names.DOCUMENTS).stats["documents"]


@pytest.fixture
def ctx(built: StageContext) -> Iterator[StageContext]:
    """The built store, restored to its good documents version after each test."""
    good = built.store.latest(names.DOCUMENTS, None)
    yield built
    if built.store.latest(names.DOCUMENTS, None).version != good.version:
        _rewritten(built, unchanged, good)  # the good rows, the latest again
        assert _check(built).passed


def test_a_file_listed_twice_in_place_of_another_is_named(ctx: StageContext) -> None:
    shards = _file_shards(ctx)
    first = ctx.store.read_shard(
        ctx.store.latest(names.DOCUMENTS, None),
        ctx.store.latest(names.DOCUMENTS, None).tables["document_files"].shards[0],
    )
    twice = first["path"][0].as_py()

    def change(name: str, path: str, rows: pa.Table) -> pa.Table:
        return _set(rows, "path", 0, twice) if path == shards[-1] else rows

    _rewritten(ctx, change)
    outcome = _check(ctx)
    assert not outcome.passed
    assert "as many files per source as tokenized_docs kept, but not the same files" in str(
        outcome.description
    )


def test_a_file_in_a_document_another_task_wrote_is_named(ctx: StageContext) -> None:
    shards = _file_shards(ctx)

    def change(name: str, path: str, rows: pa.Table) -> pa.Table:
        return _set(rows, "doc_id", 0, 0) if path == shards[-1] else rows

    _rewritten(ctx, change)
    outcome = _check(ctx)
    assert not outcome.passed
    assert "is in doc 0, which is not among the documents written with it" in str(
        outcome.metadata["problems"]
    )


def test_doc_ids_that_skip_a_number_are_named(ctx: StageContext) -> None:
    last = _file_shards(ctx)[-1].removesuffix(".parquet").rsplit("-", 1)[1]

    def change(name: str, path: str, rows: pa.Table) -> pa.Table:
        if not path.endswith(f"-{last}.parquet"):
            return rows
        i = rows.schema.get_field_index("doc_id")
        return rows.set_column(i, rows.schema.field(i), pc.add(rows["doc_id"], 1).cast(pa.int32()))

    _rewritten(ctx, change)
    outcome = _check(ctx)
    assert not outcome.passed
    assert "documents: doc_ids are not 0..N-1 (the next after" in str(outcome.description)
