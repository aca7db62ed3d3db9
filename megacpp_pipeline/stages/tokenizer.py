"""tokenizer: a pinned tokenizer.json (sha256 verified) or a byte-level BPE trained
deterministically on a sample of the train split of the deduplicated files; special tokens
(BOS, EOS, PAD, FIM, scrub placeholders) at fixed ids."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from megacpp_pipeline.corpus import tokenizer
from megacpp_pipeline.gates import tokenization
from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.registry import Grain, Materialized, PathValue, Stage
from megacpp_pipeline.storage.store import Manifest

ARTIFACT = "tokenizer.json"


def _body(ctx: StageContext, stage: Stage, partition: str | None) -> Materialized:
    assert stage.input is not None
    config = ctx.config(stage)
    split_config = ctx.config(ctx.registry.get("tokenized_docs"))
    source = ctx.latest(stage.input)
    total = None if config.pinned else train_split_bytes(ctx, source, split_config)
    tok = tokenizer.obtain_tokenizer(config, train_texts(ctx, source, split_config), total)
    training = (
        None
        if total is None
        else {
            "train_split_bytes": total,
            "sample_fraction": tokenizer.effective_fraction(config, total),
            "max_train_bytes": config.max_train_bytes,
        }
    )
    version = ctx.store.begin(
        stage.name, None, code_version=ctx.code_version(stage), config=config, run_id=ctx.run_id
    )
    with tempfile.TemporaryDirectory() as tmp:
        info = tokenizer.save_tokenizer(tok, Path(tmp) / ARTIFACT)
        version.write_file(ARTIFACT, (Path(tmp) / ARTIFACT).read_bytes())
    manifest = version.commit(
        upstream=ctx.upstream_hashes([source]),
        extra={"tokenizer": info.model_dump(), "training": training},
    )
    return Materialized(
        None,
        {
            "sha256": info.sha256,
            "vocab_size": info.vocab_size,
            "special_tokens": info.special_tokens,
            "pinned": config.pinned,
            "training": training or {},
            "tokenizers_version": info.tokenizers_version,
            "manifest": PathValue(ctx.store.manifest_path(manifest)),
        },
    )


def train_split_bytes(
    ctx: StageContext, source: Manifest, split: tokenization.TokenizeConfig
) -> int:
    """Raw bytes of the train split (`size` stands in for the text's: close enough to pick a
    sample fraction)."""
    total = 0
    for name in source.data_tables():
        for t in ctx.store.iter_tables(source, name, columns=["source_id", "path", "size"]):
            splits = tokenization.assign_split(t["source_id"], t["path"], split)
            train = pc.equal(pa.array(splits, pa.string()), "train")
            total += int(pc.sum(pc.filter(t["size"], train)).as_py() or 0)
    return total


def train_texts(
    ctx: StageContext, source: Manifest, split: tokenization.TokenizeConfig
) -> Iterator[str]:
    for name in source.data_tables():
        for t in ctx.store.iter_tables(source, name, columns=["source_id", "path", "text"]):
            splits = tokenization.assign_split(t["source_id"], t["path"], split)
            for text, which in zip(t["text"].to_pylist(), splits, strict=True):
                if which == "train":
                    yield text


STAGE = Stage(
    name="tokenizer",
    grain=Grain.GLOBAL,
    group="tokens",
    description="The tokenizer artifact: a pinned tokenizer.json (sha256 verified) or a "
    "byte-level BPE trained deterministically on the deduped train split; special tokens "
    "(BOS, EOS, PAD, FIM, scrub placeholders) at fixed ids.",
    input="decontaminated_files",
    config_key="tokenizer",
    config=tokenizer.TokenizerConfig,
    code=(tokenizer.__name__, __name__),
    body=_body,
    kinds=("huggingface",),
)
