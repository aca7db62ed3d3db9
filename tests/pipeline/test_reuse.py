"""A version whose inputs did not change stands (pipeline/reuse.py): a second run over the
same files collects no source (a directory's tree hash, a git commit) and computes no per-file
gate, dedup, documents, packing or snapshot again, a run after one
file of one source changed recomputes that source's versions and what reads them, and
either way the snapshot is the one a run from nothing gives."""

from __future__ import annotations

import hashlib
import importlib.metadata
import shutil
import tarfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

import megacpp_pipeline
from megacpp_pipeline.collect import CollectError
from megacpp_pipeline.pipeline import reuse
from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.libraries import library_versions
from megacpp_pipeline.pipeline.reuse import INPUTS, RECOMPUTE_ENV, fingerprint
from megacpp_pipeline.pipeline.runner import run_all
from megacpp_pipeline.stages import collect as collect_stage
from megacpp_pipeline.storage.store import NoVersionError
from megacpp_pipeline.storage.versions import content_id
from tests.fixtures.git_repo import git
from tests.fixtures.pipeline_corpus import write_catalog
from tests.fixtures.run_helpers import snapshot_files
from tests.fixtures.stage_runs import context, run_through

STANDING = "which stands"


def _logged(ctx: StageContext, run_id: str) -> tuple[StageContext, list[str]]:
    lines: list[str] = []
    return replace(ctx, log=lines.append, run_id=run_id), lines


def _latest(ctx: StageContext) -> dict[tuple[str, str | None], str]:
    """Every stage's latest version, by (stage, partition); a stage that keeps none (the
    Megatron export and the report live in the snapshot's folder) is left out."""
    out: dict[tuple[str, str | None], str] = {}
    for stage in ctx.registry:
        for p in ctx.partitions(stage):
            try:
                out[stage.name, p] = ctx.store.latest(stage.name, p).version
            except NoVersionError:
                assert stage.name in ("megatron_dataset", "quality_report")
    return out


def _snapshot(ctx: StageContext) -> Path:
    return Path(ctx.store.latest("snapshot").extra["snapshot_dir"])


def _pinned(catalog: Path, snapshot: Path) -> Path:
    tokenizer = catalog.with_name("tokenizer.json")
    shutil.copyfile(snapshot / "tokenizer.json", tokenizer)
    data = yaml.safe_load(catalog.read_text())
    sha = hashlib.sha256(tokenizer.read_bytes()).hexdigest()
    data["stages"]["tokenizer"] = {"path": str(tokenizer), "sha256": sha}
    out = catalog.with_name("pinned.yaml")
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def test_a_run_over_unchanged_sources_keeps_every_version_and_the_snapshot(
    tmp_path: Path,
) -> None:
    catalog, _ = write_catalog(tmp_path / "corpus")
    first = context(tmp_path, catalog, "first", workers=2)
    run_all(first)
    before = _latest(first)
    raw = {s: first.store.latest("raw_files", s) for s in first.sources()}
    cache = tmp_path / "cache" / "file-results"
    shutil.rmtree(cache)  # a gate that ran would fill it again
    again, lines = _logged(first, "again")
    run_all(again)
    after = _latest(again)
    reusable = [s.name for s in again.registry if s.gate is not None or s.reusable]
    assert {"normalized_files", "scrubbed_files", "deduped_files", "packed_rows"} <= set(reusable)
    # collection too: the directory's tree hash did not move, the git source's commit is pinned
    reusable.append("raw_files")
    for (stage, partition), version in before.items():
        where = f" [{partition}]" if partition else ""
        if stage in reusable:
            assert after[stage, partition] == version, (stage, partition)
            assert f"{stage}{where}: its inputs are those of {version}, {STANDING}" in lines
        else:  # the catalog stage always runs
            assert not any(
                line.startswith(f"{stage}{where}:") and STANDING in line for line in lines
            )
    assert {s: again.store.latest("raw_files", s) for s in again.sources()} == raw
    assert not cache.exists() or not any(cache.rglob("*.arrow"))
    assert snapshot_files(_snapshot(again)) == snapshot_files(_snapshot(first))


