"""Where a run's tokenizer comes from (`stages: {tokenizer: {mode: ...}}`): by default a
refresh keeps the last promoted snapshot's tokenizer, so only the files that changed are
tokenized again and the snapshot says where its tokenizer came from (manifest, card, diff);
`train` trains a new one and says so; a vocabulary size the config changed trains too."""

from __future__ import annotations

from pathlib import Path

import pytest

from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.runner import run_all
from megacpp_pipeline.snapshot.card import CARD
from megacpp_pipeline.snapshot.diff import diff_snapshots, render_markdown
from megacpp_pipeline.snapshot.promote import read_manifest
from megacpp_pipeline.stages import default_registry
from megacpp_pipeline.storage.store import ShardStore
from tests.fixtures.catalogs import load_catalog
from tests.fixtures.pipeline_corpus import write_catalog


def run(tmp_path: Path, catalog: Path, run_id: str) -> tuple[StageContext, Path]:
    """Every stage and check over `catalog`, always into the same data dir and cache."""
    registry = default_registry()
    ctx = StageContext(
        load_catalog(catalog, registry),
        ShardStore(str(tmp_path / "data")),
        registry,
        tmp_path / "cache",
        run_id=run_id,
        workers=1,
    )
    run_all(ctx)
    return ctx, Path(ctx.store.latest("snapshot", None).extra["snapshot_dir"])


def with_tokenizer(catalog: Path, name: str, section: str) -> Path:
    """The catalog with its tokenizer section's lines replaced by `section`."""
    text = catalog.read_text().replace(
        "  tokenizer:\n    vocab_size: 600\n    min_frequency: 2\n", section, 1
    )
    assert text != catalog.read_text()
    out = catalog.with_name(f"sources-{name}.yaml")
    out.write_text(text)
    return out


def retokenized(ctx: StageContext) -> dict[str, int]:
    out = {}
    for source in ctx.sources():
        m = ctx.store.latest("tokenized_docs", source)
        # a version an earlier run made stands when its inputs did not change: none tokenized
        fresh = m.run_id == ctx.run_id
        out[source] = int(m.stats["input_files"] - m.stats["cached_files"]) if fresh else 0
    return out


@pytest.fixture(scope="module")
def refreshed(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The test corpus promoted once (trained: nothing to reuse), then again after one
    header of the directory source changed (default mode: reuse)."""
    root = tmp_path_factory.mktemp("policy")
    catalog, _ = write_catalog(root)
    first_ctx, first = run(root, catalog, "first")
    first_tokenized = retokenized(first_ctx)
    changed = root / "corpus_dir" / "include" / "lib3" / "container.hpp"
    changed.write_text(changed.read_text() + "\n// refreshed upstream\n")
    second_ctx, second = run(root, catalog, "second")
    return {
        "root": root,
        "catalog": catalog,
        "first": first,
        "second": second,
        "first_tokenized": first_tokenized,
        "second_tokenized": retokenized(second_ctx),
    }


def test_the_first_snapshot_trains_because_there_is_nothing_to_reuse(refreshed: dict) -> None:
    policy = read_manifest(refreshed["first"]).tokenizer_policy
    assert policy["mode"] == "reuse" and policy["decision"] == "trained"
    assert policy["reason"] == "no promoted testsnap snapshot"


def test_a_refresh_keeps_the_tokenizer_and_retokenizes_only_the_changed_file(
    refreshed: dict,
) -> None:
    first, second = read_manifest(refreshed["first"]), read_manifest(refreshed["second"])
    assert second.snapshot_id != first.snapshot_id
    assert second.tokenizer["sha256"] == first.tokenizer["sha256"]
    assert second.tokenizer_policy["decision"] == "reused"
    assert second.tokenizer_policy["from_snapshot"] == first.snapshot_id
    assert refreshed["second_tokenized"] == {"tree": 1, "repo": 0}
    assert refreshed["first_tokenized"]["tree"] > 1  # the first run tokenized them all
    card = (refreshed["second"] / CARD).read_text()
    assert f"Tokenizer origin: kept from `{first.snapshot_id}` (mode reuse)." in card
    text = render_markdown(diff_snapshots(refreshed["first"], refreshed["second"]))
    assert "tree changed: `include/lib3/container.hpp`" in text
    assert f"Tokenizer changed: no (kept from `{first.snapshot_id}` (mode reuse))." in text


def test_mode_train_trains_again_and_says_so_in_the_card_and_the_diff(refreshed: dict) -> None:
    root = refreshed["root"]
    catalog = with_tokenizer(
        refreshed["catalog"], "train", "  tokenizer:\n    mode: train\n    vocab_size: 600\n"
    )
    _, third = run(root, catalog, "third")
    policy = read_manifest(third).tokenizer_policy
    assert (policy["mode"], policy["decision"]) == ("train", "trained")
    card = (third / CARD).read_text()
    assert "Tokenizer origin: trained for this snapshot (mode train" in card
    assert "cannot continue on this one without re-tokenizing" in card
    text = render_markdown(diff_snapshots(refreshed["second"], third))
    assert "(trained for this snapshot (mode train: a new vocabulary))." in text


def test_reuse_trains_when_the_config_asks_for_another_vocabulary_size(
    refreshed: dict, tmp_path: Path
) -> None:
    root = refreshed["root"]
    catalog = with_tokenizer(refreshed["catalog"], "vocab", "  tokenizer:\n    vocab_size: 700\n")
    ctx, snap = run(root, catalog, "vocab")
    manifest = read_manifest(snap)
    assert manifest.tokenizer_policy["decision"] == "trained"
    assert "vocab_size 700 in the config, 600 in testsnap-" in manifest.tokenizer_policy["reason"]
    assert manifest.vocab_size == 700
    assert min(retokenized(ctx).values()) > 0  # a new vocabulary: every file again
