"""Repository-level documents end to end: the same three sources run in file mode and in
repository mode (`stages: {documents: {mode: repository}}`), through every stage without
Dagster. Repository mode promotes a snapshot that passes every promotion check (round trip
of every document and of every member file with FIM on, the loader, the Megatron read-back),
keeps the same files with the same text as file mode, orders every document's members after
the files they include (checked against an include resolver written here), takes include
roots from the source's compile_commands.json, splits a source past max_tokens along its
directories, and `megacpp explain` shows where a file sits in its document."""

from __future__ import annotations

import json
import posixpath
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml

from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.runner import run_all
from megacpp_pipeline.snapshot import verify
from megacpp_pipeline.snapshot.promote import SnapshotConfig, latest_snapshot, read_manifest
from megacpp_pipeline.snapshot.texts import file_texts
from megacpp_pipeline.stages import default_registry
from megacpp_pipeline.stages.documents import include_roots
from megacpp_pipeline.storage.store import ShardStore
from tests.fixtures.catalogs import load_catalog
from tests.fixtures.pipeline_corpus import write_catalog

REPO = Path(__file__).resolve().parents[2]
MAX_TOKENS = 2500

_HEADER = """\
// SPDX-License-Identifier: MIT
#pragma once
{includes}
#include <cstdint>
#include <string>

namespace engine {{

/// {doc}
class {name} {{
 public:
  explicit {name}(std::uint32_t id) : id_(id) {{}}
  std::uint32_t id() const noexcept {{ return id_; }}
  std::string describe() const {{
    std::string out = "{name}#";
    out += std::to_string(id_);
    return out;
  }}

 private:
  std::uint32_t id_;
}};

}}  // namespace engine
"""

# engine: headers under lib/core (not an include/ or src/ dir: only its compile database says
# it is an include root), a cycle (a.hpp <-> b.hpp), and a stale legacy/widget.hpp that an
# angle include must not resolve to.
ENGINE_INCLUDES = {
    "lib/core/config.hpp": [],
    "lib/core/gadget.hpp": ['"config.hpp"'],
    "lib/core/widget.hpp": ['"gadget.hpp"', "<config.hpp>"],
    "lib/core/cycle_a.hpp": ['"cycle_b.hpp"'],
    "lib/core/cycle_b.hpp": ['"cycle_a.hpp"', '"config.hpp"'],
    "legacy/widget.hpp": [],
}
ENGINE_MAIN = """\
// SPDX-License-Identifier: MIT
#include <widget.hpp>
#include "lib/core/cycle_a.hpp"

#include <cstdio>

int main() {
  engine::Widget w(7);
  engine::CycleA a(3);
  std::printf("%s %s\\n", w.describe().c_str(), a.describe().c_str());
  return 0;
}
"""


def write_engine(root: Path) -> None:
    for rel, includes in ENGINE_INCLUDES.items():
        name = "".join(p.capitalize() for p in Path(rel).stem.split("_"))
        if rel.startswith("legacy/"):
            name = "LegacyWidget"
        text = _HEADER.format(
            includes="\n".join(f"#include {i}" for i in includes),
            doc=f"The {name} of the engine ({rel}).",
            name=name,
        )
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "src").mkdir(parents=True)
    (root / "src/main.cpp").write_text(ENGINE_MAIN)
    (root / "build").mkdir()
    home = "/home/dev/engine"
    (root / "build/compile_commands.json").write_text(
        json.dumps(
            [
                {
                    "directory": f"{home}/build",
                    "file": f"{home}/src/main.cpp",
                    "command": f"/usr/bin/g++ -std=c++20 -I{home}/lib/core -o main.o "
                    f"-c {home}/src/main.cpp",
                }
            ]
        )
    )


