"""The stage registry is the one ordered list: it refuses an inconsistent one naming the
stage and the field, and everything derived from it (ledger order, refresh head, config
sections, code versions) follows it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from megacpp_pipeline.gates.license.spdx import SPDX_DATA
from megacpp_pipeline.pipeline.registry import (
    Grain,
    Registry,
    RegistryError,
    Stage,
    module_source,
)
from megacpp_pipeline.stages import default_registry
from tests.fixtures.catalogs import load_catalog

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "examples" / "demo" / "sources.yaml"


def _body(ctx, stage, partition):  # type: ignore[no-untyped-def]
    raise AssertionError("not run")


def _stage(name: str, **kw) -> Stage:  # type: ignore[no-untyped-def]
    return Stage(
        name=name,
        grain=kw.pop("grain", Grain.GLOBAL),
        description="",
        group="g",
        body=kw.pop("body", _body),
        **kw,
    )


def test_the_default_order_is_the_pipeline_order() -> None:
    r = default_registry()
    assert r.names() == [
        "source_catalog", "raw_files", "normalized_files", "classified_files", "quality_files",
        "licensed_files", "removed_files", "scrubbed_files", "deduped_files",
        "decontaminated_files", "enriched_files", "tokenizer", "tokenized_docs", "documents",
        "packed_rows", "snapshot", "megatron_dataset", "quality_report",
    ]  # fmt: skip
    assert r.ledger_stages() == [
        "raw_files", "normalized_files", "classified_files", "quality_files", "licensed_files",
        "removed_files", "scrubbed_files", "deduped_files", "decontaminated_files",
        "enriched_files", "tokenized_docs",
    ]  # fmt: skip
    assert r.refresh_head() == [
        "raw_files", "normalized_files", "classified_files", "quality_files", "licensed_files",
        "removed_files", "scrubbed_files",
    ]  # fmt: skip
    assert set(r.config_models()) == {
        "normalize", "language", "quality", "license", "scrub", "dedup", "decontaminate",
        "enrich", "tokenizer", "tokenize", "documents", "packing", "snapshot",
    }  # fmt: skip


def test_every_stage_reads_only_earlier_stages_and_declares_its_drop_reasons() -> None:
    r = default_registry()
    seen: set[str] = set()
    for stage in r:
        assert set(stage.upstream) <= seen, stage.name
        assert bool(stage.drop_reasons) == stage.writes_ledger, stage.name
        seen.add(stage.name)


@pytest.mark.parametrize(
    ("stages", "message"),
    [
        ([_stage("a"), _stage("a")], "stage 'a': the name is used twice"),
        ([_stage("a", input="b"), _stage("b")], "stage 'a': upstream 'b' is not an earlier stage"),
        (
            [_stage("a", gate=lambda i: None)],
            "stage 'a': needs exactly one of gate, body and sources_body",
        ),
        (
            [_stage("a", body=None)],
            "stage 'a': needs exactly one of gate, body and sources_body",
        ),
        (
            [_stage("a", body=None, sources_body=lambda c, s, p: iter(()))],
            "stage 'a': sources_body is for a per-source stage",
        ),
        (
            [_stage("a"), _stage("b", body=None, gate=lambda i: None)],
            "stage 'b': a per-file gate runs on an input",
        ),
        ([_stage("a", config_key="x")], "stage 'a': config_key without a config model"),
    ],
)
def test_an_inconsistent_registry_is_refused_naming_the_stage(stages: list, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(RegistryError, match=message):
        Registry(stages)


def test_insert_refuses_an_unknown_anchor_or_a_taken_name() -> None:
    r = default_registry()
    with pytest.raises(RegistryError, match="no stage 'nope'"):
        r.insert(_stage("x"), after="nope")
    with pytest.raises(RegistryError, match="'raw_files': the name is used twice"):
        r.insert(replace(r.get("raw_files")), after="scrubbed_files")


def test_downstream_follows_inputs_and_reads() -> None:
    r = default_registry()
    assert r.downstream_of("tokenizer") == [
        "tokenized_docs", "documents", "packed_rows", "snapshot", "megatron_dataset",
        "quality_report",
    ]  # fmt: skip
    assert "enriched_files" in r.downstream_of("raw_files")  # it reads the compile database


def test_a_stage_config_takes_model_defaults_then_catalog_then_its_section() -> None:
    r = default_registry()
    catalog = load_catalog(DEMO)
    packing = r.config_of(r.get("packed_rows"), catalog)
    assert packing.seq_len == catalog.seq_len  # from the catalog itself
    assert packing.packing_telemetry is True  # from stages.packing
    assert r.config_of(r.get("source_catalog"), catalog) is None


def test_code_versions_are_stable_and_distinct() -> None:
    r = default_registry()
    catalog = load_catalog(DEMO)
    first = [r.code_version(s, catalog) for s in r]
    assert first == [default_registry().code_version(s, load_catalog(DEMO)) for s in r]
    assert len(set(first)) == len(first)


def test_a_packages_data_files_are_part_of_its_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rule file a gate reads decides as its code does: with only .py files hashed, an
    SPDX list edited under the same code let the result cache serve the old decisions
    (files the new list rejects were kept)."""
    package = tmp_path / "rulepkg"
    (package / "data").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "data" / "rules.json").write_text('{"allowed": ["MIT", "BSL-1.0"]}')
    monkeypatch.syspath_prepend(str(tmp_path))
    before = module_source("rulepkg")
    (package / "data" / "rules.json").write_text('{"allowed": ["MIT"]}')
    assert module_source("rulepkg") != before
    (package / "data" / "renamed.json").write_bytes((package / "data" / "rules.json").read_bytes())
    (package / "data" / "rules.json").unlink()
    assert module_source("rulepkg") not in (before, b"")
    licensed = default_registry().get("licensed_files")
    assert SPDX_DATA in licensed.code
    assert b"spdx-licenses.json" in module_source(SPDX_DATA)
