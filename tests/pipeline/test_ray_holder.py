"""The local Ray instance one `megacpp run --engine ray` holds for all its runs
(pipeline/ray_holder.py): it starts, answers with an address, and ends by itself as soon as
its owner closes it."""

from __future__ import annotations

import multiprocessing

import pytest

from megacpp_pipeline.pipeline.ray_holder import LocalInstance

ray = pytest.importorskip("ray", reason="ray is not installed (pip install -e '.[dev,cluster]')")
pytestmark = pytest.mark.cluster


def test_closing_ends_the_holder_by_itself_not_by_the_kill_after_the_timeout() -> None:
    """The holder waits for its pipe to read as closed. Forked with a copy of its owner's end
    left open, it never saw that: every command waited out the 60 s join and killed it."""
    held = LocalInstance(1)
    assert held.address.count(":") == 1, held.address
    held.close()
    assert held.exitcode == 0, f"the holder was killed (exit {held.exitcode})"


def test_a_process_forked_while_the_instance_is_held_does_not_keep_it_alive() -> None:
    """The runs are forked from the owner while the instance is held and inherit its end of
    the pipe; once they have exited, closing still ends the holder by itself."""
    held = LocalInstance(1)
    child = multiprocessing.get_context("fork").Process(target=lambda: None)
    child.start()
    child.join()
    held.close()
    assert held.exitcode == 0, f"the holder was killed (exit {held.exitcode})"
