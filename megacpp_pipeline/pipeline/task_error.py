"""How a map task's error gets from its worker (a forked process, a Ray task) to the driver.
The worker catches it and returns a `TaskError`, which always pickles: the error itself,
pickled, when it comes back from pickle as the same type and message, else only its type's
name and its message; and its traceback's text. The driver raises the error as it was, with
the worker's traceback as its cause, or, when it cannot be rebuilt there, a `TaskFailed`
that names the original type and message. An error is a task's result, not a dead worker:
the executor never runs its task again."""

from __future__ import annotations

import pickle
import traceback
from dataclasses import dataclass

from megacpp_pipeline.core.errors import FieldedError


class TaskFailed(FieldedError, RuntimeError):
    """A task raised an error the driver cannot rebuild (its class does not pickle, or is
    not importable here); names the original type and carries its message."""

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.message = message


class RemoteTraceback(Exception):
    """The traceback of a task's error as the worker saw it (the error's `__cause__`)."""

    def __str__(self) -> str:
        return f"\n{self.args[0]}" if self.args else ""


@dataclass(frozen=True)
class TaskError:
    """A task's error on its way to the driver, as the task's result."""

    type_name: str
    message: str
    traceback: str
    pickled: bytes | None  # the error, when it pickles to the same type and message

    @classmethod
    def of(cls, error: BaseException) -> TaskError:
        kind = type(error)
        message = _message(error)
        try:
            blob: bytes | None = pickle.dumps(error, protocol=pickle.HIGHEST_PROTOCOL)
            back = pickle.loads(blob)  # type: ignore[arg-type]
            if type(back) is not kind or _message(back) != message:
                blob = None
        except Exception:  # a class with a required __init__ argument, a lock in a field
            blob = None
        return cls(
            f"{kind.__module__}.{kind.__qualname__}",
            message,
            "".join(traceback.format_exception(error)),
            blob,
        )

    def error(self) -> BaseException:
        """The error as the worker raised it, else a TaskFailed naming it; its cause is the
        worker's traceback."""
        rebuilt: BaseException | None = None
        if self.pickled is not None:
            try:
                rebuilt = pickle.loads(self.pickled)
            except Exception:  # the class is not importable here (another node's code)
                rebuilt = None
        if rebuilt is None or not isinstance(rebuilt, Exception):
            # a SystemExit raised by task code fails the task, never the driver's process
            rebuilt = TaskFailed(self.type_name, self.message)
        rebuilt.__cause__ = RemoteTraceback(self.traceback)
        return rebuilt


def _message(error: BaseException) -> str:
    try:
        return str(error)
    except Exception:  # a __str__ that fails on a half-built error
        return repr(error.args)
