"""`megacpp plan`: every kind of source is sized by listing it (no file read) to exactly the
files and bytes collection keeps; the forecast scales the measured rates with the corpus and
the workers; a run that will not fit its memory or disk is refused with exit 3 naming the
stage group and the figure, and `megacpp run` refuses it before any work (`--no-plan`
skips the check); the shipped rates cover every stage of the registry."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from megacpp_pipeline import cli, collect
from megacpp_pipeline.core.catalog import CollectLimits, SourceSpec
from megacpp_pipeline.plan.forecast import forecast
from megacpp_pipeline.plan.rates import Calibration, GroupRates, Linear, Rates, load_rates
from megacpp_pipeline.plan.sizing import MB, SourceSize, StoreUsage, size_sources
from megacpp_pipeline.stages import default_registry
from tests.fixtures.catalogs import load_catalog
from tests.fixtures.pipeline_corpus import write_catalog

REPO = Path(__file__).resolve().parents[2]
HEADER = b"// SPDX-License-Identifier: MIT\n#pragma once\nnamespace p { int f(int x); }\n"


def collected(spec: SourceSpec, uri: str, cache: Path) -> tuple[int, int]:
    """Files and bytes collection keeps of a source: what the listing must predict."""
    files = collect.open_source(
        spec, uri, cache_dir=cache, limits=CollectLimits(), max_file_bytes=4000
    )
    kept = [e for e in files.entries() if e.content is not None]
    wanted = collect.PathFilter(spec.include, spec.exclude)
    kept = [e for e in kept if wanted(e.path)]
    return len(kept), sum(len(e.content or b"") for e in kept)


def listed(spec: SourceSpec, uri: str, cache: Path) -> tuple[int, int]:
    out = collect.list_source(
        spec, uri, cache_dir=cache, limits=CollectLimits(), max_file_bytes=4000
    )
    return out.files, out.bytes


def _members() -> dict[str, bytes]:
    """A tree with what collection keeps and what it drops: wanted headers and sources, a
    file the include globs leave out, one outside the subdir, one above the size limit."""
    return {
        "pkg/include/a.hpp": HEADER,
        "pkg/include/deep/b.h": HEADER * 3,
        "pkg/src/c.cc": b"#include <a.hpp>\nint p::f(int x) { return x * 2; }\n",
        "pkg/README.md": b"# not C++\n",
        "pkg/include/huge.hpp": b"// big\n" * 1000,  # 7,000 bytes > max_file_bytes
        "other/d.hpp": HEADER,  # outside the subdir
    }


def test_a_directory_walk_sizes_what_collection_keeps(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    for rel, data in _members().items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    (root / "pkg/include/link.hpp").symlink_to(root / "pkg/include/a.hpp")
    spec = SourceSpec(id="t", kind="dir", uri=str(root), subdir="pkg")
    assert listed(spec, str(root), tmp_path) == collected(spec, str(root), tmp_path) == (3, 351)


def test_git_ls_tree_sizes_what_collection_keeps_at_the_pinned_commit(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@e.com"}  # fmt: skip

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True
        ).stdout.strip()

    git("init", "-q", "-b", "main")
    for rel, data in _members().items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_bytes(data)
    git("add", ".")
    git("commit", "-q", "-m", "one")
    pinned = git("rev-parse", "HEAD")
    (repo / "pkg/include/later.hpp").write_bytes(HEADER)  # after the pin: not counted
    git("add", ".")
    git("commit", "-q", "-m", "two")
    spec = SourceSpec(id="g", kind="git", uri=str(repo), revision=pinned, subdir="pkg")
    assert listed(spec, str(repo), tmp_path) == collected(spec, str(repo), tmp_path) == (3, 351)
    tracked = SourceSpec(id="g", kind="git", uri=str(repo), track="main", subdir="pkg")
    assert listed(tracked, str(repo), tmp_path)[0] == 4  # the branch's head, as a refresh


@pytest.mark.parametrize("kind", ["whl", "tar.gz"])
def test_an_archive_member_list_sizes_what_collection_keeps(tmp_path: Path, kind: str) -> None:
    path = tmp_path / f"src.{kind}"
    if kind == "whl":
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
            for rel, data in _members().items():
                zf.writestr(rel, data)
    else:
        with tarfile.open(path, "w:gz") as tf:
            for rel, data in _members().items():
                info = tarfile.TarInfo(rel)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    spec = SourceSpec(id="a", kind="archive", uri=str(path), sha256=sha, subdir="pkg")
    assert listed(spec, str(path), tmp_path) == collected(spec, str(path), tmp_path) == (3, 351)


def test_a_catalog_is_sized_source_by_source(tmp_path: Path) -> None:
    catalog, expect = write_catalog(tmp_path)
    sizes = {s.source: s for s in size_sources(load_catalog(catalog), tmp_path / "cache")}
    assert sizes["tree"].listed.how == "directory walk"
    assert sizes["repo"].listed.how.startswith("git ls-tree -r -l ")
    # every file the test corpus's collection keeps (what is not dropped at collection)
    kept = {(s, p) for (s, p), v in expect.items() if v not in ("not_included",)}
    assert sizes["tree"].listed.files + sizes["repo"].listed.files == len(kept)


def test_sources_are_listed_side_by_side_on_forked_workers_with_the_same_sizes(
    tmp_path: Path,
) -> None:
    from megacpp_pipeline.pipeline.executor import LocalExecutor

    catalog = load_catalog(write_catalog(tmp_path)[0])
    one = size_sources(catalog, tmp_path / "cache")
    executor = LocalExecutor(2, cap=False)
    forked = size_sources(catalog, tmp_path / "cache", executor.map)
    assert forked == one and len(one) >= 2
    assert sum(work.tasks for work in executor.stats.nodes.values()) == len(one)


def test_a_source_that_cannot_be_listed_fails_the_forked_listing_naming_it(
    tmp_path: Path,
) -> None:
    # what `megacpp run` turns into "plan: not checked", leaving the run's checks to say why
    import yaml

    from megacpp_pipeline.pipeline.executor import LocalExecutor

    path, _ = write_catalog(tmp_path)
    data = yaml.safe_load(path.read_text())
    repo = next(s for s in data["sources"] if s["id"] == "repo")
    repo["revision"] = "de" * 20
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(collect.CollectError, match="source 'repo'"):
        size_sources(load_catalog(path), tmp_path / "cache", LocalExecutor(2, cap=False).map)


def rates(workers: int = 2) -> Rates:
    """Two stage groups' worth of made-up rates, enough to check the arithmetic."""
    line = Linear

    def group(stages: list[str], **figures: Linear) -> GroupRates:
        base = {k: line() for k in GroupRates.model_fields if k != "stages"}
        return GroupRates(stages=stages, **{**base, **figures})

    registry = default_registry()
    first, *rest = registry.run_groups()
    others = [s for g in rest for s in g]
    return Rates(
        calibration=Calibration(
            measured_at="2026-11-26T00:00:00+00:00",
            commit="abc",
            host="test",
            cores=workers,
            workers=workers,
            memory_mb=8000,
            engine="local",
        ),
        startup_wall_s=line(fixed=2.0),
        groups=[
            group(
                list(first),
                cpu_s=line(fixed=1.0),
                driver_cpu_s=line(fixed=1.0),
                wall_s=line(fixed=1.0),
                driver_peak_mb=line(fixed=300),
                tree_peak_mb=line(fixed=300),
                largest_process_mb=line(fixed=300),
                data_mb=line(fixed=0.1),
            ),
            group(
                others,
                cpu_s=line(per_mb=2.0),
                driver_cpu_s=line(per_mb=0.5),
                wall_s=line(fixed=5.0, per_mb=1.0),
                driver_peak_mb=line(fixed=400, per_mb=1.0),
                tree_peak_mb=line(fixed=600, per_mb=2.0),
                largest_process_mb=line(fixed=350),
                per_worker_mb=line(fixed=100),
                data_mb=line(per_mb=8.0),
                cache_mb=line(per_mb=2.0),
                local_build_mb=line(per_mb=1.0),
            ),
        ],
    )


