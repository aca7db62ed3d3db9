"""raw_files over a directory source: the tree cut into slices that this host's workers read
side by side (stages/collect.py) gives the version one process reading the tree in order
gives: the same rows, ledger and metadata in the same order, and the same revision."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pyarrow as pa
import pytest

from megacpp_pipeline import collect
from megacpp_pipeline.collect import directory
from megacpp_pipeline.collect.source import Scope
from megacpp_pipeline.core.ledger import DropReason
from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.runner import checks_of, run_stage
from megacpp_pipeline.stages.collect import _slices_of
from megacpp_pipeline.storage.store import Manifest, NoVersionError
from tests.fixtures.stage_runs import context

HEADER = "// SPDX-License-Identifier: MIT\n#pragma once\n"


def _tree(root: Path) -> None:
    for i in range(9):
        path = root / f"include/lib{i % 3}/part{i}.hpp"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(HEADER + f"namespace lib{i} {{\ninline int f() {{ return {i}; }}\n}}\n")
    (root / "src").mkdir()
    (root / "src/main.cc").write_text('#include "lib0/part0.hpp"\nint main() { return 0; }\n')
    (root / "src/huge.cc").write_text("int x;\n" * 400)  # over the source's max_file_bytes
    (root / "README.md").write_text("# not C++\n")
    (root / "REUSE.toml").write_text('version = 1\n[[annotations]]\npath = "**"\n')
    (root / "include/link.hpp").symlink_to("lib0/part0.hpp")
    os.mkfifo(root / "src/pipe.cc")
    (root / "include" / os.fsdecode(b"bad\xff.hpp")).write_text("int bad;\n")
    (root / "empty").mkdir()


@pytest.fixture
def catalog(tmp_path: Path) -> Path:
    _tree(tmp_path / "tree")
    path = tmp_path / "sources.yaml"
    path.write_text(
        "snapshot: slices\nseq_len: 256\nsources:\n"
        "  - id: tree\n    kind: dir\n    uri: tree\n    declared_license: MIT\n"
        "    max_file_bytes: 1000\n"
    )
    return path


def _collected(ctx: StageContext) -> Manifest:
    """raw_files run over the catalog's one source, "tree", its checks passed."""
    stage = ctx.registry.get("raw_files")
    for _ in run_stage(ctx, stage, ["tree"]):
        pass
    for check in checks_of(stage):
        assert check.evaluate(ctx, stage, "tree").passed, check.name
    return ctx.store.latest("raw_files", "tree")


def _raw(tmp: Path, catalog: Path, workers: int) -> tuple[dict[str, pa.Table], str]:
    ctx = context(tmp, catalog, f"w{workers}", workers=workers)
    m = _collected(ctx)
    tables = {n: ctx.store.read_table(m, n) for n, info in m.tables.items() if info.shards}
    return tables, str(m.extra["revision"])


@pytest.mark.parametrize("units", [1, 2, 64])
def test_slices_read_by_workers_give_the_version_and_revision_of_one_ordered_read(
    tmp_path: Path, catalog: Path, monkeypatch: pytest.MonkeyPatch, units: int
) -> None:
    monkeypatch.setattr(directory, "SLICE_FILES", 3)  # many slices out of a small tree
    monkeypatch.setattr(directory, "WALK_UNITS", units)  # the tree walked whole, in runs, cut
    spec_root = tmp_path / "tree"
    tables, revision = _raw(tmp_path / "a", catalog, workers=2)
    one, one_revision = _raw(tmp_path / "b", catalog, workers=1)
    assert revision == one_revision
    for name in ("data", "ledger", "metadata"):
        assert tables[name].equals(one[name]), name

    # what one process reading the tree in order gives, with the serial reader
    ctx = context(tmp_path / "c", catalog, "serial")
    spec = ctx.catalog.source("tree")
    scope = Scope(spec, lambda p: p == "REUSE.toml")
    files = collect.dir_source(spec, str(spec_root), scope, ctx.catalog.collect, 1000)
    assert files.revision == revision
    serial = list(files.entries())
    ledger = tables["ledger"]
    assert ledger["path"].to_pylist() == [e.path for e in serial]
    reasons = dict(zip(ledger["path"].to_pylist(), ledger["reason"].to_pylist(), strict=True))
    assert reasons["include/link.hpp"] == DropReason.SYMLINK
    assert reasons["src/huge.cc"] == DropReason.TOO_LARGE
    assert reasons["src/pipe.cc"] == DropReason.UNSAFE_PATH
    assert reasons["README.md"] == DropReason.NOT_INCLUDED
    assert sum(r == DropReason.UNSAFE_PATH for r in reasons.values()) == 2  # the fifo, bad\xff
    assert tables["data"].num_rows == 10
    assert tables["data"]["path"].to_pylist() == sorted(tables["data"]["path"].to_pylist())
    assert set(tables["data"]["revision"].to_pylist()) == {revision}
    assert tables["metadata"]["path"].to_pylist() == ["REUSE.toml"]
    contents = {e.path: e.content for e in serial}
    for path, content in zip(
        tables["data"]["path"].to_pylist(), tables["data"]["content"].to_pylist(), strict=True
    ):
        assert content == contents[path], path


