"""Streaming JSONL ingest: bounded validated shards, torn lines never half-ingested, bad
records counted with line and field, `_COMPLETE` only after the idle timeout, and resume
after SIGKILL without lost or duplicated rows. Converters and writers are real processes."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megacpp_pipeline.collect.jsonl_stream import (
    COMPLETE_FILE,
    JSONL_RECORDS,
    MANIFEST_FILE,
    REJECTS_FILE,
    STATE_FILE,
    CompressedInputError,
    InputChangedError,
    JsonlConverterConfig,
    OutputLockedError,
    RecordReject,
    ResumeConfigMismatchError,
    convert,
    iter_records,
    main_jsonl_to_parquet,
    read_manifest,
)

REPO = Path(__file__).resolve().parents[2]
LICENSES = ["MIT", "Apache-2.0 WITH LLVM-exception", "BSL-1.0", None]


def cpp_record(i: int) -> dict:
    """A small real-looking C++ file as a JSONL record."""
    content = (
        f"// SPDX-License-Identifier: MIT\n#include <vector>\n\nnamespace demo{i % 7} {{\n"
        f"template <typename T>\nT accumulate_{i}(const std::vector<T>& xs) {{\n"
        f"  T total{{}};\n  for (const auto& x : xs) total += x;  // \u2211 x\n"
        f"  return total * {i};\n}}\n}}  // namespace demo{i % 7}\n"
    )
    record: dict = {"path": f"src/demo{i % 7}/accumulate_{i}.hpp", "content": content}
    if LICENSES[i % 4] is not None:
        record["license"] = LICENSES[i % 4]
    if i % 3:
        record["revision"] = hashlib.sha1(str(i).encode()).hexdigest()
    return record


def jsonl_line(record: dict) -> bytes:
    return json.dumps(record, ensure_ascii=False).encode("utf-8") + b"\n"


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.write_bytes(b"".join(jsonl_line(r) for r in records))


def expected_rows(input_path: Path) -> list[tuple]:
    """Every complete, valid line of the input, as (path, content, license, revision, line)."""
    rows = []
    data = input_path.read_bytes()
    complete = data[: data.rfind(b"\n") + 1]
    for no, line in enumerate(complete.split(b"\n")[:-1], start=1):
        r = json.loads(line)
        rows.append((r["path"], r["content"], r.get("license"), r.get("revision"), no))
    return rows


def shard_rows(out_dir: Path) -> list[tuple]:
    """All rows of a completed conversion, train shards then validation, checked against the
    manifest's sha256 / rows / bytes and the declared schema."""
    manifest = read_manifest(out_dir)
    rows: list[tuple] = []
    for entry in [*manifest.train, *manifest.validation]:
        path = out_dir / entry.file
        assert hashlib.sha256(path.read_bytes()).hexdigest() == entry.sha256
        assert path.stat().st_size == entry.bytes
        table = pq.read_table(path)
        assert table.schema.equals(JSONL_RECORDS, check_metadata=True)
        assert table.num_rows == entry.rows <= manifest.rows_per_file
        columns = [table.column(n).to_pylist() for n in JSONL_RECORDS.names]
        rows.extend(zip(*columns, strict=True))
    return rows


def converter_cmd(input_path: Path, out_dir: Path, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "megacpp_pipeline.collect.jsonl_stream",
        str(input_path),
        "--out",
        str(out_dir),
        *args,
    ]


def subprocess_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env.pop("MEGACPP_JSONL_CRASH_AT", None)
    env.update(extra)
    return env


