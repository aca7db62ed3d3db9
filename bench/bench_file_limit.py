"""Memory for one file at the size policy's limit: `megacpp run` over a source holding one
C++ file of `--mib` MiB (real headers from the demo's pythran wheel, mutated copies
concatenated) beside pybind11's headers (so the tokenizer trains on ordinary code), with
`max_file_bytes` set to exactly that size, and the parse budget and the repeated-5-gram rule
opened so the big file reaches every stage. Every process of the run is sampled from
/proc (resident set) every 50 ms; the result is the largest one, with the stage group that
was running. Target (issue 26): under 2 GB for 64 MiB.

    .venv/bin/python -m bench.bench_file_limit --mib 64 --out /tmp/file-limit
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

from bench.scaleup import WHEELS_DIR, mutate

REPO = Path(__file__).resolve().parent.parent


def write_file(path: Path, size: int) -> None:
    """`size` bytes of C++: pythran's own headers, mutated copy after copy, cut at a line."""
    wheel = next(WHEELS_DIR.glob("pythran-0.19.0-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        base = "".join(
            zf.read(n).decode("utf-8", "replace")
            for n in sorted(zf.namelist())
            if n.endswith((".hpp", ".h")) and "/boost/" not in n and "/xsimd/" not in n
        )
    rng = random.Random(0)
    parts, total = [], 0
    while total < size:
        text = mutate(base, rng, 0.3)
        parts.append(text)
        total += len(text.encode())
    data = "".join(parts).encode()[:size]
    path.write_bytes(data[: data.rfind(b"\n") + 1])


def catalog(root: Path, source: Path, limit: int) -> Path:
    path = root / "sources.yaml"
    path.write_text(
        f"snapshot: filelimit\nmax_file_bytes: {limit}\nsources:\n"
        f"  - {{id: big, kind: dir, uri: {source}, declared_license: MIT}}\n"
        "stages:\n"
        "  quality: {max_repeated_5gram_fraction: 1.0}\n"
        "  enrich: {parse_timeout_seconds: 3600}\n"
    )
    return path


def _tree(root_pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root_pid]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def run(root: Path, mib: int) -> dict:
    root.mkdir(parents=True, exist_ok=True)
    source = root / "src"
    source.mkdir(exist_ok=True)
    size = mib << 20
    big = source / "big.hpp"
    if not big.exists() or big.stat().st_size > size or big.stat().st_size < size - 4096:
        write_file(big, size)
    wheel = next(WHEELS_DIR.glob("pybind11-3.1.0-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if name.endswith(".h") and "/include/" in name:
                target = source / "pybind11" / name.split("/include/", 1)[1]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(zf.read(name))
    env = {
        **os.environ,
        "DAGSTER_HOME": str(root / "dagster_home"),
        "MEGACPP_CACHE_DIR": str(root / "cache"),
    }
    args = [sys.executable, "-m", "assets.cli", "run", "--config", str(catalog(root, source, size))]
    args += ["--data-dir", str(root / f"data-{time.time_ns()}")]
    started = time.monotonic()
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines: list[str] = []
    group = ["(start)"]

    def read_stderr() -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            line = raw.decode(errors="replace").rstrip()
            lines.append(line)
            if line.startswith("-> "):
                group[0] = line[3:]

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    peak: dict[int, tuple[float, str]] = {}
    while proc.poll() is None:
        for pid in _tree(proc.pid):
            rss = _rss_mb(pid)
            if rss > peak.get(pid, (0.0, ""))[0]:
                peak[pid] = (rss, group[0])
        time.sleep(0.05)
    reader.join(timeout=10)
    largest_pid, (largest, where) = max(peak.items(), key=lambda kv: kv[1][0])
    return {
        "file_mib": mib,
        "file_bytes": big.stat().st_size,
        "exit": proc.returncode,
        "wall_s": round(time.monotonic() - started, 1),
        "largest_process_mb": round(largest, 1),
        "largest_process_group": where,
        "largest_process_is_the_command": largest_pid == proc.pid,
        "processes_sampled": len(peak),
        "target_mb": 2048,
        "stderr_tail": lines[-12:],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--out", type=Path, default=Path("/tmp/megacpp-file-limit"))
    args = p.parse_args()
    print(json.dumps(run(args.out, args.mib), indent=1))


if __name__ == "__main__":
    main()
