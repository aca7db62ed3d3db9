"""The benchmark index: decides which files share text with a pinned benchmark task.

The rule combines the published ones: a file is contaminated when it shares one n-gram with
a task (DeepSeek-Coder: 10-grams), n-grams over dedup's C++ lexer (comments and whitespace
never count) counted in words by default (DecontaminateConfig says why); n-grams found in
more than K tasks or in a list of trivial code are allow-listed (NeMo Curator ignores
n-grams seen more than 10 times); benchmark texts shorter than n match as a whole token
sequence (StarCoder's exact substring).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from megacpp_pipeline.corpus import minhash
from megacpp_pipeline.corpus.decontaminate.benchmarks import BenchmarkTask
from megacpp_pipeline.corpus.decontaminate.config import DecontaminateConfig
from megacpp_pipeline.corpus.decontaminate.ngrams import LexedBatch

I32 = npt.NDArray[np.int32]


@dataclass(frozen=True)
class _Postings:
    """Sorted unique hashes of windows of one length, each with the tasks that hold it:
    tasks of keys[i] are owners[offsets[i]:offsets[i + 1]]. `present` marks the top bits of
    every key (about 16 slots per key), so most windows are ruled out by one gather (the top
    bits of a polynomial hash mod 2**64 depend on every token, so they spread well)."""

    length: int
    keys: minhash.U64
    offsets: minhash.I64
    owners: I32
    present: npt.NDArray[np.bool_]
    shift: np.uint64

    @classmethod
    def from_pairs(
        cls, length: int, hashes: minhash.U64, tasks: I32, allowed: minhash.U64
    ) -> _Postings:
        order = np.lexsort((tasks, hashes))
        h, t = hashes[order], tasks[order]
        keep = np.ones(len(h), dtype=bool)
        keep[1:] = (h[1:] != h[:-1]) | (t[1:] != t[:-1])
        h, t = h[keep], t[keep]
        if len(allowed):
            out = np.isin(h, allowed)
            h, t = h[~out], t[~out]
        keys, counts = np.unique(h, return_counts=True)
        offsets = np.zeros(len(keys) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        bits = min(max(int(len(keys) * 16).bit_length(), 8), 26)
        shift = np.uint64(64 - bits)
        present = np.zeros(1 << bits, dtype=bool)
        present[(keys >> shift).astype(np.intp)] = True
        return cls(length, keys, offsets, t.astype(np.int32), present, shift)

    def lookup(self, hashes: minhash.U64) -> tuple[minhash.I64, minhash.I64]:
        """(positions in `hashes`, positions in `keys`) of the hashes that are keys."""
        maybe = np.flatnonzero(self.present[(hashes >> self.shift).astype(np.intp)])
        if len(maybe) == 0 or len(self.keys) == 0:
            return maybe, maybe
        at = np.searchsorted(self.keys, hashes[maybe])
        at[at == len(self.keys)] = 0
        hit = self.keys[at] == hashes[maybe]
        return maybe[hit], at[hit]


def _frequent(hashes: minhash.U64, tasks: I32, limit: int) -> minhash.U64:
    """Hashes held by more than `limit` distinct tasks."""
    if len(hashes) == 0:
        return hashes
    pairs = np.unique(np.stack([hashes, tasks.astype(np.uint64)], axis=1), axis=0)
    keys, counts = np.unique(pairs[:, 0], return_counts=True)
    return keys[counts > limit]


@dataclass(frozen=True)
class BenchmarkIndex:
    """Every benchmark's n-grams (64-bit hashes in sorted arrays: 12 bytes per n-gram and
    task) minus the allow list, plus the whole-text keys of texts shorter than n units."""

    ngram: int
    unit: str
    benchmarks: tuple[str, ...]  # benchmark ids, in catalog order
    task_benchmark: I32  # per task: position in `benchmarks`
    task_ids: tuple[str, ...]
    postings: tuple[_Postings, ...]  # the n-grams first, then short texts by length
    stats: Mapping[str, int]  # what the allow list and the short rule did, per benchmark
    fingerprint: str  # of the tasks and the index config: the gate's cache salt

    @classmethod
    def build(cls, tasks: Sequence[BenchmarkTask], config: DecontaminateConfig) -> BenchmarkIndex:
        benchmarks = tuple(dict.fromkeys(t.benchmark_id for t in tasks))
        position = {b: i for i, b in enumerate(benchmarks)}
        task_benchmark = np.asarray([position[t.benchmark_id] for t in tasks], dtype=np.int32)
        skip = [re.compile(p, re.MULTILINE) for p in config.skip_benchmark_lines]
        texts: list[str] = []
        owner: list[int] = []
        fingerprint = hashlib.sha256(json.dumps(config.index_fields(), sort_keys=True).encode())
        for i, task in enumerate(tasks):
            fingerprint.update(f"\0{task.benchmark_id}\0{task.task_id}".encode())
            for text in task.texts:
                fingerprint.update(b"\0" + text.encode())
                for pattern in skip:
                    text = pattern.sub("", text)
                texts.append(text)
                owner.append(i)
        text_task = np.asarray(owner, dtype=np.int32)
        batch = LexedBatch(texts, config.unit)
        trivial = LexedBatch(config.trivial_code, config.unit)
        n, limit = config.ngram, config.max_tasks_per_ngram

        grams = batch.windows(n)
        gram_task = text_task[grams.file]
        allowed = np.union1d(_frequent(grams.hashes, gram_task, limit), trivial.windows(n).hashes)
        postings = [_Postings.from_pairs(n, grams.hashes, gram_task, allowed)]
        units = batch.units_per_file()
        short = (units >= config.short_text_min) & (units < n)
        for m in sorted(set(units[short].tolist())):
            # A text of m < n units has one window of m: its key. It is an idiom when more
            # than K tasks hold it or it occurs inside trivial code.
            windows = batch.windows(m)
            whole = units[windows.file] == m
            hashes, holders = windows.hashes[whole], text_task[windows.file[whole]]
            allowed_m = np.union1d(_frequent(hashes, holders, limit), trivial.windows(m).hashes)
            postings.append(_Postings.from_pairs(m, hashes, holders, allowed_m))

        indexed = np.zeros(len(tasks), dtype=bool)
        for p in postings:
            indexed[p.owners] = True
        stats: dict[str, int] = {
            "ngrams_indexed": len(postings[0].keys),
            "ngrams_allow_listed": len(allowed),
            "short_texts_indexed": sum(len(p.keys) for p in postings[1:]),
        }
        too_short = (units > 0) & (units < min(config.short_text_min, n))
        for b, name in enumerate(benchmarks):
            in_b = task_benchmark == b
            stats[f"{name}:tasks"] = int(np.count_nonzero(in_b))
            stats[f"{name}:tasks_unmatchable"] = int(np.count_nonzero(in_b & ~indexed))
            stats[f"{name}:texts_too_short"] = int(np.count_nonzero(too_short & in_b[text_task]))
        return cls(
            ngram=n,
            unit=config.unit,
            benchmarks=benchmarks,
            task_benchmark=task_benchmark,
            task_ids=tuple(t.task_id for t in tasks),
            postings=tuple(postings),
            stats=stats,
            fingerprint=fingerprint.hexdigest()[:16],
        )

    @property
    def empty(self) -> bool:
        """Whether the index holds no window: it matches nothing."""
        return not any(len(p.keys) for p in self.postings)

    def match(self, texts: Sequence[str]) -> list[Contamination]:
        """Every (file, benchmark) pair that shares an indexed window, files by position."""
        if self.empty:
            return []  # no benchmark, or every window allow-listed: nothing to lex texts for
        batch = LexedBatch(texts, self.unit)
        file_, first, count, task = [], [], [], []
        for p in self.postings:
            hit, _ = p.lookup(batch.hashes(p.length))  # most windows end here, unhashed twice
            windows = batch.windows(p.length, hit)
            hit, at = p.lookup(windows.hashes)
            if len(hit) == 0:
                continue
            lo, hi = p.offsets[at], p.offsets[at + 1]
            per = hi - lo  # tasks holding each hit window
            owner_at = np.repeat(lo - (np.cumsum(per) - per), per) + np.arange(int(per.sum()))
            f = windows.file[hit]
            file_.append(np.repeat(f, per))
            # the window's first token, counted from the file's first token
            first.append(np.repeat(windows.first[hit] - batch.tokens.offsets[f], per))
            count.append(np.repeat(windows.count[hit], per))
            task.append(p.owners[owner_at])
        if not file_:
            return []
        return self._group(
            np.concatenate(file_),
            np.concatenate(first),
            np.concatenate(count),
            np.concatenate(task),
        )

    def _group(
        self, file_: minhash.I64, first: minhash.I64, count: minhash.I64, task: I32
    ) -> list[Contamination]:
        bench = self.task_benchmark[task]
        order = np.lexsort((first, bench, file_))
        file_, first, count = file_[order], first[order], count[order]
        task, bench = task[order], bench[order]
        cut = np.flatnonzero((np.diff(file_) != 0) | (np.diff(bench) != 0)) + 1
        out: list[Contamination] = []
        for lo, hi in zip([0, *cut.tolist()], [*cut.tolist(), len(file_)], strict=True):
            spans = sorted(set(zip(first[lo:hi].tolist(), count[lo:hi].tolist(), strict=True)))
            out.append(
                Contamination(
                    row=int(file_[lo]),
                    benchmark_id=self.benchmarks[int(bench[lo])],
                    task_ids=tuple(self.task_ids[t] for t in sorted(set(task[lo:hi].tolist()))),
                    token_spans=tuple(spans),
                )
            )
        return out


@dataclass(frozen=True)
class Contamination:
    """One file's matches with one benchmark."""

    row: int  # position of the file in what was matched
    benchmark_id: str
    task_ids: tuple[str, ...]
    token_spans: tuple[tuple[int, int], ...]  # (first token, tokens) of each matched window

    @property
    def shared(self) -> int:
        return len(self.token_spans)

    def detail(self, limit: int = 10) -> str:
        ids = ", ".join(self.task_ids[:limit])
        if len(self.task_ids) > limit:
            ids += f" and {len(self.task_ids) - limit} more"
        return f"{self.benchmark_id}: tasks {ids} ({self.shared} shared sequences)"
