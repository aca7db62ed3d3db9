"""The quality gate: drops C/C++ files that would teach a code model little, by the per-file
rules published code pipelines use (OpenCoder's C++ rules, StarCoder's comment ratio and
encoded-data filter). Each rule has a name, thresholds in QualityConfig, and drops with
reason `low_quality` and a detail naming the rule and the value it measured.

Defaults are measured (bench/bench_quality.py) on the demo wheels and on Debian's libc++,
Boost and nlohmann headers, and set so that well-kept library headers stay; where they
depart from the published figure, the field's comment says why.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field, model_validator

from megacpp_pipeline.core import schemas
from megacpp_pipeline.core.errors import FieldedError
from megacpp_pipeline.core.gate import GateResult
from megacpp_pipeline.core.ledger import DropReason, drops
from megacpp_pipeline.gates import cpp_text


class QualityConfig(BaseModel):
    """Every threshold of the quality rules, with its default, in one place. Fractions of
    lines count code lines: non-blank once comments are cut."""

    model_config = ConfigDict(extra="forbid")

    # OpenCoder: more than one `main` definition (several programs pasted in one file).
    max_main_definitions: int = Field(default=1, ge=1)
    # OpenCoder: > 80% preprocessor lines. As published it drops 20% of Boost, 10% of libc++
    # and 11% of nlohmann (forwarding, config and macro-library headers are all directives),
    # so it judges only long files: a short all-directive header is normal.
    max_preprocessor_fraction: float = Field(default=0.8, ge=0, le=1)
    preprocessor_min_code_lines: int = Field(default=500, ge=0)
    # OpenCoder: > 40% print lines (printf, puts, std::cout <<, fmt::print, LOG(...)).
    max_print_fraction: float = Field(default=0.4, ge=0, le=1)
    # Lines with no name on them: only braces, punctuation and literals. Library headers
    # stay under 0.6 but for pure tables (primes, Sobol direction numbers).
    max_no_logic_fraction: float = Field(default=0.85, ge=0, le=1)
    # OpenCoder's duplicated 5-gram character fraction (0.8), counted as the share of code
    # characters inside a whitespace-word 5-gram seen earlier in the same file. At 0.8 it
    # drops hand-written libc++ headers (<limits>, <codecvt> measure 0.82); above 0.85 are
    # Boost's preprocessed / arity-expanded files, the repetition the rule is meant for.
    max_repeated_5gram_fraction: float = Field(default=0.85, ge=0, le=1)
    # Embedded blobs: numeric arrays (8+ comma-separated literals), \x / octal / \u escape
    # runs and base64-like runs of 64+ characters, as StarCoder's encoded-data filter. A file
    # is dropped when such data is most of it and at least StarCoder's 1024 characters.
    max_data_fraction: float = Field(default=0.85, ge=0, le=1)
    min_data_chars: int = Field(default=1024, ge=0)
    # StarCoder keeps comment/characters in [0.01, 0.8]. The lower bound is off: 0.01 drops
    # 17% of pythran's own headers (no comment, not even a licence line). The upper bound
    # at 0.8 drops documented headers (Beast, libc++'s synopsis headers); 0.95 keeps them
    # and drops files that are nearly all comment.
    min_comment_ratio: float = Field(default=0.0, ge=0, le=1)
    max_comment_ratio: float = Field(default=0.95, ge=0, le=1)

    @model_validator(mode="after")
    def _bounds_ordered(self) -> QualityConfig:
        if self.min_comment_ratio > self.max_comment_ratio:
            raise ValueError(
                f"min_comment_ratio {self.min_comment_ratio} > "
                f"max_comment_ratio {self.max_comment_ratio}"
            )
        return self


class QualityInputError(FieldedError, ValueError):
    """The table handed to the gate lacks columns of normalized_files."""

    def __init__(self, missing: list[str]) -> None:
        super().__init__(f"quality input lacks normalized_files column(s): {', '.join(missing)}")
        self.missing = missing


@dataclass(frozen=True)
class QualityMeasures:
    """What the rules read, per file (UTF-8 bytes and lines), aligned with the texts."""

    bytes: np.ndarray
    comment_bytes: np.ndarray
    code_lines: np.ndarray  # non-blank lines once comments are cut
    preprocessor_lines: np.ndarray  # directives and their continuation lines
    print_lines: np.ndarray
    no_logic_lines: np.ndarray
    main_definitions: np.ndarray
    data_bytes: np.ndarray
    word_bytes: np.ndarray  # code bytes outside whitespace
    repeated_5gram_bytes: np.ndarray  # of word_bytes, inside a 5-gram seen earlier


@dataclass(frozen=True)
class RuleOutcome:
    rule: str
    values: np.ndarray  # the measured value per file
    fires: np.ndarray  # bool per file
    describe: Callable[[float], str]  # the ledger detail for one measured value


RULES = (
    "multiple_main",
    "print_fraction",
    "data_table",
    "no_logic_fraction",
    "repeated_5grams",
    "preprocessor_fraction",
    "comment_ratio",
)  # the order in which they are tried: a file's reason is the first that fires


def run(table: pa.Table, config: QualityConfig) -> GateResult:
    """Keep the files no rule fires on (schema unchanged); ledger the others."""
    missing = [name for name in schemas.NORMALIZED_FILES.names if name not in table.column_names]
    if missing:
        raise QualityInputError(missing)
    n = table.num_rows
    texts = cpp_text.one_array(table.column("text"))
    measures = measure(texts)
    outcomes = evaluate(measures, config)

    reason_rule = np.full(n, -1, dtype=np.int64)
    for k, outcome in enumerate(outcomes):
        reason_rule[(reason_rule < 0) & outcome.fires] = k
    dropped_rows = np.flatnonzero(reason_rule >= 0)
    details = [
        outcomes[k].describe(float(outcomes[k].values[i]))
        for i, k in zip(dropped_rows.tolist(), reason_rule[dropped_rows].tolist(), strict=True)
    ]
    take = pa.array(dropped_rows, pa.int64())
    dropped = drops(
        table.column("source_id").take(take).to_pylist(),
        table.column("path").take(take).to_pylist(),
        [DropReason.LOW_QUALITY] * len(dropped_rows),
        details=details,
    )
    keep = reason_rule < 0
    kept = table.filter(pa.array(keep))

    stats: Counter[str] = Counter()
    stats["files_in"] = n
    stats["bytes_in"] = int(measures.bytes.sum())
    stats["files_kept"] = int(keep.sum())
    stats["bytes_kept"] = int(measures.bytes[keep].sum())
    for k, outcome in enumerate(outcomes):
        decided = int((reason_rule == k).sum())
        if decided:
            stats[f"{DropReason.LOW_QUALITY}:{outcome.rule}"] = decided
        fired = int(outcome.fires.sum())
        if fired:
            stats[f"fired:{outcome.rule}"] = fired  # every file it fires on, first or not
    return GateResult(kept=kept, dropped=dropped, stats=stats)


def evaluate(m: QualityMeasures, config: QualityConfig) -> list[RuleOutcome]:
    """Every rule's value and verdict for every file, in RULES order."""
    code_lines = np.maximum(m.code_lines, 1)
    preprocessor = m.preprocessor_lines / code_lines
    prints = m.print_lines / code_lines
    no_logic = m.no_logic_lines / code_lines
    repeated = m.repeated_5gram_bytes / np.maximum(m.word_bytes, 1)
    data = m.data_bytes / np.maximum(m.bytes, 1)
    comments = m.comment_bytes / np.maximum(m.bytes, 1)
    c = config
    outcomes = [
        RuleOutcome(
            "multiple_main",
            m.main_definitions,
            m.main_definitions > c.max_main_definitions,
            lambda v: (
                f"multiple_main: {v:.0f} main definitions > {c.max_main_definitions} "
                "(max_main_definitions)"
            ),
        ),
        RuleOutcome(
            "print_fraction",
            prints,
            prints > c.max_print_fraction,
            lambda v: (
                f"print_fraction: {v:.3f} of code lines print > {c.max_print_fraction} "
                "(max_print_fraction)"
            ),
        ),
        RuleOutcome(
            "data_table",
            data,
            (data > c.max_data_fraction) & (m.data_bytes >= c.min_data_chars),
            lambda v: (
                f"data_table: {v:.3f} of the file is numeric/encoded data > "
                f"{c.max_data_fraction} (max_data_fraction)"
            ),
        ),
        RuleOutcome(
            "no_logic_fraction",
            no_logic,
            no_logic > c.max_no_logic_fraction,
            lambda v: (
                f"no_logic_fraction: {v:.3f} of code lines hold only punctuation and literals"
                f" > {c.max_no_logic_fraction} (max_no_logic_fraction)"
            ),
        ),
        RuleOutcome(
            "repeated_5grams",
            repeated,
            repeated > c.max_repeated_5gram_fraction,
            lambda v: (
                f"repeated_5grams: {v:.3f} of code characters repeat an earlier 5-gram > "
                f"{c.max_repeated_5gram_fraction} (max_repeated_5gram_fraction)"
            ),
        ),
        RuleOutcome(
            "preprocessor_fraction",
            preprocessor,
            (preprocessor > c.max_preprocessor_fraction)
            & (m.code_lines >= c.preprocessor_min_code_lines),
            lambda v: (
                f"preprocessor_fraction: {v:.3f} of code lines are directives > "
                f"{c.max_preprocessor_fraction} (max_preprocessor_fraction, files of "
                f"{c.preprocessor_min_code_lines}+ code lines)"
            ),
        ),
        RuleOutcome(
            "comment_ratio",
            comments,
            (comments < c.min_comment_ratio) | (comments > c.max_comment_ratio),
            lambda v: (
                f"comment_ratio: {v:.3f} of characters are comments, outside "
                f"[{c.min_comment_ratio}, {c.max_comment_ratio}] "
                "(min_comment_ratio, max_comment_ratio)"
            ),
        ),
    ]
    assert tuple(o.rule for o in outcomes) == RULES
    return outcomes


