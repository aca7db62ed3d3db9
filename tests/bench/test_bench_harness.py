"""The benchmark harness (bench/): the scaled-up corpus keeps dedup honest (mutated copies are
neither exact nor near duplicates, comments and licence lines intact), pass/miss follows the
targets, the growth exponent is a least-squares fit, and one measured `megacpp run` yields
per-stage times, peak memory and the tokens it promoted."""

from __future__ import annotations

import math
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import bench_scaleout, endtoend, harness, scaleup, stages
from megacpp_pipeline.corpus.dedup import DedupConfig, find_duplicates
from megacpp_pipeline.stages import default_registry
from tests.fixtures import dedup_labelled

CPP = """\
// SPDX-License-Identifier: MIT
// Copyright the_authors of ring_buffer
#include <vector>
#define RING_CAPACITY 64

namespace ring {
/* a fixed ring of slots */
template <class T>
class RingBuffer {
 public:
  bool push(const T& value) {
    if (count_ == RING_CAPACITY) return false;
    slots_[head_] = value;
    head_ = (head_ + 1) % RING_CAPACITY;
    ++count_;
    const char* label = "push into ring_buffer";
    return label != nullptr && 0x1fULL;
  }
 private:
  std::vector<T> slots_;
  unsigned head_ = 0, count_ = 0;
};
}  // namespace ring
"""


def test_a_mutated_copy_renames_code_identifiers_and_nothing_else() -> None:
    out = scaleup.mutate(CPP, random.Random(0), rate=1.0)
    assert out != CPP
    kept = (
        "// SPDX-License-Identifier: MIT",
        "// Copyright the_authors of ring_buffer",
        "#include <vector>",
        "/* a fixed ring of slots */",
        '"push into ring_buffer"',
        "0x1fULL",
        "// namespace ring",
    )
    for piece in kept:
        assert piece in out, piece
    for keyword in ("template <class", "bool ", "return false;", "const char*", "nullptr"):
        assert keyword in out, keyword
    assert "#define RING_CAPACITY_" in out  # directive name kept, the macro's name renamed
    assert "RingBuffer {" not in out and "slots_[head_]" not in out


def test_mutation_is_reproducible_from_its_seed() -> None:
    a = scaleup.mutate(CPP, random.Random("0:1:src:a.hpp"), rate=0.3)
    b = scaleup.mutate(CPP, random.Random("0:1:src:a.hpp"), rate=0.3)
    c = scaleup.mutate(CPP, random.Random("0:2:src:a.hpp"), rate=0.3)
    assert a == b
    assert a != c


def test_mutated_copies_survive_the_dedup_gate_as_distinct_files(tmp_path: Path) -> None:
    originals = [
        f for f in dedup_labelled.build(families=0, unrelated=40, seed=3) if f.kind == "unrelated"
    ]
    copies = [
        (f.path, scaleup.mutate(f.text, random.Random(f"0:1:{f.path}"), rate=0.3))
        for f in originals
    ]
    jaccards = [
        dedup_labelled.true_jaccard(f.text, text)
        for f, (_, text) in zip(originals, copies, strict=True)
    ]
    assert max(jaccards) < 0.8, sorted(jaccards)[-5:]
    rows = [("a-upstream", f.path, f.text) for f in originals]
    rows += [("b-copy", path, text) for path, text in copies]
    result = find_duplicates([dedup_labelled.scrubbed_table(rows)], DedupConfig(), tmp_path)
    statuses = result.decisions.column("status").to_pylist()
    assert statuses.count("dropped") == 0


def test_a_ratio_below_its_target_is_a_miss_and_above_it_a_pass() -> None:
    miss = stages._ratio_line("enrich", "gate vs bare", 1.0, 4.0, 0.5, "cmd", files_per_mb=100)
    hit = stages._ratio_line("enrich", "gate vs bare", 3.0, 4.0, 0.5, "cmd", files_per_mb=100)
    info = stages._ratio_line("scrub", "gate vs floor", 3.0, 4.0, None, "cmd")
    assert (miss.ratio, miss.passed, miss.gate_files_s) == (0.25, False, 100.0)
    assert (hit.ratio, hit.passed) == (0.75, True)
    assert info.passed is None and info.target == ""


