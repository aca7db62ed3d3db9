"""Faults the store and the runner must survive: `megacpp run` SIGKILLed anywhere, one flipped
byte in any file, a full disk, an unwritable data dir and two writers at once. After each, a
reader sees only complete, verifying versions and a plain re-run gives the same snapshot."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from megacpp_pipeline import cli
from megacpp_pipeline.stages import default_registry
from megacpp_pipeline.storage.store import ShardStore, StoreError
from tests.fixtures.pipeline_corpus import write_catalog
from tests.fixtures.run_helpers import (
    REPO,
    RUN_TIMEOUT,
    Baseline,
    Workspace,
    baseline,
    completed_snapshot,
    kill_points,
    leftovers,
    manifest_without_run_identity,
    megacpp,
    new_workspace,
    run,
    run_and_kill,
    snapshot_files,
    unsound_readable_dirs,
)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Baseline:
    return baseline(tmp_path_factory)


# kill anywhere ----------------------------------------------------------------------------
# One kill per test case, each in a workspace of its own: a killed run plus a whole re-run
# (a re-run re-materializes what the kill left undone), about a minute on 2 loaded cores.
# Every case has its own hang guard: each of its two runs has RUN_TIMEOUT, the guard adds the
# shared baseline the first case may have to build.
HANG_GUARD_S = 3 * RUN_TIMEOUT
DEFAULT_KILLS = 1  # seeded random moments in the default suite (the slow suite has more;
# every stage's kill is in the default suite as well)
# Seeded random moments in the slow suite: as many as fit in about ten minutes here.
SLOW_KILLS = 20 if (os.cpu_count() or 1) >= 8 else 8


def _kill_then_rerun(base: Baseline, ws: Workspace, kill: dict) -> dict:
    """SIGKILL a run at `kill`, check what a reader sees, re-run, compare with the baseline.
    Returns the trial's record (printed, and in every assertion message)."""
    killed = run_and_kill(ws, **kill)
    after_kill = unsound_readable_dirs(ws.data) if ws.data.exists() else []
    snap = completed_snapshot(run(ws))
    record = {
        **kill,
        "killed": killed.killed,
        "at": killed.last_line[-120:],
        "unsound_after_kill": after_kill,
        "unsound_after_rerun": unsound_readable_dirs(ws.data),
        "leftovers": leftovers(ws.data),
        "same_files": snapshot_files(snap) == snapshot_files(base.snapshot),
        "same_manifest": manifest_without_run_identity(snap)
        == manifest_without_run_identity(base.snapshot),
    }
    print(json.dumps(record), flush=True)  # shown with -s or on failure: the trial
    assert record["unsound_after_kill"] == [], record
    assert record["unsound_after_rerun"] == [], record
    assert record["same_files"] and record["same_manifest"], record
    # bounded, not a pile: a kill between a version's mkdir and its _WRITER record leaves
    # one empty directory that a concurrent-safe cleaner keeps for a minute
    assert record["leftovers"]["incomplete_versions"] <= 1, record
    assert {k: v for k, v in record["leftovers"].items() if k != "incomplete_versions"} == {
        "tmp_files": 0,
        "building_dirs": 0,
        "incomplete_snapshots": 0,
    }, record
    return record


def _random_kill(base: Baseline, seed: int, trial: int) -> dict:
    """The trial-th of a seeded sequence of kill moments (the same whatever the count)."""
    line, delay = kill_points(seed=seed, trials=trial + 1, total_lines=base.stderr_lines)[trial]
    return {"after_lines": line, "delay": delay}


@pytest.mark.timeout(HANG_GUARD_S)
@pytest.mark.parametrize("trial", range(DEFAULT_KILLS), ids=lambda t: f"moment-{t}")
def test_a_run_killed_at_a_seeded_random_moment_reruns_to_the_same_snapshot(
    base: Baseline, tmp_path: Path, trial: int
) -> None:
    ws = new_workspace(tmp_path / "killed", base.catalog)
    _kill_then_rerun(base, ws, _random_kill(base, seed=11, trial=trial))


