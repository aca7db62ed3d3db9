"""Text written once (storage/text_refs.py): a version whose rows keep their input's text
names the shard that holds it instead of writing it again; every read puts it back,
verified, and pruning keeps the holder while such a version is there."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megacpp_pipeline.storage import slices, text_refs
from megacpp_pipeline.storage.store import (
    HOLDS,
    Manifest,
    ShardStore,
    ShardVerificationError,
    StoreError,
)
from megacpp_pipeline.storage.versions import TEXT, TEXT_AT, TextHolder

SCHEMA = pa.schema(
    [
        pa.field("path", pa.string(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("content_sha256", pa.string(), nullable=False),
        pa.field("lines", pa.int32(), nullable=False),
    ]
)


def _files(texts: dict[str, str]) -> pa.Table:
    return pa.table(
        {
            "path": list(texts),
            "text": list(texts.values()),
            "content_sha256": [hashlib.sha256(t.encode()).hexdigest() for t in texts.values()],
            "lines": [t.count("\n") for t in texts.values()],
        },
        schema=SCHEMA,
    )


TEXTS = {
    f"src/part_{i:02d}.cpp": f"// part {i}\nint f{i}() {{ return {i}; }}\n" + "x" * i * 7
    for i in range(30)
}


def _holder_version(store: ShardStore, asset: str = "normalized") -> Manifest:
    """A version that holds its text, in three shards."""
    with store.begin(asset, "src", code_version="c1") as v:
        table = _files(TEXTS)
        for lo in (0, 10, 20):
            v.table("data", SCHEMA).write(table.slice(lo, 10))
            v.table("data", SCHEMA).flush()
        return v.commit()


def _gate_version(
    store: ShardStore,
    source: Manifest,
    keep: list[str],
    change: dict[str, str] | None = None,
    asset: str = "classified",
) -> Manifest:
    """A version of a gate that keeps the files `keep` (with `change`d texts), written as
    file_stage writes: its input read located, the kept rows by reference."""
    info = source.tables["data"]
    vdir = store.version_dir(source)
    pieces = [slices.Piece(vdir, s, 0, s.rows) for s in info.shards]
    table, places = slices.read_located(store, pieces)
    kept = table.filter(pa.compute.is_in(table["path"], pa.array(keep)))
    for path, text in (change or {}).items():
        i = kept["path"].to_pylist().index(path)
        texts = kept["text"].to_pylist()
        texts[i] = text
        hashes = kept["content_sha256"].to_pylist()
        hashes[i] = hashlib.sha256(text.encode()).hexdigest()
        kept = kept.set_column(1, SCHEMA.field("text"), pa.array(texts, pa.string()))
        kept = kept.set_column(2, SCHEMA.field("content_sha256"), pa.array(hashes))
    with store.begin(asset, "src", code_version="c1") as v:
        out, holders, _ = text_refs.by_reference(kept, table, places)
        shard, written = v.uploader.write_parquet("part-00000.parquet", out)
        shard.text_from = holders
        v.table("data", SCHEMA).adopt(shard, written)
        return v.commit()


def test_a_gate_that_keeps_the_text_writes_none_of_it_and_reads_back_the_same(
    tmp_path: Path,
) -> None:
    store = ShardStore(str(tmp_path / "data"))
    normalized = _holder_version(store)
    keep = [p for i, p in enumerate(TEXTS) if i % 3 != 1]
    classified = _gate_version(store, normalized, keep)
    shard = classified.tables["data"].shards[0]
    raw = pq.read_table(f"{store.version_dir(classified)}/{shard.path}")
    assert raw[TEXT].null_count == raw.num_rows == len(keep)  # no text written
    assert {h.path for h in shard.text_from or []} == {
        s.path for s in normalized.tables["data"].shards
    }
    got = store.read_table(classified)
    assert got.schema == SCHEMA
    assert got.equals(_files({p: TEXTS[p] for p in keep}))
    # a reader of a few columns gets them without the text's holders being read
    few = store.read_shard(classified, shard, ["path", "lines"])
    assert few.column_names == ["path", "lines"]
    # rows read from the middle of the shard
    part = store.read_shard(classified, shard, ["path", "text"], rows=(5, 9))
    assert part["text"].to_pylist() == [TEXTS[p] for p in keep[5:9]]


def test_a_changed_text_is_written_and_the_next_gate_names_the_shard_that_holds_each_row(
    tmp_path: Path,
) -> None:
    store = ShardStore(str(tmp_path / "data"))
    normalized = _holder_version(store)
    changed = {"src/part_04.cpp": "int f4() { return 4; } // [REDACTED]\n"}
    scrubbed = _gate_version(store, normalized, list(TEXTS), changed, asset="scrubbed")
    shard = scrubbed.tables["data"].shards[0]
    raw = pq.read_table(f"{store.version_dir(scrubbed)}/{shard.path}")
    assert raw[TEXT].null_count == len(TEXTS) - 1
    assert raw.filter(pa.compute.is_valid(raw[TEXT]))["path"].to_pylist() == ["src/part_04.cpp"]
    assert raw.schema.names == [*SCHEMA.names, TEXT_AT]
    # the next gate reads both kinds of row and names each one's holder: one hop each
    deduped = _gate_version(store, scrubbed, ["src/part_03.cpp", "src/part_04.cpp"], asset="dd")
    d_shard = deduped.tables["data"].shards[0]
    raw = pq.read_table(f"{store.version_dir(deduped)}/{d_shard.path}")
    assert raw[TEXT].null_count == 2
    assert {h.dir.split("/")[1] for h in d_shard.text_from or []} == {"normalized", "scrubbed"}
    assert store.read_table(deduped)["text"].to_pylist() == [
        TEXTS["src/part_03.cpp"],
        *changed.values(),
    ]


def test_a_row_is_matched_by_its_text_not_only_its_path() -> None:
    """Two input rows with one path (a JSONL export can have that): a kept row names a
    holder row only where the text is the same; a changed row is written."""
    texts = _files({"a.cpp": "int a;\n", "b.cpp": "int b;\n"})
    twice = pa.concat_tables(
        [texts, texts.set_column(0, SCHEMA.field("path"), pa.array(["b.cpp", "a.cpp"]))]
    )
    holder = TextHolder(dir="assets/x/_/v", path="part-00000.parquet", rows=4, bytes=1, sha256="0")
    places = text_refs.TextPlaces.rows_of(holder, 0, 4)
    kept = twice.slice(2, 2)  # rows "b.cpp" -> "int a;", "a.cpp" -> "int b;"
    out, holders, at = text_refs.by_reference(kept, twice, places)
    # index_in finds the first "b.cpp" (text "int b;"): another hash, so it is written
    assert at.tolist() == [-1, -1]
    assert out[TEXT].to_pylist() == ["int a;\n", "int b;\n"] and holders == []
    same = twice.slice(0, 2)
    out, holders, at = text_refs.by_reference(same, twice, places)
    assert at.tolist() == [0, 1] and out[TEXT].null_count == 2 and holders == [holder]


def test_a_tampered_holder_fails_every_read_of_the_text_that_names_it(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path / "data"))
    normalized = _holder_version(store)
    classified = _gate_version(store, normalized, list(TEXTS)[:12])
    first = normalized.tables["data"].shards[0]
    path = Path(store.version_dir(normalized)) / first.path
    table = pq.read_table(path)
    texts = table["text"].to_pylist()
    texts[3] = texts[3].replace("return", "retvrn")
    pq.write_table(table.set_column(1, SCHEMA.field("text"), pa.array(texts)), path)
    with pytest.raises(ShardVerificationError, match=first.path):
        store.read_table(classified)
    # a read that does not want the text does not need the holder
    shard = classified.tables["data"].shards[0]
    assert store.read_shard(classified, shard, ["path"]).num_rows == 12
    path.unlink()
    problems = store.verify(classified)
    assert any(first.path in p and "holds text of" in p for p in problems), problems


def test_pruning_keeps_a_holder_while_a_committed_version_names_its_text(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path / "data"), keep_versions=1)
    first = _holder_version(store)
    classified = _gate_version(store, first, list(TEXTS))
    second = _holder_version(store)  # the first would go now, but classified names it
    assert store.exists(f"{store.version_dir(first)}/_COMPLETE")
    assert store.read_table(classified).equals(_files(TEXTS))
    _gate_version(store, second, list(TEXTS))  # classified's older version is pruned ...
    assert not store.exists(store.version_dir(classified))
    _holder_version(store)  # ... so the first goes at the next prune, with its marks
    assert not store.exists(store.version_dir(first))
    assert not store.exists(f"{store.partition_dir('normalized', 'src')}/{HOLDS}/{first.version}")
    assert store.exists(f"{store.version_dir(second)}/_COMPLETE")  # the latest classified's


def test_a_version_whose_holder_is_gone_is_not_committed(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path / "data"))
    normalized = _holder_version(store)
    table, places = slices.read_located(
        store,
        [
            slices.Piece(store.version_dir(normalized), s, 0, s.rows)
            for s in normalized.tables["data"].shards
        ],
    )
    store.delete_dir(store.version_dir(normalized))
    with store.begin("classified", "src", code_version="c1") as v:
        out, holders, _ = text_refs.by_reference(table, table, places)
        shard, written = v.uploader.write_parquet("part-00000.parquet", out)
        shard.text_from = holders
        v.table("data", SCHEMA).adopt(shard, written)
        with pytest.raises(StoreError, match="not a complete version"):
            v.commit()


def test_places_of_tables_read_one_after_another_name_one_list_of_holders() -> None:
    a = TextHolder(dir="d/a", path="p0", rows=5, bytes=1, sha256="0")
    b = TextHolder(dir="d/b", path="p0", rows=3, bytes=1, sha256="0")
    first = text_refs.TextPlaces((a, b), np.array([1, 6, -1], np.int64))  # a1, b1
    second = text_refs.TextPlaces((b,), np.array([2, 0], np.int64))  # b2, b0
    both = text_refs.concat([first, second])
    assert both.holders == (a, b)
    assert both.at.tolist() == [1, 6, -1, 7, 5]
    holders, at = text_refs.compact(both.holders, np.array([7, -1, 5]))
    assert holders == [b] and at.tolist() == [2, -1, 0]


def test_a_shard_counts_the_bytes_of_the_text_it_names_by_rows() -> None:
    a = TextHolder(dir="d/a", path="p", rows=4, bytes=400, sha256="0")
    b = TextHolder(dir="d/b", path="p", rows=2, bytes=100, sha256="0")
    assert text_refs.held_bytes([a, b], np.array([0, 1, 4, -1], np.int64)) == 250
    assert text_refs.held_bytes([a, b], np.array([-1, -1], np.int64)) == 0
    assert text_refs.held_bytes([], np.empty(0, np.int64)) == 0


def test_each_row_gets_its_text_from_wherever_it_is_held() -> None:
    a = TextHolder(dir="d/a", path="p", rows=4, bytes=1, sha256="0")
    b = TextHolder(dir="d/b", path="p", rows=3, bytes=1, sha256="0")
    held = {"d/a": ["a0", "a1", "a2", "a3"], "d/b": ["b0", "b1", "b2"]}
    reads: list[tuple[str, int, int]] = []

    def read_text(h: TextHolder, lo: int, hi: int) -> pa.Array:
        reads.append((h.dir, lo, hi))
        return pa.array(held[h.dir][lo:hi], pa.string())

    def resolved(text: list[str | None], at: list[int | None]) -> list[str]:
        table = pa.table(
            {
                "path": [f"f{i}" for i in range(len(at))],
                TEXT: pa.array(text, pa.string()),
                TEXT_AT: pa.array(at, pa.int64()),
            }
        )
        got, _ = text_refs.resolve(table, [a, b], read_text, "test")
        assert got.column_names == ["path", TEXT] and not got.schema.field(TEXT).nullable
        return got[TEXT].to_pylist()

    # rows held here among rows of both holders, out of the holders' order
    assert resolved([None, "x", None, None, None], [5, None, 3, 0, 6]) == [
        "b1", "x", "a3", "a0", "b2",
    ]  # fmt: skip
    # every row held elsewhere, the holders' rows one after another (no copy), or with gaps
    assert resolved([None] * 4, [1, 2, 4, 5]) == ["a1", "a2", "b0", "b1"]
    assert resolved([None] * 3, [0, 2, 3]) == ["a0", "a2", "a3"]
    assert ("d/a", 0, 4) in reads  # only the rows from the first to the last named are read
    with pytest.raises(ValueError, match="past its holders"):
        resolved([None], [7])


def test_no_kept_rows_or_an_input_without_text_names_nothing() -> None:
    holder = TextHolder(dir="assets/x/_/v", path="p", rows=30, bytes=1, sha256="0")
    source = _files(TEXTS)
    places = text_refs.TextPlaces.rows_of(holder, 0, source.num_rows)
    out, holders, at = text_refs.by_reference(source.slice(0, 0), source, places)
    assert out.num_rows == 0 and holders == [] and at.size == 0
    assert out.column_names == [*SCHEMA.names, TEXT_AT]
    # raw bytes in, text out (normalize): every row is written with its text
    raw = source.drop_columns([TEXT])
    out, holders, at = text_refs.by_reference(source, raw, text_refs.TextPlaces.nowhere(30))
    assert holders == [] and (at == -1).all() and out[TEXT].null_count == 0


@settings(max_examples=200, deadline=None)
@given(
    texts=st.lists(st.text(max_size=6), min_size=1, max_size=300),
    chunk=st.integers(1, 50),
    data=st.data(),
)
def test_a_holders_rows_come_back_in_order_whether_sliced_or_taken(
    texts: list[str], chunk: int, data: st.DataObject
) -> None:
    held = pa.chunked_array(
        [pa.array(texts[i : i + chunk], pa.string()) for i in range(0, len(texts), chunk)]
    )
    rows = np.array(
        data.draw(st.lists(st.integers(0, len(texts) - 1), max_size=2 * len(texts))), np.int64
    )
    if data.draw(st.booleans()):  # the common case: a few rows dropped, the rest in order
        rows = np.array(sorted(set(rows.tolist()) ^ set(range(len(texts)))), np.int64)
    got = text_refs._rows_of(held, rows)
    assert got.type == pa.string() and got.to_pylist() == [texts[i] for i in rows]


def test_a_holder_with_a_few_rows_dropped_is_sliced_not_copied() -> None:
    held = pa.chunked_array([pa.array([f"t{i}" for i in range(1000)], pa.string())])
    kept = np.delete(np.arange(1000, dtype=np.int64), [10, 500, 501])
    got = text_refs._rows_of(held, kept)
    base = held.chunk(0).buffers()[2].address
    assert got.num_chunks == 3
    assert all(c.buffers()[2].address == base for c in got.chunks)  # views of the read bytes
    scattered = np.arange(0, 1000, 2, dtype=np.int64)  # a run per row: one take
    assert text_refs._rows_of(held, scattered).num_chunks == 1
