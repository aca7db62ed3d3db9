"""Structure-aware enrichment: tree-sitter-cpp spans over tricky real-looking C++, a flat
partition the tokenizer can searchsorted, drops for non-C++ and runaway parses, and the
build lane's provenance (`structure_source`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megacpp_pipeline.core.ledger import LEDGER_SCHEMA, DropReason
from megacpp_pipeline.core.schemas import DEDUPED_FILES, ENRICHED_FILES, git_blob_sha, text_sha256
from megacpp_pipeline.gates import enrich
from megacpp_pipeline.gates.build_context import parse_compile_commands
from megacpp_pipeline.gates.enrich import CHUNK_KINDS, KIND_NAMES, CppStructureParser, EnrichConfig
from tests.fixtures import real_cpp

REPO = Path(__file__).resolve().parents[2]
HANG_GUARD_S = 120  # a fresh interpreter enriches four files in about 2 s

PARSER = CppStructureParser()


def spans(text: str) -> list[tuple[str, str, int, str]]:
    """(kind, exact text, depth, name) of every span of `text`."""
    data = text.encode("utf-8")
    fs = PARSER.structure(data)
    return [
        (KIND_NAMES[k], data[s:e].decode("utf-8"), int(d), n)
        for s, e, k, d, n in zip(fs.starts, fs.ends, fs.kinds, fs.depths, fs.names, strict=True)
    ]


def kinds_of(text: str, kind: str) -> list[str]:
    return [t for k, t, _, _ in spans(text) if k == kind]


def deduped(files: dict[str, str], source_id: str = "demo") -> pa.Table:
    paths, texts = list(files), list(files.values())
    n = len(paths)
    return pa.Table.from_pydict(
        {
            "source_id": [source_id] * n,
            "path": paths,
            "revision": ["0" * 40] * n,
            "blob_sha": [git_blob_sha(t.encode()) for t in texts],
            "size": [len(t.encode()) for t in texts],
            "encoding": ["utf-8"] * n,
            "text": texts,
            "content_sha256": [text_sha256(t) for t in texts],
            "language": ["c++"] * n,
            "vendored": [False] * n,
            "license_expression": ["MIT"] * n,
            "license_source": ["file"] * n,
            "license_decision": ["allowed"] * n,
            "license_detail": [None] * n,
            "scrub_replacements": [0] * n,
            "scrub_kinds": [[] for _ in range(n)],
        },
        schema=DEDUPED_FILES,
    )


def assert_partition(text: str, fs: enrich.FileStructure) -> None:
    n = len(text.encode("utf-8"))
    assert fs.starts[0] == 0 and fs.ends[-1] == n
    assert np.all(fs.ends[:-1] == fs.starts[1:]), "spans are contiguous"
    assert np.all(fs.ends > fs.starts), "no empty spans"
    assert fs.kinds.max() < len(CHUNK_KINDS)


# --- the kind table ------------------------------------------------------------------------


def test_kind_table_is_versioned_contiguous_and_zero_means_other() -> None:
    assert CHUNK_KINDS["other"] == 0
    assert sorted(CHUNK_KINDS.values()) == list(range(len(CHUNK_KINDS)))
    assert KIND_NAMES[CHUNK_KINDS["func_body"]] == "func_body"
    assert enrich.CHUNK_KINDS_VERSION
    for required in ("func_signature", "func_body", "class_decl", "class_body", "namespace"):
        assert required in CHUNK_KINDS
    for required in ("template_params", "comment", "doc_comment", "preprocessor"):
        assert required in CHUNK_KINDS
    assert enrich.kind_table() == {
        "chunk_kinds_version": enrich.CHUNK_KINDS_VERSION,
        "chunk_kinds": dict(CHUNK_KINDS),
    }


def test_config_rejects_unknown_fields_and_out_of_range_ratio() -> None:
    with pytest.raises(ValueError):
        EnrichConfig(max_error_ratio=0.1)  # type: ignore[call-arg]
    with pytest.raises(ValueError):
        EnrichConfig(max_parse_error_ratio=1.5)


# --- the grammar ---------------------------------------------------------------------------


def test_pinned_grammar_loads_and_parses_a_translation_unit() -> None:
    tree = PARSER.parse(b"int main() { return 0; }\n")
    assert tree.root_node.type == "translation_unit"
    assert not tree.root_node.has_error
    assert tree.root_node.children[0].type == "function_definition"


# --- spans over tricky C++ -----------------------------------------------------------------


def test_function_splits_into_signature_and_body_with_its_name() -> None:
    got = spans("static inline int add(int a, int b) noexcept { return a + b; }\n")
    assert got[0] == ("func_signature", "static inline int add(int a, int b) noexcept ", 1, "add")
    assert got[1] == ("func_body", "{ return a + b; }", 1, "add")
    assert got[2] == ("other", "\n", 0, "")


def test_class_in_namespace_nests_by_depth_while_spans_stay_flat() -> None:
    text = (
        "namespace geo {\n"
        "struct Point : Base {\n"
        "  double x = 0;\n"
        "  double norm() const { return x; }\n"
        "  void scale(double f);\n"
        "};\n"
        "}  // namespace geo\n"
    )
    got = spans(text)
    assert ("namespace", "namespace geo ", 1, "geo") in got
    assert ("class_decl", "struct Point : Base ", 2, "Point") in got
    assert ("class_body", "{\n  double x = 0;\n  ", 2, "Point") in got
    assert ("func_signature", "double norm() const ", 3, "norm") in got
    assert ("func_body", "{ return x; }", 3, "norm") in got
    assert ("func_signature", "void scale(double f);", 2, "scale") in got
    assert ("comment", "// namespace geo", 0, "") in got


def test_template_parameters_are_their_own_span() -> None:
    text = "template <typename T, int N = 4>\nstruct Array { T data[N]; };\n"
    got = spans(text)
    assert got[0] == ("template_params", "template <typename T, int N = 4>", 0, "")
    assert ("class_decl", "struct Array ", 1, "Array") in got
    assert ("class_body", "{ T data[N]; }", 1, "Array") in got


def test_lambda_inside_a_function_is_a_deeper_signature_and_body() -> None:
    text = (
        "int run() {\n  auto twice = [&](int q) -> int { return 2 * q; };\n  return twice(1);\n}\n"
    )
    got = spans(text)
    assert ("func_signature", "[&](int q) -> int ", 2, "") in got
    assert ("func_body", "{ return 2 * q; }", 2, "") in got
    assert ("func_body", ";\n  return twice(1);\n}", 1, "run") in got


def test_raw_string_with_braces_comment_and_directive_text_is_one_string_span() -> None:
    raw = 'R"sql(SELECT "{" FROM t; /* not a comment */\n#include <not_a_directive>\n)sql"'
    text = f"const char* q() {{ return {raw}; }}\n"
    got = spans(text)
    assert ("string_literal", raw, 1, "") in got
    assert kinds_of(text, "comment") == []
    assert kinds_of(text, "preprocessor") == []
    assert PARSER.structure(text.encode()).parse_error_ratio == 0.0


def test_attributes_and_noexcept_prototypes_are_signatures() -> None:
    text = '[[nodiscard]] inline int h() noexcept;\n[[deprecated("use g")]] void f(int);\n'
    got = spans(text)
    assert got[0] == ("func_signature", "[[nodiscard]] inline int h() noexcept;", 0, "h")
    # Innermost wins: the attribute's string is a string span inside f's signature.
    assert [(k, t) for k, t, _, _ in got[2:5]] == [
        ("func_signature", "[[deprecated("),
        ("string_literal", '"use g"'),
        ("func_signature", ")]] void f(int);"),
    ]


def test_most_vexing_parse_inside_a_body_stays_body() -> None:
    text = "void f() { Widget w(gadget); std::vector<int> v(n); }\n"
    assert kinds_of(text, "func_signature") == ["void f() "]
    assert kinds_of(text, "func_body") == ["{ Widget w(gadget); std::vector<int> v(n); }"]


def test_concepts_and_requires_clauses_keep_their_template_heads() -> None:
    text = (
        "template <class T>\nconcept Addable = requires(T a) { a + a; };\n"
        "template <Addable T>\nT sum(T a, T b) requires (sizeof(T) > 1) { return a + b; }\n"
    )
    fs = PARSER.structure(text.encode())
    assert fs.parse_error_ratio == 0.0
    assert kinds_of(text, "template_params") == ["template <class T>", "template <Addable T>"]
    assert [t for k, t, _, n in spans(text) if n == "sum" and k == "func_body"] == [
        "{ return a + b; }"
    ]


def test_macros_that_confuse_the_parser_do_not_hide_later_structure() -> None:
    text = (
        "#define NAMESPACE_BEGIN(name) namespace name {\n"
        "#define NAMESPACE_END(name) }\n"
        "NAMESPACE_BEGIN(detail)\n"
        "template <typename T> struct caster {\n"
        '  NB_TYPE_CASTER(T, const_name("T"))\n'
        "  bool load(handle src) { return true; }\n"
        "};\n"
        "NAMESPACE_END(detail)\n"
        "int after() { return 2; }\n"
    )
    got = spans(text)
    assert (
        "preprocessor",
        "#define NAMESPACE_BEGIN(name) namespace name {\n",
        0,
        "NAMESPACE_BEGIN",
    ) in got
    assert ("func_body", "{ return 2; }", 1, "after") in got
    # The parse view blanks the lone macro lines, so the struct around them is found whole;
    # parsing the raw bytes instead leaves ERROR nodes (and the class is lost).
    assert ("class_decl", "struct caster ", 1, "caster") in got
    masked = PARSER.structure(text.encode())
    raw = CppStructureParser(mask_macro_noise=False).structure(text.encode())
    assert masked.n_error_nodes == 0 and masked.n_classes == 1
    assert raw.n_error_nodes > 0
    assert raw.parse_error_ratio < EnrichConfig().max_parse_error_ratio


def test_parse_view_keeps_every_offset_and_blanks_only_macro_noise() -> None:
    text = (
        b"_LIBCPP_BEGIN_NAMESPACE_STD\n"
        b"class _LIBCPP_TEMPLATE_VIS vector {};\n"
        b"TEST(Suite, Case)\n{ int x; }\n"
        b"struct FOO;\n"
    )
    view = enrich.parse_view(text)
    assert len(view) == len(text)
    assert view.startswith(b" " * 27 + b"\n")
    assert b"class                      vector {};" in view
    assert b"TEST(Suite, Case)\n{" in view  # a macro followed by a block may be a function
    assert b"struct FOO;" in view  # the class name itself is never blanked


@pytest.mark.parametrize(
    "text",
    [
        b"HRESULT\nFoo::Bar(int a)\n{\n  return 0;\n}\n",  # a return type on its own line
        b"BOOL\nWINAPI_Entry (void)\n{\n  return 1;\n}\n",
        b"int f() {\n  return g(1,\n    MAX_VALUE\n  );\n}\n",  # an argument
        b"int x = a +\n    OFFSET_BASE\n    + 2;\n",  # an operand
    ],
)
def test_an_all_caps_line_that_is_a_type_or_an_operand_is_not_blanked(text: bytes) -> None:
    """`HRESULT\nFoo::Bar(...)` lost its return type to the macro rule (the signature
    chunk began at the name), and a constant alone on a line inside a call was blanked."""
    assert enrich.parse_view(text) == text


def test_a_macro_line_before_a_declaration_or_after_a_template_header_is_still_blanked() -> None:
    text = b"template <typename T>\nEXPORT_API\nvoid f(T);\nstruct S {\n  Q_OBJECT\n  int x;\n};\n"
    view = enrich.parse_view(text)
    assert len(view) == len(text)
    assert b"\n          \nvoid f(T);" in view and b"{\n          \n  int x;" in view
    fs = PARSER.structure(b"HRESULT\nFoo::Bar(int a)\n{\n  return 0;\n}\n")
    assert fs.n_error_nodes == 0


def test_conditional_directives_cover_their_lines_not_the_guarded_code() -> None:
    text = (
        "#if defined(USE_SIMD) && \\\n    USE_SIMD > 1  // fast path\n"
        "int lanes = 8;\n"
        "#else\n"
        "int lanes = 1;\n"
        "#endif\n"
    )
    got = spans(text)
    assert got[0] == ("preprocessor", "#if defined(USE_SIMD) && \\\n    USE_SIMD > 1  ", 0, "")
    assert got[1] == ("comment", "// fast path", 0, "")
    assert ("other", "int lanes = 8;\n", 0, "") in got
    assert ("preprocessor", "#else\n", 0, "") in got
    assert ("preprocessor", "#endif\n", 0, "") in got


def test_include_paths_belong_to_the_directive_not_to_string_spans() -> None:
    text = '#include "tiny/tiny.h"\n#include <vector>\nconst char* s = "lit";\n'
    assert kinds_of(text, "preprocessor") == ['#include "tiny/tiny.h"\n', "#include <vector>\n"]
    assert kinds_of(text, "string_literal") == ['"lit"']


def test_max_nesting_counts_code_braces_but_not_braces_in_strings_or_comments() -> None:
    text = 'namespace a { void f() { if (x) { g("{{{{"); } } }  // }}}} {{{{\n'
    assert PARSER.structure(text.encode()).max_nesting == 3


def test_doc_comments_are_told_apart_from_plain_comments_and_rulers() -> None:
    text = "/// brief\n//! detail\n/** block doc */\n/*! qt doc */\n// plain\n//// ruler\n/**/\n"
    assert kinds_of(text, "doc_comment") == [
        "/// brief",
        "//! detail",
        "/** block doc */",
        "/*! qt doc */",
    ]
    assert kinds_of(text, "comment") == ["// plain", "//// ruler", "/**/"]


def test_module_syntax_is_kept_with_a_partition_even_where_the_grammar_lacks_it() -> None:
    text = (
        "module;\n#include <cmath>\nexport module geometry;\nimport <vector>;\n"
        "export double area(double r) { return 3.14159 * r * r; }\n"
    )
    result = enrich.run(deduped({"src/geometry.cppm": text}), EnrichConfig())
    assert result.kept.num_rows == 1
    assert ("func_body", "{ return 3.14159 * r * r; }", 1, "area") in spans(text)


def test_multibyte_text_gives_utf8_byte_offsets() -> None:
    text = "// π ≈ 3.14159 — naïve\nint größe() { return 1; }\n"
    data = text.encode("utf-8")
    fs = PARSER.structure(data)
    assert_partition(text, fs)
    assert ("comment", "// π ≈ 3.14159 — naïve", 0, "") in spans(text)
    assert ("func_signature", "int größe() ", 1, "größe") in spans(text)


TOKENS = [
    "int",
    "x",
    "f",
    "(",
    ")",
    "{",
    "}",
    ";",
    "template",
    "<",
    ">",
    "class",
    "struct",
    "namespace",
    "#define A 1\n",
    "#if X\n",
    "#endif\n",
    "// c\n",
    "/* d */",
    '"s"',
    'R"(raw)"',
    "[&]",
    "->",
    "::",
    "=",
    "0",
    "\n",
    " ",
    "é",
    "requires",
    "concept",
]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.sampled_from(TOKENS), min_size=1, max_size=60))
def test_any_token_soup_yields_a_flat_utf8_partition(tokens: list[str]) -> None:
    text = " ".join(tokens)
    fs = PARSER.structure(text.encode("utf-8"))
    assert_partition(text, fs)
    data = text.encode("utf-8")
    for s, e in zip(fs.starts.tolist(), fs.ends.tolist(), strict=True):
        data[s:e].decode("utf-8")  # every span boundary is a character boundary
    assert 0.0 <= fs.parse_error_ratio <= 1.0
    assert len(fs.names) == fs.starts.size


# --- the gate ------------------------------------------------------------------------------

LIBCXX_STYLE_VECTOR = """// -*- C++ -*-
//===----------------------------------------------------------------------===//
// Part of the LLVM Project, under the Apache License v2.0 with LLVM Exceptions.
//===----------------------------------------------------------------------===//
#ifndef _LIBCPP_VECTOR
#define _LIBCPP_VECTOR

