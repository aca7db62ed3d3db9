"""The tokenized_docs gate: every kept document round-trips, failures are named in the
ledger, the per-token chunk kind follows the byte spans of enrichment (also across
multibyte UTF-8), and the split is a deterministic function of source id and path."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, normalizers

from megacpp_pipeline.core import schemas
from megacpp_pipeline.core.catalog import SplitConfig
from megacpp_pipeline.core.ledger import DropReason
from megacpp_pipeline.corpus.encoders import FastEncoder, ReferenceEncoder, select_encoder
from megacpp_pipeline.corpus.tokenizer import SPECIAL_TOKENS, TokenizerConfig, train_tokenizer
from megacpp_pipeline.gates.enrich import CHUNK_KINDS
from megacpp_pipeline.gates.tokenization import (
    TokenizeConfig,
    TokenizerNotByteLevelError,
    align_chunk_kinds,
    assign_split,
    run,
)

OTHER, FUNC_SIGNATURE, FUNC_BODY, COMMENT = (
    CHUNK_KINDS[k] for k in ("other", "func_signature", "func_body", "comment")
)


def bytes_to_unicode() -> dict[int, str]:
    # GPT-2's byte <-> printable-char table, written out independently as the test oracle.
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


CHAR_TO_BYTE = {c: b for b, c in bytes_to_unicode().items()}


def token_bytes(tok: Tokenizer, token_id: int) -> bytes:
    token = tok.id_to_token(token_id)
    assert token is not None
    if token in SPECIAL_TOKENS:
        return token.encode()
    return bytes(CHAR_TO_BYTE[c] for c in token)


def spans_of(text: str, pieces: list[tuple[str, int]]) -> tuple[list[int], list[int], list[int]]:
    """A flat partition of `text` in UTF-8 byte offsets: each (substring, kind) in order."""
    data = text.encode()
    starts, ends, kinds = [], [], []
    cursor = 0
    for sub, kind in pieces:
        at = data.index(sub.encode(), cursor)
        starts.append(at)
        ends.append(at + len(sub.encode()))
        kinds.append(kind)
        cursor = ends[-1]
    return starts, ends, kinds


def enriched(
    docs: list[tuple[str, str]], spans: list[tuple[list[int], list[int], list[int]]] | None = None
) -> pa.Table:
    n = len(docs)
    spans = spans or [([], [], [])] * n
    rows = {
        "source_id": ["demo"] * n,
        "path": [p for p, _ in docs],
        "revision": ["0" * 40] * n,
        "blob_sha": [schemas.git_blob_sha(t.encode()) for _, t in docs],
        "size": [len(t.encode()) for _, t in docs],
        "encoding": ["utf-8"] * n,
        "text": [t for _, t in docs],
        "content_sha256": [schemas.text_sha256(t) for _, t in docs],
        "language": ["c++"] * n,
        "vendored": [False] * n,
        "license_expression": ["MIT"] * n,
        "license_source": ["file"] * n,
        "license_decision": ["allowed"] * n,
        "license_detail": [None] * n,
        "scrub_replacements": [0] * n,
        "scrub_kinds": [[] for _ in range(n)],
        "chunk_starts": [s[0] for s in spans],
        "chunk_ends": [s[1] for s in spans],
        "chunk_kinds": [s[2] for s in spans],
        "chunk_depths": [[0] * len(s[0]) for s in spans],
        "chunk_names": [[""] * len(s[0]) for s in spans],
        "parse_error_ratio": [0.0] * n,
        "n_functions": [0] * n,
        "n_classes": [0] * n,
        "comment_ratio": [0.0] * n,
        "max_nesting": [0] * n,
        "structure_source": ["syntax"] * n,
        "build_context": [None] * n,
    }
    return pa.Table.from_pydict(rows, schema=schemas.ENRICHED_FILES)


MULTIBYTE = "// Größe: 世界 — naïve 🚀\nint área(int ñ) {\n    return ñ * 2;  // doppelt ü\n}\n"
MULTIBYTE_SPANS = [
    ("// Größe: 世界 — naïve 🚀\n", COMMENT),
    ("int área(int ñ) ", FUNC_SIGNATURE),
    ("{\n    return ñ * 2;  ", FUNC_BODY),
    ("// doppelt ü\n", COMMENT),
    ("}\n", FUNC_BODY),
]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    texts = [MULTIBYTE, "int main() { return 0; }\n", "// 世界 Größe ü ñ\n"] * 40
    return train_tokenizer(texts, TokenizerConfig(vocab_size=400))


def test_every_kept_document_decodes_back_to_its_text(tokenizer: Tokenizer) -> None:
    docs = [
        ("a.hpp", MULTIBYTE),
        ("b.cpp", '#include <cstdio>\nint main() {\r\n\tputs("<|eos|>");\n}\n'),
        ("c.h", "// mail <EMAIL> or <IP_ADDRESS>\n"),
    ]
    result = run(enriched(docs), tokenizer, TokenizeConfig(), SplitConfig())
    assert result.kept.schema == schemas.TOKENIZED_DOCS
    assert result.kept.column("path").to_pylist() == ["a.hpp", "b.cpp", "c.h"]
    for (_, text), ids in zip(docs, result.kept.column("token_ids").to_pylist(), strict=True):
        assert tokenizer.decode(ids, skip_special_tokens=False) == text
        assert SPECIAL_TOKENS.index("<|bos|>") not in ids  # the packer adds BOS/EOS
    assert result.kept.column("num_tokens").to_pylist() == [
        len(ids) for ids in result.kept.column("token_ids").to_pylist()
    ]
    assert result.dropped.num_rows == 0
    assert result.stats["docs_kept"] == 3


def test_chunk_kind_of_each_token_is_the_span_holding_its_first_byte_across_multibyte_utf8(
    tokenizer: Tokenizer,
) -> None:
    starts, ends, kinds = spans_of(MULTIBYTE, MULTIBYTE_SPANS)
    result = run(
        enriched([("m.cpp", MULTIBYTE)], [(starts, ends, kinds)]),
        tokenizer,
        TokenizeConfig(),
        SplitConfig(),
    )
    ids = result.kept.column("token_ids")[0].as_py()
    got = result.kept.column("chunk_kind")[0].as_py()
    # Oracle: a per-token walk over each token's own bytes.
    expected, pos = [], 0
    for token_id in ids:
        kind = next((k for s, e, k in zip(starts, ends, kinds, strict=True) if s <= pos < e), 0)
        expected.append(kind)
        pos += len(token_bytes(tokenizer, token_id))
    assert pos == len(MULTIBYTE.encode())
    assert got == expected
    assert set(got) == {COMMENT, FUNC_SIGNATURE, FUNC_BODY}


def test_tokens_outside_every_span_are_kind_other(tokenizer: Tokenizer) -> None:
    text = "int x;\n// note\nint y;\n"
    starts, ends, kinds = spans_of(text, [("// note\n", COMMENT)])
    result = run(
        enriched([("g.h", text)], [(starts, ends, kinds)]),
        tokenizer,
        TokenizeConfig(),
        SplitConfig(),
    )
    got = result.kept.column("chunk_kind")[0].as_py()
    assert got[0] == OTHER and got[-1] == OTHER and COMMENT in got


def test_a_span_reaching_past_its_text_does_not_leak_into_the_next_document(
    tokenizer: Tokenizer,
) -> None:
    first, second = "int a;\n", "int b;\n"
    table = enriched([("a.h", first), ("b.h", second)], [([0], [10_000], [COMMENT]), ([], [], [])])
    result = run(table, tokenizer, TokenizeConfig(), SplitConfig())
    assert set(result.kept.column("chunk_kind")[1].as_py()) == {OTHER}


def test_empty_document_is_dropped_as_empty_after_tokenize(tokenizer: Tokenizer) -> None:
    result = run(
        enriched([("empty.h", ""), ("ok.h", "int x;\n")]),
        tokenizer,
        TokenizeConfig(),
        SplitConfig(),
    )
    assert result.kept.column("path").to_pylist() == ["ok.h"]
    dropped = result.dropped.to_pylist()
    assert [(d["path"], d["reason"]) for d in dropped] == [
        ("empty.h", DropReason.EMPTY_AFTER_TOKENIZE)
    ]


def test_a_document_that_does_not_round_trip_is_dropped_naming_the_file(
    tokenizer: Tokenizer,
) -> None:
    lossy = Tokenizer.from_str(tokenizer.to_str())
    lossy.normalizer = normalizers.Lowercase()  # a pinned artifact with a lossy normalizer
    docs = [("Upper.hpp", "#define MAX_SIZE 10\n"), ("lower.hpp", "int x;\n")]
    result = run(enriched(docs), lossy, TokenizeConfig(), SplitConfig())
    assert result.kept.column("path").to_pylist() == ["lower.hpp"]
    (drop,) = result.dropped.to_pylist()
    assert drop["reason"] == DropReason.ROUND_TRIP_FAILED
    assert "demo:Upper.hpp" in drop["detail"] and "character 8" in drop["detail"]


def test_a_tokenizer_without_byte_level_decoder_is_refused(tokenizer: Tokenizer) -> None:
    from tokenizers import decoders

    other = Tokenizer.from_str(tokenizer.to_str())
    other.decoder = decoders.WordPiece()
    with pytest.raises(TokenizerNotByteLevelError, match="ByteLevel"):
        run(enriched([("a.h", "int x;\n")]), other, TokenizeConfig(), SplitConfig())


def test_small_batches_give_the_same_rows_as_one_batch(tokenizer: Tokenizer) -> None:
    docs = [(f"f{i}.h", f"int v{i} = {i};  // 世界 {i}\n") for i in range(25)]
    spans = [spans_of(text, [(f"// 世界 {i}\n", COMMENT)]) for i, (_, text) in enumerate(docs)]
    one = run(enriched(docs, spans), tokenizer, TokenizeConfig(), SplitConfig())
    many = run(enriched(docs, spans), tokenizer, TokenizeConfig(batch_bytes=40), SplitConfig())
    assert one.kept.equals(many.kept)
    assert all(COMMENT in kinds for kinds in many.kept.column("chunk_kind").to_pylist())


def test_split_is_a_stable_hash_of_source_and_path_near_the_configured_fraction() -> None:
    paths = [f"include/lib/file_{i}.hpp" for i in range(4000)]
    config = SplitConfig(validation_fraction=0.1)
    splits = assign_split(["demo"] * 4000, paths, config)
    assert splits == assign_split(["demo"] * 4000, paths, config)
    assert 300 < splits.count("validation") < 500
    # The same path in another source is an independent draw; another salt reshuffles.
    assert splits != assign_split(["other"] * 4000, paths, config)
    assert splits != assign_split(
        ["demo"] * 4000, paths, SplitConfig(validation_fraction=0.1, salt="other-salt")
    )
    assert set(assign_split(["demo"] * 50, paths[:50], SplitConfig(validation_fraction=0.0))) == {
        "train"
    }


def test_split_is_recorded_per_document(tokenizer: Tokenizer) -> None:
    docs = [(f"f{i}.h", f"int v{i};\n") for i in range(40)]
    split = SplitConfig(validation_fraction=0.5)
    result = run(enriched(docs), tokenizer, TokenizeConfig(), split)
    expected = assign_split(["demo"] * 40, [p for p, _ in docs], split)
    assert result.kept.column("split").to_pylist() == expected
    assert result.stats["docs_train"] + result.stats["docs_validation"] == 40


@st.composite
def documents_with_spans(draw: st.DrawFn) -> tuple[list[int], list[list[int]], pa.Table]:
    """Documents (byte lengths), each token's start in its document (ascending, sometimes
    past the text's end, as a document whose ids overrun it has) and sorted spans that may
    nest, overlap, be empty, start together or reach past the text."""
    sizes, starts, spans = [], [], []
    for _ in range(draw(st.integers(1, 4))):
        size = draw(st.integers(0, 30))
        sizes.append(size)
        overrun = draw(st.integers(0, 3)) if draw(st.booleans()) else 0
        starts.append(sorted(draw(st.sets(st.integers(0, max(size + overrun - 1, 0))))))
        lo = sorted(draw(st.lists(st.integers(0, size), max_size=6)))
        spans.append([(s, s + draw(st.integers(0, 12)), draw(st.integers(1, 6))) for s in lo])
    chunks = pa.table(
        {
            "chunk_starts": pa.array([[s for s, _, _ in d] for d in spans], pa.list_(pa.int32())),
            "chunk_ends": pa.array([[e for _, e, _ in d] for d in spans], pa.list_(pa.int32())),
            "chunk_kinds": pa.array([[k for _, _, k in d] for d in spans], pa.list_(pa.uint8())),
        }
    )
    return sizes, starts, chunks


@settings(max_examples=300, deadline=None)
@given(case=documents_with_spans())
def test_chunk_kind_alignment_equals_a_walk_over_each_token(
    case: tuple[list[int], list[list[int]], pa.Table],
) -> None:
    sizes, starts, chunks = case
    doc_bytes = np.array(sizes, dtype=np.int64)
    doc_base = np.cumsum(doc_bytes) - doc_bytes
    token_doc = np.repeat(np.arange(len(sizes)), [len(s) for s in starts])
    token_start = np.array([t for s in starts for t in s], dtype=np.int64)
    got = align_chunk_kinds(token_doc, token_start, doc_base, doc_bytes, chunks).tolist()
    # Oracle: in one global byte space, the last span starting at or before the token's
    # first byte gives its kind if the token starts before that span's (clipped) end.
    spans = [
        (base + s, base + min(e, size), k)
        for base, size, ss, es, ks in zip(
            doc_base.tolist(),
            sizes,
            chunks["chunk_starts"].to_pylist(),
            chunks["chunk_ends"].to_pylist(),
            chunks["chunk_kinds"].to_pylist(),
            strict=True,
        )
        for s, e, k in zip(ss, es, ks, strict=True)
    ]
    expected = []
    for doc, start in zip(token_doc.tolist(), token_start.tolist(), strict=True):
        at = doc_base[doc] + start
        holding = [(s, e, k) for s, e, k in spans if s <= at]
        expected.append(holding[-1][2] if holding and at < holding[-1][1] else 0)
    assert got == expected


def test_the_gate_gives_the_same_rows_with_either_encoder(tokenizer: Tokenizer) -> None:
    docs = [
        ("a.hpp", MULTIBYTE),
        ("b.cpp", 'int main() {\r\n\tputs("<|eos|>");\r\n}\r\n'),
        ("c.h", "// mail <EMAIL> or <IP_ADDRESS>, key <API_KEY><PASSWORD>\n"),
        ("empty.h", ""),
        ("d.h", "x" * 5000 + " " * 300 + "\t\n"),
    ]
    starts, ends, kinds = spans_of(MULTIBYTE, MULTIBYTE_SPANS)
    spans = [(starts, ends, kinds)] + [([], [], [])] * 4
    table = enriched(docs, spans)
    fast = select_encoder(tokenizer, "fast")
    reference = select_encoder(tokenizer, "tokenizers")
    assert isinstance(fast, FastEncoder) and isinstance(reference, ReferenceEncoder)
    by_fast, by_reference = (
        run(table, fast, TokenizeConfig(), SplitConfig()),
        run(table, reference, TokenizeConfig(), SplitConfig()),
    )
    assert by_fast.kept.equals(by_reference.kept)
    assert by_fast.dropped.equals(by_reference.dropped)
    assert by_fast.stats == by_reference.stats
    assert by_fast.kept.num_rows == 4  # the empty one is dropped both ways


def test_a_long_document_is_encoded_a_piece_at_a_time_to_the_ids_of_the_whole(
    tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file at the size policy's limit: its Encoding is never held whole, and the ids are
    those of encoding it whole (byte-level pre-tokens never cross a newline before a
    non-space character)."""
    from megacpp_pipeline.gates import tokenization

    text = (MULTIBYTE + "int main() {\n  return 0;\n}\n\n  // indented\n") * 200
    whole = tokenizer.encode(text, add_special_tokens=False).ids
    assert tokenization.splits_exactly(tokenizer)
    monkeypatch.setattr(tokenization, "PIECE_CHARS", 500)
    pieces = list(tokenization.text_pieces(text, 500))
    assert len(pieces) > 20 and "".join(pieces) == text
    assert all(p.endswith("\n") for p in pieces[:-1])
    assert all(not p[0].isspace() for p in pieces[1:])
    table = enriched([("big.h", text), ("small.h", "int y;\n")])
    result = run(table, tokenizer, TokenizeConfig(), SplitConfig())
    assert result.kept["token_ids"][0].as_py() == whole
    assert result.kept["num_tokens"][0].as_py() == len(whole)
    assert result.dropped.num_rows == 0


