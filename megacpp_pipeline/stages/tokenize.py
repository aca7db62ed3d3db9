"""tokenized_docs: token ids per document with a per-token chunk kind from one offline
char-to-token alignment, and a deterministic train/validation split per document; its check
decodes every document back to its text."""

from __future__ import annotations

import hashlib
import itertools
from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow.compute as pc
from tokenizers import Tokenizer

from megacpp_pipeline.core.ledger import DropReason
from megacpp_pipeline.core.schemas import TOKENIZED_DOCS, text_sha256
from megacpp_pipeline.corpus import tokenizer
from megacpp_pipeline.gates import tokenization
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
    return PreparedGate(
        lambda table: tokenization.run(table, tok, config),
        # chunk kinds come from the enrich spans; ids from this exact tokenizer
        salt=inputs.code_version(inputs.stage.input or "") + sha256,
    )


def _report(ctx: StageContext, manifest: Manifest, stats: Mapping[str, float]) -> dict[str, Any]:
    return {"tokens": int(stats.get("tokens_kept", 0))}


def _every_document_round_trips(
    ctx: StageContext, stage: Stage, source: str | None
) -> CheckOutcome:
    """decode(token_ids) against the sha256 of the enriched text each row carries, one
    bounded batch of decoded documents at a time (never the whole partition)."""
    tok, _ = load_artifact(ctx)
    manifest = ctx.store.latest(stage.name, source)
    failures: list[str] = []
    checked = 0
    newline_ids: np.ndarray | None = None
    for t in ctx.store.iter_tables(manifest, columns=["path", "token_ids", "content_sha256"]):
        lengths = pc.list_value_length(t["token_ids"]).to_numpy(zero_copy_only=False)
        for lo in range(0, t.num_rows, 256):
            part = t.slice(lo, 256)
            long = lengths[lo : lo + 256] > LONG_DOCUMENT_TOKENS
            if long.any():  # a file near the size limit: decoded a piece at a time
                newline_ids = newline_ids if newline_ids is not None else _newline_ids(tok)
                paths, shas = part["path"].to_pylist(), part["content_sha256"].to_pylist()
                rows = zip(paths, shas, long, strict=True)
                for i, (path, sha, is_long) in enumerate(rows):
                    ids = part["token_ids"][i].values.to_numpy(zero_copy_only=False)
                    if is_long:
                        digest = _decoded_sha256(tok, ids, newline_ids)
                    else:
                        digest = text_sha256(tok.decode(ids.tolist(), skip_special_tokens=False))
                    checked += 1
                    if digest != sha:
                        failures.append(path)
                continue
            decoded = tok.decode_batch(part["token_ids"].to_pylist(), skip_special_tokens=False)
            for path, text, sha in zip(
                part["path"].to_pylist(), decoded, part["content_sha256"].to_pylist(), strict=True
            ):
                checked += 1
                if text_sha256(text) != sha:
                    failures.append(path)
    return CheckOutcome(
        passed=not failures,
        metadata={"documents_checked": checked, "failures": "; ".join(failures[:10]) or "none"},
        description=f"{source}: {failures[0]} does not decode to its text" if failures else None,
    )


# A document with more tokens than this (a file of several MB) is decoded a piece at a time:
# a Python list of its ids alone would cost ~36 bytes a token.
LONG_DOCUMENT_TOKENS = 1 << 20


def _newline_ids(tok: Tokenizer) -> np.ndarray:
    """Token ids whose bytes end with a newline (byte-level: the character 'Ċ'): decoding
    may stop after one without cutting a UTF-8 character."""
    return np.array(
        sorted(i for token, i in tok.get_vocab().items() if token.endswith("\u010a")), np.int64
    )


def _decoded_sha256(tok: Tokenizer, ids: np.ndarray, newline_ids: np.ndarray) -> str:
    """sha256 of decode(ids), decoded about LONG_DOCUMENT_TOKENS ids at a time, each piece
    ending after a newline token (so pieces decode to exactly their share of the text)."""
    ends = np.flatnonzero(np.isin(ids, newline_ids)) + 1
    cuts = [0]
    for end in ends.tolist():
        if end - cuts[-1] >= LONG_DOCUMENT_TOKENS:
            cuts.append(end)
    if cuts[-1] != len(ids):
        cuts.append(len(ids))
    h = hashlib.sha256()
    for lo, hi in itertools.pairwise(cuts):
        piece = tok.decode(ids[lo:hi].tolist(), skip_special_tokens=False)
        h.update(piece.encode("utf-8"))
        del piece
    return h.hexdigest()


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
    code=(tokenization.__name__, __name__),
    schema=TOKENIZED_DOCS,
    content_column="content_sha256",
    drop_reasons=(DropReason.ROUND_TRIP_FAILED, DropReason.EMPTY_AFTER_TOKENIZE),
    writes_ledger=True,
    gate=_gate,
    summarize=lambda r: Counter({"tokens_kept": int(pc.sum(r.kept["num_tokens"]).as_py() or 0)}),
    # encode_batch already runs on every core (Rust threads); forked workers would only lose
    # that (tokenizers turns its threads off after a fork) and measured slower
    workers=1,
    report=_report,
    checks=(
        Check(
            "every_document_round_trips",
            "decode(token_ids) == the enriched text for every document (by sha256).",
            _every_document_round_trips,
        ),
    ),
)
