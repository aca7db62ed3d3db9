"""The order of one document's files: every file after the files of the same document it
includes, ties by path (DeepSeek-Coder orders a repository by its dependencies too).

Cycles: the files are ordered by the strongly connected components of the include graph
restricted to the document (a topological order of the components, ties by each
component's first path), so a cycle's files stay together and no edge outside a cycle is
ever broken. Inside a cycle, files follow their include edges as far as the cycle allows:
the next file is the first by path whose included files are all placed; when none is, the
file that most unplaced files include, less the unplaced files it includes itself, goes
next (Eades, Lin and Smyth's greedy for few broken edges; ties by path), and its edges to
the files it includes that are not yet placed are the broken ones, reported.

Files are graph indices (IncludeGraph.paths is sorted), so "by path" is "by index".
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Ordering:
    order: tuple[int, ...]
    broken: tuple[tuple[int, int], ...]  # (includer, included) placed includer-first
    cycles: tuple[tuple[int, ...], ...]  # components of more than one file, sorted


def strongly_connected(nodes: Sequence[int], adj: dict[int, list[int]]) -> list[list[int]]:
    """Tarjan's components (iterative: include chains are deeper than Python's stack)."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    out: list[list[int]] = []
    for root in nodes:
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(adj[root]))]
        while work:
            v, edges = work[-1]
            for w in edges:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(adj[w])))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    u = work[-1][0]
                    low[u] = min(low[u], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    out.append(sorted(comp))
    return out


def _inside_cycle(
    comp: list[int], adj: dict[int, list[int]], broken: list[tuple[int, int]]
) -> list[int]:
    members = set(comp)
    waiting = {u: {v for v in adj[u] if v in members} for u in comp}
    dependents: dict[int, list[int]] = {u: [] for u in comp}
    for u in comp:
        for v in waiting[u]:
            dependents[v].append(u)
    ready = [u for u in comp if not waiting[u]]
    heapq.heapify(ready)
    left = set(comp)
    out: list[int] = []
    while left:
        if ready:
            u = heapq.heappop(ready)
        else:
            u = min(
                left,
                key=lambda x: (
                    len(waiting[x]) - sum(1 for w in dependents[x] if w in left),
                    x,
                ),
            )
            broken.extend((u, v) for v in sorted(waiting[u]))
            waiting[u] = set()
        left.discard(u)
        out.append(u)
        for w in dependents[u]:
            if w in left and u in waiting[w]:
                waiting[w].discard(u)
                if not waiting[w]:
                    heapq.heappush(ready, w)
    return out


def include_order(members: Sequence[int], deps: Sequence[Sequence[int]]) -> Ordering:
    """`members` (graph indices) in include order; `deps[i]` are the files i includes."""
    nodes = sorted(set(members))
    inside = set(nodes)
    adj = {u: [v for v in deps[u] if v in inside and v != u] for u in nodes}
    comps = strongly_connected(nodes, adj)
    comp_of = {u: c for c, comp in enumerate(comps) for u in comp}
    waiting: list[set[int]] = [set() for _ in comps]
    dependents: list[list[int]] = [[] for _ in comps]
    for u in nodes:
        for v in adj[u]:
            cu, cv = comp_of[u], comp_of[v]
            if cu != cv and cv not in waiting[cu]:
                waiting[cu].add(cv)
                dependents[cv].append(cu)
    ready = [(comp[0], c) for c, comp in enumerate(comps) if not waiting[c]]
    heapq.heapify(ready)
    order: list[int] = []
    broken: list[tuple[int, int]] = []
    while ready:
        _, c = heapq.heappop(ready)
        comp = comps[c]
        order.extend(comp if len(comp) == 1 else _inside_cycle(comp, adj, broken))
        for d in dependents[c]:
            waiting[d].discard(c)
            if not waiting[d]:
                heapq.heappush(ready, (comps[d][0], d))
    cycles = tuple(tuple(comp) for comp in sorted(comps) if len(comp) > 1)
    return Ordering(tuple(order), tuple(broken), cycles)