def test_growth_exponent_is_the_log_log_slope() -> None:
    xs = [27.0, 108.0, 432.0]
    assert harness.fit_exponent(xs, [3.0 * x**1.25 for x in xs]) == pytest.approx(1.25)
    assert harness.fit_exponent([27.0], [1.0]) is None


FAKE_WALL_S = {1: 100.0, 4: 250.0, 16: 625.0}


class _FakeScales:
    """scaleup.build and endtoend.run stand-ins: a scale "takes" FAKE_WALL_S[n] seconds
    without spending them, so only the harness's decisions are under test."""

    def __init__(self) -> None:
        self.built: list[int] = []
        self.ran: list[tuple[str, float]] = []  # (label, timeout_s handed to the run)

    def build(self, n: int, work: Path) -> scaleup.ScaledCorpus:
        self.built.append(n)
        return scaleup.ScaledCorpus(work / f"{n}x.yaml", n, files=10 * n, bytes=n * 1_000_000)

    def run(self, catalog: Path, work: Path, label: str, *, timeout_s: float) -> endtoend.EndToEnd:
        self.ran.append((label, timeout_s))
        n = int(label.removesuffix("x"))
        return endtoend.EndToEnd(
            label, 0, FAKE_WALL_S[n], cpu_s=FAKE_WALL_S[n], peak_rss_mb=500.0 + n,
            driver_cpu_s=1.0, stages=[],
            snapshot=None, tokens_out=None, documents=None, ledger=None, samples=1, log="",
        )  # fmt: skip


@pytest.fixture
def fake_scales(monkeypatch: pytest.MonkeyPatch) -> _FakeScales:
    fake = _FakeScales()
    monkeypatch.setattr(harness.scaleup, "build", fake.build)
    monkeypatch.setattr(harness.endtoend, "run", fake.run)
    return fake


def test_a_scale_predicted_to_overrun_the_budget_is_not_started_and_the_fits_say_so(
    tmp_path: Path, fake_scales: _FakeScales
) -> None:
    # 1x took 100 s and 4x 250 s: the power law through them predicts 625 s for 16x, more
    # than the 600 s left of the budget, so 16x is never built or run.
    deadline = time.monotonic() + 600
    scales = harness.run_scales([1, 4, 16], tmp_path, deadline, wrap_profile=None)
    assert fake_scales.built == [1, 4] and [label for label, _ in fake_scales.ran] == ["1x", "4x"]
    assert all(500 < timeout <= 600 for _, timeout in fake_scales.ran)  # the budget left
    assert [s.ok for s in scales] == [True, True, False]
    skipped = scales[2].skipped
    assert skipped.startswith("not started: 625 s predicted (exponent 0.66 through 1x and 4x)")
    assert skipped.endswith("s left of the budget"), skipped
    fits = {f.what: f for f in harness.scaling_fits(scales)}
    rss = fits["peak RSS growth, 16x over 1x"]
    assert rss.passed is None and rss.note.startswith("not measured at both 1x and 16x")
    assert fits["wall time vs MB in"].points == 2


def test_with_under_a_minute_of_budget_left_no_scale_is_started(
    tmp_path: Path, fake_scales: _FakeScales
) -> None:
    scales = harness.run_scales([1, 4], tmp_path, time.monotonic() + 30, wrap_profile=None)
    assert fake_scales.built == [] and fake_scales.ran == []
    assert [s.skipped.split(":")[0] for s in scales] == ["not started", "not started"]
    assert scales[0].skipped.endswith("s left of the budget")


