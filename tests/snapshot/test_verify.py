"""`megacpp verify` and the promotion checks from disk: the round trip decodes documents in
bounded batches and still names the one whose tokens no longer decode to its source text; a
deleted, truncated or unlisted file and a missing `_COMPLETE` each fail, naming the file."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from megacpp_pipeline import cli
from megacpp_pipeline.pipeline.executor import LocalExecutor
from megacpp_pipeline.snapshot import shard_checks, texts, verify
from megacpp_pipeline.snapshot.promote import read_manifest
from megacpp_pipeline.storage.versions import complete_marker
from tests.fixtures.snapshot_fixture import build_snapshot


@pytest.mark.parametrize("batch_tokens", [1 << 20, 64])
def test_round_trip_checks_every_document_in_bounded_batches(tmp_path, monkeypatch, batch_tokens):
    monkeypatch.setattr(texts, "DECODE_BATCH_TOKENS", batch_tokens)
    fixture = build_snapshot(tmp_path / "snap", docs_per_split={"train": 30, "validation": 6})
    manifest = read_manifest(fixture.path)
    out = verify.check_round_trip(fixture.path, manifest, sample=1000)
    assert out.passed, out.problems
    assert out.metrics["documents_checked"] == 36


def test_round_trip_names_the_document_that_no_longer_decodes(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(texts, "DECODE_BATCH_TOKENS", 64)
    fixture = build_snapshot(tmp_path / "snap", docs_per_split={"train": 30, "validation": 6})
    docs_path = fixture.path / "documents.parquet"
    docs = pq.read_table(docs_path)
    sha = docs["content_sha256"].to_pylist()
    sha[17] = "0" * 64  # the recorded source text of doc 17 no longer matches its tokens
    index = docs.schema.get_field_index("content_sha256")
    docs = docs.set_column(index, docs.schema.field(index), pa.array(sha, pa.string()))
    pq.write_table(docs, docs_path)
    out = verify.check_round_trip(fixture.path, read_manifest(fixture.path), sample=1000)
    assert not out.passed
    path = pc.take(docs["path"], [17])[0].as_py()
    assert out.problems == [f"doc 17 ({path}): decoded text differs from the source"]


# --- files that are missing, cut short, unlisted, or a snapshot without its marker ---------
@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_snapshot(
        tmp_path_factory.mktemp("verify") / "snap", docs_per_split={"train": 12, "validation": 4}
    ).path


def megacpp_verify(snapshot: Path) -> tuple[int, str]:
    """`megacpp verify` in this process: its exit code and the last line of its stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["verify", str(snapshot)])
    lines = err.getvalue().strip().splitlines()
    return code, lines[-1] if lines else ""


