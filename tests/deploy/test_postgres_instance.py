"""deploy/dagster.postgres.yaml for real: a fresh PostgreSQL cluster (Debian's server, initdb
in a temporary folder, started by pg_ctl on 127.0.0.1 and a free port, password auth over TCP)
holds the run, event log and schedule storage of a real DagsterInstance that materializes an
asset and runs its check; the run, the materialization and the check evaluation are read back
through the instance, straight from the database's tables, and by a second instance opened
from another DAGSTER_HOME with the same dagster.yaml. Run by `make test-slow`; needs the
`postgres` extra and `apt-get install postgresql`."""

from __future__ import annotations

import glob
import os
import pwd
import shlex
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest

try:
    import psycopg2  # dagster-postgres's driver
    from dagster_postgres import (
        PostgresEventLogStorage,
        PostgresRunStorage,
        PostgresScheduleStorage,
    )
except ImportError:  # the postgres extra; deselected tests then report no skip
    psycopg2 = None

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        psycopg2 is None,
        reason="dagster-postgres is not installed (pip install -e '.[dev,postgres]')",
    ),
]

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "deploy" / "dagster.postgres.yaml"
SERVER_USER = "postgres"  # Debian's package creates it; initdb refuses to run as root
USER, PASSWORD, DB = "dagster", "s3cret pw/with:chars", "megacpp_dagster"


