"""Hostile input: one `megacpp run` over a directory and a tar archive (the slow suite adds a
git repository) holding good C++ next to ~45 hostile cases must exit 0, keep every good
file, put every bad file in the snapshot ledger with the expected stage, reason and a detail
a person can read, and write nothing outside its data dir. Zip, JSONL and git cases also go
through the collect stage alone; config cases must stop the CLI before any work, naming the
field. Inputs that used to take the slow gates (scrub, the licence parser, enrich's syntax
lane) minutes are pinned by what they must return; a generous hang guard is the only clock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from assets import cli as megacpp
from megacpp_pipeline import collect
from megacpp_pipeline.core.catalog import DEFAULT_MAX_FILE_BYTES, CollectLimits, SourceSpec
from megacpp_pipeline.gates import scrub
from tests.fixtures.hostile.cases import (
    COLLECT,
    KEPT,
    REPO,
    HostileRun,
    escaped_files,
    good_cpp,
    hostile_run,
    tree_listing,
    write_git,
    write_jsonl,
    write_tar,
    write_zip,
)

# A hang guard for subprocesses, not a performance limit: each finishes in seconds.
HANG_GUARD_S = 300


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> HostileRun:
    return hostile_run(tmp_path_factory.mktemp("hostile"))


def _ledger(run: HostileRun) -> dict[tuple[str, str], dict]:
    rows = pq.read_table(run.snapshot / "ledger.parquet").to_pylist()
    return {(r["source_id"], r["path"]): r for r in rows}


def test_the_run_over_the_hostile_corpus_completes_with_a_snapshot(run: HostileRun) -> None:
    assert run.out.returncode == 0, run.out.stderr[-4000:]
    assert (run.snapshot / "_COMPLETE").exists()
    assert run.snapshot.parent == run.data / "snapshots"


def test_every_good_file_is_kept_in_documents(run: HostileRun) -> None:
    docs = pq.read_table(run.snapshot / "documents.parquet", columns=["source_id", "path"])
    kept = set(zip(docs["source_id"].to_pylist(), docs["path"].to_pylist(), strict=True))
    missing = sorted(set(run.corpus.good) - kept)
    assert not missing, f"good files lost: {missing}"


def test_every_hostile_case_has_its_expected_outcome_in_the_ledger(run: HostileRun) -> None:
    wrong, outcomes = _check_outcomes(run)
    (run.root / "outcomes.json").write_text(json.dumps(outcomes, indent=1))
    assert len(run.corpus.cases) >= 30
    assert not wrong, "\n".join(wrong)


def _check_outcomes(run: HostileRun) -> tuple[list[str], dict[str, dict[str, str]]]:
    """Each case's ledger outcome against its expectation: (mismatches, all outcomes)."""
    ledger = _ledger(run)
    docs = pq.read_table(run.snapshot / "documents.parquet", columns=["source_id", "path"])
    documents = set(zip(docs["source_id"].to_pylist(), docs["path"].to_pylist(), strict=True))
    wrong: list[str] = []
    outcomes = {}
    for case in run.corpus.cases:
        row = ledger.get((case.source, case.path))
        if row is None:
            got = "missing from the ledger"
        elif row["status"] == "kept":
            got = KEPT if (case.source, case.path) in documents else "kept but not in documents"
        else:
            got = f"{row['reason']} @ {row['stage']}"
            if not row["detail"]:
                wrong.append(f"{case.name} ({case.source}:{case.path!r}): dropped, no detail")
        want = KEPT if case.expect == KEPT else f"{case.expect} @ {case.stage}"
        outcomes[case.name] = {"expected": want, "actual": got}
        if got != want:
            wrong.append(f"{case.name} ({case.source}:{case.path!r}): want {want}, got {got}")
    return wrong, outcomes


def _explain(run: HostileRun, file_id: str) -> tuple[int, str]:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = megacpp.main(["explain", str(run.snapshot), file_id])
    return code, out.getvalue()


