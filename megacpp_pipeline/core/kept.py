"""A memo of at most a few values by key, the least recently used dropped first, safe
across threads:
what a long-lived process (a Dagster code server, a test session, a worker) keeps of the
artifacts, catalogs and manifests it met, without growing with every one it ever meets."""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Kept(Generic[K, V]):
    """At most `keep` values by key; the one used least recently goes when another comes."""

    def __init__(self, keep: int) -> None:
        if keep < 1:
            raise ValueError(f"a memo keeps at least one value, not {keep}")
        self.keep = keep
        self._values: dict[K, V] = {}
        self._lock = threading.Lock()
        _EVERY.add(self)

    def get(self, key: K, make: Callable[[], V]) -> V:
        """The value kept for `key`, else `make()`'s, kept. `make` runs outside the lock (it
        may be slow, and may raise: then nothing is kept); where two threads make the same
        key at once, both get the value the first of them kept."""
        with self._lock:
            if key in self._values:
                found = self._values[key] = self._values.pop(key)  # now the most recent
                return found
        value = make()
        with self._lock:
            if key in self._values:
                return self._values[key]
            while len(self._values) >= self.keep:
                del self._values[next(iter(self._values))]
            self._values[key] = value
        return value

    def __getstate__(self) -> dict[str, int]:
        """Pickled (an object that holds a memo, sent to a worker or a Ray task), a memo
        arrives empty: what a process kept is that process's."""
        return {"keep": self.keep}

    def __setstate__(self, state: dict[str, int]) -> None:
        self.keep = state["keep"]
        self._values = {}
        self._lock = threading.Lock()
        _EVERY.add(self)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._values

    def __len__(self) -> int:
        with self._lock:
            return len(self._values)

    def clear(self) -> None:
        with self._lock:
            self._values.clear()


# Every memo of this process: a process forked while another thread held a memo's lock (the
# pipeline forks its workers from threaded drivers) gets fresh locks, never a held one.
_EVERY: weakref.WeakSet[Kept[Any, Any]] = weakref.WeakSet()


def _fresh_locks() -> None:
    for kept in list(_EVERY):
        kept._lock = threading.Lock()


os.register_at_fork(after_in_child=_fresh_locks)