def _server_bin() -> Path | None:
    """The newest /usr/lib/postgresql/<major>/bin holding both initdb and pg_ctl."""
    dirs = [Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/initdb")]
    dirs = [d for d in dirs if (d / "pg_ctl").exists()]
    dirs.sort(key=lambda d: int(d.parent.name) if d.parent.name.isdigit() else -1)
    return dirs[-1] if dirs else None


def _as_server_user() -> tuple[list[str] | None, str]:
    """The prefix running a command as SERVER_USER ([] when not root), or None and why not."""
    if os.geteuid() != 0:
        return [], ""
    try:
        pwd.getpwnam(SERVER_USER)
    except KeyError:
        return None, f"running as root and there is no {SERVER_USER!r} user to run initdb as"
    if shutil.which("runuser"):
        prefix = ["runuser", "-u", SERVER_USER, "--"]
    elif shutil.which("su"):
        prefix = ["su", "-s", "/bin/sh", SERVER_USER, "-c"]
    else:
        return None, "running as root and neither runuser nor su is there to drop to postgres"
    probe = subprocess.run(_wrap(prefix, ["true"]), capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return None, f"cannot run commands as {SERVER_USER}: {probe.stderr.strip()}"
    return prefix, ""


def _wrap(prefix: list[str], cmd: list[str]) -> list[str]:
    if prefix[:1] == ["su"]:
        return [*prefix, shlex.join(cmd)]
    return [*prefix, *cmd]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class PgServer:
    port: int

    def env(self) -> dict[str, str]:
        return {
            "DAGSTER_PG_HOST": "127.0.0.1",
            "DAGSTER_PG_PORT": str(self.port),
            "DAGSTER_PG_USER": USER,
            "DAGSTER_PG_PASSWORD": PASSWORD,
            "DAGSTER_PG_DB": DB,
        }

    def connect(self, dbname: str = DB) -> psycopg2.extensions.connection:
        return psycopg2.connect(
            host="127.0.0.1", port=self.port, user=USER, password=PASSWORD, dbname=dbname
        )

    def query(self, sql: str, *args: object) -> list[tuple[object, ...]]:
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(sql, args)
                return list(cur.fetchall())
        finally:
            conn.close()


@pytest.fixture
def pg(tmp_path: Path) -> Iterator[PgServer]:
    bindir = _server_bin()
    if bindir is None:
        pytest.skip(
            "no PostgreSQL server (/usr/lib/postgresql/*/bin/initdb and pg_ctl): "
            "apt-get install postgresql"
        )
    prefix, why = _as_server_user()
    if prefix is None:
        pytest.skip(why)
    # As root the cluster lives in a /tmp folder owned by postgres (pytest's tmp_path is
    # root's, mode 0700); its socket path stays short either way.
    root = Path(tempfile.mkdtemp(prefix="megacpp-pg-")) if prefix else tmp_path / "pg"
    root.mkdir(exist_ok=True)
    data, sock, log, pwfile = root / "data", root / "sock", root / "server.log", root / "pw"
    sock.mkdir()
    pwfile.write_text(PASSWORD + "\n")
    if prefix:
        owner = pwd.getpwnam(SERVER_USER)
        for p in (root, sock, pwfile):
            os.chown(p, owner.pw_uid, owner.pw_gid)

    def run(*cmd: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(_wrap(prefix, list(cmd)), capture_output=True, text=True, timeout=120)

    port = _free_port()
    ctl = [str(bindir / "pg_ctl"), "-D", str(data)]
    started = False
    try:
        auth = ["--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pwfile}"]
        fast = ["-E", "UTF8", "--no-locale", "--no-sync"]
        init = run(str(bindir / "initdb"), "-D", str(data), "-U", USER, *auth, *fast)
        assert init.returncode == 0, init.stdout + init.stderr
        # fsync off: a throwaway cluster; everything else is the server's defaults
        opts = f"-c listen_addresses=127.0.0.1 -p {port} -k {sock} -c fsync=off"
        started = True  # even a failed or timed-out start may leave a postmaster: stop it
        start = run(*ctl, "-l", str(log), "-o", opts, "-w", "-t", "60", "start")
        server_log = log.read_text() if log.exists() else ""
        assert start.returncode == 0, start.stdout + start.stderr + server_log
        server = PgServer(port)
        conn = server.connect("postgres")
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(f"CREATE DATABASE {DB}")
        finally:
            conn.close()
        yield server
    finally:
        if started:
            stop = run(*ctl, "-m", "fast", "-w", "stop")
        if prefix:
            shutil.rmtree(root, ignore_errors=True)
        if started:
            assert stop.returncode == 0 or "Is server running?" in stop.stderr, stop.stderr


@dg.asset
def rows() -> dg.MaterializeResult:
    # no output value: nothing for the IO manager to write under DAGSTER_HOME
    return dg.MaterializeResult(metadata={"rows": 3})


@dg.asset_check(asset=rows)
def rows_positive() -> dg.AssetCheckResult:
    return dg.AssetCheckResult(passed=True, metadata={"min_rows": 1})


CHECK_KEY = dg.AssetCheckKey(rows.key, "rows_positive")


def _home(path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path.mkdir()
    shutil.copyfile(CONFIG, path / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(path))
    return path


def _assert_recorded(instance: dg.DagsterInstance, run_id: str) -> None:
    runs = instance.get_runs()
    assert [r.run_id for r in runs] == [run_id]
    assert runs[0].status == dg.DagsterRunStatus.SUCCESS
    mat = instance.get_latest_materialization_event(rows.key)
    assert mat is not None and mat.run_id == run_id
    assert mat.asset_materialization is not None
    assert mat.asset_materialization.metadata["rows"].value == 3
    check = instance.get_latest_asset_check_evaluation_record(CHECK_KEY)
    assert check is not None and check.run_id == run_id
    assert check.status.value == "SUCCEEDED"
    assert check.event is not None and check.event.dagster_event is not None
    evaluation = check.event.dagster_event.event_specific_data
    assert isinstance(evaluation, dg.AssetCheckEvaluation) and evaluation.passed


def test_instance_storage_is_the_shared_postgres_db(
    pg: PgServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in pg.env().items():
        monkeypatch.setenv(name, value)
    home = _home(tmp_path / "home", monkeypatch)

    with dg.DagsterInstance.get() as instance:
        assert isinstance(instance.run_storage, PostgresRunStorage)
        assert isinstance(instance.event_log_storage, PostgresEventLogStorage)
        assert isinstance(instance.schedule_storage, PostgresScheduleStorage)
        result = dg.materialize([rows, rows_positive], instance=instance)
        assert result.success
        run_id = result.run_id
        _assert_recorded(instance, run_id)

    # the rows are in Postgres's tables, and no SQLite storage appeared under DAGSTER_HOME
    assert pg.query("SELECT status FROM runs WHERE run_id = %s", run_id) == [("SUCCESS",)]
    assert pg.query(
        "SELECT count(*) FROM event_logs WHERE run_id = %s AND dagster_event_type = %s",
        run_id,
        "ASSET_MATERIALIZATION",
    ) == [(1,)]
    assert pg.query(
        "SELECT check_name, execution_status FROM asset_check_executions WHERE run_id = %s",
        run_id,
    ) == [("rows_positive", "SUCCEEDED")]
    tables = {t for (t,) in pg.query("SELECT tablename FROM pg_tables")}
    assert {"jobs", "job_ticks", "instigators"} <= tables  # the schedule storage's
    assert not [p for p in home.rglob("*") if p.suffix in {".db", ".sqlite"}]

    # another process's view: a second instance from another DAGSTER_HOME, same dagster.yaml
    other = _home(tmp_path / "other_home", monkeypatch)
    with dg.DagsterInstance.get() as second:
        assert second.root_directory == str(other)
        _assert_recorded(second, run_id)
    assert not [p for p in other.rglob("*") if p.suffix in {".db", ".sqlite"}]
