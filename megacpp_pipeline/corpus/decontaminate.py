"""Benchmark decontamination after dedup: decides which files carry the text of a pinned
benchmark task (prompt, canonical solution, tests) and drops them, or cuts the matching spans
out (seed: evaluation data stays out of training data).

The rule combines the published ones: a file is contaminated when it shares one n-gram with
a task (DeepSeek-Coder: 10-grams), n-grams over dedup's C++ lexer (comments and whitespace
never count) counted in words by default (DecontaminateConfig says why); n-grams found in
more than K tasks or in a list of trivial code are allow-listed (NeMo Curator ignores
n-grams seen more than 10 times); benchmark texts shorter than n match as a whole token
sequence (StarCoder's exact substring); the excise action cuts the match plus a margin and
drops a file cut in more than 10 places (NeMo: 200 characters, 10 splits).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, field_validator

from megacpp_pipeline.core.catalog import BenchmarkSpec
from megacpp_pipeline.core.gate import GateResult
from megacpp_pipeline.core.ledger import DropReason, drops
from megacpp_pipeline.core.schemas import text_sha256
from megacpp_pipeline.corpus import minhash
from megacpp_pipeline.storage.versions import sha256_file

I32 = npt.NDArray[np.int32]

# benchmarks in the catalog ---------------------------------------------------------------


class BenchmarkError(ValueError):
    """A benchmark file does not match its entry; names the file, the field and the record."""

    def __init__(self, benchmark: str, file: Path, field: str, rule: str, line: int | None = None):
        where = f"{file}" + (f":{line}" if line is not None else "")
        super().__init__(f"benchmark {benchmark!r}: {where}: field {field}: {rule}")
        self.benchmark, self.file, self.field, self.rule, self.line = (
            benchmark,
            file,
            field,
            rule,
            line,
        )


@dataclass(frozen=True)
class BenchmarkTask:
    benchmark_id: str
    task_id: str
    texts: tuple[str, ...]  # one per BenchmarkSpec.fields entry, in that order ("" if null)


def verify_benchmark(spec: BenchmarkSpec, base_dir: Path) -> Path:
    """The benchmark file, after checking its sha256 against the pin (catalog load time)."""
    path = spec.path(base_dir)
    try:
        actual = sha256_file(path)
    except OSError as e:
        raise BenchmarkError(spec.id, path, "uri", f"cannot read ({e.strerror})") from None
    if actual != spec.sha256:
        raise BenchmarkError(spec.id, path, "sha256", f"pinned {spec.sha256}, file has {actual}")
    return path


def load_benchmark(spec: BenchmarkSpec, base_dir: Path) -> list[BenchmarkTask]:
    """Every task of the pinned file, verified before a byte of it is parsed."""
    path = verify_benchmark(spec, base_dir)
    records = _jsonl_records(spec, path) if spec.format == "jsonl" else _parquet_records(spec, path)
    tasks: list[BenchmarkTask] = []
    seen: set[str] = set()
    for number, record in records:
        if spec.id_field is None:
            task_id = str(number)
        elif record.get(spec.id_field) is None:
            raise BenchmarkError(spec.id, path, spec.id_field, "missing task id", number)
        else:
            task_id = str(record[spec.id_field])
        if task_id in seen:
            raise BenchmarkError(
                spec.id, path, spec.id_field or "-", f"task {task_id!r} twice", number
            )
        seen.add(task_id)
        texts = tuple(_field_text(spec, path, record, name, number) for name in spec.fields)
        tasks.append(BenchmarkTask(spec.id, task_id, texts))
    return tasks


def _jsonl_records(spec: BenchmarkSpec, path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise BenchmarkError(
                    spec.id, path, "(record)", f"not JSON ({e.msg})", number
                ) from None
            if not isinstance(record, dict):
                raise BenchmarkError(spec.id, path, "(record)", "not a JSON object", number)
            yield number, record


def _parquet_records(spec: BenchmarkSpec, path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    columns = [*spec.fields, *([spec.id_field] if spec.id_field else [])]
    names = set(pq.read_schema(path).names)
    for name in columns:
        if name not in names:
            raise BenchmarkError(spec.id, path, name, "no such column")
    table = pq.read_table(path, columns=columns)
    yield from enumerate(table.to_pylist(), 1)


def _field_text(
    spec: BenchmarkSpec, path: Path, record: Mapping[str, Any], name: str, number: int
) -> str:
    if name not in record:
        raise BenchmarkError(spec.id, path, name, "missing from the record", number)
    value = record[name]
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    # MBPP keeps its tests as a list of assert lines
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value)
    raise BenchmarkError(
        spec.id, path, name, f"expected text or a list of text, got {type(value).__name__}", number
    )


# the gate's config ------------------------------------------------------------------------

# Idioms common in real code that a benchmark may hold in fewer than K tasks.
DEFAULT_TRIVIAL_CODE = [
    "int main() { return 0; } int main(int argc, char** argv) { return 0; }",
    # index loops, nested every usual way, in each index type and increment style
    *(
        f"for ({t} i = 0; i < v.size(); {inc('i')}) {{ }} "
        f"for ({t} i = 1; i < v.size(); {inc('i')}) {{ for ({t} j = 0; j < i; {inc('j')}) {{ }} "
        f"for ({t} j = i + 1; j < v.size(); {inc('j')}) {{ }} "
        f"for ({t} j = 0; j < v.size(); {inc('j')}) {{ }} }}"
        for t in ("int", "size_t", "std::size_t")
        for inc in ("++{}".format, "{}++".format)
    ),
    "for (auto it = v.begin(); it != v.end(); ++it) {} for (const auto& x : v) {}",
    "std::sort(v.begin(), v.end()); std::reverse(v.begin(), v.end());",
    "std::vector<std::vector<int>> std::vector<std::string> std::map<std::string, int>",
    'std::cout << x << std::endl; std::cout << "\\n"; std::cerr << x << std::endl;',
    "if (a > b) { return a; } else { return b; } return std::max(a, b);",
]

_DEFAULT_SKIP_LINES = [
    r"^[ \t]*#[ \t]*(?:include|undef|pragma|import)\b.*$",
    r"^[ \t]*using[ \t]+namespace[ \t]+std[ \t]*;[ \t]*$",
]


class DecontaminateConfig(BaseModel):
    """Every threshold of the decontamination gate, with its default, in one place.

    Tokens are dedup's lexer's (minhash.token_hashes): identifiers, keywords and numbers
    whole, every punctuation byte a token of its own (`std::vector<int>& v` is 9 tokens, 4
    of them words). With unit "word" an n-gram is a run of n words and the punctuation
    between them, which is what the published pipelines' 10- and 13-grams count; with unit
    "token" every punctuation byte counts and 10 tokens span idioms such as
    `; for (size_t i = 0; i`. Measured by bench/bench_decontaminate.py against a 1,000-task
    benchmark: on the 4,138 demo files, 0 false positives by words and 76 by tokens; recall
    1.0 on verbatim and re-indented plantings either way.

    `short_text_min` 5 leaves one-parameter signatures such as `bool is_prime(int n)` (4
    words) out: matched whole they would catch ordinary code as often as a prompt."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ngram: int = Field(default=10, ge=2, le=64, description="units per n-gram")
    unit: Literal["word", "token"] = Field(
        default="word",
        description="word: identifiers, keywords, literals (punctuation rides along)",
    )
    max_tasks_per_ngram: int = Field(
        default=10, ge=1, description="an n-gram in more tasks than this is an idiom, not a task"
    )
    trivial_code: list[str] = Field(
        default_factory=lambda: list(DEFAULT_TRIVIAL_CODE),
        description="code whose n-grams (and short sequences) never count as a match",
    )
    skip_benchmark_lines: list[str] = Field(
        default_factory=lambda: list(_DEFAULT_SKIP_LINES),
        description="regexes of benchmark lines that are not evidence (includes, using)",
    )
    short_text_min: int = Field(
        default=5,
        ge=1,
        description="benchmark texts shorter than ngram match whole, from this many units",
    )
    action: Literal["drop", "excise"] = "drop"
    excise_margin: int = Field(
        default=200, ge=0, description="bytes cut each side of a match, widened to whole lines"
    )
    max_excisions: int = Field(
        default=10, ge=1, description="more cut spans than this drops the file"
    )

    @field_validator("skip_benchmark_lines")
    @classmethod
    def _compiles(cls, v: list[str]) -> list[str]:
        for pattern in v:
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(f"{pattern!r}: {e}") from None
        return v

    def index_fields(self) -> dict[str, Any]:
        """What the index depends on (the rest only changes what happens to a match)."""
        return self.model_dump(
            include={
                "ngram",
                "unit",
                "max_tasks_per_ngram",
                "trivial_code",
                "skip_benchmark_lines",
                "short_text_min",
            }
        )


