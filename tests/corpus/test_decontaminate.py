"""Specification of benchmark decontamination: pinned benchmark files, the n-gram index over
C++ lexical tokens with its allow list, the drop and excise actions, and the re-scan the
blocking check runs."""

from __future__ import annotations

import hashlib
import json
import random
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from megacpp_pipeline.core.ledger import LEDGER_SCHEMA, DropReason
from megacpp_pipeline.core.schemas import text_sha256
from megacpp_pipeline.corpus import minhash
from megacpp_pipeline.corpus.decontaminate import (
    MATCHES_SCHEMA,
    BenchmarkError,
    BenchmarkIndex,
    BenchmarkSpec,
    BenchmarkTask,
    DecontaminateConfig,
    load_benchmark,
    markdown_table,
    rescan,
    run,
    token_offsets,
    verify_benchmark,
)
from tests.fixtures import benchmark_tasks
from tests.fixtures.dedup_labelled import scrubbed_table

PROMPT = """/*
Return the length of the longest strictly increasing subsequence of heights.
>>> longest_rising_run_length({3, 1, 4, 1, 5})
3
*/
#include <algorithm>
#include <vector>
int longest_rising_run_length(const std::vector<int>& heights) {
"""
SOLUTION = """    if (heights.empty()) {
        return 0;
    }
    std::vector<int> memo(heights.size(), 1);
    for (std::size_t i = 1; i < heights.size(); ++i) {
        for (std::size_t j = 0; j < i; ++j) {
            if (heights[j] < heights[i]) {
                memo[i] = std::max(memo[i], memo[j] + 1);
            }
        }
    }
    return *std::max_element(memo.begin(), memo.end());
}
"""
TESTS = """#undef NDEBUG
#include <cassert>
int main() {
    assert(longest_rising_run_length({3, 1, 4, 1, 5}) == 3);
    assert(longest_rising_run_length({10, 9, 2, 5, 3, 7, 101, 18}) == 4);
    return 0;
}
"""
HOST = """// Copyright 2023 The Kestrel Authors
// SPDX-License-Identifier: MIT
#pragma once
#include <cstddef>

namespace kestrel {

inline std::size_t align_up(std::size_t offset, std::size_t alignment) {
    return (offset + alignment - 1) / alignment * alignment;
}

}  // namespace kestrel
"""
TASK = BenchmarkTask("cppeval", "CppEval/7", (PROMPT, SOLUTION, TESTS))
CONFIG = DecontaminateConfig()


def index_of(*tasks: BenchmarkTask, config: DecontaminateConfig = CONFIG) -> BenchmarkIndex:
    return BenchmarkIndex.build(list(tasks), config)


def table(files: dict[str, str], source: str = "kestrel") -> pa.Table:
    return scrubbed_table([(source, path, text) for path, text in sorted(files.items())])


def write_jsonl(path: Path, records: list[dict[str, object]]) -> str:
    data = "".join(json.dumps(r) + "\n" for r in records).encode()
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def spec(path: Path, sha: str, **kw: object) -> BenchmarkSpec:
    fields = {
        "id": "cppeval",
        "uri": path.name,
        "sha256": sha,
        "format": "jsonl",
        "fields": ["prompt", "canonical_solution", "test"],
    }
    return BenchmarkSpec.model_validate({**fields, **kw})


RECORD = {"task_id": "CppEval/7", "prompt": PROMPT, "canonical_solution": SOLUTION, "test": TESTS}


