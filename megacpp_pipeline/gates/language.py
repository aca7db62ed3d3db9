"""The language gate: is each file C++ or C, and is it vendored? An extension that says it
decides (.cpp, .hpp, ... / .c). A header that could be either (.h, .inc, extensionless) is
decided from its content, then from the source's other files:

1. C++-only syntax outside `#ifdef __cplusplus` sections (namespace, template<, class X {,
   ::, access specifiers, C++ keywords, <vector>-style includes) -> c++ (`cpp_syntax`);
2. else a C linkage guard (`extern "C" {` in such a section, `__BEGIN_DECLS`) or a C-only
   keyword (`_Generic`, `restrict`, ...) -> c (`c_interop`): a C header written to be
   usable from C++ is still C;
3. else C++ code inside the sections (libc++'s <math.h> adds its overloads there) -> c++
   (`cpp_in_guard`);
4. else the source's other files lean: C (only .c) or C++ (.cpp, .hpp, ...) files in the
   same directory, or else in the whole source (`siblings`);
5. else `undecided` (c++ by default: the text is valid C++ and sits in a C++ corpus).

Policy: `keep_c: false` drops C files with reason `not_cpp`. Kept rows gain `language`
("c++" | "c") and `vendored` (gates/vendored.py). The lexical decision was measured against
tree-sitter (bench/bench_quality.py); it is the one used because it is as right on real
headers at a small fraction of the cost.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field, field_validator

from megacpp_pipeline.core import schemas
from megacpp_pipeline.core.errors import FieldedError
from megacpp_pipeline.core.gate import GateResult
from megacpp_pipeline.core.ledger import DropReason, drops
from megacpp_pipeline.gates import cpp_text, vendored


class Language(StrEnum):
    CPP = "c++"
    C = "c"


class Basis(StrEnum):
    """What decided a file's language (the stats count files per basis)."""

    EXTENSION = "extension"
    CPP_SYNTAX = "cpp_syntax"
    C_INTEROP = "c_interop"
    CPP_IN_GUARD = "cpp_in_guard"
    SIBLINGS = "siblings"
    C_STYLE = "c_style"
    UNDECIDED = "undecided"


_CPP_EXTENSIONS = [
    ".cc",
    ".cpp",
    ".cxx",
    ".c++",
    ".cp",
    ".C",
    ".hh",
    ".hpp",
    ".hxx",
    ".h++",
    ".ipp",
    ".tpp",
    ".tcc",
    ".inl",
    ".ixx",
    ".cppm",
    ".cu",
    ".cuh",
]  # fmt: skip (".C", capital, is C++ to GCC: ROOT macros, old Unix code)

# the kept table's new columns (schema: the input's, then these): the file's class
LANGUAGE_FIELDS = schemas.CLASS_FIELDS


class LanguageConfig(BaseModel):
    """The language policy and what decides it, with defaults, in one place."""

    model_config = ConfigDict(extra="forbid")

    keep_c: bool = False  # False: C files are dropped with reason not_cpp
    cpp_extensions: list[str] = Field(default_factory=lambda: list(_CPP_EXTENSIONS))
    c_extensions: list[str] = Field(default_factory=lambda: [".c"])
    # neither the content nor the source's other files lean either way
    undecided: Language = Language.CPP
    vendored_dirs: list[str] = Field(default_factory=lambda: list(vendored.VENDORED_DIRS))

    @field_validator("cpp_extensions", "c_extensions")
    @classmethod
    def _dotted_lowercase(cls, value: list[str]) -> list[str]:
        for ext in value:
            if not ext.startswith(".") or (ext != ext.lower() and ext != ".C"):
                raise ValueError(
                    f"extension {ext!r} must start with '.' and be lowercase (or be '.C')"
                )
        return value


class LanguageInputError(FieldedError, ValueError):
    """The table handed to the gate lacks columns of normalized_files."""

    def __init__(self, missing: list[str]) -> None:
        super().__init__(f"language input lacks normalized_files column(s): {', '.join(missing)}")
        self.missing = missing


