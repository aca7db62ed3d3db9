"""The fast encoder: built from the same tokenizer.json, it gives tokenizers' ids exactly on
random unicode, CRLF, binary-ish text, very long lines, placeholders and control tokens
spelled in text, and every demo file; an artifact it cannot reproduce is refused at load
(by its shape, or by the load sample) with the reason, falling back or failing as configured.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import PurePosixPath
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, normalizers, pre_tokenizers

from megacpp_pipeline.corpus import encoders
from megacpp_pipeline.corpus.encoders import (
    SAMPLE,
    EncoderMode,
    FastEncoder,
    FastEncoderFallbackWarning,
    FastEncoderRefusedError,
    ReferenceEncoder,
    TokenBytes,
    byte_level_alphabet,
    select_encoder,
)
from megacpp_pipeline.corpus.tokenizer import (
    CONTROL_TOKENS,
    PLACEHOLDER_TOKENS,
    TokenizerConfig,
    train_tokenizer,
)
from tests.fixtures.real_cpp import DEMO_WHEELS, demo_wheel
from tests.fixtures.tokenizer_artifacts import (
    improper_merges,
    improper_merges_outside_the_sample,
)

CPP_SUFFIXES = {".h", ".hh", ".hpp", ".hxx", ".h++", ".c", ".cc", ".cpp", ".cxx", ".ipp",
                ".inl", ".tcc"}  # fmt: skip


def demo_texts() -> list[str]:
    """Every C++ file of the three demo wheels that is UTF-8 (4,138 files, 26 MB)."""
    texts = []
    for source_id in DEMO_WHEELS:
        for path, content in demo_wheel(source_id).files:
            if PurePosixPath(path).suffix in CPP_SUFFIXES:
                try:
                    texts.append(content.decode("utf-8"))
                except UnicodeDecodeError:
                    continue
    return texts


@pytest.fixture(scope="module")
def demo() -> list[str]:
    return demo_texts()


@pytest.fixture(scope="module")
def demo_tokenizer(demo: list[str]) -> Tokenizer:
    """What the demo snapshot's tokenizer stage trains: vocab 32,768 on the demo's C++."""
    return train_tokenizer(demo, TokenizerConfig())


@pytest.fixture(scope="module")
def small_tokenizer() -> Tokenizer:
    """A small vocabulary trained on a little C++: other merges, shorter tokens."""
    texts = [
        "int main() {\r\n  return 0;  // <EMAIL>\r\n}\n",
        "// Größe: 世界 — naïve\ntemplate <typename T> struct Box { T value; };\n",
        '#define MAX(a, b) ((a) > (b) ? (a) : (b))\n\tconst char* s = "<|eos|>";\n',
    ] * 30
    return train_tokenizer(texts, TokenizerConfig(vocab_size=420))


_PAIRS: dict[int, tuple[ReferenceEncoder, FastEncoder]] = {}


def pair(tok: Tokenizer) -> tuple[ReferenceEncoder, FastEncoder]:
    """Both encoders over `tok` (looked up once per tokenizer object: select_encoder
    serializes the tokenizer to find its memo, which a property test would pay per case)."""
    if id(tok) not in _PAIRS:
        reference = select_encoder(tok, EncoderMode.TOKENIZERS)
        fast = select_encoder(tok, EncoderMode.FAST)
        assert isinstance(reference, ReferenceEncoder) and isinstance(fast, FastEncoder)
        _PAIRS[id(tok)] = (reference, fast)
    return _PAIRS[id(tok)]


def assert_same_ids(tok: Tokenizer, texts: list[str]) -> None:
    reference, fast = pair(tok)
    want, got = reference.encode(texts), fast.encode(texts)
    if not got.equals(want):
        i = next(i for i in range(len(texts)) if got[i] != want[i])
        pytest.fail(f"ids differ on text {i}, {texts[i][:80]!r}: {got[i]} != {want[i]}")


# --- the artifact's alphabet --------------------------------------------------------------
def test_the_byte_level_alphabet_is_tokenizers_own_and_covers_every_byte_once() -> None:
    alphabet = byte_level_alphabet()
    assert set(alphabet) == set(pre_tokenizers.ByteLevel.alphabet())
    assert sorted(alphabet.values()) == list(range(256))
    assert all(alphabet[chr(b)] == b for b in range(ord("!"), ord("~") + 1))
    assert alphabet["Ġ"] == ord(" ") and alphabet["Ċ"] == ord("\n")


def test_token_byte_table_decodes_every_demo_file_as_tokenizers_does(
    demo_tokenizer: Tokenizer, demo: list[str]
) -> None:
    table = TokenBytes.of(demo_tokenizer)
    assert table is not None
    texts = demo[::7]
    ids = [e.ids for e in demo_tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
    flat = np.array([i for doc in ids for i in doc], dtype=np.int64)
    bounds = table.byte_bounds(flat, np.cumsum([0, *map(len, ids)]))
    data = table.decode(flat)
    decoded = demo_tokenizer.decode_batch(ids, skip_special_tokens=False)
    for i, text in enumerate(decoded):
        assert data[bounds[i] : bounds[i + 1]].tobytes() == text.encode("utf-8")


def test_an_artifacts_byte_table_is_built_once_per_process(small_tokenizer: Tokenizer) -> None:
    """A per-source round-trip check decodes every source with the same artifact: its table
    is built for the first and kept by the artifact's sha256 (None too, for an artifact
    without one), and forget_chosen drops it."""
    first = TokenBytes.of_artifact(small_tokenizer, "a" * 64)
    assert first is not None
    assert TokenBytes.of_artifact(small_tokenizer, "a" * 64) is first
    other = TokenBytes.of_artifact(small_tokenizer, "b" * 64)
    assert other is not first and np.array_equal(other.lengths, first.lengths)
    plain = Tokenizer.from_str(small_tokenizer.to_str())
    plain.decoder = None
    assert TokenBytes.of_artifact(plain, "c" * 64) is None
    assert TokenBytes.of_artifact(small_tokenizer, "c" * 64) is None  # kept by the sha256
    encoders.forget_chosen()
    assert TokenBytes.of_artifact(small_tokenizer, "a" * 64) is not first
    assert TokenBytes.of_artifact(small_tokenizer, "c" * 64) is not None
    encoders.forget_chosen()


@pytest.mark.parametrize("limit", [encoders.BINARY_OFFSETS_LIMIT, 1])
def test_token_byte_table_decodes_edges_and_past_32_bit_offsets(
    monkeypatch: pytest.MonkeyPatch, limit: int
) -> None:
    """No ids, only empty tokens, a slice of a larger array, and (the limit lowered) the
    64-bit-offsets path that more than 2 GiB of decoded bytes take."""
    monkeypatch.setattr(encoders, "BINARY_OFFSETS_LIMIT", limit)
    table = TokenBytes([b"", b"a", b"bc", "é".encode(), b"\x00\xff"])
    assert table.decode(np.array([], dtype=np.int64)).tobytes() == b""
    assert table.decode(np.array([0, 0], dtype=np.int64)).tobytes() == b""
    ids = np.array([4, 1, 0, 2, 3, 1], dtype=np.int64)
    assert table.decode(ids).tobytes() == b"\x00\xffa" + b"bc" + "é".encode() + b"a"
    assert table.decode(ids[2:5]).tobytes() == b"bc" + "é".encode()
    assert table.decode(ids.astype(np.int32)).tobytes() == table.decode(ids).tobytes()
    with pytest.raises(IndexError):
        table.decode(np.array([5], dtype=np.int64))


def test_an_encoder_found_by_its_artifacts_sha256_is_not_serialized_again(
    small_tokenizer: Tokenizer,
) -> None:
    """A per-source gate names its artifact's sha256: the encoder chosen for the first source
    is found for the next without serializing and hashing the tokenizer (14 ms at 2.4 MB)."""
    encoders.forget_chosen()
    first = select_encoder(small_tokenizer, "fast", sha256="d" * 64)

    class Unserializable:
        def to_str(self) -> str:
            raise AssertionError("serialized to find an encoder chosen before")

    again: Any = Unserializable()
    assert select_encoder(again, "fast", sha256="d" * 64) is first
    assert select_encoder(small_tokenizer, "fast") is not first  # keyed by its own bytes
    encoders.forget_chosen()


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_decoded_sha256_hashes_a_long_document_a_bounded_run_of_ids_at_a_time(
    small_tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the byte table, gathered and hashed 7 ids at a time, it is the hash of what the
    tokenizer decodes whole; ids whose bytes are not UTF-8 (the decoder would read U+FFFD)
    are a difference, never a match."""
    monkeypatch.setattr(encoders, "DECODE_PIECE_TOKENS", 7)
    table = TokenBytes.of(small_tokenizer)
    text = 'int main() {\n  return sizeof("h\u00e9llo") + 0x2a; // \u00fcn\u00efcode \u2713\n}\n'
    ids = np.array(small_tokenizer.encode(text * 20).ids, dtype=np.int32)
    assert ids.size > 50
    assert encoders.decoded_sha256(small_tokenizer, table, ids) == _sha(text * 20)
    c3 = small_tokenizer.token_to_id("\u00c3")  # byte 0xc3 (the first of \u00e9's) alone
    broken = np.array([c3, *small_tokenizer.encode("x").ids], dtype=np.int32)
    lossy = small_tokenizer.decode(broken.tolist(), skip_special_tokens=False)
    assert lossy.startswith("\ufffd")
    assert encoders.decoded_sha256(small_tokenizer, table, broken) != _sha(lossy)
    assert encoders.decoded_sha256(small_tokenizer, table, ids[:0]) == _sha("")


