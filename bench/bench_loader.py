"""Loader throughput against the physical ceiling, in one run (issue 8, "Measured").

Builds a packed-row snapshot of realistic shape (seq_len 2048, zstd parquet), lays the same
`input_ids` out as a flat `.bin`, and measures tokens/s for: np.memmap copies of that file
(the ceiling), plain parquet decoding, the loader with a cold and a warm row-group cache,
and our own `.idx` reader against megatron-core's `IndexedDataset` on the same `.bin`/`.idx`
(every document, then random training samples) when megatron-core is installed. A simulated
20 ms training step shows the queue wait with prefetch, on a cold and a warm cache, and the
staged receipts are printed.

Like with like: every warm figure hands the consumer an owned, writable, C-contiguous copy
of the same `[batch, seq_len]` tokens (np.memmap: `np.array(data[a:b])`; the loader:
`copy=True`, its default), through the same `for batch in ...` loop, which holds each batch
until the next arrives, as a trainer does. Both keep their memory maps open across passes.
Each pass runs whole epochs for at least `--min-pass-ms`; memmap and loader passes alternate
(ABBA) and the ratio is the median of the pairs.

megatron-core imports torch and takes seconds to load, so it is measured in a child process
that imports while this one builds the snapshot and takes the cold-cache figures (those are
informational and share the machine with that import); the child measures only once this
process is idle, our reader alongside megatron-core's, and the warm-cache figures (the
targets: throughput, and the queue wait at a 20 ms step) come last.

    .venv/bin/python -m bench.bench_loader [--rows 8192] [--json PATH]
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from megacpp_pipeline.loader import PackedRowsLoader
from megacpp_pipeline.snapshot.megatron import IndexedDatasetReader, export_snapshot
from megacpp_pipeline.snapshot.packed_rows import fixed_list_to_numpy
from tests.fixtures.snapshot_fixture import build_snapshot

Pass = Callable[[], tuple[int, float, float]]  # tokens, wall seconds, CPU seconds


def _rate(tokens: int, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else float("inf")


def _flat_bin(snapshot: Path, shards: list[str], seq_len: int, out: Path) -> int:
    rows = 0
    with out.open("wb") as handle:
        for shard in shards:
            table = pq.read_table(snapshot / shard, columns=["input_ids"])
            tokens = fixed_list_to_numpy(table.column("input_ids"), seq_len)
            handle.write(np.ascontiguousarray(tokens).tobytes())
            rows += len(tokens)
    return rows


def _memmap_epoch(data: np.ndarray, batch: int) -> Iterator[np.ndarray]:
    """What a trainer reading a flat .bin does per step: slice a batch, copy it out."""
    for first in range(0, len(data) - batch + 1, batch):
        yield np.array(data[first : first + batch])


def _timed(
    epoch: Callable[[], Iterable[Any]], tokens_of: Callable[[Any], int], min_s: float
) -> Pass:
    """A pass: whole epochs through one consumer loop until `min_s` has gone by.

    The loop variable holds each batch until the next one arrives, as a training loop does.
    """

    def run() -> tuple[int, float, float]:
        tokens = 0
        started, cpu = time.perf_counter(), time.process_time()
        while True:
            for batch in epoch():
                tokens += tokens_of(batch)
            elapsed = time.perf_counter() - started
            if elapsed >= min_s:
                return tokens, elapsed, time.process_time() - cpu

    return run


def _memmap_bulk(data: np.ndarray) -> tuple[int, float]:
    """The bandwidth ceiling: 16 MB copies into one reused buffer, no per-batch work."""
    step = max(1, min(len(data), (16 << 20) // data[0].nbytes))
    out = np.empty((step, data.shape[1]), dtype=data.dtype)
    started = time.perf_counter()
    for first in range(0, len(data) - step + 1, step):
        np.copyto(out, data[first : first + step])
    return (len(data) // step) * step * data.shape[1], time.perf_counter() - started


def _parquet_pass(snapshot: Path, shards: list[str], seq_len: int) -> tuple[int, float]:
    tokens = 0
    started = time.perf_counter()
    for shard in shards:
        parquet = pq.ParquetFile(snapshot / shard)
        for group in range(parquet.num_row_groups):
            table = parquet.read_row_group(group, columns=["input_ids"])
            tokens += fixed_list_to_numpy(table.column("input_ids"), seq_len).size
    return tokens, time.perf_counter() - started


def _loader_pass(loader: PackedRowsLoader) -> tuple[int, float]:
    tokens = 0
    started = time.perf_counter()
    for batch in loader:
        tokens += batch["input_ids"].size
    return tokens, time.perf_counter() - started


@dataclass
class _Paired:
    best: float  # tokens/s, best pass of `run`
    ratio: float  # median of run/baseline tokens/s over the pairs (wall clock)
    cpu_ratio: float  # the same with CPU time of this process (all threads)


def _paired(passes: int, baseline: Pass, run: Pass) -> _Paired:
    """Alternate baseline and run (ABBA), so neither always goes first on a shared machine."""
    rates, ratios, cpu_ratios = [], [], []
    for index in range(passes):
        order = (baseline, run) if index % 2 == 0 else (run, baseline)
        results = {id(f): f() for f in order}
        (b_tokens, b_wall, b_cpu), (tokens, wall, cpu) = results[id(baseline)], results[id(run)]
        rates.append(_rate(tokens, wall))
        ratios.append(rates[-1] / _rate(b_tokens, b_wall))
        cpu_ratios.append(_rate(tokens, cpu) / _rate(b_tokens, b_cpu))
    return _Paired(max(rates), float(np.median(ratios)), float(np.median(cpu_ratios)))


def _stepped(loader: PackedRowsLoader, steps: int, step_s: float) -> None:
    iterator = iter(loader)
    for _ in range(steps):
        next(iterator)
        time.sleep(step_s)  # the simulated training step


# -- the .idx readers, in a child process ------------------------------------------------------


def _idx_passes(prefix: Path, passes: int, seq_len: int, samples: int) -> dict[str, Any]:
    """Our reader and (when installed) megatron-core's on one .bin/.idx, passes alternating:
    every document whole, then `samples` random training samples (seq_len + 1 tokens from
    a random offset, as megatron's GPTDataset cuts them). Each read is copied out."""
    figures: dict[str, Any] = {"megatron_core_installed": False}
    megatron_reader: Any = None
    if importlib.util.find_spec("megatron") is not None:
        import torch
        from megatron.core.datasets.indexed_dataset import IndexedDataset

        megatron_reader = IndexedDataset
        figures.update(
            megatron_core_installed=True,
            megatron_core_version=importlib.metadata.version("megatron-core"),
            torch_version=str(torch.__version__),
        )
    print("ready", flush=True)
    sys.stdin.readline()  # the files exist now, and the parent is idle
    readers: dict[str, Any] = {"own_idx": IndexedDatasetReader(prefix)}
    if megatron_reader is not None:
        readers["megatron_core"] = megatron_reader(str(prefix))

    own = readers["own_idx"]
    lengths = own.sequence_lengths.astype(np.int64)
    rng = np.random.default_rng(0)
    docs = rng.integers(0, len(own), size=samples)
    offsets = (rng.random(samples) * lengths[docs]).astype(np.int64)
    sizes = np.minimum(seq_len + 1, lengths[docs] - offsets)
    wanted = [(int(d), int(o), int(n)) for d, o, n in zip(docs, offsets, sizes, strict=True)]

    def documents(reader: Any) -> tuple[int, float]:
        started, tokens = time.perf_counter(), 0
        for index in range(len(reader)):
            tokens += np.array(reader[index]).size
        return tokens, time.perf_counter() - started

    def sampled(reader: Any) -> tuple[int, float]:
        started, tokens = time.perf_counter(), 0
        for index, offset, length in wanted:
            tokens += np.array(reader.get(index, offset, length)).size
        return tokens, time.perf_counter() - started

    for kind, read in (("doc", documents), ("sample", sampled)):
        rates: dict[str, list[float]] = {name: [] for name in readers}
        for index in range(passes):
            names = list(readers) if index % 2 == 0 else list(reversed(readers))
            for name in names:
                rates[name].append(_rate(*read(readers[name])))
        for name, values in rates.items():
            figures[f"{name}_{kind}_tok_s"] = max(values)
        if "megatron_core" in readers:
            pairs = np.array(rates["own_idx"]) / np.array(rates["megatron_core"])
            figures[f"ratio_own_idx_vs_megatron_core_{kind}"] = float(np.median(pairs))
    figures["idx_samples"] = samples
    return figures


def _idx_child_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--idx-child", type=Path, required=True)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--samples", type=int, default=20000)
    args = parser.parse_args(argv)
    figures = _idx_passes(args.idx_child, args.passes, args.seq_len, args.samples)
    print(json.dumps(figures), flush=True)