def test_a_change_to_one_source_recomputes_its_versions_and_gives_a_fresh_runs_snapshot(
    tmp_path: Path,
) -> None:
    trained, _ = write_catalog(tmp_path / "corpus")
    run_all(context(tmp_path / "train", trained, "train"))
    # the tokenizer pinned: a refresh would otherwise keep the last snapshot's (mode reuse)
    # where a run from nothing trains its own
    catalog = _pinned(trained, _snapshot(context(tmp_path / "train", trained, "t")))
    ctx = context(tmp_path / "refreshed", catalog, "first", workers=2)
    run_all(ctx)
    before = _latest(ctx)
    changed = tmp_path / "corpus" / "corpus_dir" / "src" / "lib2.cc"
    changed.write_text(changed.read_text() + "\nint refreshed_once() { return 2; }\n")
    again, lines = _logged(ctx, "again")
    run_all(again)
    after = _latest(again)
    for stage in ("normalized_files", "scrubbed_files", "enriched_files", "tokenized_docs"):
        assert after[stage, "repo"] == before[stage, "repo"], stage  # the git source stands
        assert f"{stage} [repo]: its inputs are those of {before[stage, 'repo']}, {STANDING}" in (
            lines
        )
        assert after[stage, "tree"] != before[stage, "tree"], stage
        m = again.store.latest(stage, "tree")
        assert m.run_id == "again" and m.extra[INPUTS]
    raw = again.store.latest("raw_files", "tree")  # its tree hash moved: collected again
    assert raw.version != before["raw_files", "tree"] and raw.run_id == "again"
    for stage in ("deduped_files", "documents", "packed_rows"):  # they read every source
        assert after[stage, None] != before[stage, None], stage
    fresh = context(tmp_path / "fresh", catalog, "fresh", workers=2)
    run_all(fresh)
    got, want = snapshot_files(_snapshot(again)), snapshot_files(_snapshot(fresh))
    assert got.pop("README.md") != want.pop("README.md")  # the card: what changed since
    assert got == want
    assert (
        again.store.latest("snapshot").extra["snapshot_id"]
        == (fresh.store.latest("snapshot").extra["snapshot_id"])
    )


def test_a_stage_whose_config_changed_is_computed_again(tmp_path: Path) -> None:
    catalog, _ = write_catalog(tmp_path / "corpus")
    ctx = context(tmp_path, catalog, "first")
    run_all(ctx)
    before = _latest(ctx)
    text = catalog.read_text()
    edited = text.replace("    packing_telemetry: true\n", "    packing_telemetry: false\n", 1)
    assert edited != text
    catalog.write_text(edited)
    again, lines = _logged(context(tmp_path, catalog, "again"), "again")
    run_all(again)
    after = _latest(again)
    for stage in ("scrubbed_files", "tokenized_docs"):
        assert after[stage, "tree"] == before[stage, "tree"], stage
    assert after["documents", None] == before["documents", None]
    assert after["packed_rows", None] != before["packed_rows", None]
    assert not any(line.startswith("packed_rows:") and STANDING in line for line in lines)


def test_with_reuse_off_every_version_is_computed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    catalog, _ = write_catalog(tmp_path / "corpus")
    ctx = context(tmp_path, catalog, "first")
    run_through(ctx, "normalized_files")
    before = ctx.store.latest("normalized_files", "tree")
    monkeypatch.setenv(RECOMPUTE_ENV, "1")  # as `MEGACPP_RECOMPUTE=1 megacpp run` sets it
    again, lines = _logged(context(tmp_path, catalog, "again"), "again")
    assert again.reuse is False
    run_through(again, "normalized_files")
    after = again.store.latest("normalized_files", "tree")
    assert after.version != before.version and after.run_id == "again"
    assert after.stats["cached_files"] == after.stats["input_files"] > 0
    assert not any(STANDING in line for line in lines)


