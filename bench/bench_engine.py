"""The ray engine against the local one: `megacpp run` on the scaled demo corpus, once with
`--engine local` and once with `--engine ray` (a local Ray instance started by the run, or
`--ray-address`), each with a fresh data dir and a fresh file-result cache, in the same
session. Reports wall seconds, the ratio, the Ray engine's fixed cost (its run groups' wall
time on a one-file corpus over the local engine's) and whether both promoted the same
snapshot.

    .venv/bin/python -m bench.bench_engine --scale 4 [--ray-address HOST:PORT]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.scaleup import build

REPO = Path(__file__).resolve().parent.parent


def run(catalog: Path, work: Path, engine: str, address: str | None) -> dict:
    data, cache = work / f"data-{engine}", work / f"cache-{engine}"
    shutil.rmtree(data, ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)
    cmd = [sys.executable, "-m", "assets.cli", "run", "--config", str(catalog),
           "--data-dir", str(data), "--cache-dir", str(cache), "--engine", engine]  # fmt: skip
    if address:
        cmd += ["--ray-address", address]
    env = dict(os.environ, DAGSTER_HOME=str(work / "dagster_home"))
    started = time.monotonic()
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.monotonic() - started
    if out.returncode != 0:
        raise SystemExit(f"{engine}: megacpp run failed:\n{out.stderr[-3000:]}")
    return {"engine": engine, "wall_s": round(wall, 1), "snapshot": out.stdout.split()[-1]}


def tiny_catalog(work: Path) -> Path:
    src = work / "tiny"
    src.mkdir(parents=True, exist_ok=True)
    (src / "a.hpp").write_text("#pragma once\nnamespace a {\ninline int one() { return 1; }\n}\n")
    catalog = work / "tiny.yaml"
    catalog.write_text(
        f"snapshot: tiny\nsources:\n  - {{id: tiny, kind: dir, uri: {src}, "
        "declared_license: MIT}\n"
    )
    return catalog


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scale", type=int, default=4)
    parser.add_argument("--ray-address", default=None)
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-engine-"))
    corpus = build(args.scale, REPO / ".cache" / "bench")
    tiny = tiny_catalog(work)
    fixed = {e: run(tiny, work / "tiny", e, args.ray_address)["wall_s"] for e in ("local", "ray")}
    local = run(corpus.catalog, work, "local", None)
    on_ray = run(corpus.catalog, work, "ray", args.ray_address)
    result = {
        "scale": args.scale,
        "files": corpus.files,
        "mb_in": round(corpus.bytes / 1e6, 1),
        "local_wall_s": local["wall_s"],
        "ray_wall_s": on_ray["wall_s"],
        "ratio": round(on_ray["wall_s"] / local["wall_s"], 3),
        "target": "ray <= 1.5 x local",
        "passed": on_ray["wall_s"] <= 1.5 * local["wall_s"],
        "ray_fixed_cost_s": round(fixed["ray"] - fixed["local"], 1),
        "tiny_corpus_wall_s": fixed,
        "same_snapshot": Path(local["snapshot"]).name == Path(on_ray["snapshot"]).name,
        "ray_address": args.ray_address or "local instance",
        "cpus": len(os.sched_getaffinity(0)),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