# benchmarks in the catalog ---------------------------------------------------------------
def test_benchmark_entry_with_an_unknown_key_is_rejected_naming_it() -> None:
    with pytest.raises(ValidationError, match="fieldz"):
        BenchmarkSpec.model_validate(
            {"id": "x", "uri": "x.jsonl", "sha256": "0" * 64, "format": "jsonl", "fieldz": ["a"]}
        )


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"sha256": "abc"}, "sha256"),
        ({"format": "csv"}, "format"),
        ({"fields": []}, "fields"),
        ({"fields": ["prompt", "prompt"]}, "fields"),
        ({"uri": "https://example.org/humaneval.jsonl"}, "uri"),
        ({"id": "Has Spaces"}, "id"),
    ],
)
def test_a_bad_benchmark_entry_fails_naming_the_field(
    change: dict[str, object], field: str
) -> None:
    entry = {"id": "cppeval", "uri": "b.jsonl", "sha256": "0" * 64, "format": "jsonl"}
    with pytest.raises(ValidationError) as e:
        BenchmarkSpec.model_validate({"fields": ["prompt"], **entry, **change})
    assert e.value.errors()[0]["loc"][0] == field


def test_relative_uri_resolves_against_the_yaml_folder(tmp_path: Path) -> None:
    (tmp_path / "benchmarks").mkdir()
    sha = write_jsonl(tmp_path / "benchmarks" / "cppeval.jsonl", [RECORD])
    entry = spec(tmp_path, sha, uri="benchmarks/cppeval.jsonl")
    assert verify_benchmark(entry, tmp_path) == tmp_path / "benchmarks" / "cppeval.jsonl"
    assert spec(tmp_path, sha, uri="file:///abs/b.jsonl").path(tmp_path) == Path("/abs/b.jsonl")


def test_benchmark_is_verified_against_its_pin_before_a_byte_is_parsed(tmp_path: Path) -> None:
    path = tmp_path / "cppeval.jsonl"
    path.write_bytes(b"not json at all\n")
    with pytest.raises(BenchmarkError) as e:
        load_benchmark(spec(path, "0" * 64), tmp_path)
    assert e.value.field == "sha256" and e.value.file == path
    assert "pinned 000" in str(e.value)


def test_a_missing_benchmark_file_names_the_uri(tmp_path: Path) -> None:
    with pytest.raises(BenchmarkError) as e:
        load_benchmark(spec(tmp_path / "gone.jsonl", "0" * 64), tmp_path)
    assert e.value.field == "uri"


def test_jsonl_tasks_carry_the_listed_fields_and_their_task_id(tmp_path: Path) -> None:
    path = tmp_path / "cppeval.jsonl"
    mbpp_like = {
        "task_id": 12,
        "prompt": "int f();",
        "canonical_solution": None,
        "test": ["a", "b"],
    }
    sha = write_jsonl(path, [RECORD, mbpp_like])
    tasks = load_benchmark(spec(path, sha), tmp_path)
    assert tasks[0] == BenchmarkTask("cppeval", "CppEval/7", (PROMPT, SOLUTION, TESTS))
    # ids are text, null fields are empty, MBPP-style lists of asserts are joined lines
    assert tasks[1] == BenchmarkTask("cppeval", "12", ("int f();", "", "a\nb"))


def test_without_an_id_field_a_task_is_known_by_its_line_number(tmp_path: Path) -> None:
    path = tmp_path / "cppeval.jsonl"
    sha = write_jsonl(path, [{"prompt": "a"}, {"prompt": "b"}])
    tasks = load_benchmark(spec(path, sha, fields=["prompt"], id_field=None), tmp_path)
    assert [t.task_id for t in tasks] == ["1", "2"]


@pytest.mark.parametrize(
    ("records", "field", "line", "rule"),
    [
        (
            [RECORD, {"task_id": "x", "prompt": "p", "test": "t"}],
            "canonical_solution",
            2,
            "missing",
        ),
        ([{**RECORD, "task_id": None}], "task_id", 1, "missing task id"),
        ([RECORD, RECORD], "task_id", 2, "twice"),
        ([{**RECORD, "test": 42}], "test", 1, "got int"),
    ],
)
def test_a_bad_record_names_the_file_line_and_field(
    tmp_path: Path, records: list[dict[str, object]], field: str, line: int, rule: str
) -> None:
    path = tmp_path / "cppeval.jsonl"
    sha = write_jsonl(path, records)
    with pytest.raises(BenchmarkError) as e:
        load_benchmark(spec(path, sha), tmp_path)
    assert (e.value.field, e.value.line, e.value.file) == (field, line, path)
    assert rule in str(e.value) and f"{path}:{line}" in str(e.value)