def test_a_snapshot_stands_only_while_its_folder_is_whole(tmp_path: Path) -> None:
    """Nothing changed, but a shard of the promoted snapshot was altered: the snapshot is
    built again, replaces the altered folder of the same id, and holds the files the first
    run promoted."""
    catalog, _ = write_catalog(tmp_path / "corpus")
    first = context(tmp_path, catalog, "first", workers=2)
    run_all(first)
    promoted = first.store.latest("snapshot")
    snap = _snapshot(first)
    want = snapshot_files(snap)
    again, lines = _logged(first, "again")
    run_all(again)
    assert again.store.latest("snapshot").version == promoted.version
    assert f"snapshot: its inputs are those of {promoted.version}, {STANDING}" in lines
    shard = next((snap / "train").glob("*.parquet"))
    shard.chmod(0o644)
    shard.write_bytes(shard.read_bytes()[:-8] + b"tampered")
    third, lines = _logged(first, "third")
    run_all(third)
    rebuilt = third.store.latest("snapshot")
    assert rebuilt.version != promoted.version and rebuilt.run_id == "third"
    assert f"snapshot: what {promoted.version} promoted is not whole; made again" in lines
    assert any(
        line.startswith("snapshot: ") and "sha256 mismatch; it is built again" in line
        for line in lines
    )
    assert rebuilt.extra["snapshot_id"] == promoted.extra["snapshot_id"]
    got = snapshot_files(_snapshot(third))
    # the card says where the tokenizer came from: trained by the first run, kept since
    assert got.pop("README.md") and want.pop("README.md")
    assert got == want


@pytest.mark.slow  # a whole run or more; make test-slow
def test_a_snapshot_whose_card_was_edited_is_made_whole_again_in_place(tmp_path: Path) -> None:
    """Nothing changed, but the promoted folder's card was edited (then, another time, a
    file planted beside it): the snapshot does not stand, its build finds the rows already
    promoted and keeps their files, and the folder gets the build's card back (loses the
    planted file); the blocking checks pass, and the next run finds it whole."""
    catalog, _ = write_catalog(tmp_path / "corpus")
    first = context(tmp_path, catalog, "first", workers=2)
    run_all(first)
    promoted = first.store.latest("snapshot")
    snap = _snapshot(first)
    card = (snap / "README.md").read_bytes()
    rows = {p: p.stat().st_ino for p in (snap / "train").glob("*.parquet")}
    (snap / "README.md").chmod(0o644)
    (snap / "README.md").write_text(card.decode().replace("tokens", "tokenz"))
    again, lines = _logged(first, "again")
    run_all(again)  # raises when a blocking check fails
    rebuilt = again.store.latest("snapshot")
    assert rebuilt.version != promoted.version
    assert f"snapshot: {snap}: README.md: sha256 mismatch; it is built again" in lines
    assert _snapshot(again) == snap and b"tokenz" not in (snap / "README.md").read_bytes()
    built = hashlib.sha256((snap / "README.md").read_bytes()).hexdigest()
    assert built == rebuilt.extra["unlisted_files"]["README.md"]  # the build's card
    assert {p: p.stat().st_ino for p in (snap / "train").glob("*.parquet")} == rows  # kept
    (snap / "notes.txt").write_text("planted\n")
    third, lines = _logged(first, "third")
    run_all(third)
    assert any("notes.txt: not listed in the manifest; it is built again" in x for x in lines)
    assert not (snap / "notes.txt").exists()
    healed = third.store.latest("snapshot")
    fourth, lines = _logged(first, "fourth")
    run_all(fourth)
    assert f"snapshot: its inputs are those of {healed.version}, {STANDING}" in lines


def test_a_git_source_pinned_to_another_commit_is_collected_again(tmp_path: Path) -> None:
    """Collection stands for a commit it collected before and reads the source again for any
    other, without reading the directory source's files twice."""
    catalog, _ = write_catalog(tmp_path / "corpus")
    first = context(tmp_path, catalog, "first")
    run_through(first, "raw_files")
    raw = {s: first.store.latest("raw_files", s) for s in first.sources()}
    head = git(tmp_path / "corpus" / "corpus_git", "rev-parse", "HEAD")  # after the pin
    assert head != raw["repo"].extra["revision"]
    catalog.write_text(catalog.read_text().replace(raw["repo"].extra["revision"], head))
    again, lines = _logged(context(tmp_path, catalog, "again"), "again")
    run_through(again, "raw_files")
    assert again.store.latest("raw_files", "tree") == raw["tree"]
    moved = again.store.latest("raw_files", "repo")
    assert moved.run_id == "again" and moved.extra["revision"] == head
    assert content_id(moved) != content_id(raw["repo"])
    assert not any(line.startswith("raw_files [repo]:") and STANDING in line for line in lines)


