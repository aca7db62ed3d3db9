"""A labelled near-duplicate set of real-looking C++ headers, generated at run time.

Each family has an original in source `upstream` and variants in mirror sources: an exact
copy, a re-indented copy, a copy under another licence header, and copies with whole
function bodies rewritten until the true shingle Jaccard falls to about 0.85, 0.7 and 0.5.
Unrelated files of the same style (same generator, other names) are the hard negatives.
The true Jaccard is measured by a plain-Python reference shingler, independent of the
library's vectorized path.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa

from megacpp_pipeline.schemas import SCRUBBED_FILES, git_blob_sha, text_sha256

# Catalog order: the original comes first, so it is every cluster's representative.
SOURCES = (
    "upstream",
    "mirror-exact",
    "mirror-reindented",
    "mirror-relicensed",
    "mirror-edit85",
    "mirror-edit70",
    "mirror-edit50",
)
EDIT_TARGETS = {"edit85": 0.85, "edit70": 0.70, "edit50": 0.50}

_LICENSES = (
    "// Copyright (c) {year} {who}\n// SPDX-License-Identifier: MIT\n//\n"
    "// Permission is hereby granted, free of charge, to any person obtaining a copy\n"
    '// of this software and associated documentation files (the "Software").\n',
    "/*\n * Copyright {year} {who}. All rights reserved.\n *\n"
    " * Redistribution and use in source and binary forms, with or without\n"
    " * modification, are permitted provided that the following conditions are met.\n"
    " * SPDX-License-Identifier: BSD-3-Clause\n */\n",
    "//  Copyright {who} {year}.\n//  Distributed under the Boost Software License, "
    "Version 1.0.\n//  (See accompanying file LICENSE_1_0.txt or copy at\n"
    "//  http://www.boost.org/LICENSE_1_0.txt)\n",
    '// Licensed under the Apache License, Version 2.0 (the "License");\n'
    "// you may not use this file except in compliance with the License.\n"
    "// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception\n// (c) {year} {who}\n",
)
_WHO = ("The Kestrel Authors", "Mira Okafor", "Acme Compute GmbH", "J. Lindqvist")
_WORDS = (
    "buffer",
    "index",
    "count",
    "node",
    "value",
    "range",
    "alloc",
    "stream",
    "block",
    "chunk",
    "page",
    "slot",
    "token",
    "cursor",
    "offset",
    "limit",
    "span",
    "frame",
    "queue",
    "entry",
    "state",
    "scale",
    "weight",
    "shape",
    "stride",
    "batch",
    "cache",
    "epoch",
    "field",
    "key",
    "mask",
    "level",
    "order",
    "pivot",
    "root",
    "seed",
    "tail",
    "width",
)
_TYPES = ("int", "std::size_t", "double", "float", "bool", "std::int64_t", "std::uint32_t")
_INCLUDES = ("vector", "string", "cstddef", "cstdint", "algorithm", "utility", "memory", "array")


@dataclass(frozen=True)
class LabelledFile:
    source_id: str
    path: str
    text: str
    family: int  # files of one family derive from one original; unrelated files are alone
    kind: str  # original | unrelated | exact | reindented | relicensed | edit85 | ...
    jaccard: float  # true shingle Jaccard with the family's original


class _Writer:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def name(self) -> str:
        return "_".join(self.rng.sample(_WORDS, self.rng.choice((1, 2, 2, 3))))

    def expr(self, names: Sequence[str]) -> str:
        r = self.rng
        a, b = r.choice(names), r.choice(names)
        return r.choice(
            (
                f"{a} + {b} * {r.randint(2, 97)}",
                f"({a} - {b}) / {r.randint(2, 9)}",
                f"std::max({a}, {b} - {r.randint(1, 5)})",
                f"{a} < {b} ? {a} : {b}",
                f"static_cast<{r.choice(_TYPES)}>({a}) << {r.randint(1, 7)}",
                f"{a}.size() + {b}",
                f"{a}[{b} % {r.randint(3, 31)}]",
            )
        )

    def body(self, params: Sequence[str]) -> list[str]:
        r = self.rng
        names = list(params) or [self.name()]
        lines = []
        for _ in range(r.randint(4, 9)):
            kind = r.randrange(5)
            if kind == 0:
                local = self.name()
                lines.append(f"auto {local} = {self.expr(names)};")
                names.append(local)
            elif kind == 1:
                lines.append(f"if ({r.choice(names)} > {r.randint(0, 64)}) {{")
                lines.append(f"  {r.choice(names)} = {self.expr(names)};")
                lines.append("}")
            elif kind == 2:
                i = r.choice("ijk")
                lines.append(f"for (std::size_t {i} = 0; {i} < {r.choice(names)}.size(); ++{i}) {{")
                lines.append(f"  {r.choice(names)} += {self.expr([*names, i])};")
                lines.append("}")
            elif kind == 3:
                lines.append(f"{r.choice(names)} = {self.expr(names)};")
            else:
                lines.append(f"while ({r.choice(names)} != {r.choice(names)}) {{")
                lines.append(f"  --{r.choice(names)};")
                lines.append("}")
        lines.append(f"return {self.expr(names)};")
        return lines

    def function(self) -> tuple[str, list[str], str]:
        r = self.rng
        params = [self.name() for _ in range(r.randint(1, 3))]
        args = ", ".join(f"{r.choice(_TYPES)} {p}" for p in params)
        sig = f"{r.choice(_TYPES)} {self.name()}({args})"
        if r.random() < 0.3:
            sig = "inline " + sig
        doc = f"{r.choice(_WORDS).capitalize()} the {r.choice(_WORDS)} of the {r.choice(_WORDS)}."
        return sig, params, doc


@dataclass
class _Draft:
    licence: str
    head: str  # include guard, includes, namespaces, the class opening
    close: str  # the class's private members and closing brace
    tail: str
    functions: list[tuple[str, list[str], str]]  # signature, parameters, doc comment
    bodies: list[list[str]]
    n_methods: int  # the first n functions are methods, indented inside the class

    def text(self, licence: str | None = None) -> str:
        parts = []
        for i, ((sig, _, doc), body) in enumerate(zip(self.functions, self.bodies, strict=True)):
            ind = "  " if i < self.n_methods else ""
            inner = "\n".join(f"{ind}  {line}" for line in body)
            parts.append(f"{ind}/// {doc}\n{ind}{sig} {{\n{inner}\n{ind}}}\n")
        methods = "\n".join(parts[: self.n_methods])
        free = "\n".join(parts[self.n_methods :])
        return (licence or self.licence) + self.head + methods + self.close + free + self.tail

    def edited(self) -> _Draft:
        return _Draft(
            self.licence,
            self.head,
            self.close,
            self.tail,
            list(self.functions),
            list(self.bodies),
            self.n_methods,
        )


def _draft(writer: _Writer, project: str, module: str) -> _Draft:
    r = writer.rng
    licence = r.choice(_LICENSES).format(year=r.randint(2009, 2025), who=r.choice(_WHO))
    guard = f"{project}_{module}_HPP".upper()
    includes = "".join(f"#include <{h}>\n" for h in r.sample(_INCLUDES, r.randint(2, 5)))
    cls = "".join(w.capitalize() for w in writer.name().split("_"))
    head = (
        f"#ifndef {guard}\n#define {guard}\n\n{includes}\nnamespace {project} {{\n"
        f"namespace {module} {{\n\ntemplate <typename T>\nclass {cls} {{\n public:\n"
        f"  explicit {cls}(std::size_t capacity) : capacity_(capacity) {{}}\n\n"
    )
    close = "\n private:\n  std::size_t capacity_;\n  std::vector<T> items_;\n};\n\n"
    tail = f"\n}}  // namespace {module}\n}}  // namespace {project}\n\n#endif  // {guard}\n"
    n_methods = r.randint(4, 8)
    functions = [writer.function() for _ in range(n_methods + r.randint(5, 10))]
    bodies = [writer.body(params) for _, params, _ in functions]
    return _Draft(licence, head, close, tail, functions, bodies, n_methods)


_TOKEN = re.compile(r"[A-Za-z0-9_\x80-\U0010ffff]+|\S")
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


def reference_tokens(text: str) -> list[str]:
    """C++ lexical tokens as the library defines them, in plain Python."""
    return _TOKEN.findall(_COMMENT.sub(" ", text))


def reference_shingles(text: str, k: int = 5) -> set[str]:
    toks = reference_tokens(text)
    return {" ".join(toks[i : i + k]) for i in range(len(toks) - k + 1)}


def shingle_set(text: str, k: int = 5) -> set[tuple[str, ...]]:
    """reference_shingles as token tuples: one-to-one with the joined strings (tokens hold no
    space), so set sizes and Jaccards are the same, and several times cheaper to build."""
    toks = reference_tokens(text)
    return set(zip(*(toks[j:] for j in range(k)), strict=False))


def jaccard_of_sets(sa: set[tuple[str, ...]], sb: set[tuple[str, ...]]) -> float:
    inter = len(sa & sb)  # |A | B| = |A| + |B| - |A & B|, without building the union
    return inter / (len(sa) + len(sb) - inter) if sa or sb else 1.0


def true_jaccard(a: str, b: str, k: int = 5) -> float:
    return jaccard_of_sets(shingle_set(a, k), shingle_set(b, k))


def _reindent(text: str) -> str:
    out = []
    for line in text.split("\n"):
        stripped = line.lstrip(" ")
        depth = (len(line) - len(stripped)) // 2
        if stripped.endswith(") {") and depth <= 1:
            out.append("\t" * depth + stripped[:-2])
            out.append("\t" * depth + "{")
        else:
            out.append("\t" * depth + stripped.rstrip())
    return "\n".join(out).replace("\n\n", "\n\n\n")


def _edit_to(writer: _Writer, draft: _Draft, reference: set[tuple[str, ...]], target: float) -> str:
    """Rewrite statements of a few functions, one at a time, until the copy's true Jaccard
    with the original is within 0.02 of `target`. Each level starts from the original."""
    rng = writer.rng
    edited = draft.edited()
    edited.bodies = [list(b) for b in edited.bodies]
    slots = [
        (i, k)
        for i, body in enumerate(edited.bodies)
        for k, line in enumerate(body)
        if line.endswith(";") and "return" not in line
    ]
    text, j, careful = edited.text(), 1.0, False
    for _ in range(500):
        if j <= target + 0.02:
            break
        # Big steps while far from the target, single statements close to it.
        step = 1 if careful else max(1, int((j - target) * len(slots) / 3))
        undo = []
        for i, k in rng.sample(slots, min(step, len(slots))):
            before = edited.bodies[i][k]
            pad = before[: len(before) - len(before.lstrip())]
            names = [*edited.functions[i][1], writer.name()]
            edited.bodies[i][k] = f"{pad}{rng.choice(names)} = {writer.expr(names)};"
            undo.append((i, k, before))
        candidate = edited.text()
        cj = jaccard_of_sets(shingle_set(candidate), reference)
        if cj < target - 0.02:
            for i, k, before in reversed(undo):  # overshot: undo, continue with small steps
                edited.bodies[i][k] = before
            careful = True
            continue
        text, j = candidate, cj
    return text


def build(families: int = 30, unrelated: int = 30, seed: int = 7) -> list[LabelledFile]:
    """The labelled files in canonical order (catalog source order, then path)."""
    rng = random.Random(seed)
    writer = _Writer(rng)
    out: list[LabelledFile] = []
    for fam in range(families + unrelated):
        project = rng.choice(("kestrel", "orbit", "tessera", "quill", "lumen"))
        module = f"{rng.choice(_WORDS)}_{fam:03d}"
        path = f"include/{project}/{module}.hpp"
        draft = _draft(writer, project, module)
        original = draft.text()
        if fam >= families:
            out.append(LabelledFile("upstream", path, original, fam, "unrelated", 1.0))
            continue
        variants = {"original": original, "exact": original, "reindented": _reindent(original)}
        other = next(lic for lic in _LICENSES if not draft.licence.startswith(lic[:12]))
        variants["relicensed"] = draft.text(other.format(year=2024, who="Fork Contributors"))
        reference = shingle_set(original)
        for kind, target in EDIT_TARGETS.items():
            variants[kind] = _edit_to(writer, draft, reference, target)
        for kind, text in variants.items():
            source = "upstream" if kind == "original" else f"mirror-{kind}"
            j = 1.0 if text == original else jaccard_of_sets(reference, shingle_set(text))
            out.append(LabelledFile(source, path, text, fam, kind, j))
    order = {s: i for i, s in enumerate(SOURCES)}
    return sorted(out, key=lambda f: (order[f.source_id], f.path))


def scrubbed_table(files: Sequence[tuple[str, str, str]]) -> pa.Table:
    """A SCRUBBED_FILES table from (source_id, path, text) rows."""
    texts = [t for _, _, t in files]
    raw = [t.encode("utf-8") for t in texts]
    n = len(files)
    return pa.table(
        {
            "source_id": [s for s, _, _ in files],
            "path": [p for _, p, _ in files],
            "revision": [hashlib.sha1(s.encode()).hexdigest() for s, _, _ in files],
            "blob_sha": [git_blob_sha(b) for b in raw],
            "size": [len(b) for b in raw],
            "encoding": ["utf-8"] * n,
            "text": texts,
            "content_sha256": [text_sha256(t) for t in texts],
            "license_expression": ["MIT"] * n,
            "license_source": ["file"] * n,
            "license_decision": ["allowed"] * n,
            "license_detail": [None] * n,
            "scrub_replacements": pa.array([0] * n, pa.int32()),
        },
        schema=SCRUBBED_FILES,
    )


def shards(files: Sequence[LabelledFile], rows_per_shard: int = 64) -> Iterator[pa.Table]:
    rows = [(f.source_id, f.path, f.text) for f in files]
    for i in range(0, len(rows), rows_per_shard):
        yield scrubbed_table(rows[i : i + rows_per_shard])
