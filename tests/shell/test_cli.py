"""`megacpp run` and `megacpp cache`, in-process: what a person types wrong (a refresh cron
or time zone, a stage name, a worker count) stops the command before any work with one line
naming it, never a traceback."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from assets import cli


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
