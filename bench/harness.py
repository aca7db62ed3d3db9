"""`python -m bench`: every stage against its bare library in the same process (the
bench/bench_*.py scripts), then `megacpp run` end to end on the demo corpus scaled 1x, 4x
and 16x (bench/scaleup.py), with the growth exponents of time and peak memory. Writes
bench/results/<UTC date>.json and docs/benchmarks.md with plots under docs/benchmarks/.

A missed target is a finding: it is reported per line and the harness still exits 0. The
whole run keeps to a time budget (default 17.5 minutes, so that `make bench` from a fresh
clone, install included, stays under 20): a scale whose run would not fit, predicted from
the scales measured before it (the power law through the last two), is not started and the
reason is reported; a run that overruns the budget anyway is stopped at it.

    .venv/bin/python -m bench [--quick] [--scales 1,4,16] [--budget-min 20]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import platform
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from bench import endtoend, scaleup, stages

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
DOCS = REPO / "docs" / "benchmarks.md"
LIBRARIES = (
    "dagster",
    "pyarrow",
    "polars",
    "numpy",
    "tokenizers",
    "datasketch",
    "tree-sitter",
    "tree-sitter-cpp",
    "pydantic",
    "detect-secrets",
    "megatron-core",
    "torch",
)
TIME_EXPONENT_MAX = 1.1
RSS_GROWTH_MAX = 1.3  # peak RSS at 16x over peak RSS at 1x


def plots_dir(docs: Path) -> Path:
    """The PNGs go beside the page: docs/benchmarks.md -> docs/benchmarks/."""
    return docs.with_suffix("")


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_kb = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    except OSError:
        pass
    versions: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "nproc": os.cpu_count(),
        "memory_gib": round(mem_kb / 2**20, 1),
        "cpu": cpu,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "libraries": versions,
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


@dataclass
class Scale:
    scale: int
    files: int = 0
    mb_in: float = 0.0
    build_s: float = 0.0
    run: dict[str, Any] | None = None
    skipped: str = ""

    @property
    def ok(self) -> bool:
        return self.run is not None and self.run["returncode"] == 0


@dataclass
class Fit:
    """y = a * x**exponent by least squares on logs, x = MB of raw C++ in."""

    what: str
    exponent: float | None
    points: int
    target: str
    passed: bool | None
    note: str = ""


@dataclass
class Results:
    date: str
    quick: bool
    command: str
    machine: dict[str, Any]
    stage_scripts: list[dict[str, Any]] = field(default_factory=list)
    lines: list[dict[str, Any]] = field(default_factory=list)
    scales: list[dict[str, Any]] = field(default_factory=list)
    fits: list[dict[str, Any]] = field(default_factory=list)
    profile: str | None = None
    wall_s: float = 0.0


def fit_exponent(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 2 or len(set(xs)) < 2:
        return None
    slope, _ = np.polyfit(np.log(xs), np.log(ys), 1)
    return float(slope)


def scaling_fits(scales: list[Scale]) -> list[Fit]:
    done = [s for s in scales if s.ok]
    assert all(s.run for s in done)
    xs = [s.mb_in for s in done]
    times = [s.run["wall_s"] for s in done if s.run]
    rss = [s.run["peak_rss_mb"] for s in done if s.run]
    t_exp = fit_exponent(xs, times)
    m_exp = fit_exponent(xs, rss)
    cpus = [s.run.get("cpu_s") for s in done if s.run]
    c_exp = fit_exponent(xs, cpus) if all(cpus) else None  # type: ignore[arg-type]
    measured = ", ".join(f"{s.scale}x" for s in done) or "none"
    fits = [
        Fit(
            "wall time vs MB in",
            t_exp,
            len(done),
            f"exponent <= {TIME_EXPONENT_MAX}",
            None if t_exp is None else t_exp <= TIME_EXPONENT_MAX,
            f"scales measured: {measured}",
        )
    ]
    by_scale = {s.scale: s for s in done}
    if 1 in by_scale and 16 in by_scale:
        r1, r16 = by_scale[1].run, by_scale[16].run
        assert r1 and r16
        growth = r16["peak_rss_mb"] / r1["peak_rss_mb"]
        fits.append(
            Fit(
                "peak RSS growth, 16x over 1x",
                growth,
                2,
                f"<= {RSS_GROWTH_MAX}x",
                growth <= RSS_GROWTH_MAX,
                f"memory exponent {m_exp:.2f}" if m_exp is not None else "",
            )
        )
    else:
        projected = 16**m_exp if m_exp is not None else None
        fits.append(
            Fit(
                "peak RSS growth, 16x over 1x",
                None,
                len(done),
                f"<= {RSS_GROWTH_MAX}x",
                None,
                "not measured at both 1x and 16x"
                + (
                    f"; memory exponent {m_exp:.2f} over {measured} projects {projected:.2f}x"
                    if projected is not None
                    else ""
                ),
            )
        )
    if 1 in by_scale and 16 in by_scale:
        fits.append(_largest_step_growth(by_scale[1], by_scale[16]))
    fits.append(Fit("peak RSS vs MB in", m_exp, len(done), "", None, "reported, no target"))
    fits.append(
        Fit(
            "CPU seconds vs MB in",
            c_exp,
            len(done),
            "",
            None,
            "reported, no target: less sensitive than wall time to other load on the machine",
        )
    )
    return fits


def _largest_step_growth(small: Scale, large: Scale) -> Fit:
    """Which stage group's own peak grew most from 1x to 16x (each runs in its own process)."""
    assert small.run and large.run
    before = {g["name"]: g["peak_rss_mb"] for g in small.run["stages"]}
    growth = {
        g["name"]: (g["peak_rss_mb"] / before[g["name"]], before[g["name"]], g["peak_rss_mb"])
        for g in large.run["stages"]
        if before.get(g["name"])
    }
    if not growth:
        return Fit("largest per-step peak RSS growth, 16x over 1x", None, 0, "", None)
    name, (ratio, a, b) = max(growth.items(), key=lambda kv: kv[1][0])
    return Fit(
        "largest per-step peak RSS growth, 16x over 1x",
        ratio,
        2,
        "",
        None,
        f"{name}: {a:.0f} -> {b:.0f} MB (reported, no target)",
    )


