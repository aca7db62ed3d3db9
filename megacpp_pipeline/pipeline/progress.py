"""What a running stage tells whoever watches: a stage starting over N partitions, each
partition done (files and bytes in, kept, dropped by reason), the stage done, and notices an
operator should read (the library's warnings: a version replaced because it failed
verification, a result-cache entry discarded). The runner emits these to the process's sink,
which the orchestrating command installs (the console view of `megacpp run`); with no sink
they go nowhere."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class StageStarted:
    stage: str
    partitions: int


@dataclass(frozen=True)
class PartitionDone:
    stage: str
    partition: str | None
    files_in: int
    bytes_in: int
    kept: int
    dropped: int
    reasons: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class StageDone:
    stage: str
    seconds: float


@dataclass(frozen=True)
class Notice:
    """One line an operator should read; the run goes on."""

    message: str


Event = StageStarted | PartitionDone | StageDone | Notice
Sink = Callable[[Event], None]
_sink: Sink | None = None


def set_sink(sink: Sink | None) -> None:
    """Where this process's stage events go (None: nowhere)."""
    global _sink
    _sink = sink


def emit(event: Event) -> None:
    if _sink is not None:
        _sink(event)


def partition_done(stage: str, partition: str | None, stats: Mapping[str, float]) -> PartitionDone:
    """A partition's event from its version's stats (the counters every stage keeps)."""
    return PartitionDone(
        stage,
        partition,
        files_in=int(stats.get("input_files", stats.get("files_seen", 0))),
        bytes_in=int(stats.get("input_bytes", stats.get("kept_bytes", 0))),
        kept=int(stats.get("kept_files", 0)),
        dropped=int(stats.get("dropped_files", 0)),
        reasons={
            k.removeprefix("ledger:"): int(v) for k, v in stats.items() if k.startswith("ledger:")
        },
    )


# A notice crosses a pipe from forked workers in one write: keep it well under PIPE_BUF.
_NOTICE_CHARS = 1500


class NoticeHandler(logging.Handler):
    """The library's warnings (`logging`, under the `megacpp_pipeline` logger) as Notice
    events to this process's sink: forked workers inherit it with the sink, so a warning
    raised anywhere in a run reaches the console as one line."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = " ".join(record.getMessage().split())
            emit(Notice(line[:_NOTICE_CHARS]))
        except Exception:
            self.handleError(record)
