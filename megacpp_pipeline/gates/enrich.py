"""Structure-aware enrichment (issue 6): parses every deduped file with tree-sitter-cpp and
emits chunk spans whose kinds the runtime consumes as integers, once, offline (seed: plain
lexical chunking is not enough for C++; record which lane — `build` or `syntax` — produced it).

Span contract (what `chunk_starts/ends/kinds/depths/names` hold)
----------------------------------------------------------------
Spans do **not** nest in the output. Structure nests in the tree (a class body holds method
spans, a namespace holds classes), but the tokenizer maps each token to exactly ONE kind by
`searchsorted` over span starts, so every file gets a flat, sorted, gap-free partition of its
UTF-8 bytes: `starts[0] == 0`, `ends[i] == starts[i + 1]`, `ends[-1] == len(text.encode())`.
Where structural regions overlap the innermost one wins (a method's body inside a class body
is `func_body`, the class body around it stays `class_body`); bytes no region claims are
`other` (id 0, which is also what the packer assumes for a missing kind). The nesting the
flat list loses is kept in `chunk_depths`: the number of namespace / class / enum / function /
lambda nodes that enclose the span (a method body inside `namespace a { struct S {...} }` has
depth 3, a top-level comment 0). `chunk_names` holds the declared name of the function, class,
namespace or macro the span belongs to ("" elsewhere).

Regions, by kind: `func_signature` is a function definition up to its body (or a whole
prototype `int f(int);` outside function bodies, or a lambda's capture/parameter head);
`func_body` the body block; `class_decl` a class/struct/union/enum head up to its body;
`class_body` that body (member declarations without their own region stay in it);
`namespace` the `namespace a::b` head; `template_params` `template <...>`; `comment` /
`doc_comment` (`///`, `//!`, `/**`, `/*!`); `preprocessor` whole directive lines (includes,
defines, pragmas and the `#if/#ifdef/#elif/#else/#endif` lines — not the code they guard);
`string_literal` string, raw-string and char literals (not `#include "x.h"` paths).

Per-file stats: `n_functions` (function definitions, lambdas excluded), `n_classes`
(class/struct/union with a body), `comment_ratio` (comment + doc_comment bytes / bytes),
`max_nesting` (deepest `{}` nesting over code bytes, braces in comments/strings excluded).

Parse quality: tree-sitter parses a same-length view of the text with parser-derailing macro
invocations blanked (`parse_view`); `parse_error_ratio` is the share of bytes left
unstructured under ERROR nodes (`_error_residue_bytes`), and files above
`EnrichConfig.max_parse_error_ratio` are dropped as not really C++. Having errors is normal.
"""

from __future__ import annotations

import functools
import itertools
import operator
import re
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import tree_sitter
import tree_sitter_cpp
from pydantic import BaseModel, ConfigDict, Field

from megacpp_pipeline.core.errors import FieldedError
from megacpp_pipeline.core.gate import GateResult
from megacpp_pipeline.core.ledger import DropReason, drops
from megacpp_pipeline.core.schemas import BUILD_CONTEXT, ENRICH_FIELDS, extend

if TYPE_CHECKING:
    from megacpp_pipeline.gates.build_context import BuildDatabase

# Bump the version whenever an id changes meaning; ids are never reused. The manifest records
# both, so a trainer can refuse a snapshot whose kind table it was not built for.
CHUNK_KINDS_VERSION = "1"
MAX_QUERY_START_DEPTH = 2000
CHUNK_KINDS: Mapping[str, int] = MappingProxyType(
    {
        "other": 0,  # no structure; also the packer's default for a missing kind
        "func_signature": 1,
        "func_body": 2,
        "class_decl": 3,
        "class_body": 4,
        "namespace": 5,
        "template_params": 6,
        "comment": 7,
        "doc_comment": 8,
        "preprocessor": 9,
        "string_literal": 10,
    }
)
KIND_NAMES: tuple[str, ...] = tuple(sorted(CHUNK_KINDS, key=CHUNK_KINDS.__getitem__))


def kind_table() -> dict[str, object]:
    """What a manifest records so a reader can check the ids it was built for."""
    return {"chunk_kinds_version": CHUNK_KINDS_VERSION, "chunk_kinds": dict(CHUNK_KINDS)}


_K = CHUNK_KINDS


class EnrichConfig(BaseModel):
    """Thresholds of the enrichment gate (the only place they live)."""

    model_config = ConfigDict(extra="forbid")

    # Share of a file's bytes left unstructured under tree-sitter ERROR nodes (see
    # `_error_residue_bytes`) above which it is "not really C++". Errors are normal in real
    # headers (23-69% of files per library have one). Measured on 9,491 real headers (demo
    # wheels, libc++ 14, nlohmann, a 4,768-file Boost 1.74 sample): p99 = 0.084,
    # p99.9 = 0.41, and 3 exceed 0.8 (libc++'s 6-byte `__libcpp_version` at 0.83, Boost's
    # MSVC-intrinsics `interlocked.hpp` at 0.97, one more Boost header at 0.86). Markdown
    # prose has a median of ~0.75.
    # bench/bench_enrich.py re-measures this.
    max_parse_error_ratio: float = Field(default=0.8, gt=0.0, le=1.0)
    # CPU seconds (this thread's, so a busy machine does not drop files) per file parse;
    # tree-sitter is cancelled through its progress callback when it runs over. The largest
    # real headers measured (Boost typeof/vector200.hpp 2.3 MB, qvm swizzle4.hpp 1.4 MB) take
    # at most 2.2 s CPU for the whole syntax lane, so 20 s leaves ~10x headroom.
    parse_timeout_seconds: float = Field(default=20.0, gt=0.0)
    # Names are for humans and join keys, not payload: long qualified names are cut here.
    max_name_bytes: int = Field(default=256, gt=0)
    # Parse a view with parser-derailing macro invocations blanked (see `parse_view`).
    mask_macro_noise: bool = True