def _catalog(root: Path, mode: str) -> Path:
    catalog, _ = write_catalog(root)
    write_engine(root / "corpus_engine")
    data = yaml.safe_load(catalog.read_text())
    data["seq_len"] = 1024
    data["sources"].append({
        "id": "engine", "kind": "dir", "uri": "corpus_engine", "declared_license": "MIT",
        "compile_commands": "build/compile_commands.json",
    })  # fmt: skip
    data["stages"]["packing"]["fim_rate"] = 0.5  # FIM must stay inside one member file
    data["stages"]["documents"] = {"mode": mode, "max_tokens": MAX_TOKENS}
    catalog.write_text(yaml.safe_dump(data))
    return catalog


def _run(root: Path, mode: str) -> dict[str, Any]:
    catalog = _catalog(root, mode)
    registry = default_registry()
    ctx = StageContext(
        load_catalog(catalog, registry), ShardStore(str(root / "data")), registry, root / "cache"
    )
    run_all(ctx)  # every stage and its blocking checks; a failed check raises
    snap = latest_snapshot(root / "data")
    assert snap is not None
    return {"snap": snap, "ctx": ctx, "catalog": catalog}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    return {mode: _run(tmp_path_factory.mktemp(mode), mode) for mode in ("file", "repository")}


def _table(snap: Path, name: str) -> list[dict[str, Any]]:
    return pq.read_table(snap / name).to_pylist()


def test_repository_mode_promotes_a_snapshot_every_promotion_check_passes(runs: dict) -> None:
    snap = runs["repository"]["snap"]
    manifest = read_manifest(snap)
    assert manifest.document_mode == "repository"
    outcomes = {
        name: verify.run_check(name, snap, SnapshotConfig(round_trip_sample=100_000))
        for name in verify.ALL_CHECKS
    }
    assert {n: o.problems for n, o in outcomes.items() if not o.passed} == {}
    files = len(_table(snap, "document_files.parquet"))
    assert outcomes["round_trip_decode"].metrics["files_checked"] == files
    assert outcomes["megatron_read_back"].passed and manifest.documents < files


def test_both_modes_keep_the_same_files_with_the_same_text(runs: dict) -> None:
    def kept(mode: str) -> set[tuple[str, str, str]]:
        snap = runs[mode]["snap"]
        return {(f.source_id, f.path, f.text) for f in file_texts(snap, read_manifest(snap))}

    file_mode, repo_mode = kept("file"), kept("repository")
    assert file_mode == repo_mode and len(file_mode) > 20
    ledgers = [pq.read_table(runs[m]["snap"] / "ledger.parquet") for m in ("file", "repository")]
    assert ledgers[0].equals(ledgers[1])


_DIRECTIVE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)


def _resolve(includer: str, quote: str, name: str, paths: set[str], roots: list[str]) -> str | None:
    """The test's own resolver: a quoted include first beside its includer, then the roots
    in order; an angle include only in the roots."""
    here = posixpath.dirname(includer)
    candidates = ([posixpath.join(here, name)] if quote == '"' else []) + [
        posixpath.join(r, name) if r else name for r in roots
    ]
    return next((posixpath.normpath(c) for c in candidates if posixpath.normpath(c) in paths), None)


