"""What a running stage tells whoever watches: a stage starting over N partitions, each
partition done (files and bytes in, kept, dropped by reason), the stage done, and notices an
operator should read (the library's warnings: a version replaced because it failed
verification, a result-cache entry discarded). The runner emits these as records of one
logger, which the orchestrating command points at its sink (`sending_to`: the console view
of `megacpp run`); with none they go nowhere."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
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

# Events travel as records of this logger, so where they go is the standard logging setup
# the orchestrating command makes (`sending_to`), not state of this module. Forked workers
# inherit it with the rest of the process.
EVENTS = logging.getLogger("megacpp_pipeline.progress")
EVENTS.setLevel(logging.INFO)
EVENTS.propagate = False  # never into the library's warnings (NoticeHandler below)


class _SinkHandler(logging.Handler):
    def __init__(self, sink: Sink) -> None:
        super().__init__(logging.INFO)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.sink(record.event)  # type: ignore[attr-defined]  # set by progress.emit
        except Exception:
            self.handleError(record)


@contextmanager
def sending_to(sink: Sink) -> Iterator[None]:
    """Within the block, this process's events go to `sink` alone (those of an enclosing
    block, or inherited from a forking parent, are set aside until it ends)."""
    before = list(EVENTS.handlers)
    EVENTS.handlers = [_SinkHandler(sink)]
    try:
        yield
    finally:
        EVENTS.handlers = before


def emit(event: Event) -> None:
    # nobody watching: not even a record is made; any other handler of this logger (a test
    # runner's capture) reads the event as its repr
    if EVENTS.handlers:
        EVENTS.info("%r", event, extra={"event": event})


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
    events: forked workers inherit it with the events' handler, so a warning raised
    anywhere in a run reaches the console as one line."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = " ".join(record.getMessage().split())
            emit(Notice(line[:_NOTICE_CHARS]))
        except Exception:
            self.handleError(record)
