"""The language gate, specified by how it decides C++ or C for each kind of header (small
real-looking files written here), the policy, the columns it adds, the vendored flag, and
its decisions on real headers: the demo wheels always, Debian's C and C++ headers when
installed."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from megacpp_pipeline.core.ledger import DropReason
from megacpp_pipeline.core.schemas import NORMALIZED_FILES
from megacpp_pipeline.gates import language
from megacpp_pipeline.gates.language import (
    Language,
    LanguageConfig,
    LanguageInputError,
    Siblings,
    run,
    split_cplusplus_sections,
)
from megacpp_pipeline.gates.vendored import VENDORED_DIRS, is_vendored, vendored_mask
from tests.fixtures import real_cpp
from tests.fixtures.quality_labelled import normalized_table

C_HEADER_WITH_GUARD = """\
/* ring.h: a ring buffer for C and C++ callers */
#ifndef RING_H
#define RING_H
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ring ring;
ring* ring_new(size_t capacity);
int ring_push(ring* r, const void* item);
void ring_free(ring* r);

#ifdef __cplusplus
}  /* extern "C" */
#endif
#endif
"""

GLIBC_STYLE = """\
#ifndef _KSTR_H
#define _KSTR_H 1
#include <features.h>
__BEGIN_DECLS
extern size_t kstrlen (const char *__s) __THROW __attribute_pure__;
#if defined __cplusplus && (__GNUC_PREREQ (4, 4) \\
                            || __glibc_clang_prereq (3, 5))
# define __CORRECT_ISO_CPP_KSTR_PROTO
#endif
#ifdef __CORRECT_ISO_CPP_KSTR_PROTO
extern "C++" {
template <typename T> inline T* kstrfind (T* s) { return s; }
}
#endif
__END_DECLS
#endif
"""

CPP_HEADER = """\
#pragma once
#include <vector>

