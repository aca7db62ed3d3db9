"""Dedup gate, measured (issue 5): near-duplicate recall and precision on the labelled set
(tests/fixtures/dedup_labelled.py); signature MB/s of the vectorized path next to datasketch's
per-document `update_batch` on the same files in the same run; end-to-end gate MB/s with
LSH; the duplicates found in the demo wheels; peak RSS of the gate on the demo corpus and on
an 8x corpus of mutated copies, each size in its own subprocess.

Corpus: the demo wheels (pythran 0.19.0, pybind11 3.1.0, nanobind 3.1.0) unzipped under
--wheels; fetch with `pip download --no-deps pythran==0.19.0 pybind11==3.1.0 nanobind==3.1.0
-d /tmp/wheels` and unzip each into /tmp/wheels/x/<name>.

    .venv/bin/python -m bench.bench_dedup [--wheels /tmp/wheels/x] [--families 100]
                                          [--datasketch-mb 6] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from datasketch import MinHash

from megacpp_pipeline.corpus import minhash
from megacpp_pipeline.corpus.dedup import DedupConfig, find_duplicates, markdown_top_clusters
from tests.fixtures import dedup_labelled

CPP_SUFFIXES = {".h", ".hh", ".hpp", ".hxx", ".ipp", ".inl", ".tcc", ".cpp", ".cc", ".cxx"}
CATALOG = ("pythran", "pybind11", "nanobind")  # the demo's source order
ROWS_PER_SHARD = 256


def demo_files(wheels: Path) -> list[tuple[str, str, Path]]:
    """(source_id, path, file) in canonical order: catalog order, then path."""
    out = []
    for source in CATALOG:
        root = wheels / source
        if not root.is_dir():
            continue
        files = [p for p in root.rglob("*") if p.is_file() and p.suffix in CPP_SUFFIXES]
        out += sorted((source, p.relative_to(root).as_posix(), p) for p in files)
    return out


# Whole lower-case words of 4+ characters: `\b[a-z_][a-z0-9_]{3,}\b`, with the `\b`s as
# lookarounds after the first character, so the pattern opens with a class `re` can scan for.
_IDENT = re.compile(r"[a-z_](?<!\w[a-z_])[a-z0-9_]{3,}(?!\w)")


def _replace_word(text: str, word: str, new: str) -> str:
    """`re.sub(rf"\\b{word}\\b", new, text)` for a word of [a-z0-9_], without compiling a
    pattern per word (the mutated corpus renames tens of thousands of different words)."""
    parts: list[str] = []
    done = at = 0
    while (at := text.find(word, at)) >= 0:
        end = at + len(word)
        before = text[at - 1] if at else " "
        after = text[end] if end < len(text) else " "
        if not (before.isalnum() or before == "_" or after.isalnum() or after == "_"):
            parts += (text[done:at], new)
            done = end
        at = end  # a later match starting inside this one has a word character before it
    return "".join([*parts, text[done:]])


def _mutate(text: str, names: list[str], rng: random.Random) -> str:
    """A lightly modified copy: a few of the text's identifiers (`names`, sorted) renamed, a
    few lines dropped."""
    for name in rng.sample(names, min(3, len(names))):
        text = _replace_word(text, name, name + "_" + str(rng.randint(0, 99)))
    lines = text.split("\n")
    for _ in range(min(3, len(lines) // 20)):
        del lines[rng.randrange(len(lines))]
    return "\n".join(lines)


def corpus_shards(wheels: Path, copies: int) -> Iterator[pa.Table]:
    """The demo corpus, then copies-1 mutated copies of it as further sources, streamed
    shard by shard (never the whole corpus at once)."""
    files = demo_files(wheels)
    identifiers: dict[Path, list[str]] = {}  # every copy mutates the same original text
    for copy in range(copies):
        rng = random.Random(copy)
        for i in range(0, len(files), ROWS_PER_SHARD):
            rows = []
            for source, path, p in files[i : i + ROWS_PER_SHARD]:
                text = p.read_bytes().decode("utf-8", "replace")
                if copy:
                    if p not in identifiers:
                        identifiers[p] = sorted(set(_IDENT.findall(text)))
                    source, text = f"synthetic-{copy}-{source}", _mutate(text, identifiers[p], rng)
                rows.append((source, path, text))
            yield dedup_labelled.scrubbed_table(rows)


def bench_labelled(families: int) -> dict[str, Any]:
    files = dedup_labelled.build(families=families, unrelated=families, seed=5)
    texts = {f"{f.source_id}:{f.path}": f.text for f in files}
    shingle_sets: dict[str, set[tuple[str, ...]]] = {}  # by file, shared by all configs

    def shingles(key: str) -> set[tuple[str, ...]]:
        if key not in shingle_sets:
            shingle_sets[key] = dedup_labelled.shingle_set(texts[key])
        return shingle_sets[key]

    out: dict[str, Any] = {"labelled_files": len(files)}
    for name, config in (
        ("one_permutation", DedupConfig()),
        ("one_permutation+verify", DedupConfig(verify_candidates=True)),
        ("affine64", DedupConfig(scheme="affine64")),
        ("one_permutation 25x10", DedupConfig(bands=25, rows=10)),
    ):
        with tempfile.TemporaryDirectory() as work:
            result = find_duplicates(dedup_labelled.shards(files, 64), config, Path(work))
        rows = result.decisions.to_pylist()
        positives = [
            r
            for f, r in zip(files, rows, strict=True)
            if f.kind not in ("original", "unrelated") and f.jaccard >= 0.8
        ]
        found = sum(r["status"] == "dropped" for r in positives)
        dropped = [r for r in rows if r["status"] == "dropped"]
        # A drop is right when the file really is >= 0.75 similar (true shingle Jaccard) to
        # the file it is recorded as a copy of: between the 0.7 and 0.85 label levels.
        right = sum(
            dedup_labelled.jaccard_of_sets(
                shingles(f"{r['source_id']}:{r['path']}"), shingles(r["dup_of"])
            )
            >= 0.75
            for r in dropped
        )
        out[name] = {
            "recall_at_0.8": found / len(positives),
            "precision": right / len(dropped) if dropped else 1.0,
            "positives": len(positives),
            "dropped": len(dropped),
            "candidate_pairs": result.stats["candidate_pairs"],
        }
    return out


def bench_signatures(wheels: Path, datasketch_mb: float) -> dict[str, Any]:
    files = demo_files(wheels)
    texts = [p.read_bytes() for _, _, p in files]
    # The same files for every contender: a deterministic sample of about datasketch_mb.
    rng = random.Random(0)
    rng.shuffle(texts)
    sample, size = [], 0
    for t in texts:
        if size >= datasketch_mb * 1e6:
            break
        sample.append(t)
        size += len(t)
    mb = size / 1e6
    out: dict[str, Any] = {"signature_sample_mb": round(mb, 2), "signature_files": len(sample)}

    # CPU seconds of this process, not wall time: on a shared machine the wall clock
    # charges other people's work to whichever contender ran at the wrong moment. Both
    # contenders are single-threaded here (numpy ufuncs, datasketch's numpy), so CPU
    # seconds are the fair comparison; wall-clock rates are reported too.
    def timed(fn: Any) -> tuple[float, float]:
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        return mb / (time.process_time() - c0), mb / (time.perf_counter() - t0)

    def ours(scheme: str) -> None:
        shingles = minhash.shingle_hashes(minhash.token_hashes(sample), 5)
        if scheme == "affine64":
            minhash.signatures(shingles, *minhash.permutations(256, 1))
        else:
            minhash.one_permutation_signatures(shingles, 256, 1)

    def datasketch() -> None:
        for raw in sample:
            m = MinHash(num_perm=256, seed=1, scheme="affine32")
            text = raw.decode("utf-8", "replace")
            m.update_batch([s.encode() for s in dedup_labelled.reference_shingles(text)])

    ours("one_permutation")  # warm up: power tables, the allocator
    contenders = {
        "one_permutation": lambda: ours("one_permutation"),
        "affine64": lambda: ours("affine64"),
        "datasketch": datasketch,
    }
    best: dict[str, tuple[float, float]] = {}
    for _ in range(2):  # interleaved, best of 2, so load swings hit every contender
        for name, fn in contenders.items():
            cpu, wall = timed(fn)
            old = best.get(name, (0.0, 0.0))
            best[name] = (max(old[0], cpu), max(old[1], wall))
    for name, (cpu, wall) in best.items():
        out[f"{name}_mb_per_cpu_s"] = cpu
        out[f"{name}_mb_s_wall"] = wall
    for name in ("one_permutation", "affine64"):
        out[f"speedup_{name}_cpu"] = best[name][0] / best["datasketch"][0]
        out[f"speedup_{name}_wall"] = best[name][1] / best["datasketch"][1]
    return out


def write_corpus(wheels: Path, copies: int, shard_dir: Path) -> float:
    """The corpus as SCRUBBED_FILES parquet shards, as the upstream asset leaves it; MB."""
    shard_dir.mkdir(parents=True, exist_ok=True)
    for i, shard in enumerate(corpus_shards(wheels, copies)):
        pq.write_table(shard, shard_dir / f"part-{i:05d}.parquet")
    return sum(p.stat().st_size for _, _, p in demo_files(wheels)) * copies / 1e6


def _vm_hwm_mb() -> float:
    """This process's own peak RSS (VmHWM). getrusage's ru_maxrss is kept across fork and
    exec on Linux, so in a child it can report the parent's peak; VmHWM belongs to the
    address space exec created. Falls back to ru_maxrss off Linux."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_gate(shard_dir: Path, mb: float) -> dict[str, Any]:
    """Child process body: the whole gate over shards read back one at a time, timed, then
    peak RSS (a high-water mark, so the child does nothing else)."""
    base_rss = _vm_hwm_mb()

    def stream() -> Iterator[pa.Table]:
        for part in sorted(shard_dir.glob("*.parquet")):
            yield pq.read_table(part)

    with tempfile.TemporaryDirectory() as work:
        t0, c0 = time.perf_counter(), time.process_time()
        result = find_duplicates(stream(), DedupConfig(), Path(work))
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {
        "files": result.stats["files"],
        "mb": mb,
        "gate_mb_s": mb / seconds,
        "gate_mb_per_cpu_s": mb / cpu,
        "peak_rss_mb": _vm_hwm_mb(),
        "getrusage_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_after_imports_mb": base_rss,
        "stats": dict(result.stats),
        "markdown": markdown_top_clusters(
            result.clusters,
            result.stats["dropped_exact_duplicate"],
            result.stats["dropped_near_duplicate"],
            10,
        ),
    }


