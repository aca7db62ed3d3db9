"""Memory flat in corpus size: `megacpp run` on the demo scaled 4x and 16x, on each engine,
with the largest resident set of any single process of the run sampled per stage group
(bench/endtoend.py: the Dagster run's process, a forked worker, a Ray worker or one of Ray's
daemons, whichever is largest at each sample).

Target (issue 16): for every stage group, the largest single-process peak at 16x within
1.3x of the one at 4x, on both engines. A missed target is reported, not raised.

    .venv/bin/python -m bench.bench_memory [--engines local,ray] [--scales 4,16]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import endtoend, scaleup

REPO = Path(__file__).resolve().parent.parent
GROWTH_MAX = 1.3


def measure(engine: str, scale: int, work: Path) -> dict[str, Any]:
    corpus = scaleup.build(scale, REPO / ".cache" / "bench")
    run_dir = work / f"{engine}-{scale}x"
    shutil.rmtree(run_dir, ignore_errors=True)
    print(f"[memory] {engine} {scale}x: {corpus.files} files ...", file=sys.stderr, flush=True)
    result = endtoend.run(
        corpus.catalog, run_dir, f"{engine}-{scale}x", timeout_s=3600, args=["--engine", engine]
    )
    if result.returncode != 0:
        raise SystemExit(f"{engine} {scale}x failed: {result.error}")
    groups = {
        g.name: {
            "largest_process_mb": round(g.largest_process_mb, 1),
            "process": g.largest_process,
            "seconds": round(g.seconds, 1),
        }
        for g in result.stages
    }
    shutil.rmtree(run_dir / "data", ignore_errors=True)
    print(
        f"[memory] {engine} {scale}x: {result.wall_s:.0f} s, largest process "
        f"{max(g['largest_process_mb'] for g in groups.values()):.0f} MB",
        file=sys.stderr,
        flush=True,
    )
    return {
        "files": corpus.files,
        "mb_in": round(corpus.bytes / 1e6, 1),
        "wall_s": round(result.wall_s, 1),
        "snapshot": Path(result.snapshot or "").name,
        "groups": groups,
    }


def growth(small: dict[str, Any], large: dict[str, Any]) -> dict[str, Any]:
    """Per stage group, the largest single-process peak at the large scale over the small."""
    rows = {}
    for name, big in large["groups"].items():
        base = small["groups"].get(name)
        if base is None or not base["largest_process_mb"]:
            continue
        ratio = big["largest_process_mb"] / base["largest_process_mb"]
        rows[name] = {
            "small_mb": base["largest_process_mb"],
            "large_mb": big["largest_process_mb"],
            "ratio": round(ratio, 3),
            "process": big["process"],
        }
    worst = max(rows.items(), key=lambda kv: kv[1]["ratio"]) if rows else ("", {"ratio": 0})
    return {
        "groups": rows,
        "worst": worst[0],
        "worst_ratio": worst[1]["ratio"],
        "passed": all(r["ratio"] <= GROWTH_MAX for r in rows.values()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--engines", default="local,ray")
    parser.add_argument("--scales", default="4,16")
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-memory-"))
    scales = [int(s) for s in args.scales.split(",")]
    result: dict[str, Any] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "target": f"largest single-process peak at {scales[-1]}x <= {GROWTH_MAX} x at "
        f"{scales[0]}x, per stage group",
        "engines": {},
    }
    for engine in args.engines.split(","):
        runs = {f"{s}x": measure(engine, s, work) for s in scales}
        small, large = runs[f"{scales[0]}x"], runs[f"{scales[-1]}x"]
        result["engines"][engine] = {"runs": runs, "growth": growth(small, large)}
        g = result["engines"][engine]["growth"]
        print(
            f"[memory] {engine}: worst {g['worst']} {g['worst_ratio']}x, "
            f"{'passed' if g['passed'] else 'MISSED'}",
            file=sys.stderr,
            flush=True,
        )
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