# Kills that hit each stage, from the registry (a new stage gets its case): the CLI's first
# progress line, every later stage's first step, and the moment a promotion has its build
# directory checked but not yet renamed into place.
_STAGES = default_registry().names()
STAGE_MARKERS = [
    f"-> {_STAGES[0]}",
    *(f"{name} - STEP_START" for name in _STAGES[1 : _STAGES.index("snapshot") + 1]),
    "promotion check megatron_read_back",
    *(f"{name} - STEP_START" for name in _STAGES[_STAGES.index("snapshot") + 1 :]),
]


@pytest.mark.slow
@pytest.mark.timeout(HANG_GUARD_S)
@pytest.mark.parametrize(
    "marker",
    STAGE_MARKERS,
    ids=lambda m: m.removeprefix("-> ").removesuffix(" - STEP_START").replace(" ", "_"),
)
def test_a_run_killed_in_each_stage_reruns_to_the_same_snapshot(
    base: Baseline, tmp_path: Path, marker: str
) -> None:
    ws = new_workspace(tmp_path / "killed", base.catalog)
    record = _kill_then_rerun(base, ws, {"on_text": marker, "delay": 0.2})
    assert record["killed"], record  # the kill landed inside the stage, not after the run


@pytest.mark.slow
@pytest.mark.timeout(HANG_GUARD_S)
@pytest.mark.parametrize("trial", range(SLOW_KILLS), ids=lambda t: f"moment-{t}")
def test_a_run_killed_at_more_seeded_random_moments_reruns_to_the_same_snapshot(
    base: Baseline, tmp_path: Path, trial: int
) -> None:
    ws = new_workspace(tmp_path / "killed", base.catalog)
    _kill_then_rerun(base, ws, _random_kill(base, seed=2026, trial=trial))


# one flipped byte -------------------------------------------------------------------------
CREATED_AT = b'"created_at": "2'


def _flip(path: Path, needle: bytes | None = None) -> None:
    """One bit of one byte: the middle one, or the last byte of `needle`'s first match (a
    timestamp digit: the file stays valid JSON and only its bytes say it changed)."""
    data = bytearray(path.read_bytes())
    at = len(data) // 2 if needle is None else data.index(needle) + len(needle) - 1
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


SNAPSHOT_FILES = [
    ("train/part-00000.parquet", None),
    ("validation/part-00000.parquet", None),
    ("documents.parquet", None),
    ("pieces.parquet", None),
    ("ledger.parquet", None),
    ("tokenizer.json", None),
    ("manifest.json", None),
    ("manifest.json", CREATED_AT),
]


@pytest.mark.parametrize(
    ("rel", "needle"),
    SNAPSHOT_FILES,
    ids=[f"{r}{'-created_at' * bool(n)}" for r, n in SNAPSHOT_FILES],
)
def test_megacpp_verify_names_the_snapshot_file_with_a_flipped_byte(
    base: Baseline, tmp_path: Path, rel: str, needle: bytes | None
) -> None:
    copy = tmp_path / base.snapshot.name
    shutil.copytree(base.snapshot, copy)
    _flip(copy / rel, needle)
    code, stderr = _megacpp_in_process(["verify", str(copy)])
    assert code == 1, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("megacpp verify: FAILED") and f"{copy / rel}" in last, stderr


