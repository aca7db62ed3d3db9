"""The stage registry is the one ordered list: it refuses an inconsistent one naming the
stage and the field, and everything derived from it (ledger order, refresh head, config
sections, code versions) follows it."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from megacpp_pipeline.gates.license.spdx import SPDX_DATA
from megacpp_pipeline.pipeline.registry import (
    Grain,
    Registry,
    RegistryError,
    Stage,
    library_versions,
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


def _distribution(root: Path, name: str, version: str) -> None:
    """A real installed distribution (its dist-info) providing the module `name`."""
    (root / name).mkdir(exist_ok=True)
    (root / name / "__init__.py").write_text("")
    info = root / f"{name}-0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "top_level.txt").write_text(f"{name}\n")
    (info / "RECORD").write_text(f"{name}/__init__.py,,\n")


_VERSIONS = """
import json, sys
from megacpp_pipeline.pipeline.registry import Grain, Registry, Stage, library_versions
from tests.fixtures.catalogs import load_catalog
stage = Stage(name="g", grain=Grain.GLOBAL, description="", group="g", code=("fakegate",),
              body=lambda *a: None)
version = Registry([stage]).code_version(stage, load_catalog(sys.argv[1]))
print(json.dumps([library_versions(["fakegate"]), version]))
"""


def test_a_librarys_version_is_part_of_the_code_of_each_stage_importing_it(
    tmp_path: Path,
) -> None:
    """A new grammar or encoder under the same gate code makes the stage stale and its
    result cache another namespace (each version read by a fresh interpreter, as a run
    after an upgrade would)."""
    (tmp_path / "fakegate.py").write_text(
        "import os, json as j\n"
        "def parse(text):\n"
        "    from fakegrammar.tables import rules  # a lazy import counts too\n"
        "    return rules\n"
    )

    def versions(grammar: str) -> tuple[list[str], str]:
        _distribution(tmp_path, "fakegrammar", grammar)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))
        out = subprocess.run(
            [sys.executable, "-c", _VERSIONS, str(DEMO)], env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        libraries, version = json.loads(out.stdout)
        return libraries, version

    old, old_version = versions("1.0")
    new, new_version = versions("1.1")
    py = f"python=={sys.version_info.major}.{sys.version_info.minor}"
    assert old == [py, "fakegrammar==1.0"]
    assert new == [py, "fakegrammar==1.1"]
    assert old_version != new_version
    assert versions("1.0")[1] == old_version  # stable: the same environment, the same version


def test_an_import_no_distribution_provides_is_refused_naming_the_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "loosehelper.py").write_text("X = 1\n")  # on the path, installed by nobody
    (tmp_path / "loosegate.py").write_text("from loosehelper import X\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    stage = _stage("loose", code=("loosegate",))
    with pytest.raises(RegistryError, match=r"stage 'loose': loosegate imports 'loosehelper'"):
        Registry([stage]).code_version(stage, load_catalog(DEMO))


def test_an_optional_import_that_is_not_installed_reads_absent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "optgate.py").write_text(
        "try:\n    import surely_not_installed_xyz\nexcept ImportError:\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "surely_not_installed_xyz==absent" in library_versions(["optgate"])


@pytest.mark.parametrize(
    ("stage", "libraries"),
    [
        ("enriched_files", ["tree-sitter", "tree-sitter-cpp"]),
        ("tokenized_docs", ["tiktoken", "tokenizers"]),
        ("scrubbed_files", ["detect-secrets", "google-re2"]),  # re2 is google-re2's module
        ("licensed_files", ["license-expression", "reuse"]),
        ("quality_files", ["polars", "pyarrow"]),
    ],
)
def test_the_stages_carry_the_libraries_that_decide_for_them(
    stage: str, libraries: list[str]
) -> None:
    got = library_versions(default_registry().get(stage).code)
    for name in libraries:
        assert f"{name}=={importlib.metadata.version(name)}" in got
