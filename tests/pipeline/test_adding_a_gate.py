"""Adding a per-file gate is one module (the gate), one registry entry and its tests: a toy
gate inserted between scrub and dedup through the public registry API runs end to end
through the real Dagster factories, with its config section validated, its drops in the
snapshot's ledger under its own stage name and reason, and its standard checks evaluated."""

from __future__ import annotations

import io
import json
from enum import StrEnum
from pathlib import Path

import dagster as dg
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml
from pydantic import BaseModel, ConfigDict

from assets.runner import run_pipeline
from megacpp_pipeline.core.catalog import CatalogError
from megacpp_pipeline.core.gate import GateResult
from megacpp_pipeline.core.ledger import drops
from megacpp_pipeline.core.schemas import SCRUBBED_FILES
from megacpp_pipeline.pipeline.context import SourceInputs
from megacpp_pipeline.pipeline.parallel import polars_threads_run
from megacpp_pipeline.pipeline.registry import Grain, PreparedGate, Registry, Stage
from megacpp_pipeline.stages import default_registry
from tests.fixtures.catalogs import load_catalog
from tests.fixtures.pipeline_corpus import write_catalog


# --- the toy gate: what a person adding a gate writes ------------------------------------
class BannedWordDrop(StrEnum):
    BANNED_WORD = "banned_word"


class BannedWordsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    words: list[str] = []


def drop_banned_words(table: pa.Table, config: BannedWordsConfig) -> GateResult:
    """Keep the files that mention none of the words; ledger the others with the word."""
    hit = pa.array([None] * table.num_rows, pa.string())
    for word in reversed(config.words):
        found = pc.match_substring(table["text"], word)
        hit = pc.if_else(found, word, hit)
    dropped = pc.is_valid(hit)
    gone = table.filter(dropped)
    return GateResult(
        kept=table.filter(pc.invert(dropped)),
        dropped=drops(
            gone["source_id"].to_pylist(),
            gone["path"].to_pylist(),
            [BannedWordDrop.BANNED_WORD] * gone.num_rows,
            details=[f"mentions {w!r}" for w in pc.filter(hit, dropped).to_pylist()],
        ),
    )


def _gate(inputs: SourceInputs) -> PreparedGate:
    config = inputs.config
    return PreparedGate(lambda table: drop_banned_words(table, config))


BANNED = Stage(
    name="unbanned_files",
    grain=Grain.PER_SOURCE,
    group="gates",
    description="Files that mention none of the banned words.",
    config_key="banned_words",
    config=BannedWordsConfig,
    code=(__name__,),
    schema=SCRUBBED_FILES,
    content_column="content_sha256",
    drop_reasons=(BannedWordDrop.BANNED_WORD,),
    writes_ledger=True,
    gate=_gate,
)


# --- the tests ----------------------------------------------------------------------------
def with_banned() -> Registry:
    return default_registry().insert(BANNED, after="scrubbed_files")


def test_inserting_a_gate_rewires_the_chain_and_every_derived_list() -> None:
    registry = with_banned()
    names = registry.names()
    assert names[names.index("scrubbed_files") + 1] == "unbanned_files"
    assert registry.get("unbanned_files").input == "scrubbed_files"
    assert registry.get("deduped_files").input == "unbanned_files"
    assert registry.get("tokenizer").input == "decontaminated_files"  # not rewired
    assert "unbanned_files" in registry.refresh_head()
    ledger = registry.ledger_stages()
    assert ledger[ledger.index("scrubbed_files") + 1] == "unbanned_files"
    assert registry.config_models()["banned_words"] is BannedWordsConfig
    assert "banned_words" not in default_registry().config_models()


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("toy")
    catalog, expect = write_catalog(root)
    data = yaml.safe_load(catalog.read_text())
    data["stages"]["banned_words"] = {"words": ["RingBuffer0"]}  # lib0's header and source
    catalog.write_text(yaml.safe_dump(data))
    mp = pytest.MonkeyPatch()
    mp.setenv("DAGSTER_HOME", str(root / "dagster_home"))
    log = io.StringIO()
    # A query first, as a notebook or this test session may have run: polars' threads then
    # run here, and the runs must not be forked (a forked run would hang at dedup's query).
    pl.DataFrame({"a": [1, 2, 2]}).group_by("a").len()
    assert polars_threads_run()
    try:
        outcome = run_pipeline(
            catalog, root / "data", cache_dir=root / "cache", registry=with_banned(), log=log
        )
        instance = dg.DagsterInstance.get()
        runs = instance.get_runs()
        mats = instance.get_materialized_partitions(dg.AssetKey("unbanned_files"))
        evaluations = {
            (e.check_name, e.passed)
            for r in runs
            for e in _check_evaluations(instance, r.run_id)
            if e.asset_key.to_user_string() == "unbanned_files"
        }
    finally:
        mp.undo()
    return {
        "outcome": outcome,
        "expect": expect,
        "runs": len(runs),
        "materialized": mats,
        "evaluations": evaluations,
        "log": log.getvalue(),
    }


def _check_evaluations(instance: dg.DagsterInstance, run_id: str) -> list:  # type: ignore[type-arg]
    records = instance.get_records_for_run(run_id, limit=100_000).records
    return [
        r.event_log_entry.dagster_event.event_specific_data
        for r in records
        if r.event_log_entry.dagster_event is not None
        and r.event_log_entry.dagster_event.event_type_value == "ASSET_CHECK_EVALUATION"
    ]


def test_the_toy_gate_runs_through_the_real_dagster_factories(toy_run: dict) -> None:
    assert toy_run["runs"] == 5
    assert toy_run["materialized"] == {"tree", "repo"}
    assert toy_run["evaluations"] == {
        ("manifest_verifies_from_disk", True),
        ("every_input_file_kept_or_in_ledger", True),
    }
    assert "unbanned_files" in toy_run["log"]


def test_its_drops_are_in_the_snapshot_ledger_under_its_name_and_reason(toy_run: dict) -> None:
    snap = Path(toy_run["outcome"].output)
    ledger = pq.read_table(snap / "ledger.parquet").to_pylist()
    banned = {(r["source_id"], r["path"]): r for r in ledger if r["stage"] == "unbanned_files"}
    assert set(banned) == {("tree", "include/lib0/container.hpp"), ("tree", "src/lib0.cc")}
    assert {(r["status"], r["reason"], r["detail"]) for r in banned.values()} == {
        ("dropped", "banned_word", "mentions 'RingBuffer0'")
    }
    documents = pq.read_table(snap / "documents.parquet", columns=["path"])["path"].to_pylist()
    assert "src/lib0.cc" not in documents and "src/lib1.cc" in documents
    manifest = json.loads((snap / "manifest.json").read_text())
    assert "unbanned_files" in manifest["ledger_stages"]
    for counts in manifest["ledger"].values():
        assert counts["collected"] == counts["kept"] + counts["dropped"]


def test_its_config_section_is_validated_against_the_registry(tmp_path: Path) -> None:
    catalog, _ = write_catalog(tmp_path)
    data = yaml.safe_load(catalog.read_text())
    data["stages"]["banned_words"] = {"word": ["x"]}
    catalog.write_text(yaml.safe_dump(data))
    with pytest.raises(CatalogError, match=r"stages\.banned_words\.word"):
        load_catalog(catalog, with_banned())
    with pytest.raises(CatalogError, match="unknown stage 'banned_words'"):
        load_catalog(catalog)  # the default registry has no such stage
