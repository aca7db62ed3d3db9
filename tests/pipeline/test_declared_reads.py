"""A stage reads only what it declares: its body and its checks get a context that refuses
another stage's versions or code version unless the registry lists that stage among its
reads, and another stage's config unless it lists it in config_reads; what it reads is part
of its code version. Stage code names other stages by their constants (stages/names.py),
never by a literal."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import pytest

from megacpp_pipeline.pipeline.context import StageContext, UndeclaredReadError
from megacpp_pipeline.pipeline.registry import (
    Check,
    CheckOutcome,
    Grain,
    Materialized,
    Registry,
    Stage,
)
from megacpp_pipeline.pipeline.runner import run_stage
from megacpp_pipeline.stages import default_registry, names
from megacpp_pipeline.storage.store import ShardStore
from tests.fixtures.catalogs import load_catalog

REPO = Path(__file__).resolve().parents[2]
HEADER = "// SPDX-License-Identifier: MIT\n#pragma once\ninline int one() { return 1; }\n"


def _peek_body(ctx: StageContext, stage: Stage, partition: str | None) -> Materialized:
    """Reads the collected version of its source: declared or not, as the stage says."""
    rows = ctx.latest(names.RAW_FILES, partition).rows
    return Materialized(partition, {"raw_rows": rows})


def _peek_check(ctx: StageContext, stage: Stage, partition: str | None) -> CheckOutcome:
    return CheckOutcome(passed=ctx.config(names.DEDUPED_FILES).threshold > 0)


PEEK = Stage(
    name="peek",
    grain=Grain.PER_SOURCE,
    description="reads the collection",
    group="gates",
    body=_peek_body,
    checks=(Check("dedup_threshold_set", "reads dedup's config", _peek_check),),
)


def _context(tmp_path: Path, registry: Registry) -> StageContext:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "one.h").write_text(HEADER)
    catalog = tmp_path / "sources.yaml"
    catalog.write_text(f"snapshot: t\nsources:\n  - {{id: tree, kind: dir, uri: {tree}}}\n")
    return StageContext(
        load_catalog(catalog, registry),
        ShardStore(str(tmp_path / "data")),
        registry,
        tmp_path / "cache",
        workers=1,
    )


def _materialize(ctx: StageContext, *stages: str) -> list[Materialized]:
    out: list[Materialized] = []
    for name in stages:
        stage = ctx.registry.get(name)
        out += run_stage(ctx, stage, ctx.partitions(stage))
    return out


def test_a_body_or_a_check_reading_an_undeclared_stage_is_refused(tmp_path: Path) -> None:
    registry = default_registry().insert(PEEK, after=names.NORMALIZED_FILES)
    ctx = _context(tmp_path, registry)
    _materialize(ctx, names.SOURCE_CATALOG, names.RAW_FILES, names.NORMALIZED_FILES)
    with pytest.raises(UndeclaredReadError, match="stage 'peek' reads 'raw_files' but does not"):
        _materialize(ctx, "peek")
    check = PEEK.checks[0]
    with pytest.raises(UndeclaredReadError, match="'peek' reads the config of 'deduped_files'"):
        check.evaluate(ctx, registry.get("peek"), "tree")


def test_the_same_reads_declared_run(tmp_path: Path) -> None:
    declared = replace(PEEK, reads=(names.RAW_FILES,), config_reads=(names.DEDUPED_FILES,))
    registry = default_registry().insert(declared, after=names.NORMALIZED_FILES)
    ctx = _context(tmp_path, registry)
    _materialize(ctx, names.SOURCE_CATALOG, names.RAW_FILES, names.NORMALIZED_FILES)
    (done,) = _materialize(ctx, "peek")
    assert done.metadata["raw_rows"] == 1
    assert declared.checks[0].evaluate(ctx, registry.get("peek"), "tree").passed
    assert "peek" in registry.downstream_of(names.RAW_FILES)


def test_the_code_version_covers_what_a_stage_reads(tmp_path: Path) -> None:
    registry = default_registry()
    catalog = tmp_path / "sources.yaml"
    catalog.write_text("snapshot: t\nsources:\n  - {id: a, kind: dir, uri: a}\n")
    (tmp_path / "a").mkdir()
    before = load_catalog(catalog)
    catalog.write_text(catalog.read_text() + "stages:\n  dedup: {threshold: 0.9}\n")
    after = load_catalog(catalog)

    def version(name: str, cat) -> str:  # type: ignore[no-untyped-def]
        return registry.code_version(registry.get(name), cat)

    # removals sign removed files with dedup's near-duplicate settings (config_reads)
    assert version(names.REMOVED_FILES, before) != version(names.REMOVED_FILES, after)
    assert version(names.LICENSED_FILES, before) == version(names.LICENSED_FILES, after)
    packing = registry.get(names.PACKED_ROWS)
    fewer = Registry([replace(s, reads=()) if s is packing else s for s in registry])
    assert fewer.code_version(fewer.get(names.PACKED_ROWS), before) != version(
        names.PACKED_ROWS, before
    )


def test_the_snapshot_reads_every_ledger_stage_an_insert_adds_too() -> None:
    registry = default_registry()
    ledgers = registry.reads_of(registry.get(names.SNAPSHOT))
    assert set(registry.ledger_stages()) <= set(ledgers)
    extra = replace(PEEK, name="extra_ledger", writes_ledger=True)
    wider = registry.insert(extra, after=names.SCRUBBED_FILES)
    assert "extra_ledger" in wider.reads_of(wider.get(names.SNAPSHOT))


# the methods that read another stage, and the Stage fields that name one (a stage's own
# `name=` may be a literal: a new gate nobody reads yet needs no constant)
_READERS = {"latest", "config", "code_version", "tables", "manifest", "artifact", "has_version"}
_FIELDS = {"input", "reads", "config_reads"}


def test_stage_code_names_stages_by_their_constants_and_reads_through_the_context() -> None:
    found = []
    for path in sorted((REPO / "megacpp_pipeline" / "stages").glob("*.py")):
        if path.name == "names.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            where = f"{path.name}:{node.lineno}"
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "latest":
                owner = func.value
                if isinstance(owner, ast.Attribute) and owner.attr == "store":
                    found.append(f"{where}: store.latest bypasses the declared reads")
            first = node.args[0] if node.args else None
            if (
                isinstance(func, ast.Attribute)
                and func.attr in _READERS
                and isinstance(first, ast.Constant)
                and isinstance(first.value, str)
            ):
                found.append(f"{where}: {func.attr}({first.value!r})")
            if isinstance(func, ast.Name) and func.id == "Stage":
                for kw in node.keywords:
                    literals = [
                        n.value
                        for n in ast.walk(kw.value)
                        if isinstance(n, ast.Constant) and isinstance(n.value, str)
                    ]
                    if kw.arg in _FIELDS and literals:
                        found.append(f"{where}: Stage({kw.arg}={literals})")
    assert found == []