@dataclass(frozen=True)
class Siblings:
    """Which way a source's files of decisive extension lean, per directory and overall.
    Built once per source from its collected paths (a shard does not see them all)."""

    by_directory: Mapping[str, Language]
    source: Language | None

    @classmethod
    def of(cls, source_paths: Sequence[str], config: LanguageConfig) -> Siblings:
        cpp_ext, c_ext = set(config.cpp_extensions), set(config.c_extensions)
        counts: dict[str, Counter[Language]] = {}
        overall: Counter[Language] = Counter()
        for path in source_paths:
            ext = _extension(path)
            language = Language.CPP if ext in cpp_ext else Language.C if ext in c_ext else None
            if language is not None:
                counts.setdefault(posixpath.dirname(path), Counter())[language] += 1
                overall[language] += 1
        leans = {d: lean for d, c in counts.items() if (lean := _lean(c)) is not None}
        return cls(by_directory=leans, source=_lean(overall))

    def lean(self, path: str) -> Language | None:
        return self.by_directory.get(posixpath.dirname(path), self.source)

    def fingerprint(self) -> str:
        """A stable digest of the leans: what, besides a row, decides its language (a
        result cache keyed by path and content needs it in its salt)."""
        leans = sorted((d, lean.value) for d, lean in self.by_directory.items())
        text = json.dumps([self.source.value if self.source else None, leans])
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def run(
    table: pa.Table,
    config: LanguageConfig,
    source_paths: Sequence[str] | Siblings,
    vendored_prefixes: Sequence[str] = (),
) -> GateResult:
    """Every input column plus `language` and `vendored`; C files are ledgered as not_cpp
    unless `keep_c`. `source_paths`: every path collected from the file's source (or its
    Siblings); `vendored_prefixes`: the path prefixes its catalog entry declares vendored."""
    missing = [name for name in schemas.NORMALIZED_FILES.names if name not in table.column_names]
    if missing:
        raise LanguageInputError(missing)
    siblings = (
        source_paths if isinstance(source_paths, Siblings) else Siblings.of(source_paths, config)
    )
    n = table.num_rows
    paths = cpp_text.one_array(table.column("path"))
    texts = cpp_text.one_array(table.column("text"))
    path_list = paths.to_pylist()

    languages = np.full(n, Language.CPP.value, dtype=object)
    bases = np.full(n, Basis.EXTENSION.value, dtype=object)
    extensions = [_extension(p) for p in path_list]
    cpp_ext, c_ext = set(config.cpp_extensions), set(config.c_extensions)
    languages[[i for i, e in enumerate(extensions) if e in c_ext]] = Language.C.value
    ambiguous = np.array(
        [i for i, e in enumerate(extensions) if e not in cpp_ext and e not in c_ext], np.int64
    )
    if len(ambiguous):
        evidence = content_evidence(texts.take(pa.array(ambiguous, pa.int64())))
        for k, i in enumerate(ambiguous.tolist()):
            language, basis = _decide(evidence, k, siblings.lean(path_list[i]), config)
            languages[i], bases[i] = language.value, basis.value
    is_vendored = vendored.vendored_mask(paths, vendored_prefixes, config.vendored_dirs)

    drop = (languages == Language.C.value) & (not config.keep_c)
    keep = ~drop
    kept = table.filter(pa.array(keep))
    kept = kept.append_column(LANGUAGE_FIELDS[0], pa.array(languages[keep].tolist(), pa.string()))
    kept = kept.append_column(LANGUAGE_FIELDS[1], pa.array(is_vendored[keep], pa.bool_()))
    dropped_rows = np.flatnonzero(drop)
    dropped = drops(
        table.column("source_id").take(pa.array(dropped_rows, pa.int64())).to_pylist(),
        [path_list[i] for i in dropped_rows.tolist()],
        [DropReason.NOT_CPP] * len(dropped_rows),
        details=[_drop_detail(bases[i], extensions[i]) for i in dropped_rows.tolist()],
    )

    sizes = cpp_text.byte_lengths(texts)
    stats: Counter[str] = Counter()
    stats["files_in"] = n
    stats["bytes_in"] = int(sizes.sum())
    stats["files_kept"] = int(keep.sum())
    stats["bytes_kept"] = int(sizes[keep].sum())
    stats.update(f"language:{language}" for language in languages.tolist())
    stats.update(f"decided_by:{basis}" for basis in bases.tolist())
    # files whose extension does not decide (.h, extensionless, ...): the share each way
    stats.update(f"header:{languages[i]}" for i in ambiguous.tolist())
    stats.update(f"{DropReason.NOT_CPP}:{bases[i]}" for i in dropped_rows.tolist())
    stats["vendored"] = int(is_vendored.sum())
    stats["vendored_kept"] = int(is_vendored[keep].sum())
    return GateResult(kept=kept, dropped=dropped, stats=+stats)