def _child(wheels: Path, copies: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        mb = write_corpus(wheels, copies, Path(tmp))
        proc = subprocess.run(
            [sys.executable, "-m", "bench.bench_dedup", "--child", tmp, "--child-mb", str(mb)],
            capture_output=True,
            text=True,
            check=True,
        )
    return {"copies": copies, **json.loads(proc.stdout.strip().splitlines()[-1])}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--wheels", type=Path, default=Path("/tmp/wheels/x"))
    ap.add_argument("--families", type=int, default=100)
    ap.add_argument("--datasketch-mb", type=float, default=6.0)
    ap.add_argument("--copies", type=int, default=8)
    ap.add_argument("--only-gate", action="store_true", help="skip labelled set and signatures")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--child-mb", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(run_gate(args.child, args.child_mb)))
        return

    figures: dict[str, Any] = {}
    have_demo = bool(demo_files(args.wheels))
    # The gate children run first, while this process is still small: each starts as a
    # fork of it.
    if have_demo:
        figures["gate"] = [_child(args.wheels, 1), _child(args.wheels, args.copies)]
    if not args.only_gate:
        figures["labelled"] = bench_labelled(args.families)
        if have_demo:
            figures["signatures"] = bench_signatures(args.wheels, args.datasketch_mb)

    if "labelled" in figures:
        print("| labelled set | recall @J>=0.8 | precision | dropped | candidate pairs |")
        print("|---|---:|---:|---:|---:|")
        for name, row in figures["labelled"].items():
            if isinstance(row, dict):
                print(
                    f"| {name} | {row['recall_at_0.8']:.3f} | {row['precision']:.3f} "
                    f"| {row['dropped']} | {row['candidate_pairs']} |"
                )
    if "signatures" in figures:
        sig = figures["signatures"]
        print(
            f"\nsignatures on {sig['signature_sample_mb']} MB ({sig['signature_files']} files),"
            " 256 slots, 5-shingles of C++ tokens"
        )
        print("| path | MB per CPU s | vs datasketch | MB/s wall | vs datasketch |")
        print("|---|---:|---:|---:|---:|")
        for name, label in (
            ("one_permutation", "ours, one_permutation (default)"),
            ("affine64", "ours, affine64 (256 permutations)"),
            ("datasketch", "datasketch 2.0 affine32 update_batch"),
        ):
            cpu, wall = sig[f"{name}_mb_per_cpu_s"], sig[f"{name}_mb_s_wall"]
            ratio_cpu = sig.get(f"speedup_{name}_cpu", 1.0)
            ratio_wall = sig.get(f"speedup_{name}_wall", 1.0)
            print(f"| {label} | {cpu:.2f} | {ratio_cpu:.1f}x | {wall:.2f} | {ratio_wall:.1f}x |")
    if "gate" in figures:
        runs = figures["gate"]
        print(
            "\n| corpus | files | MB | gate MB/s wall | MB per CPU s | peak RSS MB "
            "| RSS after imports MB | exact | near | clusters |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in runs:
            s = r["stats"]
            print(
                f"| demo x{r['copies']} | {r['files']} | {r['mb']:.1f} | {r['gate_mb_s']:.2f} "
                f"| {r['gate_mb_per_cpu_s']:.2f} | {r['peak_rss_mb']:.0f} "
                f"| {r['rss_after_imports_mb']:.0f} "
                f"| {s.get('dropped_exact_duplicate', 0)} | {s.get('dropped_near_duplicate', 0)} "
                f"| {s.get('clusters', 0)} |"
            )
        print("\n" + runs[0]["markdown"])
        for r in runs:
            del r["markdown"]
    elif not have_demo:
        print(f"\nno demo wheels under {args.wheels}: throughput and memory skipped")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
