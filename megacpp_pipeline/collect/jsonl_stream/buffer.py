"""Parsed rows waiting for their shard: decides which rows (and rejects) a shard takes and
the input offset it ends at, and builds its Arrow table straight from buffers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from megacpp_pipeline.collect.jsonl_stream.errors import ShardTooLargeError
from megacpp_pipeline.collect.jsonl_stream.reader import JSONL_RECORDS, RecordReject


def string_array(values: list[str] | list[str | None]) -> pa.Array:
    """Arrow strings straight from buffers. pa.array(list) would do, but it probes for pandas,
    and importing pandas adds ~0.7 s to every converter (re)start; this is also faster."""
    encoded = [b"" if v is None else v.encode("utf-8") for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, encoded), np.int64, len(encoded)), out=offsets[1:])
    valid = np.fromiter((v is not None for v in values), bool, len(values))
    nulls = len(values) - int(valid.sum())
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    data = pa.py_buffer(b"".join(encoded))
    large = pa.Array.from_buffers(
        pa.large_string(), len(values), [bitmap, pa.py_buffer(offsets), data], null_count=nulls
    )
    try:
        return large.cast(pa.string())
    except pa.ArrowInvalid as exc:  # 32-bit offsets: one column of one shard must stay < 2 GiB
        raise ShardTooLargeError(
            f"one shard's strings exceed 2 GiB ({offsets[-1]} bytes): lower rows_per_file"
        ) from exc


@dataclass
class RowBuffer:
    """Parsed rows not yet in a promoted shard, in input order, with the input byte offset
    just past each row's line (the resume offset if that row ends a shard)."""

    path: list[str] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    license: list[str | None] = field(default_factory=list)
    revision: list[str | None] = field(default_factory=list)
    line_no: list[int] = field(default_factory=list)
    end_offset: list[int] = field(default_factory=list)
    rejects: list[RecordReject] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.line_no)

    def add(self, record: dict, end: int) -> None:
        self.path.append(record["path"])
        self.content.append(record["content"])
        self.license.append(record["license"])
        self.revision.append(record["revision"])
        self.line_no.append(record["line_no"])
        self.end_offset.append(end)

    def take(self, n: int) -> tuple[pa.Table, int]:
        """Remove the first n rows; returns them as a table and the offset past the last."""
        line_no = np.asarray(self.line_no[:n], dtype=np.int64)
        table = pa.Table.from_arrays(
            [
                string_array(self.path[:n]),
                string_array(self.content[:n]),
                string_array(self.license[:n]),
                string_array(self.revision[:n]),
                pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(line_no)]),
            ],
            schema=JSONL_RECORDS,
        )
        end = self.end_offset[n - 1]
        for column in (
            self.path,
            self.content,
            self.license,
            self.revision,
            self.line_no,
            self.end_offset,
        ):
            del column[:n]
        return table, end

    def take_rejects_before(self, offset: int) -> list[RecordReject]:
        cut = 0
        while cut < len(self.rejects) and self.rejects[cut].byte_offset < offset:
            cut += 1
        taken, self.rejects = self.rejects[:cut], self.rejects[cut:]
        return taken