def damaged(pristine: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "snap"
    shutil.copytree(pristine, copy)
    return copy


def test_the_untouched_snapshot_verifies(pristine: Path) -> None:
    assert megacpp_verify(pristine) == (0, "")


@pytest.mark.parametrize("rel", ["train/part-00000.parquet", "documents.parquet", "tokenizer.json"])
def test_a_deleted_listed_file_fails_verify_naming_it_missing(
    pristine: Path, tmp_path: Path, rel: str
) -> None:
    snap = damaged(pristine, tmp_path)
    (snap / rel).unlink()
    assert megacpp_verify(snap) == (
        1,
        f"megacpp verify: FAILED file_checksums: {snap / rel}: missing",
    )


@pytest.mark.parametrize("rel", ["validation/part-00000.parquet", "pieces.parquet"])
def test_a_truncated_listed_file_fails_verify_naming_its_size(
    pristine: Path, tmp_path: Path, rel: str
) -> None:
    snap = damaged(pristine, tmp_path)
    size = (snap / rel).stat().st_size
    with open(snap / rel, "r+b") as f:
        f.truncate(size // 2)
    code, last = megacpp_verify(snap)
    assert code == 1
    assert last == (
        f"megacpp verify: FAILED file_checksums: {snap / rel}: "
        f"{size // 2} bytes, manifest says {size}"
    )


@pytest.mark.parametrize(
    "rel", ["train/part-00099.parquet", "notes.txt", "extra/dir/leftover.bin", ".hidden"]
)
def test_an_unlisted_extra_file_fails_verify_naming_it(
    pristine: Path, tmp_path: Path, rel: str
) -> None:
    snap = damaged(pristine, tmp_path)
    (snap / rel).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(snap / "train/part-00000.parquet", snap / rel)  # even a valid shard
    assert megacpp_verify(snap) == (
        1,
        f"megacpp verify: FAILED file_checksums: {snap / rel}: not listed in the manifest",
    )


def test_files_under_the_report_folder_are_outside_the_contract(
    pristine: Path, tmp_path: Path
) -> None:
    snap = damaged(pristine, tmp_path)
    (snap / "report").mkdir()
    (snap / "report" / "quality.md").write_text("# derived after promotion\n")
    assert megacpp_verify(snap) == (0, "")


def test_a_snapshot_without_complete_fails_every_check_as_not_a_snapshot(
    pristine: Path, tmp_path: Path
) -> None:
    snap = damaged(pristine, tmp_path)
    (snap / "_COMPLETE").unlink()
    outcomes = verify.verify_snapshot(snap)
    assert [o.name for o in outcomes if o.passed] == []


def test_verify_on_an_asset_version_of_the_store_is_one_line_saying_what_it_is(
    tmp_path: Path,
) -> None:
    """What an operator tries first: the store version's folder instead of the snapshot."""
    import pyarrow as pa

    from megacpp_pipeline.storage.store import ShardStore

    store = ShardStore(str(tmp_path / "data"))
    version = store.begin("packed_rows", None, code_version="t")
    version.table("data", pa.schema([("n", pa.int64())])).write(pa.table({"n": [1, 2]}))
    folder = store.version_dir(version.commit())
    for target in (folder, str(tmp_path)):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(["verify", target])
        assert code == 2 and out.getvalue() == "", out.getvalue()
        [line] = err.getvalue().splitlines()
        assert line.startswith(f"megacpp verify: SnapshotError: {target}: "), line
    assert "an asset version of packed_rows (version" in megacpp_line(folder)
    assert "no _COMPLETE; not a snapshot" in megacpp_line(str(tmp_path))


def megacpp_line(target: str) -> str:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        cli.main(["verify", target])
    return err.getvalue()


@pytest.mark.parametrize("command", ["verify", "inspect", "export-megatron"])
def test_the_other_snapshot_commands_refuse_a_directory_without_complete_in_one_line(
    pristine: Path, tmp_path: Path, command: str
) -> None:
    snap = damaged(pristine, tmp_path)
    (snap / "_COMPLETE").unlink()
    out_arg = ["--out", str(tmp_path / "out")] if command == "export-megatron" else []
    argv = [command, str(snap), *out_arg]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    assert code == 2 and out.getvalue() == ""
    [line] = err.getvalue().splitlines()
    assert line.startswith(f"megacpp {command}: SnapshotError: {snap}: no _COMPLETE; not a snap")


# --- document_consistency: every row against the pieces that say what it holds -------------
def _rewrite_first_train_shard(snap: Path, change, row_group_size: int | None = None) -> None:
    from megacpp_pipeline.snapshot.packed_rows import fixed_list_to_numpy

    path = sorted((snap / "train").glob("part-*.parquet"))[0]
    t = pq.read_table(path)
    seq = read_manifest(snap).seq_len
    columns = {name: t[name] for name in t.column_names}
    arrays = {name: fixed_list_to_numpy(t[name], seq).copy() for name in ("doc_ids", "target_ids")}
    pack_ids = t["pack_id"].to_numpy().copy()
    change(arrays, pack_ids)
    for name, values in arrays.items():
        field = t.schema.field(name)
        flat = pa.array(values.reshape(-1), field.type.value_type)
        columns[name] = pa.FixedSizeListArray.from_arrays(flat, seq)
    columns["pack_id"] = pa.array(pack_ids, t.schema.field("pack_id").type)
    pq.write_table(pa.table(columns, schema=t.schema), path, row_group_size=row_group_size)


def _documents_check(snap: Path) -> verify.CheckOutcome:
    return verify.check_documents(snap, read_manifest(snap))


def test_document_consistency_passes_on_a_sound_snapshot(pristine: Path) -> None:
    out = _documents_check(pristine)
    assert out.passed, out.problems
    assert out.metrics["rows"] > 0


def test_document_consistency_names_a_row_whose_doc_ids_disagree_with_its_pieces(
    pristine: Path, tmp_path: Path
) -> None:
    snap = damaged(pristine, tmp_path)

    def change(arrays, pack_ids):
        arrays["doc_ids"][1, 0] = 9999  # the first token of row 1 now claims another doc

    _rewrite_first_train_shard(snap, change)
    out = _documents_check(snap)
    assert not out.passed
    assert any("doc_ids disagree with pieces.parquet" in p for p in out.problems), out.problems


def test_document_consistency_names_a_target_that_crosses_a_document_boundary(
    pristine: Path, tmp_path: Path
) -> None:
    snap = damaged(pristine, tmp_path)
    pieces = pq.read_table(snap / "pieces.parquet").to_pylist()

    def change(arrays, pack_ids):
        first = next(p for p in pieces if p["pack_id"] == int(pack_ids[0]))
        end = first["row_offset"] + first["length"] - 1
        arrays["target_ids"][0, end] = 7  # the document's last token now predicts the next

    _rewrite_first_train_shard(snap, change)
    out = _documents_check(snap)
    assert any("a target crosses a document boundary" in p for p in out.problems), out.problems


def test_document_consistency_names_a_row_without_pieces(pristine: Path, tmp_path: Path) -> None:
    snap = damaged(pristine, tmp_path)

    def change(arrays, pack_ids):
        pack_ids[0] = 987_654_321

    _rewrite_first_train_shard(snap, change)
    out = _documents_check(snap)
    assert any("row pack_id 987654321 has no pieces" in p for p in out.problems), out.problems


def test_a_shard_of_many_row_groups_is_checked_group_by_group(
    pristine: Path, tmp_path: Path
) -> None:
    # A huge file's window is written a row group at a time and read back the same way:
    # one row per group, every check still passes, and a fault in the last group is found.
    snap = damaged(pristine, tmp_path)
    _rewrite_first_train_shard(snap, lambda arrays, pack_ids: None, row_group_size=1)
    shard = sorted((snap / "train").glob("part-*.parquet"))[0]
    groups = pq.ParquetFile(shard).num_row_groups
    assert groups == pq.read_metadata(shard).num_rows > 2
    manifest = read_manifest(snap)
    for out in (
        _documents_check(snap),
        verify.check_token_ranges(snap, manifest),
        verify.check_round_trip(snap, manifest, sample=1000),
    ):
        assert out.passed, (out.name, out.problems)
    assert verify.check_round_trip(snap, manifest, sample=1000).metrics["documents_checked"] > 0

    def change(arrays, pack_ids):
        arrays["target_ids"][-1, -1] = 10**6  # the last row's last target: outside the vocab
        arrays["doc_ids"][-1, 0] = 9999

    _rewrite_first_train_shard(snap, change, row_group_size=1)
    last = int(pq.read_table(shard, columns=["pack_id"])["pack_id"][-1].as_py())
    ranges = verify.check_token_ranges(snap, manifest)
    assert any("1 target_ids outside the vocabulary" in p for p in ranges.problems), ranges
    docs = _documents_check(snap)
    assert any(f"pack_id {last} doc_ids disagree" in p for p in docs.problems), docs.problems


def test_a_tokenizer_that_is_not_the_manifests_fails_the_round_trip_naming_it(
    pristine: Path, tmp_path: Path
) -> None:
    # the round trip decodes with the snapshot's tokenizer.json only when its bytes are the
    # ones the manifest names; another (here: the same vocabulary, rewritten) is refused
    snap = damaged(pristine, tmp_path)
    manifest = read_manifest(snap)
    assert verify.check_round_trip(snap, manifest, sample=50).passed
    path = snap / "tokenizer.json"
    path.write_text(json.dumps(json.loads(path.read_text()), indent=1))
    out = verify.check_round_trip(snap, manifest, sample=50)
    assert not out.passed
    assert any(f"{path}" in p and "sha256 mismatch" in p for p in out.problems), out.problems


# --- document_consistency: each window of documents.parquet in a task of its own ----------
def _rewrite(path: Path, change) -> None:
    """`path` rewritten after `change` edits its rows (a list of dicts), schema kept."""
    table = pq.read_table(path)
    rows = table.to_pylist()
    change(rows)
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path, row_group_size=4)


def _windowed(pristine: Path, tmp_path: Path, monkeypatch) -> Path:
    """A copy of the fixture checked in windows of 3 documents, with document_files.parquet
    written beside it (the fixture derives it from documents)."""
    from megacpp_pipeline.snapshot.document_files import read_document_files

    monkeypatch.setattr(shard_checks, "DRAW_ROWS", 3)
    snap = damaged(pristine, tmp_path)
    pq.write_table(read_document_files(snap), snap / "document_files.parquet", row_group_size=4)
    return snap


def test_the_windows_of_the_documents_check_add_up_to_the_whole(pristine: Path, monkeypatch):
    whole = _documents_check(pristine)
    monkeypatch.setattr(shard_checks, "DRAW_ROWS", 3)
    assert len(shard_checks.document_windows(pristine / "documents.parquet")) == 8
    for mapper in (shard_checks.inline, LocalExecutor(2).map_light):
        out = verify.check_documents(pristine, read_manifest(pristine), mapper)
        assert out.passed, out.problems
        assert out.metrics == whole.metrics


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda rows: [r for r in rows if r["doc_id"] != 5], "doc 5 has no pieces"),
        (
            lambda rows: [{**r, "doc_id": 99} if r["doc_id"] == 5 else r for r in rows],
            "doc 99 has pieces but is not in documents.parquet",
        ),
        (
            lambda rows: [{**r, "doc_id": -3} if r["doc_id"] == 0 else r for r in rows],
            "doc -3 has pieces but is not in documents.parquet",
        ),
        (
            lambda rows: [
                {**r, "split": "validation" if r["split"] == "train" else "train"}
                if r["doc_id"] == 7
                else r
                for r in rows
            ],
            "doc 7 pieces are in another split than the document",
        ),
        (
            lambda rows: [
                {**r, "piece_index": r["piece_index"] + 1} if r["doc_id"] == 9 else r for r in rows
            ],
            "doc 9 pieces are not 0..n-1",
        ),
        (
            lambda rows: [{**r, "copy": 1} if r["doc_id"] == 2 else r for r in rows],
            "doc 2 copies in pieces.parquet are not 0..draws-1",
        ),
    ],
)
def test_the_documents_check_names_a_document_whose_pieces_are_wrong(
    pristine: Path, tmp_path: Path, monkeypatch, change, expected
) -> None:
    monkeypatch.setattr(shard_checks, "DRAW_ROWS", 3)
    snap = damaged(pristine, tmp_path)
    _rewrite(snap / "pieces.parquet", lambda rows: rows.__setitem__(slice(None), change(rows)))
    out = verify.check_documents(snap, read_manifest(snap), LocalExecutor(2).map_light)
    assert not out.passed
    assert f"documents.parquet: {expected}" in out.problems, out.problems


