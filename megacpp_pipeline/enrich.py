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

from megacpp_pipeline.gate import GateResult
from megacpp_pipeline.ledger import DropReason, Stage, drops
from megacpp_pipeline.schemas import BUILD_CONTEXT, ENRICHED_FILES

if TYPE_CHECKING:
    from megacpp_pipeline.build_context import BuildDatabase

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
    # Files above this are not parsed at all (bounds memory and time per file).
    max_file_bytes: int = Field(default=8 * 1024 * 1024, gt=0)
    # Names are for humans and join keys, not payload: long qualified names are cut here.
    max_name_bytes: int = Field(default=256, gt=0)
    # Parse a view with parser-derailing macro invocations blanked (see `parse_view`).
    mask_macro_noise: bool = True


class ParseTimeout(Exception):
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
# macros between `class|struct|union` and the class name.
_CAPS = rb"[A-Z_][A-Z0-9_]{2,}"
_LINE_MACRO = re.compile(
    rb"(?m)^[ \t]*" + _CAPS + rb"(?:[ \t]*\([^;{}\n]*\))?[ \t]*(?=\r?\n(?![ \t\r\n]*\{))"
)
_HEAD_MACRO = re.compile(
    rb"\b(?:class|struct|union)((?:[ \t]+" + _CAPS + rb"(?:\([^()\n]*\))?)+)(?=[ \t]+[A-Za-z_])"
)


def parse_view(data: bytes) -> bytes:
    """`data` with parser-derailing macro invocations blanked; same length, same offsets."""

    def blank(m: re.Match[bytes]) -> bytes:
        return b" " * (m.end() - m.start())

    def blank_head(m: re.Match[bytes]) -> bytes:
        keyword = m.group(0)[: m.start(1) - m.start()]
        return keyword + b" " * (m.end(1) - m.start(1))

    return _HEAD_MACRO.sub(blank_head, _LINE_MACRO.sub(blank, data))


_NOT_CODE = np.array(
    [_K["comment"], _K["doc_comment"], _K["string_literal"], _K["preprocessor"]], np.uint8
)
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

    def structure(self, data: bytes, budget_seconds: float | None = None) -> FileStructure:
        tree = self.parse(parse_view(data) if self.mask_macro_noise else data, budget_seconds)
        cursor = tree_sitter.QueryCursor(self.query)
        # The query walk can cost far more than the parse on pathological nesting (100k
        # nested parentheses: 0.2 s to parse, minutes to query). Matches never start below
        # MAX_QUERY_START_DEPTH nodes, which bounds that walk; real code nests far less.
        # (captures' progress_callback would share the CPU budget, but it segfaults in
        # py-tree-sitter 0.26.1 on real headers.)
        cursor.set_max_start_depth(MAX_QUERY_START_DEPTH)
        # captures() lists each capture's nodes in an order that differs between two parses
        # of the same bytes (seen on xsimd headers): sort them, or spans that tie on
        # (start, end) would be labelled differently from run to run.
        caps = {
            name: sorted(nodes, key=lambda n: (n.start_byte, n.end_byte, n.type))
            for name, nodes in cursor.captures(tree.root_node).items()
        }
        return _structure_from_captures(data, caps, self.max_name_bytes)


def _span(nodes: list[tree_sitter.Node]) -> tuple[np.ndarray, np.ndarray]:
    return (
        np.fromiter((n.start_byte for n in nodes), np.int64, len(nodes)),
        np.fromiter((n.end_byte for n in nodes), np.int64, len(nodes)),
    )


def _covered(starts: np.ndarray, ends: np.ndarray) -> tuple[int, int]:
    """(bytes covered by the union of the intervals, deepest overlap) by an event sweep."""
    if starts.size == 0:
        return 0, 0
    pos = np.concatenate([starts, ends])
    delta = np.concatenate([np.ones_like(starts), -np.ones_like(ends)])
    order = np.lexsort((delta, pos))  # at one position, closings before openings
    pos, level = pos[order], np.cumsum(delta[order])
    covered = int(np.sum(np.diff(pos)[level[:-1] > 0]))
    return covered, int(level.max())


def _error_residue_bytes(errors: list[tree_sitter.Node]) -> int:
    """Bytes under ERROR nodes that no well-formed subtree inside them claims.

    One unexpanded macro can turn the whole root into an ERROR node while every function and
    class inside it still parses (libc++, nanobind: raw "bytes under ERROR" is 1.0 for >1% of
    real headers). So named, error-free children with structure of their own (and comments)
    are subtracted; stray tokens and bare identifiers the parser could not assemble count.
    """
    starts: list[int] = []
    ends: list[int] = []
    for err in errors:
        at = err.start_byte
        for child in err.children:
            if child.is_named and not child.is_error and (child.child_count or child.is_extra):
                if child.start_byte > at:
                    starts.append(at)
                    ends.append(child.start_byte)
                at = max(at, child.end_byte)
        if err.end_byte > at:
            starts.append(at)
            ends.append(err.end_byte)
    covered, _ = _covered(np.asarray(starts, np.int64), np.asarray(ends, np.int64))
    return covered


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


