"""Source weights end to end: a source weighted 2.5 has every document in the rows twice and
about half of them three times, one weighted 0.5 about half of its documents once; the rest
of the snapshot stays whole (every kept file in one document, the ledger, every promotion
check: pieces per copy, draws recomputed from the weights, the Megatron export), an epoch of
the loader over the rows holds each document exactly as many times as it was drawn, and the
weights are in the manifest, the card and `megacpp diff`."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from megacpp_pipeline.corpus.tokenizer import special_ids
from megacpp_pipeline.loader import PackedRowsLoader
from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.runner import run_all
from megacpp_pipeline.snapshot.card import CARD
from megacpp_pipeline.snapshot.diff import diff_snapshots, render_markdown
from megacpp_pipeline.snapshot.promote import read_manifest
from megacpp_pipeline.snapshot.verify import verify_snapshot
from megacpp_pipeline.stages import default_registry
from megacpp_pipeline.storage.store import ShardStore
from tests.fixtures.catalogs import load_catalog
from tests.fixtures.pipeline_corpus import write_catalog


def weighted(catalog: Path, name: str, weights: dict[str, float]) -> Path:
    text = catalog.read_text()
    for source, weight in weights.items():
        anchor = f"  - id: {source}\n"
        text = text.replace(anchor, f"{anchor}    weight: {weight}\n", 1)
    out = catalog.with_name(f"sources-{name}.yaml")
    out.write_text(text)
    return out


def promote(root: Path, catalog: Path, name: str) -> Path:
    registry = default_registry()
    ctx = StageContext(
        load_catalog(catalog, registry),
        ShardStore(str(root / f"data-{name}")),
        registry,
        root / "cache",
        run_id=name,
        workers=2,
    )
    run_all(ctx)  # every stage and every blocking check, the promotion checks included
    return Path(ctx.store.latest("snapshot", None).extra["snapshot_dir"])


@pytest.fixture(scope="module")
def snapshots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("weights")
    catalog, _ = write_catalog(root)
    return {
        "plain": promote(root, catalog, "plain"),
        "weighted": promote(
            root, weighted(catalog, "weighted", {"tree": 2.5, "repo": 0.5}), "weighted"
        ),
    }


def test_each_document_is_drawn_as_its_sources_weight_says(snapshots: dict[str, Path]) -> None:
    docs = pq.read_table(snapshots["weighted"] / "documents.parquet").to_pylist()
    draws: dict[str, Counter[int]] = {"tree": Counter(), "repo": Counter()}
    for d in docs:
        draws[d["source_id"]][d["draws"]] += 1
    assert set(draws["tree"]) == {2, 3} and set(draws["repo"]) == {0, 1}
    plain = pq.read_table(snapshots["plain"] / "documents.parquet")
    assert set(plain["draws"].to_pylist()) == {1}
    assert len(docs) == plain.num_rows  # weights change the rows, never the documents
    manifest = read_manifest(snapshots["weighted"])
    for source, weight in (("tree", 2.5), ("repo", 0.5)):
        entry = manifest.sources[source]
        assert entry.weight == weight
        assert entry.documents == sum(draws[source].values())
        assert entry.sequences == sum(k * n for k, n in draws[source].items())
    total = sum(s.sequences or 0 for s in manifest.splits.values())
    assert total == sum(d["draws"] for d in docs)


def test_a_documents_copies_are_whole_and_never_share_a_row(snapshots: dict[str, Path]) -> None:
    snap = snapshots["weighted"]
    pieces = pq.read_table(snap / "pieces.parquet").to_pylist()
    docs = {d["doc_id"]: d for d in pq.read_table(snap / "documents.parquet").to_pylist()}
    per_copy: dict[tuple[int, int], list[int]] = {}
    rows_of: dict[int, list[int]] = {}
    for p in pieces:
        per_copy.setdefault((p["doc_id"], p["copy"]), []).append(p["piece_index"])
        rows_of.setdefault(p["doc_id"], []).append(p["pack_id"])
    for doc_id, doc in docs.items():
        copies = sorted(c for d, c in per_copy if d == doc_id)
        assert copies == list(range(doc["draws"]))
        for c in copies:
            assert sorted(per_copy[(doc_id, c)]) == list(range(doc["num_pieces"]))
        if doc["draws"] > 1:
            rows = rows_of[doc_id]
            assert len(rows) == len(set(rows))  # a copy never lands in another copy's row


def test_an_epoch_of_the_loader_holds_each_document_as_often_as_it_was_drawn(
    snapshots: dict[str, Path], tmp_path: Path
) -> None:
    snap = snapshots["weighted"]
    docs = pq.read_table(snap / "documents.parquet").to_pylist()
    bos = special_ids().bos
    for split in ("train", "validation"):
        loader = PackedRowsLoader(
            snap, split=split, batch_size=1, drop_last=False, cache_dir=tmp_path / "cache"
        )
        starts: Counter[int] = Counter()
        for batch in loader:  # one epoch
            ids, doc_ids = batch["input_ids"], batch["doc_ids"]
            starts.update(doc_ids[ids == bos].tolist())  # a document copy opens with BOS
        loader.close()
        want = {d["doc_id"]: d["draws"] for d in docs if d["split"] == split and d["draws"]}
        assert dict(starts) == want


def test_verify_recomputes_the_draws_from_the_recorded_weights(
    snapshots: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    snap = tmp_path / "tampered"
    shutil.copytree(snapshots["weighted"], snap)
    manifest = snap / "manifest.json"
    raw = manifest.read_text()
    # a manifest claiming another weight for tree: the copies in the rows no longer match it
    manifest.write_text(raw.replace('"weight": 2.5', '"weight": 1.0', 1))
    outcomes = {o.name: o for o in verify_snapshot(snap)}
    problems = outcomes["document_consistency"].problems
    assert any("weight 1.0 draws it 1 times" in p for p in problems), problems
    # the draws are checked a part of documents.parquet per task: forked workers, each given
    # a few documents, say what one process says
    from megacpp_pipeline.pipeline.executor import LocalExecutor
    from megacpp_pipeline.snapshot import shard_checks
    from megacpp_pipeline.snapshot.verify import draw_problems

    inline = draw_problems(snap, read_manifest(snap))
    monkeypatch.setattr(shard_checks, "DRAW_ROWS", 3)
    assert len(shard_checks.draw_items(snap / "documents.parquet")) > 3
    assert inline and draw_problems(snap, read_manifest(snap), LocalExecutor(2).map) == inline


def test_the_card_and_the_diff_show_the_weights(snapshots: dict[str, Path]) -> None:
    card = (snapshots["weighted"] / CARD).read_text()
    assert "| weight |" in card and "| 2.5 |" in card and "| 0.5 |" in card
    text = render_markdown(diff_snapshots(snapshots["plain"], snapshots["weighted"]))
    assert "| tree | 1.0 | 2.5 |" in text and "| repo | 1.0 | 0.5 |" in text


def test_weights_are_checked_when_the_catalog_is_read(tmp_path: Path) -> None:
    from megacpp_pipeline.core.catalog import CatalogError

    catalog, _ = write_catalog(tmp_path)
    for bad in (0, -1):
        with pytest.raises(CatalogError, match=r"source 'tree': field weight: .*greater than 0"):
            load_catalog(weighted(catalog, f"bad{bad}", {"tree": bad}))
    assert np.isclose(load_catalog(weighted(catalog, "ok", {"tree": 0.25})).sources[0].weight, 0.25)