def test_a_file_listed_in_two_windows_is_found_by_the_ledger_sums(
    pristine: Path, tmp_path: Path, monkeypatch
) -> None:
    # doc 11's file renamed to doc 1's: every window is sound on its own, each source still
    # lists as many files as the ledger keeps, but one file is listed twice, one not at all
    snap = _windowed(pristine, tmp_path, monkeypatch)
    assert verify.check_documents(snap, read_manifest(snap)).passed

    def change(rows):
        first = next(r for r in rows if r["doc_id"] == 1)
        last = next(r for r in rows if r["doc_id"] == 11)
        last.update(source_id=first["source_id"], path=first["path"])

    _rewrite(snap / "document_files.parquet", change)
    out = verify.check_documents(snap, read_manifest(snap), LocalExecutor(2).map_light)
    assert not out.passed
    assert any("but not the same files (one listed twice" in p for p in out.problems), out.problems


def test_a_file_of_a_document_that_is_not_there_is_named(
    pristine: Path, tmp_path: Path, monkeypatch
) -> None:
    snap = _windowed(pristine, tmp_path, monkeypatch)

    def change(rows):
        rows[-1]["doc_id"] = 4242

    _rewrite(snap / "document_files.parquet", change)
    out = verify.check_documents(snap, read_manifest(snap))
    assert any("is in doc 4242, which is not in documents.parquet" in p for p in out.problems), (
        out.problems
    )


