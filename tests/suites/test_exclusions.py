"""What must not be in a training corpus, end to end: a catalog with a pinned benchmark and a
removal list gives a snapshot without the planted benchmark solution and without the removed
files; the ledger says why (benchmark and task ids, the entry that matched), the blocking
checks prove it, and the card and the quality report show it, including a near duplicate of
a removed file that stays because no entry names it."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from megacpp_pipeline.snapshot.layout import CARD
from tests.fixtures import benchmark_tasks
from tests.fixtures.pipeline_corpus import write_catalog

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("exclusions")
    catalog, _ = write_catalog(root)
    tasks = benchmark_tasks.build(n_tasks=40, seed=3)
    (root / "evals").mkdir()
    bench = benchmark_tasks.write_jsonl(tasks, root / "evals" / "cpp_tasks.jsonl")
    task = tasks[7]
    rng = random.Random(0)
    host = (root / "corpus_dir" / "src" / "lib3.cc").read_text()
    planted = root / "corpus_dir" / "src" / "planted.cc"
    planted.write_text(
        benchmark_tasks.plant(
            host.replace("lib3", "lib33"), benchmark_tasks.planted_text(task, "verbatim", rng), rng
        )
    )
    by_content = root / "corpus_dir" / "include" / "lib8" / "container.hpp"
    data = yaml.safe_load(catalog.read_text())
    data["benchmarks"] = [{
        "id": "cppeval", "uri": "evals/cpp_tasks.jsonl", "format": "jsonl",
        "sha256": hashlib.sha256(bench.read_bytes()).hexdigest(),
        "fields": ["prompt", "canonical_solution", "test"],
    }]  # fmt: skip
    data["removals"] = [
        {"source": "tree", "path": "src/lib7.cc", "reason": "author request"},
        {"sha256": hashlib.sha256(by_content.read_bytes()).hexdigest()},
        # its re-indented copy in repo (a near duplicate) is another file: it stays
        {"source": "tree", "path": "include/lib2/container.hpp"},
    ]
    catalog.write_text(yaml.safe_dump(data))
    env = {**os.environ, "DAGSTER_HOME": str(root / "home")}
    out = subprocess.run(
        [sys.executable, "-m", "assets.cli", "run", "--config", str(catalog),
         "--data-dir", str(root / "data"), "--cache-dir", str(root / "cache")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return {"snap": Path(out.stdout.strip().splitlines()[-1]), "task": task, "root": root}


def _ledger(run: dict) -> dict[tuple[str, str], dict]:
    rows = pq.read_table(run["snap"] / "ledger.parquet").to_pylist()
    return {(r["source_id"], r["path"]): r for r in rows}


def test_the_planted_benchmark_solution_is_dropped_naming_benchmark_and_task(run: dict) -> None:
    row = _ledger(run)[("tree", "src/planted.cc")]
    assert (row["status"], row["stage"], row["reason"]) == (
        "dropped", "decontaminated_files", "benchmark_contamination"
    )  # fmt: skip
    assert "cppeval" in row["detail"] and run["task"].task_id in row["detail"]


def test_removed_files_are_dropped_before_scrub_naming_their_entry(run: dict) -> None:
    ledger = _ledger(run)
    for path, entry in (
        ("src/lib7.cc", "source tree path src/lib7.cc (reason: author request)"),
        ("include/lib8/container.hpp", "sha256 "),
        ("include/lib2/container.hpp", "source tree path include/lib2/container.hpp"),
    ):
        row = ledger[("tree", path)]
        assert (row["status"], row["stage"], row["reason"]) == (
            "dropped", "removed_files", "removed_on_request"
        ), path  # fmt: skip
        assert entry in row["detail"], row["detail"]


def test_no_removed_or_contaminated_content_is_a_document(run: dict) -> None:
    documents = pq.read_table(run["snap"] / "documents.parquet").to_pylist()
    paths = {(d["source_id"], d["path"]) for d in documents}
    for gone in (
        "src/planted.cc",
        "src/lib7.cc",
        "include/lib8/container.hpp",
        "include/lib2/container.hpp",
    ):
        assert ("tree", gone) not in paths
    # the near duplicate of the removed lib2 header is another file: it is kept now
    assert ("repo", "third_party/lib2/container.hpp") in paths


def test_the_card_and_the_report_show_benchmarks_removals_and_the_near_duplicate_left(
    run: dict,
) -> None:
    card = (run["snap"] / CARD).read_text()
    assert "| cppeval | 40 | 1 | 0 |" in card
    assert "3 removal entries; 3 files removed on request." in card
    assert "1 near duplicates of removed files remain" in card
    report = (run["snap"] / "report" / "quality_report.html").read_text()
    assert "<td>cppeval</td><td>40</td><td>1</td><td>0</td>" in report
    assert "repo:third_party/lib2/container.hpp is another file, a near duplicate" in report
