"""What a stage runs with: one code version per stage for a whole run or step, hashed once
for the context and every copy of it, and a stage that is not the run's own hashed apart."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.registry import Grain, Materialized, Registry, Stage
from megacpp_pipeline.storage.store import ShardStore
from tests.fixtures.catalogs import load_catalog


def _body(ctx: StageContext, stage: Stage, partition: str | None) -> Materialized:
    return Materialized(partition, {})


def _context(tmp_path: Path, registry: Registry) -> StageContext:
    tree = tmp_path / "tree"
    tree.mkdir()
    catalog = tmp_path / "sources.yaml"
    catalog.write_text(f"snapshot: t\nsources:\n  - {{id: tree, kind: dir, uri: {tree}}}\n")
    store = ShardStore(str(tmp_path / "data"))
    return StageContext(load_catalog(catalog, registry), store, registry, tmp_path / "cache")


def test_a_stage_has_one_code_version_for_the_context_and_its_copies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """A rule file edited while a run goes on does not give the run's later steps another
    code version (nor cost a re-read of the stage's code at each call); the next run's
    context hashes the code as it is then."""
    package = tmp_path / "ctxrules"
    (package / "data").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "data" / "rules.json").write_text('{"allowed": ["MIT"]}')
    monkeypatch.syspath_prepend(str(tmp_path))
    ruled = Stage(
        name="ruled", grain=Grain.PER_SOURCE, description="reads its rules", group="gates",
        body=_body, code=("ctxrules",),
    )  # fmt: skip
    registry = Registry([ruled])
    ctx = _context(tmp_path, registry)
    request.addfinalizer(lambda: sys.modules.pop("ctxrules", None))  # imported by the hash
    version = ctx.code_version("ruled")
    (package / "data" / "rules.json").write_text('{"allowed": ["MIT", "BSL-1.0"]}')
    assert ctx.code_version(ruled) == version
    assert ctx.for_stage(ruled).code_version("ruled") == version
    assert replace(ctx, workers=1).code_version_unchecked(ruled) == version
    edited = registry.code_version(ruled, ctx.catalog)
    assert edited != version
    fresh = StageContext(ctx.catalog, ctx.store, registry, ctx.cache_dir)
    assert fresh.code_version("ruled") == edited
    # a stage changed since (not the registry's own object) is hashed for itself
    other = replace(ruled, description="another")
    assert ctx.code_version_unchecked(other) == registry.code_version(other, ctx.catalog)
