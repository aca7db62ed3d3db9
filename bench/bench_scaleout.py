"""Scale-out: does more hardware make a run faster, and how much of a run is serial?

Each figure comes from `megacpp run` on the scaled demo (bench/scaleup.py), a fresh data dir,
DAGSTER_HOME and cache per run, sampled by bench/endtoend.py: wall and CPU seconds per stage
group, the CPU the driver processes spent themselves (`megacpp run` and the Dagster run it
forks per group) against everything (their workers, Ray's processes), and the driver's own
memory high-water mark per group.

    .venv/bin/python -m bench.bench_scaleout workers --scale 4 --workers 2,16 [--pin]
    .venv/bin/python -m bench.bench_scaleout serial --scale 16 [--engines local,ray]
    .venv/bin/python -m bench.bench_scaleout memory --scales 16,64
    .venv/bin/python -m bench.bench_scaleout refresh --scale 16 [--changed 0.01]
    .venv/bin/python -m bench.bench_scaleout groups --scales 1,4,16 [--engines local,ray]

Targets (issue 25): at 16 workers on a 16-core host at least 5x faster wall than at 2, every
per-file stage at least 4x (on fewer cores: no stage slower at 16 workers than at 2); the
driver processes at most 5% of a run's CPU at 16x; the driver's peak at 64x within 1.1x of
its peak at 16x; a refresh after 1% of the files changed (tokenizer pinned) at most 15% of a
full run's CPU. `groups` (issue 29) gives each stage group's MB per CPU second at each scale
on each engine, beside the bare libraries' rates measured in the same process on the demo's
files. A missed target is reported, not raised. Results go to
bench/results/<date>-scaleout-<what>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from bench import endtoend, scaleup

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"


BASELINE: list[Path] = []  # --baseline: another checkout measured the same way, first


def _run(
    catalog: Path,
    work: Path,
    label: str,
    *,
    workers: int | None = None,
    args: tuple[str, ...] = (),
    repo: Path = REPO,
) -> endtoend.EndToEnd:
    shutil.rmtree(work, ignore_errors=True)
    print(f"[scaleout] {label} ...", file=sys.stderr, flush=True)
    result = endtoend.run(
        catalog, work, label, timeout_s=4 * 3600, args=list(args), repo=repo, workers=workers
    )
    if result.returncode != 0:
        raise SystemExit(f"{label} failed: {result.error}")
    print(
        f"[scaleout] {label}: {result.wall_s:.1f} s wall, {result.cpu_s:.1f} CPU s, "
        f"driver {result.driver_cpu_s:.1f} CPU s",
        file=sys.stderr,
        flush=True,
    )
    return result


def _groups(result: endtoend.EndToEnd, mb_in: float) -> dict[str, dict[str, Any]]:
    return {
        g.name: {
            "wall_s": round(g.seconds, 2),
            "cpu_s": round(g.cpu_s, 2),
            "driver_cpu_s": round(g.driver_cpu_s, 2),
            "serial_s": round(g.serial_s, 2),
            "driver_share": round(g.driver_cpu_s / g.cpu_s, 4) if g.cpu_s else None,
            "mb_per_cpu_s": round(mb_in / g.cpu_s, 3) if g.cpu_s else None,
            "driver_peak_mb": round(g.process_peak_rss_mb, 1),
            "largest_process_mb": round(g.largest_process_mb, 1),
        }
        for g in result.stages
    }


# The run groups of the per-file half (issue 29: "all per-file groups together"): every group
# between the catalog and the one that builds documents, rows and the snapshot.
_NOT_PER_FILE = ("source_catalog", "documents")


def _summary(result: endtoend.EndToEnd, corpus: scaleup.ScaledCorpus) -> dict[str, Any]:
    mb_in = corpus.bytes / 1e6
    per_file = sum(g.cpu_s for g in result.stages if not any(s in g.name for s in _NOT_PER_FILE))
    return {
        "files": corpus.files,
        "mb_in": round(mb_in, 1),
        "wall_s": round(result.wall_s, 1),
        "cpu_s": round(result.cpu_s, 1),
        "driver_cpu_s": round(result.driver_cpu_s, 1),
        "driver_share": round(result.driver_cpu_s / result.cpu_s, 4) if result.cpu_s else None,
        "serial_s": round(result.serial_s, 1),
        "mb_per_cpu_s": round(mb_in / result.cpu_s, 3) if result.cpu_s else None,
        "snapshot": Path(result.snapshot or "").name,
        "per_file_cpu_s": round(per_file, 1),
        "per_file_mb_per_cpu_s": round(mb_in / per_file, 3) if per_file else None,
        "groups": _groups(result, mb_in),
    }


def _pinned_run(
    corpus: scaleup.ScaledCorpus, work: Path, label: str, n: int, pin: bool
) -> dict[str, Any]:
    """One run at n workers; with pin, it and every process it starts (affinity is inherited)
    get only n CPUs, so the comparison is more hardware, not more processes on the same."""
    every = os.sched_getaffinity(0)
    if pin:
        if n > len(every):
            raise SystemExit(f"--pin: {n} workers but this process may use {len(every)} CPUs")
        os.sched_setaffinity(0, sorted(every)[:n])
    try:
        return _summary(_run(corpus.catalog, work, label, workers=n), corpus)
    finally:
        os.sched_setaffinity(0, every)


def workers(
    scale: int, counts: list[int], work: Path, pin: bool = False, repeat: int = 1
) -> dict[str, Any]:
    """The same corpus at each worker count, `repeat` rounds (the counts' order reversed every
    other round, so a drift of the machine's speed falls on each count alike); each count
    against the first by its median wall per stage group."""
    corpus = scaleup.build(scale, REPO / ".cache" / "bench")
    rounds: dict[int, list[dict[str, Any]]] = {n: [] for n in counts}
    for r in range(repeat):
        for n in counts if r % 2 == 0 else counts[::-1]:
            label = f"{scale}x w{n}" + (f" round {r + 1}" if repeat > 1 else "")
            rounds[n].append(_pinned_run(corpus, work / f"w{n}", label, n, pin))
    cpus = len(os.sched_getaffinity(0))
    return {
        "scale": scale,
        "cpus": cpus,
        "pinned": pin,
        "repeat": repeat,
        "runs": {n: runs[0] for n, runs in rounds.items()},
        "rounds": rounds if repeat > 1 else {},
        "compare": compare_counts(rounds, counts, cpus),
    }


def compare_counts(
    rounds: dict[int, list[dict[str, Any]]], counts: list[int], cpus: int
) -> dict[str, Any]:
    """Each count against the first: speedups of the median wall, per stage group too; a
    group "slower beyond noise" when even its fastest run at that count took longer than the
    first count's slowest (with one round, whenever it took longer); and the most a count's
    workers could give by Amdahl's law from the first count's serial seconds: every second
    in which more than one core was busy spread over the count's workers (`ceiling`). With
    rounds, also the median of each round's own ratio (`paired_wall_speedup`): a machine
    that speeds up or slows down over the sweep moves both runs of a round alike."""
    base = rounds[counts[0]]
    ran = max(1, min(counts[0], cpus))  # the first count's workers that had a core

    def walls(runs: list[dict[str, Any]], group: str | None = None) -> list[float]:
        return [r["wall_s"] if group is None else r["groups"][group]["wall_s"] for r in runs]

    out = {}
    for n in counts[1:]:
        mine = rounds[n]
        stages, slower = {}, []
        for name in base[0]["groups"]:
            if not all(name in r["groups"] for r in mine):
                continue
            b, m = walls(base, name), walls(mine, name)
            if statistics.median(m):
                stages[name] = round(statistics.median(b) / statistics.median(m), 2)
            if min(m) > max(b):
                slower.append(name)
        wall, serial = (
            statistics.median(walls(base)),
            statistics.median(r["serial_s"] for r in base),
        )
        ceiling = wall / (serial + (wall - serial) * ran / n) if wall else None
        paired = [b / m for b, m in zip(walls(base), walls(mine), strict=False) if m]
        out[f"{n}_vs_{counts[0]}"] = {
            "wall_speedup": round(wall / statistics.median(walls(mine)), 2),
            "paired_wall_speedup": round(statistics.median(paired), 2) if paired else None,
            "stage_group_speedup": stages,
            "slowest_group": min(stages.items(), key=lambda kv: kv[1]) if stages else None,
            "slower_beyond_noise": slower,
            "same_snapshot": {r["snapshot"] for r in mine} == {r["snapshot"] for r in base},
            "ceiling": round(ceiling, 2) if ceiling else None,
        }
    return out


def serial(scale: int, engines: list[str], work: Path) -> dict[str, Any]:
    """The driver processes' share of the run's CPU, per stage group, per engine."""
    corpus = scaleup.build(scale, REPO / ".cache" / "bench")
    out = {}
    for engine in engines:
        result = _run(
            corpus.catalog, work / engine, f"{scale}x {engine}", args=("--engine", engine)
        )
        out[engine] = _summary(result, corpus)
    baseline = {}
    for repo in BASELINE:  # the same corpus, another checkout's code, default engine
        result = _run(corpus.catalog, work / "baseline", f"{scale}x baseline {repo}", repo=repo)
        baseline[str(repo)] = {"commit": _commit_of(repo), **_summary(result, corpus)}
    return {
        "commit": _commit_of(REPO),
        "baseline": baseline,
        "scale": scale,
        "cpus": len(os.sched_getaffinity(0)),
        "target": "driver CPU <= 5% of the run's CPU",
        "runs": out,
        "passed": all((r["driver_share"] or 1) <= 0.05 for r in out.values()),
    }


def _commit_of(repo: Path) -> str:
    import subprocess

    out = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return out.stdout.strip()


def memory(scales: list[int], work: Path) -> dict[str, Any]:
    """The driver's own high-water mark per group at each scale, and the largest growth."""
    runs = {}
    for scale in scales:
        corpus = scaleup.build(scale, REPO / ".cache" / "bench")
        runs[scale] = _summary(_run(corpus.catalog, work / f"{scale}x", f"{scale}x"), corpus)
    small, large = runs[scales[0]], runs[scales[-1]]
    growth = {
        name: round(g["driver_peak_mb"] / small["groups"][name]["driver_peak_mb"], 3)
        for name, g in large["groups"].items()
        if small["groups"].get(name, {}).get("driver_peak_mb")
    }
    worst = max(growth.items(), key=lambda kv: kv[1]) if growth else ("", 0.0)
    return {
        "scales": scales,
        "runs": runs,
        "driver_peak_growth": growth,
        "worst": worst,
        "target": "the driver's peak at the large scale within 1.1x of the small one's",
        "passed": worst[1] <= 1.1,
    }


def _bare_rates(corpus: scaleup.ScaledCorpus, tokenizer_json: Path) -> dict[str, float]:
    """MB per CPU second of what each group cannot do without, on the corpus's files in this
    process, one thread: read and sha256 each file (collection's floor), write the text as
    one parquet table with the store's options (a version's), a bare tree-sitter parse
    (enrichment's) and a bare tiktoken encode with the run's own vocabulary (tokenization's;
    `corpus.encoders` builds it exactly as the stage does, its ids checked there)."""
    import hashlib
    import io
    import time

    import pyarrow as pa
    import pyarrow.parquet as pq
    import tree_sitter
    import tree_sitter_cpp
    from tokenizers import Tokenizer

    from megacpp_pipeline.corpus.encoders import FastEncoder, select_encoder
    from megacpp_pipeline.storage.versions import PARQUET_OPTIONS

    data = yaml.safe_load(corpus.catalog.read_text())
    files = sorted(p for s in data["sources"] for p in scaleup.cpp_files(Path(s["uri"])))

    def cpu(fn: Any) -> float:
        started = time.process_time()
        fn()
        return time.process_time() - started

    datas: list[bytes] = []

    def read() -> None:
        for path in files:
            datas.append(path.read_bytes())
            hashlib.sha256(datas[-1]).digest()

    read_s = cpu(read)
    mb = sum(map(len, datas)) / 1e6
    texts = [d.decode("utf-8", "replace") for d in datas]
    table = pa.table({"path": [str(p) for p in files], "text": texts})
    write_s = cpu(lambda: pq.write_table(table, io.BytesIO(), **PARQUET_OPTIONS))
    parser = tree_sitter.Parser(tree_sitter.Language(tree_sitter_cpp.language()))
    parse_s = cpu(lambda: [parser.parse(d) for d in datas])
    fast = select_encoder(Tokenizer.from_file(str(tokenizer_json)), "fast", threads=1)
    assert isinstance(fast, FastEncoder), "tiktoken did not match this vocabulary"
    encode_s = cpu(lambda: fast.encoding.encode_ordinary_batch(texts, num_threads=1))
    return {
        "mb": round(mb, 1),
        "read_sha256": round(mb / read_s, 1),
        "parquet_write": round(mb / write_s, 1),
        "tree_sitter_parse": round(mb / parse_s, 2),
        "tiktoken_encode": round(mb / encode_s, 2),
    }


# Each group's floor: the bare work of `_bare_rates` it cannot do without, per MB of what its
# first stage reads (the whole corpus for collection; what dedup and decontamination kept for
# enrichment, `input_bytes` of its versions).
_FLOORS = {
    "raw_files": ("read_sha256", "parquet_write"),
    "enriched_files": ("tree_sitter_parse", "tiktoken_encode"),
}


def _input_mb(data: Path, stage: str) -> float:
    """The MB of text a per-file stage's latest versions read (their `input_bytes`)."""
    from megacpp_pipeline.storage.store import ShardStore

    store = ShardStore(str(data))
    parts = sorted(p.name for p in (data / "assets" / stage).iterdir() if p.is_dir())
    return sum(store.latest(stage, p).stats.get("input_bytes", 0) for p in parts) / 1e6


def groups(scales: list[int], engines: list[str], work: Path) -> dict[str, Any]:
    """Every stage group's MB per CPU second at each scale on each engine (issue 29), and
    for the groups with a library floor, the same per MB of what the group reads beside
    that floor."""
    runs: dict[int, dict[str, Any]] = {}
    bare: dict[str, float] = {}
    table: dict[str, dict[str, dict[str, float | None]]] = {}
    for scale in scales:
        runs[scale] = result = serial(scale, engines, work / f"{scale}x")
        if not bare:  # the smallest scale's files, the run's own vocabulary
            corpus = scaleup.build(scale, REPO / ".cache" / "bench")
            data = work / f"{scale}x" / engines[0] / "data"
            bare = _bare_rates(corpus, next(data.rglob("snapshots/*/tokenizer.json")))
        for engine, run in result["runs"].items():
            data = work / f"{scale}x" / engine / "data"
            for name, g in run["groups"].items():
                row = table.setdefault(name, {}).setdefault(f"{scale}x {engine}", {})
                row["mb_per_cpu_s"] = g["mb_per_cpu_s"]
                first = name.split(",")[0]
                if first not in _FLOORS or not g["cpu_s"]:
                    continue
                read_mb = run["mb_in"] if first == "raw_files" else _input_mb(data, first)
                floor = 1 / sum(1 / bare[b] for b in _FLOORS[first])
                row["read_mb"] = round(read_mb, 1)
                row["read_mb_per_cpu_s"] = round(read_mb / g["cpu_s"], 3)
                row["floor_mb_per_cpu_s"] = round(floor, 3)
                row["of_floor"] = round(read_mb / g["cpu_s"] / floor, 3)
    return {
        "commit": _commit_of(REPO),
        "scales": scales,
        "engines": engines,
        "cpus": len(os.sched_getaffinity(0)),
        "bare_mb_per_cpu_s": bare,
        "floors": {g: list(parts) for g, parts in _FLOORS.items()},
        "groups": table,
        "snapshots": {
            f"{s}x {e}": r["snapshot"] for s, res in runs.items() for e, r in res["runs"].items()
        },
        "runs": runs,
    }


def _pinned_catalog(catalog: Path, tokenizer_json: Path, into: Path) -> Path:
    import hashlib

    data = yaml.safe_load(catalog.read_text())
    sha = hashlib.sha256(tokenizer_json.read_bytes()).hexdigest()
    data.setdefault("stages", {})["tokenizer"] = {"path": str(tokenizer_json), "sha256": sha}
    out = into / "sources.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def _copy_corpus(catalog: Path, into: Path) -> Path:
    """The catalog's dir sources copied (not linked: a refresh edits them) under `into`."""
    data = yaml.safe_load(catalog.read_text())
    for source in data["sources"]:
        target = into / source["id"]
        shutil.copytree(source["uri"], target, copy_function=shutil.copy2)
        source["uri"] = str(target)
    out = into / "sources.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def _change_files(catalog: Path, share: float, seed: int = 7) -> int:
    """Append a line to a seeded `share` of the catalog's files; how many changed."""
    data = yaml.safe_load(catalog.read_text())
    files = sorted(p for s in data["sources"] for p in scaleup.cpp_files(Path(s["uri"])))
    rng = random.Random(seed)
    chosen = rng.sample(files, max(1, round(len(files) * share)))
    for path in chosen:
        with path.open("a") as f:
            f.write(f"\n// refreshed {rng.getrandbits(32):08x}\n")
    return len(chosen)


def refresh(scale: int, share: float, work: Path) -> dict[str, Any]:
    """A full run with the tokenizer pinned, then the same data dir and cache re-run after
    `share` of the files changed: the re-run's CPU against the full run's."""
    corpus = scaleup.build(scale, REPO / ".cache" / "bench")
    shutil.rmtree(work, ignore_errors=True)
    (work / "corpus").mkdir(parents=True)
    catalog = _copy_corpus(corpus.catalog, work / "corpus")
    first = _run(catalog, work / "train", f"{scale}x (tokenizer trained)")
    tok = work / "tokenizer.json"
    shutil.copyfile(Path(first.snapshot or "") / "tokenizer.json", tok)
    pinned = _pinned_catalog(catalog, tok, work / "corpus")
    full_dir = work / "runs"
    full = _run(pinned, full_dir, f"{scale}x full, tokenizer pinned")
    # the nightly run that finds nothing changed: every version whose inputs are the same
    # stands (pipeline/reuse.py); collection, the snapshot and the checks run again
    same = endtoend.run(pinned, full_dir, f"{scale}x re-run, nothing changed", timeout_s=4 * 3600)
    if same.returncode != 0:
        raise SystemExit(f"re-run failed: {same.error}")
    before = _tokenized_versions(full_dir / "data")
    changed = _change_files(pinned, share)
    again = endtoend.run(pinned, full_dir, f"{scale}x refresh", timeout_s=4 * 3600)
    if again.returncode != 0:
        raise SystemExit(f"refresh failed: {again.error}")
    tokenized = _retokenized(full_dir / "data", before)
    ratio = again.cpu_s / full.cpu_s if full.cpu_s else None
    print(
        f"[scaleout] refresh: {again.cpu_s:.1f} of {full.cpu_s:.1f} CPU s "
        f"({(ratio or 0) * 100:.1f}%), {tokenized['retokenized']} files re-tokenized",
        file=sys.stderr,
    )
    return {
        "scale": scale,
        "files": corpus.files,
        "changed_files": changed,
        "full": _summary(full, corpus),
        "refresh": _summary(again, corpus),
        "cpu_ratio": round(ratio, 4) if ratio else None,
        "unchanged": _summary(same, corpus),
        "unchanged_cpu_ratio": round(same.cpu_s / full.cpu_s, 4) if full.cpu_s else None,
        "retokenized": tokenized,
        "target": "refresh CPU <= 15% of a full run's",
        "passed": ratio is not None and ratio <= 0.15,
    }


def _tokenized_versions(data: Path) -> dict[str, str]:
    from megacpp_pipeline.storage.store import ShardStore

    store = ShardStore(str(data))
    root = data / "assets" / "tokenized_docs"
    parts = sorted(p.name for p in root.iterdir() if p.is_dir())
    return {p: store.latest("tokenized_docs", p).version for p in parts}


def _retokenized(data: Path, before: dict[str, str]) -> dict[str, int]:
    """Files tokenized again by the refresh: of each source whose version it made, those not
    taken from the cache (a version that stood tokenized none)."""
    from megacpp_pipeline.storage.store import ShardStore

    store = ShardStore(str(data))
    out = {"input_files": 0, "cached_files": 0, "sources_standing": 0}
    for partition, version in _tokenized_versions(data).items():
        stats = store.latest("tokenized_docs", partition).stats
        out["input_files"] += int(stats.get("input_files", 0))
        if version == before.get(partition):
            out["cached_files"] += int(stats.get("input_files", 0))
            out["sources_standing"] += 1
        else:
            out["cached_files"] += int(stats.get("cached_files", 0))
    out["retokenized"] = out["input_files"] - out["cached_files"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("what", choices=["workers", "serial", "memory", "refresh", "groups"])
    parser.add_argument("--scale", type=int, default=4)
    parser.add_argument("--scales", default="16,64")
    parser.add_argument("--workers", default="2,16")
    parser.add_argument("--engines", default="local")
    parser.add_argument("--changed", type=float, default=0.01)
    parser.add_argument(
        "--repeat", type=int, default=1,
        help="workers: rounds over the counts, compared by their medians",
    )  # fmt: skip
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument(
        "--pin", action="store_true",
        help="workers: confine each run to as many CPUs as it has workers",
    )  # fmt: skip
    parser.add_argument(
        "--baseline", type=Path, action="append", default=[],
        help="serial: also run this checkout (e.g. a worktree at an older commit) on the corpus",
    )  # fmt: skip
    args = parser.parse_args()
    BASELINE.extend(args.baseline)
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-scaleout-"))
    try:
        if args.what == "workers":
            counts = [int(n) for n in args.workers.split(",")]
            result = workers(args.scale, counts, work, args.pin, args.repeat)
        elif args.what == "serial":
            result = serial(args.scale, [e for e in args.engines.split(",") if e], work)
        elif args.what == "memory":
            result = memory([int(n) for n in args.scales.split(",")], work)
        elif args.what == "groups":
            engines = [e for e in args.engines.split(",") if e]
            result = groups([int(n) for n in args.scales.split(",")], engines, work)
        else:
            result = refresh(args.scale, args.changed, work)
    finally:
        if args.work is None:  # a 16x run leaves about 3 GB of stores behind
            shutil.rmtree(work, ignore_errors=True)
    result["measured_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{datetime.now(UTC):%Y-%m-%d}-scaleout-{args.what}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"-> {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