def test_a_line_that_is_not_json_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "cppeval.jsonl"
    path.write_bytes(json.dumps(RECORD).encode() + b"\n{oops\n")
    with pytest.raises(BenchmarkError, match=r"cppeval.jsonl:2: field \(record\): not JSON"):
        load_benchmark(spec(path, hashlib.sha256(path.read_bytes()).hexdigest()), tmp_path)


def test_parquet_benchmark_reads_the_listed_columns(tmp_path: Path) -> None:
    path = tmp_path / "cppeval.parquet"
    pq.write_table(pa.Table.from_pylist([RECORD]), path)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    assert load_benchmark(spec(path, sha, format="parquet"), tmp_path) == [TASK]
    with pytest.raises(BenchmarkError) as e:
        load_benchmark(spec(path, sha, format="parquet", fields=["prompt", "tests"]), tmp_path)
    assert e.value.field == "tests" and "no such column" in str(e.value)


# the index ------------------------------------------------------------------------------
def test_every_punctuation_byte_has_its_own_token_hash() -> None:
    from megacpp_pipeline.corpus.decontaminate.ngrams import PUNCTUATION, is_word

    # 31 printable (not `_`), 27 control (not the 5 whitespace ones) and DEL
    assert len(set(PUNCTUATION.tolist())) == len(PUNCTUATION) == 59
    tokens = minhash.token_hashes(["std::vector<int>& v_2 = x->y;"]).hashes
    words = ["std", "vector", "int", "v_2", "x", "y"]
    assert np.count_nonzero(is_word(tokens)) == len(words)


def test_a_file_holding_the_canonical_solution_is_contaminated() -> None:
    found = index_of(TASK).match([HOST, HOST + "\n" + SOLUTION])
    assert [(c.row, c.benchmark_id, c.task_ids) for c in found] == [(1, "cppeval", ("CppEval/7",))]


def test_comments_whitespace_and_brace_placement_do_not_count() -> None:
    reformatted = (
        SOLUTION.replace("    ", "\t")
        .replace(") {\n", ")\n{\n")
        .replace("return 0;", "return 0; /* empty input */")
        .replace("\n\t}", "\n\t// done\n\t}")
    )
    assert index_of(TASK).match([reformatted])


def test_a_renamed_copy_is_missed_but_its_test_literals_are_not() -> None:
    renamed = SOLUTION
    for old, new in (("heights", "xs"), ("memo", "best"), ("i", "hi"), ("j", "lo")):
        renamed = re.sub(rf"\b{old}\b", new, renamed)
    index = index_of(TASK)
    assert index.match([renamed]) == []
    assert index.match([TESTS.replace("longest_rising_run_length", "lis")])


def test_the_same_algorithm_written_differently_is_not_contaminated() -> None:
    patience = """int lis(const std::vector<int>& heights) {
    std::vector<int> tails;
    for (int h : heights) {
        auto it = std::lower_bound(tails.begin(), tails.end(), h);
        if (it == tails.end()) tails.push_back(h); else *it = h;
    }
    return static_cast<int>(tails.size());
}
"""
    assert index_of(TASK).match([patience]) == []


def test_an_ngram_in_more_than_k_tasks_is_an_idiom_and_never_matches() -> None:
    shared = "for (std::size_t i = 0; i < values.size(); ++i) { total += values[i] * weights[i]; }"
    tasks = [
        BenchmarkTask("b", f"T/{k}", (f"int f{k}(int q{k}) {{ {shared} }}",)) for k in range(11)
    ]
    config = DecontaminateConfig(max_tasks_per_ngram=10)
    assert index_of(*tasks, config=config).match([shared]) == []
    assert index_of(*tasks[:10], config=config).match([shared])
    assert index_of(*tasks, config=config).stats["ngrams_allow_listed"] > 0


