"""The quality gate, specified by the labelled set (each rule drops its positives, and keeps
the well-kept code it could mistake), the ledger detail it writes, its stats, and what it
does to real headers: the demo wheels always, Debian's libc++, Boost and nlohmann when
installed."""

from __future__ import annotations

import re
from collections import Counter

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from megacpp_pipeline.core.ledger import LEDGER_SCHEMA, DropReason
from megacpp_pipeline.core.schemas import NORMALIZED_FILES
from megacpp_pipeline.gates import cpp_text, quality
from megacpp_pipeline.gates.quality import QualityConfig, QualityInputError, run
from tests.fixtures import real_cpp
from tests.fixtures.quality_labelled import LABELLED, LICENSE, normalized_table

POSITIVES = [item for item in LABELLED if item.rule is not None]
NEGATIVES = [item for item in LABELLED if item.rule is None]


def gate(files: dict[str, str], config: QualityConfig | None = None) -> quality.GateResult:
    return run(normalized_table(list(files.items())), config or QualityConfig())


def details(result: quality.GateResult) -> dict[str, str]:
    rows = result.dropped.select(["path", "detail"]).to_pylist()
    return {row["path"]: row["detail"] for row in rows}


@pytest.mark.parametrize("item", POSITIVES, ids=[item.rule for item in POSITIVES])
def test_each_labelled_positive_is_dropped_as_low_quality_by_its_own_rule(item) -> None:
    result = gate({item.path: item.text})
    assert result.kept.num_rows == 0, item.why
    row = result.dropped.to_pylist()[0]
    assert row["reason"] == DropReason.LOW_QUALITY
    assert row["detail"].startswith(f"{item.rule}: "), row["detail"]


@pytest.mark.parametrize("item", NEGATIVES, ids=[item.path for item in NEGATIVES])
def test_each_labelled_negative_is_kept_unchanged(item) -> None:
    table = normalized_table([(item.path, item.text)])
    result = run(table, QualityConfig())
    assert result.dropped.num_rows == 0, (item.why, details(result))
    assert result.kept.equals(table)


def test_a_file_with_two_mains_is_dropped_naming_the_rule_and_count() -> None:
    two = next(item for item in POSITIVES if item.rule == "multiple_main")
    detail = details(gate({"a.cpp": two.text}))["a.cpp"]
    assert detail == "multiple_main: 2 main definitions > 1 (max_main_definitions)"


def test_a_main_in_a_comment_or_a_declaration_is_not_counted() -> None:
    text = (
        LICENSE + "/* usage:\n int main() { run(); }\n*/\nint main(int argc, char** argv);\n"
        "int main(int argc, char** argv) {\n  return run(argc, argv);\n}\n"
    )
    assert gate({"a.cpp": text}).kept.num_rows == 1


def test_the_detail_states_the_measured_value_and_the_threshold_field() -> None:
    table = next(item for item in POSITIVES if item.rule == "data_table")
    detail = details(gate({"blob.hpp": table.text}))["blob.hpp"]
    match = re.fullmatch(
        r"data_table: (0\.\d{3}) of the file is numeric/encoded data > 0\.85 "
        r"\(max_data_fraction\)",
        detail,
    )
    assert match and float(match.group(1)) > 0.85


def test_the_first_rule_in_order_names_the_drop_and_every_rule_that_fires_is_counted() -> None:
    blob = next(item for item in POSITIVES if item.rule == "data_table")  # fires 3 rules
    result = gate({"blob.hpp": blob.text})
    assert result.stats["low_quality:data_table"] == 1
    fired = {k for k in result.stats if k.startswith("fired:")}
    assert fired == {"fired:data_table", "fired:no_logic_fraction", "fired:repeated_5grams"}
    assert quality.RULES.index("data_table") < quality.RULES.index("no_logic_fraction")


def test_stats_count_files_and_bytes_in_and_kept_and_drops_per_rule() -> None:
    files = {item.path: item.text for item in LABELLED}
    result = gate(files)
    size = {path: len(text.encode()) for path, text in files.items()}
    assert result.stats["files_in"] == len(files)
    assert result.stats["bytes_in"] == sum(size.values())
    assert result.stats["files_kept"] == len(NEGATIVES)
    assert result.stats["bytes_kept"] == sum(size[item.path] for item in NEGATIVES)
    per_rule = Counter(k.split(":", 1)[1] for k in result.stats if k.startswith("low_quality:"))
    assert set(per_rule) == {item.rule for item in POSITIVES}
    assert result.dropped.schema == LEDGER_SCHEMA
    assert set(result.dropped["stage"].to_pylist()) == {""}  # the runner stamps it