def _forecast(mb: float, workers: int, *, local: bool = True, **kw: float):  # type: ignore[no-untyped-def]
    registry = default_registry()
    catalog, _ = write_catalog(Path(kw.pop("root")))  # type: ignore[arg-type]
    source = SourceSize("s", "dir", collect.Listed(None, 100, int(mb * MB), "directory walk"))
    return forecast(
        load_catalog(catalog),
        registry,
        [source],
        data_dir="s3://bucket/data" if not local else str(catalog.parent / "data"),
        cache_dir=catalog.parent / "cache",
        workers=workers,
        rates=rates(),
        store_now=StoreUsage(local, 7, 12_000_000),
        **kw,
    )


def test_figures_follow_the_corpus_and_the_workers(tmp_path: Path) -> None:
    f = _forecast(100, 2, root=tmp_path / "a")
    rest = f.groups[-1]  # the made-up rates put every later stage in the second group
    assert rest.unmeasured == []
    assert (rest.cpu_s, rest.driver_cpu_s, rest.wall_s) == (200.0, 50.0, 105.0)
    assert (rest.driver_peak_mb, rest.peak_mb, rest.local_mb) == (500.0, 800.0, 1000.0)
    assert f.wall_s == 2.0 + 1.0 + sum(g.wall_s for g in f.groups[1:])
    # 8 workers: the workers' CPU (150 s on 2) divides by 4 more, the rest stays; six more
    # workers add 100 MB each to every process together
    g8 = _forecast(100, 8, root=tmp_path / "b").groups[-1]
    assert g8.wall_s == pytest.approx(105.0 - 75.0 + 75.0 * 2 / 8)
    assert g8.peak_mb == 800.0 + 6 * 100
    # an object store: what the stages write goes to the bucket; the snapshot builds locally
    s3 = _forecast(100, 2, local=False, root=tmp_path / "c").groups[-1]
    assert (s3.data_mb, s3.cache_mb, s3.bucket_mb) == (0.0, 100.0, 1000.0)


