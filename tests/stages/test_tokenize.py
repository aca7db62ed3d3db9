"""The tokenized_docs stage end to end: the snapshot's train and validation shards are byte
for byte the same whichever encoder runs (the fast one, or tokenizers forced by config); the
version's manifest names the encoder that ran and why; a pinned artifact the fast encoder
cannot reproduce falls back with a warning, or fails the stage when `encoder: fast` is set;
the round-trip check fails on ids that do not decode to their text."""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc
import pytest

from megacpp_pipeline.corpus.encoders import FastEncoderRefusedError
from megacpp_pipeline.corpus.tokenizer import (
    SPECIAL_TOKENS,
    TokenizerConfig,
    save_tokenizer,
    train_tokenizer,
)
from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.runner import checks_of, run_all, run_stage
from megacpp_pipeline.stages import default_registry
from megacpp_pipeline.storage.store import ShardStore
from tests.fixtures.catalogs import load_catalog
from tests.fixtures.pipeline_corpus import write_catalog
from tests.fixtures.tokenizer_artifacts import improper_merges

SOURCES = ("tree", "repo")


def context(tmp_path: Path, catalog: Path, name: str, stages: str) -> StageContext:
    """A run of `catalog` with `stages` (yaml lines) added to its stages, after the tokenizer
    section (the fixture's has none of its own), on a data dir of its own."""
    assert "  tokenize:" not in catalog.read_text()
    text = catalog.read_text().replace("  packing:\n", stages + "  packing:\n", 1)
    path = catalog.with_name(f"sources-{name}.yaml")
    path.write_text(text)
    registry = default_registry()
    return StageContext(
        load_catalog(path, registry),
        ShardStore(str(tmp_path / f"data-{name}")),
        registry,
        tmp_path / f"cache-{name}",
        run_id=name,
        workers=1,
    )


def snapshot_shards(ctx: StageContext) -> dict[str, bytes]:
    snapshot = Path(ctx.store.latest("snapshot", None).extra["snapshot_dir"])
    return {
        p.relative_to(snapshot).as_posix(): p.read_bytes()
        for split in ("train", "validation")
        for p in sorted((snapshot / split).glob("*.parquet"))
    }


def test_snapshot_shards_are_byte_identical_whichever_encoder_runs(tmp_path: Path) -> None:
    catalog, _ = write_catalog(tmp_path)
    runs = {}
    for encoder in ("auto", "tokenizers"):
        ctx = context(tmp_path, catalog, encoder, f"  tokenize:\n    encoder: {encoder}\n")
        run_all(ctx)  # every stage, every blocking check
        runs[encoder] = ctx
    shards = {name: snapshot_shards(ctx) for name, ctx in runs.items()}
    assert {"train/part-00000.parquet", "validation/part-00000.parquet"} <= set(shards["auto"])
    assert shards["auto"] == shards["tokenizers"]
    for source in SOURCES:
        fast, reference = (runs[e].store.latest("tokenized_docs", source) for e in runs)
        assert fast.extra["encoder"].startswith("tiktoken ")
        assert "same ids as tokenizers" in fast.extra["encoder_why"]
        assert reference.extra["encoder"].startswith("tokenizers ")
        assert reference.extra["encoder_why"] == "configured: encoder tokenizers"
        assert [f.sha256 for f in fast.files] == [f.sha256 for f in reference.files]


def pinned_improper_artifact(tmp_path: Path) -> str:
    texts = ["int main() { return 0; }\n", "// Größe <EMAIL>\nstruct S { int x; };\n"] * 40
    tok = improper_merges(train_tokenizer(texts, TokenizerConfig(vocab_size=400)))
    info = save_tokenizer(tok, tmp_path / "pinned-tokenizer.json")
    return (
        f"  tokenizer:\n    path: {tmp_path / 'pinned-tokenizer.json'}\n    sha256: {info.sha256}\n"
    )


def test_an_artifact_the_fast_encoder_cannot_reproduce_falls_back_or_fails_as_configured(
    tmp_path: Path,
) -> None:
    catalog, _ = write_catalog(tmp_path)
    catalog.write_text(
        catalog.read_text().replace("    vocab_size: 600\n    min_frequency: 2\n", "")
    )
    pinned = pinned_improper_artifact(tmp_path)
    registry = default_registry()
    upto = list(registry)[: registry.names().index("tokenized_docs")]
    for encoder in ("auto", "fast"):
        ctx = context(tmp_path, catalog, encoder, f"{pinned}  tokenize:\n    encoder: {encoder}\n")
        logged: list[str] = []
        ctx.log = logged.append
        for stage in upto:
            list(run_stage(ctx, stage, ctx.partitions(stage)))
        tokenize = registry.get("tokenized_docs")
        if encoder == "fast":
            refused = r"tokenizer\.json: .*load sample.*from token"
            with pytest.raises(FastEncoderRefusedError, match=refused):
                list(run_stage(ctx, tokenize, list(SOURCES)))
            continue
        with pytest.warns(UserWarning, match="differs from tokenizers on the load sample"):
            list(run_stage(ctx, tokenize, list(SOURCES)))
        m = ctx.store.latest("tokenized_docs", "tree")
        assert m.extra["encoder"].startswith("tokenizers ")
        assert "differs from tokenizers on the load sample" in m.extra["encoder_why"]
        assert any("warning: fast encoder not used" in line for line in logged), logged
        outcomes = [c.evaluate(ctx, tokenize, "tree") for c in checks_of(tokenize)]
        assert all(o.passed for o in outcomes), [o.description for o in outcomes]


def test_the_round_trip_check_names_a_document_whose_ids_do_not_decode_to_its_text(
    tmp_path: Path,
) -> None:
    catalog, _ = write_catalog(tmp_path)
    ctx = context(tmp_path, catalog, "check", "")
    registry = ctx.registry
    tokenize = registry.get("tokenized_docs")
    for stage in list(registry)[: registry.names().index("tokenized_docs") + 1]:
        list(run_stage(ctx, stage, ctx.partitions(stage)))
    (check,) = [c for c in checks_of(tokenize) if c.name == "every_document_round_trips"]
    assert check.evaluate(ctx, tokenize, "tree").passed
    good = ctx.store.latest("tokenized_docs", "tree")
    table = next(ctx.store.iter_tables(good))
    ids = table["token_ids"].combine_chunks()
    flat = ids.flatten()
    first = flat[0].as_py()
    assert first > len(SPECIAL_TOKENS)  # an ordinary token: its neighbour id is another one
    swapped = pc.if_else(pc.equal(flat, first), first - 1, flat)
    bad_ids = type(ids).from_arrays(ids.offsets, swapped)
    version = ctx.store.begin("tokenized_docs", "tree", code_version=good.code_version)
    version.table("data", table.schema).write(
        table.set_column(table.schema.get_field_index("token_ids"), "token_ids", bad_ids)
    )
    version.commit(stats=good.stats)
    outcome = check.evaluate(ctx, tokenize, "tree")
    assert not outcome.passed
    assert outcome.description is not None and "does not decode to its text" in outcome.description
    assert table["path"][0].as_py() in outcome.description