# n-grams ----------------------------------------------------------------------------------

# The lexer hashes a token from its bytes alone, so each punctuation (or control) byte has
# one fixed hash: a token is a word unless its hash is one of these. A small table indexed
# by some bits of the hash, where the punctuation hashes do not collide, tests every token
# with one gather.
_PUNCTUATION = minhash.token_hashes(
    [" ".join(chr(b) for b in range(128) if chr(b) not in " \t\n\v\f\r_" and not chr(b).isalnum())]
).hashes
_TABLE_BITS = 12
_SHIFT = np.uint64(
    next(
        s
        for s in range(64 - _TABLE_BITS)
        if len(np.unique(_PUNCTUATION >> np.uint64(s) & np.uint64((1 << _TABLE_BITS) - 1)))
        == len(_PUNCTUATION)
    )
)
_SLOT = np.uint64((1 << _TABLE_BITS) - 1)
_PUNCT_TABLE = np.zeros(1 << _TABLE_BITS, dtype=np.uint64)
_PUNCT_TABLE[(_PUNCTUATION >> _SHIFT & _SLOT).astype(np.intp)] = _PUNCTUATION
_MULT = np.uint64(0x9E3779B97F4A7C15)  # odd: invertible mod 2**64
_MULT_INV = np.uint64(pow(int(_MULT), -1, 1 << 64))