@pytest.mark.parametrize("line_end", [" \n", "\t\n", "\r\n"])
def test_a_long_document_whose_lines_end_in_whitespace_is_cut_where_the_ids_stay_the_same(
    monkeypatch: pytest.MonkeyPatch, line_end: str
) -> None:
    """Whitespace before the newline would make a piece end in " \\n" (or "\\r\\n"), one
    pre-token where the whole text has two: a piece is cut only after a newline between
    non-space characters."""
    from megacpp_pipeline.gates import tokenization

    # every line but a block's last ends in whitespace before its newline
    text = (("int value = compute(a, b);" + line_end) * 6 + "}\n") * 60
    # blank lines after such ends teach the trainer the whitespace-then-newline token
    tokenizer = train_tokenizer([("x;" + line_end + "\n") * 50, text], TokenizerConfig())
    assert len(tokenizer.encode(line_end, add_special_tokens=False).ids) == 1  # one token
    whole = tokenizer.encode(text, add_special_tokens=False).ids
    monkeypatch.setattr(tokenization, "PIECE_CHARS", 500)
    pieces = list(tokenization.text_pieces(text, 500))
    assert len(pieces) > 5 and "".join(pieces) == text
    assert all(p.endswith("}\n") for p in pieces[:-1])
    result = run(enriched([("big.h", text)]), tokenizer, TokenizeConfig(), SplitConfig())
    assert result.kept["token_ids"][0].as_py() == whole


