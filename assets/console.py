"""What `megacpp run` shows while it works: one live view (rich) on a terminal, plain lines
otherwise (CI, a log file), both fed by the stage events the library emits; then the
finished stages as one compact table. Dagster's own event log goes to the instance (the UI
shows it) and reaches the console only with --verbose."""

import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TextIO

from rich.console import Console
from rich.live import Live
from rich.table import Table

from megacpp_pipeline.pipeline import progress

PLAIN_PROGRESS_EVERY_S = 15.0  # a plain line for a stage still running, at most this often


@dataclass
class StageView:
    name: str
    partitions: int = 0
    done: int = 0
    files_in: int = 0
    bytes_in: int = 0
    kept: int = 0
    dropped: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    started: float = field(default_factory=time.monotonic)
    seconds: float | None = None
    peak_mb: float | None = None

    @property
    def elapsed(self) -> float:
        return self.seconds if self.seconds is not None else time.monotonic() - self.started

    def rate(self) -> float:
        return self.bytes_in / 1e6 / self.elapsed if self.elapsed > 0 else 0.0

    def eta(self) -> str:
        if self.seconds is not None or not self.done or not self.partitions:
            return ""
        left = self.elapsed / self.done * (self.partitions - self.done)
        return f"{left:.0f} s"

    def top_reasons(self, n: int = 2) -> str:
        """The stage's most frequent drop reasons; a reason it declares but never used (its
        counter is 0) is not one."""
        return ", ".join(f"{r} {c:,}" for r, c in self.reasons.most_common(n) if c > 0)


class RunConsole:
    """The view of one `megacpp run` on `stream` (stderr by default)."""

    def __init__(self, stream: TextIO | None = None, live: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self.stages: dict[str, StageView] = {}
        self._last_plain = time.monotonic()
        self._group: list[str] = []
        self._live: Live | None = None
        if self.live:
            self._live = Live(
                self._table(running=True),
                console=Console(file=self.stream),
                transient=True,
                refresh_per_second=4,
            )
            self._live.start()

    # events ----------------------------------------------------------------------------
    def group_started(self, keys: list[str], label: str) -> None:
        self._group = keys
        if not self.live:
            print(f"-> {label}", file=self.stream, flush=True)

    def event(self, e: progress.Event) -> None:
        if isinstance(e, progress.StageStarted):
            self.stages[e.stage] = StageView(e.stage, partitions=e.partitions)
        elif isinstance(e, progress.PartitionDone):
            view = self.stages.setdefault(e.stage, StageView(e.stage))
            view.done += 1
            view.files_in += e.files_in
            view.bytes_in += e.bytes_in
            view.kept += e.kept
            view.dropped += e.dropped
            view.reasons.update(e.reasons)
            self._maybe_plain_progress(view)
        elif isinstance(e, progress.StageDone):
            view = self.stages.setdefault(e.stage, StageView(e.stage))
            view.seconds = e.seconds
        elif isinstance(e, progress.Notice):
            self.notice(e.message)
        self._refresh()

    def notice(self, line: str) -> None:
        """A line the operator should read, above the live view (or in the plain log)."""
        if self._live is not None:
            self._live.console.print(f"! {line}", markup=False, highlight=False, soft_wrap=True)
        else:
            print(f"   ! {line}", file=self.stream, flush=True)

    def group_done(self, seconds: float, peak_mb: float) -> None:
        for key in self._group:
            if key in self.stages:
                self.stages[key].peak_mb = peak_mb
        if not self.live:
            print(
                f"   ok in {seconds:.1f}s, peak RSS {peak_mb:.0f} MB", file=self.stream, flush=True
            )
        self._refresh()

    def running_stage(self) -> str | None:
        """The stage of the current group that started and has not finished (else the
        group's first one that has not started, else None)."""
        for key in self._group:
            view = self.stages.get(key)
            if view is not None and view.seconds is None:
                return key
        return next((k for k in self._group if k not in self.stages), None)

    def failed(self, line: str) -> None:
        self.close()
        print(line, file=self.stream, flush=True)

    # output ----------------------------------------------------------------------------
    def _maybe_plain_progress(self, view: StageView) -> None:
        if self.live or view.done >= view.partitions:
            return
        now = time.monotonic()
        if now - self._last_plain >= PLAIN_PROGRESS_EVERY_S:
            self._last_plain = now
            print(
                f"   ... {view.name}: {view.done}/{view.partitions} sources, "
                f"{view.bytes_in / 1e6:.1f} MB, {view.rate():.1f} MB/s, ETA {view.eta() or '?'}",
                file=self.stream,
                flush=True,
            )

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._table(running=True))

    def _table(self, running: bool) -> Table:
        table = Table(box=None, pad_edge=False, header_style="bold")
        for name, justify in (
            ("stage", "left"),
            ("sources", "right"),
            ("files in", "right"),
            ("kept", "right"),
            ("dropped", "right"),
            ("MB", "right"),
            ("MB/s", "right"),
            ("s", "right"),
            ("ETA" if running else "peak MB", "right"),
            ("top drop reasons", "left"),
        ):
            table.add_column(name, justify=justify)  # type: ignore[arg-type]
        for v in self.stages.values():
            table.add_row(
                v.name,
                f"{v.done}/{v.partitions}",
                f"{v.files_in:,}",
                f"{v.kept:,}",
                f"{v.dropped:,}",
                f"{v.bytes_in / 1e6:.1f}",
                f"{v.rate():.1f}",
                f"{v.elapsed:.1f}",
                v.eta() if running else (f"{v.peak_mb:.0f}" if v.peak_mb else ""),
                v.top_reasons(),
            )
        return table

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def summary(self) -> None:
        """The finished stages, one line each."""
        self.close()
        Console(file=self.stream, width=160, no_color=not self.live).print(
            self._table(running=False)
        )
