"""`PackedRowsLoader`, what a trainer holds: opens one split of a promoted snapshot, hands
out this rank's static-shape batches epoch after epoch, and knows where the consumer stands
(`state_dict`), counting only batches the trainer received, never ones built ahead."""

from __future__ import annotations

import importlib
import os
import time
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from megacpp_pipeline.loader.batches import BatchBuilder
from megacpp_pipeline.loader.cache import RowGroupCache, default_cache_dir
from megacpp_pipeline.loader.errors import LoaderConfigError, LoaderStateError
from megacpp_pipeline.loader.manifest import open_split, read_snapshot_manifest
from megacpp_pipeline.loader.planning import EpochPlanner
from megacpp_pipeline.loader.prefetch import (
    END,
    Blocks,
    Prefetcher,
    ProducerFailure,
    Progress,
    start_warmer,
)
from megacpp_pipeline.loader.receipts import (
    BatchReceipt,
    BlockReceipts,
    ReceiptLog,
    ReceiptSummary,
    summarize_receipts,
)
from megacpp_pipeline.snapshot.fetch import local_snapshot
from megacpp_pipeline.snapshot.packed_rows import PACKED_SCHEMA_VERSION, packed_rows_schema


class _EpochIterator:
    """One pass over this rank's batches; counts what the consumer actually received."""

    def __init__(self, loader: PackedRowsLoader, epoch: int, start: int) -> None:
        self._loader = loader
        self._epoch = epoch
        planner, cache = loader._planner, loader.cache
        plan = planner.plan(epoch, start)
        # On a warm loader every row group is already mapped: no warmer thread, no waking
        # it for each row group.
        targets = []
        if loader.prefetch and not cache.all_open(planner.unit_keys):
            targets = [t for t in planner.warm_targets(plan) if not cache.is_open(*t[:2])]
        progress = Progress() if targets and loader.lookahead_row_groups > 0 else None
        blocks = loader._builder.blocks(plan, progress)
        self._blocks: Blocks | None = None
        self._prefetcher: Prefetcher | None = None
        self._finalizer: weakref.finalize[Any, Any]
        # the block being handed out; an empty one until the first arrives
        self._batches: list[Any] = []
        self._block = BlockReceipts(epoch, start, [], [], [], [], [], [], [], None)
        self._at = 0
        if loader.prefetch:
            name = f"megacpp-loader-{loader.split}-rank{loader.rank}"
            self._prefetcher = prefetcher = Prefetcher(blocks, depth=1, name=name)
            warmer = None
            if progress is not None:  # row groups to decode: start decoding ahead at once
                warmer = start_warmer(
                    cache, targets, progress, loader.lookahead_row_groups, prefetcher.stop, name
                )
            self._finalizer = weakref.finalize(self, prefetcher.close, warmer)
        else:
            self._blocks = blocks
            self._finalizer = weakref.finalize(self, blocks.close)
        self._done = False

    def __iter__(self) -> _EpochIterator:
        return self

    def __next__(self) -> dict[str, Any]:
        # the per-batch path: a list index and three counters
        at = self._at
        batches = self._batches
        if at < len(batches):
            batch = batches[at]
            batches[at] = None  # the trainer holds it now; the loader lets go
            self._at = self._block.delivered = at + 1
            self._loader.batch_index += 1
            return batch  # type: ignore[no-any-return]
        return self._next_block()

    def _next_block(self) -> dict[str, Any]:
        if self._done:
            raise StopIteration
        started = time.perf_counter()
        try:
            if self._prefetcher is not None:
                item = self._prefetcher.get()
            else:
                assert self._blocks is not None
                item = next(self._blocks, END)
        except BaseException:  # raised while this thread built the block itself
            self.close()
            raise
        # the trainer's stall for this block, whether it waited for the thread or built it
        wait_s = time.perf_counter() - started if self._prefetcher is not None else 0.0
        if item is END:
            self.close()
            self._loader._epoch_finished(self._epoch)
            raise StopIteration
        if isinstance(item, ProducerFailure):
            self.close()
            raise item.exc  # keeps the producer's frames in its __traceback__
        self._batches, self._block = item
        self._block.queue_wait_s = wait_s
        self._at = 0
        self._loader._log_block(self._block)
        return self.__next__()

    def close(self) -> None:
        self._done = True
        self._batches = []
        self._finalizer()

    def wait_for_prefetch(self, timeout: float) -> bool:
        """See `PackedRowsLoader.wait_for_prefetch`."""
        prefetcher = self._prefetcher
        return prefetcher is not None and not self._done and prefetcher.wait_ready(timeout)


