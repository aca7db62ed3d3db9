"""The JSONL converter's settings: shard size, following a growing input, the validation
hold-out and compression. Every threshold of the converter lives here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class JsonlConverterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rows_per_file: int = Field(default=10_000, ge=1)  # bounds memory and shard size
    follow: bool = False  # keep tailing until the input stops growing
    idle_timeout_s: float = Field(default=60.0, gt=0)  # no growth this long => end of stream
    poll_interval_s: float = Field(default=0.5, gt=0)
    # The last N records of the stream become the validation shard. A tail hold-out (rather
    # than a random fraction) keeps resume a single byte offset: held-back rows are simply
    # re-read after a restart.
    validation_rows: int = Field(default=0, ge=0)
    read_chunk_bytes: int = Field(default=4 << 20, ge=1)
    compression: Literal["zstd", "snappy", "none"] = "zstd"

    @model_validator(mode="after")
    def _poll_within_idle(self) -> JsonlConverterConfig:
        if self.poll_interval_s > self.idle_timeout_s:
            raise ValueError("poll_interval_s must not exceed idle_timeout_s")
        return self