def output_schema(input_schema: pa.Schema) -> pa.Schema:
    """The kept table's schema for an input of `input_schema`."""
    out = input_schema
    for f in LANGUAGE_FIELDS:
        out = out.append(f)
    return out


# --- content ---------------------------------------------------------------------------

# Syntax no C compiler accepts (C23 included: its constexpr, nullptr, static_assert, bool,
# alignas and auto are left out). Matched on the text with comments cut out.
_CPP_SYNTAX = "|".join(
    [
        r"\bnamespace\b\s*[\w:]*\s*[{=]",
        r"\btemplate\s*<",
        r"\bclass\s+\w+\s*(?:final\s*)?[{:]",
        r"\b(?:public|private|protected)\s*:",
        r"\b\w+::~?\w",  # scope resolution: std::size_t, Foo::~Foo
        r"(?:^|[^:\w])::\w",  # global scope: ::operator new, using ::printf;
        r"\b(?:typename|virtual|explicit|friend|mutable|decltype|noexcept|consteval|constinit"
        r"|co_await|co_return|co_yield|static_cast|dynamic_cast|reinterpret_cast|const_cast)\b",
        r"\boperator\s*(?:\(\s*\)|\[\s*\]|[-+*/%^&|~!=<>,]+|new\b|delete\b)\s*\(",
        r"\bthis\s*->",
        r"\btry\s*\{|\bcatch\s*\(",
        r"\bthrow\s*\(",
        r"\busing\s+(?:namespace\b|\w+\s*=)",
        r"\benum\s+(?:class|struct)\b",
        r"\bextern\s*\"C\+\+\"",
        r"(?m:^[ \t]*#[ \t]*include[ \t]*<[\w/]+>)",  # <vector>, <cstdio>: C headers end in .h
        r"\bconst\s+[\w:<>]+\s*&\s*\w+\s*[,)=]",  # a const reference parameter
    ]
)
_C_LINKAGE = r"\bextern\s*\"C\"\s*\{|\b(?:__BEGIN_DECLS|G_BEGIN_DECLS|BEGIN_C_DECLS)\b"
_C_ONLY_KEYWORD = (
    r"\b(?:_Generic|_Noreturn|_Static_assert|_Thread_local|_Atomic|_Alignas|_Alignof"
    r"|_Imaginary|restrict)\b"
)
# C's way of naming struct types, legal C++ but rare in it: `struct stat st;`, `typedef
# struct x x_t;` (a weak sign, read only when nothing else decides)
_C_STYLE = (
    r"\b(?:struct|union|enum)\s+\w+\s*\**\s*\w+\s*[;,)\[=]|\btypedef\s+(?:struct|union|enum)\b"
)
_DIRECTIVE_LINE = r"(?m)^[ \t]*#(?:[^\n\\]|\\.|\\\n)*"
_CONDITIONAL = re.compile(
    r"^[ \t]*#[ \t]*(ifdef|ifndef|if|elif|else|endif|define)\b((?:[^\n\\]|\\.|\\\n)*)\n?", re.M
)
_CPLUSPLUS = 201703  # what __cplusplus is when a C++ compiler reads the header


@dataclass(frozen=True)
class ContentEvidence:
    """Per file (aligned with the texts it was read from): what its content shows."""

    cpp_syntax: np.ndarray  # outside __cplusplus sections
    c_interop: np.ndarray  # C linkage guard or C-only keyword
    cpp_in_guard: np.ndarray  # C++ syntax inside __cplusplus sections
    only_guarded_code: np.ndarray  # every non-directive line is in a __cplusplus section
    c_style: np.ndarray  # struct tags used as types, typedef struct