# --- measuring -------------------------------------------------------------------------
# Everything below works on a whole shard at once: RE2 passes through Arrow and numpy over
# flat arrays of lines and words; no Python loop visits a file.

_NUMBER = r"(?:0[xX][0-9a-fA-F']+|[0-9][0-9'.]*(?:[eE][-+]?[0-9]+)?)[uUlLfFzZ]*"
_LITERAL_TOKEN = (
    r"(?:[-+*/%^&|~!<>=?:;,.(){}\[\]]|" + _NUMBER + r"|\"(?:[^\"\\\n]|\\.)*\"|'(?:[^'\\\n]|\\.)*')"
)
# a code line made only of punctuation, numbers and string/char literals
_NO_LOGIC_LINE = rf"(?m)^[ \t]*{_LITERAL_TOKEN}(?:[ \t]|{_LITERAL_TOKEN})*$"
# a line with a call that writes to the console or a log; the match runs to the line's end,
# so each line counts once
_PRINT_LINE = (
    r"(?m)^[^\n]*?(?:\b(?:std::)?(?:printf|fprintf|wprintf|puts|fputs|putchar|perror|print"
    r"|println)\s*\(|\b(?:std::)?(?:cout|cerr|clog|wcout|wcerr)\s*<<|\bfmt::print\s*\("
    r"|\bspdlog::\w+\s*\(|\bq(?:Debug|Info|Warning|Critical)\s*\(|\b(?:LOG|VLOG|DLOG)\s*\()"
    r"[^\n]*"
)
_MAIN_DEFINITION = (
    r"\b(?:int|void)\s+main\s*\([^;{}]*\)\s*\{|\bauto\s+main\s*\([^;{}]*\)\s*->\s*int\s*\{"
)
_DATA = (
    # 8+ comma-separated numeric literals, rows of a 2-D table included
    r"(?:[-+]?\b(?:0[xX][0-9a-fA-F']+|[0-9][0-9']*\.?[0-9]*(?:[eE][-+]?[0-9]+)?)[uUlLfF]*"
    r"[{}()\s]*,[{}()\s]*){8,}"
    r"|(?:\\x[0-9a-fA-F]{1,2}|\\[0-7]{1,3}){8,}"  # escaped bytes in a string
    r"|(?:\\u[0-9a-fA-F]{4}){8,}"
    r"|[A-Za-z0-9+/=]{64,}"  # base64 and hex runs
)
_NGRAM = 5
_MIX = np.uint64(0x9E3779B97F4A7C15)  # odd constants of splitmix64
_FILE_MIX = np.uint64(0xD6E8FEB86659FD93)
# n-grams a sort takes at once: 4k keys (32 KiB) sort in a core's L1 and L2 caches (over
# the demo at 16x, 2.06 CPU s for the measure's n-gram part against 2.21 at 16k, 2.41 at 32k)
_SORT_RUN = 1 << 12