def test_a_group_that_needs_more_memory_than_given_is_named_with_its_figure(
    tmp_path: Path,
) -> None:
    f = _forecast(100, 2, root=tmp_path, memory_mb=700.0)
    problems = f.problems()  # every later group (the made-up rates give them one line)
    assert len(problems) == len(default_registry().run_groups()) - 1
    problem = problems[0]
    assert problem.startswith("stage group raw_files .. scrubbed_files (7 stages): ")
    assert "800 MB of memory at 2 workers" in problem
    assert "700 MB given" in problem
    assert _forecast(100, 2, root=tmp_path / "b", memory_mb=900.0).problems() == []


def test_a_run_that_outgrows_the_free_disk_is_named_where_it_crosses(tmp_path: Path) -> None:
    (problem,) = _forecast(100, 2, root=tmp_path, disk_mb=500.0).problems()
    assert "has written 1,000 MB to data and cache by its end; 500 MB free at (given)" in problem


def megacpp(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_plan_prints_one_table_and_exits_3_when_it_does_not_fit(tmp_path: Path) -> None:
    catalog, _ = write_catalog(tmp_path)
    args = ["plan", "--config", str(catalog), "--data-dir", str(tmp_path / "data"),
            "--cache-dir", str(tmp_path / "cache")]  # fmt: skip
    code, out, err = megacpp(*args)
    assert code == 0, err
    assert "stage group" in out and "the run (with start-up)" in out and out.endswith("fits\n")
    assert "directory walk" in out and "git ls-tree -r -l" in out
    code, out, err = megacpp(*args, "--memory-mb", "10")
    assert code == 3
    assert "DOES NOT FIT: stage group source_catalog: " in out
    assert err.startswith("megacpp plan: does not fit: stage group source_catalog: ")
    assert "MB of memory at" in err and "10 MB given" in err
    code, out, _ = megacpp(*args, "--json", "--workers", "4")
    data = json.loads(out)
    assert data["workers"] == 4 and len(data["groups"]) == len(default_registry().run_groups())
    assert not (tmp_path / "data").exists()  # a plan writes nothing


@pytest.mark.parametrize("workers", ["0", "-3", "two"])
def test_plan_refuses_a_worker_count_that_is_not_one_or_more_as_run_does(
    tmp_path: Path, workers: str, capsys: pytest.CaptureFixture[str]
) -> None:
    catalog, _ = write_catalog(tmp_path)
    with pytest.raises(SystemExit) as exited:
        cli.main(["plan", "--config", str(catalog), f"--workers={workers}"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --workers: {workers!r}: a whole number of workers, at least 1" in err


def test_megacpp_run_refuses_a_run_that_does_not_fit_before_any_work(tmp_path: Path) -> None:
    catalog, _ = write_catalog(tmp_path)
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "home")}
    base = [
        sys.executable,
        "-m",
        "assets.cli",
        "run",
        "--config",
        str(catalog),
        "--data-dir",
        str(tmp_path / "data"),
        "--cache-dir",
        str(tmp_path / "cache"),
    ]
    out = subprocess.run(
        [*base, "--memory-mb", "10"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 3, out.stderr
    assert "megacpp run: does not fit, not started: stage group" in out.stderr
    assert not (tmp_path / "data" / "assets").exists()
    out = subprocess.run(
        [*base, "--memory-mb", "10", "--no-plan", "--stop-after", "source_catalog"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "plan:" not in out.stderr and (tmp_path / "data" / "assets").is_dir()


def test_the_shipped_rates_cover_every_stage_of_the_registry() -> None:
    shipped = load_rates()
    for stages in default_registry().run_groups():
        group, unmeasured = shipped.for_group(stages)
        assert group is not None and unmeasured == [], stages
        assert set(group.stages) == set(stages)
    assert shipped.calibration.runs and shipped.calibration.workers >= 1
