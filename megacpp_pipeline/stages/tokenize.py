"""tokenized_docs: token ids per document with a per-token chunk kind from one offline
char-to-token alignment, and a deterministic train/validation split per document; its check
decodes every document back to its text."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from tokenizers import Tokenizer

from megacpp_pipeline.core.ledger import DropReason
from megacpp_pipeline.core.schemas import TOKENIZED_DOCS, text_sha256
from megacpp_pipeline.corpus import encoders, tokenizer
from megacpp_pipeline.gates import tokenization
from megacpp_pipeline.pipeline.checks import RowCheck, inspect_rows
from megacpp_pipeline.pipeline.context import SourceInputs, StageContext
from megacpp_pipeline.pipeline.registry import Check, CheckOutcome, Grain, PreparedGate, Stage
from megacpp_pipeline.stages.tokenizer import ARTIFACT
from megacpp_pipeline.storage.store import Manifest


def load_artifact(ctx: StageContext) -> tuple[Tokenizer, Manifest]:
    """The tokenizer of the latest `tokenizer` version, its sha256 checked against the
    manifest (a mismatch is a clear error naming the file)."""
    manifest = ctx.store.latest("tokenizer", None)
    entry = next(f for f in manifest.files if f.path == ARTIFACT)
    path = ctx.store.local_copy(
        f"{ctx.store.version_dir(manifest)}/{ARTIFACT}", entry.sha256, ctx.cache_dir
    )
    return tokenizer.load_tokenizer(path, entry.sha256), manifest


def _gate(inputs: SourceInputs) -> PreparedGate:
    config = inputs.config
    path, sha256 = inputs.artifact("tokenizer", ARTIFACT)
    tok = tokenizer.load_tokenizer(path, sha256)
    # one thread: the executor's workers are the parallelism (a task per slice per core)
    encoder = encoders.select_encoder(tok, config.encoder, threads=1, artifact=path)
    if config.encoder is encoders.EncoderMode.AUTO and isinstance(
        encoder, encoders.ReferenceEncoder
    ):
        inputs.ctx.log(f"{inputs.stage.name} [{inputs.source.id}]: warning: {encoder.why}")
    return PreparedGate(
        lambda table: tokenization.run(table, encoder, config),
        # chunk kinds come from the enrich spans; ids from this exact tokenizer (the same
        # whichever encoder runs)
        salt=inputs.code_version(inputs.stage.input or "") + sha256,
        extra=encoder.describe(),
    )


def _report(ctx: StageContext, manifest: Manifest, stats: Mapping[str, float]) -> dict[str, Any]:
    return {"tokens": int(stats.get("tokens_kept", 0))}


def _undecodable(state: tuple[Tokenizer, encoders.TokenBytes | None], rows: pa.Table) -> list[str]:
    """The paths whose token ids do not decode to the text their sha256 names, a bounded
    batch of documents at a time. A byte-level artifact decodes through its token byte
    table (the bytes tokenizers' ByteLevel decoder joins, gathered without a Python loop
    per token); any other through tokenizers' decode_batch."""
    tok, table = state
    failures: list[str] = []
    for lo in range(0, rows.num_rows, 256):
        part = rows.slice(lo, 256)
        paths = part["path"].to_pylist()
        shas = part["content_sha256"].to_pylist()
        if table is None:
            decoded = tok.decode_batch(part["token_ids"].to_pylist(), skip_special_tokens=False)
            failures += [
                p for p, text, sha in zip(paths, decoded, shas, strict=True)
                if text_sha256(text) != sha
            ]  # fmt: skip
            continue
        ids = part["token_ids"].combine_chunks()
        flat = ids.flatten().to_numpy()
        data = table.decode(flat)
        bounds = table.byte_bounds(flat, ids.offsets.to_numpy() - ids.offsets[0].as_py())
        failures += [
            p for i, (p, sha) in enumerate(zip(paths, shas, strict=True))
            if hashlib.sha256(data[bounds[i] : bounds[i + 1]].data).hexdigest() != sha
        ]  # fmt: skip
    return failures


_ROUND_TRIP = RowCheck(("path", "token_ids", "content_sha256"), _undecodable)


def _every_document_round_trips(
    ctx: StageContext, stage: Stage, source: str | None
) -> CheckOutcome:
    """decode(token_ids) against the sha256 of the enriched text each row carries, every
    slice of the partition in a task of its own."""
    tok, _ = load_artifact(ctx)
    manifest = ctx.store.latest(stage.name, source)
    state = (tok, encoders.TokenBytes.of(tok))
    checked, failures = inspect_rows(ctx, manifest, _ROUND_TRIP, state)
    return CheckOutcome(
        passed=not failures,
        metadata={"documents_checked": checked, "failures": "; ".join(failures[:10]) or "none"},
        description=f"{source}: {failures[0]} does not decode to its text" if failures else None,
    )


STAGE = Stage(
    name="tokenized_docs",
    grain=Grain.PER_SOURCE,
    group="tokens",
    description="Token ids per document with a per-token chunk_kind from one offline "
    "char-to-token alignment, and a deterministic train/validation split per document.",
    input="enriched_files",
    reads=("tokenizer",),
    config_key="tokenize",
    config=tokenization.TokenizeConfig,
    code=(tokenization.__name__, encoders.__name__, __name__),
    schema=TOKENIZED_DOCS,
    content_column="content_sha256",
    drop_reasons=(DropReason.ROUND_TRIP_FAILED, DropReason.EMPTY_AFTER_TOKENIZE),
    writes_ledger=True,
    gate=_gate,
    summarize=lambda r: Counter({"tokens_kept": int(pc.sum(r.kept["num_tokens"]).as_py() or 0)}),
    report=_report,
    checks=(
        Check(
            "every_document_round_trips",
            "decode(token_ids) == the enriched text for every document (by sha256).",
            _every_document_round_trips,
        ),
    ),
)