#include <__config>
#include <__iterator/wrap_iter.h>

#if !defined(_LIBCPP_HAS_NO_PRAGMA_SYSTEM_HEADER)
#  pragma GCC system_header
#endif

_LIBCPP_BEGIN_NAMESPACE_STD

template <class _Tp, class _Allocator /* = allocator<_Tp> */>
class _LIBCPP_TEMPLATE_VIS vector
{
public:
    typedef _Tp value_type;
    _LIBCPP_INLINE_VISIBILITY
    size_type size() const _NOEXCEPT
        {return static_cast<size_type>(this->__end_ - this->__begin_);}
    void push_back(const_reference __x);
private:
    pointer __begin_ = nullptr;
    pointer __end_ = nullptr;
};

_LIBCPP_END_NAMESPACE_STD

#endif // _LIBCPP_VECTOR
"""

PROSE = (
    "Release notes\n=============\n\nThis version adds support for many new things, "
    "and fixes the bugs that people reported last year. Thanks to everyone who helped!\n"
    "Please read the upgrade guide before you install it; some options were renamed.\n"
) * 3


def test_extensionless_libcxx_style_header_is_kept_with_class_structure() -> None:
    result = enrich.run(deduped({"include/c++/v1/vector": LIBCXX_STYLE_VECTOR}), EnrichConfig())
    assert result.kept.num_rows == 1
    row = result.kept.to_pylist()[0]
    assert row["structure_source"] == "syntax" and row["build_context"] is None
    assert row["n_classes"] == 1 and row["n_functions"] == 1
    kinds = {KIND_NAMES[k] for k in row["chunk_kinds"]}
    assert {"class_decl", "class_body", "func_body", "preprocessor", "comment"} <= kinds
    assert row["comment_ratio"] > 0.1


def test_prose_is_dropped_for_parse_error_ratio_with_the_measured_ratio() -> None:
    result = enrich.run(deduped({"NOTES": PROSE, "a.h": "int a();\n"}), EnrichConfig())
    assert result.kept.column("path").to_pylist() == ["a.h"]
    dropped = result.dropped.to_pylist()
    assert [d["reason"] for d in dropped] == [DropReason.PARSE_ERROR_RATIO]
    assert "parse_error_ratio" in dropped[0]["detail"]
    assert dropped[0]["license_expression"] == "MIT"


def test_a_runaway_parse_is_cancelled_and_recorded_and_the_next_file_still_parses() -> None:
    heavy = "template <class T> struct A { int f() { return g<T, 1>(h<T>()); } };\n" * 5000
    config = EnrichConfig(parse_timeout_seconds=1e-9)
    result = enrich.run(deduped({"heavy.hpp": heavy}), config)
    assert result.kept.num_rows == 0
    (row,) = result.dropped.to_pylist()
    assert row["reason"] == DropReason.PARSE_TIMEOUT
    assert "budget" in row["detail"]
    assert result.stats["timeouts"] == 1
    # The same parser object recovers: a cancelled parse must not leak into the next one.
    parser = CppStructureParser()
    with pytest.raises(enrich.ParseTimeout):
        parser.structure(heavy.encode(), budget_seconds=1e-9)
    assert not parser.parse(b"int ok();\n").root_node.has_error


def _top_level_cpp(n: int) -> str:
    """Top-level declarations of real-looking C++, a blank line between each."""
    return "\n".join(
        f"/// Sum of the first {i} widgets.\n"
        f"template <class T>\nT widget_sum_{i}(const T* xs) {{\n  T s{{}};\n"
        f"  for (int k = 0; k < {i}; ++k) s += xs[k];\n  return s;\n}}\n\n"
        f"struct Gadget{i} {{\n  int id = {i};\n  int twice() const {{ return id * 2; }}\n}};\n"
        for i in range(n)
    )


def test_a_file_over_the_segment_size_is_parsed_a_segment_at_a_time_to_the_same_spans(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Memory for a file at the size policy's limit: the tree holds one segment, never the
    file; where the cuts fall between top-level declarations, the spans are the same."""
    data = _top_level_cpp(300).encode()
    parser = CppStructureParser()
    whole = enrich.partition([data], [parser.regions(data)]).file(0, parser.regions(data))
    monkeypatch.setattr(enrich, "SEGMENT_BYTES", 4096)
    cuts = enrich.segments(data, enrich.SEGMENT_BYTES)
    assert len(cuts) > 10 and cuts[0][0] == 0 and cuts[-1][1] == len(data)
    assert all(hi - lo <= 4096 and data[lo - 2 : lo] == b"\n\n" for lo, hi in cuts[1:])
    regions = parser.regions(data)
    segmented = enrich.partition([data], [regions]).file(0, regions)
    for field in ("starts", "ends", "kinds", "depths"):
        assert np.array_equal(getattr(segmented, field), getattr(whole, field)), field
    assert segmented.names == whole.names
    assert (segmented.n_functions, segmented.n_classes) == (whole.n_functions, whole.n_classes)
    assert segmented.n_functions == 300 * 2 and segmented.n_classes == 300
    assert_partition(data.decode(), segmented)