def test_the_next_scale_is_predicted_by_the_power_law_through_the_last_two() -> None:
    def measured(scale: int, wall_s: float) -> harness.Scale:
        s = harness.Scale(scale)
        s.run = {"returncode": 0, "wall_s": wall_s}
        return s

    assert harness.predict_seconds([], 4) is None
    one = harness.predict_seconds([measured(1, 50.0)], 4)
    assert one is not None and one[0] == pytest.approx(200.0)  # linear from one point
    two = harness.predict_seconds([measured(1, 68.0), measured(4, 189.0)], 16)
    assert two is not None and two[0] == pytest.approx(
        189.0 * 4 ** (math.log(189 / 68) / math.log(4))
    )
    flat = harness.predict_seconds([measured(1, 100.0), measured(4, 101.0)], 16)
    assert flat is not None and flat[0] == pytest.approx(101.0 * 4**0.6)  # exponent floor


@pytest.mark.slow
def test_one_measured_run_reports_stage_times_memory_and_tokens(tmp_path: Path) -> None:
    from tests.fixtures.pipeline_corpus import write_catalog

    catalog, _ = write_catalog(tmp_path / "corpus")
    run = endtoend.run(catalog, tmp_path / "run", "tiny", timeout_s=900, interval_s=0.1)
    assert run.returncode == 0, run.error
    assert run.tokens_out and run.tokens_out > 0
    assert run.peak_rss_mb > 50
    assert run.cpu_s > 1
    names = [g.name for g in run.stages]
    registry = default_registry()
    assert names[0] == registry.names()[0]
    assert ", ".join(registry.refresh_head()) in names  # the per-source head, one group
    per_source = next(g for g in run.stages if g.name.startswith("raw_files"))
    assert set(per_source.partitions) == {"2 sources"}  # both sources in one Dagster run
    assert all(g.seconds > 0 for g in run.stages)
    # every group's serial seconds within its wall, and the run's within its own
    assert all(0 <= g.serial_s <= g.seconds + 1 for g in run.stages)
    assert 0 < run.serial_s <= run.wall_s
    lines = Path(run.timeline or "").read_text().splitlines()
    assert len(lines) == run.samples and lines[-1].split(" ", 2)[2] in {"-", *names}


def test_serial_seconds_are_the_intervals_with_one_core_busy_per_group(tmp_path: Path) -> None:
    s = endtoend.Sample
    samples = [
        s(0.0, 0.0, None),
        s(1.0, 0.9, None),  # start-up: one core
        s(2.0, 2.9, "a"),  # two cores
        s(3.0, 4.1, "a"),  # 1.2: one core and jitter
        s(3.5, 4.1, "b"),  # idle: waiting counts as serial too
        s(4.5, 6.0, "b"),  # 1.9
        s(4.5, 6.0, "b"),  # no time between samples: nothing
    ]
    assert endtoend.serial_seconds(samples) == pytest.approx({None: 1.0, "a": 1.0, "b": 0.5})
    assert endtoend.serial_seconds(samples, cores=2.0) == pytest.approx(
        {None: 1.0, "a": 2.0, "b": 1.5}
    )
    assert endtoend.serial_seconds(samples[:1]) == {}
    endtoend.write_timeline(tmp_path / "t.tsv", samples)
    assert (tmp_path / "t.tsv").read_text().splitlines()[:3] == [
        "1.00 0.90 -",
        "2.00 2.00 a",
        "3.00 1.20 a",
    ]


def _summary(wall: float, serial: float, groups: dict[str, float], snap: str = "s") -> dict:
    return {
        "wall_s": wall,
        "serial_s": serial,
        "snapshot": snap,
        "groups": {name: {"wall_s": w} for name, w in groups.items()},
    }


