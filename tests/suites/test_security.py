"""Security rules, tested on the hostile corpus run (tests/fixtures/hostile): no code from the
runs (compile commands, build scripts, shell-named files and git config are data); no path
from the corpus escapes its root and no symlink is followed out of it; seeded secrets never
reach the snapshot, the scrubbed assets, manifests, the Dagster instance (event logs, run
storage, compute logs) or the CLI output, and the scrub audit holds only salted hashes;
the UI binds to 127.0.0.1 by default.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from megacpp_pipeline.collect import safe_relpath
from megacpp_pipeline.gates.scrub import ScrubConfig
from megacpp_pipeline.stages import default_registry
from megacpp_pipeline.storage.store import ShardStore
from tests.fixtures.hostile.cases import REPO, HostileRun, escaped_files, hostile_run

# Stages that hold file text before the scrub gate: by design they carry the raw content.
# every stage before scrub reads raw text (in registry order)
_STAGES = default_registry().names()
PRE_SCRUB_ASSETS = set(_STAGES[: _STAGES.index("scrubbed_files")])


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> HostileRun:
    out = hostile_run(tmp_path_factory.mktemp("hostile"))
    assert out.out.returncode == 0, out.out.stderr[-4000:]
    return out


def _secrets(run: HostileRun) -> list[str]:
    return [*run.corpus.secrets.values(), run.corpus.private_key_body]


def _parquet_text(path: Path) -> str:
    """Every cell of a parquet file as text (decompressed, binary columns decoded)."""
    table = pq.read_table(path)
    parts = []
    for column in table.columns:
        for value in column.to_pylist():
            if isinstance(value, bytes):
                value = value.decode("utf-8", "replace")
            parts.append(str(value))
    return "\n".join(parts)


def _file_text(path: Path) -> str:
    if path.suffix == ".parquet":
        return _parquet_text(path)
    return path.read_bytes().decode("utf-8", "replace")


def _hits(root: Path, secrets: list[str]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        text = _file_text(path)
        hit = [s for s in secrets if s in text]
        if hit:
            found[str(path.relative_to(root))] = hit
    return found


# --- no code from the corpus runs ----------------------------------------------------------
def test_no_command_script_or_git_config_from_the_corpus_ran(run: HostileRun) -> None:
    """Sentinels a compile command, configure/CMake script, git fsmonitor, filter, pager,
    hook or a shell-named file would create."""
    assert list(run.corpus.sentinel_dir.iterdir()) == []
    assert list(run.cwd.iterdir()) == []
    assert not list(REPO.glob("pwned_*"))
    db = (run.root / "corpus_dir/compile_commands.json").read_text()
    assert str(run.corpus.sentinel_dir) in db and "$(touch" in db  # the bait was there


def test_compile_commands_reach_the_build_context_only_as_sanitized_data(run: HostileRun) -> None:
    store = ShardStore(str(run.data))
    manifest = store.latest("enriched_files", "hdir")
    assert "build_lane_error" in manifest.extra
    for table in store.iter_tables(manifest):
        for ctx in table["build_context"].to_pylist():
            for define in (ctx or {}).get("defines") or []:
                assert str(run.corpus.sentinel_dir) not in define, define


# --- no path escapes the root, no symlink is followed ----------------------------------------
def test_every_kept_path_is_relative_and_inside_its_source(run: HostileRun) -> None:
    docs = pq.read_table(run.snapshot / "documents.parquet", columns=["path"])
    for path in docs["path"].to_pylist():
        assert safe_relpath(path) == path, path
    ledger = pq.read_table(run.snapshot / "ledger.parquet").to_pylist()
    for row in ledger:
        if row["status"] == "kept":
            assert safe_relpath(row["path"]) == row["path"], row
        elif safe_relpath(row["path"]) is None:
            assert row["reason"] == "unsafe_path", row


def test_escaping_archive_entries_are_ledgered_unsafe_and_written_nowhere(
    run: HostileRun,
) -> None:
    escapes = {"../escape.h", "/tmp/absolute_escape.h", "inc/../../sneaky.h"}
    ledger = pq.read_table(run.snapshot / "ledger.parquet").to_pylist()
    tar_drops = {r["path"]: r["reason"] for r in ledger if r["source_id"] == "htar"}
    assert {path: tar_drops.get(path) for path in escapes} == dict.fromkeys(escapes, "unsafe_path")
    assert escaped_files(run.root) == []


def test_no_symlink_is_followed_out_of_the_root(run: HostileRun) -> None:
    marker = run.corpus.passwd_marker
    assert marker in Path("/etc/passwd").read_text()  # the bait exists on this machine
    store = ShardStore(str(run.data))
    for source in sorted({source for source, _ in run.corpus.good}):
        raw = store.latest("raw_files", source)
        for table in store.iter_tables(raw):
            for path, content in zip(
                table["path"].to_pylist(), table["content"].to_pylist(), strict=True
            ):
                assert marker.encode() not in content, f"{source}:{path} holds /etc/passwd"
        ledger = {r["path"]: r for t in store.iter_tables(raw, "ledger") for r in t.to_pylist()}
        for path, row in ledger.items():
            if "passwd" in path or "loop" in path or path.endswith(("/etc", "/self")):
                assert row["status"] == "dropped", row


# --- secrets never leave the scrub gate's input ----------------------------------------------
def test_seeded_secrets_are_absent_from_the_snapshot_and_every_post_scrub_asset(
    run: HostileRun,
) -> None:
    secrets = _secrets(run)
    hits = _hits(run.data, secrets)
    leaked = {
        path: found
        for path, found in hits.items()
        if not (path.startswith("assets/") and path.split("/")[1] in PRE_SCRUB_ASSETS)
        or path.endswith("manifest.json")
    }
    assert not leaked, leaked
    # the grep can see them: the pre-scrub assets do hold the raw text
    assert any(path.startswith("assets/raw_files/hdir/") for path in hits)


def test_the_file_result_cache_holds_secrets_only_for_pre_scrub_gates(run: HostileRun) -> None:
    """MEGACPP_CACHE_DIR lives outside the data dir; like the pre-scrub assets, the per-file
    results of the pre-scrub stages cached there carry raw text, and nothing from scrub
    onwards does."""
    hits = _hits(run.cache, _secrets(run))
    leaked = {
        path: found
        for path, found in hits.items()
        if not (path.startswith("file-results/") and path.split("/")[1] in PRE_SCRUB_ASSETS)
    }
    assert not leaked, leaked


def test_seeded_secrets_are_absent_from_the_decoded_training_rows(run: HostileRun) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(run.snapshot / "tokenizer.json"))
    text = "".join(
        tok.decode(row, skip_special_tokens=False)
        for part in sorted(run.snapshot.glob("*/part-*.parquet"))
        for row in pq.read_table(part, columns=["input_ids"])["input_ids"].to_pylist()
    )
    assert "kAwsKeyId" in text and "<API_KEY>" in text  # the file itself is there
    for secret in _secrets(run):
        assert secret not in text


def test_seeded_secrets_never_reach_the_dagster_instance(run: HostileRun) -> None:
    secrets = _secrets(run)
    assert not _hits(run.home, secrets)
    dbs = list(run.home.rglob("*.db"))
    assert dbs, "no SQLite storage under DAGSTER_HOME"
    for db in dbs:
        con = sqlite3.connect(db)
        try:
            tables = [
                r[0] for r in con.execute("select name from sqlite_master where type='table'")
            ]
            for table in tables:
                for row in con.execute(f'select * from "{table}"'):
                    cells = " ".join(str(c) for c in row)
                    for secret in secrets:
                        assert secret not in cells, f"{db.name}:{table}"
        finally:
            con.close()


def test_seeded_secrets_never_reach_the_cli_output(run: HostileRun) -> None:
    for secret in _secrets(run):
        assert secret not in run.out.stdout
        assert secret not in run.out.stderr


def test_the_scrub_audit_holds_only_salted_hashes_of_the_secrets(run: HostileRun) -> None:
    store = ShardStore(str(run.data))
    manifest = store.latest("scrubbed_files", "hdir")
    audit = [
        row
        for table in store.iter_tables(manifest, "audit")
        for row in table.to_pylist()
        if row["path"] == "src/credentials.cc"
    ]
    salt = ScrubConfig().audit_salt.encode()
    hashes = {row["value_hash"] for row in audit}
    for secret in run.corpus.secrets.values():
        assert hmac.new(salt, secret.encode(), hashlib.sha256).hexdigest() in hashes, secret
        assert hashlib.sha256(secret.encode()).hexdigest() not in hashes  # salted, not bare
        assert all(secret not in str(value) for row in audit for value in row.values())


# --- the UI -----------------------------------------------------------------------------------
def test_the_ui_binds_to_localhost_by_default() -> None:
    makefile = (REPO / "Makefile").read_text()
    ui = re.search(r"^ui:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert ui, "no ui target in the Makefile"
    recipe = ui.group(1)
    assert "dagster dev" in recipe and re.search(r"(-h|--host) 127\.0\.0\.1\b", recipe), recipe
    readme = (REPO / "README.md").read_text()
    assert re.search(r"`make ui`.*127\.0\.0\.1", readme)
    for name in ("Makefile", "README.md", "workspace.yaml", "dagster.yaml"):
        assert "0.0.0.0" not in (REPO / name).read_text(), name


def test_make_ui_passes_localhost_to_dagster_dev_whatever_the_environment_says() -> None:
    """The command `make ui` would run, with an environment asking for every interface, still
    names 127.0.0.1, and `dagster dev` takes `-h` as the webserver's host."""
    wide_open = {**os.environ, "DAGSTER_WEBSERVER_HOST": "0.0.0.0", "HOST": "0.0.0.0"}
    planned = subprocess.run(
        ["make", "--no-print-directory", "-n", "ui"],
        cwd=REPO,
        env=wide_open,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert planned.returncode == 0, planned.stderr
    (dev,) = [line for line in planned.stdout.splitlines() if "dagster dev" in line]
    assert re.search(r"\s-h 127\.0\.0\.1\s", dev + " "), dev
    usage = subprocess.run(
        [str(Path(sys.executable).with_name("dagster")), "dev", "--help"],
        env=wide_open, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert re.search(r"-h, --host\b.*\n?.*webserver", usage.stdout), usage.stdout[-2000:]