def test_a_segmented_parse_keeps_the_whole_files_time_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(enrich, "SEGMENT_BYTES", 4096)
    data = _top_level_cpp(300).encode()
    with pytest.raises(enrich.ParseTimeout, match=f"of {len(data)}"):
        CppStructureParser().regions(data, budget_seconds=1e-9)


def test_gate_output_matches_the_enriched_schema_and_accounts_for_every_file() -> None:
    files = {"a.cpp": LIBCXX_STYLE_VECTOR, "NOTES": PROSE, "b.h": "namespace n { int v; }\n"}
    result = enrich.run(deduped(files), EnrichConfig())
    assert result.kept.schema.equals(ENRICHED_FILES, check_metadata=True)
    assert result.dropped.schema.equals(LEDGER_SCHEMA)
    assert result.kept.num_rows + result.dropped.num_rows == len(files)
    kept_bytes = sum(len(t.encode()) for t in result.kept.column("text").to_pylist())
    assert sum(result.stats[f"kind_bytes:{k}"] for k in KIND_NAMES) == kept_bytes
    assert result.stats["files_parsed"] == 3
    for row in result.kept.to_pylist():
        n = len(row["text"].encode())
        assert row["chunk_starts"][0] == 0 and row["chunk_ends"][-1] == n
        assert row["chunk_starts"][1:] == row["chunk_ends"][:-1]
        assert len(row["chunk_names"]) == len(row["chunk_depths"]) == len(row["chunk_kinds"])