def predict_seconds(done: list[Scale], n: int) -> tuple[float, str] | None:
    """Wall seconds of scale n from the scales measured so far: the power law through the
    last two (a pipeline with fixed costs grows slower than linearly; measured exponents are
    0.7-0.8 here), or linear from a single one. The exponent is kept within [0.6, 1.2]."""
    timed = [(s.scale, s.run["wall_s"]) for s in done if s.run]
    if not timed:
        return None
    if len(timed) == 1:
        (k, t) = timed[0]
        return t * n / k, f"linear from {t:.0f} s at {k}x"
    (k1, t1), (k2, t2) = timed[-2], timed[-1]
    slope = min(1.2, max(0.6, math.log(t2 / t1) / math.log(k2 / k1)))
    return t2 * (n / k2) ** slope, f"exponent {slope:.2f} through {k1}x and {k2}x"


def run_scales(
    wanted: list[int], work: Path, deadline: float, wrap_profile: Path | None
) -> list[Scale]:
    out: list[Scale] = []
    for n in wanted:
        scale = Scale(n)
        out.append(scale)
        left = deadline - time.monotonic()
        done = [s for s in out if s.ok]
        predicted = predict_seconds(done, n)
        if predicted is not None and done:
            # and building the copies the cache does not hold yet, at the last build's pace
            last = done[-1]
            built = max(1, last.scale - (done[-2].scale if len(done) > 1 else 0))
            predicted = (predicted[0] + last.build_s / built * (n - last.scale), predicted[1])
        if predicted is not None and predicted[0] > left:
            scale.skipped = (
                f"not started: {predicted[0]:.0f} s predicted ({predicted[1]}) > {left:.0f} s"
                " left of the budget"
            )
            print(f"[bench] {n}x: {scale.skipped}", file=sys.stderr, flush=True)
            continue
        if left < 60:
            scale.skipped = f"not started: {left:.0f} s left of the budget"
            continue
        started = time.monotonic()
        corpus = scaleup.build(n, work)
        scale.build_s = time.monotonic() - started
        scale.files, scale.mb_in = corpus.files, corpus.bytes / 1e6
        print(
            f"[bench] {n}x: {corpus.files} files, {scale.mb_in:.1f} MB; megacpp run ...",
            file=sys.stderr,
            flush=True,
        )
        run_dir = work / "runs" / f"{n}x"
        shutil.rmtree(run_dir, ignore_errors=True)
        load_before = os.getloadavg()[0]
        result = endtoend.run(
            corpus.catalog,
            run_dir,
            f"{n}x",
            timeout_s=max(60.0, deadline - time.monotonic()),
        )
        scale.run = result.as_dict()
        # 1-minute load averages: other work on the machine distorts wall times, not ratios
        scale.run["load_average"] = [load_before, os.getloadavg()[0]]
        print(
            f"[bench] {n}x: exit {result.returncode}, {result.wall_s:.0f} s, "
            f"peak RSS {result.peak_rss_mb:.0f} MB {result.error or ''}",
            file=sys.stderr,
            flush=True,
        )
        shutil.rmtree(run_dir / "data", ignore_errors=True)  # keep the log, not the GBs
    if wrap_profile is not None and out and out[0].ok:
        print("[bench] profiling the smallest scale with pyinstrument ...", file=sys.stderr)
        corpus = scaleup.build(out[0].scale, work)
        run_dir = work / "runs" / "profile"
        shutil.rmtree(run_dir, ignore_errors=True)
        endtoend.run(
            corpus.catalog,
            run_dir,
            "profile",
            timeout_s=3600,
            wrap=["-m", "pyinstrument", "-r", "text", "-o", str(wrap_profile)],
        )
        shutil.rmtree(run_dir / "data", ignore_errors=True)
    return out