class ParseTimeout(FieldedError):
    """tree-sitter was cancelled because one file ran over its parse budget."""

    def __init__(self, budget_seconds: float, offset: int, size: int) -> None:
        super().__init__(
            f"parse exceeded {budget_seconds:g} s CPU budget at byte {offset} of {size}"
        )
        self.budget_seconds = budget_seconds
        self.offset = offset
        self.size = size


@dataclass(frozen=True)
class FileStructure:
    """The flat span partition of one file plus its per-file structure stats."""

    starts: np.ndarray  # int64 byte offsets
    ends: np.ndarray
    kinds: np.ndarray  # uint8 CHUNK_KINDS ids
    depths: np.ndarray  # uint16
    names: list[str]
    parse_error_ratio: float
    n_error_nodes: int
    n_missing_nodes: int
    n_functions: int
    n_classes: int
    comment_ratio: float
    max_nesting: int

    def kind_bytes(self) -> np.ndarray:
        """Bytes covered by each kind id (length len(CHUNK_KINDS))."""
        return np.bincount(
            self.kinds, weights=(self.ends - self.starts), minlength=len(CHUNK_KINDS)
        ).astype(np.int64)


_QUERY = """
(function_definition) @function
(lambda_expression) @lambda
(class_specifier body: (_)) @class
(struct_specifier body: (_)) @class
(union_specifier body: (_)) @class
(enum_specifier body: (_)) @enum
(namespace_definition) @namespace
(template_declaration parameters: (_)) @template
(comment) @comment
[(preproc_include) (preproc_def) (preproc_function_def) (preproc_call)] @pp_line
["#if" "#ifdef" "#ifndef" "#elif" "#elifdef" "#elifndef" "#else" "#endif"] @pp_directive
[(string_literal) (raw_string_literal) (char_literal)] @string
(declaration declarator: (function_declarator)) @prototype
(declaration declarator: (pointer_declarator declarator: (function_declarator))) @prototype
(declaration declarator: (reference_declarator (function_declarator))) @prototype
(declaration declarator: (init_declarator declarator: (function_declarator))) @prototype
(field_declaration declarator: (function_declarator)) @prototype
(field_declaration declarator: (pointer_declarator declarator: (function_declarator))) @prototype
(field_declaration declarator: (reference_declarator (function_declarator))) @prototype
(preproc_include path: (_) @include_path)
(ERROR) @error
(MISSING) @missing
"""

# The parse view: tree-sitter cannot expand macros, and a handful of macro shapes derail it
# for a whole file (libc++'s `class _LIBCPP_TEMPLATE_VIS vector`, `_LIBCPP_BEGIN_NAMESPACE_STD`
# on its own line, nanobind's `NAMESPACE_BEGIN(detail)`). Those bytes are blanked to spaces
# of the same length before parsing, so every offset still indexes the real text and the
# spans cover the macro bytes too. On 2,270 real headers this cut files with an ERROR node
# from 59% to 36% and found 10% more classes. Only ALL_CAPS names (3+ chars) qualify: a
# lone macro line not followed by `{` (so `TEST(a, b)\n{` stays a function), or attribute
# macros between `class|struct|union` and the class name. A lone line that is the return
# type of the declarator on the next line, or a line inside an expression, is not one.
# Both patterns open with literal bytes so `re` can skip ahead to candidates (twice as
# fast as `(?m)^` / `\b` openers): a line macro is matched with the newline before it (the
# text gets one in front for its first line), and `\b` before the keyword is a lookbehind.
_CAPS = rb"[A-Z_][A-Z0-9_]{2,}"
_LINE_MACRO = re.compile(
    rb"\n[ \t]*" + _CAPS + rb"(?:[ \t]*\([^;{}\n]*\))?[ \t]*(?=\r?\n(?![ \t\r\n]*\{))"
)
_HEAD_MACRO = re.compile(
    rb"(?:class(?<!\wclass)|struct(?<!\wstruct)|union(?<!\wunion))"
    # then the class's own name: not `final` (`class HTTP final {`: HTTP is the name), and
    # one a base list, a body, template arguments or `final` follows (`struct RGB make_rgb(`
    # is C: RGB is the type's name, make_rgb a function's)
    rb"((?:[ \t]+" + _CAPS + rb"(?:\([^()\n]*\))?)+)"
    rb"(?=[ \t]+(?!final\b)[A-Za-z_]\w*[ \t]*(?:[:{<\n]|final\b|$))"
)


# A lone ALL_CAPS line that is not a macro: a return type alone on a line at the top level,
# the declarator on the next (`HRESULT\nFoo::Bar(int a)`, Windows style; an attribute macro
# before a constructor inside a class is indented, and stays a macro), or an argument or an
# operand that runs on over lines (the code of the line before ends inside the expression).
_DECLARATOR_NEXT = re.compile(
    rb"\r?\n(?:::)?(?!" + _CAPS + rb"[ \t]*\()[A-Za-z_]\w*(?:::~?[A-Za-z_]\w*)*[ \t]*\("
)
_INSIDE_EXPRESSION = frozenset(b",(=+-|&?^~[")  # not `>`, `*`, `/`: a template or comment end