def measure(texts: pa.Array) -> QualityMeasures:
    """The measures of every text of `texts` (a string array of LF-normalized files)."""
    n = len(texts)
    total = cpp_text.byte_lengths(texts)
    code = cpp_text.without_comments(texts)
    code_bytes = cpp_text.byte_lengths(code)
    code_lines, preprocessor_lines = _line_counts(code)
    data_free = pc.replace_substring_regex(code, _DATA, "")
    word_bytes, repeated = _repeated_ngram_bytes(code, n)
    return QualityMeasures(
        bytes=total,
        comment_bytes=total - code_bytes,
        code_lines=code_lines,
        preprocessor_lines=preprocessor_lines,
        print_lines=cpp_text.regex_counts(code, _PRINT_LINE),
        no_logic_lines=cpp_text.regex_counts(code, _NO_LOGIC_LINE),
        main_definitions=cpp_text.regex_counts(code, _MAIN_DEFINITION, needs="main"),
        data_bytes=code_bytes - cpp_text.byte_lengths(data_free),
        word_bytes=word_bytes,
        repeated_5gram_bytes=repeated,
    )


def _line_counts(code: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(code lines, preprocessor lines) per file. A directive's logical line runs on over
    lines ending in a backslash; every physical line of it counts."""
    lines = pc.split_pattern(code, "\n")
    offsets = np.asarray(lines.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
    flat = lines.flatten()
    stripped = pc.ascii_ltrim_whitespace(flat)
    is_code = cpp_text.byte_lengths(stripped) > 0
    opens_directive = _np_bool(pc.starts_with(stripped, "#"))
    continues = np.zeros(len(flat), dtype=bool)
    continues[1:] = _np_bool(pc.ends_with(flat, "\\"))[:-1]
    continues[offsets[:-1][offsets[:-1] < offsets[1:]]] = False  # a file's first line
    logical_start = np.flatnonzero(~continues)
    logical_of_line = np.cumsum(~continues) - 1
    in_directive = opens_directive[logical_start][logical_of_line]
    return _per_file_sums(is_code, offsets), _per_file_sums(is_code & in_directive, offsets)


def _repeated_ngram_bytes(
    code: pa.Array, n: int, run: int = _SORT_RUN
) -> tuple[np.ndarray, np.ndarray]:
    """(bytes of whitespace-separated words, bytes of the words covered by a word 5-gram
    that occurred earlier in the same file) per file. `run`: about how many n-grams each
    sort takes (whole files, so a file larger than that is sorted alone)."""
    words = pc.ascii_split_whitespace(code)
    offsets = np.asarray(words.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
    flat = words.flatten()
    lengths = cpp_text.byte_lengths(flat)
    file_of_word = np.repeat(np.arange(n), np.diff(offsets))
    word_bytes = _per_file_sums(lengths, offsets)
    total = len(flat)
    starts = total - _NGRAM + 1
    if starts <= 0:
        return word_bytes, np.zeros(n, dtype=np.int64)
    # a 64-bit key per n-gram: polars hashes the words (one vectorized pass), the n-gram
    # mixes its five word hashes and its file's index, so equal n-grams of two files differ
    # (polars takes string_view without copying; Arrow's cast to it is the cheaper copy)
    word_hash = pl.Series("word", flat.cast(pa.string_view())).hash(seed=0).to_numpy()
    keys = word_hash[:starts].copy()
    for k in range(1, _NGRAM):
        keys *= _MIX
        keys += word_hash[k : starts + k]
    keys ^= file_of_word[:starts].astype(np.uint64) * _FILE_MIX
    # an n-gram starting in a file's last four words runs into the next file's
    inside_file = np.ones(starts, dtype=bool)
    for k in range(1, _NGRAM):
        tail = offsets[1:] - k
        inside_file[tail[(tail >= offsets[:-1]) & (tail < starts)]] = False
    inside = np.flatnonzero(inside_file)
    # Sorting finds the repeats: the key's high bits with the n-gram's position in the low
    # bits, so equal keys sit together in position order and all but the first repeat.
    # (Keeping 40+ key bits, a false repeat is a chance collision: a few words a shard.)
    # A repeat is within one file, so runs of whole files are sorted apart: a run that fits
    # in the core's cache sorts in half the time of the shard at once.
    shift = np.uint64(max(total.bit_length(), 1))
    low = (np.uint64(1) << shift) - np.uint64(1)
    packed = (keys[inside] & ~low) | inside.astype(np.uint64)
    cuts = _file_runs(np.searchsorted(inside, offsets[:-1]), len(packed), run)
    for a, b in itertools.pairwise(cuts):
        packed[a:b].sort()
    again = (packed[1:] >> shift) == (packed[:-1] >> shift)
    again[cuts[1:-1] - 1] = False  # two runs' n-grams are never of one file
    repeats = np.zeros(total, dtype=bool)
    repeats[(packed[1:][again] & low).astype(np.int64)] = True
    covered = repeats.copy()  # word j lies in the n-grams starting at j-4 .. j
    for k in range(1, _NGRAM):
        covered[k:] |= repeats[:-k]
    return word_bytes, _per_file_sums(np.where(covered, lengths, 0), offsets)


def _per_file_sums(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The sum of each file's run of `values` (file k's run is offsets[k]:offsets[k + 1])."""
    running = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(values, out=running[1:])
    return running[offsets[1:]] - running[offsets[:-1]]


def _file_runs(file_starts: np.ndarray, total: int, run: int) -> np.ndarray:
    """Where to cut `total` items, grouped in files beginning at the ascending
    `file_starts`, into runs of whole files of about `run` items: 0, the cuts, `total`."""
    targets = np.arange(run, total, run)
    cuts = file_starts[np.searchsorted(file_starts, targets, side="right") - 1]
    return np.unique(np.concatenate([[0], cuts[cuts > 0], [total]]).astype(np.int64))


def _np_bool(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return np.asarray(array.to_numpy(zero_copy_only=False), dtype=bool)
