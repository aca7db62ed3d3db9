"""Writer leases: who is writing a version that has no `_COMPLETE` yet, and whether they still
are. A lease is a small JSON object, `<partition>/<version>.lease`, put before the version's
first object and refreshed by a heartbeat; a cleaner removes an unfinished version only once
its lease is dead. Seed rule (protobuf-2gb-wall-and-shards): completion markers, and a crash
leaves nothing a reader or the next writer can mistake for data.

Dead means one of two things, and nothing else:
- no heartbeat for longer than the lease's own TTL (any host): the writer promised to
  refresh within it, so a silent one is gone or cut off, and will refuse to commit;
- the writer is a process of this very machine (same host name, boot and pid namespace) and
  that process no longer exists (its pid is free, or now belongs to a later process).
A lease from another host is never judged by pid: a pid means nothing across machines.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from pydantic import BaseModel, ConfigDict

from megacpp_pipeline.storage.versions import pid_alive

LEASE_SCHEMA_VERSION = 1
DEFAULT_TTL_S = 120.0
# A heartbeat every quarter of the TTL: three may be lost (a slow request, a long GIL hold)
# before the lease expires.
HEARTBEATS_PER_TTL = 4
# A writer commits only with a heartbeat younger than this share of the TTL, so that a
# cleaner whose clock runs up to half a TTL ahead still sees the lease alive.
COMMIT_MARGIN = 0.5


class LeaseLostError(Exception):
    """The writer's lease was taken away (judged dead by a cleaner) or has lapsed: its
    version may have been removed, so it must not commit."""


class Lease(BaseModel):
    """What `<version>.lease` holds."""

    model_config = ConfigDict(extra="forbid")
    schema_version: int = LEASE_SCHEMA_VERSION
    version: str
    token: str  # this writer's id: a lease rewritten by anyone else is not ours any more
    host: str  # the host name the writer claims (socket.gethostname() unless configured)
    machine: str  # host, boot id and pid namespace: the scope in which `pid` means a process
    pid: int
    process_start: int | None = None  # /proc/<pid>/stat start time: tells a reused pid apart
    started_at: datetime
    heartbeat_at: datetime
    ttl_s: float


@dataclass(frozen=True)
class WriterIdentity:
    """The process a lease is written for (read at begin: a forked worker is its own)."""

    host: str
    machine: str
    pid: int
    process_start: int | None

    @classmethod
    def of_this_process(cls, host: str | None = None) -> WriterIdentity:
        pid = os.getpid()
        key = (pid, host)
        if key not in _IDENTITIES:  # a forked child has its own pid, so its own entry
            name = host or socket.gethostname()
            _IDENTITIES[key] = cls(
                name, f"{name}|{_boot_id()}|{_pid_namespace()}", pid, process_start(pid)
            )
        return _IDENTITIES[key]


_IDENTITIES: dict[tuple[int, str | None], WriterIdentity] = {}


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def process_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), None where unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name may hold spaces and parentheses: the fields after its last ')' are fixed
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])  # field 22 of proc(5), counted from field 3
    except (IndexError, ValueError):
        return None


def process_running(pid: int, started: int | None) -> bool:
    """Whether the process `pid` of this machine that started at `started` still runs."""
    if not pid_alive(pid):
        return False
    if started is None:
        return True
    now = process_start(pid)
    return now is None or now == started


def why_dead(
    lease: Lease, *, now: datetime, here: WriterIdentity, stored_at: datetime | None = None
) -> str | None:
    """None while the lease holds; otherwise why its writer counts as gone. The heartbeat is
    the later of the writer's stamp and the store's own time for the object, so a writer
    whose clock lags is not judged by it."""
    last = lease.heartbeat_at if stored_at is None else max(lease.heartbeat_at, stored_at)
    age = (now - last).total_seconds()
    if age > lease.ttl_s:
        return (
            f"no heartbeat for {age:.0f} s (TTL {lease.ttl_s:g} s) from"
            f" {lease.host} pid {lease.pid}"
        )
    if lease.machine == here.machine and not process_running(lease.pid, lease.process_start):
        return f"writer pid {lease.pid} on this machine ({lease.host}) is gone"
    return None


class LeaseKeeper:
    """Keeps one writer's lease: written at begin, refreshed every TTL / 4 until stopped.

    Refreshed from a thread rather than on each shard write: a stage may compute for minutes
    between `begin` and its first shard (a tokenizer trains, dedup clusters a corpus), and
    its lease must hold all that time; a dead process has no thread, so it stops beating by
    itself. One thread per process beats every lease it holds (starting a thread per version
    cost about 1 ms, which thousands of small partitions would pay). Each beat reads the
    lease back first: a lease rewritten or removed by someone else is lost, never silently
    re-created over a version a cleaner already removed."""

    def __init__(
        self,
        lease: Lease,
        *,
        read: Callable[[], bytes | None],
        write: Callable[[bytes], None],
        clock: Callable[[], datetime],
    ) -> None:
        self.lease = lease
        self._read, self._write, self._clock = read, write, clock
        self._last_ok = time.monotonic()
        self._lost: str | None = None
        self._stopped = False
        self._lock = threading.Lock()
        self.next_due = time.monotonic() + self.interval_s

    @property
    def interval_s(self) -> float:
        return self.lease.ttl_s / HEARTBEATS_PER_TTL

    def put_first(self) -> None:
        """Write the lease for the first time (begin: before any object of the version)."""
        self._write(self.lease.model_dump_json().encode())
        self._last_ok = time.monotonic()

    def start(self) -> None:
        self.next_due = time.monotonic() + self.interval_s
        _heartbeats().add(self)

    def stop(self) -> None:
        """No more beats (an in-flight one finishes first)."""
        with self._lock:
            self._stopped = True
        scheduler = _HEARTBEATS
        if scheduler is not None and scheduler.pid == os.getpid():
            scheduler.remove(self)

    def scheduled_beat(self) -> None:
        with self._lock:
            if not self._stopped:
                self._refresh()
        self.next_due = time.monotonic() + self.interval_s

    def beat(self) -> None:
        """One refresh now, whether or not the schedule is running."""
        with self._lock:
            self._refresh()

    def _refresh(self) -> None:
        """Read back, check it is still ours, write a new heartbeat. A request that fails,
        whatever the error, is a missed beat (the next one may succeed)."""
        if self._lost is not None:
            return
        try:
            raw = self._read()
        except Exception:
            return
        if raw is None:
            self._lost = "the lease was removed (judged dead by a cleaner)"
            return
        try:
            held = Lease.model_validate_json(raw)
        except ValueError:
            held = None
        if held is None or held.token != self.lease.token:
            self._lost = "the lease was rewritten by another writer"
            return
        self.lease = self.lease.model_copy(update={"heartbeat_at": self._clock()})
        try:
            self._write(self.lease.model_dump_json().encode())
        except Exception:
            return
        self._last_ok = time.monotonic()

    def check(self) -> None:
        """Raise LeaseLostError if this writer may no longer assume its version is intact."""
        if self._lost is not None:
            raise LeaseLostError(f"{self.lease.version}: {self._lost}")
        age = time.monotonic() - self._last_ok
        if age > self.lease.ttl_s * COMMIT_MARGIN:
            raise LeaseLostError(
                f"{self.lease.version}: last heartbeat {age:.1f} s ago, past"
                f" {COMMIT_MARGIN:g} of the {self.lease.ttl_s:g} s TTL"
            )

    def confirm(self) -> None:
        """Stop beating, then one last read-back and refresh: after it the lease is ours and
        fresh for a whole TTL, which the commit needs only milliseconds of."""
        self.stop()
        self.check()
        self.beat()
        self.check()


class _Heartbeats:
    """The process's heartbeat thread: beats each registered keeper when it is due."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._cond = threading.Condition()
        self._keepers: dict[int, LeaseKeeper] = {}
        thread = threading.Thread(target=self._run, name="lease-heartbeats", daemon=True)
        thread.start()

    def add(self, keeper: LeaseKeeper) -> None:
        with self._cond:
            self._keepers[id(keeper)] = keeper
            self._cond.notify()

    def remove(self, keeper: LeaseKeeper) -> None:
        with self._cond:
            self._keepers.pop(id(keeper), None)

    def _run(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                due = [k for k in self._keepers.values() if k.next_due <= now]
                if not due:
                    wake = min((k.next_due for k in self._keepers.values()), default=None)
                    self._cond.wait(None if wake is None else wake - now)
                    continue
            for keeper in due:  # outside the lock: a slow request must not block begin()
                keeper.scheduled_beat()


_HEARTBEATS: _Heartbeats | None = None
_HEARTBEATS_LOCK = threading.Lock()


def _heartbeats() -> _Heartbeats:
    global _HEARTBEATS
    with _HEARTBEATS_LOCK:
        if _HEARTBEATS is None or _HEARTBEATS.pid != os.getpid():
            _HEARTBEATS = _Heartbeats()
        return _HEARTBEATS


def _forget_heartbeats_after_fork() -> None:
    # the thread did not come along, and its locks may have been held at the fork
    global _HEARTBEATS, _HEARTBEATS_LOCK
    _HEARTBEATS, _HEARTBEATS_LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_heartbeats_after_fork)


def new_lease(version: str, identity: WriterIdentity, *, now: datetime, ttl_s: float) -> Lease:
    if ttl_s <= 0:
        raise ValueError(f"lease TTL must be positive, got {ttl_s}")
    return Lease(
        version=version,
        token=uuid.uuid4().hex,
        host=identity.host,
        machine=identity.machine,
        pid=identity.pid,
        process_start=identity.process_start,
        started_at=now,
        heartbeat_at=now,
        ttl_s=ttl_s,
    )