def _tarball(path: Path, files: dict[str, str]) -> str:
    """A gzipped tar of `files` at `path`; its sha256."""
    src = path.with_suffix(".d")
    for name, text in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    with tarfile.open(path, "w:gz") as tf:
        tf.add(src, arcname="pkg")
    shutil.rmtree(src)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_an_archive_collected_before_stands_by_its_sha256_without_being_read(
    tmp_path: Path,
) -> None:
    """An archive source names its content by the pinned sha256, so a second run collects
    nothing, even with the archive gone from its address; a new sha256 collects again."""
    header = "// SPDX-License-Identifier: MIT\n#pragma once\nnamespace ring {\n"
    files = {
        "include/ring.hpp": header + "inline int capacity() { return 64; }\n}\n",
        "src/ring.cc": '#include "ring.hpp"\nint main() { return ring::capacity() - 64; }\n',
    }
    archive = tmp_path / "ring.tar.gz"
    sha = _tarball(archive, files)
    catalog = tmp_path / "sources.yaml"
    entry = "snapshot: t\nsources:\n  - {{id: ring, kind: archive, uri: {uri}, sha256: {sha}}}\n"
    catalog.write_text(entry.format(uri=archive, sha=sha))
    first = run_through(context(tmp_path, catalog, "first"), "raw_files")
    collected = first.store.latest("raw_files", "ring")
    assert collected.rows == 2 and collected.extra["revision"] == sha

    archive.rename(tmp_path / "moved.tar.gz")  # reading it now would fail
    again, lines = _logged(context(tmp_path, catalog, "again"), "again")
    run_through(again, "raw_files")
    assert again.store.latest("raw_files", "ring") == collected
    assert any(line.startswith("raw_files [ring]:") and STANDING in line for line in lines)

    files["src/ring.cc"] += "// a second release\n"
    new_sha = _tarball(archive, files)
    catalog.write_text(entry.format(uri=archive, sha=new_sha))
    third, lines = _logged(context(tmp_path, catalog, "third"), "third")
    run_through(third, "raw_files")
    moved = third.store.latest("raw_files", "ring")
    assert moved.run_id == "third" and moved.extra["revision"] == new_sha
    assert content_id(moved) != content_id(collected)
    assert not any(line.startswith("raw_files [ring]:") and STANDING in line for line in lines)


def _tree_catalog(tmp: Path) -> Path:
    src = tmp / "corpus" / "d" / "src"
    src.mkdir(parents=True)
    (src / "a.cc").write_text("int a() { return 1; }\n")
    (src / "big.cc").write_text("// x\n" * 400)  # 2,000 bytes, over the limit
    catalog = tmp / "corpus" / "sources.yaml"
    catalog.write_text(
        "snapshot: t\nmax_file_bytes: 1000\nsources:\n  - {id: tree, kind: dir, uri: d}\n"
    )
    return catalog


def _ledger_details(ctx: StageContext) -> dict[str, str | None]:
    m = ctx.store.latest("raw_files", "tree")
    return {
        r["path"]: r["detail"] for t in ctx.store.iter_tables(m, "ledger") for r in t.to_pylist()
    }


def test_a_file_over_the_limit_that_grew_moves_the_revision(tmp_path: Path) -> None:
    """A file collection does not read still counts in the tree hash by why it was not
    read (its ledger detail gives its size), so the ledger never stands stale."""
    catalog = _tree_catalog(tmp_path)
    first = run_through(context(tmp_path / "run", catalog, "first"), "raw_files")
    collected = first.store.latest("raw_files", "tree")
    (tmp_path / "corpus" / "d" / "src" / "big.cc").write_text("// x\n" * 800)
    again = run_through(context(tmp_path / "run", catalog, "again"), "raw_files")
    fresh = run_through(context(tmp_path / "fresh", catalog, "fresh"), "raw_files")
    moved = again.store.latest("raw_files", "tree")
    assert moved.run_id == "again" and moved.extra["revision"] != collected.extra["revision"]
    assert _ledger_details(again) == _ledger_details(fresh)
    assert "4000" in str(_ledger_details(again)["src/big.cc"])