def test_a_shard_gives_every_file_the_spans_it_gets_alone() -> None:
    # The gate partitions a whole shard at once; file boundaries must not leak: an unclosed
    # namespace does not nest the next file, and a comment at the end of one file does not
    # read the first bytes of the next ("///" then "/x..." is a doc comment, not a ruler).
    files = {
        "a.h": "namespace a { namespace b {\nint f();\n",
        "b.h": "} }\n} void g() { h(); }\n///",
        "c.h": "",
        "d.h": "/x */ int y; /* tail",
        "e.h": LIBCXX_STYLE_VECTOR,
        "f.h": '#include "f.h"\nconst char* s = "{";  // }\n',
    }
    result = enrich.run(deduped(files), EnrichConfig(max_parse_error_ratio=1.0))
    assert result.kept.num_rows == len(files)
    for row in result.kept.to_pylist():
        alone = PARSER.structure(row["text"].encode())
        assert row["chunk_starts"] == alone.starts.tolist(), row["path"]
        assert row["chunk_ends"] == alone.ends.tolist(), row["path"]
        assert row["chunk_kinds"] == alone.kinds.tolist(), row["path"]
        assert row["chunk_depths"] == alone.depths.tolist(), row["path"]
        assert row["chunk_names"] == alone.names, row["path"]
        assert row["max_nesting"] == alone.max_nesting, row["path"]
        assert row["comment_ratio"] == np.float32(alone.comment_ratio), row["path"]
    by_path = {r["path"]: r for r in result.kept.to_pylist()}
    assert by_path["a.h"]["max_nesting"] == 2 and by_path["b.h"]["max_nesting"] == 0
    assert KIND_NAMES[by_path["b.h"]["chunk_kinds"][-1]] == "doc_comment"
    assert by_path["c.h"]["chunk_starts"] == []


