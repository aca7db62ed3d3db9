"""The Megatron export writes megatron-core's MMIDIDX bytes exactly, one whole document per
sequence, and both our reader and (when installed) megatron-core's read it back."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megacpp_pipeline.loader import SnapshotIncompleteError, read_snapshot_manifest
from megacpp_pipeline.snapshot.megatron import (
    EXPORTED,
    INDEX_MAGIC,
    IndexedDatasetFormatError,
    IndexedDatasetReader,
    MegatronExportError,
    export_once,
    export_snapshot,
    megatron_token_dtype,
    write_indexed_dataset,
)
from megacpp_pipeline.storage.versions import complete_marker
from tests.fixtures.snapshot_fixture import SnapshotFixture, build_snapshot


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> SnapshotFixture:
    # small shards so that many documents have pieces in different shards
    return build_snapshot(
        tmp_path_factory.mktemp("snap") / "snapshot", rows_per_shard=5, row_group_rows=2
    )


def test_index_header_matches_megatron_core_byte_for_byte(
    snapshot: SnapshotFixture, tmp_path: Path
) -> None:
    export_snapshot(snapshot.path, tmp_path / "train")
    idx = (tmp_path / "train.idx").read_bytes()
    docs = len(snapshot.splits["train"].doc_ids)
    assert idx[:9] == INDEX_MAGIC == b"MMIDIDX\x00\x00"
    assert struct.unpack_from("<Q", idx, 9) == (1,)
    assert idx[17] == 8  # uint16: megatron-core's optimal dtype for a vocabulary under 65500
    assert struct.unpack_from("<QQ", idx, 18) == (docs, docs + 1)
    assert len(idx) == 34 + docs * 4 + docs * 8 + (docs + 1) * 8
    lengths = np.frombuffer(idx, "<i4", docs, 34)
    pointers = np.frombuffer(idx, "<i8", docs, 34 + 4 * docs)
    document_indices = np.frombuffer(idx, "<i8", docs + 1, 34 + 12 * docs)
    assert pointers[0] == 0 and np.array_equal(np.diff(pointers), lengths[:-1] * 2)
    assert np.array_equal(document_indices, np.arange(docs + 1))
    assert (tmp_path / "train.bin").stat().st_size == int(lengths.sum()) * 2


def test_every_document_comes_back_whole_in_doc_id_order(
    snapshot: SnapshotFixture, tmp_path: Path
) -> None:
    summary = export_snapshot(snapshot.path, tmp_path / "validation", split="validation")
    with IndexedDatasetReader(tmp_path / "validation") as reader:
        doc_ids = snapshot.splits["validation"].doc_ids
        assert reader.document_count == len(reader) == len(doc_ids) == summary.documents
        assert reader.total_tokens == summary.tokens
        for position, doc_id in enumerate(doc_ids):
            np.testing.assert_array_equal(reader[position], snapshot.documents[int(doc_id)])
            np.testing.assert_array_equal(
                reader.document(position), snapshot.documents[int(doc_id)]
            )


def test_documents_whose_pieces_sit_in_different_shards_are_reassembled(
    snapshot: SnapshotFixture, tmp_path: Path
) -> None:
    pieces = pq.read_table(snapshot.path / "pieces.parquet").to_pydict()
    shard_of_pack = {}
    for relpath in snapshot.splits["train"].shards:
        for pack_id in pq.read_table(snapshot.path / relpath, columns=["pack_id"])["pack_id"]:
            shard_of_pack[pack_id.as_py()] = relpath
    shards_per_doc: dict[int, set[str]] = {}
    for doc_id, pack_id in zip(pieces["doc_id"], pieces["pack_id"], strict=True):
        if pack_id in shard_of_pack:
            shards_per_doc.setdefault(doc_id, set()).add(shard_of_pack[pack_id])
    split_docs = [doc for doc, shards in shards_per_doc.items() if len(shards) > 1]
    assert split_docs, "the fixture should spread some document over several shards"

    export_snapshot(snapshot.path, tmp_path / "train")
    reader = IndexedDatasetReader(tmp_path / "train")
    order = list(snapshot.splits["train"].doc_ids)
    for doc_id in split_docs:
        np.testing.assert_array_equal(reader[order.index(doc_id)], snapshot.documents[doc_id])
    tokens = sum(len(snapshot.documents[int(d)]) for d in order)
    assert reader.total_tokens == tokens


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 50), max_size=20),
    dtype=st.sampled_from([np.uint16, np.int32, np.uint8, np.int64]),
    seed=st.integers(0, 2**16),
)
def test_written_sequences_read_back_identically(
    tmp_path_factory: pytest.TempPathFactory, lengths: list[int], dtype: type, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    high = min(np.iinfo(dtype).max, 2**31 - 1)
    sequences: list[np.ndarray] = [rng.integers(0, high, size=n).astype(dtype) for n in lengths]
    prefix = tmp_path_factory.mktemp("roundtrip") / "data"
    if not sum(lengths):  # megatron-core cannot map an empty .bin: nothing is written
        with pytest.raises(MegatronExportError, match="no tokens to write"):
            write_indexed_dataset(prefix, iter(sequences), dtype)
        assert list(prefix.parent.iterdir()) == []
        return
    summary = write_indexed_dataset(prefix, iter(sequences), dtype)
    assert summary.tokens == sum(lengths)
    reader = IndexedDatasetReader(prefix)
    assert len(reader) == reader.document_count == len(sequences)
    assert reader.dtype == np.dtype(dtype)
    for got, want in zip((reader[i] for i in range(len(reader))), sequences, strict=True):
        np.testing.assert_array_equal(got, want)


def test_token_ids_that_do_not_fit_the_dtype_are_refused(tmp_path: Path) -> None:
    with pytest.raises(MegatronExportError, match="beyond uint16"):
        write_indexed_dataset(tmp_path / "big", [np.array([1, 70000])], np.uint16)
    assert not list(tmp_path.iterdir())  # nothing half-written is left behind


def test_megatron_dtype_follows_the_vocabulary_size() -> None:
    assert megatron_token_dtype(32768) == np.uint16
    assert megatron_token_dtype(65500) == np.int32
    assert megatron_token_dtype(None) == np.int32


def _record_again(snapshot: Path, rel: str) -> None:
    """Record a rewritten file's size and sha256 in the snapshot manifest, as a (buggy)
    builder would have: the export's own consistency checks are what is tested then."""
    manifest = json.loads((snapshot / "manifest.json").read_text())
    data = (snapshot / rel).read_bytes()
    for entry in manifest["files"]:
        if entry["path"] == rel:
            entry.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    (snapshot / "manifest.json").write_text(json.dumps(manifest))
    marker = complete_marker(manifest["snapshot_id"], (snapshot / "manifest.json").read_bytes())
    (snapshot / "_COMPLETE").write_bytes(marker)


