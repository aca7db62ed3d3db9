"""Promotion, on snapshots the library builds itself (a trained tokenizer, the packer, then
build_snapshot with every promotion check as its gate): a split with no rows goes through
packing, promotion and the loader as an empty split, and the Megatron export refuses it in
one line instead of writing a pair megatron-core cannot open; while a snapshot is being
promoted, readers see the previous one whole and never the build."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from megacpp_pipeline import cli
from megacpp_pipeline.core.ledger import LEDGER_SCHEMA
from megacpp_pipeline.core.schemas import DOCUMENTS, git_blob_sha, text_sha256
from megacpp_pipeline.corpus import packing
from megacpp_pipeline.corpus.repository import file_document_files
from megacpp_pipeline.corpus.tokenizer import (
    TokenizerConfig,
    save_tokenizer,
    special_ids,
    train_tokenizer,
)
from megacpp_pipeline.loader import PackedRowsLoader
from megacpp_pipeline.pipeline.executor import LocalExecutor
from megacpp_pipeline.snapshot import megatron, verify
from megacpp_pipeline.snapshot.promote import (
    SINGLE_FILES,
    SnapshotConfig,
    SnapshotParts,
    build_snapshot,
    final_ledger,
    latest_snapshot,
    read_manifest,
)
from megacpp_pipeline.snapshot.streams import OutOfOrderError

SEQ_LEN = 64
LEDGER_STAGE = "raw_files"
# The smoke read takes 2 batches of 2 rows from each split that has rows.
CHECKS = SnapshotConfig(smoke_batches=2, smoke_batch_size=2)


def cpp_file(i: int) -> str:
    return (
        f"// SPDX-License-Identifier: MIT\n#pragma once\nnamespace edge{i} {{\n"
        f"inline int twice_{i}(int v) {{ return v * {i + 2}; }}\n"
        f"struct Box{i} {{ int value = {i}; }};\n}}  // namespace edge{i}\n"
    )


def snapshot_parts(work: Path, splits: dict[str, int], name: str = "edge") -> SnapshotParts:
    """Everything build_snapshot takes, made by the library: `splits` says how many files
    each split gets (0 for an empty split)."""
    files = [
        (split, f"include/edge/{split}_{k}.hpp", cpp_file(100 * n + k))
        for n, (split, count) in enumerate(splits.items())
        for k in range(count)
    ]
    texts = [text for _, _, text in files] or [cpp_file(0)]
    tok = train_tokenizer(texts, TokenizerConfig(vocab_size=320, min_frequency=1))
    info = save_tokenizer(tok, work / "tokenizer.json")
    ids = [np.array(tok.encode(text).ids, dtype=np.int32) for _, _, text in files]
    documents = pa.Table.from_pylist(
        [
            {
                "doc_id": i,
                "source_id": "edge",
                "path": path,
                "revision": "0" * 40,
                "blob_sha": git_blob_sha(text.encode()),
                "content_sha256": text_sha256(text),
                "license_expression": "MIT",
                "license_source": "file",
                "structure_source": "syntax",
                "split": split,
                "num_files": 1,
                "num_tokens": len(ids[i]),
            }
            for i, (split, path, text) in enumerate(files)
        ],
        schema=DOCUMENTS,
    )
    to_pack = documents.select(["doc_id", "split"]).append_column(
        "token_ids", pa.array(ids, pa.list_(pa.int32()))
    )
    to_pack = to_pack.append_column(
        "chunk_kind", pa.array([np.zeros(len(t), np.uint8) for t in ids], pa.list_(pa.uint8()))
    )
    rows: dict[str, list[Path]] = {split: [] for split in splits}
    pieces = []
    config = packing.PackingConfig(seq_len=SEQ_LEN, window_docs=4)
    for batch in packing.pack([to_pack], config, special_ids()):
        path = work / f"{batch.split}-{len(rows[batch.split]):03d}.parquet"
        pq.write_table(batch.rows, path)
        rows[batch.split].append(path)
        pieces.append(batch.pieces)
    ledger = pa.Table.from_pylist(
        [
            {"source_id": "edge", "path": path, "stage": LEDGER_STAGE, "status": "kept"}
            for _, path, _ in files
        ],
        schema=LEDGER_SCHEMA,
    )
    # the streams come in document order, the ledger already final (as the stage makes them)
    in_order = pa.concat_tables(pieces).sort_by(
        [("doc_id", "ascending"), ("piece_index", "ascending")]
    )
    final = final_ledger([ledger], file_document_files(documents), LEDGER_STAGE)
    return SnapshotParts(
        name=name, seq_len=SEQ_LEN, vocab_size=info.vocab_size,
        tokenizer_json=(work / "tokenizer.json").read_bytes(),
        tokenizer_info=info.model_dump(), rows=rows, documents=documents.sort_by("doc_id"),
        pieces=[in_order], ledger=[final], ledger_stages=[LEDGER_STAGE], inputs={},
        code_version=name, config_hash="0" * 64,
    )  # fmt: skip


def every_check(build_dir: Path) -> list[str]:
    """The promotion gate the snapshot stage runs: all eight checks, failures named."""
    outcomes = [verify.run_check(name, build_dir, CHECKS) for name in verify.ALL_CHECKS]
    return [f"{o.name}: {o.problems[0]}" for o in outcomes if not o.passed]


def megacpp(argv: list[str]) -> tuple[int, str]:
    """The library's `megacpp` commands in this process: exit code and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    return code, err.getvalue()


