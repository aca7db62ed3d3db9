"""`megacpp run` and `megacpp cache`, in-process: what a person types wrong (a refresh cron
or time zone, a stage name, a worker count) stops the command before any work with one line
naming it, never a traceback."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from assets import cli
from assets.runner import PipelineFailed, run_pipeline
from megacpp_pipeline import cli as library_cli
from megacpp_pipeline.stages import default_registry

REPO = Path(__file__).resolve().parents[2]


def megacpp(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    return code, out.getvalue(), err.getvalue()


def _catalog(tmp_path: Path, extra: str = "") -> Path:
    (tmp_path / "src").mkdir(exist_ok=True)
    (tmp_path / "src" / "a.hpp").write_text("#pragma once\nint a();\n")
    path = tmp_path / "sources.yaml"
    path.write_text("snapshot: t\nsources:\n  - {id: s1, kind: dir, uri: src}\n" + extra)
    return path


def _run(tmp_path: Path, catalog: Path, *more: str) -> tuple[int, str, str]:
    return megacpp(
        "run",
        "--config",
        str(catalog),
        "--data-dir",
        str(tmp_path / "data"),
        "--cache-dir",
        str(tmp_path / "cache"),
        *more,
    )


@pytest.mark.parametrize(
    ("refresh", "field", "says"),
    [
        ("{cron: '99 2 * * *'}", "refresh.cron", "'99 2 * * *' is not a schedule Dagster can run"),
        ("{timezone: Mars/Olympus}", "refresh.timezone", "unknown time zone 'Mars/Olympus'"),
    ],
    ids=["cron", "timezone"],
)
def test_a_refresh_setting_dagster_cannot_schedule_stops_run_with_one_line_naming_it(
    tmp_path: Path, refresh: str, field: str, says: str
) -> None:
    catalog = _catalog(tmp_path, f"refresh: {refresh}\n")
    code, _, err = _run(tmp_path, catalog)
    assert code == 2, err
    last = err.splitlines()[-1]  # after the plan's line, when the plan got that far
    assert last.startswith("megacpp run: CatalogError: ") and "Traceback" not in err, err
    assert f"{catalog}: field {field}: {says}" in last, err
    assert not (tmp_path / "data" / "assets").exists()


def test_a_stop_after_that_names_no_stage_is_refused_before_any_work_listing_the_stages(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    catalog = _catalog(tmp_path)
    with pytest.raises(SystemExit) as exited:  # at parse time, before the plan
        cli.main(
            ["run", "--config", str(catalog), "--data-dir", str(tmp_path / "data"),
             "--cache-dir", str(tmp_path / "cache"), "--stop-after", "snapshto"]
        )  # fmt: skip
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --stop-after: 'snapshto' is no stage; the stages: source_catalog, " in err
    with pytest.raises(PipelineFailed) as failed:  # the same from the API
        run_pipeline(catalog, tmp_path / "data", cache_dir=tmp_path / "cache", stop_after="snap")
    assert str(failed.value).startswith("--stop-after 'snap' is no stage; the stages: ")
    assert ", ".join(default_registry().names()) in str(failed.value)
    assert not (tmp_path / "data").exists()  # nothing ran, nothing was promoted


def test_plan_and_run_keep_their_cache_in_one_place_from_any_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`megacpp plan` sizes the disk `megacpp run` writes, and lists a git source through
    the mirror the run will use: both under the repository's .cache/, not the caller's."""
    monkeypatch.delenv("MEGACPP_CACHE_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    parser = library_cli.build_parser(extra={"run": cli._register_run})
    plan = parser.parse_args(["plan", "--config", "sources.yaml"])
    run = parser.parse_args(["run", "--config", "sources.yaml"])
    assert Path(plan.cache_dir) == Path(run.cache_dir) == REPO / ".cache"


@pytest.mark.parametrize("extra", [[], ["--no-plan"]], ids=["planned", "no-plan"])
def test_a_workers_variable_that_is_no_count_stops_run_with_one_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: list[str]
) -> None:
    monkeypatch.setenv("MEGACPP_WORKERS", "abc")
    code, _, err = _run(tmp_path, _catalog(tmp_path), *extra)
    assert code == 2 and "Traceback" not in err, err
    assert err.splitlines()[-1] == (
        "megacpp run: WorkersError: MEGACPP_WORKERS='abc': a whole number of workers, at least 1"
    )
    assert not (tmp_path / "data" / "assets").exists()