def test_worker_counts_compare_by_medians_and_flag_only_a_group_slower_in_every_round() -> None:
    rounds = {
        2: [
            _summary(40.0, 10.0, {"a": 10.0, "b": 8.0}),
            _summary(44.0, 10.0, {"a": 12.0, "b": 8.4}),
        ],
        16: [
            _summary(41.0, 9.0, {"a": 11.0, "b": 8.5}),
            _summary(42.0, 9.0, {"a": 10.0, "b": 8.6}),
        ],
    }
    out = bench_scaleout.compare_counts(rounds, [2, 16], cpus=2)["16_vs_2"]
    assert out["wall_speedup"] == round(42.0 / 41.5, 2)
    assert out["paired_wall_speedup"] == round((40.0 / 41.0 + 44.0 / 42.0) / 2, 2)
    assert out["stage_group_speedup"] == {"a": 1.05, "b": round(8.2 / 8.55, 2)}
    # a: its runs at 16 overlap those at 2 (noise); b: slower in both rounds than either at 2
    assert out["slower_beyond_noise"] == ["b"] and out["same_snapshot"]
    # Amdahl from the 2-worker runs on 2 cores: 10 serial s, 32 s spread over 2 cores
    assert out["ceiling"] == round(42.0 / (10.0 + 32.0 * 2 / 16), 2)
    one = bench_scaleout.compare_counts({2: rounds[2][:1], 16: [rounds[16][0]]}, [2, 16], 16)
    assert one["16_vs_2"]["slower_beyond_noise"] == ["a", "b"]
    other = {2: rounds[2], 16: [_summary(40.0, 9.0, {"a": 9.0, "b": 7.0}, snap="t")]}
    assert not bench_scaleout.compare_counts(other, [2, 16], 2)["16_vs_2"]["same_snapshot"]


_BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"


def _sampled(root: subprocess.Popen[bytes]) -> float:
    tree = endtoend.TreeCPU(root.pid)
    while root.poll() is None:
        tree.sample()
        time.sleep(0.02)
    return tree.sample()


def test_cpu_of_a_process_that_dies_unreaped_in_the_tree_stays_counted() -> None:
    """Ray's workers outlive their raylet and are never reaped inside the run's tree: a
    sum over the live tree would drop their seconds once they exit."""
    # root -> middle -> burner: the burner burns 0.6 s and lingers; the middle process exits
    # without reaping it (the burner leaves the tree, as Ray's workers do when their raylet
    # ends); the root then burns 0.2 s of its own
    burner = _BURN.format(s=0.6) + "time.sleep(1.0)\n"
    middle = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {burner!r}])\n"
        "time.sleep(0.9)\n"
    )
    script = (
        "import subprocess, sys\n"
        f"subprocess.run([sys.executable, '-c', {middle!r}])\n" + _BURN.format(s=0.2)
    )
    root = subprocess.Popen([sys.executable, "-c", script])
    total = _sampled(root)
    assert total >= 0.6 + 0.2, total


def test_cpu_of_reaped_children_is_counted_once() -> None:
    """A pool's workers are reaped together by their group's process, which then exits at
    once and is reaped by the run: their seconds reach the root's count twice over (their
    own samples, then the jump of the root's reaped time) and count once."""
    children = "\n".join(
        f"subprocess.Popen([sys.executable, '-c', {_BURN.format(s=0.3)!r}])" for _ in range(3)
    )
    # the middle process sleeps past its children's ends (zombies till then), reaps them
    # all and exits: no sample falls between
    middle = (
        f"import os, subprocess, sys, time\n{children}\ntime.sleep(0.9)\n"
        "while True:\n    try: os.wait()\n    except ChildProcessError: break\n"
    )
    script = (
        "import subprocess, sys\n"
        f"subprocess.run([sys.executable, '-c', {middle!r}])\n"
        f"subprocess.run([sys.executable, '-c', {_BURN.format(s=0.3)!r}])\n"
    )
    root = subprocess.Popen([sys.executable, "-c", script])
    total = _sampled(root)
    assert 1.2 <= total < 1.2 + 0.5, total  # the burns, plus six interpreters' start-up
