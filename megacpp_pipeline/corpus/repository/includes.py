"""Which files of one source include which: `#include` directives read from the text (never
preprocessed, never compiled) and resolved inside the source the way a compiler searches,
so repository documents can put every file after the files it includes.

Resolution of `#include "x"` / `#include <x>` from file F, first hit wins:
1. quoted only: F's own directory (what every compiler does first for quotes);
2. the include roots: those that contain F, deepest first, then the others nearest first
   (most leading directories shared with F), then in the order given. Angle includes
   resolve here too: header-only libraries include themselves with angles (nanobind's
   headers say `<nanobind/nanobind.h>` 31 times, pybind11's `<pybind11/pytypes.h>`), so
   skipping them would drop most of such a library's edges, while `<vector>` or
   `<Python.h>` match no file of the source and stay external;
3. a path suffix, for a name with a directory (`"pythonic/include/types/str.hpp"`): the
   file whose path ends with `/x`, the one sharing most directories with F on a tie, then
   by path. It finds roots nobody declared (pythran's headers say `<boost/config.hpp>` and
   `"pythonic/..."` relative to its package directory, named neither `include` nor `src`).
   A bare name (`"config.h"`) is never guessed this way: too many files share one.
Anything else (the standard library, Python.h, a generated header, a name that would leave
the source root) is external: counted, never an edge. `#include_next` is read as an angle
include that cannot resolve to the including file itself. Directives are read whether or
not an `#if` around them holds (nothing is preprocessed), so the graph is a superset of
what one configuration includes.

Default roots, when no compile database gives them: every directory named `include` or
`src` at any depth, then the source root. A nested tree keeps its own root that way
(pybind11's wheel has `pybind11/include/`, nanobind's `nanobind/include/` and
`nanobind/ext/robin_map/include/`), and "nearest first" makes a component prefer its own
root when two components ship a header of the same name.
"""

from __future__ import annotations

import posixpath
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

ROOT_DIR_NAMES = frozenset({"include", "src"})

# A directive at the start of a line (after blanks): `#  include <a/b.h>`, `#include "c.h"`.
# Names built by macros (`#include BOOST_PP_ITERATE()`) cannot be read without
# preprocessing and are skipped.
_DIRECTIVE = re.compile(
    r'^[ \t]*#[ \t]*(include|include_next)[ \t]*(?:<([^>\r\n]+)>|"([^"\r\n]+)")', re.MULTILINE
)


@dataclass(frozen=True)
class Include:
    name: str  # as written between the quotes or angle brackets
    angled: bool
    next_only: bool = False  # #include_next


@dataclass
class IncludeGraph:
    """One source's files (sorted by path) and, per file, the files it includes."""

    paths: tuple[str, ...]
    deps: tuple[tuple[int, ...], ...]  # deps[i]: indices of the files paths[i] includes
    rows: tuple[int, ...]  # rows[i]: where paths[i] was in the input
    # directives, resolved_relative / resolved_root / resolved_suffix, external
    stats: Counter[str] = field(default_factory=Counter)

    def edges(self) -> list[tuple[int, int]]:
        """(includer, included) pairs, sorted."""
        return [(i, j) for i, ds in enumerate(self.deps) for j in ds]


# What can hide a directive's line from the compiler: a /* */ comment or a raw string (a
# `//` cannot: a directive's `#` starts its line). Each directive is looked back from, to the
# nearest opener that is not inside a literal or a `//` comment on its own line; lexing
# whole files for this cost 8x the directive scan.
_LITERAL = re.compile(r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'')
_RAW_OPEN = re.compile(r'R"([^()\\\s"]{0,16})\(')


def _opens(text: str, at: int) -> bool:
    """Whether the `/*` or `R"` at `at` is code, not inside a literal or a `//` comment."""
    prefix = text[text.rfind("\n", 0, at) + 1 : at]
    if '"' not in prefix and "'" not in prefix and "/" not in prefix:
        return True
    bare = _LITERAL.sub("", prefix)
    return "//" not in bare and bare.count('"') % 2 == 0


def _hidden(text: str, pos: int) -> bool:
    """Whether `pos` lies inside a block comment or a raw string."""
    end = pos
    while (at := text.rfind("/*", 0, end)) >= 0:
        if _opens(text, at):
            if text.find("*/", at + 2, pos) < 0:
                return True
            break
        end = at
    end = pos
    while (at := text.rfind('R"', 0, end)) >= 0:
        m = _RAW_OPEN.match(text, at)
        if (
            m is not None
            and (at == 0 or not text[at - 1].isalnum() or text[at - 1] in "uUL8")
            and _opens(text, at)
        ):
            return text.find(f'){m.group(1)}"', m.end(), pos) < 0
        end = at
    return False


def scan_includes(text: str) -> list[Include]:
    """The `#include` directives of one file, in text order (not those inside a block
    comment or a raw string: a commented-out include is no edge, and inventing one made
    cycles that put files before what they really include)."""
    if "include" not in text:
        return []
    found = list(_DIRECTIVE.finditer(text))
    if found and ("/*" in text or 'R"' in text):
        found = [m for m in found if not _hidden(text, m.start())]
    out = []
    for m in found:
        angled = m.group(2) is not None
        name = (m.group(2) if angled else m.group(3)).strip().replace("\\", "/")
        out.append(Include(name, angled or m.group(1) == "include_next", m.group(1) != "include"))
    return out