def test_a_file_changed_between_the_two_reads_is_named_and_nothing_is_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory's revision is taken from a first read of every file: an edit that lands
    before the second read (the one collected) fails the source, naming the file, instead
    of a version that holds other content than its revision names."""
    catalog = _tree_catalog(tmp_path)
    a = tmp_path / "corpus" / "d" / "src" / "a.cc"
    collecting = collect_stage._collect_task

    def racing(job: Any, task: Any) -> Any:
        a.write_text("int a() { return 2; }\n")  # lands after the digest pass
        return collecting(job, task)

    monkeypatch.setattr(collect_stage, "_collect_task", racing)
    with pytest.raises(CollectError, match=r"src/a\.cc changed while this run collected it"):
        run_through(context(tmp_path / "run", catalog, "first"), "raw_files")
    monkeypatch.setattr(collect_stage, "_collect_task", collecting)
    ctx = context(tmp_path / "run", catalog, "again")
    with pytest.raises(NoVersionError):
        ctx.store.latest("raw_files", "tree")
    run_through(ctx, "raw_files")
    m = ctx.store.latest("raw_files", "tree")
    texts = {r["path"]: r["content"] for t in ctx.store.iter_tables(m) for r in t.to_pylist()}
    assert texts["src/a.cc"] == b"int a() { return 2; }\n"


def test_the_fingerprint_moves_with_any_file_of_the_library_and_a_library_version(
    tmp_path: Path,
) -> None:
    (tmp_path / "gates").mkdir()
    (tmp_path / "gates" / "rules.toml").write_text("a = 1\n")
    (tmp_path / "versions.py").write_text("OPTIONS = {'use_dictionary': False}\n")
    libraries = ["python==3.11", "pyarrow==26.0.1"]
    before = fingerprint(tmp_path, libraries)
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "versions.cpython-311.pyc").write_bytes(b"\0compiled")
    assert fingerprint(tmp_path, libraries) == before  # compiled files do not count
    (tmp_path / "versions.py").write_text("OPTIONS = {'use_dictionary': True}\n")
    edited = fingerprint(tmp_path, libraries)
    assert edited != before
    (tmp_path / "gates" / "rules.toml").write_text("a = 2\n")
    assert fingerprint(tmp_path, libraries) != edited
    assert fingerprint(tmp_path, ["python==3.11", "pyarrow==27.0.0"]) != fingerprint(
        tmp_path, libraries
    )


def test_the_pipeline_fingerprint_carries_every_library_the_package_imports() -> None:
    """Read off the imports, not a list kept by hand: the REUSE library the licence gate
    reads its metadata with and scipy, which dedup's components come from, were missing
    from the list this replaced."""
    got = library_versions([megacpp_pipeline.__name__])
    for name in ("pyarrow", "tiktoken", "tree-sitter-cpp", "google-re2", "reuse", "scipy"):
        assert f"{name}=={importlib.metadata.version(name)}" in got


def test_no_version_stands_for_other_code_than_wrote_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Code outside a stage's own modules (the parquet options, the snapshot's writers) or
    a library upgrade can change what it writes: the whole library's fingerprint is in
    every inputs id, so after such a change nothing stands."""
    catalog, _ = write_catalog(tmp_path / "corpus")
    first = run_through(context(tmp_path, catalog, "first"), "raw_files")
    assert {first.store.latest("raw_files", s).run_id for s in first.sources()} == {"first"}
    monkeypatch.setattr(reuse, "pipeline_fingerprint", lambda: "another build")
    again, lines = _logged(context(tmp_path, catalog, "again"), "again")
    run_through(again, "raw_files")
    assert {again.store.latest("raw_files", s).run_id for s in again.sources()} == {"again"}
    assert not any(STANDING in line for line in lines)


def test_a_body_whose_inputs_moved_while_it_ran_records_none(tmp_path: Path) -> None:
    """A stage computed from what it read: when another run commits one of its inputs
    before it commits (its inputs at the end are not those it started from), its version
    records no inputs id and never stands."""
    catalog, _ = write_catalog(tmp_path / "corpus")
    ctx = run_through(context(tmp_path, catalog, "first"), "documents")
    packing = ctx.registry.get("packed_rows")
    now = reuse.body_inputs(ctx, packing, None)
    assert now is not None
    for started, moved in ((now, False), ("inputs when it started", True)):
        lines: list[str] = []
        body = replace(ctx.for_stage(packing), inputs={None: started}, log=lines.append)
        with body.begin(packing, None, body.config(packing)) as version:
            committed = version.commit()
        assert (INPUTS not in committed.extra) is moved
        assert any("its inputs moved while it ran" in x for x in lines) is moved
        assert ctx.store.latest("packed_rows").extra.get(INPUTS) == (None if moved else now)