def test_a_conditional_directive_without_a_newline_runs_to_the_end_of_the_text() -> None:
    assert spans("#if X") == [("preprocessor", "#if X", 0, "")]


_ENRICH_IN_A_FRESH_INTERPRETER = """
import json, sys
from tests.gates.test_enrich import enriched_bytes
files = json.loads(open(sys.argv[1]).read())
sys.stdout.write(enriched_bytes(files).hex())
"""


def enriched_bytes(files: dict[str, str]) -> bytes:
    """Kept rows, ledger rows and stats of one enrich run, as bytes (Arrow IPC + JSON)."""
    result = enrich.run(deduped(files), EnrichConfig())
    out = pa.BufferOutputStream()
    for table in (result.kept, result.dropped):
        with pa.ipc.new_stream(out, table.schema) as writer:
            writer.write_table(table)
    return out.getvalue().to_pybytes() + json.dumps(result.stats, sort_keys=True).encode()


def test_interpreters_with_different_hash_seeds_enrich_to_the_same_bytes(tmp_path: Path) -> None:
    """String hashing is salted per process (set and dict-of-set order can change with it);
    the same input must still give the same rows, ledger and stats in every process."""
    files = {
        "a.cpp": LIBCXX_STYLE_VECTOR,
        "b.h": "namespace n { int v; }\n",
        "c.hpp": LIBCXX_STYLE_VECTOR.replace("vector", "deque"),
        "NOTES": PROSE,
    }
    (tmp_path / "files.json").write_text(json.dumps(files))
    here = enriched_bytes(files)
    for seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", _ENRICH_IN_A_FRESH_INTERPRETER, str(tmp_path / "files.json")],
            cwd=REPO, env={**os.environ, "PYTHONHASHSEED": seed}, capture_output=True, text=True,
            timeout=HANG_GUARD_S,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        assert bytes.fromhex(out.stdout) == here, f"PYTHONHASHSEED={seed}"


