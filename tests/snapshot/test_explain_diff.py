"""`megacpp explain` and `megacpp diff` answer from a snapshot on disk alone: where a kept,
an exact-duplicate, a near-duplicate, a licence-denied and a never-collected file went;
whether some content is in the corpus; and what changed when a source moved to a new commit
(which the nightly refresh also writes into the new snapshot's card)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from megacpp_pipeline import cli
from megacpp_pipeline.snapshot.layout import CARD
from tests.fixtures.pipeline_corpus import write_catalog

REPO = Path(__file__).resolve().parents[2]


def _run(root: Path, catalog: Path) -> Path:
    env = {**os.environ, "DAGSTER_HOME": str(root / "home")}
    out = subprocess.run(
        [sys.executable, "-m", "assets.cli", "run", "--config", str(catalog),
         "--data-dir", str(root / "data"), "--cache-dir", str(root / "cache")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return Path(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def two_snapshots(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The test corpus at its pinned commit, then with the git source moved to its head
    (one more header, include/late.hpp)."""
    root = tmp_path_factory.mktemp("explain")
    catalog, _ = write_catalog(root)
    first = _run(root, catalog)
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=root / "corpus_git", capture_output=True, text=True,
        check=True,
    ).stdout.strip()  # fmt: skip
    data = yaml.safe_load(catalog.read_text())
    data["sources"][1]["revision"] = head
    moved = root / "moved.yaml"
    moved.write_text(yaml.safe_dump(data))
    second = _run(root, moved)
    return {"root": root, "first": first, "second": second, "head": head}


def megacpp(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = cli.main(list(argv))
    return code, out.getvalue()


def test_a_kept_file_names_its_document_split_rows_and_licence(two_snapshots: dict) -> None:
    code, text = megacpp("explain", str(two_snapshots["first"]), "tree:include/lib4/container.hpp")
    assert code == 0, text
    assert "in corpus   doc " in text and "split " in text and "rows (pack_id)" in text
    assert "licence     MIT (decided from file)" in text
    assert "scrubbed    email" in text  # lib4 carries an author address
    assert "kept by     raw_files -> normalized_files" in text


def test_an_exact_duplicate_names_its_cluster_and_the_kept_copy(two_snapshots: dict) -> None:
    code, text = megacpp(
        "explain", str(two_snapshots["first"]), "repo:third_party/lib1/container.hpp"
    )
    assert code == 1, text
    assert "dropped at  deduped_files: exact_duplicate" in text
    assert "kept copy   tree:include/lib1/container.hpp" in text
    assert "because     cluster " in text


def test_a_near_duplicate_names_its_estimated_similarity(two_snapshots: dict) -> None:
    code, text = megacpp(
        "explain", str(two_snapshots["first"]), "repo:third_party/lib2/container.hpp"
    )
    assert code == 1, text
    assert "deduped_files: near_duplicate" in text and "estimated jaccard" in text


def test_a_licence_denied_file_names_the_expression(two_snapshots: dict) -> None:
    code, text = megacpp("explain", str(two_snapshots["first"]), "tree:include/gpl_only.hpp")
    assert code == 1, text
    assert "dropped at  licensed_files: license_denied" in text and "GPL-3.0-only" in text
    assert "kept by     raw_files -> normalized_files -> classified_files -> quality_files" in text


def test_a_file_never_collected_says_so_with_the_revision(two_snapshots: dict) -> None:
    code, text = megacpp("explain", str(two_snapshots["first"]), "repo:include/late.hpp")
    assert code == 1
    assert "not collected: no such file in source repo at revision" in text


def test_file_finds_present_content_by_hash_and_misses_absent_content(
    two_snapshots: dict, tmp_path: Path
) -> None:
    root = two_snapshots["root"]
    present = root / "corpus_dir" / "include" / "lib3" / "container.hpp"
    code, text = megacpp("explain", str(two_snapshots["first"]), "--file", str(present))
    assert code == 0, text
    assert "tree:include/lib3/container.hpp" in text
    absent = tmp_path / "absent.hpp"
    absent.write_text("#pragma once\nnamespace elsewhere { int totally_unrelated_function(); }\n")
    code, text = megacpp("explain", str(two_snapshots["first"]), "--file", str(absent))
    assert code == 1 and "not in" in text


def test_file_finds_a_reindented_copy_as_a_near_duplicate(
    two_snapshots: dict, tmp_path: Path
) -> None:
    original = (
        two_snapshots["root"] / "corpus_dir" / "include" / "lib5" / "container.hpp"
    ).read_text()
    copy = tmp_path / "mine.hpp"
    copy.write_text(original.replace("  ", "    ") + "// my local change\n")
    code, text = megacpp("explain", str(two_snapshots["first"]), "--file", str(copy))
    assert code == 0, text
    assert "near duplicate of tree:include/lib5/container.hpp" in text


def test_diff_names_the_moved_source_and_the_added_file(two_snapshots: dict) -> None:
    code, text = megacpp("diff", str(two_snapshots["first"]), str(two_snapshots["second"]))
    assert code == 0, text
    assert "| repo | `" in text and two_snapshots["head"] in text
    assert "repo added: `include/late.hpp`" in text
    assert "Tokenizer changed:" in text
    card = (two_snapshots["second"] / CARD).read_text()
    assert "## Changes since the previous snapshot" in card and "include/late.hpp" in card


def test_sha256_answers_in_corpus_when_any_copy_is_kept(two_snapshots: dict) -> None:
    """The copies a hash finds come in ledger order, a dropped duplicate perhaps first (here
    the kept copy leads): the answer is whether any of them reached the corpus."""
    root, snap = two_snapshots["root"], str(two_snapshots["first"])
    digest = hashlib.sha256(
        (root / "corpus_dir" / "include" / "lib1" / "container.hpp").read_bytes()
    ).hexdigest()
    code, text = megacpp("explain", snap, "--sha256", digest)
    assert "repo:third_party/lib1/container.hpp" in text, text  # the dropped copy
    assert "tree:include/lib1/container.hpp" in text and code == 0, text


def test_sha256_reads_a_ledger_written_before_it_held_hashes(
    two_snapshots: dict, tmp_path: Path
) -> None:
    """Snapshots from before the ledger's sha256 column: the kept documents still answer."""
    import shutil

    import pyarrow.parquet as pq

    old = tmp_path / "old-snapshot"
    shutil.copytree(two_snapshots["first"], old)
    ledger = pq.read_table(old / "ledger.parquet")
    pq.write_table(ledger.drop_columns(["sha256"]), old / "ledger.parquet")
    data = (
        two_snapshots["root"] / "corpus_dir" / "include" / "lib3" / "container.hpp"
    ).read_bytes()
    code, text = megacpp("explain", str(old), "--sha256", hashlib.sha256(data).hexdigest())
    assert code == 0, text
    assert "tree:include/lib3/container.hpp" in text