def test_trivial_code_never_matches() -> None:
    idiom = "std::sort(values.begin(), values.end()); std::reverse(values.begin(), values.end());"
    task = BenchmarkTask("b", "T/1", (idiom,))
    assert index_of(task).match([idiom])
    assert index_of(task, config=DecontaminateConfig(trivial_code=[idiom])).match([idiom]) == []


def test_include_lines_of_a_benchmark_are_not_evidence() -> None:
    includes = "#include <algorithm>\n#include <vector>\n#include <string>\n#include <map>\n"
    task = BenchmarkTask("b", "T/1", (includes + "using namespace std;\n" + includes,))
    assert index_of(task).match([includes * 2]) == []
    assert index_of(task).stats["b:tasks_unmatchable"] == 1


def test_a_short_benchmark_text_matches_only_whole() -> None:
    signature = "long long fibonacci_number(int steps) {"  # 5 words: shorter than a 10-gram
    task = BenchmarkTask("b", "T/1", (signature,))
    index = index_of(task)
    assert index.match(["// mirror\nlong long\nfibonacci_number( int steps ) {\n  return 0;\n}\n"])
    assert index.match(["long long fibonacci_number(int count) {"]) == []
    assert index.match(["long fibonacci_number(int steps) {"]) == []


def test_a_text_below_the_short_minimum_is_not_indexed() -> None:
    task = BenchmarkTask("b", "T/1", ("return a + b;",))  # 3 words
    index = index_of(task)
    assert index.match(["int add(int a, int b) { return a + b; }"]) == []
    assert index.stats["b:texts_too_short"] == 1 and index.stats["b:tasks_unmatchable"] == 1


def test_token_unit_counts_every_punctuation_byte() -> None:
    # 10 lexer tokens, 5 of them words: an n-gram by tokens, too short by words
    text = "x = std::min(a, b);"
    task = BenchmarkTask("b", "T/1", (text,))
    assert index_of(task, config=DecontaminateConfig(unit="token")).match([text])
    assert index_of(task, config=DecontaminateConfig(short_text_min=6)).match([text]) == []


def test_matches_name_every_benchmark_separately() -> None:
    other = BenchmarkTask("mbpp-cpp", "M/3", (SOLUTION,))
    found = index_of(TASK, other).match([SOLUTION])
    assert {(c.benchmark_id, c.task_ids) for c in found} == {
        ("cppeval", ("CppEval/7",)),
        ("mbpp-cpp", ("M/3",)),
    }


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.text(alphabet="ab_ (){};=+<>:\n0123/*", min_size=0, max_size=60), min_size=1, max_size=6
    ),
    st.integers(min_value=2, max_value=6),
)
def test_a_window_hashes_the_same_wherever_its_file_sits_in_a_batch(
    texts: list[str], n: int
) -> None:
    from megacpp_pipeline.corpus.decontaminate.ngrams import LexedBatch

    together = LexedBatch(texts, "word").windows(n)
    for i, text in enumerate(texts):
        alone = LexedBatch([text], "word").windows(n)
        assert together.hashes[together.file == i].tolist() == alone.hashes.tolist()


@settings(max_examples=80, deadline=None)
@given(st.text(alphabet='ab_ (){};=+<>\n\t0123/*"é', min_size=0, max_size=120))
def test_token_offsets_lex_like_dedup_and_point_into_the_original_text(text: str) -> None:
    hashes, starts = token_offsets(text)
    assert hashes.tolist() == minhash.token_hashes([text]).hashes.tolist()
    data = text.encode("utf-8")
    assert all(0 <= s < len(data) and data[s : s + 1] not in b" \t\n" for s in starts.tolist())