def test_every_document_puts_a_file_after_the_files_of_it_it_includes(runs: dict) -> None:
    snap = runs["repository"]["snap"]
    texts = {(f.source_id, f.path): f.text for f in file_texts(snap, read_manifest(snap))}
    placed = {(r["source_id"], r["path"]): r for r in _table(snap, "document_files.parquet")}
    roots = {"tree": ["include", "src", ""], "repo": ["include", ""], "engine": ["lib/core", ""]}
    paths = defaultdict(set)
    for source, path in placed:
        paths[source].add(path)
    edges = []
    for (source, path), text in texts.items():
        for quote, name in _DIRECTIVE.findall(text):
            target = _resolve(path, quote, name, paths[source], roots[source])
            if target is not None and target != path:
                edges.append(((source, path), (source, target)))
    edge_set = set(edges)
    checked = set()
    for includer, included in edges:
        a, b = placed[includer], placed[included]
        if a["doc_id"] != b["doc_id"] or (included, includer) in edge_set:
            continue  # another document, or a cycle (either order is one broken edge)
        assert b["position"] < a["position"], f"{includer[1]} comes before {included[1]}"
        checked.add((includer[1], included[1]))
    # not a vacuous pass: every include of the engine outside its cycle was checked
    assert {
        ("lib/core/gadget.hpp", "lib/core/config.hpp"),
        ("lib/core/widget.hpp", "lib/core/gadget.hpp"),
        ("lib/core/widget.hpp", "lib/core/config.hpp"),
        ("lib/core/cycle_b.hpp", "lib/core/config.hpp"),
        ("src/main.cpp", "lib/core/widget.hpp"),
        ("src/main.cpp", "lib/core/cycle_a.hpp"),
    } <= checked
    # the angle include went to lib/core (the compile database's root), not legacy/
    main, widget = placed[("engine", "src/main.cpp")], placed[("engine", "lib/core/widget.hpp")]
    assert widget["doc_id"] == main["doc_id"] and widget["position"] < main["position"]


def test_include_roots_come_from_the_compile_database_and_the_cycle_is_reported(
    runs: dict,
) -> None:
    ctx = runs["repository"]["ctx"]
    assert include_roots(ctx, "engine") == ["lib/core", ""]
    assert include_roots(ctx, "tree") is None  # no database: the usual include/, src/, root
    manifest = ctx.store.latest("documents", None)
    broken = manifest.extra["broken_includes"]
    assert len(broken) == 1 and "engine: lib/core/cycle_" in broken[0]


def test_a_source_past_max_tokens_is_split_along_its_directories(runs: dict) -> None:
    snap = runs["repository"]["snap"]
    docs = [d for d in _table(snap, "documents.parquet") if d["source_id"] == "tree"]
    assert len(docs) > 1
    assert all(d["text_tokens"] <= MAX_TOKENS or d["num_files"] == 1 for d in docs)
    members = defaultdict(set)
    for r in _table(snap, "document_files.parquet"):
        members[r["doc_id"]].add(r["path"].split("/")[0])
    # the train files (a split is grouped apart) are over budget: cut into include/ and src/
    train = [d for d in docs if d["split"] == "train"]
    assert sorted(d["path"] for d in train) == ["include", "src"]
    assert all(members[d["doc_id"]] == {d["path"]} for d in train)


def test_the_engine_is_one_document_read_in_include_order(runs: dict) -> None:
    snap = runs["repository"]["snap"]
    rows = [r for r in _table(snap, "document_files.parquet") if r["source_id"] == "engine"]
    assert len({r["doc_id"] for r in rows}) == 1
    order = [r["path"] for r in sorted(rows, key=lambda r: r["position"])]
    assert order.index("lib/core/config.hpp") < order.index("lib/core/gadget.hpp")
    assert order.index("lib/core/gadget.hpp") < order.index("lib/core/widget.hpp")
    assert order[-1] == "src/main.cpp"


def test_explain_shows_where_a_file_sits_in_its_repository_document(runs: dict) -> None:
    snap = runs["repository"]["snap"]
    row = next(
        r for r in _table(snap, "document_files.parquet") if r["path"] == "lib/core/widget.hpp"
    )
    out = subprocess.run(
        [sys.executable, "-m", "megacpp_pipeline.cli", "explain", str(snap),
         "engine:lib/core/widget.hpp"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    start, end = row["start_token"], row["start_token"] + row["num_tokens"]
    assert f"file {row['position'] + 1} of " in out.stdout
    assert f"its tokens {start}..{end}" in out.stdout


def test_the_card_says_what_a_document_is(runs: dict) -> None:
    card = (runs["repository"]["snap"] / "README.md").read_text()
    assert "Repository mode:" in card and "document_mode: repository" in card
    assert "File mode:" in (runs["file"]["snap"] / "README.md").read_text()