@pytest.mark.slow  # a whole run or more; make test-slow
def test_a_removal_request_added_that_removes_nothing_still_moves_the_snapshot(
    tmp_path: Path,
) -> None:
    """The card counts the removal requests; a request file that gains an entry matching no
    file leaves every removals version's content the same, but not the snapshot."""
    catalog, _ = write_catalog(tmp_path / "corpus")
    requests = catalog.with_name("requests.jsonl")
    requests.write_text('{"source": "tree", "path": "no/such/**"}\n')
    data = yaml.safe_load(catalog.read_text())
    data["removals"] = [{"file": "requests.jsonl"}]
    catalog.write_text(yaml.safe_dump(data, sort_keys=False))
    first = context(tmp_path, catalog, "first", workers=2)
    run_all(first)
    promoted = first.store.latest("snapshot")
    before = _latest(first)
    assert promoted.extra["removals"]["entries"] == 1
    with requests.open("a") as f:
        f.write('{"source": "repo", "path": "nor/this/**"}\n')
    again, lines = _logged(context(tmp_path, catalog, "again", workers=2), "again")
    run_all(again)
    rebuilt = again.store.latest("snapshot")
    assert rebuilt.version != promoted.version and rebuilt.extra["removals"]["entries"] == 2
    assert f"snapshot: its inputs are those of {promoted.version}, {STANDING}" not in lines
    after = _latest(again)
    for stage in ("normalized_files", "licensed_files", "scrubbed_files", "tokenized_docs"):
        assert after[stage, "tree"] == before[stage, "tree"], stage


def test_a_removal_written_into_the_catalog_leaves_the_other_stages_versions_standing(
    tmp_path: Path,
) -> None:
    """Every per-source stage's identity held the whole catalog, so a `removals:` entry
    added to it computed every gate of every source again; the requests are in the removals
    gate's identity (its code version and each source's salt), not in every stage's."""
    catalog, _ = write_catalog(tmp_path / "corpus")
    first = context(tmp_path, catalog, "first", workers=2)
    run_all(first)
    before = _latest(first)
    data = yaml.safe_load(catalog.read_text())
    data["removals"] = [{"source": "repo", "path": "no/such/**"}]
    catalog.write_text(yaml.safe_dump(data, sort_keys=False))
    again = context(tmp_path, catalog, "again", workers=2)
    run_all(again)
    after = _latest(again)
    for stage in ("normalized_files", "classified_files", "quality_files", "licensed_files"):
        for source in ("tree", "repo"):
            assert after[stage, source] == before[stage, source], (stage, source)
    # the removals gate and what reads it are computed again: its code version, which every
    # reader's identity holds, changed
    assert after["removed_files", "repo"] != before["removed_files", "repo"]


def test_the_catalog_is_dumped_once_for_every_sources_inputs_and_each_sees_its_own_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's N sources each compute N stages' inputs ids: dumping the whole catalog for
    each grew as N^2. It is dumped once per catalog; a per-source id still sees the catalog's
    settings and its own entry only, and a corpus-wide id every source."""
    from megacpp_pipeline.core.catalog import Catalog

    catalog, _ = write_catalog(tmp_path / "corpus")
    ctx = context(tmp_path, catalog, "run-a")
    dumps: list[int] = []
    real = Catalog.model_dump

    def counted(self: Catalog, **kwargs: Any) -> dict[str, Any]:
        dumps.append(1)
        return real(self, **kwargs)

    monkeypatch.setattr(Catalog, "model_dump", counted)
    reuse._CATALOG_JSON.clear()
    stage = ctx.registry.get("normalized_files")
    ids = {s: reuse.inputs_id(ctx, stage, s, []) for s in ctx.sources() for _ in range(3)}
    everything = reuse.inputs_id(ctx, ctx.registry.get("deduped_files"), None, [])
    assert len(dumps) == 1 and len(set(ids.values())) == len(ids) == 2
    whole, entries = reuse._catalog_json(ctx.catalog)
    assert set(entries) == set(ctx.sources()) and "stages" not in whole
    assert everything not in ids.values()
