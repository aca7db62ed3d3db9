"""One local Ray instance for every run of a `megacpp run` with the ray engine and no cluster
address. Each Dagster run used to start (and end) an instance of its own: seconds of wall a
run group, and every worker process importing the library again. A process forked for it
starts the instance and holds it, the runs join it by address, and it ends when the process
that started it closes its end of their pipe or exits (a pipe's end: no process id or signal
is relied on). The process that forks the runs must never join Ray itself (a process forked
with Ray's threads running cannot connect again), hence a process of its own; forked, it has
Ray's modules already (the process that forks the runs imports them once).
"""

from __future__ import annotations

import multiprocessing
import signal
import traceback
from multiprocessing.connection import Connection
from types import TracebackType

from megacpp_pipeline.pipeline.parallel import name_process

START_TIMEOUT_S = 180.0
# the holder's process name (`ps`, `top`; a bench counts it with Ray's processes, not as a
# driver: it runs no stage, it keeps Ray's instance up)
PROCESS_NAME = "megacpp-ray"


class HolderError(RuntimeError):
    """The local instance could not be started; the message ends with what Ray said."""


class LocalInstance:
    """A local Ray instance of `cpus` CPUs held by a forked process until `close`."""

    def __init__(self, cpus: int, timeout_s: float = START_TIMEOUT_S) -> None:
        ctx = multiprocessing.get_context("fork")
        self._conn, theirs = ctx.Pipe()
        # the holder gets our end too and closes its copy first: a copy left open in it would
        # keep the pipe from ever reading as closed there, and `close` would wait it out
        self._process = ctx.Process(target=_hold, args=(cpus, theirs, self._conn), daemon=True)
        self._process.start()
        theirs.close()
        try:
            self.address = self._read_address(timeout_s)
        except BaseException:
            self.close()
            raise

    @property
    def pid(self) -> int | None:
        return self._process.pid

    @property
    def exitcode(self) -> int | None:
        """The holder's exit status once ended: 0 when it left Ray and exited by itself,
        negative (the signal) when `close` had to kill it."""
        return self._process.exitcode

    def _read_address(self, timeout_s: float) -> str:
        if not self._conn.poll(timeout_s):
            raise HolderError(f"the local Ray instance did not start in {timeout_s:.0f} s")
        try:
            kind, said = self._conn.recv()
        except EOFError:
            raise HolderError("the local Ray instance did not start: its process ended") from None
        if kind != "address":
            raise HolderError(f"the local Ray instance did not start: {said}")
        return str(said)

    def close(self) -> None:
        """End the instance: the holder sees its pipe close, leaves Ray and exits."""
        self._conn.close()
        self._process.join(timeout=60)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()

    def __enter__(self) -> LocalInstance:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()


def _hold(cpus: int, conn: Connection, other_end: Connection) -> None:
    """The holder: start the instance, send its address, wait for the pipe to close, leave."""
    other_end.close()  # the copy fork gave us of the end whose closing we wait for
    from megacpp_pipeline.pipeline import ray_engine
    from megacpp_pipeline.pipeline.engine import Engine, EngineKind

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a ctrl-c is the runs' to handle
    name_process(PROCESS_NAME)
    try:
        ray_engine.connect(Engine(EngineKind.RAY), cpus)
        conn.send(("address", ray_engine.joined_address()))
    except Exception as e:  # any start-up failure is reported, whole
        lines = traceback.format_exception_only(type(e), e)
        conn.send(("error", " ".join(" ".join(lines).split())))
        return
    try:
        conn.recv()  # nothing is ever sent: this returns when the other end closes
    except EOFError:
        pass
    finally:
        ray_engine.release()
