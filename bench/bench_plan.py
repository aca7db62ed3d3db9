"""`megacpp plan` against measured runs, and the rates it plans with.

`calibrate` runs `megacpp run` on the demo scaled to each scale (bench/scaleup.py; fresh data
dir, DAGSTER_HOME and cache each, sampled by bench/endtoend.py: per stage group CPU seconds,
the driver's CPU, wall, the driver's own high-water mark, the largest process and every
process together), measures what each group left on disk, fits every figure as a line in the
MB collected and writes megacpp_pipeline/plan/rates.json (the file the package ships). The
shipped rates are fitted over 1x, 4x and 16x: the per-file groups' memory levels off once
their shards are full (collection writes up to 5,000 files a shard; the 1x demo's largest
source has about 4,000), so a line through 1x and 4x alone overshoots 16x's peak by ~40%.

`accuracy` plans each scale with those rates, then runs it fresh and compares: the run's wall
and peak memory (every process together) against the forecast, target within 30%.

`refresh` measures the tokenizer policy on a refresh: a full run (the default mode, reuse,
trains: nothing to reuse yet), then the same data dir after `--changed` of the files were
edited: how many files were tokenized again (target: the changed ones only) and the re-run's
CPU against the full run's; with `--train`, the same re-run with `mode: train` beside it.

    .venv/bin/python -m bench.bench_plan calibrate --scales 1,4,16
    .venv/bin/python -m bench.bench_plan accuracy --scales 1,4,16
    .venv/bin/python -m bench.bench_plan refresh --scale 4 --changed 0.01 [--train]

Results go to bench/results/<date>-plan-<what>.json; a missed target is reported, not raised.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from bench import endtoend, scaleup
from bench.bench_scaleout import _change_files, _copy_corpus, _retokenized, _summary
from megacpp_pipeline.pipeline.catalog import load_catalog
from megacpp_pipeline.pipeline.parallel import workers_from
from megacpp_pipeline.plan.forecast import Forecast, forecast
from megacpp_pipeline.plan.rates import RATES_FILE, Calibration, GroupRates, Rates, fit_linear
from megacpp_pipeline.plan.sizing import MB, host_memory_mb, size_sources, store_usage
from megacpp_pipeline.stages import default_registry

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
SHIPPED = REPO / "megacpp_pipeline" / "plan" / RATES_FILE
BENCH = REPO / ".cache" / "bench"
TARGET = 0.30  # forecast within 30% of the measured wall and peak memory


def _tree_mb(path: Path) -> float:
    total = 0
    if path.is_dir():
        for p in path.rglob("*"):
            if p.is_file() and not p.is_symlink():
                total += p.stat().st_size
    return total / MB


def disk_by_stage(work: Path, stages: list[str]) -> dict[str, dict[str, float]]:
    """What each stage left: its versions in the data dir, its per-file results in the
    cache; the snapshot and the Megatron export also count the folders they built, which
    stay on local disk even with an object store."""
    data, cache = work / "data", work / "cache"
    out = {}
    for stage in stages:
        out[stage] = {
            "data_mb": _tree_mb(data / "assets" / stage),
            "cache_mb": _tree_mb(cache / "file-results" / stage),
            "local_build_mb": 0.0,
        }
    built = {"snapshot": data / "snapshots", "megatron_dataset": data / "megatron"}
    for stage, folder in built.items():
        if stage in out:
            out[stage]["data_mb"] += _tree_mb(folder)
            out[stage]["local_build_mb"] += _tree_mb(folder)
    return out


def _run(
    corpus: scaleup.ScaledCorpus, work: Path, label: str, workers: int | None = None
) -> endtoend.EndToEnd:
    shutil.rmtree(work, ignore_errors=True)
    print(f"[plan] {label} ...", file=sys.stderr, flush=True)
    result = endtoend.run(corpus.catalog, work, label, timeout_s=4 * 3600, workers=workers)
    if result.returncode != 0:
        raise SystemExit(f"{label} failed: {result.error}")
    print(
        f"[plan] {label}: {result.wall_s:.1f} s wall, {result.cpu_s:.1f} CPU s, peak "
        f"{result.peak_rss_mb:.0f} MB",
        file=sys.stderr,
        flush=True,
    )
    return result


def measure(scale: int, work: Path, workers: int | None = None) -> dict[str, Any]:
    """One scale's run: per registry group, every figure the rates hold."""
    corpus = scaleup.build(scale, BENCH)
    result = _run(corpus, work, f"{scale}x" + (f" w{workers}" if workers else ""), workers)
    registry = default_registry()
    disk = disk_by_stage(work, registry.names())
    mb = (
        sum(s.listed.bytes for s in size_sources(load_catalog(corpus.catalog, registry), work)) / MB
    )
    by_name = {tuple(g.name.split(", ")): g for g in result.stages}
    groups = {}
    for stages in registry.run_groups():
        g = next((v for k, v in by_name.items() if set(k) == set(stages)), None)
        if g is None:
            raise SystemExit(f"{scale}x: no measured group for {stages}")
        groups[", ".join(stages)] = {
            "cpu_s": g.cpu_s,
            "driver_cpu_s": g.driver_cpu_s,
            "wall_s": g.seconds,
            "driver_peak_mb": g.process_peak_rss_mb,
            "largest_process_mb": g.largest_process_mb,
            "tree_peak_mb": g.peak_rss_mb,
            "data_mb": sum(disk[s]["data_mb"] for s in stages),
            "cache_mb": sum(disk[s]["cache_mb"] for s in stages),
            "local_build_mb": sum(disk[s]["local_build_mb"] for s in stages),
        }
    return {
        "scale": scale,
        "files": corpus.files,
        "mb": round(mb, 3),
        "wall_s": round(result.wall_s, 2),
        "cpu_s": round(result.cpu_s, 2),
        "peak_mb": round(result.peak_rss_mb, 1),
        "startup_wall_s": max(0.0, result.wall_s - sum(g.seconds for g in result.stages)),
        "groups": groups,
        "snapshot": Path(result.snapshot or "").name,
    }


