"""Tokenization: the tokenized_docs gate with each encoder (tokenizers, as before; the fast
tiktoken one) beside bare `tokenizers` encode_batch and bare tiktoken, in MB per CPU-second,
and the tokenized_docs stage itself (store I/O, result cache and its round-trip check) with
each encoder; then packing throughput / utilization per policy. On the demo corpus (the C++
headers of the pythran, pybind11 and nanobind wheels).

    .venv/bin/python -m bench.bench_tokenize_pack [--corpus DIR] [--json PATH] [--no-stage]
        [--stage-corpus DIR]

Prints a markdown table; the last stdout line is the JSON dict of figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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
from megacpp_pipeline.core.catalog import SplitConfig
from megacpp_pipeline.corpus import encoders
from megacpp_pipeline.corpus.encoders import FastEncoder, select_encoder
from megacpp_pipeline.corpus.packing import PackingConfig, merge_telemetry, pack
from megacpp_pipeline.corpus.tokenizer import SpecialIds, TokenizerConfig, train_tokenizer
from megacpp_pipeline.gates.tokenization import TokenizeConfig, run
from megacpp_pipeline.pipeline.catalog import load_catalog
from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.parallel import workers_from
from megacpp_pipeline.pipeline.runner import checks_of, run_stage
from megacpp_pipeline.stages import default_registry
from megacpp_pipeline.storage.store import ShardStore

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


def best_cpu_seconds(fns: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Process CPU time (every thread of this process), interleaved, best of `repeat`."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            t0 = time.process_time()
            fn()
            times[name].append(time.process_time() - t0)
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


def _one_thread(fn: Callable[[], object]) -> object:
    """`fn` with tokenizers' thread pool off (it reads the variable on every call)."""
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        return fn()
    finally:
        if before is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before


def _catalog(root: Path, corpus: Path, encoder: str) -> Path:
    path = root / f"sources-{encoder}.yaml"
    path.write_text(
        "snapshot: bench\nseq_len: 2048\nsources:\n"
        f"  - {{id: demo, kind: dir, uri: {corpus.resolve()}, declared_license: BSD-3-Clause}}\n"
        f"stages:\n  tokenize:\n    encoder: {encoder}\n"
    )
    return path


def stage_figures(corpus: Path, repeat: int) -> dict[str, float | int | str | bool]:
    """The tokenized_docs stage as the runner runs it (read enriched_files from the store,
    the gate, the result cache, write the version) and its checks, on the whole demo as one
    source, once per encoder; in this process (workers=1), so CPU time is all of it."""
    registry = default_registry()
    stage = registry.get("tokenized_docs")
    out: dict[str, float | int | str | bool] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        store = ShardStore(str(root / "data"))

        def context(encoder: str, cache: str) -> StageContext:
            catalog = load_catalog(_catalog(root, corpus, encoder), registry)
            return StageContext(catalog, store, registry, root / cache, run_id="bench", workers=1)

        ctx = context("auto", "cache")
        for upstream in registry:  # the pipeline up to the stage, untimed
            if upstream.name == stage.name:
                break
            for _ in run_stage(ctx, upstream, ctx.partitions(upstream)):
                pass
        cpu: dict[str, list[float]] = {"tokenizers": [], "auto": []}
        checks: dict[str, list[float]] = {"tokenizers": [], "auto": []}
        shards: dict[str, list[str]] = {}
        for attempt in range(repeat):
            for encoder in cpu:
                ctx = context(encoder, f"cache-{encoder}-{attempt}")  # no cached result
                encoders.forget_chosen()  # each run builds its encoder, as a fresh process does
                t0 = time.process_time()
                list(run_stage(ctx, stage, ["demo"]))
                t1 = time.process_time()
                for check in checks_of(stage):
                    outcome = check.evaluate(ctx, stage, "demo")
                    assert outcome.passed, outcome.description
                t2 = time.process_time()
                cpu[encoder].append(t1 - t0)
                checks[encoder].append(t2 - t1)
                m = store.latest(stage.name, "demo")
                out[f"stage_encoder_{encoder}"] = str(m.extra.get("encoder"))
                shards[encoder] = [f.sha256 for f in m.files if f.path.endswith(".parquet")]
                mb = float(m.stats["input_bytes"]) / 1e6
        shutil.rmtree(root / "data", ignore_errors=True)
    for encoder, label in (("tokenizers", "tokenizers"), ("auto", "fast")):
        run_s, check_s = min(cpu[encoder]), min(checks[encoder])
        out[f"stage_cpu_s_{label}"] = round(run_s, 2)
        out[f"stage_check_cpu_s_{label}"] = round(check_s, 2)
        out[f"stage_mb_per_cpu_s_{label}"] = round(mb / run_s, 2)
        out[f"stage_and_checks_mb_per_cpu_s_{label}"] = round(mb / (run_s + check_s), 2)
    out["stage_mb"] = round(mb, 2)
    out["stage_fast_vs_tokenizers"] = round(min(cpu["tokenizers"]) / min(cpu["auto"]), 2)
    out["stage_and_checks_fast_vs_tokenizers"] = round(
        (min(cpu["tokenizers"]) + min(checks["tokenizers"]))
        / (min(cpu["auto"]) + min(checks["auto"])),
        2,
    )
    out["stage_files_identical"] = shards["tokenizers"] == shards["auto"]
    return out


