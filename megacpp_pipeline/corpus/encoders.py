"""Which encoder turns text into token ids: `tokenizers` (the trainer, the pinned artifact's
own library, the reference) or a tiktoken `Encoding` built from the same artifact, several
times fewer CPU-seconds per MB. The fast one runs only when the artifact has the one shape
tiktoken reproduces and a fixed sample encodes to the same ids both ways; else tokenizers.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import warnings
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from enum import StrEnum
from typing import Any

import numpy as np
import pyarrow as pa
import tiktoken
import tokenizers
from tokenizers import Tokenizer, decoders

from megacpp_pipeline.core.errors import FieldedError
from megacpp_pipeline.core.kept import Kept
from megacpp_pipeline.snapshot import layout

# tokenizers' ByteLevel pre-tokenizer regex (GPT-2's), as tiktoken takes it.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


class EncoderMode(StrEnum):
    AUTO = "auto"  # the fast encoder when the artifact allows it and the sample agrees
    TOKENIZERS = "tokenizers"  # always the reference
    FAST = "fast"  # the fast encoder, or an error saying why not


class FastEncoderRefusedError(FieldedError, ValueError):
    """`encoder: fast` was configured but the fast encoder cannot reproduce this artifact."""

    def __init__(self, artifact: str, rule: str) -> None:
        super().__init__(f"{artifact}: fast encoder refused: {rule}")
        self.artifact = artifact
        self.rule = rule


class FastEncoderFallbackWarning(UserWarning):
    """`encoder: auto` fell back to tokenizers; the message says why."""


class TokenizerNotByteLevelError(ValueError):
    """The alignment needs a byte-level decoder: each token must stand for fixed bytes."""


def token_byte_lengths(tokenizer: Tokenizer) -> np.ndarray:
    """Bytes each token id decodes to, for a byte-level tokenizer (one char = one byte)."""
    if not isinstance(tokenizer.decoder, decoders.ByteLevel):
        raise TokenizerNotByteLevelError(
            f"tokenizer decoder is {type(tokenizer.decoder).__name__!r};"
            " the alignment needs 'ByteLevel'"
        )
    lengths = np.zeros(tokenizer.get_vocab_size(with_added_tokens=True), dtype=np.int64)
    for token, token_id in tokenizer.get_vocab(with_added_tokens=False).items():
        lengths[token_id] = len(token)
    for token_id, added in tokenizer.get_added_tokens_decoder().items():
        lengths[token_id] = len(added.content.encode("utf-8"))
    return lengths


def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte <-> printable character table (what a ByteLevel vocab is spelled in),
    character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    chars = {b: chr(b) for b in printable}
    spare = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + spare)
            spare += 1
    return {c: b for b, c in chars.items()}


# A fixed sample both encoders must agree on before the fast one is trusted: C++ as the
# corpus has it, every branch of the pre-tokenizer regex, whitespace and letters beyond
# ASCII, control and placeholder tokens spelled in text. Each vocabulary token's own text
# is added at load (see _vocabulary_texts), so every merge is exercised too.
SAMPLE: tuple[str, ...] = (
    '#include <vector>\n#include "util/str.hpp"\n\nnamespace geo {\ntemplate <typename T>\n'
    "struct Point {\n    T x{}, y{};\n    constexpr Point operator+(const Point& o) const "
    "noexcept { return {x + o.x, y + o.y}; }\n};\n}  // namespace geo\n",
    'int main(int argc, char** argv) {\r\n\tstd::printf("%d\\n", argc);\r\n\treturn 0x1F'
    " >> 2u;\r\n}\r\n\r\n   \r\n",
    "// it's the user's; we've, I'm, they'll, he'd, you're, don't 'S 'LL ''s x's'\n",
    "/* Größe des Puffers: 世界 — ünïcödé naïve façade Ελληνικά кириллица עברית العربية "
    "हिन्दी 한국어 ไทย */\n",
    "emoji 🚀👩‍💻🇩🇪 and digits ٣٤ १२ １２ ½ ² Ⅻ and marks e\u0301 a\u0308\u0304\n",
    "spaces:\u00a0nbsp\u2003em\u3000ideo\u2028ls\u2029ps\u0085nel\x0bvt\x0cff end   \n",
    "controls \x01\x02\x1b[0m\x7f tabs\t\t\tand   trailing   \n\n\n",
    "mail <EMAIL> or <IP_ADDRESS>, key=<API_KEY><PASSWORD> x<PRIVATE_KEY>y <SSH_KEY>\n"
    "path <LOCAL_PATH>/a.h <<EMAIL>> <EMAIL <email> EMAIL> <LOCAL_PATH\n",
    'puts("<|eos|>"); // <|bos|><|pad|><|fim_prefix|>x<|fim_middle|>y<|fim_suffix|> <|eos|\n',
    "<|bos|><EMAIL><|eos|> <EMAIL><|pad|>",
    " " * 64 + "x" + "\t" * 17 + "\n" * 9 + "y" * 300 + "1234567890" * 30 + "=" * 80,
    "static const unsigned char kBlob[] = {0x00,0x01,0xff,0x7f,255,-1,1e10,3.14f,'\\0'};\n",
    "",
    " ",
    "\n",
    "x",
)


def _artifact_shape_problem(doc: dict[str, Any], alphabet: dict[str, int]) -> str | None:
    """Why tiktoken cannot reproduce this tokenizer.json, or None when it can: byte-level BPE
    with the GPT-2 regex, no normalizer, merges in id order, plain added tokens."""
    normalizer = doc.get("normalizer")
    if normalizer is not None and normalizer != {"type": "Sequence", "normalizers": []}:
        return f"normalizer {normalizer.get('type')!r} (only none reproduces the text as is)"
    pre = doc.get("pre_tokenizer") or {}
    if pre.get("type") != "ByteLevel" or pre.get("add_prefix_space") or not pre.get("use_regex"):
        return f"pre-tokenizer {pre!r} (needs ByteLevel, use_regex, no prefix space)"
    decoder = doc.get("decoder") or {}
    if decoder.get("type") != "ByteLevel":
        return f"decoder {decoder.get('type')!r} (needs ByteLevel)"
    post = doc.get("post_processor")
    if post is not None and post.get("type") != "ByteLevel":
        return f"post-processor {post.get('type')!r} (only none or ByteLevel keep the ids)"
    if doc.get("truncation") is not None or doc.get("padding") is not None:
        return "truncation or padding is set"
    model = doc.get("model") or {}
    if model.get("type") != "BPE":
        return f"model {model.get('type')!r} (needs BPE)"
    for option in ("dropout", "continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(option):
            return f"BPE option {option}={model[option]!r}"
    if model.get("byte_fallback") or model.get("ignore_merges"):
        return "BPE byte_fallback or ignore_merges is set"
    added = doc.get("added_tokens") or []
    for token in added:
        if token.get("single_word") or token.get("lstrip") or token.get("rstrip"):
            return f"added token {token['content']!r} has single_word/lstrip/rstrip"
        if token.get("normalized"):
            return f"added token {token['content']!r} is matched on normalized text"
    # Control tokens (special) are never matched in text (encode_special_tokens); the
    # others (placeholders) are. tokenizers finds matches leftmost-longest over both sets
    # and then skips the special ones; tiktoken searches the matched ones alone. The two
    # agree when no matched token is a prefix of another and no skipped one overlaps any.
    matched = [t["content"] for t in added if not t.get("special")]
    skipped = [t["content"] for t in added if t.get("special")]
    for a in matched:
        for b in matched:
            if a != b and b.startswith(a):
                return f"added token {a!r} is a prefix of {b!r}"
        for s in skipped:
            if _overlap(a, s):
                return f"added token {a!r} overlaps control token {s!r}"
    vocab: dict[str, int] = model.get("vocab") or {}
    missing = [c for c in alphabet if c not in vocab]
    if missing:
        return f"{len(missing)} of the 256 byte-level characters are not in the vocabulary"
    added_ids = {int(t["id"]) for t in added}
    merged: dict[str, int] = {}
    last = -1
    for pair in model.get("merges") or []:
        a, b = pair.split(" ", 1) if isinstance(pair, str) else pair
        token = a + b
        token_id = vocab.get(token)
        if a not in vocab or b not in vocab or token_id is None:
            return f"merge {a!r} + {b!r} names a token outside the vocabulary"
        if token_id in added_ids:
            return f"merge {a!r} + {b!r} produces added token {token!r}"
        # tiktoken ranks a merge by its result's id, tokenizers by its place in the list
        if token_id <= last:
            return f"merge {a!r} + {b!r} is out of id order (id {token_id} after {last})"
        last = token_id
        merged[token] = token_id
    for token, token_id in vocab.items():
        if token_id in added_ids or token in merged:
            continue
        if len(token) != 1 or token not in alphabet:
            return f"vocabulary token {token!r} is neither a byte nor a merge's result"
    return None


def _overlap(a: str, b: str) -> bool:
    """Whether `a` and `b` can share characters in some text: one holds the other, or a
    suffix of one is a prefix of the other."""
    if a in b or b in a:
        return True
    return any(a.endswith(b[:k]) or b.endswith(a[:k]) for k in range(1, min(len(a), len(b))))


BINARY_OFFSETS_LIMIT = 1 << 31  # bytes an Arrow binary array's 32-bit offsets can address


# per process, a few of each: the encoder chosen per (artifact, mode, threads), and each
# artifact's token bytes table by its sha256
_CHOSEN: Kept[tuple[str, EncoderMode, int], TokenEncoder] = Kept(8)
_TABLES: Kept[str, TokenBytes | None] = Kept(8)


class TokenBytes:
    """The bytes each token id stands for, and decoding without a Python loop: each id's
    bytes gathered into one array by Arrow's take over the vocabulary as a binary array
    (what a ByteLevel decoder does before reading the bytes as UTF-8; one copy per token in
    C, 3-4x numpy's index-array gather warm)."""

    def __init__(self, token_bytes: list[bytes]) -> None:
        self.lengths = np.array([len(b) for b in token_bytes], dtype=np.int64)
        offsets = np.zeros(len(token_bytes) + 1, dtype=np.int32)
        np.cumsum(self.lengths, out=offsets[1:])
        # over buffers numpy and Python own: nothing held in Arrow's memory pool (where a
        # packing test counts what a run holds) for as long as a tokenizer is cached
        self.vocabulary = pa.Array.from_buffers(
            pa.binary(),
            len(token_bytes),
            [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(token_bytes))],
        )

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> TokenBytes | None:
        """The table of a tokenizer with a ByteLevel decoder whose vocabulary is spelled in
        the byte-level alphabet; None for any other."""
        if not isinstance(tokenizer.decoder, decoders.ByteLevel):
            return None
        alphabet = byte_level_alphabet()
        size = tokenizer.get_vocab_size(with_added_tokens=True)
        token_bytes = [b""] * size
        added = tokenizer.get_added_tokens_decoder()
        for token, token_id in tokenizer.get_vocab(with_added_tokens=False).items():
            if token_id not in added:
                if any(c not in alphabet for c in token):
                    return None
                token_bytes[token_id] = bytes(alphabet[c] for c in token)
        for token_id, added_token in added.items():
            token_bytes[token_id] = added_token.content.encode("utf-8")
        return cls(token_bytes)

    @classmethod
    def of_artifact(cls, tokenizer: Tokenizer, sha256: str) -> TokenBytes | None:
        """`of(tokenizer)`, built once per process for the artifact whose bytes hash to
        `sha256` (a per-source check decodes with the same artifact for every source)."""
        return _TABLES.get(sha256, lambda: cls.of(tokenizer))

    def decode(self, flat: np.ndarray) -> np.ndarray:
        """The bytes of the ids in `flat`, concatenated, as uint8 (read-only)."""
        large = int(self.lengths[flat].sum()) >= BINARY_OFFSETS_LIMIT
        vocabulary = self.vocabulary.cast(pa.large_binary()) if large else self.vocabulary
        taken = vocabulary.take(pa.array(flat, pa.int64()))
        _, offsets, data = taken.buffers()
        if data is None or not len(taken):  # no ids, or only empty tokens
            return np.empty(0, dtype=np.uint8)
        at = np.frombuffer(offsets, dtype=np.int64 if large else np.int32)
        return np.frombuffer(data, dtype=np.uint8)[at[taken.offset] : at[taken.offset + len(taken)]]

    def byte_bounds(self, flat: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """Where each list's bytes start in decode(flat) (n + 1 bounds), for list offsets."""
        cum = np.zeros(flat.size + 1, dtype=np.int64)
        np.cumsum(self.lengths[flat], out=cum[1:])
        return cum[offsets]


# A document of more tokens than this is decoded and hashed a piece at a time: a Python list
# of its ids alone would cost about 36 bytes a token, its text as one string more again.
DECODE_PIECE_TOKENS = 1 << 20


def newline_ids(tokenizer: Tokenizer) -> np.ndarray:
    """Token ids whose bytes end with a newline (byte-level: the character 'Ċ'): decoding
    may stop after one without cutting a UTF-8 character."""
    vocab = tokenizer.get_vocab()
    return np.array(sorted(i for token, i in vocab.items() if token.endswith("\u010a")), np.int64)


def decoded_sha256(
    tokenizer: Tokenizer,
    table: TokenBytes | None,
    ids: np.ndarray,
    newlines: np.ndarray | None = None,
) -> str:
    """The sha256 of what `ids` decode to (special tokens kept), in memory bounded by
    DECODE_PIECE_TOKENS. Through `table` (the tokenizer's TokenBytes): the ids' bytes as a
    ByteLevel decoder joins them, hashed as they are, so bytes that are not UTF-8 differ from
    every text's. Without one (not byte-level), by the tokenizer's decode: a long document in
    pieces each ending after a newline token (`newlines`, else newline_ids), so each piece
    decodes to exactly its share of the text."""
    digest = hashlib.sha256()
    if table is not None:
        for lo in range(0, ids.size, DECODE_PIECE_TOKENS):
            digest.update(table.decode(ids[lo : lo + DECODE_PIECE_TOKENS]).data)
        return digest.hexdigest()
    cuts = [0]
    if ids.size > DECODE_PIECE_TOKENS:
        found = newline_ids(tokenizer) if newlines is None else newlines
        for end in (np.flatnonzero(np.isin(ids, found)) + 1).tolist():
            if end - cuts[-1] >= DECODE_PIECE_TOKENS:
                cuts.append(end)
    if cuts[-1] != ids.size:
        cuts.append(ids.size)
    for lo, hi in itertools.pairwise(cuts):
        digest.update(tokenizer.decode(ids[lo:hi].tolist(), skip_special_tokens=False).encode())
    return digest.hexdigest()


class TokenEncoder(ABC):
    """Text to ids for the tokenized_docs gate, with what the alignment and the round-trip
    check need: the bytes each id stands for."""

    name: str
    byte_len: np.ndarray  # token id -> bytes it decodes to
    reference: Tokenizer  # the artifact itself (what decides how a long text may be cut)

    @abstractmethod
    def encode(self, texts: list[str]) -> pa.ListArray:
        """Ids per text, list<int32>, no BOS/EOS; control tokens in text are text."""

    @abstractmethod
    def round_trip_failures(
        self, texts: list[str], text_bytes: np.ndarray, text_offsets: np.ndarray, ids: pa.ListArray
    ) -> dict[int, int]:
        """Texts whose ids do not decode back to them: index -> first differing character.
        `text_bytes`/`text_offsets` are the texts as one UTF-8 buffer (Arrow's own)."""

    @abstractmethod
    def describe(self) -> dict[str, str]:
        """What the tokenized_docs manifest records: which encoder ran, and why."""


class ReferenceEncoder(TokenEncoder):
    """`tokenizers` itself: encode_batch (every core, Rust threads) and decode_batch."""

    def __init__(self, tokenizer: Tokenizer, why: str) -> None:
        tokenizer.encode_special_tokens = True  # not serialized: control tokens are text
        self.tokenizer = tokenizer
        self.reference = tokenizer
        self.byte_len = token_byte_lengths(tokenizer)
        self.name = f"tokenizers {tokenizers.__version__}"
        self.why = why

    def encode(self, texts: list[str]) -> pa.ListArray:
        encodings = self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        return pa.array([e.ids for e in encodings], type=pa.list_(pa.int32()))

    def round_trip_failures(
        self, texts: list[str], text_bytes: np.ndarray, text_offsets: np.ndarray, ids: pa.ListArray
    ) -> dict[int, int]:
        decoded = self.tokenizer.decode_batch(ids.to_pylist(), skip_special_tokens=False)
        return {
            i: first_difference(text, back)
            for i, (text, back) in enumerate(zip(texts, decoded, strict=True))
            if back != text
        }

    def describe(self) -> dict[str, str]:
        return {"encoder": self.name, "encoder_why": self.why}


class FastEncoder(TokenEncoder):
    """A tiktoken Encoding over the artifact's own ranks and ids. Texts are encoded on
    `threads` threads (tiktoken releases the GIL); the round trip is checked by gathering
    each id's bytes from one vocabulary buffer and comparing with the text's UTF-8 bytes."""

    def __init__(
        self, encoding: tiktoken.Encoding, table: TokenBytes, reference: Tokenizer,
        threads: int, why: str,
    ) -> None:  # fmt: skip
        self.encoding = encoding
        self.matched = frozenset(encoding.special_tokens_set)  # the placeholders
        self.table = table
        self.byte_len = table.lengths
        self.reference = reference  # only to name a failure as the reference would
        self.threads = max(1, threads)
        self.name = f"tiktoken {tiktoken.__version__}"
        self.why = why

    def _encode_one(self, text: str) -> np.ndarray:
        try:
            return self.encoding.encode_to_numpy(
                text, allowed_special=self.matched, disallowed_special=()
            )
        except ValueError:
            # tiktoken's regex gives up on a whitespace run of about a million characters
            # ("Max stack size exceeded for backtracking"); that text takes the reference
            # encoder, whose ids are the ones wanted anyway
            ids = self.reference.encode(text, add_special_tokens=False).ids
            return np.asarray(ids, dtype=np.uint32)

    def encode(self, texts: list[str]) -> pa.ListArray:
        if self.threads > 1 and len(texts) > 1:
            with ThreadPoolExecutor(min(self.threads, len(texts))) as pool:
                parts = list(pool.map(self._encode_one, texts))
        else:
            parts = [self._encode_one(t) for t in texts]
        offsets = np.zeros(len(parts) + 1, dtype=np.int32)
        np.cumsum([p.size for p in parts], out=offsets[1:])
        flat = np.concatenate(parts).astype(np.int32) if parts else np.zeros(0, np.int32)
        values = pa.Array.from_buffers(pa.int32(), flat.size, [None, pa.py_buffer(flat)])
        return pa.ListArray.from_buffers(
            pa.list_(pa.int32()), len(parts), [None, pa.py_buffer(offsets)], children=[values]
        )

    def round_trip_failures(
        self, texts: list[str], text_bytes: np.ndarray, text_offsets: np.ndarray, ids: pa.ListArray
    ) -> dict[int, int]:
        flat = ids.flatten().to_numpy()
        offsets = ids.offsets.to_numpy() - ids.offsets[0].as_py()
        decoded = self.table.decode(flat)
        bounds = self.table.byte_bounds(flat, offsets)
        if np.array_equal(bounds, text_offsets):
            differ = np.flatnonzero(decoded != text_bytes)
            suspects = np.unique(np.searchsorted(text_offsets, differ, side="right") - 1)
        else:  # some text's ids stand for more or fewer bytes: compare text by text
            suspects = np.array(
                [
                    i
                    for i in range(len(texts))
                    if not np.array_equal(
                        decoded[bounds[i] : bounds[i + 1]],
                        text_bytes[text_offsets[i] : text_offsets[i + 1]],
                    )
                ],
                dtype=np.int64,
            )
        out: dict[int, int] = {}
        for i in suspects.tolist():
            # named as the reference would name it (the character where decode differs)
            back = self.reference.decode(
                flat[offsets[i] : offsets[i + 1]].tolist(), skip_special_tokens=False
            )
            if back != texts[i]:
                out[i] = first_difference(texts[i], back)
        return out

    def describe(self) -> dict[str, str]:
        return {"encoder": self.name, "encoder_why": self.why}


def first_difference(a: Sequence[Any], b: Sequence[Any]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _vocabulary_texts(token_bytes: list[bytes], added_ids: set[int]) -> list[str]:
    """The vocabulary's tokens that are whole UTF-8 on their own, a few hundred to a text
    (one text each would cost a call each), one per line."""
    tokens = []
    for token_id, raw in enumerate(token_bytes):
        if token_id in added_ids or len(raw) < 2:
            continue
        try:
            tokens.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            continue
    return ["\n".join(tokens[i : i + 256]) for i in range(0, len(tokens), 256)]


def _sample_difference(encoder: FastEncoder, reference: Tokenizer, texts: list[str]) -> str | None:
    """How the two encoders (and the byte table against the reference's own decode) first
    differ on `texts`, or None."""
    expected = [e.ids for e in reference.encode_batch_fast(texts, add_special_tokens=False)]
    got = encoder.encode(texts)
    for text, want, have in zip(texts, expected, got.to_pylist(), strict=True):
        if want != have:
            k = first_difference(want, have)
            return (
                f"text {text[:40]!r}: from token {k}, ids {have[k : k + 4]}"
                f" where tokenizers gives {want[k : k + 4]}"
            )
    decoded = reference.decode_batch(expected, skip_special_tokens=False)
    table = encoder.table.decode(got.flatten().to_numpy())
    if decoded != texts or table.tobytes() != "".join(texts).encode("utf-8"):
        return "ids do not decode back to the sample texts"
    return None


def _build_fast(
    doc: dict[str, Any], reference: Tokenizer, threads: int, name: str
) -> tuple[FastEncoder | None, str]:
    """The fast encoder and why it may be used, or None and why not."""
    alphabet = byte_level_alphabet()
    problem = _artifact_shape_problem(doc, alphabet)
    if problem is not None:
        return None, problem
    vocab: dict[str, int] = doc["model"]["vocab"]
    added = {int(t["id"]): t for t in doc.get("added_tokens") or []}
    token_bytes = [b""] * (max([*vocab.values(), *added]) + 1)
    ranks: dict[bytes, int] = {}
    for token, token_id in vocab.items():
        if token_id not in added:
            token_bytes[token_id] = raw = bytes(alphabet[c] for c in token)
            ranks[raw] = token_id
    for token_id, t in added.items():
        token_bytes[token_id] = t["content"].encode("utf-8")
    encoding = tiktoken.Encoding(
        name=name,
        pat_str=GPT2_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={t["content"]: i for i, t in added.items() if not t.get("special")},
    )
    fast = FastEncoder(encoding, TokenBytes(token_bytes), reference, threads, why="")
    sample = [*SAMPLE, *_vocabulary_texts(token_bytes, set(added))]
    difference = _sample_difference(fast, reference, sample)
    if difference is not None:
        return None, f"differs from tokenizers on the load sample: {difference}"
    unmade = _token_not_made_of_its_bytes(vocab, set(added), reference)
    if unmade is not None:
        return None, unmade
    fast.why = (
        f"same ids as tokenizers on the {len(sample)} load-sample texts"
        f" ({sum(len(t) for t in sample)} characters, every token of the vocabulary), and"
        " every token what tokenizers' merges make of its own bytes"
    )
    return fast, fast.why


def _token_not_made_of_its_bytes(
    vocab: Mapping[str, int], added: set[int], reference: Tokenizer
) -> str | None:
    """The first token the reference's merges do not make of its own bytes, as why the fast
    encoder may not be used; None when every token is (as every trainer's are). tiktoken
    takes a pre-token that is a whole token as that token, so such a token would get other
    ids wherever its bytes are a pre-token, or a piece of one tiktoken merges by rank (an
    artifact with merges no trainer writes; the load sample holds only the vocabulary's
    tokens that are whole UTF-8, each beside a newline)."""
    model = reference.model
    for token, token_id in sorted(vocab.items(), key=lambda kv: kv[1]):
        if token_id in added:
            continue
        made = [t.id for t in model.tokenize(token)]
        if made != [token_id]:
            return (
                f"tokenizers' merges make token {token_id} ({token!r}) of its bytes as"
                f" {made}, where tiktoken takes the token: merges no trainer writes"
            )
    return None


def select_encoder(
    tokenizer: Tokenizer,
    mode: EncoderMode | str = EncoderMode.AUTO,
    *,
    threads: int = 1,
    artifact: str = layout.TOKENIZER,
    sha256: str | None = None,
) -> TokenEncoder:
    """The encoder `mode` asks for over `tokenizer` (built once per artifact and process).
    `auto` falls back to tokenizers with a FastEncoderFallbackWarning naming why; `fast`
    raises FastEncoderRefusedError instead. `sha256`: the artifact's, when the caller read
    the tokenizer from it (read_artifact); without it the tokenizer is serialized and hashed
    to find its encoder (about 14 ms for a 2.4 MB artifact, at every call)."""
    mode = EncoderMode(mode)
    raw = None if sha256 is not None else tokenizer.to_str()
    if raw is not None:
        sha256 = hashlib.sha256(raw.encode("utf-8")).hexdigest()
    assert sha256 is not None
    key = (sha256, mode, threads)

    def choose() -> TokenEncoder:
        serialized = tokenizer.to_str() if raw is None else raw
        return _choose(serialized, mode, threads, artifact, f"megacpp-{key[0][:12]}")

    chosen = _CHOSEN.get(key, choose)
    if mode is EncoderMode.AUTO and isinstance(chosen, ReferenceEncoder):
        warnings.warn(f"{artifact}: {chosen.why}", FastEncoderFallbackWarning, stacklevel=2)
    return chosen


def _choose(raw: str, mode: EncoderMode, threads: int, artifact: str, name: str) -> TokenEncoder:
    reference = Tokenizer.from_str(raw)
    reference.encode_special_tokens = True
    if mode is EncoderMode.TOKENIZERS:
        return ReferenceEncoder(reference, "configured: encoder tokenizers")
    fast, why = _build_fast(json.loads(raw), reference, threads, name)
    if fast is not None:
        return fast
    if mode is EncoderMode.FAST:
        raise FastEncoderRefusedError(artifact, why)
    return ReferenceEncoder(reference, f"fast encoder not used: {why}")


def forget_chosen() -> None:
    """Drop the encoders and tables built so far (a bench times the build as a fresh
    process pays it)."""
    _CHOSEN.clear()
    _TABLES.clear()