def _is_word(hashes: minhash.U64) -> npt.NDArray[np.bool_]:
    return _PUNCT_TABLE[(hashes >> _SHIFT & _SLOT).astype(np.intp)] != hashes


def _powers(base: np.uint64, n: int) -> minhash.U64:
    out = np.empty(max(n, 1), dtype=np.uint64)
    out[0] = 1
    with np.errstate(over="ignore"):
        out[1:] = base
        np.cumprod(out, out=out)
    return out


@dataclass(frozen=True)
class _Windows:
    """Runs of m units inside one file: hash, file, and the lexer tokens they span."""

    hashes: minhash.U64
    file: minhash.I64
    first: minhash.I64  # first lexer token, counted from the start of the batch
    count: minhash.I64  # lexer tokens spanned (m in token mode)


class _Batch:
    """A batch of texts lexed once, ready to hash windows of any length: the units (every
    token, or the words only), their files, and prefix sums of the polynomial hash."""

    def __init__(self, texts: Sequence[str], unit: str) -> None:
        self.tokens = minhash.token_hashes(texts)
        t = self.tokens.hashes
        self.units = np.flatnonzero(_is_word(t)) if unit == "word" else np.arange(len(t))
        self.file_of = np.searchsorted(self.tokens.offsets, self.units, side="right") - 1
        n = len(t)
        with np.errstate(over="ignore"):
            self.prefix = np.zeros(n + 1, dtype=np.uint64)
            np.cumsum(t * _powers(_MULT, n), out=self.prefix[1:])
        self.inverse = _powers(_MULT_INV, n)

    def units_per_file(self) -> minhash.I64:
        return np.bincount(self.file_of, minlength=len(self.tokens.offsets) - 1)

    def hashes(self, m: int) -> minhash.U64:
        """The hash of the window of m units starting at each unit, over all the lexer
        tokens it spans (so punctuation between words counts for equality but not for the
        length); windows that run into the next file are hashed too, and dropped by
        `windows` or by the caller once they hit."""
        lo = self.units[: max(len(self.units) - m + 1, 0)]
        hi = self.units[m - 1 :] + 1
        with np.errstate(over="ignore"):
            return (self.prefix[hi] - self.prefix[lo]) * self.inverse[lo]

    def windows(self, m: int, at: minhash.I64 | None = None) -> _Windows:
        """The windows of m units that stay in one file (of those starting at units `at`)."""
        k = np.arange(max(len(self.units) - m + 1, 0)) if at is None else at
        k = k[self.file_of[k] == self.file_of[k + m - 1]]
        lo, hi = self.units[k], self.units[k + m - 1] + 1
        with np.errstate(over="ignore"):
            h = (self.prefix[hi] - self.prefix[lo]) * self.inverse[lo]
        return _Windows(h, self.file_of[k], lo, hi - lo)


# the index --------------------------------------------------------------------------------


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
        batch = _Batch(texts, config.unit)
        trivial = _Batch(config.trivial_code, config.unit)
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

    def match(self, texts: Sequence[str]) -> list[Contamination]:
        """Every (file, benchmark) pair that shares an indexed window, files by position."""
        batch = _Batch(texts, self.unit)
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


# the gate ---------------------------------------------------------------------------------

MATCHES_SCHEMA = pa.schema(
    [
        pa.field("source_id", pa.string(), nullable=False),
        pa.field("path", pa.string(), nullable=False),
        pa.field("action", pa.string(), nullable=False),  # dropped | excised
        pa.field("benchmark_id", pa.string(), nullable=False),
        pa.field("task_ids", pa.list_(pa.string()), nullable=False),
        pa.field("shared_sequences", pa.int32(), nullable=False),
        pa.field("excised_spans", pa.int32()),  # excise: cut spans after merging
        pa.field("excised_bytes", pa.int64()),
    ],
    metadata={"megacpp.table": "decontamination_matches", "megacpp.schema_version": "1"},
)


