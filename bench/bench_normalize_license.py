"""Normalize and license gates against a bare read + sha256 loop over the same files, in one
run (issue 3: cheap filters must stay cheap), plus the licence decisions pythran's vendored
Boost, xsimd and its own files get with declared_license "BSD-3-Clause".

Each repeat runs every step once, in turn (bare, normalize, bare over the licence gate's
files, license), and each figure is the median over repeats: load from other work on the
machine then falls on all steps alike instead of on whichever ran while it lasted.
license_over_bare compares with the bare loop over every raw file, as bench/stages.py does;
license_over_bare_same_files with the bare loop over exactly the files the gate reads.

Corpus: every file of the demo wheels (pythran 0.19.0, pybind11 3.1.0, nanobind 3.1.0)
unzipped under --wheels as <dir>/<name>/...; missing wheels are fetched with
`pip download --no-deps` and unzipped there.

    .venv/bin/python -m bench.bench_normalize_license [--wheels /tmp/wheels/x] [--repeat 3]
                                                      [--json PATH]
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from megacpp_pipeline.core.schemas import RAW_FILES, git_blob_sha
from megacpp_pipeline.gates import license, normalize

WHEELS = {"pythran": "0.19.0", "pybind11": "3.1.0", "nanobind": "3.1.0"}


def _ensure_wheels(root: Path) -> None:
    missing = [
        name for name in WHEELS if not (root / name).is_dir() or not any((root / name).iterdir())
    ]
    if not missing:
        return
    with tempfile.TemporaryDirectory() as download:
        specs = [f"{name}=={WHEELS[name]}" for name in missing]
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", download, *specs],
            check=True,
        )
        for wheel in Path(download).glob("*.whl"):
            name = wheel.name.split("-")[0]
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(root / name)


def _files(root: Path) -> list[tuple[str, Path]]:
    out = []
    for name in WHEELS:
        base = root / name
        out += [(name, p) for p in sorted(base.rglob("*")) if p.is_file() and not p.is_symlink()]
    return out


def _raw_table(files: list[tuple[str, Path]], root: Path) -> pa.Table:
    rows = []
    for source_id, path in files:
        content = path.read_bytes()
        rows.append(
            {
                "source_id": source_id,
                "path": path.relative_to(root / source_id).as_posix(),
                "revision": WHEELS[source_id],
                "blob_sha": git_blob_sha(content),
                "size": len(content),
                "content": content,
            }
        )
    return pa.Table.from_pylist(rows, schema=RAW_FILES)


def _interleaved_median_seconds(
    steps: dict[str, Callable[[], object]], repeat: int
) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeat):
        for name, step in steps.items():
            gc.collect()  # no step pays for the garbage of the one before it
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def _bare_read_sha256(files: list[tuple[str, Path]]) -> None:
    for _, path in files:
        hashlib.sha256(path.read_bytes()).hexdigest()


def _pythran_breakdown(result: Any) -> dict[str, int]:
    def group(path: str) -> str:
        parts = path.split("/")
        return parts[1] if len(parts) > 1 and parts[1] in ("boost", "xsimd") else "own"

    counts: Counter[str] = Counter()
    for row in result.kept.select(["path", "license_source", "license_decision"]).to_pylist():
        counts[f"{group(row['path'])} {row['license_decision']} {row['license_source']}"] += 1
    for row in result.dropped.to_pylist():
        source = row["detail"].split(":")[0]
        counts[f"{group(row['path'])} {row['reason']} {source}"] += 1
    return dict(sorted(counts.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--wheels", type=Path, default=Path("/tmp/wheels/x"))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    _ensure_wheels(args.wheels)
    files = _files(args.wheels)
    raw = _raw_table(files, args.wheels)
    raw_mb = sum(p.stat().st_size for _, p in files) / 1e6

    norm_config = normalize.NormalizeConfig()
    lic_config = license.LicenseConfig()
    normalized = normalize.run(raw, norm_config)
    text_mb = normalized.stats["bytes_kept"] / 1e6
    license.run(normalized.kept, lic_config, declared_license="BSD-3-Clause", reuse_files={})

    # the licence gate reads the files normalize kept: its bare loop reads those same files
    kept_rows = normalized.kept.select(["source_id", "path"]).to_pylist()
    kept = {(row["source_id"], row["path"]) for row in kept_rows}
    lic_files = [
        (sid, path)
        for sid, path in files
        if (sid, path.relative_to(args.wheels / sid).as_posix()) in kept
    ]
    lic_raw_mb = sum(p.stat().st_size for _, p in lic_files) / 1e6

    seconds = _interleaved_median_seconds(
        {
            "bare": lambda: _bare_read_sha256(files),
            "normalize": lambda: normalize.run(raw, norm_config),
            "bare_license_files": lambda: _bare_read_sha256(lic_files),
            "license": lambda: license.run(
                normalized.kept, lic_config, declared_license="BSD-3-Clause", reuse_files={}
            ),
        },
        args.repeat,
    )
    bare_s, norm_s, lic_s = seconds["bare"], seconds["normalize"], seconds["license"]
    bare_lic_s = seconds["bare_license_files"]

    pythran_kept = normalized.kept.filter(pa.compute.equal(normalized.kept["source_id"], "pythran"))
    pythran = license.run(pythran_kept, lic_config, declared_license="BSD-3-Clause", reuse_files={})

    figures = {
        "files": len(files),
        "raw_mb": round(raw_mb, 2),
        "normalized_files": normalized.kept.num_rows,
        "normalized_text_mb": round(text_mb, 2),
        "bare_read_sha256_mb_s": round(raw_mb / bare_s, 1),
        "normalize_mb_s": round(raw_mb / norm_s, 1),
        "normalize_over_bare": round((raw_mb / norm_s) / (raw_mb / bare_s), 3),
        "license_mb_s": round(text_mb / lic_s, 1),
        "license_over_bare": round((text_mb / lic_s) / (raw_mb / bare_s), 3),
        "bare_read_sha256_license_files_mb_s": round(lic_raw_mb / bare_lic_s, 1),
        "license_over_bare_same_files": round((text_mb / lic_s) / (lic_raw_mb / bare_lic_s), 3),
        "normalize_drops": {k: v for k, v in normalized.stats.items() if k.startswith("dropped:")},
        "pythran_license": _pythran_breakdown(pythran),
    }

    print(f"{len(files)} files, {raw_mb:.1f} MB raw, {text_mb:.1f} MB kept text; "
          f"median of {args.repeat}\n")  # fmt: skip
    print("| step | MB/s | vs bare read+sha256 |")
    print("|---|---:|---:|")
    print(f"| bare read + sha256 | {figures['bare_read_sha256_mb_s']} | 1.000 |")
    print(f"| normalize.run | {figures['normalize_mb_s']} | {figures['normalize_over_bare']} |")
    print(f"| license.run | {figures['license_mb_s']} | {figures['license_over_bare']} |")
    print(
        f"| bare read + sha256, the licence gate's {len(lic_files)} files "
        f"| {figures['bare_read_sha256_license_files_mb_s']} | |"
    )
    print(
        f"| license.run vs those files | {figures['license_mb_s']} "
        f"| {figures['license_over_bare_same_files']} |"
    )
    print("\n| pythran group, decision, license_source | files |")
    print("|---|---:|")
    for key, count in figures["pythran_license"].items():
        print(f"| {key} | {count} |")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
