"""`megacpp run` shows one progress view: live on a terminal, plain lines elsewhere, then the
finished stages as one table; Dagster's event log stays out of the console."""

from __future__ import annotations

import io
import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from assets import console as console_mod
from assets import runner
from assets.console import RunConsole
from megacpp_pipeline.pipeline import progress
from tests.fixtures.pipeline_corpus import write_catalog

REPO = Path(__file__).resolve().parents[2]


def _feed(view: RunConsole) -> None:
    view.group_started(["normalized_files"], "normalized_files [2 sources]")
    view.event(progress.StageStarted("normalized_files", 2))
    view.event(progress.PartitionDone("normalized_files", "a", 10, 5_000_000, 8, 2, {"binary": 2}))
    view.event(
        progress.PartitionDone("normalized_files", "b", 4, 1_000_000, 3, 1, {"generated_file": 1})
    )
    view.event(progress.StageDone("normalized_files", 2.0))
    view.group_done(2.1, 321.0)


def test_plain_mode_prints_group_lines_progress_and_the_stage_table(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(console_mod, "PLAIN_PROGRESS_EVERY_S", 0.0)
    out = io.StringIO()
    view = RunConsole(out, live=False)
    _feed(view)
    view.summary()
    text = out.getvalue()
    assert "-> normalized_files [2 sources]" in text
    assert "... normalized_files: 1/2 sources, 5.0 MB" in text  # a stage still running
    assert "ok in 2.1s, peak RSS 321 MB" in text
    row = next(line for line in text.splitlines() if line.startswith("normalized_files"))
    assert "2/2" in row and "14" in row and "11" in row and "binary 2, generated_file 1" in row
    assert "321" in row  # the group's peak memory
    assert "\x1b[" not in text  # no terminal codes in a log


def test_live_mode_redraws_in_place_and_leaves_the_table(tmp_path: Path) -> None:
    out = io.StringIO()
    out.isatty = lambda: True  # type: ignore[method-assign]
    view = RunConsole(out)
    assert view.live
    _feed(view)
    view.summary()
    text = out.getvalue()
    assert "\x1b[" in text  # cursor movement: the view is redrawn, not appended
    assert "-> normalized_files" not in text
    assert "binary 2, generated_file 1" in text


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("console")
    catalog, _ = write_catalog(root)
    return catalog


def test_a_run_on_a_terminal_shows_the_live_view_and_prints_the_path_last(
    corpus: Path, tmp_path: Path
) -> None:
    leader, follower = pty.openpty()
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "home"), "COLUMNS": "160"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "assets.cli", "run", "--config", str(corpus),
         "--data-dir", str(tmp_path / "data"), "--cache-dir", str(tmp_path / "cache"),
         "--workers", "1"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=follower, text=True,
    )  # fmt: skip
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # the run closed its end of the terminal
            break
        if not data:
            break
        chunks.append(data)
    stdout, _ = proc.communicate(timeout=900)
    os.close(leader)
    screen = b"".join(chunks).decode(errors="replace")
    assert proc.returncode == 0, screen[-3000:]
    assert "\x1b[" in screen and "top drop reasons" in screen
    assert "DEBUG" not in screen and "STEP_START" not in screen
    assert Path(stdout.strip().splitlines()[-1]).name.startswith("testsnap-")
    # --workers reached the stages: the corpus-wide ones record it in their versions
    dedup = list((tmp_path / "data" / "assets" / "deduped_files").glob("_/*/manifest.json"))
    assert dedup and all(json.loads(m.read_text())["extra"]["workers"] == 1 for m in dedup)


def test_workers_must_be_a_positive_number(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "assets.cli", "run", "--config", "sources.yaml", "--workers", "0"],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 2 and "--workers: '0': a whole number of workers" in out.stderr


def test_a_declared_reason_no_file_was_dropped_for_is_not_listed() -> None:
    out = io.StringIO()
    view = RunConsole(out, live=False)
    view.group_started(["decontaminated_files"], "decontaminated_files")
    view.event(progress.StageStarted("decontaminated_files", 1))
    view.event(
        progress.PartitionDone(
            "decontaminated_files", None, 5, 1_000, 5, 0, {"benchmark_contamination": 0}
        )
    )
    view.event(progress.StageDone("decontaminated_files", 0.1))
    view.group_done(0.1, 100.0)
    view.summary()
    row = next(ln for ln in out.getvalue().splitlines() if ln.startswith("decontaminated_files"))
    assert "benchmark_contamination" not in row


def test_a_groups_peak_memory_is_in_megabytes_of_a_million_bytes_as_the_plan_counts() -> None:
    def hwm_bytes() -> int:
        status = Path("/proc/self/status").read_text()
        line = next(x for x in status.splitlines() if x.startswith("VmHWM:"))
        return int(line.split()[1]) * 1024

    before = hwm_bytes()
    peak = runner._peak_rss_mb()
    after = hwm_bytes()
    assert before / 1e6 <= peak <= after / 1e6
