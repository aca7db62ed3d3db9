"""How the library's errors cross a process boundary whole. An error that names its file, field
and rule builds its message in `__init__` from those fields; pickle's default for an
exception calls the class again with the message as the only argument, which such an
`__init__` refuses (or mangles), so a worker's error could not reach the driver. A
`FieldedError` is pickled as its message and its fields instead, never through `__init__`."""

from __future__ import annotations

from typing import Any


class FieldedError(Exception):
    """Base of an error whose `__init__` takes named fields rather than its message: it
    pickles to the same type, message and fields (a forked worker or a Ray task raises it,
    the driver re-raises it as it was)."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args), self.__dict__)


def _rebuild(cls: type[BaseException], args: tuple[Any, ...]) -> BaseException:
    # BaseException.__new__ sets `args` (the message) without running the class's __init__;
    # the fields come back from the pickled __dict__
    return cls.__new__(cls, *args)