# the gate ---------------------------------------------------------------------------------
def test_drop_action_drops_the_file_with_benchmark_and_task_ids_in_the_ledger() -> None:
    files = {"src/align.hpp": HOST, "src/lis.cpp": HOST + "\n" + PROMPT + SOLUTION}
    result = run(table(files), index_of(TASK), CONFIG)
    assert result.kept["path"].to_pylist() == ["src/align.hpp"]
    assert result.dropped.schema == LEDGER_SCHEMA
    row = result.dropped.to_pylist()[0]
    assert (row["path"], row["reason"], row["stage"]) == (
        "src/lis.cpp",
        DropReason.BENCHMARK_CONTAMINATION,
        "",
    )
    assert row["detail"].startswith("cppeval: tasks CppEval/7 (")
    matches = result.extra["matches"]
    assert matches.schema == MATCHES_SCHEMA
    assert matches.to_pylist()[0]["action"] == "dropped"
    assert result.stats["benchmark:cppeval:files_dropped"] == 1
    assert result.stats["dropped_benchmark_contamination"] == 1
    assert result.stats["kept"] == 1


def test_a_clean_shard_passes_through_unchanged() -> None:
    t = table({"a.hpp": HOST})
    result = run(t, index_of(TASK), CONFIG)
    assert result.kept.equals(t) and result.dropped.num_rows == 0
    assert result.extra["matches"].num_rows == 0


def test_excise_cuts_the_match_plus_margin_in_whole_lines_and_keeps_the_rest() -> None:
    before = "".join(f"inline int before_{k}() {{ return {k}; }}\n" for k in range(40))
    after = "".join(f"inline int after_{k}() {{ return {k}; }}\n" for k in range(40))
    text = before + TESTS + after
    config = DecontaminateConfig(action="excise", excise_margin=60)
    result = run(table({"mixed.cpp": text}), index_of(TASK), config)
    assert result.dropped.num_rows == 0
    out = result.kept["text"][0].as_py()
    assert "longest_rising_run_length" not in out
    assert "before_0()" in out and "after_39()" in out  # the rest stays
    assert "before_39()" not in out  # the margin reaches the line before the match
    assert all(line in text.split("\n") for line in out.split("\n"))  # whole lines only
    assert result.kept["content_sha256"][0].as_py() == text_sha256(out)
    match = result.extra["matches"].to_pylist()[0]
    assert match["action"] == "excised" and match["excised_bytes"] == len(text) - len(out)
    assert rescan(result.kept, index_of(TASK)) == []


def test_excise_drops_a_file_cut_in_more_places_than_allowed() -> None:
    filler = "".join(f"inline int filler_{k}() {{ return {k}; }}\n" for k in range(30))
    text = (filler + TESTS) * 3 + filler
    config = DecontaminateConfig(action="excise", excise_margin=0, max_excisions=2)
    result = run(table({"many.cpp": text}), index_of(TASK), config)
    assert result.kept.num_rows == 0 and result.dropped.num_rows == 1
    assert (
        run(
            table({"many.cpp": text}),
            index_of(TASK),
            config.model_copy(update={"max_excisions": 3}),
        ).kept.num_rows
        == 1
    )


def test_excise_drops_a_file_that_is_nothing_but_the_task() -> None:
    config = DecontaminateConfig(action="excise")
    result = run(table({"lis.cpp": PROMPT + SOLUTION + TESTS}), index_of(TASK), config)
    assert result.kept.num_rows == 0 and result.dropped.num_rows == 1


def test_rescan_reports_what_is_still_contaminated() -> None:
    t = table({"a.hpp": HOST, "b.cpp": SOLUTION})
    findings = rescan(t, index_of(TASK))
    assert [(f.path, f.benchmark_id, f.task_ids) for f in findings] == [
        ("b.cpp", "cppeval", ("CppEval/7",))
    ]
    assert str(findings[0]) == "kestrel:b.cpp: cppeval tasks CppEval/7"