def test_explain_tells_a_name_that_is_not_utf8_from_one_spelled_with_its_escapes(
    run: HostileRun,
) -> None:
    """`hostile/caf\\xe9.h` is two files: one named with the byte 0xE9 (not UTF-8), one named
    with a backslash and `xe9` (a separator on Windows). Both are refused, each under its own
    ledger path and reason, and explain answers for the file it is asked about."""
    ledger = _ledger(run)
    not_utf8, literal = ("hdir", "hostile/caf\\xe9.h"), ("hdir", "hostile/caf\\\\xe9.h")
    assert "not UTF-8" in ledger[not_utf8]["detail"]
    assert "backslash" in ledger[literal]["detail"]
    code, out = _explain(run, "hdir:hostile/caf\\\\xe9.h")  # the literal name's ledger path
    assert code == 1 and "backslash" in out and "not UTF-8" not in out, out
    assert "b'hostile/caf\\\\xe9.h'" in out, out
    code, out = _explain(run, os.fsdecode(b"hdir:hostile/caf\xe9.h"))  # the bytes, as a shell
    assert code == 1 and "not UTF-8" in out and "backslash" not in out, out
    assert "b'hostile/caf\\xe9.h'" in out, out
    code, out = _explain(run, "hdir:hostile/caf\\xe9.h")  # the non-UTF-8 name's ledger path
    assert code == 1 and out.index("not UTF-8") < out.index("backslash"), out


def test_the_ledger_accounts_for_every_file_of_every_source(run: HostileRun) -> None:
    manifest = json.loads((run.snapshot / "manifest.json").read_text())
    assert set(manifest["ledger"]) == {source for source, _ in run.corpus.good}
    for source, counts in manifest["ledger"].items():
        assert counts["collected"] == counts["kept"] + counts["dropped"], source


def test_nothing_is_written_outside_the_data_dir(run: HostileRun) -> None:
    assert run.out.returncode == 0, run.out.stderr[-2000:]
    after = tree_listing(run.root)
    after.pop("outcomes.json", None)  # written by the outcome test above
    changed = {
        k for k in set(after) | set(run.tree_before) if after.get(k) != run.tree_before.get(k)
    }
    assert not changed, sorted(changed)
    assert list(run.tmp.iterdir()) == [], "temporary files left behind"
    assert list(run.cwd.iterdir()) == [], "files appeared in the run's working directory"


def test_no_escaping_tar_member_is_written_anywhere(run: HostileRun) -> None:
    escapes = {"tar_dotdot_entry", "tar_absolute_entry", "tar_nested_dotdot"}
    assert escapes <= {case.name for case in run.corpus.cases}  # the run held them
    assert escaped_files(run.root) == []


# --- zip and JSONL through the collect stage --------------------------------------------
def _collect(
    spec: SourceSpec,
    uri: Path,
    limits: CollectLimits,
    cache: Path,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
) -> dict:
    files = collect.open_source(
        spec, str(uri), cache_dir=cache, limits=limits, max_file_bytes=max_file_bytes
    )
    out = {}
    for batch in collect.collect_batches(spec, files, is_metadata=lambda _p: False):
        for row in batch.ledger.to_pylist():
            out[row["path"]] = row
    return out


def _outcome(row: dict | None) -> str:
    if row is None:
        return "missing"
    return KEPT if row["status"] == "kept" else str(row["reason"])


def test_zip_bomb_lying_header_escapes_and_member_flood_are_ledgered(tmp_path: Path) -> None:
    good = {f"a/good_{k}.h": good_cpp(400 + k) for k in range(3)}  # sorted first
    archive = tmp_path / "hostile.zip"
    cases = write_zip(archive, good)
    spec = SourceSpec(id="hzip", kind="archive", uri=str(archive), sha256=collect_sha(archive))
    got = _collect(spec, archive, CollectLimits(max_files=40), tmp_path / "cache", 4 << 20)
    for rel in good:
        assert _outcome(got.get(rel)) == KEPT, rel
    for case in cases:
        assert _outcome(got.get(case.path)) == case.expect, (case.name, got.get(case.path))
    assert {p.name for p in tmp_path.iterdir()} <= {archive.name, "cache"}  # nothing extracted
    assert escaped_files(tmp_path) == []


def test_jsonl_records_with_escaping_paths_or_torn_lines_are_ledgered(tmp_path: Path) -> None:
    good = {f"j/good_{k}.h": good_cpp(500 + k) for k in range(3)}
    export = tmp_path / "export.jsonl"
    cases = write_jsonl(export, good)
    spec = SourceSpec(id="hjsonl", kind="jsonl", uri=str(export))
    got = _collect(spec, export, CollectLimits(), tmp_path / "cache")
    for rel in good:
        assert _outcome(got.get(rel)) == KEPT, rel
    for case in cases:
        expect = case.expect if case.stage == COLLECT else KEPT  # dropped by a later gate
        assert _outcome(got.get(case.path)) == expect, (case.name, got)


