"""Tokenization gate vs bare `encode_batch`, and packing throughput / utilization per policy,
on the demo corpus (the C++ headers of the pythran, pybind11 and nanobind wheels).

    .venv/bin/python -m bench.bench_tokenize_pack [--corpus DIR] [--json PATH]

Prints a markdown table; the last stdout line is the JSON dict of figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from megacpp_pipeline.core import schemas
from megacpp_pipeline.corpus.packing import PackingConfig, merge_telemetry, pack
from megacpp_pipeline.corpus.tokenizer import SpecialIds, TokenizerConfig, train_tokenizer
from megacpp_pipeline.gates.tokenization import TokenizeConfig, run

WHEELS = ("pythran==0.19.0", "pybind11==3.1.0", "nanobind==3.1.0")
CPP_SUFFIXES = {
    ".h",
    ".hh",
    ".hpp",
    ".hxx",
    ".h++",
    ".c",
    ".cc",
    ".cpp",
    ".cxx",
    ".ipp",
    ".inl",
    ".tcc",
}
DEFAULT_CORPUS = Path(tempfile.gettempdir()) / "megacpp-demo-corpus"


def fetch_corpus(root: Path) -> Path:
    if root.exists() and any(root.iterdir()):
        return root
    wheels = root / "_wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels), *WHEELS],
        check=True,
    )
    for wheel in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(wheel) as zf:
            for name in zf.namelist():
                if Path(name).suffix in CPP_SUFFIXES:
                    zf.extract(name, root / wheel.stem)
    return root


def read_corpus(root: Path) -> list[tuple[str, str]]:
    docs = []
    for path in sorted(root.rglob("*")):
        if path.suffix in CPP_SUFFIXES and path.is_file() and "_wheels" not in path.parts:
            try:
                docs.append((str(path.relative_to(root)), path.read_bytes().decode("utf-8")))
            except UnicodeDecodeError:
                continue
    return docs


def line_spans(text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A stand-in flat partition (one span per line, comments kind 5) with real span density."""
    data = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    ends = np.append(np.flatnonzero(data == 10) + 1, data.size)
    ends = np.unique(ends[ends > 0])
    starts = np.concatenate([[0], ends[:-1]])
    first = data[np.minimum(starts, max(data.size - 1, 0))] if data.size else starts
    kinds = np.where(first == ord("/"), 5, 0).astype(np.uint8)
    return starts.astype(np.int32), ends.astype(np.int32), kinds


def enriched_table(docs: list[tuple[str, str]]) -> pa.Table:
    spans = [line_spans(t) for _, t in docs]
    n = len(docs)
    return pa.Table.from_pydict(
        {
            "source_id": ["demo"] * n,
            "path": [p for p, _ in docs],
            "revision": ["0" * 40] * n,
            "blob_sha": [schemas.git_blob_sha(t.encode()) for _, t in docs],
            "size": [len(t.encode()) for _, t in docs],
            "encoding": ["utf-8"] * n,
            "text": [t for _, t in docs],
            "content_sha256": [schemas.text_sha256(t) for _, t in docs],
            "language": ["c++"] * n,
            "vendored": [False] * n,
            "license_expression": [None] * n,
            "license_source": ["repo-declared"] * n,
            "license_decision": ["allowed"] * n,
            "license_detail": [None] * n,
            "scrub_replacements": [0] * n,
            "scrub_kinds": [[] for _ in range(n)],
            "chunk_starts": [s[0] for s in spans],
            "chunk_ends": [s[1] for s in spans],
            "chunk_kinds": [s[2] for s in spans],
            "chunk_depths": [[0] * len(s[0]) for s in spans],
            "chunk_names": [[""] * len(s[0]) for s in spans],
            "parse_error_ratio": [0.0] * n,
            "n_functions": [0] * n,
            "n_classes": [0] * n,
            "comment_ratio": [0.0] * n,
            "max_nesting": [0] * n,
            "structure_source": ["syntax"] * n,
            "build_context": [None] * n,
        },
        schema=schemas.ENRICHED_FILES,
    )