def default_include_roots(paths: Sequence[str]) -> tuple[str, ...]:
    """Every directory named `include` or `src` (any depth, sorted), then the root ("")."""
    roots: set[str] = set()
    for path in paths:
        parts = path.split("/")[:-1]
        for k, part in enumerate(parts):
            if part in ROOT_DIR_NAMES:
                roots.add("/".join(parts[: k + 1]))
    return (*sorted(roots), "")


def _normal(path: str) -> str | None:
    """POSIX-normalized relative path, or None when it is absolute or leaves the root."""
    if not path or path.startswith("/"):
        return None
    norm = posixpath.normpath(path)
    if norm == ".." or norm.startswith("../") or norm == ".":
        return None
    return norm


def _join(directory: str, name: str) -> str | None:
    if name.startswith("/"):  # an absolute name is outside the tree, whatever the directory
        return None
    return _normal(f"{directory}/{name}" if directory else name)


def _contains(root: str, path: str) -> bool:
    return root == "" or path.startswith(root + "/")


def _shared_dirs(a: str, b: str) -> int:
    """Leading directories two file paths share."""
    n = 0
    for x, y in zip(a.split("/")[:-1], b.split("/")[:-1], strict=False):
        if x != y:
            break
        n += 1
    return n


class _Resolver:
    def __init__(self, paths: Sequence[str], roots: Sequence[str]) -> None:
        self.index = {p: i for i, p in enumerate(paths)}
        self.roots = [r.strip("/") for r in roots]
        by_base: dict[str, list[str]] = {}
        for p in paths:
            by_base.setdefault(p.rsplit("/", 1)[-1], []).append(p)
        self.by_base = by_base
        self.cache: dict[tuple[str, Include], tuple[int | None, str]] = {}

    def roots_for(self, includer: str) -> list[str]:
        """The declared roots, those holding the includer first (deepest first), then the
        others (nearest first), then the source root "" if declared: last, as the roots'
        docs say (it holds every file, so it would otherwise come before every root)."""
        inside = sorted(
            (r for r in self.roots if r and _contains(r, includer)),
            key=lambda r: -(r.count("/") + 1),
        )
        others = sorted(
            (r for r in self.roots if r and not _contains(r, includer)),
            key=lambda r: -_shared_dirs(f"{r}/_", includer),
        )
        return inside + others + ([""] if "" in self.roots else [])

    def resolve(self, includer: str, inc: Include) -> tuple[int | None, str]:
        """(file index or None, the rule that decided: relative|root|suffix|external)."""
        directory = posixpath.dirname(includer)
        # Everything below depends on the includer only through its directory (the roots
        # that contain it, the relative join), except #include_next's self-exclusion.
        key = (includer if inc.next_only else directory, inc)
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        result: tuple[int | None, str] = (None, "external")
        candidates: list[tuple[str | None, str]] = []
        if not inc.angled:
            candidates.append((_join(directory, inc.name), "relative"))
        candidates += [(_join(r, inc.name), "root") for r in self.roots_for(includer)]
        for path, rule in candidates:
            if path is not None and path in self.index and not (inc.next_only and path == includer):
                result = (self.index[path], rule)
                break
        else:
            name = _normal(inc.name)
            if name is not None and "/" in name:
                tail = "/" + name
                found = [
                    p
                    for p in self.by_base.get(name.rsplit("/", 1)[-1], ())
                    if p.endswith(tail) and not (inc.next_only and p == includer)
                ]
                if found:
                    best = min(found, key=lambda p: (-_shared_dirs(p, includer), p))
                    result = (self.index[best], "suffix")
        self.cache[key] = result
        return result


def include_graph(
    paths: Sequence[str], texts: Sequence[str], include_roots: Sequence[str] | None = None
) -> IncludeGraph:
    """The resolved include graph of one source's files. `include_roots` are directories
    relative to the source root (a compile database's, when the source has one); None means
    default_include_roots(paths). Paths are sorted first, so the graph does not depend on
    the input order."""
    if len(paths) != len(texts):
        raise ValueError(f"{len(paths)} paths but {len(texts)} texts")
    if len(set(paths)) != len(paths):
        dup = next(p for p in sorted(paths) if list(paths).count(p) > 1)
        raise ValueError(f"{dup}: path listed twice in one source")
    order = sorted(range(len(paths)), key=lambda i: paths[i])
    sorted_paths = [paths[i] for i in order]
    roots = default_include_roots(sorted_paths) if include_roots is None else include_roots
    resolver = _Resolver(sorted_paths, roots)
    stats: Counter[str] = Counter()
    deps: list[tuple[int, ...]] = []
    for k, i in enumerate(order):
        includer = sorted_paths[k]
        found: set[int] = set()
        for inc in scan_includes(texts[i]):
            stats["directives"] += 1
            target, rule = resolver.resolve(includer, inc)
            stats[f"resolved_{rule}" if target is not None else "external"] += 1
            if target is not None and target != k:
                found.add(target)
        deps.append(tuple(sorted(found)))
    stats["files"] += len(paths)
    stats["edges"] += sum(len(d) for d in deps)
    return IncludeGraph(tuple(sorted_paths), tuple(deps), tuple(order), stats)