def test_tar_escapes_links_devices_duplicates_and_disorder_are_ledgered_in_path_order(
    tmp_path: Path,
) -> None:
    good = {f"pkg/good_{k}.h": good_cpp(200 + k) for k in range(4)}
    archive = tmp_path / "hostile.tar.gz"
    cases = write_tar(archive, good)  # members written in reverse path order
    spec = SourceSpec(id="htar", kind="archive", uri=str(archive), sha256=collect_sha(archive))
    files = collect.open_source(
        spec, str(archive), cache_dir=tmp_path / "c", limits=CollectLimits()
    )
    kept = [e.path for e in files.entries() if e.content is not None]
    assert kept == sorted(good), "dedup needs every source's files in path order"
    got = _collect(spec, archive, CollectLimits(), tmp_path / "cache")
    for case in cases:
        assert _outcome(got.get(case.path)) == case.expect, (case.name, got.get(case.path))
    assert [p.name for p in tmp_path.iterdir()] == ["hostile.tar.gz"]  # nothing extracted
    assert escaped_files(tmp_path) == []


def test_git_names_links_submodules_and_repo_config_are_data_at_collect(tmp_path: Path) -> None:
    """The git cases through the collect stage, which runs every git command the pipeline
    runs: hostile names and links are ledgered, and the repository's own fsmonitor, filter,
    pager, ssh command and hooks never run."""
    sentinel = tmp_path / "sentinels"
    sentinel.mkdir()
    good = {f"lib/good_{k}.hpp": good_cpp(300 + k) for k in range(3)}
    repo = tmp_path / "repo"
    pinned, cases = write_git(repo, good, sentinel)
    spec = SourceSpec(id="hgit", kind="git", uri=str(repo), revision=pinned)
    got = _collect(spec, repo, CollectLimits(), tmp_path / "cache")
    for rel in good:
        assert _outcome(got.get(rel)) == KEPT, rel
    for case in cases:
        assert _outcome(got.get(case.path)) == case.expect, (case.name, got.get(case.path))
    assert list(sentinel.iterdir()) == []


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_full_run_with_tar_and_git_sources_keeps_every_good_file_and_runs_nothing(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    full = hostile_run(tmp_path_factory.mktemp("hostile_full"), full=True)
    assert full.out.returncode == 0, full.out.stderr[-4000:]
    wrong, _ = _check_outcomes(full)
    assert not wrong, "\n".join(wrong)
    docs = pq.read_table(full.snapshot / "documents.parquet", columns=["source_id", "path"])
    kept = set(zip(docs["source_id"].to_pylist(), docs["path"].to_pylist(), strict=True))
    assert set(full.corpus.good) <= kept
    assert list(full.corpus.sentinel_dir.iterdir()) == [] and list(full.cwd.iterdir()) == []
    assert escaped_files(full.root) == []


def collect_sha(path: Path) -> str:
    from tests.fixtures.hostile.cases import sha256_of

    return sha256_of(path)


def test_an_oversized_compile_database_is_refused_by_size_without_being_read(
    tmp_path: Path,
) -> None:
    """The default-suite stand-in for 1 GB of flags: the bound is max_file_bytes (the one size
    policy), exceeded here by a 3 MiB database under a 1 MiB limit (the slow test writes
    1 GB)."""
    root = tmp_path / "src"
    (root / "src").mkdir(parents=True)
    (root / "src/a.cc").write_text(good_cpp(600))
    flags = " ".join(f"-DFLAG_{k}=1" for k in range(250_000))
    db = [{"directory": str(root), "command": f"c++ {flags} -c src/a.cc", "file": "src/a.cc"}]
    (root / "compile_commands.json").write_text(json.dumps(db))
    assert (root / "compile_commands.json").stat().st_size > 3 << 20
    spec = SourceSpec(id="big", kind="dir", uri=str(root), compile_commands="compile_commands.json")
    files = collect.open_source(
        spec, str(root), cache_dir=tmp_path / "c", limits=CollectLimits(), max_file_bytes=1 << 20,
        keep_also=lambda p: p == "compile_commands.json",
    )  # fmt: skip
    batches = list(collect.collect_batches(spec, files, is_metadata=lambda p: p.endswith(".json")))
    ledger = {r["path"]: r for b in batches for r in b.ledger.to_pylist()}
    assert ledger["compile_commands.json"]["reason"] == "too_large"
    assert ledger["src/a.cc"]["status"] == "kept"
    assert sum(b.metadata.num_rows for b in batches) == 0


# --- pathological text: what the slow gates must return ----------------------------------
# Each of these once took a gate minutes a file (the figures below); fixed, each takes about
# a second of CPU. Nothing here measures time: the suite's pytest-timeout (600 s) and
# HANG_GUARD_S on subprocesses are hang guards only.

_SCRUB_FLOODS = {
    # 40k e-mail addresses: the overlap check between hits was quadratic (134 s a file)
    "emails": ("x@y.co " * 14 + "\n") * 3000,
    # `password` 120 times a line: the keyword regex backtracked over the line (20 s a file)
    "password_keywords": ("password" * 120 + "\n") * 300,
}


@pytest.mark.parametrize("flood", sorted(_SCRUB_FLOODS))
def test_scrub_replaces_every_address_of_a_flood_and_leaves_a_keyword_flood_alone(
    flood: str,
) -> None:
    text = _SCRUB_FLOODS[flood]
    out, findings = scrub.scrub_text(text, scrub.ScrubConfig())
    if flood == "emails":
        assert len(findings) == 14 * 3000 and "@" not in out
        assert out.count("\n") == 3000  # replaced in place, the lines intact
    else:
        assert (out, findings) == (text, [])


def test_spdx_floods_of_10k_operands_or_5k_nested_parentheses_parse_to_their_meaning() -> None:
    from megacpp_pipeline.gates import license

    flood = " OR ".join(["MIT", "Apache-2.0", "BSD-3-Clause", "Zlib"] * 2500)
    parsed = license.parse_expression(flood)
    assert parsed.is_valid and parsed.normalized == "MIT OR Apache-2.0 OR BSD-3-Clause OR Zlib"
    bad = license.parse_expression("(" * 5000 + "MIT" + ")" * 5000 + " AND Nope-1.0")
    assert not bad.is_valid and bad.normalized == "MIT AND Nope-1.0"
    assert any("'Nope-1.0' is not an SPDX licence id" in e for e in bad.errors), bad.errors


# --- config cases: the CLI stops before any work, naming the field --------------------------
_GOOD_SOURCE = {"id": "ok", "kind": "dir", "uri": "corpus"}


def _catalog(**changes: object) -> dict:
    base: dict = {"snapshot": "cfg", "seq_len": 256, "sources": [dict(_GOOD_SOURCE)]}
    for key, value in changes.items():
        if key.startswith("source_"):
            base["sources"][0][key.removeprefix("source_")] = value
        else:
            base[key] = value
    return base


_LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
    for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)

