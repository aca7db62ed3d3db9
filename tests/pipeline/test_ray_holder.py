"""The local Ray instance one `megacpp run --engine ray` holds for all its runs
(pipeline/ray_holder.py): it starts, answers with an address, and ends by itself as soon as
its owner closes it.

Each case runs in a fresh interpreter, as `megacpp run` does: the holder is forked, and a
process that has joined Ray (as this test process may have, after the engine's tests)
cannot fork one that starts Ray again."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("ray", reason="ray is not installed (pip install -e '.[dev,cluster]')")
pytestmark = pytest.mark.cluster


def _in_a_fresh_process(body: str) -> str:
    script = textwrap.dedent(
        """
        import multiprocessing
        from megacpp_pipeline.pipeline.ray_holder import LocalInstance

        held = LocalInstance(1)
        assert held.address.count(":") == 1, held.address
        """
    ) + textwrap.dedent(body)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_closing_ends_the_holder_by_itself_not_by_the_kill_after_the_timeout() -> None:
    """The holder waits for its pipe to read as closed. Forked with a copy of its owner's end
    left open, it never saw that: every command waited out the 60 s join and killed it."""
    exitcode = _in_a_fresh_process(
        """
        held.close()
        print(held.exitcode)
        """
    )
    assert exitcode == "0", f"the holder was killed (exit {exitcode})"


def test_a_process_forked_while_the_instance_is_held_does_not_keep_it_alive() -> None:
    """The runs are forked from the owner while the instance is held and inherit its end of
    the pipe; once they have exited, closing still ends the holder by itself."""
    exitcode = _in_a_fresh_process(
        """
        child = multiprocessing.get_context("fork").Process(target=lambda: None)
        child.start()
        child.join()
        held.close()
        print(held.exitcode)
        """
    )
    assert exitcode == "0", f"the holder was killed (exit {exitcode})"
