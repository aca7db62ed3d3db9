"""Every snapshot carries a dataset card the Hugging Face Hub renders: `datasets` loads both
splits from the snapshot folder with no data_files argument, the front matter names the
licences and the size, and `megacpp verify` refuses a card whose figures are not the
manifest's."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
import yaml

from megacpp_pipeline import cli
from megacpp_pipeline.snapshot.card import (
    CARD,
    CardInputs,
    licence_ids,
    read_front_matter,
    render_card,
    size_category,
)
from megacpp_pipeline.snapshot.promote import read_manifest
from megacpp_pipeline.snapshot.verify import check_documents, check_ledger
from tests.fixtures.snapshot_fixture import build_snapshot

datasets = pytest.importorskip("datasets", reason="datasets is a dev dependency")


def test_load_dataset_on_the_snapshot_folder_alone_gives_both_splits(tmp_path: Path) -> None:
    fixture = build_snapshot(tmp_path / "snap")
    loaded = datasets.load_dataset(str(fixture.path), cache_dir=str(tmp_path / "hf"))
    assert set(loaded) == {"train", "validation"}
    for split in ("train", "validation"):
        assert len(loaded[split]) == read_manifest(fixture.path).splits[split].rows, split
        assert len(loaded[split][0]["input_ids"]) == fixture.seq_len


def test_the_front_matter_has_licences_size_and_the_manifest_figures(tmp_path: Path) -> None:
    fixture = build_snapshot(tmp_path / "snap")
    front = read_front_matter(fixture.path)
    manifest = read_manifest(fixture.path)
    assert front["license"] == ["mit"]
    assert front["size_categories"] == [size_category(manifest.documents)]
    assert front["megacpp"]["snapshot_id"] == manifest.snapshot_id
    assert front["megacpp"]["splits"]["train"]["rows"] == manifest.splits["train"].rows
    text = (fixture.path / CARD).read_text()
    assert "## From collected to kept" in text and "## How to read it" in text


def test_verify_refuses_a_card_whose_figures_differ_from_the_manifest(tmp_path: Path) -> None:
    fixture = build_snapshot(tmp_path / "snap")
    card = fixture.path / CARD
    head, _, body = card.read_text().partition("\n---\n")
    front = yaml.safe_load(head.removeprefix("---\n"))
    front["megacpp"]["documents"] += 1
    card.write_text("---\n" + yaml.safe_dump(front, sort_keys=False) + "---\n" + body)
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = cli.main(["verify", str(fixture.path)])
    assert code == 1
    assert "dataset_card" in err.getvalue() and "megacpp.documents" in err.getvalue()


def test_licence_ids_split_expressions_into_lowercase_ids() -> None:
    assert licence_ids(["MIT AND (BSL-1.0 OR Apache-2.0 WITH LLVM-exception)", None]) == [
        "apache-2.0",
        "bsl-1.0",
        "llvm-exception",
        "mit",
    ]


def test_the_card_and_the_checks_count_labels_across_row_groups(tmp_path: Path) -> None:
    """Each row group of the ledger brings its own dictionary of labels (kept rows first,
    the drops in later groups): the card's funnel and the ledger check count across them."""
    fixture = build_snapshot(tmp_path / "snap", row_group_rows=3, dropped=5)
    manifest = read_manifest(fixture.path)
    text = render_card(fixture.path, manifest, CardInputs())
    assert "exact_duplicate" in text and "near_duplicate" in text
    outcome = check_ledger(fixture.path, manifest)
    assert outcome.passed, outcome.messages
    assert check_documents(fixture.path, manifest).passed
