"""One local Ray instance for every run of a `megacpp run` with the ray engine and no cluster
address. Each Dagster run used to start (and end) an instance of its own: seconds of wall a
run group, its driver's start-up CPU, and every worker process importing the library again.
This process starts the instance and holds it, the runs join it by address, and it ends when
the process that started it closes its stdin or exits (a pipe's end: no process id or signal
is relied on). The process that forks the runs must never join Ray itself (a process forked
with Ray's threads running cannot connect again), hence a process of its own.
"""

from __future__ import annotations

import contextlib
import select
import signal
import subprocess
import sys
import tempfile
import time
from types import TracebackType

# what the holder writes before the address, on a line of its own (Ray may print too)
ADDRESS_LINE = "megacpp-ray-address "
START_TIMEOUT_S = 180.0


class HolderError(RuntimeError):
    """The local instance could not be started; the message ends with what Ray said."""


class LocalInstance:
    """A local Ray instance of `cpus` CPUs held by a process of its own until `close`."""

    def __init__(self, cpus: int, timeout_s: float = START_TIMEOUT_S) -> None:
        # what the holder says, kept for an error message while it lives; closed by close()
        self._log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
        self._process = subprocess.Popen(
            [sys.executable, "-m", __name__, str(cpus)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        try:
            self.address = self._read_address(timeout_s)
        except BaseException:
            self.close()
            raise

    def _read_address(self, timeout_s: float) -> str:
        assert self._process.stdout is not None
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([self._process.stdout], [], [], left)
            if not ready:
                break
            line = self._process.stdout.readline()
            if not line:  # it exited
                raise HolderError(f"the local Ray instance did not start: {self._said()}")
            if line.startswith(ADDRESS_LINE):
                return line[len(ADDRESS_LINE) :].strip()
        raise HolderError(
            f"the local Ray instance did not start in {timeout_s:.0f} s: {self._said()}"
        )

    def _said(self) -> str:
        self._log.seek(0)
        lines = [line.strip() for line in self._log.read().splitlines() if line.strip()]
        return " | ".join(lines[-5:]) or "it said nothing"

    def close(self) -> None:
        """End the instance: the holder's stdin closes, it leaves Ray and exits."""
        if self._process.stdin is not None and not self._process.stdin.closed:
            with contextlib.suppress(OSError):
                self._process.stdin.close()
        try:
            self._process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()
        self._log.close()

    def __enter__(self) -> LocalInstance:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()


def _hold(cpus: int) -> None:
    """The holder: start the instance, say its address, wait for stdin to close, leave."""
    from megacpp_pipeline.pipeline import ray_engine
    from megacpp_pipeline.pipeline.engine import Engine, EngineKind

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a ctrl-c is the runs' to handle
    ray_engine.connect(Engine(EngineKind.RAY), cpus)
    print(ADDRESS_LINE + ray_engine.joined_address(), flush=True)
    sys.stdin.read()
    ray_engine.release()


if __name__ == "__main__":
    _hold(int(sys.argv[1]))