def _commit() -> str:
    out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def fit(runs: list[dict[str, Any]], one_worker: dict[str, Any] | None = None) -> Rates:
    """Every figure of every group as a line over the runs; the per-worker memory from the
    smallest run again with one worker (the difference, per worker)."""
    mbs = [r["mb"] for r in runs]
    workers = workers_from(os.environ)
    groups = []
    for name in runs[0]["groups"]:
        figures = {
            key: fit_linear(mbs, [r["groups"][name][key] for r in runs])
            for key in runs[0]["groups"][name]
        }
        if one_worker is not None and workers > 1:
            more = runs[0]["groups"][name]["tree_peak_mb"]
            less = one_worker["groups"][name]["tree_peak_mb"]
            figures["per_worker_mb"] = fit_linear([], [])
            figures["per_worker_mb"].fixed = round(max(0.0, more - less) / (workers - 1), 1)
        groups.append(GroupRates(stages=name.split(", "), **figures))
    cores = len(os.sched_getaffinity(0))
    return Rates(
        calibration=Calibration(
            measured_at=datetime.now(UTC).isoformat(timespec="seconds"),
            commit=_commit(),
            host=f"{cores} CPUs, {host_memory_mb() / 1000:.1f} GB",
            cores=cores,
            workers=workers,
            memory_mb=round(host_memory_mb(), 1),
            engine="local",
            runs=[
                {k: r[k] for k in ("scale", "files", "mb", "wall_s", "cpu_s", "peak_mb")}
                for r in runs
            ],
        ),
        startup_wall_s=fit_linear(mbs, [r["startup_wall_s"] for r in runs]),
        groups=groups,
    )


def calibrate(scales: list[int], work: Path, out: Path) -> dict[str, Any]:
    runs = [measure(scale, work / f"calibrate-{scale}x") for scale in scales]
    one = measure(scales[0], work / f"calibrate-{scales[0]}x-w1", workers=1)
    rates = fit(runs, one)
    out.write_text(rates.model_dump_json(indent=2) + "\n")
    print(f"[plan] rates -> {out}", file=sys.stderr)
    return {
        "scales": scales,
        "runs": runs,
        "one_worker": one,
        "rates": rates.model_dump(),
        "written": str(out),
    }