def _megacpp_in_process(argv: list[str]) -> tuple[int, str]:
    """The `megacpp` entry point without a new interpreter: exit code and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    return code, err.getvalue()


def test_megacpp_verify_passes_the_untouched_snapshot(base: Baseline) -> None:
    assert _megacpp_in_process(["verify", str(base.snapshot)]) == (0, "")


# Flip a byte in the latest version of an asset, then run the asset's blocking checks together
# with a downstream asset in one Dagster run: the check must fail naming the file and the
# downstream asset must not materialize.
def _corrupt_then_run(ws: Workspace, case: tuple[str, str, str, str, str]) -> dict:
    import dagster as dg

    from assets.defs import build_defs

    asset, part, target, downstream, needle = case
    partition = None if part == "_" else part
    defs = build_defs(ws.catalog, ws.data, cache_dir=ws.root / "cache")
    st = ShardStore(str(ws.data))
    m = st.latest(asset, partition)
    vdir = Path(st.version_dir(m))
    path = vdir / (m.tables[target].shards[0].path if target in m.tables else target)
    data = bytearray(path.read_bytes())
    at = len(data) // 2 if needle == "-" else data.index(needle.encode()) + len(needle) - 1
    data[at] ^= 0x01
    path.write_bytes(bytes(data))
    before = st.latest(downstream, partition).version
    result = dg.materialize(
        [*defs.assets, *defs.asset_checks],  # type: ignore[list-item]
        selection=dg.AssetSelection.checks_for_assets(asset) | dg.AssetSelection.assets(downstream),
        partition_key=partition,
        instance=dg.DagsterInstance.ephemeral(),
        resources=defs.resources,
        raise_on_error=False,
    )
    failed = {
        e.check_name: e.description or ""
        for e in result.get_asset_check_evaluations()
        if not e.passed
    }
    for ev in result.all_events:
        if ev.event_type_value == "STEP_FAILURE" and ev.step_failure_data:
            err = ev.step_failure_data.error
            failed[ev.step_key] = (err.cause.message if err.cause else err.message) or ""
    ran = [e.asset_key.to_user_string() for e in result.get_asset_materialization_events()]
    same = before == st.latest(downstream, partition).version
    return {"path": str(path), "failed": failed, "ran": ran, "same": same}


def _consumer(asset: str) -> str:
    """The stage that reads `asset` as its input: the one its blocking checks must stop."""
    return next(s.name for s in default_registry() if s.input == asset)


IN_RUN_CASES = [
    # (asset, partition, a table's first shard or a file, downstream asset, where: "-" middle)
    ("normalized_files", "tree", "data", _consumer("normalized_files"), "-"),
    ("licensed_files", "tree", "manifest.json", _consumer("licensed_files"), "-"),
    ("licensed_files", "repo", "manifest.json", _consumer("licensed_files"), CREATED_AT.decode()),
    ("tokenizer", "_", "tokenizer.json", "snapshot", "-"),
    ("documents", "_", "document_files", _consumer("documents"), "-"),
]


@pytest.fixture(scope="module")
def corrupted_runs(base: Baseline, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    ws = new_workspace(tmp_path_factory.mktemp("corrupt"), base.catalog)
    shutil.copytree(base.ws.data, ws.data)
    return [_corrupt_then_run(ws, case) for case in IN_RUN_CASES]


@pytest.mark.parametrize("case", range(len(IN_RUN_CASES)), ids=[
    f"{c[0]}-{c[1]}-{c[2]}{'-created_at' * (c[4] != '-')}" for c in IN_RUN_CASES
])  # fmt: skip
def test_a_flipped_byte_fails_the_blocking_check_naming_the_file_and_nothing_downstream_runs(
    corrupted_runs: list[dict], case: int
) -> None:
    got = corrupted_runs[case]
    assert got["failed"], got
    assert any(got["path"] in why for why in got["failed"].values()), got
    assert got["ran"] == [] and got["same"], got


# a shard edited in place ----------------------------------------------------------------------
# What the careful operator found: a committed `scrubbed_files` shard edited by hand into valid
# parquet (a line appended to one file's text, its content hash recomputed). Materializing the
# assets downstream from Dagster (as the UI does, the edited asset's checks not selected) must
# fail naming the version, the shard and its expected hash; `megacpp run` must say it replaces
# that version, and its snapshot must be the untouched one.
INJECTED = "\nint injected_by_hand = 1;  // not written by any gate\n"


def _edit_scrubbed_shard(data: Path) -> tuple[str, str, str]:
    """(version, shard path, recorded sha256) of the edited shard."""
    import hashlib

    import pyarrow.parquet as pq

    from megacpp_pipeline.storage.versions import TEXT_AT

    st = ShardStore(str(data))
    m = st.latest("scrubbed_files", "tree")
    shard = m.tables["data"].shards[0]
    path = Path(st.version_dir(m)) / shard.path
    table = pq.read_table(path)
    texts = table["text"].to_pylist()
    # the shard may name where its text is held (text written once): the edit writes the
    # file's text into the shard itself, as a hand edit would
    texts[0] = st.read_shard(m, shard, ["text"])["text"][0].as_py() + INJECTED
    shas = table["content_sha256"].to_pylist()
    shas[0] = hashlib.sha256(texts[0].encode()).hexdigest()
    for name, values in (("text", texts), ("content_sha256", shas)):
        i = table.schema.get_field_index(name)
        table = table.set_column(i, table.schema.field(i), pa.array(values, pa.string()))
    if TEXT_AT in table.column_names:
        i = table.schema.get_field_index(TEXT_AT)
        at = table[TEXT_AT].to_pylist()
        at[0] = None
        table = table.set_column(i, table.schema.field(i), pa.array(at, pa.int64()))
    pq.write_table(table, path)
    return m.version, shard.path, shard.sha256


def test_an_edited_shard_stops_a_dagster_materialization_of_what_reads_it(
    base: Baseline, tmp_path: Path
) -> None:
    import dagster as dg

    from assets.defs import build_defs

    ws = new_workspace(tmp_path / "edited", base.catalog)
    shutil.copytree(base.ws.data, ws.data)
    version, shard, sha = _edit_scrubbed_shard(ws.data)
    st = ShardStore(str(ws.data))
    before = st.latest("snapshot").version
    defs = build_defs(ws.catalog, ws.data, cache_dir=ws.root / "cache")
    downstream = ["deduped_files", "decontaminated_files", "tokenizer"]
    result = dg.materialize(
        [*defs.assets, *defs.asset_checks],  # type: ignore[list-item]
        selection=dg.AssetSelection.assets(*downstream),
        instance=dg.DagsterInstance.ephemeral(),
        resources=defs.resources,
        raise_on_error=False,
    )
    failures = [
        (ev.step_key, ev.step_failure_data.error)
        for ev in result.all_events
        if ev.event_type_value == "STEP_FAILURE" and ev.step_failure_data
    ]
    assert [key for key, _ in failures] == ["deduped_files"], failures
    error = failures[0][1]
    message = (error.cause.message if error.cause else error.message) or ""
    assert "ShardVerificationError" in message, message
    assert version in message and shard in message and sha in message, message
    assert result.get_asset_materialization_events() == []
    assert st.latest("snapshot").version == before


def test_megacpp_run_names_the_edited_version_it_replaces_and_promotes_the_untouched_text(
    base: Baseline, tmp_path: Path
) -> None:
    ws = new_workspace(tmp_path / "edited", base.catalog)
    shutil.copytree(base.ws.data, ws.data)
    version, shard, _ = _edit_scrubbed_shard(ws.data)
    out = run(ws)
    snap = completed_snapshot(out)
    notices = [line for line in out.stderr.splitlines() if "failed verification" in line]
    assert len(notices) == 1, out.stderr
    assert notices[0].startswith("   ! scrubbed_files [tree]: replacing version " + version)
    assert shard in notices[0]
    assert snapshot_files(snap) == snapshot_files(base.snapshot)


def test_a_poisoned_result_cache_entry_is_discarded_named_and_the_snapshot_is_unchanged(
    base: Baseline, tmp_path: Path
) -> None:
    """A few bytes of one file's text changed inside a scrub cache entry (the entry stays a
    valid Arrow file): the run names the entry once, recomputes its files, and promotes the
    snapshot an untouched cache gives."""
    ws = new_workspace(tmp_path / "poisoned", base.catalog)
    # the cache alone: over the base's data dir every version would stand, and no gate
    # would read the cache (pipeline/reuse.py)
    shutil.copytree(base.ws.root / "cache", ws.root / "cache")
    parts = sorted((ws.root / "cache" / "file-results" / "scrubbed_files").rglob("e-*.kept.arrow"))
    part = next(p for p in parts if b"#include" in p.read_bytes())
    data = part.read_bytes()
    at = data.index(b"#include")
    part.write_bytes(data[:at] + b"#exclude" + data[at + 8 :])
    out = run(ws)
    snap = completed_snapshot(out)
    notices = [line for line in out.stderr.splitlines() if "result cache entry discarded" in line]
    assert len(notices) == 1, out.stderr
    index = str(part).replace(".kept.arrow", ".arrow")
    assert notices[0].startswith(f"   ! {index}: result cache entry discarded"), notices
    assert snapshot_files(snap) == snapshot_files(base.snapshot)


# full disk, unwritable data dir -------------------------------------------------------------
class _FullDisk(pafs.FileSystemHandler):
    """A local filesystem whose output streams raise ENOSPC once `budget` bytes are written."""

    def __init__(self, budget: int) -> None:
        self.local = pafs.LocalFileSystem()
        self.budget = budget

    def __eq__(self, other: object) -> bool:
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other

    def get_type_name(self) -> str:
        return "fulldisk"

    def normalize_path(self, path: str) -> str:
        return path

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        return self.local.get_file_info(paths)

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        return self.local.get_file_info(selector)

    def create_dir(self, path: str, recursive: bool) -> None:
        self.local.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self.local.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self.local.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        raise OSError(errno.EPERM, "refused")

    def delete_file(self, path: str) -> None:
        self.local.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        self.local.move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        self.local.copy_file(src, dest)

    def open_input_stream(self, path: str) -> pa.NativeFile:
        return self.local.open_input_stream(path)

    def open_input_file(self, path: str) -> pa.NativeFile:
        return self.local.open_input_file(path)

    def open_output_stream(self, path: str, metadata: dict | None = None) -> pa.NativeFile:
        handler = self

        class _Limited:
            def __init__(self) -> None:
                self.f = open(path, "wb")  # noqa: SIM115 - closed by PythonFile
                self.closed = False

            def write(self, data: bytes) -> int:
                if len(data) > handler.budget:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
                handler.budget -= len(data)
                return self.f.write(data)

            def flush(self) -> None:
                self.f.flush()

            def close(self) -> None:
                self.f.close()
                self.closed = True

        return pa.PythonFile(_Limited(), mode="w")

    def open_append_stream(self, path: str, metadata: dict | None = None) -> pa.NativeFile:
        raise OSError(errno.EPERM, "append is not supported")


def _write_version(st: ShardStore, rows: int) -> None:
    version = st.begin("raw_files", "tree", code_version="1")
    table = pa.table({"path": [f"src/f{i}.cc" for i in range(rows)], "n": list(range(rows))})
    version.table("data", table.schema).write(table)
    version.commit()


def test_a_full_disk_is_a_clear_store_error_and_the_previous_version_stays_readable(
    tmp_path: Path,
) -> None:
    root = str(tmp_path / "data")
    _write_version(ShardStore(root), rows=10)
    before = ShardStore(root).latest("raw_files", "tree")
    full = ShardStore(root, filesystem=pafs.PyFileSystem(_FullDisk(budget=4096)))
    with pytest.raises(StoreError) as err:
        _write_version(full, rows=50_000)
    message = str(err.value)
    assert "No space left on device" in message and f"{root}/assets/raw_files/tree/" in message
    st = ShardStore(root)
    after = st.latest("raw_files", "tree")
    assert after.version == before.version
    assert st.verify(after) == []
    assert st.read_table(after).num_rows == 10


# A real full disk under a real `megacpp run`: the data dir is a small tmpfs, mounted in a
# private mount namespace (root, or an unprivileged user namespace), so nothing outlives the
# run; what the full disk held is copied back to the same path for the checks and the re-run.
# --no-plan: this is the disk filling during a run (the plan's refusal of a run that would
# not fit before it starts is tests/plan's)
_FULL_DISK_RUN = """
set -u
mount -t tmpfs -o size="$SIZE" tmpfs "$DATA" || exit 97
"$PY" -m assets.cli run --no-plan --config "$CATALOG" --data-dir "$DATA" \
  >"$OUT/stdout" 2>"$OUT/stderr"