def best_seconds(fns: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Interleaved runs, best of `repeat` each: on a shared, noisy machine the minimum is the
    figure least disturbed by other processes, and interleaving exposes each call alike."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: min(ts) for name, ts in times.items()}


def cpu_seconds(fn: Callable[[], object], repeat: int = 3) -> float:
    """Process CPU time (one thread), so a loaded machine does not count against it."""
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def pack_input(docs: pa.Table, copies: int = 1, batch: int = 512) -> Iterator[pa.Table]:
    base = docs.select(["token_ids", "chunk_kind", "split"])
    n = base.num_rows
    for c in range(copies):
        for lo in range(0, n, batch):
            part = base.slice(lo, batch)
            ids = pa.array(np.arange(c * n + lo, c * n + lo + part.num_rows), pa.int32())
            yield part.add_column(0, "doc_id", ids)


def rss_child(path: str, copies: int) -> None:
    docs = pq.read_table(path)
    config = PackingConfig(seq_len=2048)
    for _ in pack(pack_input(docs, copies), config, SpecialIds()):
        pass
    # ru_maxrss survives execve (it would report the parent's peak); VmHWM is this image's.
    status = Path("/proc/self/status").read_text()
    hwm_kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM"))
    print(hwm_kb // 1024)


_STARTED = time.perf_counter()


def _mark(what: str) -> None:
    print(f"[{time.perf_counter() - _STARTED:6.1f} s] {what}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--repeat", type=int, default=2, help="tokenization runs per call")
    parser.add_argument("--every", type=int, default=3, help="time every k-th file")
    parser.add_argument("--rss-child", nargs=2, metavar=("PARQUET", "COPIES"))
    args = parser.parse_args()
    if args.rss_child:
        rss_child(args.rss_child[0], int(args.rss_child[1]))
        return

    all_docs = read_corpus(fetch_corpus(args.corpus))
    all_mb = sum(len(t.encode()) for _, t in all_docs) / 1e6
    # The rates are timed on every k-th file (the same files for the gate and the bare
    # calls): a third of the demo gives stable ratios in a third of the time.
    docs = all_docs[:: max(1, args.every)]
    texts = [t for _, t in docs]
    mb = sum(len(t.encode()) for t in texts) / 1e6
    figures: dict[str, float | int | str] = {
        "corpus_files": len(docs),
        "corpus_mb": round(mb, 2),
        "demo_files": len(all_docs),
        "demo_mb": round(all_mb, 2),
        "every": args.every,
    }

    t0 = time.perf_counter()
    tok = train_tokenizer(texts, TokenizerConfig())  # the timed sample: training is not timed
    figures["train_seconds_vocab_32768"] = round(time.perf_counter() - t0, 2)
    table = enriched_table(docs)

    run(table, tok, TokenizeConfig())  # warm-up
    timed = best_seconds(
        {
            "bare": lambda: tok.encode_batch(texts, add_special_tokens=False),
            "bare_fast": lambda: tok.encode_batch_fast(texts, add_special_tokens=False),
            "gate": lambda: run(table, tok, TokenizeConfig()),
        },
        repeat=args.repeat,
    )
    bare, bare_fast, gate = timed["bare"], timed["bare_fast"], timed["gate"]
    _mark("tokenization timed")
    result = run(table, tok, TokenizeConfig())
    n_sample = int(result.stats["tokens_kept"])
    # Packing packs the sample's documents `every` times over (distinct doc ids): about the
    # demo's size and length mix without tokenizing the demo once more.
    copies = max(1, args.every)
    n_tokens = n_sample * copies
    figures.update(
        tokens=n_sample,
        pack_tokens=n_tokens,
        bare_encode_batch_mb_s=round(mb / bare, 2),
        bare_encode_batch_fast_mb_s=round(mb / bare_fast, 2),
        gate_mb_s=round(mb / gate, 2),
        gate_mtok_s=round(n_sample / gate / 1e6, 3),
        bare_mtok_s=round(n_sample / bare / 1e6, 3),
        gate_vs_bare=round(bare / gate, 3),
        gate_vs_bare_fast=round(bare_fast / gate, 3),
        gate_dropped=result.dropped.num_rows,
    )

    kept = result.kept
    for seq_len in (2048, 8192):
        for policy in ("best_fit", "packed_rows", "single_doc"):
            config = PackingConfig(seq_len=seq_len, policy=policy, packing_telemetry=True)
            telemetry = merge_telemetry(pack(pack_input(kept, copies), config, SpecialIds()))
            assert telemetry is not None
            key = f"{policy}_{seq_len}"
            figures[f"util_{key}"] = round(telemetry.utilization, 4)
            figures[f"docs_per_row_{key}"] = round(telemetry.docs_per_row, 2)
            figures[f"cropped_doc_frac_{key}"] = round(telemetry.cropped_doc_frac, 4)
    _mark("utilization per policy")
    inputs = list(pack_input(kept, copies))
    config = PackingConfig(seq_len=2048)
    wall = best_seconds({"pack": lambda: list(pack(inputs, config, SpecialIds()))}, 3)["pack"]
    cpu = cpu_seconds(lambda: list(pack(inputs, config, SpecialIds())))
    figures["best_fit_mtok_s_2048_wall"] = round(n_tokens / wall / 1e6, 2)
    figures["best_fit_mtok_s_2048_cpu"] = round(n_tokens / cpu / 1e6, 2)

    _mark("packing timed")
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "docs.parquet")
        pq.write_table(kept.select(["token_ids", "chunk_kind", "split"]), path)
        for scale in (1, 4, 16):  # x the demo-sized input
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "bench.bench_tokenize_pack",
                    "--rss-child",
                    path,
                    str(scale * copies),
                ],
                check=True,
                capture_output=True,
                text=True,
            )
            figures[f"pack_peak_rss_mb_x{scale}"] = int(out.stdout.strip().splitlines()[-1])

    print("| figure | value |\n|---|---|")
    for name, value in figures.items():
        print(f"| {name} | {value} |")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