def content_evidence(texts: pa.Array) -> ContentEvidence:
    code = cpp_text.without_comments(texts)
    n = len(code)
    mentions = np.flatnonzero(_np_bool(pc.match_substring(code, "__cplusplus")))
    outside, inside = code, pa.nulls(n, pa.string())
    if len(mentions):
        sections = [split_cplusplus_sections(t) for t in code.take(mentions).to_pylist()]
        mask = pa.array(np.isin(np.arange(n), mentions))
        outside = pc.replace_with_mask(code, mask, pa.array([s[0] for s in sections]))
        inside = pc.replace_with_mask(inside, mask, pa.array([s[1] for s in sections]))
    inside = pc.fill_null(inside, "")
    cpp_in_guard = cpp_text.regex_matches(inside, _CPP_SYNTAX)
    only_guarded = np.zeros(n, dtype=bool)
    guarded = np.flatnonzero(cpp_in_guard)
    if len(guarded):
        bare = pc.replace_substring_regex(outside.take(guarded), _DIRECTIVE_LINE, "")
        only_guarded[guarded] = ~cpp_text.regex_matches(bare, r"\S")
    return ContentEvidence(
        cpp_syntax=cpp_text.regex_matches(outside, _CPP_SYNTAX),
        c_interop=cpp_text.regex_matches(code, _C_LINKAGE)
        | cpp_text.regex_matches(outside, _C_ONLY_KEYWORD),
        cpp_in_guard=cpp_in_guard,
        only_guarded_code=only_guarded,
        c_style=cpp_text.regex_matches(outside, _C_STYLE),
    )


def split_cplusplus_sections(code: str) -> tuple[str, str]:
    """(the text outside, the text inside) the branches of conditionals that a C++ compiler
    may read and a C compiler never does: `#ifdef __cplusplus`, `#if defined __cplusplus &&
    ...`, the `#else` of `#ifndef __cplusplus`, `#elif __cplusplus >= 201103L`, and tests of
    macros defined only inside such branches (glibc's __CORRECT_ISO_CPP_STRING_H_PROTO).
    Nesting is followed; the conditional directives themselves count as outside."""
    outside: list[str] = []
    inside: list[str] = []
    # per open conditional: [its branch is C++-only, C reaches a later branch, C++ does]
    chains: list[list[bool | None]] = []
    cpp_macros = {"__cplusplus"}  # macros only a C++ compiler has defined
    position = 0
    for match in _CONDITIONAL.finditer(code):
        in_cpp = any(chain[0] for chain in chains)
        side = inside if in_cpp else outside
        side.append(code[position : match.start()])
        position = match.end()
        kind, condition = match.group(1), match.group(2).replace("\\\n", " ")
        if kind == "define":  # a definition belongs to its section
            side.append(match.group(0))
            if in_cpp and condition.split():
                cpp_macros.add(re.split(r"\W", condition.split()[0])[0])
            continue
        outside.append(match.group(0))
        if kind == "ifdef":
            condition = f"defined {condition}"
        elif kind == "ifndef":
            condition = f"!defined {condition}"
        if kind in ("ifdef", "ifndef", "if"):
            chains.append([False, True, True])
        elif not chains:
            continue  # an unbalanced #elif/#else/#endif: ignore it
        if kind == "endif":
            chains.pop()
            continue
        chain = chains[-1]
        c_open, cpp_open = chain[1], chain[2]
        if kind == "else":
            c_taken, cpp_taken = c_open, cpp_open
        else:
            c_cond = _evaluate(condition, cpp_macros, cplusplus=False)
            cpp_cond = _evaluate(condition, cpp_macros, cplusplus=True)
            c_taken, cpp_taken = _and(c_open, c_cond), _and(cpp_open, cpp_cond)
            chain[1], chain[2] = _and(c_open, _not(c_cond)), _and(cpp_open, _not(cpp_cond))
        chain[0] = c_taken is False and cpp_taken is not False
    in_cpp = any(chain[0] for chain in chains)
    (inside if in_cpp else outside).append(code[position:])
    return "".join(outside), "".join(inside)


# Three-valued evaluation of a #if condition: True, False, or None (depends on macros other
# than __cplusplus). Enough of the grammar for guards: !, &&, ||, parentheses, defined, and
# comparisons of __cplusplus with a number.
_TOKEN = re.compile(r"\s*(\(|\)|!(?!=)|&&|\|\||(?:[^()!&|]|!=|&(?!&)|\|(?!\|))+)")
_DEFINED = re.compile(r"defined\s*\(\s*(\w+)\s*\)")
_MACRO_TEST = re.compile(r"^\s*(?:defined\s+)?(\w+)\s*$")
_CPP_COMPARE = re.compile(r"^\s*__cplusplus\s*(>=|<=|==|!=|>|<)\s*(\d+)[lLuU]*\s*$")


def _evaluate(condition: str, cpp_macros: set[str], *, cplusplus: bool) -> bool | None:
    tokens = [t.strip() for t in _TOKEN.findall(_DEFINED.sub(r"defined \1", condition))]
    tokens = [t for t in tokens if t]
    value, rest = _or(tokens, _Reading(cpp_macros, cplusplus))
    return value if not rest else None