def megacpp_verify(snapshot: Path) -> tuple[int, str]:
    return megacpp(["verify", str(snapshot)])


# --- a split with no rows ------------------------------------------------------------------
@pytest.mark.parametrize("empty", ["validation", "train"])
def test_a_split_with_no_rows_is_promoted_and_read_as_empty_and_its_export_refused_in_a_line(
    tmp_path: Path, empty: str
) -> None:
    full = "train" if empty == "validation" else "validation"
    work = tmp_path / "work"
    work.mkdir()
    parts = snapshot_parts(work, {full: 5, empty: 0})
    assert parts.rows[empty] == [] and parts.rows[full]  # the packer gave the split nothing

    snap = build_snapshot(tmp_path / "data", parts, gate=every_check)  # all eight checks pass
    manifest = read_manifest(snap)
    assert manifest.splits[empty].model_dump() == {
        "rows": 0, "documents": 0, "tokens": 0, "shards": [], "sequences": 0
    }  # fmt: skip
    assert manifest.splits[full].documents == 5
    assert megacpp_verify(snap) == (0, "")

    loader = PackedRowsLoader(snap, split=empty, batch_size=2, cache_dir=tmp_path / "cache")
    try:
        assert len(loader) == 0 and list(loader) == []
    finally:
        loader.close()

    # nothing to train on, and megatron-core cannot map an empty .bin: refused, not written
    with pytest.raises(megatron.MegatronExportError, match=f"splits.{empty}: 0 documents"):
        megatron.export_snapshot(snap, tmp_path / "mega" / empty, split=empty)
    code, err = megacpp(["export-megatron", str(snap), "--out", str(tmp_path / "cli"),
                         "--split", empty])  # fmt: skip
    assert code == 2 and err.strip().splitlines() == [
        f"megacpp export-megatron: MegatronExportError: {snap}: splits.{empty}: 0 documents, "
        "no tokens to write: megatron-core cannot memory-map an empty .bin"
    ]
    exports = [p for p in tmp_path.rglob("*") if p.suffix in (".bin", ".idx", ".tmp")]
    assert exports == []
    summary = megatron.export_snapshot(snap, tmp_path / "mega" / full, split=full)
    assert summary.documents == 5 and summary.tokens == manifest.splits[full].tokens