def test_pieces_and_files_are_orphans_when_documents_parquet_has_no_rows(
    pristine: Path, tmp_path: Path, monkeypatch
) -> None:
    snap = _windowed(pristine, tmp_path, monkeypatch)
    _rewrite(snap / "documents.parquet", lambda rows: rows.clear())
    assert shard_checks.document_windows(snap / "documents.parquet") == [(-1, 0, 0, 0)]
    out = verify.check_documents(snap, read_manifest(snap), LocalExecutor(2).map_light)
    assert any("has pieces but is not in documents.parquet" in p for p in out.problems)
    assert any("which is not in documents.parquet" in p for p in out.problems), out.problems


# --- ledger_completeness, counted a row group at a time --------------------------------------
@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (  # a drop without its reason
            lambda rows: rows[-1].update(reason=None),
            "files dropped without a reason",
        ),
        (  # a kept file the documents do not hold
            lambda rows: rows.append({**rows[0], "path": "src/extra.cc"}),
            "kept but 16 files in document_files.parquet",
        ),
        (  # a row that is neither kept nor dropped
            lambda rows: rows[0].update(status="pending"),
            "!= kept + dropped",
        ),
    ],
)
def test_the_ledger_check_names_what_does_not_add_up(tmp_path: Path, change, expected) -> None:
    fixture = build_snapshot(
        tmp_path / "snap", docs_per_split={"train": 12, "validation": 4}, row_group_rows=3,
        dropped=4,
    )  # fmt: skip
    manifest = read_manifest(fixture.path)
    assert verify.check_ledger(fixture.path, manifest).passed
    _rewrite(fixture.path / "ledger.parquet", change)
    out = verify.check_ledger(fixture.path, manifest)
    assert not out.passed
    assert any(expected in p for p in out.problems), out.problems