def start_converter(input_path: Path, out_dir: Path, *args: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        converter_cmd(input_path, out_dir, *args),
        env=subprocess_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_converter(input_path: Path, out_dir: Path, *args: str, **env: str):
    return subprocess.run(
        converter_cmd(input_path, out_dir, *args),
        env=subprocess_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


HANG_GUARD_S = 60.0  # only a hung converter or writer makes a wait this long
# --idle-timeout where a test needs the stream to end on its own. Idle means no growth this
# long, so it must dwarf how long a converter on a loaded machine takes to act on a line.
END_OF_STREAM_S = 3.0


def wait_for(predicate, hang_guard_s: float = HANG_GUARD_S) -> None:
    """Poll until `predicate` holds: what another process does shows up in files, which
    have no event to wait on. The guard only turns a hang into a failure."""
    deadline = time.monotonic() + hang_guard_s
    while not predicate():
        assert time.monotonic() < deadline, f"hang guard: condition not met in {hang_guard_s} s"
        time.sleep(0.02)


def train_shards_committed(out_dir: Path) -> int:
    """Train shards the converter's resume state vouches for (the file is replaced whole)."""
    state = out_dir / STATE_FILE
    return len(json.loads(state.read_text())["train"]) if state.exists() else 0


# --------------------------------------------------------------------------- in-process


def test_every_record_lands_once_in_order_in_bounded_shards_with_a_validation_tail(tmp_path):
    src = tmp_path / "corpus.jsonl"
    write_jsonl(src, [cpp_record(i) for i in range(53)])
    config = JsonlConverterConfig(rows_per_file=10, validation_rows=5)

    report = convert(src, tmp_path / "out", config)

    assert shard_rows(tmp_path / "out") == expected_rows(src)
    assert (report.rows, report.train_shards, report.validation_rows) == (53, 5, 5)
    manifest = read_manifest(tmp_path / "out")
    assert [e.rows for e in manifest.train] == [10, 10, 10, 10, 8]
    assert [e.last_line for e in manifest.validation] == [53]
    assert manifest.consumed_bytes == src.stat().st_size
    # Shard byte ranges tile the input: each starts where the previous one ended.
    ends = [0] + [e.end_offset for e in [*manifest.train, *manifest.validation]]
    assert [e.start_offset for e in [*manifest.train, *manifest.validation]] == ends[:-1]


def test_same_input_and_config_give_byte_identical_shards(tmp_path):
    src = tmp_path / "corpus.jsonl"
    write_jsonl(src, [cpp_record(i) for i in range(30)])
    config = JsonlConverterConfig(rows_per_file=8, validation_rows=3)
    convert(src, tmp_path / "a", config)
    convert(src, tmp_path / "b", config)
    manifest = (tmp_path / "a" / MANIFEST_FILE).read_bytes()
    assert manifest == (tmp_path / "b" / MANIFEST_FILE).read_bytes()  # sha256 of every shard


def test_torn_last_line_is_left_unconsumed_and_reported(tmp_path):
    src = tmp_path / "corpus.jsonl"
    write_jsonl(src, [cpp_record(i) for i in range(5)])
    half = jsonl_line(cpp_record(5))[:40]
    with open(src, "ab") as f:
        f.write(half)

    report = convert(src, tmp_path / "out", JsonlConverterConfig(rows_per_file=4))

    assert [row[4] for row in shard_rows(tmp_path / "out")] == [1, 2, 3, 4, 5]
    assert report.torn_tail_bytes == len(half)
    assert report.consumed_bytes == src.stat().st_size - len(half)
    assert report.first_rejects[-1].line_no == 6
    assert report.first_rejects[-1].field == "<line>"


def test_bad_records_are_rejected_with_line_and_field_and_the_rest_continue(tmp_path):
    good = [cpp_record(i) for i in range(4)]
    lines = [
        jsonl_line(good[0]),
        jsonl_line({"path": "a.cpp"}),  # 2: no content
        jsonl_line({"path": "b.cpp", "content": 42}),  # 3: content not a string
        jsonl_line(good[1]),
        jsonl_line({"path": None, "content": "int x;"}),  # 5: null path
        jsonl_line({"path": "c.cpp", "content": "int y;", "license": ["MIT"]}),  # 6
        b"\n",  # 7: blank, not a record and not a reject
        b'{"path": "d.cpp", "content": "int z;"\n',  # 8: truncated JSON object
        b'["src/e.cpp", "int e;"]\n',  # 9: not an object
        b'{"path": "f.cpp", "content": "\xff\xfe"}\n',  # 10: not UTF-8
        b'{"path": "g.cpp", "content": "\\ud800 lone surrogate"}\n',  # 11
        jsonl_line({"path": "", "content": "int w;"}),  # 12: empty path
        jsonl_line({"path": "h.cpp", "content": "int v;", "revision": 7}),  # 13
        jsonl_line(good[2]),
        jsonl_line(good[3]),
    ]
    src = tmp_path / "corpus.jsonl"
    src.write_bytes(b"".join(lines))

    report = convert(src, tmp_path / "out", JsonlConverterConfig(rows_per_file=2))

    assert [row[4] for row in shard_rows(tmp_path / "out")] == [1, 4, 14, 15]
    rejects = [
        RecordReject.model_validate_json(line)
        for line in (tmp_path / "out" / REJECTS_FILE).read_bytes().splitlines()
    ]
    assert [(r.line_no, r.field) for r in rejects] == [
        (2, "content"),
        (3, "content"),
        (5, "path"),
        (6, "license"),
        (8, "<json>"),
        (9, "<record>"),
        (10, "<json>"),
        (11, "content"),
        (12, "path"),
        (13, "revision"),
    ]
    assert report.rejects == len(rejects) == read_manifest(tmp_path / "out").rejects
    assert "missing" in rejects[0].reason
    assert "not UTF-8" in rejects[6].reason
    byte_of_line_3 = len(lines[0]) + len(lines[1])
    assert rejects[1].byte_offset == byte_of_line_3


def test_a_compressed_input_is_refused_before_anything_is_written(tmp_path):
    """A .jsonl.gz was read as text: every line rejected, and the conversion "complete"."""
    src = tmp_path / "corpus.jsonl.gz"
    src.write_bytes(gzip.compress(b"".join(jsonl_line(cpp_record(i)) for i in range(3))))
    with pytest.raises(CompressedInputError, match=r"corpus\.jsonl\.gz: is gzip-compressed"):
        convert(src, tmp_path / "out", JsonlConverterConfig(rows_per_file=2))
    assert not (tmp_path / "out" / COMPLETE_FILE).exists()


def test_a_line_nested_too_deep_is_a_reject_not_a_crash(tmp_path):
    src = tmp_path / "corpus.jsonl"
    deep = b'{"path": "d.h", "content": "x", "extra": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"
    src.write_bytes(jsonl_line(cpp_record(0)) + deep + jsonl_line(cpp_record(1)))
    report = convert(src, tmp_path / "out", JsonlConverterConfig(rows_per_file=4))
    assert [row[4] for row in shard_rows(tmp_path / "out")] == [1, 3]
    assert [(r.line_no, r.field) for r in report.first_rejects] == [(2, "<json>")]
    assert "nested deeper" in report.first_rejects[0].reason


def test_iter_records_reads_a_finished_file_by_the_same_rules(tmp_path):
    src = tmp_path / "corpus.jsonl"
    src.write_bytes(
        jsonl_line(cpp_record(0))
        + jsonl_line({"path": "x.cpp"})
        + jsonl_line(cpp_record(1))
        + b'{"path": "torn.cpp", "cont'
    )
    rejects: list[RecordReject] = []
    records = list(iter_records(src, rejects))
    assert [(r["path"], r["line_no"]) for r in records] == [
        (cpp_record(0)["path"], 1),
        (cpp_record(1)["path"], 3),
    ]
    assert records[0]["license"] == "MIT" and records[0]["revision"] is None
    assert set(records[0]) == set(JSONL_RECORDS.names)
    assert [(r.line_no, r.field) for r in rejects] == [(2, "content"), (4, "<line>")]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    contents=st.lists(st.text(max_size=30), min_size=0, max_size=25),
    chunk=st.integers(min_value=1, max_value=64),
    rows_per_file=st.integers(min_value=1, max_value=6),
    validation_rows=st.integers(min_value=0, max_value=4),
    torn=st.integers(min_value=0, max_value=20),
)
def test_any_read_chunking_yields_every_complete_record_exactly_once(
    contents, chunk, rows_per_file, validation_rows, torn
):
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "corpus.jsonl"
        data = b"".join(
            jsonl_line({"path": f"f{i}.cc", "content": c}) for i, c in enumerate(contents)
        )
        src.write_bytes(data + jsonl_line({"path": "torn.cc", "content": "x" * 30})[:torn])
        config = JsonlConverterConfig(
            rows_per_file=rows_per_file, validation_rows=validation_rows, read_chunk_bytes=chunk
        )
        report = convert(src, Path(tmp) / "out", config)
        rows = shard_rows(Path(tmp) / "out")
        assert [(r[0], r[1], r[4]) for r in rows] == [
            (f"f{i}.cc", c, i + 1) for i, c in enumerate(contents)
        ]
        assert report.validation_rows == min(validation_rows, len(contents))
        assert report.torn_tail_bytes == torn


def test_rerun_on_a_complete_directory_is_a_no_op_but_growth_after_completion_is_an_error(
    tmp_path,
):
    src = tmp_path / "corpus.jsonl"
    write_jsonl(src, [cpp_record(i) for i in range(6)])
    config = JsonlConverterConfig(rows_per_file=4)
    convert(src, tmp_path / "out", config)
    manifest = (tmp_path / "out" / MANIFEST_FILE).read_bytes()

    assert convert(src, tmp_path / "out", config).already_complete
    assert (tmp_path / "out" / MANIFEST_FILE).read_bytes() == manifest

    with open(src, "ab") as f:
        f.write(jsonl_line(cpp_record(6)))
    with pytest.raises(InputChangedError, match="grew"):
        convert(src, tmp_path / "out", config)
    with pytest.raises(ResumeConfigMismatchError, match="rows_per_file"):
        convert(src, tmp_path / "out", JsonlConverterConfig(rows_per_file=5))


# --------------------------------------------------------------------------- real processes


def test_cli_errors_are_one_line_naming_the_file_not_a_traceback(tmp_path, capsys):
    out = str(tmp_path / "out")
    missing = tmp_path / "nope.jsonl"
    assert main_jsonl_to_parquet([str(missing), "--out", out, "--rows-per-file", "5"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"jsonl-to-parquet: error: {missing}: input file does not exist"
    ]

    src = tmp_path / "corpus.jsonl"
    src.write_bytes(jsonl_line(cpp_record(0)) + jsonl_line({"path": "a.cpp", "content": 1}))
    assert main_jsonl_to_parquet([str(src), "--out", out, "--rows-per-file", "0"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "rows_per_file" in err[0]

    assert main_jsonl_to_parquet([str(src), "--out", out, "--rows-per-file", "5"]) == 0
    printed = capsys.readouterr()
    assert f"{src}:2: field 'content': a string expected, got int" in printed.err
    assert "1 rows" in printed.out

    with open(src, "ab") as f:
        f.write(jsonl_line(cpp_record(1)))
    assert main_jsonl_to_parquet([str(src), "--out", out, "--rows-per-file", "5"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and str(src) in err[0] and "after the conversion" in err[0]


def test_a_second_converter_on_the_same_output_is_refused(tmp_path):
    src = tmp_path / "corpus.jsonl"
    write_jsonl(src, [cpp_record(0)])
    first = start_converter(src, tmp_path / "out", "--rows-per-file", "1", "--follow",
                            "--idle-timeout", "30")  # fmt: skip
    try:
        wait_for(lambda: (tmp_path / "out" / STATE_FILE).exists())
        with pytest.raises(OutputLockedError):
            convert(src, tmp_path / "out", JsonlConverterConfig(rows_per_file=1))
    finally:
        first.kill()
        first.wait()


def test_torn_line_being_written_is_only_ingested_once_its_newline_arrives(tmp_path):
    src = tmp_path / "corpus.jsonl"
    write_jsonl(src, [cpp_record(i) for i in range(3)])
    fourth = jsonl_line(cpp_record(3))
    with open(src, "ab") as f:
        f.write(fourth[:50])
    proc = start_converter(src, tmp_path / "out", "--rows-per-file", "3", "--follow",
                           "--idle-timeout", str(END_OF_STREAM_S),
                           "--poll-interval", "0.02")  # fmt: skip
    # The first shard is written only after the converter's first read, which took
    # everything there was, the half line included; only then does the rest of it arrive.
    wait_for(lambda: (tmp_path / "out" / "train" / "part-00000.parquet").exists())
    with open(src, "ab") as f:
        f.write(fourth[50:])
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    rows = shard_rows(tmp_path / "out")
    assert rows == expected_rows(src)
    assert rows[3][1] == cpp_record(3)["content"]


def test_no_complete_marker_until_the_input_has_been_idle_for_the_timeout(tmp_path):
    src = tmp_path / "corpus.jsonl"
    src.write_bytes(b"")
    out = tmp_path / "out"
    # one row per shard: a line's shard on disk shows the converter has read that line
    proc = start_converter(src, out, "--rows-per-file", "1", "--follow",
                           "--idle-timeout", str(END_OF_STREAM_S),
                           "--poll-interval", "0.05")  # fmt: skip
    for i in range(6):
        last_growth = time.monotonic()  # taken before the write: the converter sees it after
        with open(src, "ab") as f:
            f.write(jsonl_line(cpp_record(i)))
        shard = out / "train" / f"part-{i:05d}.parquet"
        wait_for(lambda shard=shard: shard.exists() or proc.poll() is not None)
        assert proc.poll() is None, proc.communicate()
        assert not (out / COMPLETE_FILE).exists()
        assert not (out / MANIFEST_FILE).exists()
    _, err = proc.communicate(timeout=HANG_GUARD_S)
    assert proc.returncode == 0, err
    # the idle clock restarted at the last growth: the stream ended no sooner than that
    assert time.monotonic() - last_growth >= END_OF_STREAM_S
    assert (out / COMPLETE_FILE).exists()
    assert shard_rows(out) == expected_rows(src)


CRASH_POINTS = [
    "after_shard_tmp:2",  # a stale part-00001.parquet.tmp is left behind
    "after_promote:2",  # part-00001.parquet promoted, the state file does not list it yet
    "after_state:2",
    "after_promote:5",  # the validation shard promoted, not yet recorded
    "before_complete:1",  # manifest written, _COMPLETE not yet
]


@pytest.mark.parametrize("crash_at", CRASH_POINTS)
def test_sigkill_at_each_commit_step_resumes_to_the_uninterrupted_result(tmp_path, crash_at):
    src = tmp_path / "corpus.jsonl"
    write_jsonl(src, [cpp_record(i) for i in range(23)])
    src.write_bytes(
        src.read_bytes() + b'{"path": 1, "content": "x"}\n' + jsonl_line(cpp_record(23))
    )
    args = ("--rows-per-file", "5", "--validation-rows", "4")
    reference = convert(
        src, tmp_path / "reference", JsonlConverterConfig(rows_per_file=5, validation_rows=4)
    )
    out = tmp_path / "out"

    killed = run_converter(src, out, *args, MEGACPP_JSONL_CRASH_AT=crash_at)
    assert killed.returncode == -signal.SIGKILL
    assert not (out / COMPLETE_FILE).exists()
    state = json.loads((out / STATE_FILE).read_text())
    if crash_at == "after_shard_tmp:2":
        assert (out / "train" / "part-00001.parquet.tmp").exists()
    if crash_at == "after_promote:2":
        assert (out / "train" / "part-00001.parquet").exists() and len(state["train"]) == 1
    if crash_at == "after_promote:5":
        assert (out / "validation" / "part-00000.parquet").exists() and not state["validation"]
    if crash_at == "before_complete:1":
        assert (out / MANIFEST_FILE).exists() and state["finalized"]

    convert(src, out, JsonlConverterConfig(rows_per_file=5, validation_rows=4))
    assert shard_rows(out) == shard_rows(tmp_path / "reference")
    assert len(shard_rows(out)) == reference.rows == 24
    manifest = (out / MANIFEST_FILE).read_bytes()
    assert manifest == (tmp_path / "reference" / MANIFEST_FILE).read_bytes()
    assert not list(out.rglob("*.tmp"))
    assert (out / REJECTS_FILE).read_bytes() == (tmp_path / "reference" / REJECTS_FILE).read_bytes()


CRASH_PLAN_PROBE = r"""
import sys
from megacpp_pipeline.collect.jsonl_stream import CrashPlan
plan = CrashPlan.from_environ({"MEGACPP_JSONL_CRASH_AT": "after_promote:2"})
for step in ("after_shard_tmp", "after_promote", "after_state", "after_shard_tmp"):
    plan.passed(step)
    print(step, flush=True)
plan.passed("after_promote")
print("survived", flush=True)
"""


def test_crash_plan_kills_on_the_nth_pass_of_its_own_step_and_no_other():
    probe = subprocess.run(
        [sys.executable, "-c", CRASH_PLAN_PROBE],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.returncode == -signal.SIGKILL
    assert probe.stdout.split() == [
        "after_shard_tmp",
        "after_promote",
        "after_state",
        "after_shard_tmp",
    ]


CONVERT_IN_PROCESS = r"""
import sys
from pathlib import Path
from megacpp_pipeline.collect.jsonl_stream import JsonlConverterConfig, convert
convert(Path(sys.argv[1]), Path(sys.argv[2]), JsonlConverterConfig(rows_per_file=5))
"""


def test_the_crash_variable_is_read_by_the_cli_only_not_by_a_library_caller(tmp_path):
    src = tmp_path / "corpus.jsonl"
    write_jsonl(src, [cpp_record(i) for i in range(12)])
    library = subprocess.run(
        [sys.executable, "-c", CONVERT_IN_PROCESS, str(src), str(tmp_path / "library")],
        env=subprocess_env(MEGACPP_JSONL_CRASH_AT="after_promote:1"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert library.returncode == 0, library.stderr
    assert shard_rows(tmp_path / "library") == expected_rows(src)
    cli = run_converter(
        src, tmp_path / "cli", "--rows-per-file", "5", MEGACPP_JSONL_CRASH_AT="after_promote:1"
    )
    assert cli.returncode == -signal.SIGKILL
    assert [p.name for p in (tmp_path / "cli" / "train").iterdir()] == ["part-00000.parquet"]


@pytest.mark.parametrize(
    ("spec", "rule"),
    [
        ("after_promte:2", "'after_promte' is not one of after_shard_tmp, after_promote"),
        ("after_promote:two", "'two' is not a count"),
    ],
)
def test_a_malformed_crash_variable_is_one_line_before_anything_is_written(
    tmp_path, capsys, spec, rule
):
    src = tmp_path / "corpus.jsonl"
    write_jsonl(src, [cpp_record(i) for i in range(3)])
    out = tmp_path / "out"
    argv = [str(src), "--out", str(out), "--rows-per-file", "5"]
    assert main_jsonl_to_parquet(argv, {"MEGACPP_JSONL_CRASH_AT": spec}) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"jsonl-to-parquet: error: MEGACPP_JSONL_CRASH_AT={spec!r}: {rule}")
    assert not out.exists()


WRITER = r"""
import json, random, sys, time
path, n, seed, held = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(seed)
with open(path, "ab", buffering=0) as f:
    for i in range(n):
        if i == n - held:
            sys.stdin.read()  # the last records wait until the test closes our stdin
        body = "int f%d() { return %d; }  // %s\n" % (i, i, "\u00e9" * rng.randrange(40))
        line = json.dumps({"path": "w/%05d.cc" % i, "content": body * rng.randrange(1, 4),
                           "license": "MIT" if i % 2 else None}, ensure_ascii=False)
        line = line.encode() + b"\n"
        if rng.random() < 0.2:  # flush half a line, pause, then the rest
            cut = rng.randrange(1, len(line))
            f.write(line[:cut])
            time.sleep(rng.uniform(0.005, 0.03))
            f.write(line[cut:])
        else:
            f.write(line)
        time.sleep(rng.uniform(0.0, 0.008))
"""


def run_writer_and_killed_follower(tmp_path: Path, seed: int, kills: int, records: int) -> None:
    """A writer appends while followers are SIGKILLed one after another, each once it has
    committed a random number (0-3) of new shards; a last follower then sees the stream end.

    The writer holds its last quarter of records back until every kill is done, so a killed
    follower always has new lines to commit; killed followers never idle out (they are
    killed first), and only the last one ends the stream, END_OF_STREAM_S after the writer.
    """
    rng = random.Random(seed)
    src = tmp_path / "stream.jsonl"
    src.write_bytes(b"")
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    out = tmp_path / "out"
    args = ("--rows-per-file", "7", "--validation-rows", "5", "--follow",
            "--poll-interval", "0.02")  # fmt: skip
    held = records // 4
    writer = subprocess.Popen(
        [sys.executable, str(script), str(src), str(records), str(seed), str(held)],
        stdin=subprocess.PIPE,
    )
    converters: list[subprocess.Popen] = []
    try:
        for _ in range(kills):
            target = train_shards_committed(out) + rng.randint(0, 3)
            converter = start_converter(src, out, *args, "--idle-timeout", str(HANG_GUARD_S))
            converters.append(converter)
            wait_for(
                lambda c=converter, t=target: (
                    train_shards_committed(out) >= t or c.poll() is not None
                )
            )
            assert converter.poll() is None, converter.communicate()
            converter.send_signal(signal.SIGKILL)
            converter.wait()
            assert not (out / COMPLETE_FILE).exists()
        final = start_converter(src, out, *args, "--idle-timeout", str(END_OF_STREAM_S))
        converters.append(final)
        assert writer.stdin is not None
        writer.stdin.close()  # the held-back records follow while the last follower runs
        writer.wait(timeout=HANG_GUARD_S)
        assert writer.returncode == 0
        _, err = final.communicate(timeout=HANG_GUARD_S)
        assert final.returncode == 0, err
    finally:
        if writer.stdin is not None:
            writer.stdin.close()
        for process in [writer, *converters]:
            process.kill()
            process.wait()
    rows = shard_rows(out)
    assert (out / COMPLETE_FILE).exists()
    assert [r[0] for r in rows] == [f"w/{i:05d}.cc" for i in range(records)]
    assert rows == expected_rows(src)
    assert not list(out.rglob("*.tmp"))


def test_writer_appending_while_follower_is_sigkilled_and_restarted_loses_nothing(tmp_path):
    run_writer_and_killed_follower(tmp_path, seed=20261121, kills=2, records=400)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_many_sigkills_while_a_writer_appends_lose_and_duplicate_nothing(tmp_path, seed):
    run_writer_and_killed_follower(tmp_path, seed=seed, kills=10, records=2500)
