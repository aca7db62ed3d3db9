"""The text release: every document in a snapshot's rows as its final text with its metadata,
in bounded parquet shards per split with a manifest and `_COMPLETE`, written by the snapshot
stage (`text: true`, checked before promotion) or by `megacpp export-text`; Hugging Face
`datasets` loads it; `megacpp verify` re-tokenizes it with the snapshot's tokenizer and
finds the snapshot's tokens, and names a release whose text does not give them back."""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from megacpp_pipeline import cli
from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.runner import run_all
from megacpp_pipeline.snapshot.promote import read_manifest
from megacpp_pipeline.snapshot.text_release import (
    TEXT_DIR,
    TEXT_SCHEMA,
    ReleaseConfig,
    TextReleaseError,
    check_release,
    read_release,
    write_release,
)
from megacpp_pipeline.stages import default_registry
from megacpp_pipeline.storage.store import ShardStore
from megacpp_pipeline.storage.versions import COMPLETE, complete_marker, sha256_file
from tests.fixtures.catalogs import load_catalog
from tests.fixtures.pipeline_corpus import write_catalog


def promote(root: Path, catalog: Path, name: str, extra: str) -> Path:
    """The test corpus promoted with `extra` (yaml lines) added under its stages."""
    text = catalog.read_text().replace("stages:\n", f"stages:\n{extra}", 1)
    text = text.replace("  snapshot:\n", "  snapshot:\n    text: true\n", 1)
    text = text.replace("  - id: repo\n", "  - id: repo\n    weight: 0.5\n", 1)
    path = catalog.with_name(f"sources-{name}.yaml")
    path.write_text(text)
    registry = default_registry()
    ctx = StageContext(
        load_catalog(path, registry),
        ShardStore(str(root / f"data-{name}")),
        registry,
        root / "cache",
        run_id=name,
        workers=2,
    )
    run_all(ctx)  # the text_release check runs before promotion, with every other check
    return Path(ctx.store.latest("snapshot", None).extra["snapshot_dir"])


@pytest.fixture(scope="module")
def snapshots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("text")
    catalog, _ = write_catalog(root)
    return {
        "file": promote(root, catalog, "file", ""),
        "repository": promote(root, catalog, "repository", "  documents:\n    mode: repository\n"),
    }


