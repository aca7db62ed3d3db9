"""What orchestration costs as sources grow: `megacpp run` over a catalog of N small `dir`
sources of real headers (5 each, from the demo's pythran wheel), against the same stages and
checks run by the library alone (megacpp_pipeline.pipeline.runner.run_all, no Dagster) on
the same catalog. Orchestration = the run's wall time minus the library's; its growth from
the smallest to the largest N is the cost per source (target: under 0.1 s).

    .venv/bin/python -m bench.bench_orchestration --sources 100,1000 --work DIR
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WHEEL = REPO / ".cache" / "wheels" / "pythran-0.19.0-py3-none-any.whl"
FILES_PER_SOURCE = 5
STAGES = """\
stages:
  tokenizer: {vocab_size: 2048}
  snapshot: {round_trip_sample: 500}
"""


def headers(limit: int) -> list[tuple[str, bytes]]:
    """Real C++ headers from the pythran wheel, smallest-path first, at most `limit`."""
    with zipfile.ZipFile(WHEEL) as z:
        names = sorted(n for n in z.namelist() if n.endswith((".hpp", ".h")))
        return [(n, z.read(n)) for n in names[:limit]]


def write_catalog(root: Path, n: int) -> tuple[Path, int, int]:
    """N dir sources of FILES_PER_SOURCE headers each; returns (catalog, files, bytes)."""
    pool = headers(4000)
    total = 0
    lines = ["snapshot: orch", "seq_len: 1024", STAGES.rstrip(), "sources:"]
    for i in range(n):
        src = root / f"s{i:04d}"
        for j in range(FILES_PER_SOURCE):
            name, data = pool[(i * FILES_PER_SOURCE + j) % len(pool)]
            path = src / Path(name).name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            total += len(data)
        lines.append(f"  - {{id: s{i:04d}, kind: dir, uri: {src}, declared_license: BSD-3-Clause}}")
    catalog = root / "sources.yaml"
    catalog.write_text("\n".join(lines) + "\n")
    return catalog, n * FILES_PER_SOURCE, total


def _library_only(catalog: str, data: str, cache: str) -> None:
    from megacpp_pipeline.pipeline.catalog import load_catalog
    from megacpp_pipeline.pipeline.context import StageContext
    from megacpp_pipeline.pipeline.runner import run_all
    from megacpp_pipeline.stages import default_registry
    from megacpp_pipeline.storage.store import ShardStore

    registry = default_registry()
    ctx = StageContext(load_catalog(catalog, registry), ShardStore(data), registry, Path(cache))
    run_all(ctx)


def measure(root: Path, n: int) -> dict[str, float | int]:
    case = root / f"n{n}"
    shutil.rmtree(case, ignore_errors=True)
    catalog, files, nbytes = write_catalog(case / "corpus", n)
    env = {**os.environ, "DAGSTER_HOME": str(case / "home"), "MEGACPP_WORKERS": "1"}
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "assets.cli", "run", "--config", str(catalog),
         "--data-dir", str(case / "data"), "--cache-dir", str(case / "cache")],
        cwd=REPO, env=env, capture_output=True, text=True,
    )  # fmt: skip
    run_s = time.monotonic() - started
    if out.returncode != 0:
        raise SystemExit(f"megacpp run failed for {n} sources: {out.stderr[-2000:]}")
    runs = int(re.search(r"(\d+) Dagster runs recorded", out.stderr).group(1))  # type: ignore[union-attr]
    started = time.monotonic()
    lib = subprocess.run(
        [sys.executable, "-m", "bench.bench_orchestration", "--library-only", str(catalog),
         str(case / "lib-data"), str(case / "lib-cache")],
        cwd=REPO, env=env, capture_output=True, text=True,
    )  # fmt: skip
    library_s = time.monotonic() - started
    if lib.returncode != 0:
        raise SystemExit(f"library run failed for {n} sources: {lib.stderr[-2000:]}")
    return {
        "sources": n,
        "files": files,
        "mb": round(nbytes / 1e6, 2),
        "dagster_runs": runs,
        "megacpp_run_s": round(run_s, 1),
        "library_s": round(library_s, 1),
        "orchestration_s": round(run_s - library_s, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sources", default="100,1000")
    parser.add_argument("--work", type=Path, default=REPO / ".cache" / "bench" / "orchestration")
    parser.add_argument("--library-only", nargs=3, metavar=("CATALOG", "DATA", "CACHE"))
    args = parser.parse_args(argv)
    if args.library_only:
        _library_only(*args.library_only)
        return 0
    args.work.mkdir(parents=True, exist_ok=True)
    rows = [measure(args.work, int(n)) for n in args.sources.split(",")]
    small, large = rows[0], rows[-1]
    per_source = None
    if large["sources"] != small["sources"]:
        per_source = (large["orchestration_s"] - small["orchestration_s"]) / (
            large["sources"] - small["sources"]
        )
    print(json.dumps({"rows": rows, "orchestration_s_per_source": per_source}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
