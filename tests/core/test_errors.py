"""Every error of the library that is built from named fields pickles to the same type,
message and fields: a gate error raised in a forked worker or a Ray task reaches the driver
as the error it was, naming its file."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pickle
import pkgutil
from pathlib import Path

import pytest

import megacpp_pipeline
from megacpp_pipeline.core.errors import FieldedError
from megacpp_pipeline.corpus.decontaminate.benchmarks import BenchmarkError
from megacpp_pipeline.corpus.dedup.config import DedupInputError, DedupOrderError
from megacpp_pipeline.corpus.encoders import FastEncoderRefusedError
from megacpp_pipeline.corpus.tokenizer import TokenizerArtifactError
from megacpp_pipeline.gates.build_context import CompileDatabaseError
from megacpp_pipeline.gates.enrich import ParseTimeout
from megacpp_pipeline.gates.language import LanguageInputError
from megacpp_pipeline.gates.license.gate import LicenseInputError
from megacpp_pipeline.gates.normalize import NormalizeInputError
from megacpp_pipeline.gates.quality import QualityInputError
from megacpp_pipeline.gates.removals import RemovalError
from megacpp_pipeline.gates.scrub import Finding, ScrubError
from megacpp_pipeline.gates.scrub.hits import Kind
from megacpp_pipeline.gates.scrub.vendor_rules import VendorRulesError
from megacpp_pipeline.loader.errors import (
    LoaderConfigError,
    LoaderStateError,
    ShardChecksumError,
    ShardSchemaError,
    SnapshotIncompleteError,
    SnapshotManifestError,
)
from megacpp_pipeline.pipeline.file_stage import GateInputsChanged
from megacpp_pipeline.pipeline.task_error import TaskFailed
from megacpp_pipeline.snapshot.megatron import IndexedDatasetFormatError, MegatronExportError

EXAMPLES: list[BaseException] = [
    BenchmarkError("humaneval-cpp", Path("bench/he.jsonl"), "prompt", "is empty", line=12),
    DedupOrderError("tree", "src/a.cc", "paths must increase in a source"),
    DedupInputError("deduped/part-00001.parquet", ["sha256", "path"]),
    FastEncoderRefusedError("tokenizer.json", "a normalizer the fast encoder lacks"),
    TokenizerArtifactError(Path("tok/tokenizer.json"), "sha256 is not the pinned one"),
    CompileDatabaseError("build/compile_commands.json", 3, "no 'file' field"),
    CompileDatabaseError("build/compile_commands.json", None, "not a JSON list"),
    ParseTimeout(0.5, 1024, 4096),
    LanguageInputError(["text", "path"]),
    LicenseInputError(["text"]),
    NormalizeInputError(["content", "path"]),
    QualityInputError(["text"]),
    RemovalError("removals.jsonl:3", "path", "must be relative"),
    ScrubError("src/key.cc", Finding(Kind.API_KEY, "aws-key", 10, 30, "ab12")),
    VendorRulesError(Path("vendor/rules.toml"), "does not parse", rule="aws-key"),
    SnapshotIncompleteError(Path("snap/2024"), "_COMPLETE"),
    SnapshotManifestError(Path("snap/manifest.json"), "rows", "must be positive"),
    ShardChecksumError("train/part-0.parquet", "aa", "bb"),
    ShardSchemaError("train/part-0.parquet", "tokens", "is not a list of int32"),
    LoaderConfigError("batch_size", "must be positive"),
    LoaderStateError("seed", 1, 2),
    IndexedDatasetFormatError(Path("out/data.idx"), "magic", "is not MMIDIDX"),
    MegatronExportError(Path("snap"), "tokens", "holds no token"),
    TaskFailed("gates.custom.RuleError", "include/a.hpp: refused"),
    GateInputsChanged("removed_files", "tree", "its salt differs"),
]


@pytest.mark.parametrize("error", EXAMPLES, ids=lambda e: type(e).__name__)
def test_a_fielded_error_pickles_to_the_same_type_message_and_fields(error: BaseException):
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error)
    assert str(back) == str(error)
    assert back.args == error.args
    assert vars(back) == vars(error)


def test_every_library_error_built_from_fields_is_a_fielded_error_with_an_example():
    """An exception class with its own __init__ does not pickle by default: each is a
    FieldedError, and each has an example above."""
    optional = {"megacpp_pipeline.pipeline.ray_engine": "ray"}
    fielded = set()
    for info in pkgutil.walk_packages(megacpp_pipeline.__path__, "megacpp_pipeline."):
        need = optional.get(info.name)
        if need is not None and importlib.util.find_spec(need) is None:
            continue
        module = importlib.import_module(info.name)
        for cls in vars(module).values():
            if (
                inspect.isclass(cls)
                and issubclass(cls, BaseException)
                and cls.__module__ == module.__name__
                and "__init__" in vars(cls)
            ):
                assert issubclass(cls, FieldedError), f"{cls.__module__}.{cls.__qualname__}"
                fielded.add(cls)
    assert fielded == {type(e) for e in EXAMPLES}
