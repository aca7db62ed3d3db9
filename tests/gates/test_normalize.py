"""The normalize gate, specified by the files it keeps, how it decodes them, and the ledger
reason every other file gets."""

from __future__ import annotations

import codecs

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from megacpp_pipeline.core import schemas
from megacpp_pipeline.core.ledger import LEDGER_SCHEMA, DropReason
from megacpp_pipeline.gates import normalize as normalize_gate
from megacpp_pipeline.gates.normalize import NormalizeConfig, NormalizeInputError, run
from tests.fixtures import real_cpp

HEADER = """\
// Copyright (c) 2024 Example Authors
// Distributed under the Boost Software License, Version 1.0.

#ifndef EXAMPLE_SPAN_HPP
#define EXAMPLE_SPAN_HPP

#include <cstddef>

namespace example {

template <class T>
class span {
 public:
  constexpr span(T* data, std::size_t size) noexcept : data_(data), size_(size) {}
  constexpr std::size_t size() const noexcept { return size_; }
  constexpr T& operator[](std::size_t i) const { return data_[i]; }

 private:
  T* data_;
  std::size_t size_;
};

}  // namespace example

#endif  // EXAMPLE_SPAN_HPP
"""


# bytes that exercise every per-file count: letters, LF, CR, controls, multi-byte UTF-8
_PIECES = [
    b"a", b"Z", b"7", b" ", b"\n", b"\r\n", b"\r", b"\t", b"\x01", b"\x7f", b"\xc3\xa9", b";;",
]  # fmt: skip


def raw_table(files: dict[str, bytes], source_id: str = "demo") -> pa.Table:
    rows = [
        {
            "source_id": source_id,
            "path": path,
            "revision": "0" * 40,
            "blob_sha": schemas.git_blob_sha(content),
            "size": len(content),
            "content": content,
        }
        for path, content in files.items()
    ]
    return pa.Table.from_pylist(rows, schema=schemas.RAW_FILES)


def normalize(files: dict[str, bytes], **config: object) -> tuple[dict, dict]:
    """(kept rows by path, (reason, detail) by dropped path)."""
    result = run(raw_table(files), NormalizeConfig(**config))  # type: ignore[arg-type]
    assert result.kept.schema.equals(schemas.NORMALIZED_FILES)
    assert result.dropped.schema.equals(LEDGER_SCHEMA)
    kept = {row["path"]: row for row in result.kept.to_pylist()}
    dropped = {row["path"]: (row["reason"], row["detail"]) for row in result.dropped.to_pylist()}
    assert len(kept) + len(dropped) == len(files), "every file is kept or in the ledger"
    return kept, dropped


def test_plain_utf8_header_is_kept_unchanged_with_its_hash():
    kept, _ = normalize({"include/span.hpp": HEADER.encode()})
    row = kept["include/span.hpp"]
    assert row["text"] == HEADER
    assert row["encoding"] == "utf-8"
    assert row["content_sha256"] == schemas.text_sha256(HEADER)
    assert row["blob_sha"] == schemas.git_blob_sha(HEADER.encode())


def test_utf8_bom_is_stripped_and_recorded():
    kept, _ = normalize({"a.h": codecs.BOM_UTF8 + HEADER.encode()})
    assert kept["a.h"]["text"] == HEADER
    assert kept["a.h"]["encoding"] == "utf-8-sig"
    assert kept["a.h"]["content_sha256"] == schemas.text_sha256(HEADER)