# --- readers while a snapshot is being promoted --------------------------------------------
class _HeldPromotion:
    """build_snapshot in a thread, held at its gate (the finished build directory, with its
    `_COMPLETE`, not yet renamed into place) until `release`."""

    def __init__(self, root: Path, parts: SnapshotParts) -> None:
        self.at_gate, self.release = threading.Event(), threading.Event()
        self.build_dir: Path | None = None
        self.result: list[Path | BaseException] = []
        self.thread = threading.Thread(target=self._run, args=(root, parts))

    def _gate(self, build_dir: Path) -> list[str]:
        failures = every_check(build_dir)
        self.build_dir = build_dir
        self.at_gate.set()
        self.release.wait(timeout=300)  # a hang guard; the test releases it
        return failures

    def _run(self, root: Path, parts: SnapshotParts) -> None:
        try:
            self.result.append(build_snapshot(root, parts, gate=self._gate))
        except BaseException as e:  # re-raised by finish()
            self.result.append(e)

    def __enter__(self) -> _HeldPromotion:
        self.thread.start()
        assert self.at_gate.wait(timeout=300), self.result
        return self

    def finish(self) -> Path:
        self.release.set()
        self.thread.join(timeout=300)
        (result,) = self.result
        if isinstance(result, BaseException):
            raise result
        return result

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.thread.join(timeout=300)


@pytest.fixture
def first_and_next(tmp_path: Path) -> tuple[Path, Path, SnapshotParts]:
    """A promoted snapshot in tmp_path/data, and the parts of a different next one."""
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    first = build_snapshot(
        tmp_path / "data", snapshot_parts(tmp_path / "a", {"train": 4, "validation": 2})
    )
    following = snapshot_parts(tmp_path / "b", {"train": 6, "validation": 2})
    return tmp_path / "data", first, following


def test_while_a_snapshot_is_promoted_readers_see_the_previous_one_whole(
    tmp_path: Path, first_and_next: tuple[Path, Path, SnapshotParts]
) -> None:
    root, first, following = first_and_next
    with _HeldPromotion(root, following) as held:
        assert held.build_dir is not None and (held.build_dir / "_COMPLETE").exists()
        listed = sorted(p.name for p in (root / "snapshots").iterdir())
        assert listed == sorted([first.name, held.build_dir.name])  # nothing else yet
        assert latest_snapshot(root, "edge") == first
        assert megacpp_verify(first) == (0, "")
        loader = PackedRowsLoader(first, split="train", batch_size=2, cache_dir=tmp_path / "c")
        try:
            assert len(list(loader)) == len(loader) > 0
        finally:
            loader.close()
        second = held.finish()
    assert second != first and latest_snapshot(root, "edge") == second
    assert megacpp_verify(second) == (0, "") and megacpp_verify(first) == (0, "")
    assert [p.name for p in (root / "snapshots").glob(".building-*")] == []


def test_while_a_snapshot_is_promoted_the_latest_of_any_name_is_still_the_previous_one(
    first_and_next: tuple[Path, Path, SnapshotParts],
) -> None:
    root, first, following = first_and_next
    with _HeldPromotion(root, following) as held:
        during = latest_snapshot(root)
        held.finish()
    assert during == first, during


# --- the final ledger ---------------------------------------------------------------------


def _row(path: str, stage: str, status: str, **rest: str | None) -> dict[str, str | None]:
    return {"source_id": "edge", "path": path, "stage": stage, "status": status, **rest}