class PackedRowsLoader:
    """Iterable over static-shape batches of one split of a promoted snapshot.

    Iterating once is one epoch; iterating again continues with the next epoch. Each batch
    is a dict column -> array: `[batch, seq_len]` for token columns, `[batch]` for per-row
    ones. Ranks cut disjoint slices out of each global batch of `batch_size * world_size`
    rows, so every rank takes the same number of steps (with `drop_last=False` the last
    batch may be short, and some ranks may have no last batch at all).

    Options the signature does not explain: `columns` restricts what each batch carries
    (all schema-known columns by default); `copy=False` hands out read-only views into the
    memory-mapped cache when a batch lies inside one row group (a copy otherwise);
    `cache_dir` holds the decoded row groups, shared by every loader and rank on the
    machine (default: a per-user directory under the system temp dir; nothing evicts it);
    `lookahead_row_groups` is how far ahead of the producer a second thread decodes on a
    cold cache; `receipt_history` bounds how many per-batch receipts are kept.

    With `prefetch`, batches are built in blocks (512 KiB at most) by a background thread
    while the trainer is busy with a step, one block ahead; a trainer that asks again at
    once (a benchmark loop) builds the next block itself, which is faster than waiting for
    a thread under the GIL. Either way the batches, their order and the resume position are
    the same; an error met while building surfaces at the batch where it happened, with the
    traceback of where it was raised.
    """

    def __init__(
        self,
        snapshot_dir: str | os.PathLike[str],
        split: str = "train",
        batch_size: int = 8,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = True,
        verify_sha256: bool = False,
        prefetch: bool = True,
        to_torch: bool = False,
        cache_dir: str | os.PathLike[str] | None = None,
        columns: Sequence[str] | None = None,
        copy: bool = True,
        receipt_history: int = 10_000,
        lookahead_row_groups: int = 4,
    ) -> None:
        if batch_size < 1:
            raise LoaderConfigError("batch_size", "must be at least 1")
        if world_size < 1 or not 0 <= rank < world_size:
            raise LoaderConfigError("rank", f"need 0 <= rank < world_size, got {rank}/{world_size}")
        if seed < 0:  # the shuffle's generator takes non-negative seeds only
            raise LoaderConfigError("seed", f"must be >= 0, got {seed}")
        self.snapshot_dir = local_snapshot(snapshot_dir)  # a URI: a local copy, fetched once
        self.manifest = read_snapshot_manifest(self.snapshot_dir)
        self.seq_len = self.manifest.seq_len
        self.split = split
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.drop_last = drop_last
        self.prefetch = prefetch
        self.lookahead_row_groups = lookahead_row_groups  # decoded ahead on a cold cache
        self.copy = copy or to_torch  # tensors need owned, writable memory
        torch: Any = None
        if to_torch:
            try:
                torch = importlib.import_module("torch")
            except ImportError as exc:
                raise LoaderConfigError("to_torch", "torch is not installed") from exc

        known = list(packed_rows_schema(self.seq_len).names)
        self.columns = tuple(columns) if columns is not None else tuple(known)
        for name in self.columns:
            if name not in known:
                raise LoaderConfigError("columns", f"{name!r} is not a packed-row column")

        shards = open_split(self.snapshot_dir, self.manifest, split, verify_sha256)
        self._planner = EpochPlanner(
            shards,
            self.columns,
            batch_size=batch_size,
            rank=rank,
            world_size=world_size,
            drop_last=drop_last,
            shuffle=shuffle,
            seed=seed,
        )
        self.total_rows = self._planner.total_rows
        self.cache = RowGroupCache(
            Path(cache_dir) if cache_dir is not None else default_cache_dir(), self.seq_len
        )
        self._shards = shards
        self._builder = BatchBuilder(
            self._planner,
            self.cache,
            shards,
            self.columns,
            seq_len=self.seq_len,
            batch_size=batch_size,
            copy=self.copy,
            torch=torch,
            pin=torch is not None and bool(torch.cuda.is_available()),
        )
        self.epoch = 0
        self.batch_index = 0  # batches of `epoch` already delivered to the consumer
        self._receipt_log = ReceiptLog(receipt_history, rank, self.seq_len)
        self._active: weakref.ReferenceType[_EpochIterator] | None = None

    # -- iteration ---------------------------------------------------------------------------

    def __len__(self) -> int:
        """Batches this rank receives per epoch."""
        return self._planner.batches

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self._close_active()
        iterator = _EpochIterator(self, self.epoch, self.batch_index)
        self._active = weakref.ref(iterator)
        return iterator

    def set_epoch(self, epoch: int) -> None:
        if epoch < 0:
            raise LoaderConfigError("epoch", f"must be >= 0, got {epoch}")
        self._close_active()
        self.epoch, self.batch_index = epoch, 0

    def row_group_order(self, epoch: int) -> np.ndarray:
        """Indices of the split's row groups in the order this epoch reads them."""
        return self._planner.row_group_order(epoch)

    def wait_for_prefetch(self, timeout: float) -> bool:
        """Block until the prefetch thread holds the next block ready, or has nothing left
        to build; True then. False at once when no thread runs (prefetch off, no pass under
        way, or a consumer that has not yet stayed away long enough for one to start), and
        False when `timeout` passes.

        A trainer never needs this. Tests use it for a step that lasts exactly as long as
        the thread needs, where a sleep would race a loaded machine.
        """
        active = self._active() if self._active is not None else None
        return active is not None and active.wait_for_prefetch(timeout)

    def _log_block(self, block: BlockReceipts) -> None:
        """The consumer started on `block`: it is where the run stands, and its receipts count."""
        self.epoch, self.batch_index = block.epoch, block.first_batch
        self._receipt_log.append(block)

    def _epoch_finished(self, epoch: int) -> None:
        self.epoch, self.batch_index = epoch + 1, 0

    # -- resume --------------------------------------------------------------------------------

    def _identity(self) -> dict[str, Any]:
        return {
            "snapshot_id": self.manifest.snapshot_id,
            "split": self.split,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "batch_size": self.batch_size,
            "world_size": self.world_size,
            "rank": self.rank,
            "drop_last": self.drop_last,
            "total_rows": self.total_rows,
        }

    def state_dict(self) -> dict[str, Any]:
        """Where the consumer stands: batches already received, not batches prefetched."""
        return {
            "format": PACKED_SCHEMA_VERSION,
            **self._identity(),
            "epoch": self.epoch,
            "batch_index": self.batch_index,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, expected in self._identity().items():
            if state.get(key) != expected:
                raise LoaderStateError(key, expected, state.get(key))
        batch_index = int(state["batch_index"])
        if not 0 <= batch_index <= len(self):
            raise LoaderStateError("batch_index", f"0..{len(self)}", batch_index)
        if int(state["epoch"]) < 0:
            raise LoaderStateError("epoch", ">= 0", int(state["epoch"]))
        self._close_active()
        self.epoch, self.batch_index = int(state["epoch"]), batch_index

    # -- receipts, cache, lifetime -----------------------------------------------------------

    @property
    def receipt_history(self) -> int:
        """How many of the last received batches keep their receipts."""
        return self._receipt_log.history

    @receipt_history.setter
    def receipt_history(self, batches: int) -> None:
        self._receipt_log.history = batches

    @property
    def receipts(self) -> list[BatchReceipt]:
        """Receipts of the last `receipt_history` batches the consumer received, oldest first."""
        return self._receipt_log.receipts()

    def receipt_summary(self) -> ReceiptSummary:
        return summarize_receipts(self.receipts)

    def warm_cache(self) -> float:
        """Decode every row group of this split into the cache now; returns seconds spent."""
        spent = 0.0
        for shard in self._shards:
            for group, rows in enumerate(shard.row_group_rows):
                if rows:
                    spent += self.cache.views(shard, group)[1]
        return spent

    def _close_active(self) -> None:
        active = self._active() if self._active is not None else None
        if active is not None:
            active.close()
        self._active = None

    def close(self) -> None:
        self._close_active()
        self.cache.close()

    def __enter__(self) -> PackedRowsLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_active", None) is not None:
            self._close_active()
