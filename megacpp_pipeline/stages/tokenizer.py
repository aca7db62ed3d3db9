"""tokenizer: where the run's tokenizer comes from (`stages: {tokenizer: {mode: ...}}`): the
last promoted snapshot's own tokenizer.json (`reuse`, the default: a refresh keeps the
vocabulary, so unchanged files hit the token cache and training can continue on the new
snapshot), a pinned tokenizer.json (sha256 verified), or a byte-level BPE trained
deterministically on a sample of the train split of the deduplicated files (`train`, and
`reuse` when there is nothing to reuse); special tokens (BOS, EOS, PAD, FIM, scrub
placeholders) at fixed ids. Tasks measure the train split and draw the hash-uniform sample
slice by slice; one more task reads the sample (bounded by max_train_bytes) and trains: the
driver holds neither the corpus nor the sample. The version records what was decided and
why (`policy`), for the snapshot's card and diff."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tokenizers import Tokenizer

from megacpp_pipeline.core.catalog import Catalog, SplitConfig
from megacpp_pipeline.corpus import tokenizer
from megacpp_pipeline.gates import tokenization
from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.executor import ending
from megacpp_pipeline.pipeline.registry import Grain, Materialized, PathValue, Stage
from megacpp_pipeline.snapshot import layout
from megacpp_pipeline.snapshot.promote import promoted_in_store
from megacpp_pipeline.stages import names
from megacpp_pipeline.storage import slices
from megacpp_pipeline.storage.store import Manifest, ShardStore, ShardUploader


def split_version(catalog: Catalog) -> Any:
    """The split section versions the stages that use it: this one (it trains on the train
    split alone) and the tokenize stage (it labels every file)."""
    return catalog.split.model_dump(mode="json")


@dataclass(frozen=True)
class _Job:
    store: ShardStore
    split: SplitConfig
    config: tokenizer.TokenizerConfig
    work: str  # where sample tasks put the texts they drew
    fraction: float = 1.0


def _train_bytes_task(job: _Job, pieces: tuple[slices.Piece, ...]) -> int:
    """Bytes of a slice's train split (`size` stands in for the text's: close enough to
    pick a sample fraction)."""
    t = slices.read(job.store, pieces, ["source_id", "path", "size"])
    splits = tokenization.assign_split(t["source_id"], t["path"], job.split)
    train = pc.equal(pa.array(splits, pa.string()), "train")
    return int(pc.sum(pc.filter(t["size"], train)).as_py() or 0)


def _sample_task(job: _Job, task: tuple[int, tuple[slices.Piece, ...]]) -> tuple[int, int]:
    """A slice's share of the hash-uniform sample of the train split, written to the work
    folder; (texts, bytes) drawn."""
    index, pieces = task
    t = slices.read(job.store, pieces, ["source_id", "path", "text"])
    splits = tokenization.assign_split(t["source_id"], t["path"], job.split)
    texts = [x for x, s in zip(t["text"].to_pylist(), splits, strict=True) if s == "train"]
    drawn = list(tokenizer.training_sample(texts, job.config, job.fraction, budget=None))
    if not drawn:
        return 0, 0
    uploader = ShardUploader(job.store, job.work)
    uploader.write_parquet(f"sample-{index:05d}.parquet", pa.table({"text": drawn}))
    return len(drawn), sum(len(x.encode()) for x in drawn)


def _train_task(job: _Job, drawn: list[int]) -> str:
    """Train on the tasks' sample (their files read in stream order, up to max_train_bytes)
    in a worker of its own: the driver only plans and commits. The tokenizer's JSON."""
    config = job.config

    def drawn_texts() -> Iterator[str]:
        for index, texts in enumerate(drawn):
            if texts:
                path = f"{job.work}/sample-{index:05d}.parquet"
                yield from pq.read_table(path, filesystem=job.store.fs)["text"].to_pylist()

    # the tasks drew at the split's fraction, which the trainer's own draw keeps whole (the
    # same seeded hash under a threshold at least as high); the trainer applies the budget
    tok = tokenizer.train_tokenizer(drawn_texts(), config, None)
    return str(tok.to_str())


