"""The prefetch side of the loader: a background thread that builds blocks of batches ahead
while the trainer is busy with a step (errors cross to the consumer with their traceback),
and a warmer thread that decodes the next row groups into the cache on a cold start."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Generator
from typing import Any

from megacpp_pipeline.loader.cache import RowGroupCache
from megacpp_pipeline.loader.manifest import Shard
from megacpp_pipeline.loader.receipts import BlockReceipts

CONSUMER_AWAY_S = 0.001  # a consumer gone this long is busy with a step: see Prefetcher

END = object()
Item = Any  # tuple[list[batch], BlockReceipts], END or ProducerFailure
Blocks = Generator[tuple[list[Any], BlockReceipts], None, None]


class ProducerFailure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class Prefetcher:
    """Blocks in order, built ahead by a background thread while the consumer is busy, or
    by the consumer itself when none is ready and the thread is not in the middle of one.

    Building a block is mostly Python, which holds the GIL, so a consumer that comes
    straight back for more gains nothing from a thread: sleeping and being woken by it costs
    two thread switches, as much as building a small block. So the thread starts only once
    the consumer has stayed away (a training step, which is what prefetch is for), and
    then keeps `depth` blocks ready; a consumer that finds none ready and the thread idle
    builds the next one itself.
    Order: only the holder of `_building` advances the generator, and the thread files its
    block in `_ready` before letting go, so a block the consumer builds is always the next.
    """

    def __init__(self, blocks: Blocks, depth: int, name: str) -> None:
        self._blocks = blocks
        self._depth = depth
        # started by the first `get` after the consumer stayed away
        self._thread = threading.Thread(target=self.run_producer, name=name, daemon=True)
        self._ready: deque[Item] = deque()
        self._building = threading.Lock()
        self._changed = threading.Condition()
        self._finished = False  # the generator ended or failed; nothing more to build
        self._consumer_seen = 0.0  # when the consumer last asked for a block
        self._away = 0  # consecutive asks after the consumer stayed away
        self.stop = threading.Event()

    def _advance(self) -> Item:
        # only with `_building` held
        if self._finished:
            return END
        try:
            return next(self._blocks)
        except StopIteration:
            self._finished = True
            return END
        except BaseException:
            self._finished = True
            raise

    def get(self) -> Item:
        """The next item: taken from `_ready`, built here, or waited for."""
        now = time.perf_counter()
        seen, self._consumer_seen = self._consumer_seen, now
        if self._thread.ident is None:
            # twice in a row: one long gap may just be this process losing its core
            self._away = self._away + 1 if seen and now - seen > CONSUMER_AWAY_S else 0
            if self._away < 2:
                return self._advance()  # no other thread touches the generator yet
            self._thread.start()
        with self._changed:
            if self._ready:
                item = self._ready.popleft()
                self._changed.notify_all()
                return item
        if self._building.acquire(blocking=False):
            try:
                with self._changed:  # the thread may have filed one just before letting go
                    if self._ready:
                        item = self._ready.popleft()
                        self._changed.notify_all()
                        return item
                return self._advance()
            finally:
                self._building.release()
        with self._changed:
            while not self._ready:
                self._changed.wait()
            item = self._ready.popleft()
            self._changed.notify_all()
            return item

    def wait_ready(self, timeout: float) -> bool:
        """Block until the thread holds the next block ready, or nothing is left to build.

        False at once if the thread has not started, and False when `timeout` passes.
        """
        if self._thread.ident is None:
            return False
        with self._changed:
            return self._changed.wait_for(
                lambda: bool(self._ready) or self._finished or self.stop.is_set(), timeout
            )

    def run_producer(self) -> None:
        """The background thread: keep `depth` blocks ready until the end or `stop`."""
        # The thread holds this object, never the consumer-side iterator, so dropping the
        # iterator lets its finalizer stop the thread.
        while not self.stop.is_set():
            with self._changed:
                while len(self._ready) >= self._depth and not self.stop.is_set():
                    self._changed.wait(0.05)
            # a consumer back within the grace builds the next block itself (see above)
            away = time.perf_counter() - self._consumer_seen
            if away < CONSUMER_AWAY_S:
                if self.stop.wait(2 * CONSUMER_AWAY_S - away):
                    return
                continue
            with self._building:
                if self._finished:
                    return
                try:
                    item = self._advance()
                except BaseException as exc:  # crosses to the consumer, which re-raises it
                    item = ProducerFailure(exc)
                with self._changed:
                    self._ready.append(item)
                    self._changed.notify_all()

    def close(self, warmer: threading.Thread | None) -> None:
        self.stop.set()
        with self._changed:
            self._ready.clear()
            self._changed.notify_all()
        if threading.current_thread() is self._thread:
            return  # collected on the producer thread: it stops on its own, mid-block or not
        me = threading.current_thread()
        for thread in [t for t in (self._thread, warmer) if t is not None and t is not me]:
            if thread.ident is not None:  # started
                thread.join(timeout=10)
        if self._building.acquire(timeout=10):
            try:
                self._finished = True
                self._blocks.close()
            finally:
                self._building.release()


class Progress:
    """The plan position the producer has reached, so the warmer stays a bounded way ahead."""

    def __init__(self) -> None:
        self.position = -1
        self.changed = threading.Condition()

    def advance(self, position: int) -> None:
        with self.changed:
            self.position = position
            self.changed.notify_all()


def run_warmer(
    cache: RowGroupCache,
    targets: list[tuple[Shard, int, int]],
    progress: Progress,
    lookahead: int,
    stop: threading.Event,
) -> None:
    # Decoding happens in pyarrow with the GIL released, so on a cold cache the next row
    # groups are decoded on another core while the trainer works through the current one.
    targets = [t for t in targets if not cache.entry_path(t[0], t[1]).is_file()]
    for shard, group, position in targets:
        with progress.changed:
            while not stop.is_set() and position > progress.position + lookahead:
                progress.changed.wait(0.1)
        if stop.is_set():
            return
        try:
            cache.ensure(shard, group)
        except Exception:  # the producer meets the same error on its own path and reports it
            return


def start_warmer(
    cache: RowGroupCache,
    targets: list[tuple[Shard, int, int]],
    progress: Progress,
    lookahead: int,
    stop: threading.Event,
    name: str,
) -> threading.Thread:
    """The warmer thread, started: decodes `targets` at most `lookahead` ahead of `progress`."""
    warmer = threading.Thread(
        target=run_warmer,
        args=(cache, targets, progress, lookahead, stop),
        name=f"{name}-warmer",
        daemon=True,
    )
    warmer.start()
    return warmer