def test_thresholds_come_from_the_config_model() -> None:
    prints = next(item for item in POSITIVES if item.rule == "print_fraction")
    assert gate({"d.cpp": prints.text}, QualityConfig(max_print_fraction=0.9)).dropped.num_rows == 0
    forwarding = {"fwd.hpp": LICENSE + '#pragma once\n#include "impl.hpp"\n'}
    strict = QualityConfig(preprocessor_min_code_lines=0)
    assert gate(forwarding, strict).stats["low_quality:preprocessor_fraction"] == 1


def test_the_published_lower_comment_bound_drops_uncommented_code_when_set() -> None:
    uncommented = next(item for item in NEGATIVES if item.path == "src/accumulate.cpp")
    starcoder = QualityConfig(min_comment_ratio=0.01, max_comment_ratio=0.8)
    detail = details(gate({"a.cpp": uncommented.text}, starcoder))["a.cpp"]
    assert detail.startswith("comment_ratio: 0.000 of characters are comments, outside [0.01, 0.8]")


def test_config_rejects_unknown_fields_and_inverted_comment_bounds() -> None:
    with pytest.raises(ValidationError, match="max_print_fractoin"):
        QualityConfig(max_print_fractoin=0.5)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="min_comment_ratio 0.9 > max_comment_ratio 0.5"):
        QualityConfig(min_comment_ratio=0.9, max_comment_ratio=0.5)


def test_a_table_without_normalized_columns_is_refused_naming_them() -> None:
    with pytest.raises(QualityInputError, match="content_sha256"):
        run(
            normalized_table([("a.hpp", "int x;\n")]).drop_columns(["content_sha256"]),
            QualityConfig(),
        )


def test_an_empty_shard_gives_empty_outputs() -> None:
    result = run(NORMALIZED_FILES.empty_table(), QualityConfig())
    assert result.kept.num_rows == 0 and result.dropped.num_rows == 0
    assert result.stats["files_in"] == 0


def test_comment_openers_inside_string_literals_stay_code() -> None:
    texts = pa.array(
        [
            'const char* u = "http://x/*y*/"; // tail\nint z; /* c */\n',
            "char c = '/'; // slash\nchar d = '*'; /* star */\n",
            '/* a "quoted // thing" */ int k;\n',
        ]
    )
    assert cpp_text.without_comments(texts).to_pylist() == [
        'const char* u = "http://x/*y*/"; \nint z; \n',
        "char c = '/'; \nchar d = '*'; \n",
        " int k;\n",
    ]


def test_a_raw_string_spanning_lines_with_a_comment_opener_stays_code() -> None:
    """`R"(... src/* ...)"` once opened a comment that ate the code after it, up to the
    next `*/`: the file was dropped as not C++ and for its comment ratio."""
    texts = pa.array(
        [
            'const char* help = R"(usage:\n  --include=src/*  glob\n)";\n'
            "class Lint { int x; };\n/* c */ int y;\n",
            'auto s = u8R"xy(a // b\n)xy"; int z; // c\n',
        ]
    )
    assert cpp_text.without_comments(texts).to_pylist() == [
        'const char* help = R"(usage:\n  --include=src/*  glob\n)";\n'
        "class Lint { int x; };\n int y;\n",
        'auto s = u8R"xy(a // b\n)xy"; int z; \n',
    ]


_CODE_PIECES = [
    "int x;", "// c", "/* b */", '"s//t"', '"/*"', "'/'", "'\"'", "\n", " ", "*/", "/",
    'R"(', ')"', 'R"d(', ')d"',
]  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.sampled_from(_CODE_PIECES), max_size=12), min_size=1, max_size=8))
def test_comment_removal_takes_the_fast_path_only_where_it_gives_the_same_text(pieces) -> None:
    texts = pa.array(["".join(p) for p in pieces], pa.string())
    exact = pc.replace_substring_regex(texts, cpp_text._COMMENT_OR_LITERAL, r"\1")
    assert cpp_text.without_comments(texts).to_pylist() == exact.to_pylist()


