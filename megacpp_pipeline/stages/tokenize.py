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
from megacpp_pipeline.pipeline.checks import RowCheck, rescan_content
from megacpp_pipeline.pipeline.context import SourceInputs, StageContext
from megacpp_pipeline.pipeline.registry import Check, CheckOutcome, Grain, PreparedGate, Stage
from megacpp_pipeline.snapshot import layout
from megacpp_pipeline.stages import names
from megacpp_pipeline.stages.tokenizer import split_version
from megacpp_pipeline.storage.store import Manifest


def load_artifact(ctx: StageContext) -> tuple[Tokenizer, Manifest]:
    """The tokenizer of the latest `tokenizer` version, its sha256 checked against the
    manifest (a mismatch is a clear error naming the file)."""
    manifest = ctx.latest(names.TOKENIZER, None)
    entry = next(f for f in manifest.files if f.path == layout.TOKENIZER)
    path = ctx.store.local_copy(
        f"{ctx.store.version_dir(manifest)}/{layout.TOKENIZER}", entry.sha256, ctx.cache_dir
    )
    return tokenizer.load_tokenizer(path, entry.sha256), manifest


def _gate(inputs: SourceInputs) -> PreparedGate:
    config, split = inputs.config, inputs.catalog.split
    path, sha256 = inputs.artifact(names.TOKENIZER, layout.TOKENIZER)
    tok = tokenizer.load_tokenizer(path, sha256)
    # one thread: the executor's workers are the parallelism (a task per slice per core)
    encoder = encoders.select_encoder(tok, config.encoder, threads=1, artifact=path, sha256=sha256)
    if config.encoder is encoders.EncoderMode.AUTO and isinstance(
        encoder, encoders.ReferenceEncoder
    ):
        inputs.ctx.log(f"{inputs.stage.name} [{inputs.source.id}]: warning: {encoder.why}")
    return PreparedGate(
        lambda table: tokenization.run(table, encoder, config, split),
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
    per token); any other through tokenizers' decode_batch, a document near the
    size limit a piece at a time (encoders.decoded_sha256)."""
    tok, table = state
    failures: list[str] = []
    for lo in range(0, rows.num_rows, 256):
        part = rows.slice(lo, 256)
        paths = part["path"].to_pylist()
        shas = part["content_sha256"].to_pylist()
        if table is None:
            lengths = pc.list_value_length(part["token_ids"]).to_numpy(zero_copy_only=False)
            if (lengths > encoders.DECODE_PIECE_TOKENS).any():  # near the size limit
                newlines = encoders.newline_ids(tok)
                for i, (path, sha) in enumerate(zip(paths, shas, strict=True)):
                    ids = part["token_ids"][i].values.to_numpy(zero_copy_only=False)
                    if encoders.decoded_sha256(tok, None, ids, newlines) != sha:
                        failures.append(path)
                continue
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
ROUND_TRIP = "every_document_round_trips"


def _artifact_sha256(tokenizer_version: Manifest) -> str:
    return next(f.sha256 for f in tokenizer_version.files if f.path == layout.TOKENIZER)


def _every_document_round_trips(
    ctx: StageContext, stage: Stage, source: str | None
) -> CheckOutcome:
    """decode(token_ids) against the sha256 of the enriched text each row carries, every
    slice of the partition in a task of its own."""
    tok, artifact = load_artifact(ctx)
    manifest = ctx.latest(stage.name, source)
    state = (tok, encoders.TokenBytes.of_artifact(tok, _artifact_sha256(artifact)))
    scan = rescan_content(
        ctx,
        stage,
        ROUND_TRIP,
        manifest,
        source,
        _ROUND_TRIP,
        state,
        by_text=False,  # the verdict is the token ids', not the text's
        material=_artifact_sha256(artifact),
    )
    failures = scan.problems
    return CheckOutcome(
        passed=not failures,
        metadata={
            "documents_checked": scan.rows,
            "failures": "; ".join(failures[:10]) or "none",
            **scan.metadata(),
        },
        description=f"{source}: {failures[0]} does not decode to its text" if failures else None,
    )


STAGE = Stage(
    name=names.TOKENIZED_DOCS,
    grain=Grain.PER_SOURCE,
    group="tokens",
    description="Token ids per document with a per-token chunk_kind from one offline "
    "char-to-token alignment, and a deterministic train/validation split per document.",
    input=names.ENRICHED_FILES,
    reads=(names.TOKENIZER,),
    config_key="tokenize",
    config=tokenization.TokenizeConfig,
    version_data=split_version,
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
            ROUND_TRIP,
            "decode(token_ids) == the enriched text for every document (by sha256); over "
            "the very version a recorded pass of this check decoded, with the same "
            "tokenizer, its verdict stands while the version's objects hash to its manifest.",
            _every_document_round_trips,
            verdicts=True,
        ),
    ),
)