def _structure_from_captures(
    data: bytes, caps: dict[str, list[tree_sitter.Node]], max_name_bytes: int
) -> FileStructure:
    n = len(data)
    rs: list[int] = []
    re_: list[int] = []
    rk: list[int] = []
    rn: list[str] = []

    def add(start: int, end: int, kind: int, name: str) -> None:
        rs.append(start)
        re_.append(end)
        rk.append(kind)
        rn.append(name)

    def name_of(node: tree_sitter.Node | None) -> str:
        if node is None:
            return ""
        raw = data[node.start_byte : min(node.end_byte, node.start_byte + max_name_bytes)]
        return raw.decode("utf-8", "ignore")

    def head_and_body(node: tree_sitter.Node, head: int, body_kind: int | None, name: str) -> None:
        body = node.child_by_field_name("body")
        cut = node.end_byte if body is None else body.start_byte
        add(node.start_byte, cut, head, name)
        if body is not None and body_kind is not None:
            add(body.start_byte, body.end_byte, body_kind, name)

    functions = caps.get("function", [])
    for fn in functions:
        head_and_body(fn, _K["func_signature"], _K["func_body"], name_of(_declared_name(fn)))
    for lam in caps.get("lambda", []):
        head_and_body(lam, _K["func_signature"], _K["func_body"], "")
    classes = caps.get("class", [])
    for cls in itertools.chain(classes, caps.get("enum", [])):
        name = name_of(cls.child_by_field_name("name"))
        head_and_body(cls, _K["class_decl"], _K["class_body"], name)
    for ns in caps.get("namespace", []):
        head_and_body(ns, _K["namespace"], None, name_of(ns.child_by_field_name("name")))
    for td in caps.get("template", []):
        params = td.child_by_field_name("parameters")
        add(td.start_byte, params.end_byte if params else td.end_byte, _K["template_params"], "")
    for pp in caps.get("pp_line", []):
        name = name_of(pp.child_by_field_name("name") or pp.child_by_field_name("path"))
        add(pp.start_byte, pp.end_byte, _K["preprocessor"], name)

    # Prototypes: `int f(int);` at namespace/class scope. Inside a function body the same
    # shape is usually a variable (`Foo x(a);`, the most vexing parse), so those are dropped
    # below once body coverage is known.
    protos = caps.get("prototype", [])
    proto_first = len(rs)
    for pr in protos:
        add(pr.start_byte, pr.end_byte, _K["func_signature"], name_of(_declared_name(pr)))
    proto_end = len(rs)

    starts = np.asarray(rs, np.int64)
    ends = np.asarray(re_, np.int64)
    kinds = np.asarray(rk, np.uint8)
    names = rn

    arr = np.frombuffer(data, np.uint8)
    # Comments: doc comments are `///` `//!` `/**` `/*!`, but not `////` rulers or `/**/`.
    cs, ce = _span(caps.get("comment", []))
    if cs.size:
        padded = np.concatenate([arr, np.zeros(4, np.uint8)])
        b1, b2, b3 = padded[cs + 1], padded[cs + 2], padded[cs + 3]
        line_doc = (b1 == ord("/")) & (((b2 == ord("/")) & (b3 != ord("/"))) | (b2 == ord("!")))
        block_doc = (b1 == ord("*")) & (((b2 == ord("*")) & (b3 != ord("/"))) | (b2 == ord("!")))
        ckinds = np.where(line_doc | block_doc, _K["doc_comment"], _K["comment"]).astype(np.uint8)
    else:
        ckinds = np.zeros(0, np.uint8)
    # Conditional directives: the `#if ...` line (with its `\` continuations), not the block.
    ds, _ = _span(caps.get("pp_directive", []))
    if ds.size:
        nl = np.flatnonzero(arr == ord("\n"))
        prev = np.where(nl > 0, arr[np.maximum(nl - 1, 0)], 0)
        prev2 = np.where(nl > 1, arr[np.maximum(nl - 2, 0)], 0)
        continued = (prev == ord("\\")) | ((prev == ord("\r")) & (prev2 == ord("\\")))
        line_ends = nl[~continued]
        at = np.searchsorted(line_ends, ds)
        de = np.where(at < line_ends.size, line_ends[np.minimum(at, line_ends.size - 1)] + 1, n)
    else:
        de = np.zeros(0, np.int64)
    ss, se = _span(caps.get("string", []))
    # `#include "x.h"`: the path is part of the directive, not a string of the program.
    inc_s, _ = _span(caps.get("include_path", []))
    if inc_s.size and ss.size:
        program = ~np.isin(ss, inc_s)
        ss, se = ss[program], se[program]
    leaf_first = len(rs)  # regions from here on are leaves: nothing nests inside them but
    # comments inside directive lines, so they are painted last, in bulk, lines first.
    starts = np.concatenate([starts, cs, ds, ss])
    ends = np.concatenate([ends, ce, de, se])
    kinds = np.concatenate(
        [
            kinds,
            ckinds,
            np.full(ds.size, _K["preprocessor"], np.uint8),
            np.full(ss.size, _K["string_literal"], np.uint8),
        ]
    )
    names = names + [""] * (cs.size + ds.size + ss.size)

    # Scopes set the depth: namespace / class / enum / function / lambda nodes.
    scope_nodes = [
        *caps.get("namespace", []),
        *classes,
        *caps.get("enum", []),
        *functions,
        *caps.get("lambda", []),
    ]
    sc_s, sc_e = _span(scope_nodes)

    bounds = np.unique(np.concatenate([[0, n], starts, ends, sc_s, sc_e]))
    bounds = bounds[(bounds >= 0) & (bounds <= n)]
    n_el = bounds.size - 1  # elementary intervals [bounds[i], bounds[i+1])

    def level(s: np.ndarray, e: np.ndarray) -> np.ndarray:
        ev = np.zeros(n_el + 1, np.int32)
        np.add.at(ev, np.searchsorted(bounds, s), 1)
        np.add.at(ev, np.searchsorted(bounds, e), -1)
        return np.cumsum(ev)[:n_el]

    ia = np.searchsorted(bounds, starts)
    ib = np.searchsorted(bounds, ends)
    keep = ib > ia
    if proto_end > proto_first:
        body = kinds == _K["func_body"]
        in_body = level(starts[body], ends[body])
        pidx = np.arange(proto_first, proto_end)
        keep[pidx] &= in_body[np.minimum(ia[pidx], n_el - 1)] == 0

    # Paint outer regions first so inner ones win: sort by (start, -end), then by list order.
    order = np.lexsort((np.arange(leaf_first), -ends[:leaf_first], starts[:leaf_first]))
    order = order[keep[order]]
    label = np.full(n_el, -1, np.int64)
    for i, a, b in zip(order.tolist(), ia[order].tolist(), ib[order].tolist(), strict=True):
        label[a:b] = i
    leaf_groups = (
        np.arange(leaf_first + cs.size, leaf_first + cs.size + ds.size),  # directive lines
        np.arange(leaf_first, leaf_first + cs.size),  # comments
        np.arange(leaf_first + cs.size + ds.size, starts.size),  # strings
    )
    for ids in leaf_groups:
        ids = ids[keep[ids]]
        width = ib[ids] - ia[ids]
        first_el = np.repeat(ia[ids] - (np.cumsum(width) - width), width)
        label[first_el + np.arange(int(width.sum()))] = np.repeat(ids, width)
    depth = level(sc_s, sc_e)

    if n_el > 0:
        change = np.flatnonzero((label[1:] != label[:-1]) | (depth[1:] != depth[:-1])) + 1
        first = np.concatenate([[0], change])
    else:
        first = np.zeros(0, np.int64)
    span_starts = bounds[first]
    span_ends = np.append(bounds[first[1:]], n) if first.size else first
    lab = label[first]
    kind_of = np.append(kinds, np.uint8(_K["other"]))  # label -1 picks the appended "other"
    name_of_label = np.array([*names, ""], dtype=object)
    span_kinds = kind_of[lab]
    span_names = name_of_label[lab].tolist()

    err_bytes = _error_residue_bytes(caps.get("error", []))
    lengths = span_ends - span_starts
    # Brace nesting over code bytes only (braces in comments, strings, directives don't count).
    leafy = np.isin(span_kinds, _NOT_CODE)
    braces = (arr == ord("{")).astype(np.int32) - (arr == ord("}"))
    braces[np.repeat(leafy, lengths)] = 0
    max_nesting = max(0, int(np.cumsum(braces).max())) if n else 0
    comment_bytes = int(
        lengths[(span_kinds == _K["comment"]) | (span_kinds == _K["doc_comment"])].sum()
    )
    return FileStructure(
        starts=span_starts,
        ends=span_ends,
        kinds=span_kinds.astype(np.uint8),
        depths=np.minimum(depth[first], np.iinfo(np.uint16).max).astype(np.uint16),
        names=span_names,
        parse_error_ratio=err_bytes / n if n else 0.0,
        n_error_nodes=len(caps.get("error", [])),
        n_missing_nodes=len(caps.get("missing", [])),
        n_functions=len(functions),
        n_classes=len(classes),
        comment_ratio=comment_bytes / n if n else 0.0,
        max_nesting=max_nesting,
    )