@pytest.mark.parametrize(
    ("bom", "codec"), [(codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be")]
)
def test_utf16_with_bom_decodes_despite_its_nul_bytes(bom, codec):
    text = HEADER.replace("Example Authors", "Exämple Authörs")
    kept, _ = normalize({"win/span.h": bom + text.encode(codec)})
    assert kept["win/span.h"]["text"] == text
    assert kept["win/span.h"]["encoding"] == codec


@pytest.mark.parametrize(
    ("bom", "codec"), [(codecs.BOM_UTF32_LE, "utf-32-le"), (codecs.BOM_UTF32_BE, "utf-32-be")]
)
def test_utf32_with_bom_decodes_and_is_not_taken_for_utf16(bom, codec):
    """UTF-32-LE's BOM starts with UTF-16-LE's: it was decoded as UTF-16 and dropped as
    binary (NUL characters)."""
    text = HEADER.replace("Example Authors", "Exämple Authörs")
    kept, _ = normalize({"win/span.h": bom + text.encode(codec)})
    assert kept["win/span.h"]["text"] == text
    assert kept["win/span.h"]["encoding"] == codec


@pytest.mark.parametrize(
    ("raw", "detail"),
    [
        # a UTF-8 BOM, then UTF-8 with one broken byte: was kept as cp1252, "ï»¿" and all
        (codecs.BOM_UTF8 + "// Überprüfung\n".encode() + b"// \xa9 2020\n", "a UTF-8 BOM"),
        # UTF-8 text with one stray latin-1 byte: was kept as cp1252 ("ÃœberprÃ¼fung")
        ("// Überprüfung\n".encode() + b"// \xa9 2020\n" + HEADER.encode(), "UTF-8 with"),
    ],
)
def test_utf8_with_a_broken_byte_is_undecodable_not_kept_as_mojibake(raw, detail):
    kept, dropped = normalize({"m.h": raw})
    assert not kept
    assert dropped["m.h"][0] == DropReason.UNDECODABLE and detail in dropped["m.h"][1]


def test_a_cp_file_is_kept_as_the_language_gate_counts_it_cpp():
    kept, _ = normalize({"src/old.cp": HEADER.encode()})
    assert "src/old.cp" in kept


def test_latin1_comment_falls_back_to_cp1252_and_is_recorded():
    raw = HEADER.replace("Example Authors", "José Müller").encode("latin-1")
    kept, _ = normalize({"legacy.cpp": raw})
    assert kept["legacy.cpp"]["encoding"] == "cp1252"
    assert "José Müller" in kept["legacy.cpp"]["text"]


def test_byte_undefined_in_cp1252_falls_through_to_latin1():
    raw = HEADER.encode() + b"// control \x81 byte from an old editor\n"
    kept, _ = normalize({"old.c": raw})
    assert kept["old.c"]["encoding"] == "latin-1"


def test_without_fallbacks_invalid_utf8_is_undecodable():
    _, dropped = normalize({"old.c": HEADER.encode() + b"// caf\xe9\n"}, fallback_encodings=[])
    assert dropped["old.c"][0] == DropReason.UNDECODABLE


# C++ commented in each language, as the files are found: the Japanese in Shift-JIS (cp932)
# or EUC-JP, the Chinese in GBK (simplified) or Big5 (traditional), the Korean in EUC-KR.
_JAPANESE = """\
// リングバッファの実装。スレッドセーフではない。
#include <cstddef>

template <class T, std::size_t N>
class ring_buffer {
 public:
  // 要素を末尾に追加する。満杯なら最も古い要素を上書きする
  void push(const T& value) {
    data_[head_] = value;
    head_ = (head_ + 1) % N;  // 先頭位置を進める
  }

 private:
  T data_[N];
  std::size_t head_ = 0;  // 次に書き込む位置
};
"""
_SIMPLIFIED_CHINESE = """\
// 环形缓冲区的实现，不是线程安全的。
#include <cstddef>

template <class T, std::size_t N>
class ring_buffer {
 public:
  // 在末尾添加元素；如果已满，则覆盖最旧的元素
  void push(const T& value) {
    data_[head_] = value;
    head_ = (head_ + 1) % N;  // 移动写入位置
  }

 private:
  T data_[N];
  std::size_t head_ = 0;  // 下一个写入的位置
};
"""
_TRADITIONAL_CHINESE = """\
// 環形緩衝區的實作，不是執行緒安全的。
#include <cstddef>

template <class T, std::size_t N>
class ring_buffer {
 public:
  // 在尾端加入元素；如果已滿，則覆寫最舊的元素
  void push(const T& value) {
    data_[head_] = value;
    head_ = (head_ + 1) % N;  // 移動寫入位置
  }

 private:
  T data_[N];
  std::size_t head_ = 0;  // 下一個寫入的位置
};
"""
_KOREAN = """\
// 링 버퍼 구현. 스레드 안전하지 않다.
#include <cstddef>

template <class T, std::size_t N>
class ring_buffer {
 public:
  // 끝에 요소를 추가한다. 가득 차면 가장 오래된 요소를 덮어쓴다
  void push(const T& value) {
    data_[head_] = value;
    head_ = (head_ + 1) % N;  // 쓰기 위치를 옮긴다
  }

 private:
  T data_[N];
  std::size_t head_ = 0;  // 다음에 쓸 위치
};
"""
_EAST_ASIAN_FILES = [
    (_JAPANESE, "cp932"),
    (_JAPANESE, "euc_jp"),
    (_SIMPLIFIED_CHINESE, "gbk"),
    (_TRADITIONAL_CHINESE, "big5"),
    (_KOREAN, "euc_kr"),
]


@pytest.mark.parametrize(("text", "codec"), _EAST_ASIAN_FILES)
def test_east_asian_comments_decode_to_the_original_text_with_their_encoding(text, codec):
    """They were kept as cp1252 or latin-1 mojibake, or dropped as broken UTF-8."""
    kept, _ = normalize({"ring_buffer.hpp": text.encode(codec)})
    assert kept["ring_buffer.hpp"]["text"] == text
    assert kept["ring_buffer.hpp"]["encoding"] == codec
    assert kept["ring_buffer.hpp"]["content_sha256"] == schemas.text_sha256(text)


@pytest.mark.parametrize(
    ("comment", "codec"),
    [
        ("// ポインタ", "cp932"),  # katakana only: Shift-JIS puts ASCII trail bytes in it
        ("// デストラクタ", "cp932"),
        ("// 初期化処理を行う", "euc_jp"),
        ("// 释放内存", "gbk"),
        ("// 初始化缓冲区", "gbk"),
        ("// 釋放記憶體", "big5"),
        ("// 메모리 해제", "euc_kr"),
        ("// 버퍼를 초기화한다", "euc_kr"),
    ],
)
def test_one_east_asian_comment_is_enough(comment, codec):
    text = comment + "\n" + HEADER
    kept, _ = normalize({"span.hpp": text.encode(codec)})
    assert (kept["span.hpp"]["text"], kept["span.hpp"]["encoding"]) == (text, codec)


@pytest.mark.parametrize(
    "comment",
    [
        "// (c) Jürgen Müller",
        "// Größe für später",
        "// café déjà",
        "// Função de inicialização",  # accents in pairs: çã
        "// süße Grüße, Straße",
        "// INFORMAÇÕES DA FUNÇÃO",
        "// 25°C, 10µs, don’t",
        "// « École » — voilà",
        "// ÄÄÄÄÄÄÄÄÄÄÄÄÄÄÄÄÄÄÄÄ",  # a DOS box line, as cp1252 reads it
    ],
)
def test_western_comments_still_decode_as_cp1252(comment):
    text = comment + "\n" + HEADER
    kept, _ = normalize({"span.hpp": text.encode("cp1252")})
    assert (kept["span.hpp"]["text"], kept["span.hpp"]["encoding"]) == (text, "cp1252")


def test_a_file_mixing_two_east_asian_encodings_is_undecodable_not_mojibake():
    """No single codec reads both comments, and cp1252 would keep either as mojibake."""
    raw = "// バッファを初期化する\n".encode("cp932") + "// 버퍼를 초기화한다\n".encode("euc_kr")
    kept, dropped = normalize({"mixed.cpp": raw + HEADER.encode()})
    assert not kept
    assert dropped["mixed.cpp"] == (
        DropReason.UNDECODABLE,
        "looks like a double-byte East Asian encoding, none of "
        "cp932/euc_jp/euc_kr/gbk/big5 reads it coherently",
    )


def test_utf8_east_asian_text_with_a_broken_byte_is_still_broken_utf8():
    """Not read as some double-byte codec: its high bytes are nearly all UTF-8 sequences."""
    raw = "// リングバッファの実装\n".encode() + b"// \xff\n" + HEADER.encode()
    _, dropped = normalize({"ring.hpp": raw})
    assert dropped["ring.hpp"][0] == DropReason.UNDECODABLE
    assert dropped["ring.hpp"][1].startswith("UTF-8 with bytes that are not")


def test_the_east_asian_encodings_are_configurable():
    raw = _SIMPLIFIED_CHINESE.encode("gbk")
    kept, _ = normalize({"r.hpp": raw}, east_asian_encodings=["gb18030"])
    assert kept["r.hpp"]["encoding"] == "gb18030"
    _, dropped = normalize({"r.hpp": raw}, east_asian_encodings=[])
    assert dropped["r.hpp"][1].startswith("UTF-8 with bytes that are not")  # as before


def test_a_single_byte_encoding_is_not_an_east_asian_one():
    with pytest.raises(ValidationError, match="east_asian_encodings"):
        NormalizeConfig(east_asian_encodings=["cp1252"])


_LATIN1_CAPITALS = [chr(c) for c in range(0xC0, 0xDF) if c != 0xD7]  # À..Þ
_LATIN1_SMALL = [chr(c) for c in range(0xDF, 0x100) if c != 0xF7]  # ß..ÿ


@st.composite
def _western_word(draw: st.DrawFn) -> str:
    """A word as Western European languages write it: small letters, up to two of them
    accented, anywhere (café, ção, süß), after an optional capital, maybe accented
    (École, Über)."""
    small = st.sampled_from("abcdefghijklmnopqrstuvwxyz")
    letters = draw(st.lists(small, min_size=1, max_size=10))
    for accent in draw(st.lists(st.sampled_from(_LATIN1_SMALL), max_size=2)):
        letters.insert(draw(st.integers(0, len(letters))), accent)
    capital = draw(st.sampled_from(["", "", *"ABCDEFGHIJKLMNOPQRSTUVWXYZ", *_LATIN1_CAPITALS]))
    return capital + "".join(letters)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["", "«", "“", "‘", "(", "¿", "¡"]),
            _western_word(),
            st.sampled_from(["", "»", "”", "’s", ",", ".", "…", "€", "°", "—"]),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_western_european_text_is_never_taken_for_east_asian(words):
    comment = "// " + " ".join(before + word + after for before, word, after in words)
    text = comment + "\n" + HEADER
    kept, dropped = normalize({"w.hpp": text.encode("cp1252")})
    assert "w.hpp" not in dropped or "East Asian" not in dropped["w.hpp"][1]
    if "w.hpp" in kept:  # UTF-8 when ASCII only, or "Â»" is UTF-8's "»"
        assert kept["w.hpp"]["encoding"] in ("utf-8", "cp1252")
        if kept["w.hpp"]["encoding"] == "cp1252":
            assert kept["w.hpp"]["text"] == text


def test_crlf_and_lone_cr_become_lf_and_the_hash_follows_the_text():
    dos = HEADER.replace("\n", "\r\n").encode()
    mac = HEADER.replace("\n", "\r").encode()
    kept, _ = normalize({"dos.cpp": dos, "mac.cpp": mac})
    for path in ("dos.cpp", "mac.cpp"):
        assert kept[path]["text"] == HEADER
        assert kept[path]["content_sha256"] == schemas.text_sha256(HEADER)
        assert kept[path]["blob_sha"] != schemas.git_blob_sha(HEADER.encode())  # raw bytes id


def test_nul_containing_blob_named_h_is_binary():
    blob = b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 4
    _, dropped = normalize({"include/blob.h": blob})
    assert dropped["include/blob.h"] == (DropReason.BINARY, "NUL byte in raw content")


def test_control_characters_without_nul_are_binary():
    junk = bytes([1, 2, 3, 4, 5, 6, 0x1B, ord("a")]) * 200
    _, dropped = normalize({"junk.cpp": junk})
    reason, detail = dropped["junk.cpp"]
    assert reason == DropReason.BINARY
    assert "max_non_text_ratio" in detail


def test_five_megabyte_single_line_table_has_too_long_lines():
    """No size limit here (collection applies the one size policy, max_file_bytes): a 5 MB
    one-line table that got this far is dropped for what it is."""
    table = b"static const int t[] = {" + b"1," * (5 * (1 << 20) // 2 - 13) + b"};"
    _, dropped = normalize({"gen/table.cpp": table})
    assert dropped["gen/table.cpp"] == (
        DropReason.LONG_LINES,
        "max line 5242880 > 1000 (max_line_length)",
    )


def test_the_size_limit_is_not_a_normalize_setting_any_more():
    with pytest.raises(ValidationError, match="max_file_bytes"):
        NormalizeConfig(max_file_bytes=1 << 20)


LFS_POINTER = (
    b"version https://git-lfs.github.com/spec/v1\n"
    b"oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\n"
    b"size 12345678\n"
)
ANNEX_POINTER = (
    b"/annex/objects/SHA256E-s52428800--"
    b"0b8e3c5b2a9c4f1e6d7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e.hpp\n"
)


def test_git_lfs_and_git_annex_pointers_are_dropped_as_pointer_files_naming_the_object():
    files = {
        "include/model_weights.hpp": LFS_POINTER,
        "include/lfs_with_extension.h": LFS_POINTER.replace(
            b"oid", b"ext-0-foo sha256:" + b"0" * 64 + b"\noid"
        ),
        "include/huge_table.hpp": ANNEX_POINTER,
        "include/span.hpp": HEADER.encode(),
        # a header that quotes the pointer format is C++, not a pointer
        "include/lfs_doc.h": b"// " + LFS_POINTER.replace(b"\n", b"\n// ") + HEADER.encode(),
    }
    kept, dropped = normalize(files)
    assert set(kept) == {"include/span.hpp", "include/lfs_doc.h"}
    reason, detail = dropped["include/model_weights.hpp"]
    assert reason == DropReason.POINTER_FILE
    assert "Git LFS pointer to 12345678 bytes" in detail and "4d7a214614ab2935" in detail
    assert dropped["include/lfs_with_extension.h"][0] == DropReason.POINTER_FILE
    reason, detail = dropped["include/huge_table.hpp"]
    assert reason == DropReason.POINTER_FILE
    assert detail.startswith("git-annex pointer to SHA256E-s52428800--0b8e3c5b")


def test_line_length_counts_characters_not_utf8_bytes():
    line = "// " + "é" * 900 + "\n"  # 903 characters, 1803 bytes
    kept, _ = normalize({"intl.cpp": (HEADER + line).encode()})
    assert "intl.cpp" in kept


def test_wide_but_short_lines_fail_the_mean_line_length():
    wide = "".join(f"#define MACRO_{i}(x) " + "x + " * 40 + "x\n" for i in range(30))
    _, dropped = normalize({"macros.hpp": wide.encode()})
    reason, detail = dropped["macros.hpp"]
    assert reason == DropReason.MEAN_LINE_LENGTH
    assert detail.startswith("mean line ") and detail.endswith("> 100.0 (max_mean_line_length)")


def test_punctuation_heavy_data_table_has_low_alnum_fraction():
    data = "static const int lut[][3] = {\n" + "  {-1, -1, -1},\n" * 200 + "};\n"
    _, dropped = normalize({"lut.inc": data.encode()})
    reason, detail = dropped["lut.inc"]
    assert reason == DropReason.LOW_ALNUM
    assert "< 0.25 (min_alnum_fraction)" in detail


@pytest.mark.parametrize(
    ("path", "text"),
    [
        (
            "proto/msg.h",
            "// Generated by the protocol buffer compiler.  DO NOT EDIT!\n// source: msg.proto\n",
        ),
        ("src/config.h", "/* This file was generated by configure. */\n#define HAVE_X 1\n"),
        ("gui/window.cpp", "/****\n** Meta object code from reading C++ file 'window.h'\n****/\n"),
    ],
)
def test_generated_marker_in_the_head_drops_the_file(path, text):
    _, dropped = normalize({path: (text + HEADER).encode()})
    assert dropped[path][0] == DropReason.GENERATED_FILE
    assert dropped[path][1].startswith("marker ")


@pytest.mark.parametrize(
    "path", ["proto/msg.pb.h", "proto/msg.pb.cc", "gui/moc_window.cpp", "gui/ui_dialog.h"]
)
def test_generated_file_names_drop_the_file(path):
    _, dropped = normalize({path: HEADER.encode()})
    assert dropped[path][0] == DropReason.GENERATED_FILE
    assert dropped[path][1].startswith("path matches ")


def test_a_marker_deep_in_the_file_does_not_count():
    text = HEADER * 40 + "// DO NOT EDIT the table below by hand\n"
    kept, _ = normalize({"span.hpp": text.encode()})
    assert "span.hpp" in kept


def test_markers_are_looked_for_in_the_first_characters_not_bytes():
    # 25 lines of 80 characters: the marker starts at character 2000 of both files, which
    # is byte 2000 of the ASCII one and byte 3900 of the accented one
    ascii_lines = ("// " + "x" * 76 + "\n") * 25
    accented_lines = ("// " + "\u00e9" * 76 + "\n") * 25
    marker = "// DO NOT EDIT\n"
    _, dropped = normalize(
        {
            "ascii.h": (ascii_lines + marker + HEADER).encode(),
            "accented.h": (accented_lines + marker + HEADER).encode(),
        }
    )
    assert dropped["ascii.h"][0] == DropReason.GENERATED_FILE
    assert dropped["accented.h"][0] == DropReason.GENERATED_FILE


def test_a_marker_cut_by_the_scan_limit_does_not_count():
    text = ("// " + "x" * 76 + "\n") * 25 + "// " + "y" * 42 + "DO NOT EDIT\n" + HEADER
    kept, _ = normalize({"cut.h": text.encode()})  # "DO NOT EDIT" starts at character 2045
    assert "cut.h" in kept


@settings(max_examples=200, deadline=None)
@given(
    st.text(st.sampled_from("ab\u00e9\u20ac\U0001f600 \n"), min_size=1, max_size=60),
    st.integers(1, 12),
)
def test_longest_line_is_measured_in_characters(text, limit):
    _, dropped = normalize({"t.h": ("x" + text).encode()}, max_line_length=limit)
    longest = max(len(line) for line in ("x" + text).split("\n"))
    if longest > limit:
        assert dropped["t.h"] == (
            DropReason.LONG_LINES,
            f"max line {longest} > {limit} (max_line_length)",
        )
    else:
        assert dropped.get("t.h", (None,))[0] != DropReason.LONG_LINES


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.lists(st.sampled_from(_PIECES)).map(b"".join), max_size=10),
    st.sampled_from([1, 5, 64]),
)
def test_results_do_not_depend_on_how_texts_are_batched_for_counting(contents, batch_bytes):
    files = {f"d{i}/f.h": content for i, content in enumerate(contents)}
    config = NormalizeConfig(max_line_length=6, max_mean_line_length=4.0)
    whole = run(raw_table(files), config)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(normalize_gate, "_BATCH_BYTES", batch_bytes)
        batched = run(raw_table(files), config)
    assert batched.kept.equals(whole.kept)
    assert batched.dropped.equals(whole.dropped)
    assert batched.stats == whole.stats