_STARTED = time.perf_counter()


def _mark(what: str) -> None:
    print(f"[{time.perf_counter() - _STARTED:6.1f} s] {what}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument(
        "--stage-corpus",
        type=Path,
        default=None,
        help="time the tokenized_docs stage over this directory as one source (default: "
        "--corpus; e.g. .cache/bench/scale-16x, the demo at 16x, where the encoder's build "
        "and the stage's fixed costs are spread over 16 times the text)",
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--repeat", type=int, default=2, help="tokenization runs per call")
    parser.add_argument("--every", type=int, default=3, help="time every k-th file")
    parser.add_argument("--rss-child", nargs=2, metavar=("PARQUET", "COPIES"))
    parser.add_argument(
        "--no-stage",
        dest="stage",
        action="store_false",
        help="skip the tokenized_docs stage timing (it first runs the pipeline up to it)",
    )
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

    reference = select_encoder(tok, "tokenizers")
    fast = select_encoder(tok, "fast", threads=1)
    fast_threads = select_encoder(tok, "fast", threads=workers_from(os.environ))
    assert isinstance(fast, FastEncoder)
    encoding, allowed = fast.encoding, fast.matched
    config, split = TokenizeConfig(), SplitConfig()
    run(table, reference, config, split)  # warm-up
    run(table, fast, config, split)
    # Wall clock, each as the stage runs it: tokenizers on its own threads, the fast encoder
    # on as many threads as workers.
    timed = best_seconds(
        {
            "bare": lambda: tok.encode_batch(texts, add_special_tokens=False),
            "bare_fast": lambda: tok.encode_batch_fast(texts, add_special_tokens=False),
            "gate_tokenizers": lambda: run(table, reference, config, split),
            "gate": lambda: run(table, fast_threads, config, split),
        },
        repeat=args.repeat,
    )
    bare, bare_fast, gate = timed["bare"], timed["bare_fast"], timed["gate"]
    _mark("tokenization timed (wall)")
    # CPU seconds: what the hour-per-terabyte budget is counted in. tokenizers as the stage
    # ran it until now (its own thread pool) and on one thread; tiktoken on one thread.
    cpu_fns: dict[str, Callable[[], object]] = {
        "bare_tokenizers": lambda: tok.encode_batch(texts, add_special_tokens=False),
        "bare_tokenizers_1t": lambda: _one_thread(
            lambda: tok.encode_batch(texts, add_special_tokens=False)
        ),
        "bare_tiktoken": lambda: encoding.encode_ordinary_batch(texts, num_threads=1),
        "bare_tiktoken_specials": lambda: [
            encoding.encode_to_numpy(t, allowed_special=allowed, disallowed_special=())
            for t in texts
        ],
        "gate_tokenizers": lambda: run(table, reference, config, split),
        "gate_tokenizers_1t": lambda: _one_thread(lambda: run(table, reference, config, split)),
        "gate_fast": lambda: run(table, fast, config, split),
    }
    cpu = best_cpu_seconds(cpu_fns, repeat=max(2, args.repeat))
    _mark("tokenization timed (CPU)")
    result = run(table, fast, config, split)
    same = result.kept.equals(run(table, reference, config, split).kept)
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
        gate_tokenizers_mb_s=round(mb / timed["gate_tokenizers"], 2),
        gate_threads=workers_from(os.environ),
        gate_mtok_s=round(n_sample / gate / 1e6, 3),
        bare_mtok_s=round(n_sample / bare / 1e6, 3),
        gate_vs_bare=round(bare / gate, 3),
        gate_vs_bare_fast=round(bare_fast / gate, 3),
        gate_dropped=result.dropped.num_rows,
        gate_encoder=fast.describe()["encoder"],
        ids_identical=same,
        **{f"cpu_{name}_mb_s": round(mb / seconds, 2) for name, seconds in cpu.items()},
        cpu_gate_fast_vs_gate_tokenizers=round(cpu["gate_tokenizers"] / cpu["gate_fast"], 2),
        cpu_gate_fast_vs_gate_tokenizers_1t=round(cpu["gate_tokenizers_1t"] / cpu["gate_fast"], 2),
        cpu_gate_fast_vs_bare_tiktoken=round(cpu["bare_tiktoken"] / cpu["gate_fast"], 3),
        cpu_gate_fast_vs_bare_tokenizers=round(cpu["bare_tokenizers"] / cpu["gate_fast"], 2),
        cpu_bare_tiktoken_vs_bare_tokenizers=round(
            cpu["bare_tokenizers"] / cpu["bare_tiktoken"], 2
        ),
    )
    if args.stage:
        stage_corpus = args.stage_corpus or fetch_corpus(args.corpus)
        figures["stage_corpus"] = str(stage_corpus)
        figures.update(stage_figures(stage_corpus, repeat=max(1, args.repeat)))
        _mark("tokenized_docs stage timed")

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