def _is_line_macro(data: bytes, m: re.Match[bytes]) -> bool:
    """A `_LINE_MACRO` match (in `data`, which starts with the newline parse_view adds) that
    is a macro line rather than a return type or a continued expression."""
    line = m.group(0)
    if b"(" in line:  # a call: a macro's (a type takes no arguments, a constant none)
        return True
    if line[1:2] not in b" \t" and _DECLARATOR_NEXT.match(data, m.end()):
        return False  # a top-level type starts its line
    before = data[data.rfind(b"\n", 0, m.start()) + 1 : m.start()]
    code = before.split(b"//", 1)[0].rstrip()  # the line before, its comment cut
    return not code or code.endswith(b"*/") or code[-1] not in _INSIDE_EXPRESSION


def parse_view(data: bytes) -> bytes:
    """`data` with parser-derailing macro invocations blanked; same length, same offsets."""

    def blank_line(m: re.Match[bytes]) -> bytes:
        if not _is_line_macro(m.string, m):
            return m.group(0)
        return b"\n" + b" " * (m.end() - m.start() - 1)

    def blank_head(m: re.Match[bytes]) -> bytes:
        keyword = m.group(0)[: m.start(1) - m.start()]
        return keyword + b" " * (m.end(1) - m.start(1))

    return _HEAD_MACRO.sub(blank_head, _LINE_MACRO.sub(blank_line, b"\n" + data)[1:])


_READ_CHUNK = 1 << 16
_CHECK_EVERY = 64  # progress callbacks between clock reads: the clock costs more than parsing


@functools.cache
def _grammar() -> tuple[tree_sitter.Language, tree_sitter.Query]:
    """The pinned grammar and the compiled structure query (compiling costs ~0.3 s: once)."""
    language = tree_sitter.Language(tree_sitter_cpp.language())
    return language, tree_sitter.Query(language, _QUERY)


class CppStructureParser:
    """One tree-sitter parser plus the compiled structure query; not thread-safe, make one
    per worker. `structure(data)` is the whole syntax lane for one file."""

    def __init__(self, max_name_bytes: int = 256, mask_macro_noise: bool = True) -> None:
        self.mask_macro_noise = mask_macro_noise
        self.language, self.query = _grammar()
        self.parser = tree_sitter.Parser(self.language)
        self.max_name_bytes = max_name_bytes

    def parse(self, data: bytes, budget_seconds: float | None = None) -> tree_sitter.Tree:
        if budget_seconds is None:
            return self.parser.parse(data)
        view = memoryview(data)
        # The budget is CPU time of this thread, so a loaded machine does not drop files.
        # Reading that clock is a syscall (slow in sandboxes), so the cheap wall clock is
        # checked first: CPU time never runs ahead of wall time on one thread.
        wall_deadline = time.monotonic() + budget_seconds
        cpu_start = time.thread_time()
        ticks = itertools.count()
        reached = [0]

        def over_budget(offset: int, _has_error: bool) -> bool:
            if next(ticks) % _CHECK_EVERY or time.monotonic() < wall_deadline:
                return False
            reached[0] = offset
            return time.thread_time() - cpu_start > budget_seconds

        try:
            return self.parser.parse(
                lambda offset, _point: view[offset : offset + _READ_CHUNK],
                progress_callback=over_budget,
            )
        except ValueError as exc:  # tree-sitter reports a cancelled parse as "Parsing failed"
            self.parser.reset()
            raise ParseTimeout(budget_seconds, reached[0], len(data)) from exc

    def regions(self, data: bytes, budget_seconds: float | None = None) -> FileRegions:
        """Parse, structure query and the per-node work for one file: everything of the
        syntax lane but the span partition, which `partition` does for many files at once.
        A file over SEGMENT_BYTES is parsed a segment at a time (cut where a line opens at
        the top level), so a tree never holds more than one segment: memory is bounded by
        the segment, not the file, for a file at the size policy's limit. The budget is the
        whole file's."""
        if len(data) <= SEGMENT_BYTES:
            return self._regions(data, budget_seconds)
        parts: list[tuple[int, FileRegions]] = []
        started = time.thread_time()
        for lo, hi in segments(data, SEGMENT_BYTES):
            left = None
            if budget_seconds is not None:
                left = budget_seconds - (time.thread_time() - started)
                if left <= 0:
                    raise ParseTimeout(budget_seconds, lo, len(data))
            try:
                parts.append((lo, self._regions(data[lo:hi], left)))
            except ParseTimeout as exc:
                raise ParseTimeout(budget_seconds or 0.0, lo + exc.offset, len(data)) from exc
        return merge_regions(parts, len(data))

    def _regions(self, data: bytes, budget_seconds: float | None) -> FileRegions:
        tree = self.parse(parse_view(data) if self.mask_macro_noise else data, budget_seconds)
        cursor = tree_sitter.QueryCursor(self.query)
        # The query walk can cost far more than the parse on pathological nesting (100k
        # nested parentheses: 0.2 s to parse, minutes to query). Matches never start below
        # MAX_QUERY_START_DEPTH nodes, which bounds that walk; real code nests far less.
        # (captures' progress_callback would share the CPU budget, but it segfaults in
        # py-tree-sitter 0.26.1 on real headers.)
        cursor.set_max_start_depth(MAX_QUERY_START_DEPTH)
        return _regions_from_captures(data, cursor.captures(tree.root_node), self.max_name_bytes)

    def structure(self, data: bytes, budget_seconds: float | None = None) -> FileStructure:
        """The whole syntax lane for one file."""
        regions = self.regions(data, budget_seconds)
        return partition([data], [regions]).file(0, regions)


