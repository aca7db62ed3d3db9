"""Receipts: where each batch's time went (read, decode, normalize, stage, queue wait).
The hot path keeps a block's timings as columns (`BlockReceipts`); `ReceiptLog` keeps the
blocks the consumer took batches from and turns them into `BatchReceipt`s when asked."""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict


@dataclass(slots=True)
class BatchReceipt:
    """Where one batch's time went. Every stage is its own field; nothing is lumped.

    A slotted dataclass, not a pydantic model; the hot path does not even build these: it
    keeps each block's timings as columns (`BlockReceipts`), and `ReceiptLog` turns
    the delivered batches into receipts when asked. The summary that leaves the loader
    (`ReceiptSummary`) is the pydantic edge.
    """

    epoch: int
    batch_index: int
    rank: int
    shape: tuple[int, int]  # (rows, seq_len) of every token column
    row_groups: int  # row groups the batch was cut from
    read_s: float  # open the cached IPC row groups, zero-copy numpy views
    decode_s: float  # parquet -> uncompressed Arrow IPC, only on a cache miss
    normalize_s: float  # defaults for missing optional columns
    stage_s: float  # copy into owned contiguous arrays (and tensors when asked)
    # the trainer's stall in next() for this batch: waiting for the prefetch thread, or
    # building the block itself when none was ready; 0 without prefetch (all of it is stages)
    queue_wait_s: float
    cache_misses: int
    defaulted_columns: tuple[str, ...]

    def model_dump(self) -> dict[str, Any]:
        """Same spelling as the pydantic models, so callers treat every receipt alike."""
        return dataclasses.asdict(self)


_TIMED_FIELDS = ("read_s", "decode_s", "normalize_s", "stage_s", "queue_wait_s")


class StageSummary(BaseModel):
    model_config = ConfigDict(extra="forbid")

    total_s: float
    mean_ms: float
    p50_ms: float
    p95_ms: float
    max_ms: float


class ReceiptSummary(BaseModel):
    model_config = ConfigDict(extra="forbid")

    batches: int
    rows: int
    tokens: int
    shapes: list[tuple[int, int]]  # distinct batch shapes seen; one entry = static shapes
    cache_misses: int
    stages: dict[str, StageSummary]

    def to_markdown(self) -> str:
        lines = [
            f"batches {self.batches}, rows {self.rows}, tokens {self.tokens}, "
            f"shapes {self.shapes}, cache misses {self.cache_misses}",
            "",
            "| stage | total s | mean ms | p50 ms | p95 ms | max ms |",
            "|---|---|---|---|---|---|",
        ]
        for name, s in self.stages.items():
            lines.append(
                f"| {name.removesuffix('_s')} | {s.total_s:.3f} | {s.mean_ms:.3f} | "
                f"{s.p50_ms:.3f} | {s.p95_ms:.3f} | {s.max_ms:.3f} |"
            )
        return "\n".join(lines)


def summarize_receipts(receipts: Sequence[BatchReceipt]) -> ReceiptSummary:
    stages = {}
    for name in _TIMED_FIELDS:
        values = np.array([getattr(r, name) for r in receipts], dtype=np.float64)
        if not len(values):
            values = np.zeros(1)
        stages[name] = StageSummary(
            total_s=float(values.sum()),
            mean_ms=float(values.mean() * 1e3),
            p50_ms=float(np.percentile(values, 50) * 1e3),
            p95_ms=float(np.percentile(values, 95) * 1e3),
            max_ms=float(values.max() * 1e3),
        )
    return ReceiptSummary(
        batches=len(receipts),
        rows=sum(r.shape[0] for r in receipts),
        tokens=sum(r.shape[0] * r.shape[1] for r in receipts),
        shapes=sorted({r.shape for r in receipts}),
        cache_misses=sum(r.cache_misses for r in receipts),
        stages=stages,
    )


@dataclass(slots=True, eq=False)
class BlockReceipts:
    """Consecutive batches handed to the consumer at once, with their timings as columns
    (one entry per batch, never an object per batch). `delivered` counts the batches the
    consumer has taken, so receipts and the resume position only ever describe batches a
    trainer actually received."""

    epoch: int
    first_batch: int
    rows: list[int]
    row_groups: list[int]
    read_s: list[float]
    decode_s: list[float]
    normalize_s: list[float]
    stage_s: list[float]
    cache_misses: list[int]
    defaulted: list[tuple[str, ...]] | None
    queue_wait_s: float = 0.0  # the consumer's wait, charged to the block's first batch
    delivered: int = 0


class ReceiptLog:
    """The blocks the consumer has taken batches from, oldest first, trimmed so they hold
    no more than the last `history` batches received (plus the block being handed out)."""

    def __init__(self, history: int, rank: int, seq_len: int) -> None:
        self.history = history
        self._rank = rank
        self._seq_len = seq_len
        self._blocks: deque[BlockReceipts] = deque()
        self._logged = 0  # delivered batches in every logged block but the last

    def append(self, block: BlockReceipts) -> None:
        """The consumer started on `block`: its receipts count from now on."""
        log = self._blocks
        if log:
            self._logged += log[-1].delivered
        log.append(block)
        while len(log) > 1 and self._logged - log[0].delivered >= self.history:
            self._logged -= log.popleft().delivered

    def receipts(self) -> list[BatchReceipt]:
        """Receipts of the last `history` batches the consumer received, oldest first."""
        out = []
        for block in self._blocks:
            for k in range(block.delivered):
                out.append(
                    BatchReceipt(
                        epoch=block.epoch,
                        batch_index=block.first_batch + k,
                        rank=self._rank,
                        shape=(block.rows[k], self._seq_len),
                        row_groups=block.row_groups[k],
                        read_s=block.read_s[k],
                        decode_s=block.decode_s[k],
                        normalize_s=block.normalize_s[k],
                        stage_s=block.stage_s[k],
                        queue_wait_s=block.queue_wait_s if k == 0 else 0.0,
                        cache_misses=block.cache_misses[k],
                        defaulted_columns=block.defaulted[k] if block.defaulted else (),
                    )
                )
        return out[len(out) - self.history :] if self.history else []