@dataclass(frozen=True)
class RescanFinding:
    source_id: str
    path: str
    benchmark_id: str
    task_ids: tuple[str, ...]
    shared: int

    def __str__(self) -> str:
        tasks = ", ".join(self.task_ids[:5])
        return f"{self.source_id}:{self.path}: {self.benchmark_id} tasks {tasks}"


def _slices(table: pa.Table) -> list[tuple[int, int]]:
    """Row ranges of about minhash.TOKEN_BATCH_BYTES of text (at least one row each)."""
    sizes = pc.binary_length(table["text"]).to_numpy(zero_copy_only=False).astype(np.int64)
    ends = np.cumsum(sizes)
    bounds, lo = [], 0
    while lo < len(sizes):
        base = ends[lo - 1] if lo else 0
        hi = max(int(np.searchsorted(ends, base + minhash.TOKEN_BATCH_BYTES, side="right")), lo + 1)
        bounds.append((lo, hi))
        lo = hi
    return bounds


def _matches(table: pa.Table, index: BenchmarkIndex) -> list[Contamination]:
    out: list[Contamination] = []
    for lo, hi in _slices(table):
        texts = table["text"].slice(lo, hi - lo).to_pylist()
        out += [
            Contamination(c.row + lo, c.benchmark_id, c.task_ids, c.token_spans)
            for c in index.match(texts)
        ]
    return out


def run(table: pa.Table, index: BenchmarkIndex, config: DecontaminateConfig) -> GateResult:
    """Kept rows (excised text where the action is excise), ledger rows for dropped files,
    stats, and the `matches` side table (MATCHES_SCHEMA)."""
    stats: Counter[str] = Counter()
    stats["files"] += table.num_rows
    stats["bytes"] += int(pc.sum(pc.binary_length(table["text"])).as_py() or 0)
    found = _matches(table, index)
    by_row: dict[int, list[Contamination]] = {}
    for c in found:
        by_row.setdefault(c.row, []).append(c)
    texts = table["text"]
    replaced: dict[int, str] = {}
    dropped: dict[int, str] = {}  # row -> ledger detail
    records: list[dict[str, Any]] = []
    for row, matches in by_row.items():
        detail = "; ".join(c.detail() for c in matches)
        cut = None
        if config.action == "excise":
            cut = _excise(texts[row].as_py(), matches, config, index)
        if cut is None:
            dropped[row] = detail
        else:
            replaced[row] = cut.text
            detail = f"excised {cut.spans} spans ({cut.bytes} bytes): {detail}"
        for c in matches:
            records.append(
                {
                    "source_id": table["source_id"][row].as_py(),
                    "path": table["path"][row].as_py(),
                    "action": "dropped" if cut is None else "excised",
                    "benchmark_id": c.benchmark_id,
                    "task_ids": list(c.task_ids),
                    "shared_sequences": c.shared,
                    "excised_spans": None if cut is None else cut.spans,
                    "excised_bytes": None if cut is None else cut.bytes,
                }
            )
            verdict = "dropped" if cut is None else "excised"
            stats[f"benchmark:{c.benchmark_id}:files_{verdict}"] += 1
        if cut is not None:
            stats["excised_files"] += 1
            stats["excised_bytes"] += cut.bytes
    stats[f"dropped_{DropReason.BENCHMARK_CONTAMINATION}"] += len(dropped)
    stats["kept"] += table.num_rows - len(dropped)
    keep = np.ones(table.num_rows, dtype=bool)
    keep[list(dropped)] = False
    kept = _with_texts(table, replaced).filter(pa.array(keep))
    rows = sorted(dropped)
    ledger = drops(
        table["source_id"].take(pa.array(rows, pa.int64())).to_pylist(),
        table["path"].take(pa.array(rows, pa.int64())).to_pylist(),
        [DropReason.BENCHMARK_CONTAMINATION] * len(rows),
        details=[dropped[r] for r in rows],
    )
    matches = pa.Table.from_pylist(records, schema=MATCHES_SCHEMA)
    return GateResult(kept=kept, dropped=ledger, stats=stats, extra={"matches": matches})