@dataclass(frozen=True)
class _Reading:
    """Which compiler reads the condition, and the macros only C++ defines."""

    cpp_macros: set[str]
    cplusplus: bool


def _or(tokens: list[str], cpp: _Reading) -> tuple[bool | None, list[str]]:
    value, tokens = _conjunction(tokens, cpp)
    while tokens[:1] == ["||"]:
        right, tokens = _conjunction(tokens[1:], cpp)
        value = _not(_and(_not(value), _not(right)))
    return value, tokens


def _conjunction(tokens: list[str], cpp: _Reading) -> tuple[bool | None, list[str]]:
    value, tokens = _unary(tokens, cpp)
    while tokens[:1] == ["&&"]:
        right, tokens = _unary(tokens[1:], cpp)
        value = _and(value, right)
    return value, tokens


def _unary(tokens: list[str], cpp: _Reading) -> tuple[bool | None, list[str]]:
    if not tokens:
        return None, []
    head, tokens = tokens[0], tokens[1:]
    if head == "!":
        value, tokens = _unary(tokens, cpp)
        return _not(value), tokens
    if head == "(":
        value, tokens = _or(tokens, cpp)
        return value, tokens[1:] if tokens[:1] == [")"] else tokens
    if tokens[:1] == ["("]:  # a function-like macro: FOO_PREREQ (4, 4)
        depth = 0
        for k, t in enumerate(tokens):
            depth += (t == "(") - (t == ")")
            if depth == 0:
                return None, tokens[k + 1 :]
        return None, []
    test = _MACRO_TEST.match(head)
    if test and test.group(1) in cpp.cpp_macros:
        return cpp.cplusplus, tokens
    compare = _CPP_COMPARE.match(head)
    if compare:
        left, right = (_CPLUSPLUS if cpp.cplusplus else 0), int(compare.group(2))
        ops = {">=": left >= right, "<=": left <= right, "==": left == right}
        ops.update({"!=": left != right, ">": left > right, "<": left < right})
        return ops[compare.group(1)], tokens
    return None, tokens


def _and(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    return True if a is True and b is True else None


def _not(a: bool | None) -> bool | None:
    return None if a is None else not a


def _decide(
    evidence: ContentEvidence, k: int, lean: Language | None, config: LanguageConfig
) -> tuple[Language, Basis]:
    if evidence.cpp_syntax[k]:
        return Language.CPP, Basis.CPP_SYNTAX
    if evidence.cpp_in_guard[k] and evidence.only_guarded_code[k]:
        return Language.CPP, Basis.CPP_IN_GUARD  # a C++ header wrapped whole in the guard
    if evidence.c_interop[k]:
        return Language.C, Basis.C_INTEROP
    if lean is not None:
        return lean, Basis.SIBLINGS
    if evidence.cpp_in_guard[k]:
        return Language.CPP, Basis.CPP_IN_GUARD
    if evidence.c_style[k]:
        return Language.C, Basis.C_STYLE
    return config.undecided, Basis.UNDECIDED


_DROP_DETAILS = {
    Basis.EXTENSION.value: "extension {ext!r} is C",
    Basis.C_INTEROP.value: (
        "C header: no C++ syntax outside __cplusplus sections, and a C linkage guard or a "
        "C-only keyword"
    ),
    Basis.SIBLINGS.value: "no C++ syntax, and the source's files beside it are C",
    Basis.C_STYLE.value: "no C++ syntax, nothing beside it, and struct tags used as C does",
    Basis.UNDECIDED.value: "no C++ syntax and nothing leaning either way (undecided: c)",
}


def _drop_detail(basis: str, ext: str) -> str:
    return _DROP_DETAILS[basis].format(ext=ext) + " (keep_c: false)"


def _lean(counts: Counter[Language]) -> Language | None:
    if not counts:
        return None
    return Language.C if counts[Language.C] > counts[Language.CPP] else Language.CPP


def _extension(path: str) -> str:
    """'.h' for 'a/b.H', '' for 'vector' and for '.clang-format'; '.C' stays as it is (a
    C++ file to GCC, where '.c' is C)."""
    base = path.rsplit("/", 1)[-1]
    dot = base.rfind(".")
    if dot <= 0:
        return ""
    return ".C" if base[dot:] == ".C" else base[dot:].lower()


def _np_bool(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return np.asarray(array.to_numpy(zero_copy_only=False), dtype=bool)