@pytest.fixture(scope="module")
def unterminated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository snapshot of the test corpus with the directory source's sources and
    every other header cut short of their final newline (one ending inside a `//` comment),
    so its documents hold such files first, in the middle and last."""
    root = tmp_path_factory.mktemp("unterminated")
    catalog, _ = write_catalog(root)
    tree = root / "corpus_dir"
    cut = [*sorted(tree.glob("src/*.cc")), *sorted(tree.glob("include/lib*/container.hpp"))[::2]]
    for path in cut:
        path.write_text(path.read_text().rstrip("\n"))
    cut[0].write_text(cut[0].read_text() + "\n// the end, no newline")
    return promote(root, catalog, "unterminated", "  documents:\n    mode: repository\n")


def megacpp(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = cli.main(list(argv))
    return code, out.getvalue()


def released_rows(folder: Path) -> list[dict]:
    release = read_release(folder)
    return [row for f in release.files for row in pq.read_table(folder / f.path).to_pylist()]


@pytest.mark.parametrize("mode", ["file", "repository"])
def test_the_snapshot_stage_writes_every_document_in_the_rows_with_its_metadata(
    snapshots: dict[str, Path], mode: str
) -> None:
    snap = snapshots[mode]
    folder = snap / TEXT_DIR
    assert (folder / COMPLETE).is_file()
    release = read_release(folder)
    docs = {d["doc_id"]: d for d in pq.read_table(snap / "documents.parquet").to_pylist()}
    rows = released_rows(folder)
    in_rows = {i for i, d in docs.items() if d["draws"] > 0}
    assert sorted(r["doc_id"] for r in rows) == sorted(in_rows)  # each once
    assert release.not_in_rows == len(docs) - len(in_rows)
    assert release.not_in_rows > 0 or mode == "repository"  # repo weighs 0.5 (3 documents)
    assert release.snapshot_id == read_manifest(snap).snapshot_id
    for row in rows:
        doc = docs[row["doc_id"]]
        for key in ("source_id", "path", "revision", "license_expression", "language", "split"):
            assert row[key] == doc[key], key
        assert row["scrub_kinds"] == list(doc["scrub_kinds"])
        assert row["draws"] == doc["draws"]
        assert hashlib.sha256(row["text"].encode()).hexdigest() == doc["content_sha256"]
        spans = row["files"]
        assert spans[0]["start"] == 0 and spans[-1]["end"] == len(row["text"])
        assert all(a["end"] == b["start"] for a, b in itertools.pairwise(spans))
        if mode == "repository":
            assert all(row["text"][s["start"] :].startswith(f"// {s['path']}\n") for s in spans)
    assert any(len(r["files"]) > 1 for r in rows) == (mode == "repository")
    assert any("email" in r["scrub_kinds"] for r in rows)


@pytest.mark.parametrize("mode", ["file", "repository"])
def test_verify_re_tokenizes_the_release_to_the_snapshots_tokens(
    snapshots: dict[str, Path], mode: str
) -> None:
    found = check_release(snapshots[mode] / TEXT_DIR, snapshots[mode], sample=10_000)
    assert found.problems == []
    assert found.documents_checked == read_release(snapshots[mode] / TEXT_DIR).documents
    code, text = megacpp("verify", str(snapshots[mode]))
    assert code == 0, text
    assert "PASS  text_release" in text and "released=yes" in text


def test_a_file_without_a_final_newline_is_released_with_its_separator_outside_its_span(
    unterminated: Path,
) -> None:
    rows = released_rows(unterminated / TEXT_DIR)
    files = pq.read_table(unterminated / "document_files.parquet").to_pylist()
    sha = {(f["doc_id"], f["path"]): f["content_sha256"] for f in files}
    separated = 0
    for row in rows:
        text, spans = row["text"], row["files"]
        ends = [s["start"] for s in spans[1:]] + [len(text)]
        for span, next_start in zip(spans, ends, strict=True):
            marker = f"// {span['path']}\n"
            assert text[span["start"] :].startswith(marker)
            assert span["start"] == 0 or text[span["start"] - 1] == "\n"  # a line of its own
            file = text[span["start"] + len(marker) : span["end"]]
            assert hashlib.sha256(file.encode()).hexdigest() == sha[(row["doc_id"], span["path"])]
            separator = text[span["end"] : next_start]
            assert separator == ("\n" if file and not file.endswith("\n") else "")
            separated += separator == "\n" and next_start < len(text)
        assert text.endswith("\n")
    assert separated > 0  # some separator sits between two members, not only at the end
    found = check_release(unterminated / TEXT_DIR, unterminated, sample=10_000)
    assert found.problems == []
    assert found.documents_checked == len(rows)
    code, text = megacpp("verify", str(unterminated))  # every member file's own text too
    assert code == 0, text


def test_a_release_that_moves_a_file_end_or_changes_a_separator_is_named(
    unterminated: Path, tmp_path: Path
) -> None:
    def first_separated(rows: list[dict]) -> tuple[dict, int]:
        for row in rows:
            for k, span in enumerate(row["files"][:-1]):
                if span["end"] != row["files"][k + 1]["start"]:
                    return row, k
        raise AssertionError("no separated member")

    def moved_end(table: pa.Table) -> pa.Table:  # the separator counted into the file
        rows = table.to_pylist()
        row, k = first_separated(rows)
        row["files"][k]["end"] += 1
        return pa.Table.from_pylist(rows, schema=TEXT_SCHEMA)

    def spaced(table: pa.Table) -> pa.Table:  # a space where the separator newline was
        rows = table.to_pylist()
        row, k = first_separated(rows)
        end = row["files"][k]["end"]
        row["text"] = row["text"][:end] + " " + row["text"][end + 1 :]
        row["content_sha256"] = hashlib.sha256(row["text"].encode()).hexdigest()
        return pa.Table.from_pylist(rows, schema=TEXT_SCHEMA)

    for name, change, problem in (
        ("moved", moved_end, "the file's text differs from its content_sha256"),
        ("spaced", spaced, "is followed by text that is no separator"),
    ):
        folder = tmp_path / name
        shutil.copytree(unterminated / TEXT_DIR, folder)
        _rewrite(folder, change)
        found = check_release(folder, unterminated, sample=10_000)
        assert any(problem in p for p in found.problems), found.problems
        assert any("re-tokenized text differs" in p for p in found.problems) == (name == "spaced")


def test_export_text_writes_bounded_shards_that_datasets_loads(
    snapshots: dict[str, Path], tmp_path: Path
) -> None:
    import datasets

    snap, out = snapshots["file"], tmp_path / "release"
    code, text = megacpp("export-text", str(snap), "--out", str(out), "--max-rows", "4")
    assert code == 0, text
    release = read_release(out)
    assert all(f.rows <= 4 for f in release.files) and len(release.splits["train"].shards) > 1
    assert pq.read_schema(out / release.files[0].path).equals(TEXT_SCHEMA)
    loaded = datasets.load_dataset("parquet", data_dir=str(out), cache_dir=str(tmp_path / "hf"))
    for split in ("train", "validation"):
        assert loaded[split].num_rows == release.splits[split].documents
    assert set(loaded["train"].column_names) == set(TEXT_SCHEMA.names)
    code, text = megacpp("verify", str(snap), "--text", str(out))
    assert code == 0, text
    # a folder that already holds something is refused, in one line
    code, text = megacpp("export-text", str(snap), "--out", str(out))
    assert code == 2 and "not empty" in text


def _rewrite(folder: Path, change: callable) -> None:
    """One shard of a release rewritten by `change`, its manifest and marker made to agree
    (so only the re-tokenization can tell)."""
    manifest_path = folder / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    entry = manifest["files"][0]
    shard = folder / entry["path"]
    shard.chmod(0o644)
    pq.write_table(change(pq.read_table(shard)), shard)
    entry["sha256"], entry["bytes"] = sha256_file(shard), shard.stat().st_size
    raw = json.dumps(manifest, indent=2).encode()
    manifest_path.write_bytes(raw)
    (folder / COMPLETE).write_bytes(complete_marker(manifest["snapshot_id"], raw))


def test_a_release_whose_text_does_not_give_the_snapshots_tokens_is_named(
    snapshots: dict[str, Path], tmp_path: Path
) -> None:
    snap = snapshots["file"]
    folder = tmp_path / "tampered"
    shutil.copytree(snap / TEXT_DIR, folder)

    def edit(table: pa.Table) -> pa.Table:
        rows = table.to_pylist()
        rows[0]["text"] = rows[0]["text"].replace("\n", "\n\n", 1)  # one more blank line
        rows[0]["content_sha256"] = hashlib.sha256(rows[0]["text"].encode()).hexdigest()
        return pa.Table.from_pylist(rows, schema=TEXT_SCHEMA)

    _rewrite(folder, edit)
    first = pq.read_table(folder / read_release(folder).files[0].path).slice(0, 1).to_pylist()[0]
    found = check_release(folder, snap, sample=10_000)
    assert found.problems == [
        f"{folder}: doc {first['doc_id']} ({first['source_id']}:{first['path']}): re-tokenized "
        "text differs from the snapshot's tokens"
    ]
    code, text = megacpp("verify", str(snap), "--text", str(folder))
    assert code == 1 and "FAILED text_release" in text


def test_a_release_missing_a_document_or_of_another_snapshot_is_refused(
    snapshots: dict[str, Path], tmp_path: Path
) -> None:
    folder = tmp_path / "short"
    shutil.copytree(snapshots["file"] / TEXT_DIR, folder)
    _rewrite(folder, lambda t: t.filter(pc.not_equal(t["doc_id"], t["doc_id"][0])))
    (problem,) = check_release(folder, snapshots["file"]).problems
    assert "documents released, the rows hold" in problem and "missing doc [" in problem
    (problem,) = check_release(snapshots["repository"] / TEXT_DIR, snapshots["file"]).problems[:1]
    assert "a release of " in problem
    with pytest.raises(TextReleaseError, match="no _COMPLETE"):
        read_release(tmp_path)


def test_write_release_bounds_shards_by_bytes_too(
    snapshots: dict[str, Path], tmp_path: Path
) -> None:
    release = write_release(
        snapshots["file"], tmp_path / "small", ReleaseConfig(max_rows=1000, max_bytes=4000)
    )
    sizes = [
        sum(len(t.encode()) for t in pq.read_table(tmp_path / "small" / f.path)["text"].to_pylist())
        for f in release.files
    ]
    assert len(sizes) > 2
    assert all(size <= 4000 for size, f in zip(sizes, release.files, strict=True) if f.rows > 1)


def test_a_file_the_release_does_not_list_is_refused(
    snapshots: dict[str, Path], tmp_path: Path
) -> None:
    """`load_dataset("parquet", data_dir=text/)` reads every file of the folder: an extra
    shard passed `verify --full` because only the listed files were read."""
    folder = tmp_path / "extra"
    shutil.copytree(snapshots["file"] / TEXT_DIR, folder)
    listed = read_release(folder).files[0].path
    extra = folder / Path(listed).with_name("part-00099.parquet")
    shutil.copy(folder / listed, extra)
    (problem,) = check_release(folder, snapshots["file"]).problems
    assert str(extra) in problem and "not listed" in problem