class _IdxChild:
    """The child process that measures the .idx readers: started early, asked to measure late."""

    def __init__(self, prefix: Path, passes: int, seq_len: int, samples: int) -> None:
        self.process = subprocess.Popen(
            [
                *(sys.executable, "-W", "ignore", "-m", "bench.bench_loader"),
                *("--idx-child", str(prefix), "--passes", str(passes)),
                *("--seq-len", str(seq_len), "--samples", str(samples)),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def measure(self) -> dict[str, Any]:
        process = self.process
        assert process.stdin is not None and process.stdout is not None
        started = time.perf_counter()
        if process.stdout.readline().strip() != "ready":
            _, errors = process.communicate(timeout=60)
            raise RuntimeError(f".idx reader child failed:\n{errors}")
        waited = time.perf_counter() - started  # import time this process did not hide
        out, errors = process.communicate("go\n", timeout=300)
        if process.returncode:
            raise RuntimeError(f".idx reader child failed:\n{errors}")
        figures = dict(json.loads(out.strip().splitlines()[-1]))
        figures["idx_child_ready_wait_s"] = waited
        return figures


# -- the run ---------------------------------------------------------------------------------


@dataclass
class _Row:
    name: str
    key: str
    tok_s: float | None
    bytes_per_token: int
    batch: int = 0  # 0: not batched like a trainer step
    paired: _Paired | None = None  # against np.memmap at the same batch


def main() -> None:
    if "--idx-child" in sys.argv:
        _idx_child_main(sys.argv[1:])
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=8192, help="approximate train rows")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--large-batch", type=int, default=64)
    parser.add_argument("--rows-per-shard", type=int, default=2048)
    parser.add_argument("--row-group-rows", type=int, default=64)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--passes", type=int, default=5, help="paired passes per warm figure")
    parser.add_argument("--min-pass-ms", type=float, default=40.0, help="per timed pass")
    parser.add_argument("--samples", type=int, default=20000, help="random .idx samples")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    run_started = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="bench-loader-", dir=args.workdir))
    figures: dict[str, Any] = {}
    results: list[_Row] = []
    all_bytes = 4 + 4 + 1 + 4 + 1  # per token: input, target, loss mask, doc ids, chunk kind
    min_s = args.min_pass_ms / 1e3
    child: _IdxChild | None = None
    try:
        # the child imports megatron-core (seconds) while this process builds and measures
        # the cold, informational figures; it measures once this process is idle, and the
        # target figures (warm cache) come after it, on a machine it no longer loads
        prefix = workdir / "megatron" / "train"
        child = _IdxChild(prefix, args.passes, args.seq_len, args.samples)
        started = time.perf_counter()
        fixture = build_snapshot(
            workdir / "snapshot",
            seq_len=args.seq_len,
            vocab_size=32768,
            docs_per_split={"train": args.rows // 2, "validation": 16},
            max_doc_tokens=4 * args.seq_len,
            rows_per_shard=args.rows_per_shard,
            row_group_rows=args.row_group_rows,
            compression="zstd",
            content_hashes=False,
        )
        figures["build_snapshot_s"] = time.perf_counter() - started
        snapshot, seq_len, batch, passes = fixture.path, args.seq_len, args.batch_size, args.passes
        shards = fixture.splits["train"].shards
        flat = workdir / "input_ids.bin"
        rows = _flat_bin(snapshot, shards, seq_len, flat)
        figures.update(
            rows=rows,
            tokens=rows * seq_len,
            parquet_mb=sum((snapshot / s).stat().st_size for s in shards) / 1e6,
        )
        started = time.perf_counter()
        export = export_snapshot(snapshot, prefix)
        figures["megatron_export_s"] = time.perf_counter() - started
        export_bytes = np.dtype(export.dtype).itemsize

        def loader(size: int, **options: Any) -> PackedRowsLoader:
            return PackedRowsLoader(
                snapshot, batch_size=size, cache_dir=workdir / "cache", **options
            )

        parquet = _rate(*_parquet_pass(snapshot, shards, seq_len))
        results.append(_Row("plain parquet -> numpy, input_ids", "parquet_tok_s", parquet, 4))
        cold = loader(batch, columns=["input_ids"])
        cold_rate = _rate(*_loader_pass(cold))  # the first epoch decodes every row group
        cold_summary = cold.receipt_summary()
        results.append(
            _Row(
                "loader, cold cache, input_ids, prefetch", "loader_cold_tok_s", cold_rate, 4, batch
            )
        )
        step_s = args.step_ms / 1e3
        steps = min(args.steps, rows // batch)
        shutil.rmtree(workdir / "cache")
        cold_stepped = loader(batch)
        _stepped(cold_stepped, steps, step_s)
        cold_step_summary = cold_stepped.receipt_summary()

        figures.update(child.measure())  # the child measures while this process waits
        child = None
        own_doc = figures.get("own_idx_doc_tok_s")
        results.append(
            _Row("own .idx reader, per document", "own_idx_tok_s", own_doc, export_bytes)
        )
        results.append(
            _Row(
                "megatron-core IndexedDataset, per document",
                "megatron_core_tok_s",
                figures.get("megatron_core_doc_tok_s"),
                export_bytes,
            )
        )
        for name, key in (("own .idx reader", "own_idx"), ("megatron-core", "megatron_core")):
            results.append(
                _Row(
                    f"{name}, random samples of {seq_len + 1} tokens",
                    f"{key}_sample_tok_s",
                    figures.get(f"{key}_sample_tok_s"),
                    export_bytes,
                )
            )

        stepped = loader(batch)
        stepped.warm_cache()
        _stepped(stepped, steps, step_s)
        step_summary = stepped.receipt_summary()
        data = np.memmap(flat, dtype=np.int32, mode="r", shape=(rows, seq_len)).view(np.ndarray)
        _memmap_bulk(data)  # page cache warm-up
        bulk = max(_rate(*_memmap_bulk(data)) for _ in range(passes))
        results.append(_Row("np.memmap, 16 MB copies (bandwidth)", "memmap_bulk_tok_s", bulk, 4))
        for size in sorted({batch, args.large_batch}):
            memmap = _timed(functools.partial(_memmap_epoch, data, size), np.size, min_s)
            results.append(
                _Row(
                    "np.memmap, one batch copy per step",
                    f"memmap_b{size}_tok_s",
                    max(_rate(*memmap()[:2]) for _ in range(passes)),
                    4,
                    size,
                )
            )
            for columns, per_token, label in ((["input_ids"], 4, "ids"), (None, all_bytes, "all")):
                for prefetch in (False, True):
                    # one loader across epochs, as in training: its memory maps stay open
                    warm = loader(size, columns=columns, prefetch=prefetch)
                    _loader_pass(warm)  # maps every row group once
                    mode = "prefetch" if prefetch else "sync"
                    paired = _paired(
                        passes,
                        memmap,
                        _timed(warm.__iter__, _input_ids_size, min_s),
                    )
                    results.append(
                        _Row(
                            f"loader, warm cache, shuffled, "
                            f"{'input_ids' if columns else 'all 8 columns'}, {mode}",
                            f"loader_warm_b{size}_{label}_{mode}_tok_s",
                            paired.best,
                            per_token,
                            size,
                            paired,
                        )
                    )
    finally:
        if child is not None:
            child.process.kill()
        shutil.rmtree(workdir, ignore_errors=True)

    for r in results:
        figures[r.key] = r.tok_s
        if r.paired is not None:
            name = r.key.removesuffix("_tok_s")
            figures[f"ratio_{name}_tokens_vs_memmap"] = r.paired.ratio
            figures[f"ratio_{name}_bytes_vs_memmap"] = r.paired.ratio * r.bytes_per_token / 4
            figures[f"ratio_{name}_tokens_vs_memmap_cpu"] = r.paired.cpu_ratio
    queue_wait, cold_wait = (
        step_summary.stages["queue_wait_s"],
        cold_step_summary.stages["queue_wait_s"],
    )
    figures.update(
        export_documents=export.documents,
        export_dtype=export.dtype,
        step_ms=args.step_ms,
        steps=steps,
        warm_queue_wait_mean_ms=queue_wait.mean_ms,
        warm_queue_wait_p95_ms=queue_wait.p95_ms,
        warm_queue_wait_max_ms=queue_wait.max_ms,
        cold_queue_wait_mean_ms=cold_wait.mean_ms,
        cold_queue_wait_p95_ms=cold_wait.p95_ms,
        cold_queue_wait_max_ms=cold_wait.max_ms,
        cold_row_groups_decoded=cold_stepped.cache.decoded,
        min_pass_ms=args.min_pass_ms,
        passes=passes,
        run_s=time.perf_counter() - run_started,
    )
    _report(args, figures, results, step_summary, cold_step_summary, cold_summary, cold_stepped)


def _input_ids_size(batch: dict[str, Any]) -> int:
    return int(batch["input_ids"].size)


def _report(
    args: argparse.Namespace,
    figures: dict[str, Any],
    results: list[_Row],
    step_summary: Any,
    cold_step_summary: Any,
    cold_summary: Any,
    cold_stepped: PackedRowsLoader,
) -> None:
    rows, seq_len = figures["rows"], args.seq_len
    print(
        f"# loader bench: {rows} rows x {seq_len} ({rows * seq_len / 1e6:.1f} M tokens), "
        f"parquet {figures['parquet_mb']:.0f} MB (zstd), row groups of {args.row_group_rows} "
        f"rows; warm figures: best pass of {args.passes}, ratio = median of ABBA pairs, "
        f"passes of >= {args.min_pass_ms:.0f} ms\n"
    )
    print(
        "| reader | batch | M tokens/s (best) | GB/s delivered "
        "| vs memmap, same batch: bytes/s (CPU time) |"
    )
    print("|---|---|---|---|---|")
    for r in results:
        if r.tok_s is None:
            print(f"| {r.name} | | not installed | | |")
            continue
        # in bytes/s: the all-column rows deliver 14 bytes per token, memmap 4
        ratio = ""
        if r.paired is not None:
            scale = r.bytes_per_token / 4
            ratio = f"{r.paired.ratio * scale:.2f} ({r.paired.cpu_ratio * scale:.2f})"
        shape = f"{r.batch} x {seq_len}" if r.batch else ""
        print(
            f"| {r.name} | {shape} | {r.tok_s / 1e6:,.1f} | "
            f"{r.tok_s * r.bytes_per_token / 1e9:.2f} | {ratio} |"
        )
    for kind in ("doc", "sample"):
        idx_ratio = figures.get(f"ratio_own_idx_vs_megatron_core_{kind}")
        if idx_ratio is not None:
            print(
                f"\nown .idx reader / megatron-core, per {kind}: {idx_ratio:.2f} (median of pairs)"
            )
    if figures.get("megatron_core_installed"):
        print(f"megatron-core {figures['megatron_core_version']}, torch {figures['torch_version']}")
    print(
        f"\nsimulated {args.step_ms:.0f} ms step, {figures['steps']} batches of "
        f"{args.batch_size} x {seq_len}, all columns, warm cache:\n"
    )
    print(step_summary.to_markdown())
    print(
        "\nsame, cold cache: row groups decoded during training "
        f"({cold_stepped.cache.decoded} decoded, look-ahead {cold_stepped.lookahead_row_groups}):\n"
    )
    print(cold_step_summary.to_markdown())
    print("\nfirst epoch on a cold cache, no step, input_ids only:\n")
    print(cold_summary.to_markdown())
    print(f"\nwhole run {figures['run_s']:.1f} s\n")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