@pytest.mark.parametrize("path", ["setup.py", "README.md", "CMakeLists.txt", "docs/.clang-format"])
def test_non_cpp_extensions_are_dropped(path):
    _, dropped = normalize({path: b"print('hello')\n"})
    assert dropped[path][0] == DropReason.NOT_CPP


def test_uppercase_and_unusual_cpp_extensions_are_kept():
    files = {p: HEADER.encode() for p in ["a.HPP", "b.C", "c.ipp", "d.inl", "e.tcc", "f.cxx"]}
    kept, dropped = normalize(files)
    assert not dropped
    assert set(kept) == set(files)


def test_extensionless_libcxx_style_header_is_kept():
    vector = "// -*- C++ -*-\n//===----------------------------------===//\n" + HEADER
    kept, _ = normalize({"include/c++/v1/vector": vector.encode()})
    assert "include/c++/v1/vector" in kept


def test_extensionless_non_cpp_files_are_not_cpp():
    files = {
        "LICENSE": b"Permission is hereby granted, free of charge, to any person\n" * 5,
        "configure": b"#!/bin/sh\necho configuring\n",
    }
    _, dropped = normalize(files)
    assert {reason for reason, _ in dropped.values()} == {DropReason.NOT_CPP}


def test_extensionless_headers_can_be_refused_by_config():
    vector = "// -*- C++ -*-\n" + HEADER
    _, dropped = normalize({"v1/vector": vector.encode()}, allow_extensionless_cpp=False)
    assert dropped["v1/vector"][0] == DropReason.NOT_CPP