def test_markdown_table_shows_each_benchmark_with_tasks_matched_and_top_files() -> None:
    index = index_of(TASK, BenchmarkTask("mbpp-cpp", "M/1", ("int unused_entirely(int q) {",)))
    result = run(table({"a.cpp": SOLUTION, "b.cpp": HOST + TESTS}), index, CONFIG)
    md = markdown_table(result.extra["matches"], index)
    lines = md.split("\n")
    assert lines[0].startswith("| benchmark | tasks | tasks matched | files dropped |")
    assert lines[2].startswith("| cppeval | 1 | 1 | 2 | 0 | `kestrel:")
    assert lines[3].startswith("| mbpp-cpp | 1 | 0 | 0 | 0 | - |")


def test_the_index_fingerprint_follows_the_tasks_and_the_index_config_only() -> None:
    base = index_of(TASK).fingerprint
    assert index_of(TASK, config=DecontaminateConfig(action="excise")).fingerprint == base
    assert index_of(TASK, config=DecontaminateConfig(ngram=12)).fingerprint != base
    changed = BenchmarkTask("cppeval", "CppEval/7", (PROMPT, SOLUTION, TESTS + " "))
    assert index_of(changed).fingerprint != base


# the labelled set, small --------------------------------------------------------------------
def test_labelled_set_recall_and_decoys() -> None:
    tasks = benchmark_tasks.build(n_tasks=300, seed=3)
    records = [t.record() for t in tasks]
    index = index_of(
        *[
            BenchmarkTask(
                "cppbench", r["task_id"], (r["prompt"], r["canonical_solution"], r["test"])
            )
            for r in records
        ]
    )
    rng = random.Random(11)
    sample = rng.sample(tasks, 60)
    for mode in ("verbatim", "reindented"):
        texts = [
            benchmark_tasks.plant(HOST, benchmark_tasks.planted_text(t, mode, rng), rng)
            for t in sample
        ]
        found = {c.row: c.task_ids for c in index.match(texts)}
        recall = sum(t.task_id in found.get(i, ()) for i, t in enumerate(sample)) / len(sample)
        assert recall >= 0.95, mode
    decoys = [benchmark_tasks.idioms(rng) for _ in range(60)]
    assert index.match(decoys) == []
    near = [benchmark_tasks.near_miss(t, rng) for t in sample]
    assert len({c.row for c in index.match(near)}) <= 3


def test_an_index_that_holds_no_window_matches_nothing_and_the_gate_keeps_every_file() -> None:
    """No benchmark in the catalog, or tasks whose every window is allow-listed (trivial
    code): nothing can match, and no text is lexed for it."""
    trivial = BenchmarkTask("cppeval", "CppEval/0", tuple(CONFIG.trivial_code))
    files = {"a.cpp": PROMPT + SOLUTION, "b.cpp": "int main() { return 0; }\n"}
    for index in (index_of(), index_of(trivial)):
        assert all(len(p.keys) == 0 for p in index.postings)
        assert index.match(list(files.values())) == []
        result = run(table(files), index, CONFIG)
        assert result.kept.num_rows == 2 and result.dropped.num_rows == 0
    assert len(index_of(TASK).match([PROMPT + SOLUTION])) == 1  # a real one still matches


def test_the_gate_vouches_for_the_texts_it_matched_nothing_in_and_not_an_excised_one() -> None:
    """`scanned_clean`: a kept text the index matched nothing in, by its input bytes; an
    excised one, None (the check inspects what excision left); a dropped one, not at all."""
    before = "".join(f"inline int before_{k}() {{ return {k}; }}\n" for k in range(40))
    files = {
        "clean.cpp": "int answer() { return 42; }\n",
        "mixed.cpp": before + TESTS,  # excised
        "whole.cpp": PROMPT + SOLUTION + TESTS,  # nothing but the task: dropped
    }
    result = run(table(files), index_of(TASK), DecontaminateConfig(action="excise"))
    assert result.kept["path"].to_pylist() == ["clean.cpp", "mixed.cpp"]
    assert result.dropped["path"].to_pylist() == ["whole.cpp"]
    assert result.scanned_clean == [text_sha256(files["clean.cpp"]), None]
    assert run(table(files), index_of(), CONFIG).scanned_clean is None  # an empty index
