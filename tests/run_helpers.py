"""Driving `megacpp run` in subprocesses for the fault and determinism suites: a workspace
(corpus, data dir, DAGSTER_HOME), runs that can be SIGKILLed at a chosen log line, and the
fingerprints two runs are compared by (every snapshot file, every asset version's files)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.pipeline_corpus import write_catalog

REPO = Path(__file__).resolve().parent.parent
MEGACPP = [sys.executable, "-m", "megacpp_pipeline.cli"]
RUN_TIMEOUT = 900
# Manifest keys that name a moment or a run, not content (see test_determinism).
RUN_IDENTITY_KEYS = ("created_at", "inputs")


@dataclass
class Workspace:
    """One data dir + Dagster instance over a (possibly shared) corpus."""

    root: Path
    catalog: Path

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "DAGSTER_HOME": str(self.root / "dagster_home"),
            "MEGACPP_CACHE_DIR": str(self.root / "cache"),
        }

    def run_args(self) -> list[str]:
        return [*MEGACPP, "run", "--config", str(self.catalog), "--data-dir", str(self.data)]


def new_workspace(root: Path, catalog: Path) -> Workspace:
    root.mkdir(parents=True, exist_ok=True)
    return Workspace(root, catalog)


def megacpp(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MEGACPP, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT
    )


def run(ws: Workspace) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ws.run_args(), cwd=REPO, env=ws.env, capture_output=True, text=True, timeout=RUN_TIMEOUT
    )


def completed_snapshot(out: subprocess.CompletedProcess[str]) -> Path:
    assert out.returncode == 0, out.stderr[-4000:]
    return Path(out.stdout.strip().splitlines()[-1])


@dataclass
class Baseline:
    """An uninterrupted run from clean state, shared by every test of one pytest process."""

    catalog: Path
    ws: Workspace
    snapshot: Path
    stderr_lines: int


_CLEAN_RUNS: list[Baseline] = []


def clean_runs(tmp_path_factory: pytest.TempPathFactory) -> list[Baseline]:
    """Two uninterrupted runs from clean state (separate data dirs and Dagster instances) over
    one corpus, started together: the reference for the fault suite, the pair for the
    determinism suite. Done once per pytest process."""
    if not _CLEAN_RUNS:
        corpus = tmp_path_factory.mktemp("corpus")
        catalog, _ = write_catalog(corpus)
        spaces = [new_workspace(tmp_path_factory.mktemp(f"clean{i}"), catalog) for i in (1, 2)]
        procs = [
            subprocess.Popen(
                ws.run_args(),
                cwd=REPO,
                env=ws.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for ws in spaces
        ]
        for ws, proc in zip(spaces, procs, strict=True):
            stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT)
            out = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
            snap = completed_snapshot(out)
            _CLEAN_RUNS.append(Baseline(catalog, ws, snap, len(stderr.splitlines())))
    return _CLEAN_RUNS


def baseline(tmp_path_factory: pytest.TempPathFactory) -> Baseline:
    return clean_runs(tmp_path_factory)[0]


# killing ----------------------------------------------------------------------------------
@dataclass
class Killed:
    killed: bool  # False when the run had already finished
    last_line: str
    lines_seen: int


def run_and_kill(ws: Workspace, *, after_lines: int | None = None, on_text: str | None = None,
                 delay: float = 0.0) -> Killed:  # fmt: skip
    """Start `megacpp run` in its own process group; SIGKILL the group `delay` seconds after
    the `after_lines`-th stderr line (or the first line containing `on_text`)."""
    proc = subprocess.Popen(
        ws.run_args(),
        cwd=REPO,
        env=ws.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stderr is not None
    seen, last = 0, ""
    try:
        for line in proc.stderr:
            seen, last = seen + 1, line.rstrip()
            hit = (after_lines is not None and seen >= after_lines) or (
                on_text is not None and on_text in line
            )
            if hit:
                # keep draining the pipe so the run is never blocked on a full stderr
                threading.Thread(target=proc.stderr.read, daemon=True).start()
                time.sleep(delay)
                break
        killed = proc.poll() is None
        if killed:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=RUN_TIMEOUT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return Killed(killed, last, seen)


def kill_points(seed: int, trials: int, total_lines: int) -> list[tuple[int, float]]:
    """Seeded kill moments spread over a whole run: a stderr line index and a short delay."""
    rng = random.Random(seed)
    return [(rng.randint(1, total_lines), rng.uniform(0.0, 0.4)) for _ in range(trials)]


# fingerprints -----------------------------------------------------------------------------
def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot_files(snap: Path) -> dict[str, str]:
    """Every file of the training contract but manifest.json and _COMPLETE (which holds the
    manifest's sha256): relpath -> sha256. The quality report under report/ is derived after
    promotion and lies outside the contract."""
    return {
        p.relative_to(snap).as_posix(): sha256(p)
        for p in sorted(snap.rglob("*"))
        if p.is_file()
        and p.name not in ("manifest.json", "_COMPLETE")  # both hold the promotion time
        and not p.relative_to(snap).as_posix().startswith("report/")
    }


def manifest_without_run_identity(snap: Path) -> dict[str, Any]:
    data = json.loads((snap / "manifest.json").read_text())
    for key in RUN_IDENTITY_KEYS:
        data.pop(key, None)
    return data


def diff_keys(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Dotted paths of every leaf where two JSON values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for key in sorted(set(a) | set(b)):
            path = f"{prefix}.{key}" if prefix else str(key)
            if key not in a or key not in b:
                out.append(path)
            else:
                out.extend(diff_keys(a[key], b[key], path))
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        pairs = enumerate(zip(a, b, strict=True))
        return [k for i, (x, y) in pairs for k in diff_keys(x, y, f"{prefix}[{i}]")]
    return [] if a == b else [prefix]


def store_files(data_dir: Path) -> dict[str, str]:
    """The latest complete version of every asset partition: "asset/partition/table[i]" (or
    "asset/partition/file") -> sha256 of the bytes on disk."""
    from megacpp_pipeline.store import ShardStore

    st = ShardStore(str(data_dir))
    out: dict[str, str] = {}
    for asset_dir in sorted((data_dir / "assets").iterdir()):
        for part_dir in sorted(p for p in asset_dir.iterdir() if p.is_dir()):
            m = st.latest(asset_dir.name, part_dir.name)
            vdir = Path(st.version_dir(m))
            for name, table in m.tables.items():
                for i, shard in enumerate(table.shards):
                    out[f"{m.asset}/{m.partition}/{name}[{i}]"] = sha256(vdir / shard.path)
            for f in m.files:
                out[f"{m.asset}/{m.partition}/{f.path}"] = sha256(vdir / f.path)
    return out


# what a reader may see --------------------------------------------------------------------
def unsound_readable_dirs(data_dir: Path) -> list[str]:
    """Problems in any directory a reader accepts: every store version with `_COMPLETE`
    passes ShardStore.verify, every snapshot with `_COMPLETE` passes `megacpp verify`."""
    from megacpp_pipeline import cli
    from megacpp_pipeline.store import COMPLETE, ShardStore

    st = ShardStore(str(data_dir))
    problems: list[str] = []
    for marker in sorted((data_dir / "assets").glob(f"*/*/*/{COMPLETE}")):
        problems.extend(st.verify(st.read_manifest(str(marker.parent))))
    for marker in sorted((data_dir / "snapshots").glob(f"*/{COMPLETE}")):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(["verify", str(marker.parent)])
        if code != 0:
            problems.append(f"{marker.parent}: megacpp verify exit {code}: {err.getvalue()}")
    return problems


def leftovers(data_dir: Path) -> dict[str, int]:
    """Debris a crash can leave: temp files, snapshot build dirs, incomplete versions."""
    versions = [p for p in data_dir.glob("assets/*/*/*") if p.is_dir()]
    return {
        "tmp_files": sum(1 for p in data_dir.rglob("*.tmp")),
        "building_dirs": sum(1 for _ in data_dir.glob("snapshots/.building-*")),
        "incomplete_versions": sum(1 for v in versions if not (v / "_COMPLETE").exists()),
        "incomplete_snapshots": sum(
            1
            for s in data_dir.glob("snapshots/*")
            if s.is_dir() and not s.name.startswith(".") and not (s / "_COMPLETE").exists()
        ),
    }
