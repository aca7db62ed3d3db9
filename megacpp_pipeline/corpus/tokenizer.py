"""The tokenizer artifact: a pinned `tokenizer.json` whose sha256 must match, the last promoted
snapshot's own artifact (kept across refreshes, so a snapshot stays one a training run can
continue on), or a byte-level BPE trained deterministically with `tokenizers`. Seed rule: pin
the artifact and record its special tokens (fixed ids 0..n-1, in SPECIAL_TOKENS order) and
normalization.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from enum import StrEnum
from pathlib import Path
from typing import Any

import tokenizers
from pydantic import BaseModel, ConfigDict, Field, model_validator
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from megacpp_pipeline.core.errors import FieldedError
from megacpp_pipeline.core.kept import Kept
from megacpp_pipeline.storage.versions import write_bytes_atomic

BOS = "<|bos|>"
EOS = "<|eos|>"
PAD = "<|pad|>"
FIM_PREFIX = "<|fim_prefix|>"
FIM_MIDDLE = "<|fim_middle|>"
FIM_SUFFIX = "<|fim_suffix|>"
# Control tokens: never produced from text (a source file that literally contains "<|eos|>"
# is encoded as ordinary bytes), only inserted by the packer.
CONTROL_TOKENS = (BOS, EOS, PAD, FIM_PREFIX, FIM_MIDDLE, FIM_SUFFIX)
# The scrub gate's placeholders: added tokens matched in text, so a placeholder is one token
# and decodes back to itself.
PLACEHOLDER_TOKENS = (
    "<EMAIL>",
    "<IP_ADDRESS>",
    "<API_KEY>",
    "<PASSWORD>",
    "<PRIVATE_KEY>",
    "<SSH_KEY>",
    "<LOCAL_PATH>",
)
SPECIAL_TOKENS = (*CONTROL_TOKENS, *PLACEHOLDER_TOKENS)  # the id of each is its index here


class TokenizerArtifactError(FieldedError, ValueError):
    """The tokenizer artifact is not the one pinned, or breaks the special-token contract."""

    def __init__(self, path: str | os.PathLike[str], rule: str) -> None:
        super().__init__(f"{path}: {rule}")
        self.path = str(path)
        self.rule = rule


class TokenizerMode(StrEnum):
    """Where a run's tokenizer comes from."""

    # the last promoted snapshot of the same name keeps its tokenizer (unchanged files then
    # hit the token cache and a training run can continue on the new snapshot); trained only
    # when there is none, or when the config asks for another vocabulary size
    REUSE = "reuse"
    TRAIN = "train"  # a new BPE on this run's train split: a new vocabulary
    PINNED = "pinned"  # `path` + `sha256`: an artifact from elsewhere, verified


class TokenizerConfig(BaseModel):
    """Where the tokenizer comes from (`mode`; default: pinned when `path` and `sha256` are
    given, else reuse) and, for training, how it is trained (the remaining fields)."""

    model_config = ConfigDict(extra="forbid")

    mode: TokenizerMode | None = None
    path: str | None = None
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    vocab_size: int = Field(default=32768, ge=len(SPECIAL_TOKENS) + 256 + 1, le=1 << 20)
    min_frequency: int = Field(default=2, ge=1)
    # BPE training itself has no randomness; the seed salts the hash that picks the training
    # sample, so a different seed is a different (still reproducible) sample.
    seed: int = 0
    sample_fraction: float = Field(default=1.0, gt=0.0, le=1.0)
    # Bounds training time and memory (about 9 bytes of RSS per byte of text): a larger
    # corpus is sampled uniformly down to this budget (see effective_fraction), so a 16x
    # corpus trains on the same amount of text as the 1x one. 32 MiB of C++ is plenty for
    # a 32k vocab; raise it for larger vocabularies.
    max_train_bytes: int = Field(default=32 * 1024 * 1024, ge=1)

    @model_validator(mode="after")
    def _pinned_needs_both(self) -> TokenizerConfig:
        if (self.path is None) != (self.sha256 is None):
            raise ValueError("a pinned tokenizer needs both `path` and `sha256`")
        if self.mode is TokenizerMode.PINNED and self.path is None:
            raise ValueError("mode pinned needs `path` and `sha256` (the artifact it pins)")
        if self.mode not in (None, TokenizerMode.PINNED) and self.path is not None:
            raise ValueError(
                f"mode {self.mode} does not take `path`/`sha256` (they pin an artifact: "
                "mode pinned)"
            )
        return self

    @property
    def effective_mode(self) -> TokenizerMode:
        if self.mode is not None:
            return self.mode
        return TokenizerMode.PINNED if self.path is not None else TokenizerMode.REUSE

    @property
    def pinned(self) -> bool:
        return self.effective_mode is TokenizerMode.PINNED