def reference_repeated_bytes(text: str) -> tuple[int, int]:
    """Plain Python: bytes of words inside a word 5-gram seen earlier in the text."""
    words = text.split()
    seen: set[tuple[str, ...]] = set()
    covered = [False] * len(words)
    for j in range(len(words) - 4):
        gram = tuple(words[j : j + 5])
        if gram in seen:
            for k in range(j, j + 5):
                covered[k] = True
        seen.add(gram)
    lengths = [len(w.encode()) for w in words]
    return sum(lengths), sum(n for n, c in zip(lengths, covered, strict=True) if c)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(st.sampled_from(["a", "b", "{", "}", "x;", "return", "é"]), max_size=40),
        min_size=1,
        max_size=6,
    )
)
def test_repeated_5gram_bytes_match_a_plain_python_count_file_by_file(files) -> None:
    texts = [" ".join(words) + "\n" for words in files]
    measures = quality.measure(pa.array(texts, pa.string()))
    for k, text in enumerate(texts):
        assert (measures.word_bytes[k], measures.repeated_5gram_bytes[k]) == (
            reference_repeated_bytes(text)
        )


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.lists(st.sampled_from(["a", "b", "{", "}", "x;", "return"]), max_size=30),
        min_size=1,
        max_size=12,
    ),
    st.integers(min_value=1, max_value=40),
)
def test_repeated_5gram_bytes_are_the_same_whatever_run_of_files_each_sort_takes(
    files, run
) -> None:
    texts = [" ".join(words) + "\n" for words in files]
    code = pa.array(texts, pa.string())
    one_sort = quality._repeated_ngram_bytes(code, len(texts), run=1 << 40)
    runs = quality._repeated_ngram_bytes(code, len(texts), run=run)
    assert [a.tolist() for a in runs] == [a.tolist() for a in one_sort]
    assert runs[1].tolist() == [reference_repeated_bytes(t)[1] for t in texts]


def test_directive_continuation_lines_count_as_preprocessor_lines() -> None:
    text = "#define TWICE(x) \\\n  ((x) + \\\n   (x))\nint y = TWICE(2);\n"
    measures = quality.measure(pa.array([text]))
    assert (measures.code_lines[0], measures.preprocessor_lines[0]) == (4, 3)


# --- real headers ----------------------------------------------------------------------


@pytest.mark.parametrize("source_id", ["pybind11", "nanobind"])
def test_the_demo_bindings_libraries_lose_no_file(source_id: str) -> None:
    result = run(real_cpp.demo_normalized(source_id), QualityConfig())
    assert result.dropped.num_rows == 0, details(result)


def test_pythran_loses_only_files_of_its_vendored_boost_and_none_of_its_own() -> None:
    result = run(real_cpp.demo_normalized("pythran"), QualityConfig())
    paths = result.dropped["path"].to_pylist()
    assert paths and all(path.startswith("pythran/boost/") for path in paths)
    assert len(paths) / result.stats["files_in"] < 0.015


def _real(debian: str, wheel: str) -> tuple[real_cpp.RealSource, quality.GateResult]:
    tree = real_cpp.debian_or_wheel(debian, wheel)
    return tree, run(tree.normalized(), QualityConfig())


def test_libcxx_loses_only_its_config_switchboard_and_two_synopsis_only_headers() -> None:
    """The wheels' stand-in, pybind11, loses nothing."""
    tree, result = _real("libcxx", "pybind11")
    want = {"libcxx": {"__config", "chrono", "random"}, "pybind11": set()}[tree.key]
    assert details(result).keys() == want, tree.label


def test_nlohmann_loses_only_the_vendored_hedley_macro_library() -> None:
    """The wheels' stand-in: pythran loses only files of its vendored Boost (40 of 3,797)."""
    tree, result = _real("nlohmann", "pythran")
    prefix, count = {
        "nlohmann": ("nlohmann/thirdparty/hedley/", 1),
        "pythran": ("pythran/boost/", 40),
    }[tree.key]
    dropped = list(details(result))
    assert len(dropped) == count and all(p.startswith(prefix) for p in dropped), tree.label


@pytest.mark.slow
def test_boost_loses_about_one_file_in_a_hundred_mostly_preprocessed_output() -> None:
    """Debian's Boost, or the Boost that pythran vendors (40 of its 3,797 files, 31 of them
    preprocessed)."""
    tree, result = _real("boost", "pythran")
    dropped = result.dropped["path"].to_pylist()
    assert len(dropped) / result.stats["files_in"] < 0.012, tree.label
    generated = [p for p in dropped if "preprocessed" in p or "/preprocessor/" in p]
    assert len(generated) > len(dropped) / 2, tree.label