@pytest.mark.parametrize("rel", ["train/part-00000.parquet", "pieces.parquet"])
def test_a_snapshot_file_changed_after_promotion_is_not_exported(tmp_path: Path, rel: str) -> None:
    fixture = build_snapshot(tmp_path / "snap")
    recorded = next(
        f
        for f in json.loads((fixture.path / "manifest.json").read_text())["files"]
        if f["path"] == rel
    )
    data = bytearray((fixture.path / rel).read_bytes())
    data[len(data) // 2] ^= 0x01
    (fixture.path / rel).write_bytes(bytes(data))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(MegatronExportError) as caught:
        export_snapshot(fixture.path, out / "train")
    message = str(caught.value)
    assert str(fixture.path / rel) in message and recorded["sha256"] in message, message
    assert "changed after promotion" in message
    assert not list(out.iterdir())


def test_a_piece_whose_row_is_missing_fails_the_export_naming_the_document(
    tmp_path: Path,
) -> None:
    fixture = build_snapshot(tmp_path / "snap")
    pieces = pq.read_table(fixture.path / "pieces.parquet")
    pack_ids = pc.if_else(
        pc.equal(pieces.column("pack_id"), 0), pa.scalar(10**9, pa.int64()), pieces["pack_id"]
    )
    pieces = pieces.set_column(pieces.schema.get_field_index("pack_id"), "pack_id", pack_ids)
    pq.write_table(pieces.cast(pieces.schema), fixture.path / "pieces.parquet")
    _record_again(fixture.path, "pieces.parquet")
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(MegatronExportError, match="pack_id 1000000000 found 0 times"):
        export_snapshot(fixture.path, out / "train")
    assert not list(out.iterdir())


def test_pieces_that_disagree_with_documents_parquet_fail_the_export(tmp_path: Path) -> None:
    fixture = build_snapshot(tmp_path / "snap")
    pieces = pq.read_table(fixture.path / "pieces.parquet")
    pq.write_table(pieces.slice(1), fixture.path / "pieces.parquet")
    _record_again(fixture.path, "pieces.parquet")
    first_doc = pieces["doc_id"][0].as_py()
    with pytest.raises(MegatronExportError, match=f"doc_id {first_doc}"):
        export_snapshot(fixture.path, tmp_path / "train")


def test_an_incomplete_snapshot_is_not_exported(tmp_path: Path) -> None:
    fixture = build_snapshot(tmp_path / "snap", complete=False)
    with pytest.raises(SnapshotIncompleteError):
        export_snapshot(fixture.path, tmp_path / "train")


def test_reader_names_the_field_of_a_damaged_index(
    snapshot: SnapshotFixture, tmp_path: Path
) -> None:
    export_snapshot(snapshot.path, tmp_path / "train")
    idx = tmp_path / "train.idx"
    good = idx.read_bytes()
    idx.write_bytes(b"NOTMEGA\x00\x00" + good[9:])
    with pytest.raises(IndexedDatasetFormatError, match="magic"):
        IndexedDatasetReader(tmp_path / "train")
    idx.write_bytes(good[:-8])
    with pytest.raises(IndexedDatasetFormatError, match="size"):
        IndexedDatasetReader(tmp_path / "train")
    idx.write_bytes(good)
    with (tmp_path / "train.bin").open("ab") as data:
        data.write(b"\0\0")
    with pytest.raises(IndexedDatasetFormatError, match="size"):
        IndexedDatasetReader(tmp_path / "train")


def test_a_sample_read_is_the_slice_of_its_document(
    snapshot: SnapshotFixture, tmp_path: Path
) -> None:
    export_snapshot(snapshot.path, tmp_path / "train")
    reader = IndexedDatasetReader(tmp_path / "train")
    rng = np.random.default_rng(0)
    for index in rng.integers(0, len(reader), size=50).tolist():
        size = len(reader[index])
        offset = int(rng.integers(0, size))
        length = int(rng.integers(0, size - offset + 1))
        np.testing.assert_array_equal(
            reader.get(index, offset, length), reader[index][offset : offset + length]
        )
        np.testing.assert_array_equal(reader.get(index, offset), reader[index][offset:])
    with pytest.raises(IndexError, match="tokens"):
        reader.get(0, 1, len(reader[0]))
    with pytest.raises(IndexError, match="sequence"):
        reader.get(len(reader))


def test_megatron_core_reads_the_export(snapshot: SnapshotFixture, tmp_path: Path) -> None:
    indexed_dataset = pytest.importorskip(
        "megatron.core.datasets.indexed_dataset", reason="megatron-core (optional extra)"
    )
    export_snapshot(snapshot.path, tmp_path / "train")
    dataset = indexed_dataset.IndexedDataset(str(tmp_path / "train"))
    ours = IndexedDatasetReader(tmp_path / "train")
    assert len(dataset) == len(ours)
    assert len(dataset.document_indices) - 1 == ours.document_count
    assert int(dataset.sequence_lengths.sum()) == ours.total_tokens
    assert dataset.index.dtype == ours.dtype
    for i in range(len(ours)):
        np.testing.assert_array_equal(dataset[i], ours[i])
    # training samples: a window of a document, as GPTDataset cuts them
    rng = np.random.default_rng(1)
    for i in rng.integers(0, len(ours), size=50).tolist():
        offset = int(rng.integers(0, len(ours[i])))
        length = min(snapshot.seq_len + 1, len(ours[i]) - offset)
        np.testing.assert_array_equal(dataset.get(i, offset, length), ours.get(i, offset, length))


def test_an_export_is_taken_again_only_while_it_is_the_bytes_its_marker_lists(
    tmp_path: Path,
) -> None:
    """export_once keeps an export whose marker names this snapshot, this code and the
    sha256 of every .bin/.idx; a file changed, a file planted or an old plain marker is
    exported again, and the result is the same bytes."""
    fixture = build_snapshot(tmp_path / "snap")
    out = tmp_path / "export"
    assert export_once(fixture.path, out) is True
    snapshot_id = read_snapshot_manifest(fixture.path).snapshot_id
    first = {
        p.relative_to(out).as_posix(): p.read_bytes()
        for p in out.rglob("*")
        if p.suffix in (".bin", ".idx")
    }
    marker = json.loads((out / EXPORTED).read_text())
    assert marker["snapshot_id"] == snapshot_id and set(marker["files"]) == set(first)
    assert {k: hashlib.sha256(v).hexdigest() for k, v in first.items()} == marker["files"]
    assert export_once(fixture.path, out) is False  # whole: taken as it is
    binary = next(out.rglob("*.bin"))
    data = bytearray(binary.read_bytes())
    data[-1] ^= 0x01
    binary.write_bytes(bytes(data))
    assert export_once(fixture.path, out) is True
    (binary.parent / "planted.idx").write_bytes(b"MMIDIDX")
    assert export_once(fixture.path, out) is True
    assert not (binary.parent / "planted.idx").exists()
    (out / EXPORTED).write_text(snapshot_id + "\n")  # the marker older code wrote
    assert export_once(fixture.path, out) is True
    again = {
        p.relative_to(out).as_posix(): p.read_bytes()
        for p in out.rglob("*")
        if p.suffix in (".bin", ".idx")
    }
    assert again == first