class SpecialIds(BaseModel):
    """The ids the packer inserts; fixed by SPECIAL_TOKENS order, checked on every load."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bos: int = 0
    eos: int = 1
    pad: int = 2
    fim_prefix: int = 3
    fim_middle: int = 4
    fim_suffix: int = 5


class TokenizerInfo(BaseModel):
    """What the manifest records about the artifact."""

    model_config = ConfigDict(extra="forbid")

    sha256: str
    vocab_size: int
    special_tokens: dict[str, int]
    normalizer: dict[str, Any] | None
    pre_tokenizer: dict[str, Any] | None
    decoder: dict[str, Any] | None
    post_processor: dict[str, Any] | None
    model_type: str
    tokenizers_version: str


def special_ids() -> SpecialIds:
    return SpecialIds()


def effective_fraction(config: TokenizerConfig, total_bytes: int | None) -> float:
    """The configured fraction, lowered so that a train split of `total_bytes` yields about
    `max_train_bytes` (a hash-uniform sample over the whole split, not its first files)."""
    if not total_bytes or total_bytes <= config.max_train_bytes:
        return config.sample_fraction
    return min(config.sample_fraction, config.max_train_bytes / total_bytes)


def training_sample(
    texts: Iterable[str], config: TokenizerConfig, fraction: float, budget: int | None = -1
) -> Iterator[str]:
    """The texts a hash of their bytes (seeded) draws at `fraction`, in order, up to
    `budget` bytes (default max_train_bytes; None: no budget, a task's share of a sample
    whose budget another step applies). The text that crosses the budget gives its first
    bytes (cut at a character) rather than none: a corpus whose first drawn file is larger
    than the budget still trains on it instead of on nothing."""
    threshold = int(fraction * (1 << 64))
    salt = config.seed.to_bytes(8, "little", signed=True)
    left = config.max_train_bytes if budget == -1 else budget
    for text in texts:
        data = text.encode("utf-8")
        if fraction < 1.0:
            digest = hashlib.blake2b(data, digest_size=8, key=salt).digest()
            if int.from_bytes(digest, "little") >= threshold:
                continue
        if left is not None and len(data) >= left:
            head = data[:left].decode("utf-8", "ignore")
            if head:
                yield head
            return
        if left is not None:
            left -= len(data)
        yield text


# The trainer holds a text's per-byte alignments while it pre-tokenizes it (~100 bytes a byte:
# one 32 MiB file took 4 GB), so a long text reaches it in pieces of at most this many
# characters, cut after a line; files below it (nearly all C++) go in whole, as before.
TRAIN_PIECE_CHARS = 1 << 20


def training_pieces(texts: Iterable[str], limit: int = TRAIN_PIECE_CHARS) -> Iterator[str]:
    """`texts`, each longer than `limit` characters cut into consecutive pieces of at most
    `limit`, each ending after a newline where the piece has one (so no line is split)."""
    for text in texts:
        start = 0
        while len(text) - start > limit:
            cut = text.rfind("\n", start, start + limit) + 1
            end = cut if cut > start else start + limit
            yield text[start:end]
            start = end
        yield text[start:] if start else text


def _finalize(tok: Tokenizer) -> Tokenizer:
    # The trainer registers every special token as `special`; placeholders must not be (they
    # are text), and the added-token matcher is only rebuilt on load, hence the round trip.
    tok.add_tokens([AddedToken(p, special=False, normalized=False) for p in PLACEHOLDER_TOKENS])
    tok = Tokenizer.from_str(tok.to_str())
    tok.encode_special_tokens = True
    return tok


def train_tokenizer(
    texts: Iterable[str], config: TokenizerConfig, total_bytes: int | None = None
) -> Tokenizer:
    """Byte-level BPE, no normalizer (so decode(encode(text)) == text), specials at 0..n-1.
    `total_bytes` (of all `texts`, if known) lets a corpus above the budget be sampled
    uniformly instead of cut after its first `max_train_bytes`."""
    if config.pinned:
        raise TokenizerArtifactError(str(config.path), "config pins an artifact; not training")
    tok = Tokenizer(models.BPE())
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        min_frequency=config.min_frequency,
        show_progress=False,
        special_tokens=[AddedToken(s, special=True, normalized=False) for s in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    fraction = effective_fraction(config, total_bytes)
    tok.train_from_iterator(training_pieces(training_sample(texts, config, fraction)), trainer)
    return _finalize(tok)


def check_special_tokens(tok: Tokenizer, path: str | os.PathLike[str] = "<memory>") -> None:
    for expected_id, content in enumerate(SPECIAL_TOKENS):
        actual = tok.token_to_id(content)
        if actual != expected_id:
            raise TokenizerArtifactError(
                path, f"special token {content!r} must have id {expected_id}, has {actual}"
            )


# sha256 -> the artifact's tokenizer, parsed once per process: a per-source step loads the
# same artifact for its gate and again for its check, and a run's steps share a process
_LOADED: Kept[str, Tokenizer] = Kept(4)  # a process meets one artifact a run, a test a few


def load_tokenizer(path: str | os.PathLike[str], sha256: str) -> Tokenizer:
    """The pinned artifact (`read_artifact`), refused unless it has the pipeline's special
    tokens at their ids."""
    tok = read_artifact(path, sha256)
    check_special_tokens(tok, path)
    return tok


def read_artifact(path: str | os.PathLike[str], sha256: str) -> Tokenizer:
    """A tokenizer artifact, refused unless its bytes hash to `sha256` (read and checked at
    every call). It is parsed once per process and sha256, and the tokenizer returned is
    shared by every caller that loads those bytes: none may change it."""
    if not Path(path).is_file():
        raise TokenizerArtifactError(path, "pinned tokenizer file does not exist")
    raw = Path(path).read_bytes()  # once: the bytes hashed are the bytes parsed
    actual = hashlib.sha256(raw).hexdigest()
    if actual != sha256:
        raise TokenizerArtifactError(path, f"sha256 mismatch: pinned {sha256}, file has {actual}")

    def parsed() -> Tokenizer:
        tok = Tokenizer.from_str(raw.decode("utf-8"))
        tok.encode_special_tokens = True  # not serialized: control tokens never come from text
        return tok

    return _LOADED.get(sha256, parsed)


def obtain_tokenizer(
    config: TokenizerConfig, texts: Iterable[str] = (), total_bytes: int | None = None
) -> Tokenizer:
    """The pinned artifact when the config pins one, else a tokenizer trained on `texts`."""
    if config.pinned:
        assert config.path is not None and config.sha256 is not None
        return load_tokenizer(config.path, config.sha256)
    return train_tokenizer(texts, config, total_bytes)


def describe(path: str | os.PathLike[str]) -> TokenizerInfo:
    raw = Path(path).read_bytes()
    doc = json.loads(raw)
    added = sorted(doc.get("added_tokens") or [], key=lambda t: t["id"])
    tok = Tokenizer.from_str(raw.decode("utf-8"))
    return TokenizerInfo(
        sha256=hashlib.sha256(raw).hexdigest(),
        vocab_size=tok.get_vocab_size(with_added_tokens=True),
        special_tokens={t["content"]: int(t["id"]) for t in added},
        normalizer=doc.get("normalizer"),
        pre_tokenizer=doc.get("pre_tokenizer"),
        decoder=doc.get("decoder"),
        post_processor=doc.get("post_processor"),
        model_type=str((doc.get("model") or {}).get("type", "unknown")),
        tokenizers_version=tokenizers.__version__,
    )


def save_tokenizer(tok: Tokenizer, path: str | os.PathLike[str]) -> TokenizerInfo:
    """Write atomically (tmp + os.replace); the same tokenizer always gives the same bytes."""
    check_special_tokens(tok, path)
    target = Path(path)
    write_bytes_atomic(target, tok.to_str(pretty=True).encode("utf-8"))
    return describe(target)