namespace kestrel {
struct shard { std::vector<int> rows; };
}
"""

WHOLLY_GUARDED = """\
#ifndef KESTREL_ABI_H
#define KESTREL_ABI_H
#ifdef __cplusplus
namespace kestrel { namespace abi {
extern "C" {
void* allocate_exception(unsigned long size) noexcept;
}
} }
#endif
#endif
"""

DUAL_MATH = """\
#ifndef KESTREL_MATH_H
#define KESTREL_MATH_H
#include_next <math.h>
#ifdef __cplusplus
extern "C++" {
template <class T> inline bool is_nan(T x) { return x != x; }
}
#endif
#endif
"""

MACROS_ONLY = """\
#ifndef KESTREL_VERSION_H
#define KESTREL_VERSION_H
#define KESTREL_VERSION_MAJOR 2
#define KESTREL_VERSION_MINOR 7
#endif
"""

KERNEL_STYLE = """\
#ifndef _KESTREL_IOCTL_H
#define _KESTREL_IOCTL_H
struct kestrel_req {
    unsigned int flags;
    struct kestrel_range range;
};
#define KESTREL_IOC_RESET 0x4b01
#endif
"""

COMMENT_SAYS_CPP = """\
/* Unlike the C++ API (namespace kestrel, template<class T> class span), this is C. */
#ifndef KSPAN_H
#define KSPAN_H
int kspan_len(const int* data, int n);
#endif
"""


def decide(
    files: dict[str, str],
    source_paths: list[str] | None = None,
    config: LanguageConfig | None = None,
    vendored_prefixes: tuple[str, ...] = (),
) -> language.GateResult:
    table = normalized_table(list(files.items()))
    paths = list(files) if source_paths is None else source_paths
    return run(table, config or LanguageConfig(keep_c=True), paths, vendored_prefixes)


def languages(result: language.GateResult) -> dict[str, str]:
    rows = result.kept.select(["path", "language"]).to_pylist()
    return {row["path"]: row["language"] for row in rows}


def test_unambiguous_extensions_decide_without_reading_the_text() -> None:
    result = decide({"a.cpp": "int x;\n", "b.hpp": "int y;\n", "c.c": "int z;\n"})
    assert languages(result) == {"a.cpp": "c++", "b.hpp": "c++", "c.c": "c"}
    assert result.stats["decided_by:extension"] == 3


def test_a_capital_c_file_is_cpp_as_gcc_takes_it() -> None:
    """`.C` is C++ to GCC (ROOT macros, old Unix code); `.c` is C."""
    result = decide({"macros/fit.C": "void fit() {}\n", "src/util.c": "int z;\n"})
    assert languages(result) == {"macros/fit.C": "c++", "src/util.c": "c"}


def test_a_c_header_with_extern_c_guards_is_c() -> None:
    result = decide({"ring.h": C_HEADER_WITH_GUARD})
    assert languages(result) == {"ring.h": "c"}
    assert result.stats["decided_by:c_interop"] == 1


def test_a_glibc_style_header_stays_c_despite_cpp_overloads_behind_derived_macros() -> None:
    assert languages(decide({"kstr.h": GLIBC_STYLE})) == {"kstr.h": "c"}


def test_a_header_with_namespace_and_a_standard_cpp_include_is_cpp() -> None:
    result = decide({"shard.h": CPP_HEADER})
    assert languages(result) == {"shard.h": "c++"}
    assert result.stats["decided_by:cpp_syntax"] == 1


def test_a_cpp_header_wrapped_whole_in_a_cplusplus_guard_is_cpp() -> None:
    assert languages(decide({"abi.h": WHOLLY_GUARDED})) == {"abi.h": "c++"}


def test_a_dual_header_whose_only_code_is_cpp_overloads_is_cpp() -> None:
    result = decide({"math.h": DUAL_MATH})
    assert languages(result) == {"math.h": "c++"}
    assert result.stats["decided_by:cpp_in_guard"] == 1


def test_cpp_words_in_comments_do_not_make_a_c_header_cpp() -> None:
    assert languages(decide({"kspan.h": COMMENT_SAYS_CPP}, ["kspan.h", "kspan.c"])) == {
        "kspan.h": "c"
    }


def test_a_header_with_no_evidence_follows_the_files_in_its_own_directory() -> None:
    source = ["lib/version.h", "lib/ring.c", "lib/ring_test.c", "tools/cli.cpp"]
    result = decide({"lib/version.h": MACROS_ONLY}, source)
    assert languages(result) == {"lib/version.h": "c"}
    assert result.stats["decided_by:siblings"] == 1


def test_a_header_with_no_evidence_follows_the_whole_source_when_its_directory_says_nothing() -> (
    None
):
    source = ["include/kestrel/version.h", "src/a.cpp", "src/b.cpp", "src/c.c"]
    assert languages(decide({"include/kestrel/version.h": MACROS_ONLY}, source)) == {
        "include/kestrel/version.h": "c++"
    }


def test_a_header_with_no_evidence_anywhere_takes_the_undecided_default() -> None:
    result = decide({"version.h": MACROS_ONLY}, ["version.h"])
    assert languages(result) == {"version.h": "c++"}
    assert result.stats["decided_by:undecided"] == 1
    as_c = LanguageConfig(keep_c=True, undecided=Language.C)
    assert languages(decide({"version.h": MACROS_ONLY}, ["version.h"], as_c)) == {"version.h": "c"}


def test_struct_tags_used_as_types_lean_c_only_when_nothing_else_decides() -> None:
    assert languages(decide({"ioctl.h": KERNEL_STYLE}, ["ioctl.h"])) == {"ioctl.h": "c"}
    beside_cpp = ["ioctl.h", "driver.cpp"]
    assert languages(decide({"ioctl.h": KERNEL_STYLE}, beside_cpp)) == {"ioctl.h": "c++"}


def test_extensionless_headers_are_decided_from_content() -> None:
    result = decide({"include/vector": CPP_HEADER, "include/kstr": GLIBC_STYLE})
    assert languages(result) == {"include/vector": "c++", "include/kstr": "c"}
    assert result.stats["header:c++"] == 1 and result.stats["header:c"] == 1


def test_c_files_are_dropped_as_not_cpp_by_default_naming_the_basis() -> None:
    files = {"ring.h": C_HEADER_WITH_GUARD, "ring.c": "int ring_len;\n", "shard.h": CPP_HEADER}
    result = run(normalized_table(list(files.items())), LanguageConfig(), list(files))
    assert result.kept["path"].to_pylist() == ["shard.h"]
    rows = {row["path"]: row for row in result.dropped.to_pylist()}
    assert {row["reason"] for row in rows.values()} == {DropReason.NOT_CPP}
    assert rows["ring.c"]["detail"] == "extension '.c' is C (keep_c: false)"
    assert rows["ring.h"]["detail"].startswith("C header: no C++ syntax outside __cplusplus")
    assert result.stats["not_cpp:c_interop"] == 1 and result.stats["not_cpp:extension"] == 1


def test_keep_c_keeps_c_files_labelled_c() -> None:
    result = decide({"ring.h": C_HEADER_WITH_GUARD, "ring.c": "int ring_len;\n"})
    assert result.dropped.num_rows == 0
    assert set(languages(result).values()) == {"c"}


def test_kept_rows_are_the_input_columns_then_language_and_vendored() -> None:
    result = decide({"third_party/zlib/zlib.h": C_HEADER_WITH_GUARD, "src/a.cpp": "int a;\n"})
    assert result.kept.schema == language.output_schema(NORMALIZED_FILES)
    assert result.kept.schema.names[-2:] == ["language", "vendored"]
    assert dict(zip(*result.kept.select(["path", "vendored"]).columns, strict=True)) == {
        pa.scalar("third_party/zlib/zlib.h"): pa.scalar(True),
        pa.scalar("src/a.cpp"): pa.scalar(False),
    }


def test_siblings_built_once_give_the_same_result_as_the_path_list() -> None:
    source = ["lib/version.h", "lib/ring.c"]
    config = LanguageConfig(keep_c=True)
    table = normalized_table([("lib/version.h", MACROS_ONLY)])
    from_paths = run(table, config, source)
    from_siblings = run(table, config, Siblings.of(source, config))
    assert from_paths.kept.equals(from_siblings.kept)


def test_the_siblings_fingerprint_changes_exactly_when_a_lean_changes() -> None:
    config = LanguageConfig()
    base = Siblings.of(["lib/a.c", "lib/b.h", "src/x.cpp"], config)
    same = Siblings.of(["src/x.cpp", "lib/a.c", "lib/c.h", "src/y.cc"], config)
    flipped = Siblings.of(["lib/a.cpp", "lib/b.h", "src/x.cpp"], config)
    assert base.fingerprint() == same.fingerprint() != flipped.fingerprint()


def test_config_rejects_unknown_fields_and_undotted_extensions() -> None:
    with pytest.raises(ValidationError, match="keep_cc"):
        LanguageConfig(keep_cc=True)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="must start with '.'"):
        LanguageConfig(c_extensions=["c"])


def test_a_table_without_normalized_columns_is_refused_naming_them() -> None:
    table = normalized_table([("a.h", "int x;\n")]).drop_columns(["text"])
    with pytest.raises(LanguageInputError, match="text"):
        run(table, LanguageConfig(), ["a.h"])


# --- __cplusplus sections ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "inside"),
    [
        ("#ifdef __cplusplus\nA\n#endif\nB\n", "A\n"),
        ("#ifndef __cplusplus\nA\n#else\nB\n#endif\n", "B\n"),
        ("#if defined(__cplusplus) && X\nA\n#elif Y\nB\n#endif\n", "A\n"),
        ("#if __cplusplus >= 201103L\nA\n#else\nB\n#endif\n", "A\n"),
        ("#if !defined __cplusplus || (__cplusplus < 201103L)\nA\n#else\nB\n#endif\n", "B\n"),
        ("#if X\nA\n#elif defined __cplusplus\nB\n#endif\n", "B\n"),
        ("#ifdef __cplusplus\n#if X\nA\n#endif\nB\n#endif\nC\n", "A\nB\n"),
        ("#if defined(__cplusplus) || X\nA\n#endif\n", ""),
        ("#if 0\nA\n#endif\n", ""),
    ],
)
def test_the_sections_only_a_cpp_compiler_reads_are_found(code: str, inside: str) -> None:
    outside, found = split_cplusplus_sections(code)
    assert found == inside
    assert sorted(outside + found) == sorted(code)  # every character lands on one side


# --- vendored ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "prefixes", "expected"),
    [
        ("third_party/zlib/zlib.h", (), True),
        ("src/ThirdParty/fmt/core.h", (), True),
        ("deps/json/json.hpp", (), True),
        ("extern/catch2/catch.hpp", (), True),
        ("src/extern.h", (), False),  # a file named like a vendored directory
        ("pythran/boost/config.hpp", (), False),
        ("pythran/boost/config.hpp", ("pythran/boost/",), True),
        ("pythran/boostx/config.hpp", ("pythran/boost",), False),
        ("pythran/pythonic/core.hpp", ("pythran/boost/", "pythran/xsimd/"), False),
    ],
)
def test_vendored_by_directory_convention_or_declared_prefix(
    path: str, prefixes: tuple[str, ...], expected: bool
) -> None:
    assert is_vendored(path, prefixes) is expected


_PARTS = ["src", "lib", "vendor", "Vendor", "third-party", "a.h", "b.hpp", "deps", "x", "3rdparty"]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.lists(st.sampled_from(_PARTS), min_size=1, max_size=4), min_size=1, max_size=10),
    st.lists(st.sampled_from(["src/", "lib/x", "x", "src/lib/"]), max_size=2),
)
def test_the_column_form_of_vendored_agrees_with_the_one_path_form(parts, prefixes) -> None:
    paths = ["/".join(p) for p in parts]
    mask = vendored_mask(pa.array(paths), prefixes, VENDORED_DIRS)
    assert mask.tolist() == [is_vendored(p, prefixes) for p in paths]


# --- real headers ------------------------------------------------------------------------


@pytest.mark.parametrize("source_id", ["pythran", "pybind11", "nanobind"])
def test_every_demo_file_is_cpp_and_none_is_dropped(source_id: str) -> None:
    table = real_cpp.demo_normalized(source_id)
    result = run(table, LanguageConfig(), table["path"].to_pylist())
    assert result.dropped.num_rows == 0
    assert set(result.kept["language"].to_pylist()) == {"c++"}


def test_pythran_vendors_boost_and_xsimd_only_by_declared_prefix() -> None:
    table = real_cpp.demo_normalized("pythran")
    paths = table["path"].to_pylist()
    by_convention = run(table, LanguageConfig(), paths)
    declared = run(table, LanguageConfig(), paths, ["pythran/boost/", "pythran/xsimd/"])
    assert by_convention.stats["vendored"] == 0
    expected = sum(p.startswith(("pythran/boost/", "pythran/xsimd/")) for p in paths)
    assert declared.stats["vendored"] == expected > 1900


def _real(tree: real_cpp.RealSource, source: list[str] | None = None) -> language.GateResult:
    table = tree.normalized()
    return run(table, LanguageConfig(keep_c=True), source or table["path"].to_pylist())


# The C files of a real C++ library: libc++ holds two C shims; nanobind (the wheels'
# stand-in) holds none.
C_SHIMS = {
    "libcxx": ["__support/ibm/gettod_zos.h", "__support/xlocale/__nop_locale_mgmt.h"],
    "nanobind": [],
}


def test_libcxx_headers_are_cpp_but_two_c_shims_and_nanobinds_are_all_cpp() -> None:
    tree = real_cpp.debian_or_wheel("libcxx", "nanobind")
    result = _real(tree)
    c_files = [p for p, lang in languages(result).items() if lang == "c"]
    assert sorted(c_files) == C_SHIMS[tree.key], tree.label
    assert result.dropped.num_rows == 0, tree.label


@pytest.mark.parametrize("name", ["glibc", "linux-uapi"])
def test_no_real_c_header_is_taken_for_cpp_by_its_syntax(name: str) -> None:
    tree = real_cpp.debian_or_python_c(name)
    result = _real(tree)
    assert result.stats["decided_by:cpp_syntax"] == 0, tree.label
    assert result.stats["header:c"] > 0, tree.label


def test_real_c_headers_become_c_when_the_source_holds_c_files() -> None:
    tree = real_cpp.debian_or_python_c("glibc")
    paths = [path for path, _ in tree.files]
    source = paths + [p.rsplit(".", 1)[0] + ".c" for p in paths]  # a C tree has its .c files
    result = _real(tree, source)
    assert set(result.kept["language"].to_pylist()) == {"c"}, tree.label