def _list_column(parts: list[np.ndarray], value_type: pa.DataType) -> pa.Array:
    offsets = np.zeros(len(parts) + 1, np.int32)
    np.cumsum([p.size for p in parts], out=offsets[1:])
    values = np.concatenate(parts) if parts else np.zeros(0)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, value_type))


def run(table: pa.Table, config: EnrichConfig, build: BuildDatabase | None = None) -> GateResult:
    """Enrich one shard of `deduped_files`: kept rows get ENRICHED_FILES columns; files over
    `max_file_bytes`, over the parse budget or over `max_parse_error_ratio` go to the ledger.
    `build` (that source's parsed compile database) makes matching TUs `structure_source =
    build`; every other file is `syntax`."""
    parser = CppStructureParser(config.max_name_bytes, config.mask_macro_noise)
    stats: Counter[str] = Counter()
    texts = table.column("text").to_pylist()
    paths = table.column("path").to_pylist()
    structures: list[FileStructure] = []
    kept_rows: list[int] = []
    drop_rows: list[int] = []
    drop_reasons: list[DropReason] = []
    drop_details: list[str | None] = []

    def drop(row: int, reason: DropReason, detail: str) -> None:
        drop_rows.append(row)
        drop_reasons.append(reason)
        drop_details.append(detail)

    kind_bytes = np.zeros(len(CHUNK_KINDS), np.int64)
    stats["files_in"] += len(texts)
    for row, text in enumerate(texts):
        data = text.encode("utf-8")
        if len(data) > config.max_file_bytes:
            detail = f"{len(data)} bytes > max_file_bytes {config.max_file_bytes}: not parsed"
            drop(row, DropReason.TOO_LARGE, detail)
            continue
        try:
            fs = parser.structure(data, config.parse_timeout_seconds)
        except ParseTimeout as exc:
            stats["timeouts"] += 1
            drop(row, DropReason.PARSE_TIMEOUT, str(exc))
            continue
        stats["files_parsed"] += 1
        stats["bytes_parsed"] += len(data)
        stats["error_files"] += fs.n_error_nodes > 0
        stats["error_nodes"] += fs.n_error_nodes
        stats["missing_nodes"] += fs.n_missing_nodes
        if fs.parse_error_ratio > config.max_parse_error_ratio:
            drop(
                row,
                DropReason.PARSE_ERROR_RATIO,
                f"parse_error_ratio {fs.parse_error_ratio:.3f} > max_parse_error_ratio "
                f"{config.max_parse_error_ratio} ({fs.n_error_nodes} ERROR nodes)",
            )
            continue
        kept_rows.append(row)
        structures.append(fs)
        kind_bytes += fs.kind_bytes()

    for kind, nbytes in zip(KIND_NAMES, kind_bytes.tolist(), strict=True):
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
        "chunk_starts": _list_column([s.starts for s in structures], pa.int32()),
        "chunk_ends": _list_column([s.ends for s in structures], pa.int32()),
        "chunk_kinds": _list_column([s.kinds for s in structures], pa.uint8()),
        "chunk_depths": _list_column([s.depths for s in structures], pa.uint16()),
        "chunk_names": pa.array([s.names for s in structures], pa.list_(pa.string())),
        "parse_error_ratio": pa.array([s.parse_error_ratio for s in structures], pa.float32()),
        "n_functions": pa.array([s.n_functions for s in structures], pa.int32()),
        "n_classes": pa.array([s.n_classes for s in structures], pa.int32()),
        "comment_ratio": pa.array([s.comment_ratio for s in structures], pa.float32()),
        "max_nesting": pa.array([s.max_nesting for s in structures], pa.int32()),
        "structure_source": pa.array(sources, pa.string()),
        "build_context": pa.array(contexts, BUILD_CONTEXT),
    }
    columns = [
        new_columns[f.name] if f.name in new_columns else base.column(f.name)
        for f in ENRICHED_FILES
    ]
    kept = pa.Table.from_arrays(columns, schema=ENRICHED_FILES)

    take = pa.array(drop_rows, pa.int64())
    license_col = table.column("license_expression").take(take).to_pylist()
    dropped = drops(
        table.column("source_id").take(take).to_pylist(),
        [paths[r] for r in drop_rows],
        Stage.ENRICH,
        drop_reasons,
        drop_details,
        license_expressions=license_col,
    )
    return GateResult(kept=kept, dropped=dropped, stats=stats)
