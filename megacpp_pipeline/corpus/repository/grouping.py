"""Which files of one source go into which repository document.

Each split is grouped apart (a file keeps the train/validation split it has in file mode, so
switching modes never moves a file into or out of validation). A split's files are one
document when their tokens fit `max_tokens`; otherwise the directory is split, recursively:

- a directory over the budget becomes its units in this order: its own files (the files
  directly in it), then each subdirectory by name; a subdirectory that fits is one unit, one
  that does not is split the same way into its own units;
- a directory's own files over the budget are cut, in their include order, into consecutive
  runs that each fit;
- consecutive units are then merged greedily while the merged tokens still fit, so siblings
  share a document instead of leaving many small ones;
- a single file over `max_tokens` is a document on its own, never cut here (the packer cuts
  it into seq_len pieces, as it does in file mode).

Every document is then put in include order (order.py). Files are graph indices, sorted by
path, so the plan is the same for the same files in any input order.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from dataclasses import dataclass

from megacpp_pipeline.corpus.repository.includes import IncludeGraph
from megacpp_pipeline.corpus.repository.order import include_order


@dataclass(frozen=True)
class PlannedDocument:
    split: str
    label: str  # the members' common directory ("." for the source root), "#k" if repeated
    members: tuple[int, ...]  # graph indices, in include order
    num_tokens: int  # the members' tokens (what the budget counted)
    broken: tuple[tuple[int, int], ...]  # include edges inside cycles placed includer-first
    cycles: tuple[tuple[int, ...], ...]


class _Splitter:
    def __init__(self, graph: IncludeGraph, tokens: Sequence[int], max_tokens: int) -> None:
        self.graph = graph
        self.tokens = tokens
        self.max_tokens = max_tokens

    def size(self, files: Sequence[int]) -> int:
        return sum(self.tokens[f] for f in files)

    def split(self, files: list[int], directory: str) -> list[list[int]]:
        if self.size(files) <= self.max_tokens:
            return [files]
        own: list[int] = []
        children: dict[str, list[int]] = {}
        cut = len(directory) + 1 if directory else 0
        for f in files:
            rest = self.graph.paths[f][cut:]
            if "/" in rest:
                children.setdefault(rest.split("/", 1)[0], []).append(f)
            else:
                own.append(f)
        units = self.cut_in_order(own) if own else []
        for name in sorted(children):
            child = f"{directory}/{name}" if directory else name
            units.extend(self.split(children[name], child))
        return self.merge(units)

    def cut_in_order(self, files: list[int]) -> list[list[int]]:
        if self.size(files) <= self.max_tokens:
            return [files]
        runs: list[list[int]] = []
        run: list[int] = []
        total = 0
        for f in include_order(files, self.graph.deps).order:
            if run and total + self.tokens[f] > self.max_tokens:
                runs.append(run)
                run, total = [], 0
            run.append(f)
            total += self.tokens[f]
        runs.append(run)
        return runs

    def merge(self, units: list[list[int]]) -> list[list[int]]:
        out: list[list[int]] = []
        current: list[int] = []
        total = 0
        for unit in units:
            size = self.size(unit)
            if current and total + size <= self.max_tokens:
                current = current + unit
                total += size
            else:
                if current:
                    out.append(current)
                current, total = list(unit), size
        if current:
            out.append(current)
        return out


def _common_dir(paths: Sequence[str]) -> str:
    common = posixpath.dirname(paths[0]).split("/")
    for p in paths[1:]:
        parts = posixpath.dirname(p).split("/")
        k = 0
        while k < min(len(common), len(parts)) and common[k] == parts[k]:
            k += 1
        common = common[:k]
    return "/".join(common) or "."


def plan_documents(
    graph: IncludeGraph, tokens: Sequence[int], splits: Sequence[str], max_tokens: int
) -> list[PlannedDocument]:
    """The documents of one source: `tokens[i]` and `splits[i]` belong to graph.paths[i]
    (each member's tokens as the document will hold them, path marker and separator
    included)."""
    if not len(tokens) == len(splits) == len(graph.paths):
        raise ValueError("tokens and splits must align with the graph's paths")
    splitter = _Splitter(graph, tokens, max_tokens)
    plans: list[PlannedDocument] = []
    seen: dict[str, int] = {}
    for split in sorted(set(splits)):
        files = [i for i in range(len(graph.paths)) if splits[i] == split]
        for group in splitter.split(files, ""):
            ordering = include_order(group, graph.deps)
            label = _common_dir([graph.paths[f] for f in group])
            seen[label] = seen.get(label, 0) + 1
            plans.append(
                PlannedDocument(
                    split=split,
                    label=label if seen[label] == 1 else f"{label}#{seen[label]}",
                    members=ordering.order,
                    num_tokens=splitter.size(group),
                    broken=ordering.broken,
                    cycles=ordering.cycles,
                )
            )
    return plans