def test_decoded_sha256_without_a_byte_table_decodes_pieces_ending_after_a_newline(
    small_tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a table (a tokenizer that is not byte-level), by the tokenizer's decode: a
    long document in pieces that end after a newline token, so multibyte characters are
    never cut and the hash is the whole text's; a short one whole."""
    text = "// Größe: 世界 — naïve 🚀\nint área(int ñ) {\n    return ñ * 2;  // doppelt ü\n}\n" * 60
    ids = np.array(small_tokenizer.encode(text).ids, np.int64)
    newlines = encoders.newline_ids(small_tokenizer)
    assert newlines.size and np.isin(ids, newlines).sum() > 100
    whole = encoders.decoded_sha256(small_tokenizer, None, ids)
    assert whole == _sha(small_tokenizer.decode(ids.tolist(), skip_special_tokens=False))
    monkeypatch.setattr(encoders, "DECODE_PIECE_TOKENS", 50)
    decoded: list[int] = []
    real = Tokenizer.decode

    class Counting:  # tokenizers' Tokenizer cannot be patched: a stand-in that counts ids
        def decode(self, piece: list[int], skip_special_tokens: bool) -> str:
            decoded.append(len(piece))
            return real(small_tokenizer, piece, skip_special_tokens=skip_special_tokens)

        def get_vocab(self) -> dict[str, int]:
            return small_tokenizer.get_vocab()

    counting: Any = Counting()
    assert encoders.decoded_sha256(counting, None, ids) == _sha(text)
    assert len(decoded) > 5 and max(decoded[:-1]) < 50 + 40  # pieces, each a line past 50
    assert encoders.decoded_sha256(counting, None, ids, newlines) == _sha(text)
    assert encoders.decoded_sha256(small_tokenizer, None, ids[:-1], newlines) != _sha(text)


# --- the choice at load -------------------------------------------------------------------
def test_a_trained_artifact_gets_the_fast_encoder_and_the_manifest_says_why(
    demo_tokenizer: Tokenizer,
) -> None:
    encoder = select_encoder(demo_tokenizer)
    assert isinstance(encoder, FastEncoder)
    described = encoder.describe()
    assert described["encoder"].startswith("tiktoken ")
    assert "same ids as tokenizers" in described["encoder_why"]
    forced = select_encoder(demo_tokenizer, "tokenizers")
    assert isinstance(forced, ReferenceEncoder)
    assert forced.describe()["encoder"].startswith("tokenizers ")


def test_a_lossy_normalizer_falls_back_with_a_warning_or_fails_when_fast_is_required(
    small_tokenizer: Tokenizer,
) -> None:
    lossy = Tokenizer.from_str(small_tokenizer.to_str())
    lossy.normalizer = normalizers.Lowercase()
    with pytest.warns(FastEncoderFallbackWarning, match="normalizer 'Lowercase'"):
        encoder = select_encoder(lossy, "auto", artifact="pinned/tokenizer.json")
    assert isinstance(encoder, ReferenceEncoder)
    assert "normalizer 'Lowercase'" in encoder.describe()["encoder_why"]
    with pytest.raises(FastEncoderRefusedError, match=r"pinned/tokenizer\.json: .*Lowercase"):
        select_encoder(lossy, "fast", artifact="pinned/tokenizer.json")


def test_a_prefix_space_pre_tokenizer_is_not_reproduced(small_tokenizer: Tokenizer) -> None:
    doc = json.loads(small_tokenizer.to_str())
    doc["pre_tokenizer"]["add_prefix_space"] = True
    other = Tokenizer.from_str(json.dumps(doc))
    with pytest.raises(FastEncoderRefusedError, match="pre-tokenizer"):
        select_encoder(other, "fast")


def test_an_artifact_with_improper_merges_passes_the_shape_but_not_the_load_sample(
    small_tokenizer: Tokenizer,
) -> None:
    assert "\x01\x02\x1b" in "".join(SAMPLE)
    tok = improper_merges(small_tokenizer)
    with pytest.warns(FastEncoderFallbackWarning, match="differs from tokenizers on the load"):
        assert isinstance(select_encoder(tok, "auto"), ReferenceEncoder)
    with pytest.raises(FastEncoderRefusedError, match="load sample"):
        select_encoder(tok, "fast")


@pytest.mark.parametrize(
    ("kind", "texts"),
    [("whitespace", ["x \t\t\n", "int a; \t\t\n}\n"]), ("multibyte", ["// Հայերեն\n", "Հա"])],
)
def test_improper_merges_the_load_sample_never_meets_are_refused_too(
    small_tokenizer: Tokenizer, kind: str, texts: list[str]
) -> None:
    """A token the artifact's merges do not make of its own bytes (whitespace-only, or not
    whole UTF-8: the sample never encodes either alone) would get other ids from tiktoken;
    the encoder is refused for it, however the sample came out."""
    tok = improper_merges_outside_the_sample(small_tokenizer, kind)
    reference = Tokenizer.from_str(tok.to_str())
    with pytest.warns(FastEncoderFallbackWarning, match="merges no trainer writes"):
        chosen = select_encoder(tok, "auto")
    assert isinstance(chosen, ReferenceEncoder)
    wanted = [reference.encode(t, add_special_tokens=False).ids for t in texts]
    assert chosen.encode(texts).to_pylist() == wanted
    with pytest.raises(FastEncoderRefusedError, match="merges no trainer writes"):
        select_encoder(tok, "fast")


def test_a_whitespace_run_tiktoken_gives_up_on_gets_the_references_ids(
    demo_tokenizer: Tokenizer,
) -> None:
    """tiktoken's regex stops at about a million characters of whitespace (a backtracking
    limit); such a file fits the size policy, and gets tokenizers' ids instead of failing
    its batch."""
    assert_same_ids(
        demo_tokenizer,
        ["int a;\n" + "\n" * 1_000_000 + "int b;\n", " " * 999_999 + "x", "\t" * 1_000_000],
    )


def test_a_control_token_overlapping_a_placeholder_is_not_reproduced(
    small_tokenizer: Tokenizer,
) -> None:
    doc = json.loads(small_tokenizer.to_str())
    control = next(t for t in doc["added_tokens"] if t["content"] == CONTROL_TOKENS[0])
    control["content"] = "<|x<EMAIL"  # would hide "<EMAIL>" from tokenizers' matcher
    other = Tokenizer.from_str(json.dumps(doc))
    with pytest.raises(FastEncoderRefusedError, match="overlaps control token"):
        select_encoder(other, "fast")


def test_a_failed_round_trip_is_found_and_named_by_character(small_tokenizer: Tokenizer) -> None:
    _, fast = pair(small_tokenizer)
    texts = ["int x;\n", "// 世界\n", "int y;\n"]
    data = "".join(texts).encode()
    offsets = np.cumsum([0, *(len(t.encode()) for t in texts)])
    right = fast.encode(texts)
    assert fast.round_trip_failures(texts, np.frombuffer(data, np.uint8), offsets, right) == {}
    buffer = np.frombuffer(data, np.uint8)
    wrong = fast.encode(["int x;\n", "// 世xyz\n", "int z;\n"])  # same byte lengths
    assert fast.round_trip_failures(texts, buffer, offsets, wrong) == {1: 4, 2: 4}
    shorter = fast.encode(["int x;\n", "//\n", "int y;\n"])
    assert fast.round_trip_failures(texts, buffer, offsets, shorter) == {1: 2}


# --- identical ids ------------------------------------------------------------------------
TOKENIZERS = ("demo_tokenizer", "small_tokenizer")
PIECES = [*PLACEHOLDER_TOKENS, *CONTROL_TOKENS, "<", ">", "|", "<|", "|>", "<EMAIL", "EMAIL>",
          "<|eos|", "<<", ">>", "\r\n", "\r", "\n", " ", "  ", "\t", "'s", "'S", "x", "42",
          "\u00a0", "é", "世界"]  # fmt: skip
TEXT = st.characters(exclude_categories=("Cs",))  # any code point a UTF-8 string may hold
SETTINGS = settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.mark.parametrize("name", TOKENIZERS)
@SETTINGS
@given(texts=st.lists(st.text(TEXT, max_size=200), min_size=1, max_size=8))
def test_random_unicode_gets_the_same_ids(
    request: pytest.FixtureRequest, name: str, texts: list[str]
) -> None:
    assert_same_ids(request.getfixturevalue(name), texts)


@pytest.mark.parametrize("name", TOKENIZERS)
@SETTINGS
@given(
    texts=st.lists(
        st.lists(st.one_of(st.sampled_from(PIECES), st.text(TEXT, max_size=6))).map("".join),
        min_size=1,
        max_size=8,
    )
)
def test_placeholders_control_tokens_crlf_and_look_alikes_get_the_same_ids(
    request: pytest.FixtureRequest, name: str, texts: list[str]
) -> None:
    assert_same_ids(request.getfixturevalue(name), texts)


@pytest.mark.parametrize("name", TOKENIZERS)
@SETTINGS
@given(raw=st.lists(st.binary(min_size=1, max_size=300), min_size=1, max_size=6))
def test_nul_free_binary_ish_text_gets_the_same_ids(
    request: pytest.FixtureRequest, name: str, raw: list[bytes]
) -> None:
    blobs = [b.replace(b"\0", b"") for b in raw]
    texts = [b.decode("latin-1") for b in blobs] + [b.decode("utf-8", "replace") for b in blobs]
    assert_same_ids(request.getfixturevalue(name), texts)


@pytest.mark.parametrize("name", TOKENIZERS)
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(unit=st.text(TEXT, min_size=1, max_size=12), times=st.integers(500, 20_000))
def test_very_long_lines_get_the_same_ids(
    request: pytest.FixtureRequest, name: str, unit: str, times: int
) -> None:
    line = (unit.replace("\n", " ") * times)[:200_000]
    assert_same_ids(request.getfixturevalue(name), [line, line + "\r\n" + line])


def test_huge_runs_and_minified_lines_get_the_same_ids(demo_tokenizer: Tokenizer) -> None:
    numbers = ",".join(str(i * 7919 % 65536) for i in range(60_000))
    minified = "static const int kTable[]={" + numbers
    assert_same_ids(
        demo_tokenizer,
        [" " * 300_000, "\t" * 50_000 + "x", "a" * 300_000, "/" * 100_000, "世" * 100_000,
         minified + "};", "<EMAIL>" * 20_000, "\r\n" * 100_000],
    )  # fmt: skip


def test_every_fifth_demo_file_gets_the_same_ids(
    demo_tokenizer: Tokenizer, demo: list[str]
) -> None:
    assert_same_ids(demo_tokenizer, demo[::5])


@pytest.mark.slow
def test_every_demo_file_gets_the_same_ids(demo_tokenizer: Tokenizer, demo: list[str]) -> None:
    assert len(demo) > 4000  # about 20 s on two loaded cores: the fifth above is the default
    assert_same_ids(demo_tokenizer, demo)


@pytest.mark.slow
def test_every_code_point_in_context_gets_the_same_ids(demo_tokenizer: Tokenizer) -> None:
    # Each code point as a letter, a digit's neighbour, whitespace's neighbour and after an
    # apostrophe: the two regex engines must class it alike (Unicode tables of each).
    points = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    texts = [f"a{c}b {c}{c}1{c} {c}'s\n{c}" for c in points]
    for lo in range(0, len(texts), 65_536):
        assert_same_ids(demo_tokenizer, texts[lo : lo + 65_536])
