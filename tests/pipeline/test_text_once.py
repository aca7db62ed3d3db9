"""The collect-to-scrub gates write a file's text once (issue 29): normalize writes it, the
gates that keep it (language, quality, licence, removals, and scrub where it redacts
nothing) write their decisions and name the shard that holds it; every reader gets the
same rows as before."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.snapshot import layout
from megacpp_pipeline.storage import slices
from megacpp_pipeline.storage.versions import TEXT
from tests.fixtures.pipeline_corpus import write_catalog
from tests.fixtures.stage_runs import context, run_through

KEEPERS = ("classified_files", "quality_files", "licensed_files", "removed_files")
# after scrub: their rows' text is held by normalize's shards or, where scrub redacted, its
AFTER_SCRUB = ("deduped_files", "decontaminated_files", "enriched_files")


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> StageContext:
    tmp = tmp_path_factory.mktemp("text_once")
    catalog, _ = write_catalog(tmp)
    return run_through(context(tmp / "run", catalog, "run", workers=2), "enriched_files")


def _written(ctx: StageContext, stage: str, source: str) -> pa.Table:
    """The data shards of a version as parquet holds them, not resolved."""
    m = ctx.store.latest(stage, source)
    vdir = ctx.store.version_dir(m)
    shards = m.tables["data"].shards
    return pa.concat_tables(pq.read_table(f"{vdir}/{s.path}") for s in shards)


def test_only_normalize_writes_the_text_of_a_file_no_later_gate_changes(ran: StageContext) -> None:
    for source in ran.sources():
        normalized = ran.store.read_table(ran.store.latest("normalized_files", source))
        text_of = dict(
            zip(normalized["path"].to_pylist(), normalized[TEXT].to_pylist(), strict=True)
        )
        assert _written(ran, "normalized_files", source)[TEXT].null_count == 0
        for stage in KEEPERS:
            m = ran.store.latest(stage, source)
            written = _written(ran, stage, source)
            assert written[TEXT].null_count == written.num_rows > 0, (stage, source)
            for shard in m.tables["data"].shards:
                assert shard.text_from, (stage, shard.path)
                assert {h.dir.split("/")[1] for h in shard.text_from} == {"normalized_files"}
            rows = ran.store.read_table(m)
            assert rows[TEXT].null_count == 0
            assert rows[TEXT].to_pylist() == [text_of[p] for p in rows["path"].to_pylist()]


def test_the_gates_after_scrub_name_the_text_normalize_or_scrub_wrote(ran: StageContext) -> None:
    for source in ran.sources():
        scrubbed = ran.store.read_table(ran.store.latest("scrubbed_files", source))
        text_of = dict(zip(scrubbed["path"].to_pylist(), scrubbed[TEXT].to_pylist(), strict=True))
        for stage in AFTER_SCRUB:
            per_source = ran.registry.get(stage).per_source
            m = ran.store.latest(stage, source if per_source else None)
            table = layout.data_table(None if per_source else source)
            holders = {
                h.dir.split("/")[1] for s in m.tables[table].shards for h in s.text_from or []
            }
            assert holders <= {"normalized_files", "scrubbed_files"}, (stage, holders)
            assert "normalized_files" in holders
            rows = pa.concat_tables(ran.store.iter_tables(m, table))
            assert rows.num_rows > 0
            assert rows[TEXT].to_pylist() == [text_of[p] for p in rows["path"].to_pylist()]


def test_scrub_writes_the_text_it_redacted_and_names_the_rest(ran: StageContext) -> None:
    redacted = 0
    for source in ran.sources():
        written = _written(ran, "scrubbed_files", source)
        rows = ran.store.read_table(ran.store.latest("scrubbed_files", source))
        changed = pc.greater(written["scrub_replacements"], 0)
        # a row with a replacement holds its new text; every other one names normalize's
        assert pc.all(pc.equal(pc.is_valid(written[TEXT]), changed)).as_py()
        redacted += pc.sum(changed).as_py() or 0
        assert rows[TEXT].null_count == 0
    assert redacted > 0  # the corpus has author emails to scrub


def _text_bytes(ctx: StageContext, stage: str, source: str) -> int:
    """What the text column takes in a version's data shards, compressed."""
    m = ctx.store.latest(stage, source)
    total = 0
    for shard in m.tables["data"].shards:
        meta = pq.read_metadata(f"{ctx.store.version_dir(m)}/{shard.path}")
        i = meta.schema.to_arrow_schema().get_field_index(TEXT)
        total += sum(
            meta.row_group(g).column(i).total_compressed_size for g in range(meta.num_row_groups)
        )
    return total


def test_the_versions_that_keep_the_text_hold_almost_none_of_its_bytes(ran: StageContext) -> None:
    for source in ran.sources():
        whole = _text_bytes(ran, "normalized_files", source)
        for stage in KEEPERS:
            kept = _text_bytes(ran, stage, source)
            assert kept < whole / 20, (stage, source, kept, whole)


def _slice_text_bytes(ctx: StageContext, stage: str, source: str, task_bytes: int) -> list[int]:
    per_source = ctx.registry.get(stage).per_source
    m = ctx.store.latest(stage, source if per_source else None)
    table = layout.data_table(None if per_source else source)
    return [
        pc.sum(pc.binary_length(slices.read(ctx.store, s.pieces, [TEXT])[TEXT])).as_py()
        for s in slices.plan(ctx.store, [(m, table)], task_bytes)
    ]


def test_a_version_that_names_its_text_is_sliced_by_the_text_it_carries(
    ran: StageContext,
) -> None:
    """A keeper's shards are a few small columns; planned by those bytes alone, one task
    would get the whole text (a straggler, and memory that grows with the corpus)."""
    for source in ran.sources():
        norm = ran.store.latest("normalized_files", source)
        task_bytes = max(1, slices.total_bytes([(norm, "data")]) // 8)
        whole = _slice_text_bytes(ran, "normalized_files", source, task_bytes)
        assert len(whole) >= 6, (source, whole)
        for stage in (*KEEPERS, *AFTER_SCRUB):
            each = _slice_text_bytes(ran, stage, source, task_bytes)
            assert max(each) <= 1.5 * max(whole), (stage, source, each, whole)