def test_a_marker_that_records_no_manifest_sha256_fails_the_file_checks(tmp_path: Path) -> None:
    """A one-token _COMPLETE vouched for no manifest, and the manifest check was skipped:
    an edited manifest (a forged revision) passed behind it."""
    fixture = build_snapshot(tmp_path / "snap")
    manifest = read_manifest(fixture.path)
    assert verify.check_files(fixture.path, manifest).passed
    (fixture.path / "_COMPLETE").write_text(manifest.snapshot_id + "\n")
    out = verify.check_files(fixture.path, manifest)
    assert not out.passed and "records no manifest sha256" in out.problems[0]


def _rewrite_column(path: Path, name: str, edit) -> None:  # type: ignore[no-untyped-def]
    table = pq.read_table(path)
    seq = table.schema.field(name).type.list_size
    values = table[name].combine_chunks().values.to_numpy(zero_copy_only=False).copy()
    values = edit(values.reshape(-1, seq)).reshape(-1)
    column = pa.FixedSizeListArray.from_arrays(
        pa.array(values, table.schema.field(name).type.value_type), seq
    )
    pq.write_table(table.set_column(table.schema.get_field_index(name), name, column), path)


@pytest.mark.parametrize("tamper", ["target not the next token", "mask of 2", "mask cut"])
def test_targets_and_loss_mask_must_agree_with_the_inputs(tmp_path: Path, tamper: str) -> None:
    """Targets in the vocabulary but not the next input token, a loss_mask of 2, half a
    row's loss masked off: every check passed them, so a packer bug would be promoted."""
    fixture = build_snapshot(tmp_path / "snap")
    manifest = read_manifest(fixture.path)
    shard = fixture.path / manifest.splits["train"].shards[0]
    job = (manifest.vocab_size, manifest.seq_len)
    assert shard_checks.token_problems(job, shard)[1] == []

    def targets(t):  # type: ignore[no-untyped-def]
        at = np.argwhere(t != -100)[0]
        t[tuple(at)] = (t[tuple(at)] + 1) % manifest.vocab_size
        return t

    def mask_two(m):  # type: ignore[no-untyped-def]
        m[m == 1] = 2
        return m

    def mask_cut(m):  # type: ignore[no-untyped-def]
        m[:, : m.shape[1] // 2] = 0
        return m

    column, edit, expected = {
        "target not the next token": ("target_ids", targets, "not the next input token"),
        "mask of 2": ("loss_mask", mask_two, "other than 0 and 1"),
        "mask cut": ("loss_mask", mask_cut, "loss_mask is not where the targets are"),
    }[tamper]
    _rewrite_column(shard, column, edit)
    problems = shard_checks.token_problems(job, shard)[1]
    assert any(expected in p for p in problems), problems


def test_rows_in_the_other_splits_shards_are_named(tmp_path: Path) -> None:
    """Train and validation shards swapped (with a manifest and card made to agree) passed
    every check from disk: the rows were compared with the pieces by pack_id alone."""
    fixture = build_snapshot(tmp_path / "snap")
    manifest = read_manifest(fixture.path)
    assert verify.check_documents(fixture.path, manifest).passed
    splits = dict(manifest.splits)
    splits["train"], splits["validation"] = splits["validation"], splits["train"]
    swapped = manifest.model_copy(update={"splits": splits})
    out = verify.check_documents(fixture.path, swapped)
    assert any("packed for split 'validation', in a 'train' shard" in p for p in out.problems)


def test_documents_of_a_source_the_ledger_does_not_list_are_named(tmp_path: Path) -> None:
    """Kept files were compared with the documents' files only for the sources the ledger
    lists: a document relabelled to a source of its own, with no ledger row, passed."""
    fixture = build_snapshot(tmp_path / "snap")
    manifest = read_manifest(fixture.path)
    assert verify.check_documents(fixture.path, manifest).passed
    source = sorted(manifest.ledger)[0]
    ledger = {s: counts for s, counts in manifest.ledger.items() if s != source}
    out = verify.check_documents(fixture.path, manifest.model_copy(update={"ledger": ledger}))
    assert any(f"{source}: 0 kept files but" in p for p in out.problems), out.problems


def test_verify_by_uri_sees_the_files_the_manifest_does_not_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By URI (file:// takes the path s3:// does) only the manifest's files were fetched,
    so an extra train shard, which the card's `train/*.parquet` makes readers load, failed
    `verify <path>` but passed `verify <uri>`."""
    monkeypatch.setenv("MEGACPP_CACHE_DIR", str(tmp_path / "cache"))
    fixture = build_snapshot(tmp_path / "snap")
    uri = f"file://{fixture.path}"
    assert megacpp_line(uri) == ""
    listed = fixture.path / read_manifest(fixture.path).splits["train"].shards[0]
    shutil.copy(listed, listed.with_name("part-00099.parquet"))
    line = megacpp_line(uri)
    assert "file_checksums" in line and "part-00099.parquet: not listed" in line, line


def test_a_slice_from_offset_zero_gives_only_its_own_rows() -> None:
    """`.values` is the parent's: a slice(0, n) came back with every row of the parent."""
    from megacpp_pipeline.snapshot.packed_rows import fixed_list_to_numpy

    column = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(16, dtype=np.int32)), 4)
    assert fixed_list_to_numpy(column.slice(0, 2), 4).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert fixed_list_to_numpy(column.slice(1, 2), 4).tolist() == [[4, 5, 6, 7], [8, 9, 10, 11]]