CONFIG_CASES: dict[str, tuple[object, str]] = {
    "unknown_top_level_key": (_catalog(sourcs=[]), "field sourcs: unknown key"),
    "unknown_source_key": (_catalog(source_branch="main"), "source 'ok': field branch"),
    "duplicate_ids": (
        _catalog(sources=[dict(_GOOD_SOURCE), dict(_GOOD_SOURCE)]),
        "duplicate source id 'ok'",
    ),
    "subdir_escapes_with_dotdot": (_catalog(source_subdir="../../etc"), "field subdir"),
    "subdir_absolute": (_catalog(source_subdir="/etc"), "field subdir"),
    "compile_commands_outside": (
        _catalog(source_compile_commands="../../cc.json"),
        "field compile_commands",
    ),
    "revision_is_a_branch": (
        _catalog(source_kind="git", source_revision="main"),
        "field revision",
    ),
    "archive_without_sha256": (_catalog(source_kind="archive"), "sha256"),
    "id_with_a_path": (_catalog(source_id="../evil"), "field id"),
    "unknown_kind": (_catalog(source_kind="svn"), "field kind"),
    "unknown_stage": (_catalog(stages={"tokenise": {}}), "unknown stage 'tokenise'"),
    "bad_stage_threshold": (
        _catalog(stages={"normalize": {"max_line_length": -1}}),
        "stages.normalize.max_line_length",
    ),
    "seq_len_too_small": (_catalog(seq_len=3), "field seq_len"),
    "not_a_mapping": ("- just\n- a list\n", "expected a mapping"),
    "yaml_alias_bomb": (
        _LAUGHS + "snapshot: cfg\nsources: *i\n",
        "field",
    ),
}