echo $? >"$OUT/rc"
mkdir "$OUT/held" && cp -a "$DATA/." "$OUT/held/"
umount "$DATA" && cp -a "$OUT/held/." "$DATA/"
"""
_NAMESPACES = (
    ["unshare", "--mount", "--propagation", "private"],
    ["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private"],
)


def _private_mount_namespace(probe_dir: Path) -> list[str] | None:
    """The unshare command that may mount a tmpfs here, or None."""
    probe_dir.mkdir(parents=True, exist_ok=True)
    for cmd in _NAMESPACES:
        probe = [*cmd, "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs '{probe_dir}'"]
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            if subprocess.run(probe, capture_output=True, timeout=60).returncode == 0:
                return cmd
    return None


def _tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize(
    "fraction",
    [pytest.param(0.2, marks=pytest.mark.slow), 0.6],  # the default suite keeps one moment
    ids=lambda f: f"disk-{int(f * 100)}pct-of-a-run",
)
def test_a_disk_that_fills_during_megacpp_run_is_one_clear_line_and_a_rerun_recovers(
    base: Baseline, tmp_path: Path, fraction: float
) -> None:
    namespace = _private_mount_namespace(tmp_path / "probe")
    if namespace is None:
        pytest.skip("a full disk needs a private tmpfs mount: root or user namespaces")
    ws = new_workspace(tmp_path / "full", base.catalog)
    ws.data.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    size_kib = max(64, int(_tree_bytes(base.ws.data) * fraction) // 1024)
    env = {**ws.env, "SIZE": f"{size_kib}k", "DATA": str(ws.data), "OUT": str(out),
           "PY": sys.executable, "CATALOG": str(ws.catalog)}  # fmt: skip
    done = subprocess.run(
        [*namespace, "sh", "-c", _FULL_DISK_RUN], cwd=REPO, env=env, capture_output=True,
        text=True, timeout=RUN_TIMEOUT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    code, stderr = int((out / "rc").read_text()), (out / "stderr").read_text()
    assert code != 0, f"a {size_kib} KiB disk held the whole run: lower the fraction"
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("megacpp run: FAILED") and "No space left on device" in last, last
    assert str(ws.data) in last, last  # names the file it could not write
    # what the full disk held: only complete versions are readable, and they verify
    assert unsound_readable_dirs(ws.data) == []
    assert leftovers(ws.data)["tmp_files"] == 0
    snap = completed_snapshot(run(ws))  # the same data dir, now with room
    assert snapshot_files(snap) == snapshot_files(base.snapshot)
    assert unsound_readable_dirs(ws.data) == []
    assert leftovers(ws.data) == dict.fromkeys(
        ("tmp_files", "building_dirs", "incomplete_versions", "incomplete_snapshots"), 0
    )


def test_an_unwritable_data_dir_is_one_clear_line_from_the_cli(tmp_path: Path) -> None:
    catalog, _ = write_catalog(tmp_path)
    blocked = tmp_path / "data"
    blocked.write_text("a file where the data directory must be\n")
    ws = new_workspace(tmp_path, catalog)
    out = megacpp(["run", "--config", str(catalog), "--data-dir", str(blocked)], ws.env)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("megacpp run:") and str(blocked) in last, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    assert blocked.read_text().startswith("a file where")
    assert not (tmp_path / "dagster_home").exists()  # refused before any Dagster run


# two writers at once ----------------------------------------------------------------------
@pytest.mark.parametrize("attempt", range(10))
def test_two_store_writers_on_one_partition_both_finish_and_neither_corrupts_the_other(
    tmp_path: Path, attempt: int
) -> None:
    root = str(tmp_path / "data")
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def writer(seed: int) -> None:
        try:
            st = ShardStore(root, max_rows_per_shard=500)
            barrier.wait()
            for _ in range(3):
                version = st.begin("raw_files", "tree", code_version="1")
                t = pa.table({"writer": [seed] * 2000, "i": list(range(2000))})
                version.table("data", t.schema).write(t)
                version.commit()
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(n,)) for n in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    st = ShardStore(root)
    latest = st.latest("raw_files", "tree")
    assert set(st.read_table(latest)["writer"].to_pylist()) in ({1}, {2})
    assert unsound_readable_dirs(Path(root)) == []


@pytest.mark.slow
def test_two_megacpp_runs_on_one_data_dir_at_once_finish_or_refuse_cleanly(
    base: Baseline, tmp_path: Path
) -> None:
    ws = new_workspace(tmp_path / "shared", base.catalog)
    procs = [
        subprocess.Popen(
            ws.run_args(),
            cwd=REPO,
            env=ws.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=1200) for p in procs]
    codes = [p.returncode for p in procs]
    assert 0 in codes, outs
    for code, (_, stderr) in zip(codes, outs, strict=True):
        if code != 0:  # refused: one clear line, no traceback
            assert stderr.strip().splitlines()[-1].startswith("megacpp run:"), stderr[-3000:]
    assert unsound_readable_dirs(ws.data) == []
    snap = completed_snapshot(run(ws))
    assert snapshot_files(snap) == snapshot_files(base.snapshot)
