"""The build lane: a compile_commands.json read as data into sanitized per-TU contexts —
no absolute or home paths survive, nothing from it is ever executed, and a malformed
database is an error naming the file and the entry."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megacpp_pipeline.gates.build_context import (
    LOCAL_PATH,
    CompileDatabaseError,
    parse_compile_commands,
)

KNOWN = {"src/tiny.cpp", "src/util.cc", "include/tiny/tiny.h", "include/tiny/detail.hpp"}


def db(*entries: dict[str, object]) -> bytes:
    return json.dumps(list(entries)).encode()


def strings_in(record: dict[str, object]) -> list[str]:
    out: list[str] = []
    for value in record.values():
        out.extend(value if isinstance(value, list) else [value] if isinstance(value, str) else [])
    return out


@pytest.mark.skipif(
    shutil.which("cmake") is None or shutil.which("g++") is None,
    reason="cmake or g++ missing: `make test` installs them when it runs as root with apt-get",
)
def test_cmake_exported_database_yields_relative_gcc_contexts(tmp_path: Path) -> None:
    root = tmp_path / "tiny"
    (root / "src").mkdir(parents=True)
    (root / "include" / "tiny").mkdir(parents=True)
    (root / "src" / "tiny.cpp").write_text('#include "tiny/tiny.h"\nint tiny() { return 3; }\n')
    (root / "include" / "tiny" / "tiny.h").write_text("#pragma once\nint tiny();\n")
    (root / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.16)\nproject(tiny CXX)\n"
        "set(CMAKE_CXX_STANDARD 20)\n"
        "add_library(tiny src/tiny.cpp)\n"
        "target_include_directories(tiny PUBLIC include)\n"
        "target_include_directories(tiny SYSTEM PRIVATE /opt/thirdparty/include)\n"
        "target_compile_definitions(tiny PRIVATE TINY_LEVEL=3 TINY_FAST\n"
        '  "DATA_DIR=\\"${CMAKE_SOURCE_DIR}/data\\"")\n'
    )
    build = tmp_path / "out-of-tree-build"
    subprocess.run(
        [
            "cmake",
            "-S",
            str(root),
            "-B",
            str(build),
            "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON",
            "-DCMAKE_CXX_COMPILER=g++",
        ],
        check=True,
        capture_output=True,
    )
    data = (build / "compile_commands.json").read_bytes()
    assert str(tmp_path).encode() in data  # the real thing is full of local paths

    database = parse_compile_commands(data, {"src/tiny.cpp", "include/tiny/tiny.h"})
    ctx = database.context_for("src/tiny.cpp")
    assert ctx is not None
    assert ctx["compiler_family"] == "gcc"
    assert ctx["language_standard"] in {"gnu++20", "c++20"}
    assert ctx["tu_path"] == "src/tiny.cpp"
    assert {"TINY_LEVEL=3", "TINY_FAST", 'DATA_DIR="data"'} <= set(ctx["defines"])
    assert ctx["include_roots"] == ["include", LOCAL_PATH]
    for value in strings_in(ctx):
        assert not value.startswith("/") and str(tmp_path) not in value
    assert database.context_for("include/tiny/tiny.h") is None  # headers stay syntax-only


def test_arguments_form_with_wrapper_undefines_and_home_paths() -> None:
    entry = {
        "directory": "/home/alice/src/tiny/build",
        "file": "/home/alice/src/tiny/src/tiny.cpp",
        "arguments": [
            "ccache",
            "/usr/lib/ccache/x86_64-linux-gnu-g++-12",
            "-DNDEBUG",
            "-D",
            "LEVEL=1",
            "-DLEVEL=2",
            "-UNDEBUG",
            "-I../include",
            "-iquote",
            "/home/alice/src/tiny/src",
            "-isystem",
            "/opt/boost/include",
            "-I~/sdk/include",
            "-I",
            "/home/alice/.local/include",
            "-std=c++17",
            "-std=gnu++20",
            "-O2",
            "-Wall",
            "-c",
            "../src/tiny.cpp",
        ],
    }
    ctx = parse_compile_commands(db(entry), KNOWN).context_for("src/tiny.cpp")
    assert ctx == {
        "compiler_family": "gcc",
        "language_standard": "gnu++20",  # the last -std wins, as in the compiler
        "defines": ["LEVEL=2"],
        "include_roots": ["include", "src", LOCAL_PATH],
        "tu_path": "src/tiny.cpp",
    }


def test_command_form_with_shell_metacharacters_stays_data(tmp_path: Path) -> None:
    canary = tmp_path / "pwned"
    command = (
        f"clang++-16 -DPAYLOAD='$(touch {canary})' -DTICKS=\"`touch {canary}`\" "
        f"-c ../src/util.cc -o util.o; touch {canary} && rm -rf ~ | tee {canary}"
    )
    entry = {"directory": "/work/tiny/build", "file": "../src/util.cc", "command": command}
    ctx = parse_compile_commands(db(entry), KNOWN).context_for("src/util.cc")
    assert not canary.exists()
    assert ctx is not None and ctx["compiler_family"] == "clang"
    assert f"PAYLOAD=$(touch {LOCAL_PATH})" in ctx["defines"]
    assert f"TICKS=`touch {LOCAL_PATH}`" in ctx["defines"]


def test_msvc_command_with_windows_paths() -> None:
    entry = {
        "directory": "C:\\src\\tiny\\build",
        "file": "..\\src\\tiny.cpp",
        "command": '"C:\\Program Files\\MSVC\\bin\\cl.exe" /nologo /DWIN32 /D_DEBUG=1 '
        "/IC:\\src\\tiny\\include /I C:\\Users\\bob\\vcpkg\\include /std:c++20 "
        "/c ..\\src\\tiny.cpp",
    }
    ctx = parse_compile_commands(db(entry), KNOWN).context_for("src/tiny.cpp")
    assert ctx == {
        "compiler_family": "msvc",
        "language_standard": "c++20",
        "defines": ["WIN32", "_DEBUG=1"],
        "include_roots": ["include", LOCAL_PATH],
        "tu_path": "src/tiny.cpp",
    }


def test_headers_outsiders_and_duplicate_entries_are_counted_not_used() -> None:
    base = {"directory": "/w/tiny/build", "arguments": ["g++", "-c", "x"]}
    database = parse_compile_commands(
        db(
            {**base, "file": "/w/tiny/src/tiny.cpp", "arguments": ["g++", "-DFIRST", "-c", "x"]},
            {**base, "file": "/w/tiny/src/tiny.cpp", "arguments": ["g++", "-DSECOND", "-c", "x"]},
            {**base, "file": "/w/tiny/include/tiny/tiny.h"},
            {**base, "file": "/w/tiny/build/generated.cpp"},
        ),
        KNOWN,
    )
    assert list(database.contexts) == ["src/tiny.cpp"]
    assert database.context_for("src/tiny.cpp")["defines"] == ["FIRST"]  # type: ignore[index]
    assert database.stats["duplicate_entries_ignored"] == 1
    assert database.stats["header_entries_ignored"] == 1
    assert database.stats["entries_outside_corpus"] == 1
    assert database.context_for("src/util.cc") is None


def test_unknown_compiler_and_missing_standard_are_recorded_as_such() -> None:
    entry = {"directory": "/w/t", "file": "src/tiny.cpp", "arguments": ["/usr/bin/c++", "-c"]}
    ctx = parse_compile_commands(db(entry), KNOWN).context_for("src/tiny.cpp")
    assert ctx is not None
    assert ctx["compiler_family"] == "unknown" and ctx["language_standard"] is None


@pytest.mark.parametrize(
    ("data", "entry", "rule"),
    [
        (b"{not json", None, "not JSON"),
        (b'{"directory": "/w"}', None, "JSON array"),
        (db({"directory": "/w", "file": "a.cpp", "command": "g++"}, "nope"), 1, "object"),
        (db({"directory": "/w", "command": "g++ -c a.cpp"}), 0, "'file'"),
        (db({"directory": "build", "file": "a.cpp", "command": "g++"}), 0, "absolute"),
        (db({"directory": "/w", "file": "a.cpp", "arguments": "g++ -c a.cpp"}), 0, "arguments"),
        (db({"directory": "/w", "file": "a.cpp"}), 0, "'command'"),
        (db({"directory": "/w", "file": "src/tiny.cpp", "command": "g++ -DX='oops"}), 0, "split"),
    ],
)
def test_malformed_database_names_file_entry_and_rule(
    data: bytes, entry: int | None, rule: str
) -> None:
    with pytest.raises(CompileDatabaseError) as info:
        parse_compile_commands(data, KNOWN, origin="vendor/tiny/compile_commands.json")
    assert info.value.origin == "vendor/tiny/compile_commands.json"
    assert info.value.entry == entry
    assert rule in str(info.value) and "vendor/tiny/compile_commands.json" in str(info.value)


FLAG = st.one_of(
    st.from_regex(r"-D[A-Z_][A-Z0-9_]{0,8}(=[a-z0-9 '\"$;|&()]{0,10})?", fullmatch=True),
    st.from_regex(r"-I(include|src|/usr/include|/home/u/x|\.\./include)", fullmatch=True),
    st.sampled_from(["-O2", "-Wall", "-std=c++17", "-std=gnu++20", "-fPIC", "-c", "-g"]),
)


@settings(max_examples=50, deadline=None)
@given(st.lists(FLAG, max_size=12))
def test_command_and_arguments_forms_agree_and_never_leak_absolute_paths(
    flags: list[str],
) -> None:
    argv = ["/usr/bin/g++", *flags, "-c", "../src/tiny.cpp"]
    common = {"directory": "/home/u/tiny/build", "file": "../src/tiny.cpp"}
    by_args = parse_compile_commands(db({**common, "arguments": argv}), KNOWN)
    by_command = parse_compile_commands(db({**common, "command": shlex.join(argv)}), KNOWN)
    ctx = by_args.context_for("src/tiny.cpp")
    assert ctx == by_command.context_for("src/tiny.cpp")
    assert ctx is not None
    for value in strings_in(ctx):
        assert "/home/" not in value and "/usr/" not in value
    for root in ctx["include_roots"]:
        assert root == LOCAL_PATH or not root.startswith(("/", ".."))


def test_clang_cl_inputs_outputs_and_posix_paths_are_not_read_as_flags() -> None:
    """To an MSVC-style driver `/Data/alice/...` looks like `/D`: the source after `--`
    (CMake's clang-cl rule) and the object after `-o` became the define
    `ata/alice/proj/src/a.cpp`, a local path fragment the stage's check did not look for."""
    data = db(
        {
            "directory": "/Data/alice/proj/build",
            "file": "/Data/alice/proj/src/a.cpp",
            "arguments": [
                *("/usr/bin/clang-cl", "/nologo", "/DNDEBUG", "/I/Data/alice/proj/include"),
                *("-o", "/Data/alice/proj/build/a.obj", "/DFOO=1", "-c", "--"),
                "/Data/alice/proj/src/a.cpp",
            ],
        }
    )
    record = parse_compile_commands(data, {"src/a.cpp"}).contexts["src/a.cpp"].as_record()
    assert record["defines"] == ["NDEBUG", "FOO=1"]
    assert record["include_roots"] == ["include"]


def test_an_entry_whose_flags_are_in_a_response_file_keeps_the_syntax_evidence() -> None:
    """`g++ @CMakeFiles/a.rsp -c a.cpp` gave a context with no defines and no include
    roots, presented as the build's."""
    data = db(
        {"directory": "/w/b", "file": "/w/src/a.cpp", "command": "g++ @a.rsp -c ../src/a.cpp"},
        {"directory": "/w/b", "file": "/w/src/b.cpp", "command": "g++ -DX -c ../src/b.cpp"},
    )
    parsed = parse_compile_commands(data, {"src/a.cpp", "src/b.cpp"})
    assert set(parsed.contexts) == {"src/b.cpp"}
    assert parsed.stats["response_file_entries"] == 1


def test_a_windows_command_line_is_split_as_the_c_runtime_splits_it() -> None:
    """shlex(posix=False) then stripping quotes left `VERSION=\\"1.0\\` for CMake's
    `-DVERSION=\\"1.0\\"` and cut `"/IC:\\src\\my include"` at its space."""
    command = (
        r"C:\VS\bin\Hostx64\x64\cl.exe /nologo /TP -DVERSION=\"1.0\" "
        r'"/IC:\src\fmt\my include" /DNDEBUG -std:c++20 -c C:\src\fmt\src\format.cc'
    )
    data = db(
        {
            "directory": "C:\\src\\fmt\\build",
            "file": "C:\\src\\fmt\\src\\format.cc",
            "command": command,
        }
    )
    record = parse_compile_commands(data, {"src/format.cc"}).contexts["src/format.cc"].as_record()
    assert record["defines"] == ['VERSION="1.0"', "NDEBUG"]
    assert record["include_roots"] == ["my include"]
    assert record["language_standard"] == "c++20"
