"""Where a run's serial work is: each corpus-wide stage re-run over a finished run's store, one
fresh process per stage (`run_stage`, what its Dagster asset calls, then its checks), its own CPU
seconds (the driver's part, one core) apart from its forked workers', and its own peak memory.

At two scales the driver seconds and peak of each stage are fitted as a line in the MB
collected and projected to 1 TB, the figure docs/scaling.md reports: the largest remaining
single-process step and its time at 1 TB (target: none over 10 minutes, a 64 GB driver enough).
A stage that runs steps in processes of their own (the snapshot's single-file writers,
promotion checks and diff) reports each one's CPU, projected the same way: each is a
single-process step too.

    .venv/bin/python -m bench.bench_driver --scales 16,64 [--work DIR] [--stages A,B] [--repeat N]

`--work` may hold the runs `bench.bench_scaleout memory` left (`<scale>x/data`); a scale
without one is run first. Results go to bench/results/<date>-scaleout-driver.json.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import scaleup
from bench.bench_scaleout import RESULTS, _run

TB_MB = 1_000_000.0
TARGET_S = 600.0  # no single-process step over 10 minutes at 1 TB
DRIVER_MB = 64_000.0


def _cpu() -> tuple[float, float]:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def one(catalog: Path, data: Path, cache: Path, name: str, workers: int) -> dict[str, Any]:
    """One stage and its checks in this process (run as `_one` in a fresh interpreter)."""
    from megacpp_pipeline.pipeline.catalog import load_catalog
    from megacpp_pipeline.pipeline.checks import checks_of
    from megacpp_pipeline.pipeline.context import StageContext
    from megacpp_pipeline.pipeline.executor import end_light_pool
    from megacpp_pipeline.pipeline.no_pandas import skip_pandas_probe
    from megacpp_pipeline.pipeline.runner import run_stage
    from megacpp_pipeline.stages import default_registry
    from megacpp_pipeline.storage.store import ShardStore

    skip_pandas_probe()  # as a run's process does (assets/defs.py): pyarrow never imports pandas
    registry = default_registry()
    ctx = StageContext(
        load_catalog(catalog, registry),
        ShardStore(str(data)),
        registry,
        cache,
        workers=workers,
        # computed again: over the finished run's store every version's inputs are unchanged,
        # so with reuse each stage would stand and its driver do next to nothing
        reuse=False,
    )
    stage = registry.get(name)
    base_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    cpu0, kids0 = _cpu()
    t0 = time.perf_counter()
    for _ in run_stage(ctx, stage, ctx.partitions(stage)):
        pass
    end_light_pool()  # its workers reaped: their CPU is in RUSAGE_CHILDREN
    cpu1, kids1 = _cpu()
    t1 = time.perf_counter()
    stage_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    for check in checks_of(stage):
        for partition in ctx.partitions(stage):
            check.evaluate(ctx, stage, partition)
    end_light_pool()
    cpu2, kids2 = _cpu()
    # steps the stage ran in a process of their own (the snapshot's single-file writers,
    # promotion checks and diff): each one's CPU seconds
    apart = (
        ctx.latest(stage.name, None).extra.get("single_process_steps_cpu_s") or {}
        if ctx.store.has_version(stage.name)  # the last two stages commit no version
        else {}
    )
    return {
        "single_process_steps_cpu_s": apart,
        "wall_s": round(t1 - t0, 2),
        "driver_cpu_s": round(cpu1 - cpu0, 2),
        "workers_cpu_s": round(kids1 - kids0, 2),
        "checks_wall_s": round(time.perf_counter() - t1, 2),
        "checks_driver_cpu_s": round(cpu2 - cpu1, 2),
        "checks_workers_cpu_s": round(kids2 - kids1, 2),
        "import_mb": round(base_mb, 1),
        "peak_mb": round(stage_mb, 1),
        "peak_with_checks_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        # the largest resident set of any worker it forked (and reaped), checks included
        "workers_peak_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1),
    }


def _global_stages() -> list[str]:
    from megacpp_pipeline.stages import default_registry

    registry = default_registry()
    first = registry.names()[0]  # the catalog: a few rows whatever the corpus
    return [s.name for s in registry if not s.per_source and s.name != first]


def _driver_s(run: dict[str, Any]) -> float:
    return float(run["driver_cpu_s"] + run["checks_driver_cpu_s"])


def measure(
    scale: int, work: Path, workers: int, names: list[str] | None = None, repeat: int = 1
) -> dict[str, Any]:
    """Each stage `repeat` times over the run's store; the run of least driver CPU is kept
    (the shared machine's noise only adds), every run's driver CPU listed beside it, and each
    step apart at its least over the runs."""
    corpus = scaleup.build(scale, scaleup.REPO / ".cache" / "bench")
    run_dir = work / f"{scale}x"
    if not (run_dir / "data" / "snapshots").is_dir():
        _run(corpus.catalog, run_dir, f"{scale}x")
    stages = {}
    for name in names or _global_stages():
        runs = []
        for _ in range(repeat):
            cache = run_dir / "cache-driver"  # fresh: the map work is done again, not hits
            shutil.rmtree(cache, ignore_errors=True)
            print(f"[driver] {scale}x {name} ...", file=sys.stderr, flush=True)
            cmd = [sys.executable, "-m", "bench.bench_driver", "_one", str(corpus.catalog)]
            cmd += [str(run_dir / "data"), str(cache), name, str(workers)]
            out = subprocess.run(cmd, cwd=scaleup.REPO, capture_output=True, text=True)
            if out.returncode != 0:
                raise SystemExit(f"{scale}x {name} failed:\n{out.stderr[-4000:]}")
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"[driver] {scale}x {name}: {runs[-1]}", file=sys.stderr, flush=True)
        stages[name] = min(runs, key=_driver_s)
        stages[name]["driver_and_checks_cpu_s_runs"] = [round(_driver_s(r), 2) for r in runs]
        # each step apart at its least over the runs too (each is its own process)
        steps = {k for r in runs for k in r["single_process_steps_cpu_s"]}
        stages[name]["single_process_steps_cpu_s"] = {
            k: min(r["single_process_steps_cpu_s"].get(k, float("inf")) for r in runs)
            for k in sorted(steps)
        }
    return {"mb_in": round(corpus.bytes / 1e6, 1), "files": corpus.files, "stages": stages}


def _line(x0: float, y0: float, x1: float, y1: float, at: float) -> float:
    slope = (y1 - y0) / (x1 - x0)
    return max(y0 + slope * (at - x0), y1)


def project(runs: dict[int, dict[str, Any]]) -> dict[str, Any]:
    small, large = runs[min(runs)], runs[max(runs)]
    x0, x1 = small["mb_in"], large["mb_in"]
    out: dict[str, dict[str, Any]] = {}
    steps: dict[str, float] = {}  # every single-process step: each driver, each writer
    for name, s in large["stages"].items():
        a = small["stages"][name]
        drv0, drv1 = _driver_s(a), _driver_s(s)
        out[name] = {
            "driver_s_per_gb": round((drv1 - drv0) / (x1 - x0) * 1000, 3),
            "driver_s_at_1tb": round(_line(x0, drv0, x1, drv1, TB_MB)),
            "peak_mb_at_1tb": round(
                _line(x0, a["peak_with_checks_mb"], x1, s["peak_with_checks_mb"], TB_MB)
            ),
        }
        steps[name] = out[name]["driver_s_at_1tb"]
        apart = s.get("single_process_steps_cpu_s") or {}
        if apart:
            before = a.get("single_process_steps_cpu_s") or {}
            out[name]["apart_s_at_1tb"] = {
                step: round(_line(x0, before.get(step, 0.0), x1, cpu, TB_MB))
                for step, cpu in apart.items()
            }
            steps.update({f"{name}: {k}": v for k, v in out[name]["apart_s_at_1tb"].items()})
    largest = max(steps.items(), key=lambda kv: kv[1])
    heaviest = max(out.items(), key=lambda kv: kv[1]["peak_mb_at_1tb"])
    return {
        "per_stage": out,
        "largest_single_process_step": [largest[0], largest[1]],
        "largest_driver_peak": [heaviest[0], heaviest[1]["peak_mb_at_1tb"]],
        "target": f"no step over {TARGET_S:.0f} s at 1 TB, a {DRIVER_MB / 1000:.0f} GB driver",
        "passed": largest[1] <= TARGET_S and heaviest[1]["peak_mb_at_1tb"] <= DRIVER_MB,
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_one":
        catalog, data, cache, name, workers = sys.argv[2:7]
        print(json.dumps(one(Path(catalog), Path(data), Path(cache), name, int(workers))))
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scales", default="16,64")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--stages", default="", help="these stages only (comma-separated)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per stage; least kept")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-driver-"))
    scales = [int(n) for n in args.scales.split(",")]
    names = [n for n in args.stages.split(",") if n] or None
    runs = {scale: measure(scale, work, args.workers, names, args.repeat) for scale in scales}
    result = {
        "scales": scales,
        "workers": args.workers,
        "runs": runs,
        "projection": project(runs),
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{datetime.now(UTC):%Y-%m-%d}-scaleout-driver.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["projection"], indent=2))
    print(f"-> {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
