"""Streaming JSONL -> bounded parquet shards (seed: protobuf-2gb-wall-and-shards, the
streaming converter): decides which lines of a possibly still growing JSONL file become
records, and commits them as validated shards that a killed run resumes byte-identically.

reader.py parses lines (the `jsonl` collector reads through it too); buffer.py cuts shards;
convert.py runs the tail loop and the commit steps, with durable.py's writes; output.py owns
the output directory (names, resume state, manifest); config.py, errors.py; cli.py is the
`megacpp jsonl-to-parquet` command; crash.py is its test-only fault injection.
"""

from megacpp_pipeline.collect.jsonl_stream.cli import main_jsonl_to_parquet
from megacpp_pipeline.collect.jsonl_stream.config import JsonlConverterConfig
from megacpp_pipeline.collect.jsonl_stream.convert import convert
from megacpp_pipeline.collect.jsonl_stream.crash import CRASH_ENV, CRASH_POINTS, CrashPlan
from megacpp_pipeline.collect.jsonl_stream.errors import (
    CompressedInputError,
    InputChangedError,
    InputMissingError,
    JsonlIngestError,
    OutputLockedError,
    ResumeConfigMismatchError,
    ShardTooLargeError,
    ShardValidationError,
)
from megacpp_pipeline.collect.jsonl_stream.output import (
    COMPLETE_FILE,
    LOCK_FILE,
    MANIFEST_FILE,
    REJECTS_FILE,
    STATE_FILE,
    TRAIN_DIR,
    VALIDATION_DIR,
    ConversionReport,
    JsonlManifest,
    ShardEntry,
    read_manifest,
)
from megacpp_pipeline.collect.jsonl_stream.reader import (
    JSONL_RECORDS,
    JSONL_SCHEMA_VERSION,
    RecordReject,
    iter_records,
)

__all__ = [
    "COMPLETE_FILE",
    "CRASH_ENV",
    "CRASH_POINTS",
    "JSONL_RECORDS",
    "JSONL_SCHEMA_VERSION",
    "LOCK_FILE",
    "MANIFEST_FILE",
    "REJECTS_FILE",
    "STATE_FILE",
    "TRAIN_DIR",
    "VALIDATION_DIR",
    "CompressedInputError",
    "ConversionReport",
    "CrashPlan",
    "InputChangedError",
    "InputMissingError",
    "JsonlConverterConfig",
    "JsonlIngestError",
    "JsonlManifest",
    "OutputLockedError",
    "RecordReject",
    "ResumeConfigMismatchError",
    "ShardEntry",
    "ShardTooLargeError",
    "ShardValidationError",
    "convert",
    "iter_records",
    "main_jsonl_to_parquet",
    "read_manifest",
]