def test_tokens_aligned_block_by_block_get_the_kinds_of_the_vectorized_alignment(
    tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from megacpp_pipeline.gates import tokenization

    docs = [("a.cc", MULTIBYTE), ("b.cc", MULTIBYTE * 3), ("c.cc", "int z;\n")]
    spans = [spans_of(MULTIBYTE, MULTIBYTE_SPANS)]
    spans.append(spans_of(MULTIBYTE * 3, MULTIBYTE_SPANS * 3))
    spans.append(([0], [3], [FUNC_SIGNATURE]))
    vectorized = run(enriched(docs, spans), tokenizer, TokenizeConfig(), SplitConfig())
    monkeypatch.setattr(tokenization, "BLOCK_TOKENS", 7)
    blocks = run(enriched(docs, spans), tokenizer, TokenizeConfig(), SplitConfig())
    assert blocks.kept["chunk_kind"].to_pylist() == vectorized.kept["chunk_kind"].to_pylist()
    assert blocks.kept.equals(vectorized.kept) and blocks.dropped.num_rows == 0


def test_a_tokenizer_that_normalizes_is_never_split(tokenizer: Tokenizer) -> None:
    from megacpp_pipeline.gates import tokenization

    changed = Tokenizer.from_str(tokenizer.to_str())
    changed.normalizer = normalizers.NFC()
    assert not tokenization.splits_exactly(changed)
