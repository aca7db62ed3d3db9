"""Benchmark decontamination after dedup: decides which files carry the text of a pinned
benchmark task (prompt, canonical solution, tests) and drops them, or cuts the matching spans
out (seed: evaluation data stays out of training data).

benchmarks.py loads and verifies the pinned files; ngrams.py hashes windows of words or
tokens; index.py holds the rule (which n-grams count, and the matching); excise.py cuts;
gate.py runs it over a table; config.py holds every threshold.
"""

from megacpp_pipeline.core.catalog import BenchmarkSpec
from megacpp_pipeline.corpus.decontaminate.benchmarks import (
    BenchmarkError,
    BenchmarkTask,
    load_benchmark,
    verify_benchmark,
)
from megacpp_pipeline.corpus.decontaminate.config import DEFAULT_TRIVIAL_CODE, DecontaminateConfig
from megacpp_pipeline.corpus.decontaminate.excise import token_offsets
from megacpp_pipeline.corpus.decontaminate.gate import (
    MATCHES_SCHEMA,
    RescanFinding,
    markdown_table,
    rescan,
    run,
)
from megacpp_pipeline.corpus.decontaminate.index import BenchmarkIndex, Contamination

__all__ = [
    "DEFAULT_TRIVIAL_CODE",
    "MATCHES_SCHEMA",
    "BenchmarkError",
    "BenchmarkIndex",
    "BenchmarkSpec",
    "BenchmarkTask",
    "Contamination",
    "DecontaminateConfig",
    "RescanFinding",
    "load_benchmark",
    "markdown_table",
    "rescan",
    "run",
    "token_offsets",
    "verify_benchmark",
]