def rescan(table: pa.Table, index: BenchmarkIndex) -> list[RescanFinding]:
    """The blocking check's scan: every kept file that still shares a sequence with a task."""
    return [
        RescanFinding(
            table["source_id"][c.row].as_py(),
            table["path"][c.row].as_py(),
            c.benchmark_id,
            c.task_ids,
            c.shared,
        )
        for c in _matches(table, index)
    ]


def _with_texts(table: pa.Table, replaced: Mapping[int, str]) -> pa.Table:
    if not replaced:
        return table
    texts = table["text"].to_pylist()
    hashes = table["content_sha256"].to_pylist()
    for row, text in replaced.items():
        texts[row] = text
        hashes[row] = text_sha256(text)
    out = table.set_column(
        table.schema.get_field_index("text"),
        table.schema.field("text"),
        pa.array(texts, pa.string()),
    )
    i = out.schema.get_field_index("content_sha256")
    return out.set_column(i, out.schema.field(i), pa.array(hashes, pa.string()))


# excision ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Cut:
    text: str
    spans: int
    bytes: int


def _blanked(text: str) -> bytes:
    """The text's UTF-8 with comments blanked to spaces of the same length (so offsets stay
    those of the text and tokens those of the lexer), ending with a newline."""
    data = bytearray(text.encode("utf-8"))
    # minhash's comment pattern and block lexer, which are private there
    for m in minhash._COMMENT.finditer(bytes(data)):
        data[m.start() : m.end()] = b" " * (m.end() - m.start())
    return bytes(data + b"\n")


def token_offsets(text: str) -> tuple[minhash.U64, minhash.I64]:
    """The token hashes of minhash.token_hashes([text]) and the byte offset in the text's
    UTF-8 where each token starts."""
    return minhash._hash_token_block(_blanked(text))


def _excise(
    text: str, matches: Sequence[Contamination], config: DecontaminateConfig, index: BenchmarkIndex
) -> _Cut | None:
    """The text with every matched window cut, plus the margin, widened to whole lines; None
    when the file should be dropped instead (too many cuts, nothing left, still matching)."""
    data = text.encode("utf-8")
    blanked = _blanked(text)
    _, starts = minhash._hash_token_block(blanked)
    nexts = [*starts[1:].tolist(), len(data)]
    ranges = []
    for c in matches:
        for first, count in c.token_spans:
            last = first + count - 1
            # a token ends where the whitespace (or blanked comment) before the next begins
            end = int(starts[last]) + len(blanked[starts[last] : nexts[last]].rstrip())
            lo = max(int(starts[first]) - config.excise_margin, 0)
            hi = min(end + config.excise_margin, len(data))
            lo = data.rfind(b"\n", 0, lo) + 1
            nl = data.find(b"\n", hi)
            hi = len(data) if nl < 0 else nl + 1
            ranges.append((lo, hi))
    ranges.sort()
    merged: list[list[int]] = []
    for lo, hi in ranges:
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    if len(merged) > config.max_excisions:
        return None
    parts, at = [], 0
    for lo, hi in merged:
        parts.append(data[at:lo])
        at = hi
    parts.append(data[at:])
    out = b"".join(parts).decode("utf-8")
    if not out.strip() or index.match([out]):
        return None
    return _Cut(out, len(merged), len(data) - len(out.encode("utf-8")))


# what the UI shows ------------------------------------------------------------------------


def markdown_table(matches: pa.Table, index: BenchmarkIndex | None = None, top: int = 5) -> str:
    """Per benchmark: tasks matched, files dropped and excised, and the files with the most
    shared sequences (from the gate's `matches` side tables)."""
    rows = matches.to_pylist()
    benchmarks = list(index.benchmarks) if index is not None else []
    benchmarks += sorted({r["benchmark_id"] for r in rows} - set(benchmarks))
    if not benchmarks:
        return "no benchmark configured"
    lines = [
        "| benchmark | tasks | tasks matched | files dropped | files excised | top files |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name in benchmarks:
        mine = [r for r in rows if r["benchmark_id"] == name]
        tasks = {t for r in mine for t in r["task_ids"]}
        worst = sorted(mine, key=lambda r: (-r["shared_sequences"], r["source_id"], r["path"]))
        files = "<br>".join(
            f"`{r['source_id']}:{r['path']}` ({r['shared_sequences']}; "
            f"{', '.join(r['task_ids'][:3])})"
            for r in worst[:top]
        )
        total = index.stats.get(f"{name}:tasks", "") if index is not None else ""
        lines.append(
            f"| {name} | {total} | {len(tasks)} "
            f"| {sum(r['action'] == 'dropped' for r in mine)} "
            f"| {sum(r['action'] == 'excised' for r in mine)} | {files or '-'} |"
        )
    return "\n".join(lines)