def _error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured if measured else float("inf")


def predict(
    corpus: scaleup.ScaledCorpus, work: Path, rates: Rates, workers: int | None = None
) -> Forecast:
    """The forecast `megacpp plan` prints for this run (same sizing, same rates)."""
    registry = default_registry()
    catalog = load_catalog(corpus.catalog, registry)
    (work / "data").mkdir(parents=True, exist_ok=True)
    return forecast(
        catalog,
        registry,
        size_sources(catalog, work / "cache"),
        data_dir=str(work / "data"),
        cache_dir=work / "cache",
        workers=workers or workers_from(os.environ),
        rates=rates,
        store_now=store_usage(str(work / "data")),
    )


def accuracy(
    scales: list[int], work: Path, rates: Rates, one_worker: bool = False
) -> dict[str, Any]:
    """Each scale planned, then run fresh; with `one_worker`, the smallest scale again on one
    worker (the forecast moved off the calibration's workers)."""
    rows = []
    cases = [(scale, None) for scale in scales] + ([(scales[0], 1)] if one_worker else [])
    for scale, workers in cases:
        corpus = scaleup.build(scale, BENCH)
        label = f"{scale}x" + (f" w{workers}" if workers else "")
        run_dir = work / f"accuracy-{label.replace(' ', '-')}"
        shutil.rmtree(run_dir, ignore_errors=True)
        plan = predict(corpus, run_dir, rates, workers)
        result = _run(corpus, run_dir, label, workers)
        largest = max((g.largest_process_mb for g in result.stages), default=0.0)
        disk = _tree_mb(run_dir / "data") + _tree_mb(run_dir / "cache" / "file-results")
        row = {
            "scale": scale,
            "workers": plan.workers,
            "files": plan.files,
            "mb_in": round(plan.mb_in, 1),
            "wall_s": {"predicted": round(plan.wall_s, 1), "measured": round(result.wall_s, 1)},
            "cpu_s": {"predicted": round(plan.cpu_s, 1), "measured": round(result.cpu_s, 1)},
            "peak_mb": {
                "predicted": round(plan.peak_mb, 1),
                "measured": round(result.peak_rss_mb, 1),
            },
            "largest_process_mb": {
                "predicted": round(max(g.worker_peak_mb for g in plan.groups), 1),
                "measured": round(largest, 1),
            },
            "disk_mb": {"predicted": round(plan.local_mb, 1), "measured": round(disk, 1)},
            "groups": {
                g.label: {
                    "wall_s": [round(g.wall_s, 1), round(m.seconds, 1)],
                    "cpu_s": [round(g.cpu_s, 1), round(m.cpu_s, 1)],
                    "peak_mb": [round(g.peak_mb, 1), round(m.peak_rss_mb, 1)],
                }
                for g in plan.groups
                for m in result.stages
                if set(m.name.split(", ")) == set(g.stages)
            },
            "snapshot": Path(result.snapshot or "").name,
        }
        for key in ("wall_s", "cpu_s", "peak_mb", "largest_process_mb", "disk_mb"):
            row[key]["error"] = round(_error(row[key]["predicted"], row[key]["measured"]), 3)
        row["within_target"] = all(
            abs(row[key]["error"]) <= TARGET for key in ("wall_s", "peak_mb")
        )
        rows.append(row)
        print(
            f"[plan] {label}: wall {row['wall_s']}, peak {row['peak_mb']}",
            file=sys.stderr,
            flush=True,
        )
    return {
        "target": f"predicted wall and peak memory within {TARGET:.0%} of the measured run",
        "rates_calibrated_on": [r["scale"] for r in rates.calibration.runs],
        "runs": rows,
        "passed": all(r["within_target"] for r in rows),
        "table": markdown(rows),
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    out = [
        "| demo | workers | MB | wall s: plan / run | error | peak MB: plan / run | error |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        w, p = r["wall_s"], r["peak_mb"]
        out.append(
            f"| {r['scale']}x | {r['workers']} | {r['mb_in']} | "
            f"{w['predicted']} / {w['measured']} | "
            f"{w['error']:+.0%} | {p['predicted']:,.0f} / {p['measured']:,.0f} | "
            f"{p['error']:+.0%} |"
        )
    return "\n".join(out)


def _with_mode(catalog: Path, mode: str, into: Path) -> Path:
    data = yaml.safe_load(catalog.read_text())
    data.setdefault("stages", {})["tokenizer"] = {"mode": mode}
    out = into / f"sources-{mode}.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def refresh(scale: int, share: float, work: Path, train: bool) -> dict[str, Any]:
    """A full run, then the same data dir re-run after `share` of the files changed, with
    the default tokenizer mode (reuse); `train`: also the same re-run with mode train."""
    corpus = scaleup.build(scale, BENCH)
    shutil.rmtree(work, ignore_errors=True)
    (work / "corpus").mkdir(parents=True)
    catalog = _copy_corpus(corpus.catalog, work / "corpus")
    runs = work / "runs"
    full = endtoend.run(catalog, runs, f"{scale}x full", timeout_s=4 * 3600)
    if full.returncode != 0:
        raise SystemExit(f"full run failed: {full.error}")
    first_tokens = json.loads((Path(full.snapshot or "") / "manifest.json").read_text())
    changed = _change_files(catalog, share)
    if train:  # the same data dir, copied before the reuse run, for the train variant
        shutil.copytree(runs, work / "runs-train", symlinks=True)
    again = endtoend.run(catalog, runs, f"{scale}x refresh (reuse)", timeout_s=4 * 3600)
    if again.returncode != 0:
        raise SystemExit(f"refresh failed: {again.error}")
    second = json.loads((Path(again.snapshot or "") / "manifest.json").read_text())
    tokenized = _retokenized(runs / "data")
    out: dict[str, Any] = {
        "scale": scale,
        "files": corpus.files,
        "changed_files": changed,
        "full": _summary(full, corpus),
        "refresh": _summary(again, corpus),
        "tokenizer_kept": first_tokens["tokenizer"]["sha256"] == second["tokenizer"]["sha256"],
        "tokenizer_policy": second.get("tokenizer_policy"),
        "retokenized": tokenized,
        "retokenized_share": round(tokenized["retokenized"] / tokenized["input_files"], 5),
        "cpu_ratio": round(again.cpu_s / full.cpu_s, 4) if full.cpu_s else None,
        "target": "only the changed files tokenized again",
    }
    out["passed"] = out["tokenizer_kept"] and tokenized["retokenized"] <= changed
    if train:
        trained = endtoend.run(
            _with_mode(catalog, "train", work / "corpus"),
            work / "runs-train",
            f"{scale}x refresh (train)",
            timeout_s=4 * 3600,
        )
        if trained.returncode != 0:
            raise SystemExit(f"train refresh failed: {trained.error}")
        t = _retokenized(work / "runs-train" / "data")
        out["train"] = {
            "refresh": _summary(trained, corpus),
            "retokenized": t,
            "cpu_ratio": round(trained.cpu_s / full.cpu_s, 4) if full.cpu_s else None,
        }
    print(
        f"[plan] refresh: {tokenized['retokenized']} of {tokenized['input_files']} files "
        f"re-tokenized ({changed} changed), CPU {again.cpu_s:.1f} of {full.cpu_s:.1f} s",
        file=sys.stderr,
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("what", choices=["calibrate", "accuracy", "refresh"])
    parser.add_argument("--scales", default="1,4,16")
    parser.add_argument("--scale", type=int, default=4)
    parser.add_argument("--changed", type=float, default=0.01)
    parser.add_argument("--train", action="store_true")
    parser.add_argument(
        "--one-worker", action="store_true", help="accuracy: the smallest scale on one worker too"
    )
    parser.add_argument("--rates", type=Path, default=SHIPPED, help="written / read")
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-plan-"))
    scales = [int(s) for s in args.scales.split(",")]
    if args.what == "calibrate":
        result = calibrate(scales, work, args.rates)
    elif args.what == "accuracy":
        rates = Rates.model_validate_json(args.rates.read_bytes())
        result = accuracy(scales, work, rates, args.one_worker)
    else:
        result = refresh(args.scale, args.changed, work, args.train)
    result["measured_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{datetime.now(UTC):%Y-%m-%d}-plan-{args.what}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"-> {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