def _body(ctx: StageContext, stage: Stage, partition: str | None) -> Materialized:
    assert stage.input is not None
    config: tokenizer.TokenizerConfig = ctx.config(stage)
    split_config = ctx.catalog.split
    source = ctx.latest(stage.input)
    version = ctx.begin(stage, None, config)
    with version:
        training = None
        mode = config.effective_mode
        policy: dict[str, Any] = {"mode": str(mode)}
        tok = None
        if mode is tokenizer.TokenizerMode.PINNED:
            tok = tokenizer.obtain_tokenizer(config)
            policy.update(decision="pinned", path=config.path)
        elif mode is tokenizer.TokenizerMode.REUSE:
            tok, policy = _reuse(ctx, config, policy)
        else:
            policy.update(decision="trained", reason="a new vocabulary")
        if tok is None:
            tok, training = _train(ctx, source, config, split_config, f"{version.dir}/_sample")
        ctx.log(f"{stage.name}: {policy['decision']} ({policy.get('reason') or mode})")
        with tempfile.TemporaryDirectory() as tmp:
            info = tokenizer.save_tokenizer(tok, Path(tmp) / layout.TOKENIZER)
            version.write_file(layout.TOKENIZER, (Path(tmp) / layout.TOKENIZER).read_bytes())
        manifest = version.commit(
            upstream=ctx.upstream_hashes([source]),
            extra={"tokenizer": info.model_dump(), "training": training, "policy": policy},
        )
    return Materialized(
        None,
        {
            "sha256": info.sha256,
            "vocab_size": info.vocab_size,
            "special_tokens": info.special_tokens,
            "mode": str(mode),
            "decision": str(policy["decision"]),
            "reused_from": str(policy.get("from_snapshot") or "none"),
            "pinned": mode is tokenizer.TokenizerMode.PINNED,
            "training": training or {},
            "tokenizers_version": info.tokenizers_version,
            "manifest": PathValue(ctx.store.manifest_path(manifest)),
        },
    )


def _reuse(
    ctx: StageContext, config: tokenizer.TokenizerConfig, policy: dict[str, Any]
) -> tuple[Any, dict[str, Any]]:
    """The newest promoted snapshot of this catalog's name keeps its tokenizer (its bytes
    checked against that snapshot's manifest); (None, why) when there is none to keep or the
    config asks for another vocabulary size, and the stage trains."""
    name = ctx.catalog.snapshot
    found = promoted_in_store(ctx.store, name)
    if not found:
        return None, {**policy, "decision": "trained", "reason": f"no promoted {name} snapshot"}
    where, previous = found[-1]
    entry = next((f for f in previous.files if f.path == layout.TOKENIZER), None)
    if entry is None:
        raise tokenizer.TokenizerArtifactError(f"{where}/{layout.TOKENIZER}", "not in its manifest")
    local = ctx.store.local_copy(f"{where}/{layout.TOKENIZER}", entry.sha256, ctx.cache_dir)
    tok = tokenizer.load_tokenizer(local, entry.sha256)
    if previous.vocab_size != config.vocab_size:
        return None, {
            **policy,
            "decision": "trained",
            "reason": f"vocab_size {config.vocab_size} in the config, {previous.vocab_size} in "
            f"{previous.snapshot_id}",
        }
    return tok, {
        **policy,
        "decision": "reused",
        "from_snapshot": previous.snapshot_id,
        "reason": f"kept from {previous.snapshot_id}",
    }


def _train(
    ctx: StageContext,
    source: Manifest,
    config: tokenizer.TokenizerConfig,
    split: SplitConfig,
    work: str,
) -> tuple[Any, dict[str, Any]]:
    """A BPE trained on a hash-uniform sample of the train split that tasks draw slice by
    slice, by a task of its own that reads the sample in stream order up to
    max_train_bytes: the driver holds neither the corpus nor the sample."""
    executor = ctx.executor()
    inputs = [(source, name) for name in source.data_tables()]
    task_bytes = slices.task_bytes_for(
        slices.total_bytes(inputs), executor.workers, ctx.engine.task_bytes
    )
    plan = [s.pieces for s in slices.plan(ctx.store, inputs, task_bytes)]
    job = _Job(ctx.store, split, config, work)
    with ending(executor.map(_train_bytes_task, job, plan)) as sizes:
        total = sum(sizes)
    fraction = tokenizer.effective_fraction(config, total)
    job = replace(job, fraction=fraction)
    try:
        # a failure here ends the tasks before the work folder goes
        with ending(executor.map(_sample_task, job, list(enumerate(plan)))) as samples:
            drawn = [texts for texts, _ in samples]
        trained = executor.run_apart(_train_task, job, drawn)
    finally:
        ctx.store.delete_dir(work)
    tok = Tokenizer.from_str(trained)
    training = {
        "train_split_bytes": total,
        "sample_fraction": fraction,
        "max_train_bytes": config.max_train_bytes,
    }
    return tok, training


STAGE = Stage(
    name=names.TOKENIZER,
    grain=Grain.GLOBAL,
    group="tokens",
    description="The tokenizer artifact: the last promoted snapshot's (mode reuse, the "
    f"default), a pinned {layout.TOKENIZER} (sha256 verified) or a byte-level BPE trained "
    "deterministically on the deduped train split (mode train, or reuse with nothing to "
    "reuse); special tokens (BOS, EOS, PAD, FIM, scrub placeholders) at fixed ids.",
    input=names.DECONTAMINATED_FILES,
    config_key="tokenizer",
    version_data=split_version,
    config=tokenizer.TokenizerConfig,
    code=(tokenizer.__name__, __name__),
    body=_body,
    kinds=("huggingface",),
)