def _write_config(tmp_path: Path, content: object) -> Path:
    import yaml

    (tmp_path / "corpus").mkdir(exist_ok=True)
    path = tmp_path / "sources.yaml"
    path.write_text(content if isinstance(content, str) else yaml.safe_dump(content))
    return path


@pytest.mark.parametrize("name", sorted(CONFIG_CASES))
def test_a_bad_config_stops_the_cli_before_any_work_naming_the_field(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    content, field = CONFIG_CASES[name]
    config = _write_config(tmp_path, content)
    data = tmp_path / "data"
    code = megacpp.main(["run", "--config", str(config), "--data-dir", str(data)])
    err = capsys.readouterr().err
    assert code != 0
    assert field in err, err
    assert "CatalogError" in err and "Traceback" not in err
    assert not data.exists(), "work started before the config was validated"


def test_a_bad_config_through_the_real_entry_point_is_one_line_and_no_work(
    tmp_path: Path,
) -> None:
    config = _write_config(tmp_path, _catalog(source_subdir="../../etc"))
    data, home = tmp_path / "data", tmp_path / "home"
    out = subprocess.run(
        [sys.executable, "-m", "assets.cli", "run", "--config", str(config),
         "--data-dir", str(data)],
        cwd=REPO, env={**os.environ, "DAGSTER_HOME": str(home)}, capture_output=True, text=True,
        timeout=HANG_GUARD_S,
    )  # fmt: skip
    assert out.returncode == 2
    assert "source 'ok': field subdir" in out.stderr and "Traceback" not in out.stderr
    assert not data.exists() and not home.exists()


def _missing_pin_catalog(tmp_path: Path) -> tuple[Path, str]:
    from tests.fixtures.hostile.cases import _git

    (tmp_path / "good").mkdir()
    (tmp_path / "good/a.h").write_text(good_cpp(700))
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    (repo / "b.h").write_text(good_cpp(701))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "only commit")
    missing = "de" * 20
    config = _write_config(
        tmp_path,
        _catalog(
            sources=[
                {"id": "good", "kind": "dir", "uri": "good"},
                {"id": "repo", "kind": "git", "uri": "repo", "revision": missing},
            ]
        ),
    )
    return config, missing


def test_a_git_pin_that_does_not_exist_fails_the_catalog_check_naming_the_revision(
    tmp_path: Path,
) -> None:
    """The blocking check on source_catalog runs before any per-source asset; the slow
    variant drives it through `megacpp run`."""
    from megacpp_pipeline.pipeline.context import StageContext
    from megacpp_pipeline.stages import default_registry
    from megacpp_pipeline.storage.store import ShardStore
    from tests.fixtures.catalogs import load_catalog

    config, missing = _missing_pin_catalog(tmp_path)
    registry = default_registry()
    stage = registry.get("source_catalog")
    ctx = StageContext(
        load_catalog(config), ShardStore(str(tmp_path / "data")), registry, tmp_path / "cache"
    )
    (check,) = stage.checks
    result = check.evaluate(ctx, stage, None)
    assert not result.passed
    assert f"repo: revision {missing} does not exist" in str(result.metadata["problems"])


@pytest.mark.slow
def test_a_git_pin_that_does_not_exist_stops_the_run_before_any_source_is_collected(
    tmp_path: Path,
) -> None:
    config, missing = _missing_pin_catalog(tmp_path)
    data = tmp_path / "data"
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "home"),
           "MEGACPP_CACHE_DIR": str(tmp_path / "cache")}  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", "assets.cli", "run", "--config", str(config),
         "--data-dir", str(data)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    last = out.stderr.strip().splitlines()[-1]
    assert out.returncode == 1
    assert f"repo: revision {missing} does not exist" in last, last
    assert sorted(p.name for p in (data / "assets").iterdir()) == ["source_catalog"]