def test_empty_and_whitespace_only_files_are_empty():
    _, dropped = normalize({"empty.h": b"", "blank.h": b"  \n\t\n\n", "bom.h": codecs.BOM_UTF8})
    assert dropped["empty.h"] == (DropReason.EMPTY, "0 bytes")
    assert dropped["blank.h"] == (DropReason.EMPTY, "whitespace only")
    assert dropped["bom.h"][0] == DropReason.EMPTY


def test_stats_count_reasons_encodings_and_kept_bytes():
    files = {
        "ok.hpp": HEADER.encode(),
        "win.hpp": codecs.BOM_UTF16_LE + HEADER.encode("utf-16-le"),
        "blob.h": b"\0\1\2",
        "notes.txt": b"hello\n",
    }
    result = run(raw_table(files), NormalizeConfig())
    assert result.stats["files_in"] == 4
    assert result.stats["files_kept"] == 2
    assert result.stats["dropped:binary"] == 1
    assert result.stats["dropped:not_cpp"] == 1
    assert result.stats["encoding:utf-16-le"] == 1
    assert result.stats["bytes_kept"] == 2 * len(HEADER.encode())
    assert result.stats["bytes_in"] == sum(len(v) for v in files.values())


def test_ledger_rows_carry_source_and_rule_and_leave_the_stage_to_the_runner():
    result = run(raw_table({"x.py": b"print()\n"}, source_id="pythran"), NormalizeConfig())
    (row,) = result.dropped.to_pylist()
    assert row["source_id"] == "pythran"
    assert row["stage"] == ""  # stamped with the registry's stage name when the stage runs
    assert row["status"] == "dropped"
    assert row["detail"] == "extension of '.py' is not a C/C++ source extension"