@dataclass(frozen=True)
class FileRegions:
    """One file's structure as the query found it, in plain lists: regions that may nest (in
    the order that breaks painting ties), leaves as (start, end) pairs in position order, the
    scope nodes that set depth, and the per-file counts. `partition` turns these into spans."""

    size: int
    starts: list[int]
    ends: list[int]
    kinds: list[int]
    names: list[str]
    prototypes: range  # indices of the prototype regions, dropped inside function bodies
    comments: list[tuple[int, int]]
    directives: list[tuple[int, int]]  # conditional directive lines
    strings: list[tuple[int, int]]
    scope_starts: list[int]
    scope_ends: list[int]
    parse_error_ratio: float
    n_error_nodes: int
    n_missing_nodes: int
    n_functions: int
    n_classes: int


# The most of one file tree-sitter holds as one tree (about 30 bytes of tree per byte of
# text): larger files are parsed in segments. Real headers stay far below it (the largest
# measured, Boost's vector200.hpp, is 2.3 MB), so they parse whole, exactly as before.
SEGMENT_BYTES = 4 << 20
_TOP_LEVEL_LINE = re.compile(rb"\n\n(?=[^\s])")


def segments(data: bytes, size: int) -> list[tuple[int, int]]:
    """[lo, hi) cuts of `data`, each at most `size` bytes. A cut goes after a blank line that
    a line starting in column 0 follows, where the braces since the segment began balance
    (the top level, as far as bytes tell; braces in comments and strings are counted too),
    else after such a line anywhere in the segment's second half, else after its last
    newline, else at `size`. Deterministic: the same bytes give the same cuts."""
    cuts = [0]
    while len(data) - cuts[-1] > size:
        lo = cuts[-1]
        window = np.frombuffer(data, np.uint8, size, lo)
        depth = np.cumsum((window == ord("{")).astype(np.int32) - (window == ord("}")))
        candidates = [m.end() for m in _TOP_LEVEL_LINE.finditer(data, lo + size // 2, lo + size)]
        top = [c for c in candidates if depth[c - lo - 1] == 0]
        if top or candidates:
            best = (top or candidates)[-1]
        else:
            nl = data.rfind(b"\n", lo + size // 2, lo + size)
            best = nl + 1 if nl >= 0 else lo + size
        cuts.append(best)
    cuts.append(len(data))
    return list(itertools.pairwise(cuts))


def merge_regions(parts: list[tuple[int, FileRegions]], size: int) -> FileRegions:
    """One file's regions from its segments' (each at its byte offset): every offset moved
    to the file, prototypes kept last (as `partition` expects), counts summed, the error
    ratio weighted by segment size."""

    def moved(values: list[int], at: int) -> list[int]:
        return [v + at for v in values]

    def moved_pairs(pairs: list[tuple[int, int]], at: int) -> list[tuple[int, int]]:
        return [(a + at, b + at) for a, b in pairs]

    starts: list[int] = []
    ends: list[int] = []
    kinds: list[int] = []
    names: list[str] = []
    for rest in (False, True):  # the regions first, then the prototypes
        for at, r in parts:
            chosen = r.prototypes if rest else range(r.prototypes.start)
            starts += [r.starts[i] + at for i in chosen]
            ends += [r.ends[i] + at for i in chosen]
            kinds += [r.kinds[i] for i in chosen]
            names += [r.names[i] for i in chosen]
    prototypes = sum(len(r.prototypes) for _, r in parts)
    return FileRegions(
        size=size,
        starts=starts,
        ends=ends,
        kinds=kinds,
        names=names,
        prototypes=range(len(starts) - prototypes, len(starts)),
        comments=[c for at, r in parts for c in moved_pairs(r.comments, at)],
        directives=[d for at, r in parts for d in moved_pairs(r.directives, at)],
        strings=[x for at, r in parts for x in moved_pairs(r.strings, at)],
        scope_starts=[v for at, r in parts for v in moved(r.scope_starts, at)],
        scope_ends=[v for at, r in parts for v in moved(r.scope_ends, at)],
        parse_error_ratio=sum(r.parse_error_ratio * r.size for _, r in parts) / max(size, 1),
        n_error_nodes=sum(r.n_error_nodes for _, r in parts),
        n_missing_nodes=sum(r.n_missing_nodes for _, r in parts),
        n_functions=sum(r.n_functions for _, r in parts),
        n_classes=sum(r.n_classes for _, r in parts),
    )


def _union_bytes(intervals: list[tuple[int, int]]) -> int:
    """Bytes covered by the union of non-empty [start, end) intervals (plain Python: most
    files have no ERROR node, the rest a handful of intervals)."""
    total = 0
    run_start = run_end = -1
    for start, end in sorted(intervals):
        if start > run_end:
            total += run_end - run_start
            run_start, run_end = start, end
        elif end > run_end:
            run_end = end
    return total + run_end - run_start


def _error_residue_bytes(errors: list[tree_sitter.Node]) -> int:
    """Bytes under ERROR nodes that no well-formed subtree inside them claims.

    One unexpanded macro can turn the whole root into an ERROR node while every function and
    class inside it still parses (libc++, nanobind: raw "bytes under ERROR" is 1.0 for >1% of
    real headers). So named, error-free children with structure of their own (and comments)
    are subtracted; stray tokens and bare identifiers the parser could not assemble count.
    """
    residue: list[tuple[int, int]] = []
    for err in errors:
        at = err.start_byte
        for child in err.children:
            if child.is_named and not child.is_error and (child.child_count or child.is_extra):
                if child.start_byte > at:
                    residue.append((at, child.start_byte))
                at = max(at, child.end_byte)
        if err.end_byte > at:
            residue.append((at, err.end_byte))
    return _union_bytes(residue)


def _declared_name(node: tree_sitter.Node) -> tree_sitter.Node | None:
    """The identifier a function definition / prototype declares, through pointer, reference
    and init declarators (`int *f()`, `T& operator=(...)`, `bool f() = delete`)."""
    decl = node.child_by_field_name("declarator")
    while decl is not None and decl.type != "function_declarator":
        nxt = decl.child_by_field_name("declarator")
        if nxt is None:  # reference_declarator has no field for its inner declarator
            nxt = next((c for c in decl.named_children if c.type.endswith("declarator")), None)
        decl = nxt
    return None if decl is None else decl.child_by_field_name("declarator")


def _directive_lines(data: bytes, starts: list[int]) -> list[tuple[int, int]]:
    """(start, end) of the line each conditional directive starts, backslash-newline
    continuations followed; it ends one past its newline, or at the end of the text."""
    lines = []
    for start in starts:
        at = start
        while True:
            nl = data.find(b"\n", at)
            if nl < 0:
                lines.append((start, len(data)))
                break
            prev = data[nl - 1] if nl > 0 else 0
            if prev == 0x5C or (prev == 0x0D and nl > 1 and data[nl - 2] == 0x5C):
                at = nl + 1  # `\` + newline: the directive goes on
                continue
            lines.append((start, nl + 1))
            break
    return lines


# Capture lists whose order matters (it breaks painting ties and picks names) are sorted by
# (start, end, type), because captures() does not list nodes in a stable order (seen on xsimd
# headers: spans that tie on (start, end) were labelled differently from run to run).
_BY_POSITION = operator.attrgetter("start_byte", "end_byte", "type")


def _regions_from_captures(
    data: bytes, caps: dict[str, list[tree_sitter.Node]], max_name_bytes: int
) -> FileRegions:
    rs: list[int] = []
    re_: list[int] = []
    rk: list[int] = []
    rn: list[str] = []
    sc_s: list[int] = []  # scope nodes (namespace / class / enum / function / lambda) set depth
    sc_e: list[int] = []

    def name_of(node: tree_sitter.Node | None) -> str:
        if node is None:
            return ""
        start = node.start_byte
        raw = data[start : min(node.end_byte, start + max_name_bytes)]
        return raw.decode("utf-8", "ignore")

    def head_and_body(node: tree_sitter.Node, head: int, body_kind: int, name: str) -> None:
        start, end = node.start_byte, node.end_byte
        sc_s.append(start)
        sc_e.append(end)
        body = node.child_by_field_name("body")
        if body is None:
            rs.append(start)
            re_.append(end)
            rk.append(head)
            rn.append(name)
        elif body_kind:
            cut = body.start_byte
            rs.extend((start, cut))
            re_.extend((cut, body.end_byte))
            rk.extend((head, body_kind))
            rn.extend((name, name))
        else:  # a namespace: its body is not a region of its own
            rs.append(start)
            re_.append(body.start_byte)
            rk.append(head)
            rn.append(name)

    def ordered(name: str) -> list[tree_sitter.Node]:
        nodes = caps.get(name)
        return sorted(nodes, key=_BY_POSITION) if nodes else []

    functions = ordered("function")
    for fn in functions:
        head_and_body(fn, _K["func_signature"], _K["func_body"], name_of(_declared_name(fn)))
    for lam in ordered("lambda"):
        head_and_body(lam, _K["func_signature"], _K["func_body"], "")
    classes = ordered("class")
    for cls in itertools.chain(classes, ordered("enum")):
        name = name_of(cls.child_by_field_name("name"))
        head_and_body(cls, _K["class_decl"], _K["class_body"], name)
    for ns in ordered("namespace"):
        head_and_body(ns, _K["namespace"], 0, name_of(ns.child_by_field_name("name")))
    for td in ordered("template"):
        params = td.child_by_field_name("parameters")
        rs.append(td.start_byte)
        re_.append(params.end_byte if params else td.end_byte)
        rk.append(_K["template_params"])
        rn.append("")
    for pp in ordered("pp_line"):
        rs.append(pp.start_byte)
        re_.append(pp.end_byte)
        rk.append(_K["preprocessor"])
        rn.append(name_of(pp.child_by_field_name("name") or pp.child_by_field_name("path")))
    # Prototypes: `int f(int);` at namespace/class scope. Inside a function body the same
    # shape is usually a variable (`Foo x(a);`, the most vexing parse), so `partition` drops
    # those once body coverage is known.
    proto_first = len(rs)
    for pr in ordered("prototype"):
        rs.append(pr.start_byte)
        re_.append(pr.end_byte)
        rk.append(_K["func_signature"])
        rn.append(name_of(_declared_name(pr)))

    # Leaves need their bytes only. No two leaves of one kind share a range, so (start, end)
    # orders them as (start, end, type) would.
    comments = sorted((c.start_byte, c.end_byte) for c in caps.get("comment", ()))
    directives = _directive_lines(data, sorted(d.start_byte for d in caps.get("pp_directive", ())))
    strings = sorted((s.start_byte, s.end_byte) for s in caps.get("string", ()))
    include_paths = caps.get("include_path")
    if include_paths and strings:
        # `#include "x.h"`: the path is part of the directive, not a string of the program.
        paths = {p.start_byte for p in include_paths}
        strings = [s for s in strings if s[0] not in paths]
    errors = caps.get("error", [])
    n = len(data)
    return FileRegions(
        size=n,
        starts=rs,
        ends=re_,
        kinds=rk,
        names=rn,
        prototypes=range(proto_first, len(rs)),
        comments=comments,
        directives=directives,
        strings=strings,
        scope_starts=sc_s,
        scope_ends=sc_e,
        parse_error_ratio=(_error_residue_bytes(errors) / n if errors and n else 0.0),
        n_error_nodes=len(errors),
        n_missing_nodes=len(caps.get("missing", ())),
        n_functions=len(functions),
        n_classes=len(classes),
    )


_IS_NOT_CODE = np.zeros(256, bool)
_IS_NOT_CODE[[_K["comment"], _K["doc_comment"], _K["string_literal"], _K["preprocessor"]]] = True
_IS_COMMENT = np.zeros(256, bool)
_IS_COMMENT[[_K["comment"], _K["doc_comment"]]] = True
_MAX_DEPTH = np.iinfo(np.uint16).max


@dataclass(frozen=True)
class SpanPartition:
    """The spans of several files, flat in file order: file i owns rows
    ``offsets[i]:offsets[i + 1]`` (starts and ends are offsets in its own text)."""

    offsets: np.ndarray  # int64, files + 1
    starts: np.ndarray  # int64
    ends: np.ndarray  # int64
    kinds: np.ndarray  # uint8
    depths: np.ndarray  # uint16
    names: np.ndarray  # object (str)
    comment_ratio: np.ndarray  # float64 per file
    max_nesting: np.ndarray  # int64 per file

    def file(self, i: int, regions: FileRegions) -> FileStructure:
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        return FileStructure(
            starts=self.starts[lo:hi],
            ends=self.ends[lo:hi],
            kinds=self.kinds[lo:hi],
            depths=self.depths[lo:hi],
            names=self.names[lo:hi].tolist(),
            parse_error_ratio=regions.parse_error_ratio,
            n_error_nodes=regions.n_error_nodes,
            n_missing_nodes=regions.n_missing_nodes,
            n_functions=regions.n_functions,
            n_classes=regions.n_classes,
            comment_ratio=float(self.comment_ratio[i]),
            max_nesting=int(self.max_nesting[i]),
        )

    def kind_bytes(self) -> np.ndarray:
        """Bytes covered by each kind id over all files (length len(CHUNK_KINDS))."""
        return np.bincount(
            self.kinds, weights=self.ends - self.starts, minlength=len(CHUNK_KINDS)
        ).astype(np.int64)


def partition(datas: list[bytes], files: list[FileRegions]) -> SpanPartition:
    """Span partitions of many files at once (see the module docstring for the contract).

    The files are laid end to end in one coordinate space, so every array pass runs once per
    call, not once per file. No region crosses a file boundary and every file boundary is a
    span boundary, so each file gets exactly the spans it would get alone."""
    n_files = len(files)
    chain = itertools.chain.from_iterable
    sizes = np.fromiter((f.size for f in files), np.int64, n_files)
    base = np.zeros(n_files + 1, np.int64)
    np.cumsum(sizes, out=base[1:])
    total = int(base[-1])

    def placed(values: list[list[int]], counts: list[int]) -> np.ndarray:
        """Per-file offsets, flat, moved to the file's place in the shared coordinates."""
        flat = np.fromiter(chain(values), np.int64, sum(counts))
        return flat + np.repeat(base[:-1], counts)

    def placed_pairs(pairs: list[list[tuple[int, int]]]) -> tuple[np.ndarray, np.ndarray]:
        counts = [len(p) for p in pairs]
        flat = np.fromiter(chain(chain(pairs)), np.int64, 2 * sum(counts)).reshape(-1, 2)
        flat += np.repeat(base[:-1], counts)[:, None]
        return flat[:, 0], flat[:, 1]

    # Entries: every region (file by file, each in its own order), then the leaves by group.
    region_counts = [len(f.starts) for f in files]
    r_s = placed([f.starts for f in files], region_counts)
    r_e = placed([f.ends for f in files], region_counts)
    r_k = np.fromiter(chain(f.kinds for f in files), np.uint8, r_s.size)
    n_regions = r_s.size
    d_s, d_e = placed_pairs([f.directives for f in files])
    c_s, c_e = placed_pairs([f.comments for f in files])
    s_s, s_e = placed_pairs([f.strings for f in files])
    scope_counts = [len(f.scope_starts) for f in files]
    sc_s = placed([f.scope_starts for f in files], scope_counts)
    sc_e = placed([f.scope_ends for f in files], scope_counts)

    arr = np.frombuffer(b"".join(datas), np.uint8)
    if c_s.size:
        # Comments: doc comments are `///` `//!` `/**` `/*!`, but not `////` rulers or `/**/`;
        # a byte past the end of the comment's file reads as 0.
        file_end = np.repeat(base[1:], [len(f.comments) for f in files])
        b1, b2, b3 = (
            np.where(c_s + k < file_end, arr[np.minimum(c_s + k, total - 1)], 0) for k in (1, 2, 3)
        )
        line_doc = (b1 == ord("/")) & (((b2 == ord("/")) & (b3 != ord("/"))) | (b2 == ord("!")))
        block_doc = (b1 == ord("*")) & (((b2 == ord("*")) & (b3 != ord("/"))) | (b2 == ord("!")))
        c_k = np.where(line_doc | block_doc, _K["doc_comment"], _K["comment"]).astype(np.uint8)
    else:
        c_k = np.zeros(0, np.uint8)

    starts = np.concatenate([r_s, d_s, c_s, s_s])
    ends = np.concatenate([r_e, d_e, c_e, s_e])
    kinds = np.concatenate(
        [
            r_k,
            np.full(d_s.size, _K["preprocessor"], np.uint8),
            c_k,
            np.full(s_s.size, _K["string_literal"], np.uint8),
        ]
    )

    bounds = np.sort(np.concatenate([base, starts, ends, sc_s, sc_e]))
    bounds = bounds[np.flatnonzero(np.diff(bounds, prepend=-1))]  # unique, sorted
    n_el = bounds.size - 1  # elementary intervals [bounds[i], bounds[i+1])
    if n_el <= 0:
        none = np.zeros(0, np.int64)
        return SpanPartition(
            offsets=np.zeros(n_files + 1, np.int64),
            starts=none,
            ends=none,
            kinds=np.zeros(0, np.uint8),
            depths=np.zeros(0, np.uint16),
            names=np.zeros(0, object),
            comment_ratio=np.zeros(n_files),
            max_nesting=np.zeros(n_files, np.int64),
        )

    def level(s: np.ndarray, e: np.ndarray) -> np.ndarray:
        opened = np.bincount(np.searchsorted(bounds, s), minlength=n_el + 1)
        opened -= np.bincount(np.searchsorted(bounds, e), minlength=n_el + 1)
        return np.cumsum(opened[:n_el])

    ia = np.searchsorted(bounds, starts)
    ib = np.searchsorted(bounds, ends)
    keep = ib > ia
    region_first = itertools.accumulate(region_counts, initial=0)
    prototypes = np.fromiter(
        chain(
            range(first + f.prototypes.start, first + f.prototypes.stop)
            for f, first in zip(files, region_first, strict=False)  # first has one more
        ),
        np.int64,
    )
    if prototypes.size:
        body = r_k == _K["func_body"]
        in_body = level(r_s[body], r_e[body])
        keep[prototypes] &= in_body[np.minimum(ia[prototypes], n_el - 1)] == 0

    # Paint outer regions first so inner ones win: sort by (start, -end), then by list order.
    label = np.full(n_el, -1, np.int64)
    order = np.lexsort((np.arange(n_regions), -r_e, r_s))
    order = order[keep[order]]
    for i, a, b in zip(order.tolist(), ia[order].tolist(), ib[order].tolist(), strict=True):
        label[a:b] = i
    # Leaves: nothing nests inside them but comments inside directive lines, so they are
    # painted last, in bulk, lines first.
    first_leaf = n_regions
    for size in (d_s.size, c_s.size, s_s.size):
        ids = np.arange(first_leaf, first_leaf + size)
        first_leaf += size
        ids = ids[keep[ids]]
        if ids.size:
            width = ib[ids] - ia[ids]
            first_el = np.repeat(ia[ids] - (np.cumsum(width) - width), width)
            label[first_el + np.arange(int(width.sum()))] = np.repeat(ids, width)
    depth = level(sc_s, sc_e)

    # A span starts where the label or the depth changes, and at every file's first byte.
    boundary = np.empty(n_el, bool)
    boundary[0] = True
    np.not_equal(label[1:], label[:-1], out=boundary[1:])
    boundary[1:] |= depth[1:] != depth[:-1]
    boundary[np.searchsorted(bounds, base[:-1][sizes > 0])] = True
    first = np.flatnonzero(boundary)
    span_starts = bounds[first]
    span_ends = np.append(bounds[first[1:]], total)
    lab = label[first]
    kind_of = np.append(kinds, np.uint8(_K["other"]))  # label -1 picks the appended "other"
    span_kinds = kind_of[lab]
    region_names = list(chain(f.names for f in files))
    if any(region_names):
        name_of_label = np.array([*region_names, *([""] * (kinds.size - n_regions + 1))], object)
        span_names = name_of_label[lab]
    else:
        span_names = np.full(lab.size, "", object)
    span_file = np.searchsorted(base, span_starts, side="right") - 1
    offsets = np.zeros(n_files + 1, np.int64)
    np.cumsum(np.bincount(span_file, minlength=n_files), out=offsets[1:])
    lengths = span_ends - span_starts

    # Brace nesting over code bytes only (braces in comments, strings, directives don't
    # count): each file's running sum over its code braces, where the nesting can change.
    max_nesting = np.zeros(n_files, np.int64)
    braces = np.flatnonzero((arr == ord("{")) | (arr == ord("}")))
    braces = braces[~_IS_NOT_CODE[span_kinds[np.searchsorted(span_starts, braces, "right") - 1]]]
    if braces.size:
        steps = np.where(arr[braces] == ord("{"), 1, -1)
        running = np.cumsum(steps)
        brace_file = np.searchsorted(base, braces, side="right") - 1
        seg = np.flatnonzero(np.diff(brace_file, prepend=-1))
        peak = np.maximum.reduceat(running, seg) - (running[seg] - steps[seg])
        max_nesting[brace_file[seg]] = np.maximum(peak, 0)
    comment_bytes = np.bincount(
        span_file, weights=np.where(_IS_COMMENT[span_kinds], lengths, 0), minlength=n_files
    )
    comment_ratio = np.divide(comment_bytes, sizes, out=np.zeros(n_files), where=sizes > 0)
    return SpanPartition(
        offsets=offsets,
        starts=span_starts - base[span_file],
        ends=span_ends - base[span_file],
        kinds=span_kinds.astype(np.uint8),
        depths=np.minimum(depth[first], _MAX_DEPTH).astype(np.uint16),
        names=span_names,
        comment_ratio=comment_ratio,
        max_nesting=max_nesting,
    )


def _list_column(offsets: np.ndarray, values: pa.Array) -> pa.Array:
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)


def run(table: pa.Table, config: EnrichConfig, build: BuildDatabase | None = None) -> GateResult:
    """Enrich one shard of `deduped_files`: kept rows get ENRICHED_FILES columns; files over
    the parse budget or over `max_parse_error_ratio` go to the ledger (no file is larger than
    the catalog's `max_file_bytes`: collection refused it).
    `build` (that source's parsed compile database) makes matching TUs `structure_source =
    build`; every other file is `syntax`."""
    parser = CppStructureParser(config.max_name_bytes, config.mask_macro_noise)
    stats: Counter[str] = Counter()
    # The UTF-8 bytes the parser needs, straight from Arrow (no str round trip).
    text = table.column("text")
    texts = text.cast(pa.large_binary() if pa.types.is_large_string(text.type) else pa.binary())
    datas: list[bytes] = texts.to_pylist()
    paths = table.column("path").to_pylist()
    kept_rows: list[int] = []
    kept_regions: list[FileRegions] = []
    drop_rows: list[int] = []
    drop_reasons: list[DropReason] = []
    drop_details: list[str | None] = []

    def drop(row: int, reason: DropReason, detail: str) -> None:
        drop_rows.append(row)
        drop_reasons.append(reason)
        drop_details.append(detail)

    stats["files_in"] += len(datas)
    for row, data in enumerate(datas):
        try:
            fr = parser.regions(data, config.parse_timeout_seconds)
        except ParseTimeout as exc:
            stats["timeouts"] += 1
            drop(row, DropReason.PARSE_TIMEOUT, str(exc))
            continue
        stats["files_parsed"] += 1
        stats["bytes_parsed"] += len(data)
        stats["error_files"] += fr.n_error_nodes > 0
        stats["error_nodes"] += fr.n_error_nodes
        stats["missing_nodes"] += fr.n_missing_nodes
        if fr.parse_error_ratio > config.max_parse_error_ratio:
            drop(
                row,
                DropReason.PARSE_ERROR_RATIO,
                f"parse_error_ratio {fr.parse_error_ratio:.3f} > max_parse_error_ratio "
                f"{config.max_parse_error_ratio} ({fr.n_error_nodes} ERROR nodes)",
            )
            continue
        kept_rows.append(row)
        kept_regions.append(fr)
    spans = partition([datas[r] for r in kept_rows], kept_regions)

    for kind, nbytes in zip(KIND_NAMES, spans.kind_bytes().tolist(), strict=True):
        stats[f"kind_bytes:{kind}"] += nbytes
    for reason in drop_reasons:
        stats[f"dropped:{reason}"] += 1

    contexts = [build.context_for(paths[r]) if build is not None else None for r in kept_rows]
    sources = ["build" if c is not None else "syntax" for c in contexts]
    stats["structure_source:build"] += sources.count("build")
    stats["structure_source:syntax"] += sources.count("syntax")
    stats["files_kept"] += len(kept_rows)

    base = table.take(pa.array(kept_rows, pa.int64()))
    new_columns: dict[str, pa.Array] = {
        "chunk_starts": _list_column(spans.offsets, pa.array(spans.starts, pa.int32())),
        "chunk_ends": _list_column(spans.offsets, pa.array(spans.ends, pa.int32())),
        "chunk_kinds": _list_column(spans.offsets, pa.array(spans.kinds, pa.uint8())),
        "chunk_depths": _list_column(spans.offsets, pa.array(spans.depths, pa.uint16())),
        "chunk_names": _list_column(spans.offsets, pa.array(spans.names, pa.string())),
        "parse_error_ratio": pa.array([f.parse_error_ratio for f in kept_regions], pa.float32()),
        "n_functions": pa.array([f.n_functions for f in kept_regions], pa.int32()),
        "n_classes": pa.array([f.n_classes for f in kept_regions], pa.int32()),
        "comment_ratio": pa.array(spans.comment_ratio.astype(np.float32)),
        "max_nesting": pa.array(spans.max_nesting, pa.int32()),
        "structure_source": pa.array(sources, pa.string()),
        "build_context": pa.array(contexts, BUILD_CONTEXT),
    }
    kept = extend(base, new_columns, ENRICH_FIELDS, "enriched_files")

    take = pa.array(drop_rows, pa.int64())
    license_col = table.column("license_expression").take(take).to_pylist()
    dropped = drops(
        table.column("source_id").take(take).to_pylist(),
        [paths[r] for r in drop_rows],
        drop_reasons,
        drop_details,
        license_expressions=license_col,
    )
    return GateResult(kept=kept, dropped=dropped, stats=stats)