def test_tu_named_by_the_compile_database_is_build_and_its_header_stays_syntax() -> None:
    db = json.dumps(
        [
            {
                "directory": "/home/dev/work/tiny/build",
                "arguments": [
                    "/usr/bin/g++-12",
                    "-DTINY_FAST",
                    "-I/home/dev/work/tiny/include",
                    "-isystem",
                    "/opt/deps/include",
                    "-std=c++20",
                    "-c",
                    "../src/tiny.cpp",
                    "-o",
                    "tiny.o",
                ],
                "file": "../src/tiny.cpp",
            }
        ]
    ).encode()
    files = {
        "src/tiny.cpp": '#include "tiny.h"\nint tiny() { return 1; }\n',
        "include/tiny.h": "int tiny();\n",
    }
    build = parse_compile_commands(db, set(files))
    result = enrich.run(deduped(files), EnrichConfig(), build=build)
    rows = {r["path"]: r for r in result.kept.to_pylist()}
    assert rows["src/tiny.cpp"]["structure_source"] == "build"
    assert rows["src/tiny.cpp"]["build_context"] == {
        "compiler_family": "gcc",
        "language_standard": "c++20",
        "defines": ["TINY_FAST"],
        "include_roots": ["include", "<LOCAL_PATH>"],
        "tu_path": "src/tiny.cpp",
    }
    assert rows["include/tiny.h"]["structure_source"] == "syntax"
    assert rows["include/tiny.h"]["build_context"] is None
    assert result.stats["structure_source:build"] == 1