def test_empty_table_gives_empty_results():
    result = run(raw_table({}), NormalizeConfig())
    assert result.kept.num_rows == 0
    assert result.dropped.num_rows == 0


def test_a_table_without_the_content_column_is_refused_by_name():
    table = raw_table({"a.h": HEADER.encode()}).drop_columns(["content"])
    with pytest.raises(NormalizeInputError, match="content"):
        run(table, NormalizeConfig())


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("fallback_encodings", ["no-such-codec"]),
        ("east_asian_encodings", ["no-such-codec"]),
        ("cpp_extensions", ["hpp"]),
        ("max_line_length", 0),
        ("min_alnum_fraction", 1.5),
        ("generated_path_patterns", ["(unclosed"]),
        ("max_line_lenght", 10),
    ],
)
def test_bad_config_fails_naming_the_field(field, value):
    with pytest.raises(ValidationError, match=field):
        NormalizeConfig(**{field: value})


# Extensionless files of each real tree and what normalize owes them: libc++ names its
# standard headers without an extension; pythran (the wheels' stand-in) ships one patched
# <complex>, beside the wheel's own metadata files, which are not C++.
EXTENSIONLESS_KEPT = {
    "libcxx": {"count": 142, "some": {"vector", "string", "map", "algorithm", "type_traits"}},
    "pythran": {"count": 1, "some": {"pythran/pythonic/patch/complex"}},
}


def test_real_extensionless_cpp_headers_are_kept_and_other_extensionless_files_are_not_cpp():
    tree = real_cpp.debian_or_wheel("libcxx", "pythran")
    files = dict(tree.files)
    kept, dropped = normalize(files)
    extensionless = [p for p in files if "." not in p.rsplit("/", 1)[-1]]
    kept_here = {p for p in extensionless if p in kept}
    want = EXTENSIONLESS_KEPT[tree.key]
    assert want["some"] <= kept_here, tree.label
    assert len(kept_here) == want["count"], tree.label
    for path in set(extensionless) - kept_here:  # libc++'s version number, the wheel's METADATA
        assert dropped[path][0] == DropReason.NOT_CPP, (tree.label, path, dropped[path])
