"""Pinned benchmark files: decides whether a benchmark file is the one its catalog entry pins
(sha256, checked before a byte is parsed) and reads its tasks, with errors naming the file,
the field and the record. The catalog verifies pins through here; the index reads tasks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from megacpp_pipeline.core.catalog import BenchmarkSpec
from megacpp_pipeline.core.errors import FieldedError
from megacpp_pipeline.storage.versions import sha256_file


class BenchmarkError(FieldedError, ValueError):
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