# An extensionless header of each real tree that must come out with classes: libc++'s
# <vector>; in the wheels, pythran's patched <complex>.
EXTENSIONLESS_WITH_CLASSES = {"libcxx": "vector", "pythran": "pythran/pythonic/patch/complex"}


def test_real_extensionless_headers_stay_and_parse_cleanly() -> None:
    tree = real_cpp.debian_or_wheel("libcxx", "pythran")
    table = tree.normalized()  # what normalize keeps (libc++: 142 headers, pythran: 1)
    texts = dict(zip(table["path"].to_pylist(), table["text"].to_pylist(), strict=True))
    files = {path: text for path, text in texts.items() if "." not in path.rsplit("/", 1)[-1]}
    assert files, tree.label
    result = enrich.run(deduped(files), EnrichConfig())
    assert sorted(result.kept.column("path").to_pylist()) == sorted(files), tree.label
    rows = {r["path"]: r for r in result.kept.to_pylist()}
    assert rows[EXTENSIONLESS_WITH_CLASSES[tree.key]]["n_classes"] >= 1, tree.label
    worst = max(rows.values(), key=lambda r: r["parse_error_ratio"])
    assert worst["parse_error_ratio"] < 0.2, (tree.label, worst["path"])


def test_an_empty_or_fully_dropped_shard_still_has_the_enriched_schema() -> None:
    empty = enrich.run(DEDUPED_FILES.empty_table(), EnrichConfig())
    assert empty.kept.num_rows == 0 and empty.kept.schema.equals(ENRICHED_FILES)
    all_dropped = enrich.run(deduped({"NOTES": PROSE}), EnrichConfig())
    assert all_dropped.kept.num_rows == 0 and all_dropped.kept.schema.equals(ENRICHED_FILES)


@pytest.mark.parametrize(
    ("source", "kind", "name"),
    [
        (b"class HTTP final {\n int x;\n};\n", "class_decl", "HTTP"),
        (b"struct RGB final : Base {\n int r;\n};\n", "class_decl", "RGB"),
        (
            b"struct RGB make_rgb(int r)\n{\n  struct RGB c;\n  return c;\n}\n",
            "func_signature",
            "make_rgb",
        ),
    ],
)
def test_an_all_caps_name_that_is_the_types_own_is_not_blanked(
    source: bytes, kind: str, name: str
) -> None:
    """`class HTTP final` and C's `struct RGB make_rgb(...)` had their names blanked as if
    attribute macros: the class lost its name, the function its type."""
    assert enrich.parse_view(source) == source
    fs = enrich.CppStructureParser().structure(source)
    assert (kind, name) in [
        (enrich.KIND_NAMES[k], n) for k, n in zip(fs.kinds, fs.names, strict=True)
    ]