def test_the_tree_is_cut_into_units_by_a_worker_not_the_driver(
    tmp_path: Path, catalog: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The units of a large folder carry its entries' names: the folder is listed in a
    forked worker, and the driver holds only how many units each source has."""
    monkeypatch.setattr(directory, "WALK_UNITS", 4)
    where = tmp_path / "planned-in"
    real = collect.walk_units_of

    def recording(spec: object, uri: str) -> object:
        with where.open("a") as f:
            f.write(f"{os.getpid()}\n")
        return real(spec, uri)  # type: ignore[arg-type]

    monkeypatch.setattr(collect, "walk_units_of", recording)
    tables, _ = _raw(tmp_path / "a", catalog, workers=2)
    planned_in = [int(line) for line in where.read_text().split()]
    assert planned_in and os.getpid() not in planned_in
    assert tables["data"].num_rows == 10


def test_an_empty_tree_gives_an_empty_version_with_a_revision(tmp_path: Path) -> None:
    (tmp_path / "tree").mkdir()
    catalog = tmp_path / "sources.yaml"
    catalog.write_text(
        "snapshot: empty\nseq_len: 256\nsources:\n"
        "  - id: tree\n    kind: dir\n    uri: tree\n    declared_license: MIT\n"
    )
    ctx = context(tmp_path, catalog, "empty", workers=2)
    m = _collected(ctx)
    assert m.rows == 0
    spec = ctx.catalog.source("tree")
    files = collect.dir_source(
        spec, str(tmp_path / "tree"), Scope(spec, None), ctx.catalog.collect, 10
    )
    assert m.extra["revision"] == files.revision


def test_a_source_that_cannot_be_collected_fails_the_stage_and_leaves_no_version_begun(
    tmp_path: Path, catalog: Path
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True)
    missing = "1" * 40  # a commit the repository does not hold
    catalog.write_text(
        catalog.read_text()
        + "  - id: repo\n    kind: git\n    uri: repo\n    declared_license: MIT\n"
        + f"    revision: '{missing}'\n"
    )
    ctx = context(tmp_path / "run", catalog, "fails", workers=2)
    stage = ctx.registry.get("raw_files")
    with pytest.raises(collect.CollectError, match="repo"):
        list(run_stage(ctx, stage, ["tree", "repo"]))
    for source in ("tree", "repo"):
        with pytest.raises(NoVersionError):
            ctx.store.latest("raw_files", source)
        folder = Path(ctx.store.partition_dir("raw_files", source))
        assert not folder.exists() or not [p for p in folder.iterdir() if p.is_dir()]


def test_chunks_are_joined_into_slices_across_units_while_they_fit_in_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(directory, "SLICE_FILES", 10)
    monkeypatch.setattr(directory, "SLICE_BYTES", 1000)
    walked = [
        [(10, 50), (3, 10)],  # a full chunk, then a unit's small last chunk
        [(4, 20)],  # joined to it
        [],  # a unit with nothing in it
        [(2, 990), (9, 10)],
        [(1, 1)],
    ]
    got = _slices_of("src", walked)
    assert [s.chunks for s in got] == [
        ((0, 0),),
        ((0, 1), (1, 0)),  # with (3, 0) it would hold 1,020 bytes
        ((3, 0),),  # with (3, 1), 11 files
        ((3, 1), (4, 0)),
    ]
    sizes = {(u, c): nb for u, chunks in enumerate(walked) for c, nb in enumerate(chunks)}
    for s in got:  # never over a slice's worth, but for one chunk alone
        held = [sizes[c] for c in s.chunks]
        n, b = sum(x for x, _ in held), sum(y for _, y in held)
        assert len(held) == 1 or (n <= 10 and b <= 1000), (s.chunks, n, b)
    assert [s.index for s in got] == [0, 1, 2, 3]
    assert _slices_of("src", []) == [] and _slices_of("src", [[], []]) == []