def test_the_final_ledger_takes_each_files_first_drop_its_document_or_says_unaccounted():
    collected = [
        _row("a.hpp", "raw_files", "kept", sha256="1" * 64),
        _row("b.hpp", "raw_files", "kept"),
        _row("c.hpp", "raw_files", "kept"),
        _row("d.bin", "raw_files", "dropped", reason="binary", detail="NUL bytes"),
        _row("e.hpp", "raw_files", "kept"),
    ]
    later = [  # stage order: quality's drop of b.hpp comes first and counts
        _row("b.hpp", "quality_files", "dropped", reason="low_quality", detail="rule"),
        _row("c.hpp", "licensed_files", "dropped", reason="license", license_expression="GPL"),
        _row("b.hpp", "deduped_files", "dropped", reason="near_duplicate", dup_of="edge:a.hpp"),
    ]
    files = pa.table({"source_id": ["edge"], "path": ["a.hpp"], "license_expression": ["MIT"]})
    ledger = pa.Table.from_pylist(collected + later, schema=LEDGER_SCHEMA)
    final = final_ledger([ledger], files, "raw_files").to_pylist()
    assert [r["path"] for r in final] == ["a.hpp", "b.hpp", "c.hpp", "d.bin", "e.hpp"]
    by = {r["path"]: r for r in final}
    assert (by["a.hpp"]["stage"], by["a.hpp"]["status"]) == ("snapshot", "kept")
    assert by["a.hpp"]["license_expression"] == "MIT" and by["a.hpp"]["sha256"] == "1" * 64
    assert (by["b.hpp"]["stage"], by["b.hpp"]["reason"], by["b.hpp"]["dup_of"]) == (
        "quality_files",
        "low_quality",
        None,
    )
    assert (by["c.hpp"]["status"], by["c.hpp"]["license_expression"]) == ("dropped", "GPL")
    assert (by["d.bin"]["stage"], by["d.bin"]["reason"]) == ("raw_files", "binary")
    # kept by every stage yet in no document: dropped, and said to be unaccounted for
    assert (by["e.hpp"]["status"], by["e.hpp"]["reason"]) == ("dropped", "unaccounted")


# --- the single files, written side by side -------------------------------------------------


def _opened_afresh(parts: SnapshotParts) -> SnapshotParts:
    """The same parts with each stream given as a function that opens it, as the stage
    gives them (a generator each time: a stream read by two writers is opened twice)."""

    def opener(tables: object) -> object:
        listed = list(tables) if not isinstance(tables, pa.Table) else [tables]
        return lambda: (t for t in listed)

    return dataclasses.replace(
        parts,
        documents=opener(parts.documents),
        pieces=opener(parts.pieces),
        ledger=opener(parts.ledger),
    )


def test_the_single_files_written_by_forked_workers_are_the_ones_one_process_writes(
    tmp_path: Path,
) -> None:
    """documents, pieces, document_files and the ledger are each written by a task of the
    mapper that opens the streams it needs itself: forked workers give byte for byte the
    files (and so the snapshot id) one process gives, and each writer's CPU is reported."""
    (tmp_path / "w").mkdir()
    parts = snapshot_parts(tmp_path / "w", {"train": 5, "validation": 2})
    alone = build_snapshot(tmp_path / "one", parts, gate=every_check)
    figures: dict[str, float] = {}
    forked = build_snapshot(
        tmp_path / "forked", _opened_afresh(parts), gate=every_check,
        mapper=LocalExecutor(2, cap=False).map_light, figures=figures,
    )  # fmt: skip
    assert forked.name == alone.name
    a, b = read_manifest(alone), read_manifest(forked)
    assert [(f.path, f.sha256, f.rows) for f in a.files] == [
        (f.path, f.sha256, f.rows) for f in b.files
    ]
    assert a.splits == b.splits and a.ledger == b.ledger and a.sources == b.sources
    assert sorted(figures) == sorted(SINGLE_FILES) and all(s >= 0 for s in figures.values())


def test_a_writer_that_meets_documents_out_of_order_fails_the_build_naming_them(
    tmp_path: Path,
) -> None:
    (tmp_path / "w").mkdir()
    parts = snapshot_parts(tmp_path / "w", {"train": 5, "validation": 2})
    documents = parts.documents
    assert isinstance(documents, pa.Table)
    backwards = dataclasses.replace(parts, documents=[documents.slice(3), documents.slice(0, 3)])
    with pytest.raises(OutOfOrderError, match="documents: rows are not in doc_id order"):
        build_snapshot(
            tmp_path / "data", _opened_afresh(backwards),
            mapper=LocalExecutor(2, cap=False).map_light,
        )  # fmt: skip
    assert list((tmp_path / "data" / "snapshots").iterdir()) == []  # no build left behind
