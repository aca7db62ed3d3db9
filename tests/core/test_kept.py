"""core.kept: a memo that keeps a few values, drops the least recently used first, keeps
nothing a failed make would have given, and gives two threads making one key one value."""

from __future__ import annotations

import pickle
import threading

import pytest

from megacpp_pipeline.core.kept import Kept


def test_a_value_is_made_once_and_the_least_recently_used_goes_when_a_new_one_comes() -> None:
    made: list[str] = []

    def make(key: str) -> str:
        made.append(key)
        return key.upper()

    kept: Kept[str, str] = Kept(2)
    assert kept.get("a", lambda: make("a")) == "A"
    assert kept.get("a", lambda: make("a")) == "A" and made == ["a"]
    kept.get("b", lambda: make("b"))
    kept.get("a", lambda: make("a"))  # used again: "b" is now the least recently used
    kept.get("c", lambda: make("c"))
    assert "b" not in kept and "a" in kept and "c" in kept and len(kept) == 2
    kept.get("b", lambda: make("b"))
    assert made == ["a", "b", "c", "b"] and "a" not in kept
    kept.clear()
    assert len(kept) == 0


def test_none_is_a_value_and_a_failed_make_keeps_nothing() -> None:
    kept: Kept[str, int | None] = Kept(4)
    calls = []

    def none() -> None:
        calls.append(1)

    assert kept.get("k", none) is None and kept.get("k", none) is None and calls == [1]

    def fails() -> int:
        raise OSError("gone")

    with pytest.raises(OSError, match="gone"):
        kept.get("x", fails)
    assert "x" not in kept and kept.get("x", lambda: 7) == 7
    with pytest.raises(ValueError, match="at least one"):
        Kept(0)


def test_two_threads_making_one_key_get_the_value_kept_first() -> None:
    kept: Kept[str, object] = Kept(2)
    both_making = threading.Barrier(2)
    got: list[object] = []

    def make() -> object:
        both_making.wait(timeout=10)  # each thread is inside make before either keeps
        return object()

    threads = [threading.Thread(target=lambda: got.append(kept.get("k", make))) for _ in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 2 and got[0] is got[1] and len(kept) == 1


def test_a_pickled_memo_arrives_empty_with_its_bound_and_works() -> None:
    """An object holding a memo (a store sent to a worker or a Ray task) pickles: the memo
    comes without its values (they are the sending process's) and keeps its bound."""
    kept: Kept[str, int] = Kept(2)
    kept.get("a", lambda: 1)
    copy = pickle.loads(pickle.dumps(kept))
    assert len(copy) == 0 and copy.keep == 2 and "a" in kept
    assert copy.get("b", lambda: 2) == 2 and copy.get("c", lambda: 3) == 3
    copy.get("d", lambda: 4)
    assert len(copy) == 2


def test_a_process_forked_while_a_lock_is_held_gets_a_memo_it_can_use() -> None:
    """The pipeline forks its workers from drivers with threads: a child forked while
    another thread held a memo's lock would wait for it forever."""
    import os

    kept: Kept[str, int] = Kept(2)
    kept.get("a", lambda: 1)
    with kept._lock:  # held, as by another thread, at the fork
        pid = os.fork()
        if pid == 0:  # the child: the memo's values came along, its lock is free
            if not kept._lock.acquire(timeout=5):
                os._exit(2)
            kept._lock.release()
            ok = kept.get("a", lambda: 2) == 1 and kept.get("b", lambda: 3) == 3
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
