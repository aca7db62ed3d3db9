"""The decontamination gate's configuration: n-gram length and unit, the allow list (common
n-grams, trivial code, skipped benchmark lines), the short-text rule and the action on a
match. Every threshold of the gate lives here, with its default.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

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