# --- slow variants: the real sizes ------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_50mb_single_line_is_refused_by_size_at_collect_naming_the_setting(
    tmp_path: Path,
) -> None:
    root = tmp_path / "src"
    root.mkdir()
    (root / "ok.h").write_text(good_cpp(800))
    with open(root / "line.h", "wb") as f:
        f.write(b"int v[] = {")
        for _ in range(50):
            f.write(b"7," * (1 << 19))
        f.write(b"};")
    spec = SourceSpec(id="big", kind="dir", uri=str(root))
    got = _collect(spec, root, CollectLimits(), tmp_path / "c")  # the default 1 MiB policy
    assert got["line.h"]["reason"] == "too_large" and got["ok.h"]["status"] == "kept"
    assert f"> max_file_bytes {DEFAULT_MAX_FILE_BYTES}" in got["line.h"]["detail"]
    raised = _collect(spec, root, CollectLimits(), tmp_path / "c", 64 << 20)
    assert raised["line.h"]["status"] == "kept"  # under a raised policy: the gates judge it


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_1gb_compile_database_is_refused_by_size_without_being_read(tmp_path: Path) -> None:
    root = tmp_path / "src"
    (root / "src").mkdir(parents=True)
    (root / "src/a.cc").write_text(good_cpp(801))
    flags = " ".join(f"-DFLAG_{k}=1" for k in range(80_000)).encode()  # ~1 MB
    with open(root / "compile_commands.json", "wb") as f:
        f.write(b'[{"directory": "/w", "file": "src/a.cc", "command": "c++ ')
        for _ in range(1024):
            f.write(flags + b" ")
        f.write(b'-c src/a.cc"}]')
    assert (root / "compile_commands.json").stat().st_size > 1 << 30
    spec = SourceSpec(id="big", kind="dir", uri=str(root), compile_commands="compile_commands.json")
    files = collect.open_source(
        spec, str(root), cache_dir=tmp_path / "c", limits=CollectLimits(),
        keep_also=lambda p: p == "compile_commands.json",
    )  # fmt: skip
    batches = list(collect.collect_batches(spec, files, is_metadata=lambda p: p.endswith(".json")))
    ledger = {r["path"]: r for b in batches for r in b.ledger.to_pylist()}
    assert ledger["compile_commands.json"]["reason"] == "too_large"
    assert ledger["src/a.cc"]["status"] == "kept"


_DEEP_PARENS = """
import json
import pyarrow as pa
from megacpp_pipeline.gates import enrich
from megacpp_pipeline.core import schemas
n = 250  # 100,000 nested parentheses over 500 lines
text = "int x = " + "\\n".join("(" * 400 for _ in range(n)) + "1"
text += "\\n".join(")" * 400 for _ in range(n)) + ";\\n"
row = {"source_id": "s", "path": "p.cc", "revision": "r", "blob_sha": "b", "size": len(text),
       "encoding": "utf-8", "text": text, "content_sha256": "c", "language": "c++",
       "vendored": False, "license_expression": "MIT",
       "license_source": "file", "license_decision": "allowed", "license_detail": None,
       "scrub_replacements": 0, "scrub_kinds": []}
table = pa.Table.from_pylist([row], schema=schemas.SCRUBBED_FILES)
out = {}
for budget in (20.0, 0.001):  # the default CPU budget, and one far below the 0.2 s parse
    result = enrich.run(table, enrich.EnrichConfig(parse_timeout_seconds=budget))
    dropped = [(r["reason"], r["detail"]) for r in result.dropped.to_pylist()]
    out[str(budget)] = {"kept": result.kept["path"].to_pylist(), "dropped": dropped}
print(json.dumps(out))
"""


def test_100k_nested_parentheses_are_enriched_and_a_parse_over_its_budget_is_dropped() -> None:
    """The query walk over the deep tree used to take minutes (enrich now bounds where matches
    may start); the parse takes 0.2 s of CPU and is cut at the file's CPU budget. In a
    subprocess, so that a regression is killed by the hang guard instead of wedging pytest."""
    out = subprocess.run(
        [sys.executable, "-c", _DEEP_PARENS], cwd=REPO, capture_output=True, text=True,
        timeout=HANG_GUARD_S,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)
    assert got["20.0"] == {"kept": ["p.cc"], "dropped": []}
    assert got["0.001"]["kept"] == []
    [(reason, detail)] = got["0.001"]["dropped"]
    assert reason == "parse_timeout" and "0.001 s CPU budget" in detail, detail