def render(path: Path, docs: Path) -> int:
    from bench import results_page

    data = json.loads(path.read_text())
    scales = [Scale(**s) for s in data["scales"]]
    results = Results(**data)
    # Lines are recomputed from each script's raw figures with the current mapping.
    by_module = {s.module: s for s in stages.scripts(REPO / ".cache" / "bench" / "wheels")}
    lines: list[dict[str, Any]] = []
    for run in results.stage_scripts:
        script = by_module.get(run["module"])
        if script is not None and run["figures"]:
            lines += [line.as_dict() for line in script.lines(run["figures"], run["command"])]
    results.lines = lines
    results.fits = [asdict(f) for f in scaling_fits(scales)]
    results_page.write(results, scales, docs, plots_dir(docs))
    print(results_page.summary(results))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small per-stage sizes, 1x only")
    parser.add_argument("--scales", default=None, help="comma-separated, default 1,4,16")
    parser.add_argument(
        "--budget-min",
        type=float,
        default=17.5,
        help="the whole run; with install and downloads `make bench` stays under 20 minutes",
    )
    parser.add_argument("--work", type=Path, default=REPO / ".cache" / "bench")
    parser.add_argument("--no-stages", action="store_true", help="end to end only")
    parser.add_argument("--no-e2e", action="store_true", help="per-stage scripts only")
    parser.add_argument(
        "--profile", action="store_true", help="also run the smallest scale under pyinstrument"
    )
    parser.add_argument(
        "--reuse-stages",
        action="store_true",
        help="take a script's figures from its last successful run of the same command",
    )
    parser.add_argument("--docs", type=Path, default=DOCS)
    parser.add_argument("--out", type=Path, default=None, help="default bench/results/<date>.json")
    parser.add_argument("--render", type=Path, help="rewrite docs from a results JSON")
    args = parser.parse_args(argv)
    if args.render:
        return render(args.render, args.docs)

    started = time.monotonic()
    deadline = started + args.budget_min * 60
    wanted = [int(s) for s in (args.scales or ("1" if args.quick else "1,4,16")).split(",")]
    date = datetime.now(UTC).strftime("%Y-%m-%d")
    results = Results(
        date=date,
        quick=args.quick,
        command=" ".join([".venv/bin/python -m bench", *(argv or sys.argv[1:])]),
        machine=machine(),
    )
    args.work.mkdir(parents=True, exist_ok=True)
    wheels = args.work / "wheels"
    scaleup.unpack_demo(scaleup.WHEELS_DIR, wheels)
    RESULTS.mkdir(parents=True, exist_ok=True)
    logs = args.work / "logs"
    logs.mkdir(exist_ok=True)

    if not args.no_stages:
        for script in stages.scripts(wheels):
            print(f"[bench] {script.module} ...", file=sys.stderr, flush=True)
            res = stages.run_script(script, args.quick, logs, reuse=args.reuse_stages)
            print(
                f"[bench] {script.module}: {res.seconds:.0f} s {res.note}",
                file=sys.stderr,
                flush=True,
            )
            results.stage_scripts.append(
                {
                    "module": res.module,
                    "command": res.command,
                    "seconds": res.seconds,
                    "note": res.note,
                    "figures": res.figures,
                }
            )
            results.lines += [line.as_dict() for line in res.lines]

    scales: list[Scale] = []
    if not args.no_e2e:
        profile = RESULTS / f"{date}-profile.txt" if args.profile else None
        scales = run_scales(wanted, args.work, deadline, profile)
        results.scales = [asdict(s) for s in scales]
        results.fits = [asdict(f) for f in scaling_fits(scales)]
        if profile is not None and profile.exists() and profile.stat().st_size:
            results.profile = str(profile.relative_to(REPO))
    results.machine["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    results.wall_s = time.monotonic() - started

    out = args.out or RESULTS / f"{date}.json"
    out.write_text(json.dumps(asdict(results), indent=1, default=str) + "\n")
    from bench import results_page

    results_page.write(results, scales, args.docs, plots_dir(args.docs))
    print(f"[bench] {results.wall_s:.0f} s; wrote {out} and {args.docs}", file=sys.stderr)
    print(results_page.summary(results))
    return 0
