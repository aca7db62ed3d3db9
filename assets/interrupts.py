"""How SIGINT (Ctrl-C) and SIGTERM stop `megacpp run`: the parent catches them, asks the
running stage group's process to stop (SIGTERM: Dagster ends the run as failed and the stage
aborts its unfinished version), and after a grace period kills that process's whole group,
so its forked workers and Dagster's helper processes go with it; the parent returns only
once nobody of the group is left, so nothing writes a store version after the command
exits. A forked run lives in a process group of its own, so a terminal's Ctrl-C reaches only
the parent (Dagster's helper processes then print no tracebacks)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from types import FrameType, TracebackType
from typing import Any

# How long a stage group's process gets to stop on its own before its group is killed.
GRACE_S = 10.0
_POLL_S = 0.05


class Interrupts:
    """Installed for the length of a run (main thread only): records the first SIGINT or
    SIGTERM and stops the running child; a second one kills the child's group at once."""

    def __init__(self, grace_s: float = GRACE_S) -> None:
        self.grace_s = grace_s
        self.signal: int | None = None
        self._child: int | None = None
        self._timer: threading.Timer | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._cancel_timer()

    @property
    def name(self) -> str:
        return signal.Signals(self.signal).name if self.signal else "an interrupt"

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        first = self.signal is None
        if first:
            self.signal = signum
        child = self._child
        if child is None:
            return  # between stage groups: the run loop stops before the next one
        if first:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGTERM)
            self._timer = threading.Timer(self.grace_s, _kill_group, (child,))
            self._timer.daemon = True
            self._timer.start()
        else:
            _kill_group(child)

    # the running child ---------------------------------------------------------------------
    def started(self, pid: int) -> None:
        """A stage group's process started: it leads a process group of its own (set here
        too, so a Ctrl-C right after the fork cannot reach it first)."""
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)
        self._child = pid
        if self.signal is not None:  # the signal came while it was being forked
            self._on_signal(self.signal, None)

    def ended(self, pid: int) -> None:
        """The child exited (and was joined). After an interrupt, whatever is left of its
        group (forked workers, Dagster's log watchers) is killed and waited for."""
        self._child = None
        self._cancel_timer()
        if self.signal is not None:
            _kill_group(pid)
            wait_group_gone(pid, self.grace_s)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def become_group_leader() -> None:
    """In a forked stage-group process: a process group of its own, and the default signal
    dispositions (not the parent's handlers, which point at the parent's state)."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group, from /proc."""
    out: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # the command may hold spaces and parentheses: fields follow the last ')'
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(entry))
    return out


def wait_group_gone(pgid: int, timeout_s: float) -> bool:
    """Wait until no live process of the group is left (killing stragglers); True if so."""
    deadline = time.monotonic() + timeout_s
    while group_members(pgid):
        if time.monotonic() > deadline:
            return False
        _kill_group(pgid)
        time.sleep(_POLL_S)
    return True