@pytest.mark.parametrize("forged", ["snapshot_id", "marker"])
def test_an_id_that_does_not_name_the_snapshots_content_fails_the_file_checks(
    tmp_path: Path, forged: str
) -> None:
    """A manifest whose id was edited (and its marker rewritten to match) passed every check:
    the id is recomputed from the listed files, code version, config and row length, and the
    marker must name the same id."""
    fixture = build_snapshot(tmp_path / "snap")
    manifest = read_manifest(fixture.path)
    assert verify.check_files(fixture.path, manifest).passed
    if forged == "snapshot_id":
        manifest = manifest.model_copy(update={"snapshot_id": "fixture-0123456789abcdef"})
        raw = manifest.model_dump_json(indent=2).encode()
        (fixture.path / "manifest.json").write_bytes(raw)
        (fixture.path / "_COMPLETE").write_bytes(complete_marker(manifest.snapshot_id, raw))
        expected = "does not name its content"
    else:
        raw = (fixture.path / "manifest.json").read_bytes()
        (fixture.path / "_COMPLETE").write_bytes(complete_marker("fixture-0123456789abcdef", raw))
        expected = f"the manifest {manifest.snapshot_id}"
    out = verify.check_files(fixture.path, read_manifest(fixture.path))
    assert not out.passed and any(expected in p for p in out.problems), out.problems
