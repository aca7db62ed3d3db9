"""The packer: fixed-length BOS-aligned rows whose pieces give back every document, no target
across a document boundary, masked pads, split isolation, FIM on train only, determinism."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megacpp_pipeline.corpus import packing
from megacpp_pipeline.corpus.packing import (
    PACK_ID_BASE,
    PackedBatch,
    PackingConfig,
    PackingInputError,
    document_draws,
    draw_keys,
    max_draws,
    merge_telemetry,
    pack,
    pack_block,
    restore_fim_order,
)
from megacpp_pipeline.corpus.tokenizer import SpecialIds
from megacpp_pipeline.gates.enrich import CHUNK_KINDS
from megacpp_pipeline.snapshot.packed_rows import (
    IGNORE_INDEX,
    PAD_DOC_ID,
    fixed_list_to_numpy,
    packed_rows_schema,
    validate_rows,
)

SPECIAL = SpecialIds()
VOCAB = 1000
FIRST_ORDINARY_ID = 13  # after the special tokens


def docs_table(lengths: list[int], splits: list[str] | None = None, first_id: int = 0) -> pa.Table:
    tokens = [
        (FIRST_ORDINARY_ID + (np.arange(n) * 7 + i * 31) % (VOCAB - FIRST_ORDINARY_ID)).astype(
            np.int32
        )
        for i, n in enumerate(lengths)
    ]
    kinds = [((np.arange(n) // 3 + i) % 4).astype(np.uint8) for i, n in enumerate(lengths)]
    return pa.table(
        {
            "doc_id": pa.array(np.arange(first_id, first_id + len(lengths)), pa.int32()),
            "token_ids": pa.array(tokens, pa.list_(pa.int32())),
            "chunk_kind": pa.array(kinds, pa.list_(pa.uint8())),
            "split": splits or ["train"] * len(lengths),
        }
    )


def run_pack(tables: list[pa.Table], config: PackingConfig) -> list[PackedBatch]:
    return list(pack(tables, config, SPECIAL))


def reconstruct(batches: list[PackedBatch], seq_len: int) -> dict[int, list[int]]:
    """Each document's stream, read back from the rows through the pieces table alone."""
    rows: dict[int, np.ndarray] = {}
    pieces: dict[int, list[tuple[int, int, int, int]]] = defaultdict(list)
    for batch in batches:
        ids = fixed_list_to_numpy(batch.rows.column("input_ids"), seq_len)
        for pack_id, row in zip(batch.rows.column("pack_id").to_pylist(), ids, strict=True):
            rows[pack_id] = row
        for p in batch.pieces.to_pylist():
            pieces[p["doc_id"]].append(
                (p["piece_index"], p["pack_id"], p["row_offset"], p["length"])
            )
    out = {}
    for doc_id, parts in pieces.items():
        parts.sort()
        assert [p[0] for p in parts] == list(range(len(parts)))
        out[doc_id] = [
            int(t) for _, pid, off, length in parts for t in rows[pid][off : off + length]
        ]
    return out


def expected_stream(table: pa.Table) -> dict[int, list[int]]:
    return {
        d: [SPECIAL.bos, *toks, SPECIAL.eos]
        for d, toks in zip(
            table.column("doc_id").to_pylist(), table.column("token_ids").to_pylist(), strict=True
        )
    }


policies = st.sampled_from(["best_fit", "packed_rows", "single_doc"])


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=0, max_value=90), min_size=1, max_size=40),
    seq_len=st.sampled_from([8, 13, 32]),
    policy=policies,
    window=st.integers(min_value=1, max_value=12),
    validation_every=st.integers(min_value=2, max_value=5),
)
def test_rows_are_full_length_and_give_back_every_document_through_the_pieces(
    lengths: list[int], seq_len: int, policy: str, window: int, validation_every: int
) -> None:
    splits = ["validation" if i % validation_every == 0 else "train" for i in range(len(lengths))]
    table = docs_table(lengths, splits)
    config = PackingConfig(seq_len=seq_len, policy=policy, window_docs=window)
    batches = run_pack([table], config)

    split_of = dict(zip(table.column("doc_id").to_pylist(), splits, strict=True))
    for batch in batches:
        assert batch.rows.schema == packed_rows_schema(seq_len)
        assert validate_rows(batch.rows, seq_len, VOCAB) == []
        ids = fixed_list_to_numpy(batch.rows.column("input_ids"), seq_len)
        docs = fixed_list_to_numpy(batch.rows.column("doc_ids"), seq_len)
        targets = fixed_list_to_numpy(batch.rows.column("target_ids"), seq_len)
        mask = fixed_list_to_numpy(batch.rows.column("loss_mask"), seq_len)
        valid = batch.rows.column("valid_token_count").to_numpy()
        pad = np.arange(seq_len)[None, :] >= valid[:, None]
        # Pads: pad id, doc -1, target ignored, not in the loss.
        assert (ids[pad] == SPECIAL.pad).all() and (docs[pad] == PAD_DOC_ID).all()
        assert (targets[pad] == IGNORE_INDEX).all() and (mask[pad] == 0).all()
        # No counted target across a document boundary.
        counted = mask[:, :-1] == 1
        assert (docs[:, 1:][counted] == docs[:, :-1][counted]).all()
        # Train and validation never share a row; every row starts at a piece start.
        assert {split_of[d] for d in np.unique(docs[docs >= 0]).tolist()} <= {batch.split}
        assert set(batch.pieces.column("split").to_pylist()) <= {batch.split}
        starts = batch.pieces.to_pylist()
        first_slots = {p["pack_id"] for p in starts if p["row_offset"] == 0}
        assert first_slots == set(batch.rows.column("pack_id").to_pylist())

    assert reconstruct(batches, seq_len) == expected_stream(table)
    all_ids = [pid for b in batches for pid in b.rows.column("pack_id").to_pylist()]
    assert len(all_ids) == len(set(all_ids))
    # Determinism: byte-identical rows and pieces on a second run.
    again = run_pack([table], config)
    assert len(again) == len(batches)
    for a, b in zip(batches, again, strict=True):
        assert a.rows.equals(b.rows) and a.pieces.equals(b.pieces)


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=30),
    cut=st.integers(min_value=0, max_value=30),
)
def test_output_does_not_depend_on_how_the_input_is_cut_into_tables(
    lengths: list[int], cut: int
) -> None:
    table = docs_table(lengths)
    cut = min(cut, table.num_rows)
    config = PackingConfig(seq_len=16, window_docs=7)
    whole = run_pack([table], config)
    parts = run_pack([table.slice(0, cut), table.slice(cut)], config)
    assert [b.rows for b in whole] == [b.rows for b in parts]


def test_a_long_document_is_cut_into_seq_len_pieces_and_reported_as_cropped() -> None:
    table = docs_table([40, 3])  # streams of 42 and 5 tokens
    batches = run_pack([table], PackingConfig(seq_len=16, packing_telemetry=True))
    (batch,) = batches
    lengths = {(p["doc_id"], p["piece_index"]): p["length"] for p in batch.pieces.to_pylist()}
    assert lengths == {(0, 0): 16, (0, 1): 16, (0, 2): 10, (1, 0): 5}
    telemetry = merge_telemetry(batches)
    assert telemetry is not None
    assert telemetry.cropped_doc_frac == 0.5
    assert telemetry.rows == 3  # the 10- and 5-token pieces share a row
    assert telemetry.utilization == pytest.approx(47 / 48)
    assert telemetry.avg_doc_tokens == pytest.approx(21.5)
    assert sum(telemetry.histogram) == 3


@pytest.mark.parametrize("policy", ["best_fit", "packed_rows"])
def test_a_window_is_built_a_row_group_at_a_time_with_the_same_rows(
    policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One document far longer than a row group among short ones (a huge file's window): the
    # rows come in chunks of row_group_rows rows (what the writer keeps as row groups), and
    # are the rows the window gives when built in one piece.
    from megacpp_pipeline.snapshot import packed_rows

    table = docs_table([5, 900, 17, 3, 260, 40, 1, 64])
    config = PackingConfig(seq_len=16, policy=policy, fim_rate=0.5, packing_telemetry=True)
    whole = run_pack([table], config)
    monkeypatch.setattr(packed_rows, "ROW_GROUP_BYTES", 3 * 240)  # a row: 240 bytes at 16
    assert packed_rows.row_group_rows(16) == 2  # 3 rows' worth, down to a power of two
    grouped = run_pack([table], config)
    assert len(whole) == len(grouped) == 1
    rows = grouped[0].rows
    assert rows.num_rows > 50 and rows.column("input_ids").num_chunks == -(-rows.num_rows // 2)
    assert rows.combine_chunks().equals(whole[0].rows.combine_chunks())
    assert grouped[0].pieces.equals(whole[0].pieces)
    assert grouped[0].telemetry == whole[0].telemetry


def test_best_fit_fills_rows_at_least_as_well_as_greedy_and_single_doc() -> None:
    rng = np.random.default_rng(7)
    lengths = (rng.lognormal(4.0, 1.0, size=400).astype(int) + 1).tolist()
    table = docs_table(lengths)
    util = {}
    for policy in ("best_fit", "packed_rows", "single_doc"):
        config = PackingConfig(seq_len=128, policy=policy, window_docs=200, packing_telemetry=True)
        telemetry = merge_telemetry(run_pack([table], config))
        assert telemetry is not None and telemetry.policy == policy
        util[policy] = telemetry.utilization
    assert util["best_fit"] > 0.97
    assert util["best_fit"] >= util["packed_rows"] >= util["single_doc"]


def test_pack_ids_are_sequential_per_split_from_distinct_bases() -> None:
    table = docs_table([5, 5, 5, 5], ["train", "validation", "train", "validation"])
    batches = run_pack([table], PackingConfig(seq_len=8, policy="single_doc"))
    ids = {b.split: b.rows.column("pack_id").to_pylist() for b in batches}
    assert ids == {
        "train": [PACK_ID_BASE["train"], PACK_ID_BASE["train"] + 1],
        "validation": [PACK_ID_BASE["validation"], PACK_ID_BASE["validation"] + 1],
    }


def fim_rows(table: pa.Table, config: PackingConfig) -> list[list[int]]:
    (batch,) = run_pack([table], config)
    ids = fixed_list_to_numpy(batch.rows.column("input_ids"), config.seq_len)
    valid = batch.rows.column("valid_token_count").to_pylist()
    return [row[:n].tolist() for row, n in zip(ids, valid, strict=True)]


def test_structured_fim_moves_one_whole_function_body_to_the_middle() -> None:
    body = CHUNK_KINDS["func_body"]
    tokens = [20, 21, 30, 31, 32, 22, 23]
    kinds = [0, CHUNK_KINDS["func_signature"], body, body, body, CHUNK_KINDS["comment"], 0]
    table = pa.table(
        {
            "doc_id": pa.array([0], pa.int32()),
            "token_ids": pa.array([tokens], pa.list_(pa.int32())),
            "chunk_kind": pa.array([kinds], pa.list_(pa.uint8())),
            "split": ["train"],
        }
    )
    config = PackingConfig(seq_len=16, fim_rate=1.0, fim_mode="structured")
    (row,) = fim_rows(table, config)
    s = SPECIAL
    assert row == [
        s.bos, s.fim_prefix, 20, 21, s.fim_suffix, 22, 23, s.fim_middle, 30, 31, 32, s.eos,
    ]  # fmt: skip
    assert restore_fim_order(np.array(row), SPECIAL).tolist() == [s.bos, *tokens, s.eos]


def test_structured_fim_skips_documents_without_a_wanted_chunk() -> None:
    table = pa.table(
        {
            "doc_id": pa.array([0], pa.int32()),
            "token_ids": pa.array([[20, 21, 22]], pa.list_(pa.int32())),
            "chunk_kind": pa.array([[CHUNK_KINDS["comment"]] * 3], pa.list_(pa.uint8())),
            "split": ["train"],
        }
    )
    config = PackingConfig(seq_len=16, fim_rate=1.0, fim_mode="structured")
    assert fim_rows(table, config) == [[SPECIAL.bos, 20, 21, 22, SPECIAL.eos]]


def test_random_fim_keeps_every_token_in_prefix_suffix_middle_order() -> None:
    table = docs_table([30] * 20)
    config = PackingConfig(seq_len=64, fim_rate=1.0, fim_mode="random", window_docs=100)
    (batch,) = run_pack([table], config)
    streams = reconstruct([batch], 64)
    s = SPECIAL
    for doc_id, original in zip(
        table.column("doc_id").to_pylist(), table.column("token_ids").to_pylist(), strict=True
    ):
        stream = streams[doc_id]
        assert stream[:2] == [s.bos, s.fim_prefix] and stream[-1] == s.eos
        pre_end, suf_end = stream.index(s.fim_suffix), stream.index(s.fim_middle)
        prefix, suffix = stream[2:pre_end], stream[pre_end + 1 : suf_end]
        middle = stream[suf_end + 1 : -1]
        assert prefix + middle + suffix == original
        restored = restore_fim_order(np.array(stream), SPECIAL).tolist()
        assert restored == [s.bos, *original, s.eos]
    assert validate_rows(batch.rows, 64, VOCAB) == []


def test_validation_rows_never_get_fim() -> None:
    table = docs_table([20] * 10, ["validation"] * 10)
    config = PackingConfig(seq_len=32, fim_rate=1.0, packing_telemetry=True)
    batches = run_pack([table], config)
    assert reconstruct(batches, 32) == expected_stream(table)
    telemetry = merge_telemetry(batches)
    assert telemetry is not None and telemetry.fim_docs == 0


def test_fim_choice_is_seeded() -> None:
    table = docs_table([30] * 40)
    a = fim_rows(table, PackingConfig(seq_len=64, fim_rate=0.5, seed=1))
    b = fim_rows(table, PackingConfig(seq_len=64, fim_rate=0.5, seed=1))
    c = fim_rows(table, PackingConfig(seq_len=64, fim_rate=0.5, seed=2))
    assert a == b and a != c


def test_chunk_kind_rides_along_and_specials_are_kind_other() -> None:
    table = docs_table([6])
    (batch,) = run_pack([table], PackingConfig(seq_len=16))
    kinds = fixed_list_to_numpy(batch.rows.column("chunk_kind"), 16)[0]
    original = table.column("chunk_kind")[0].as_py()
    assert kinds[:8].tolist() == [0, *original, 0]
    assert (kinds[8:] == 0).all()


def test_mismatched_chunk_kind_length_names_the_document() -> None:
    table = pa.table(
        {
            "doc_id": pa.array([41], pa.int32()),
            "token_ids": pa.array([[20, 21]], pa.list_(pa.int32())),
            "chunk_kind": pa.array([[0]], pa.list_(pa.uint8())),
            "split": ["train"],
        }
    )
    with pytest.raises(PackingInputError, match="doc_id 41"):
        run_pack([table], PackingConfig(seq_len=8))


def test_unknown_split_is_refused() -> None:
    with pytest.raises(PackingInputError, match="split"):
        run_pack([docs_table([3], ["test"])], PackingConfig(seq_len=8))


def test_validate_rows_names_the_column_of_a_target_that_crosses_documents() -> None:
    (batch,) = run_pack([docs_table([3, 3])], PackingConfig(seq_len=16))
    targets = fixed_list_to_numpy(batch.rows.column("target_ids"), 16).copy()
    mask = fixed_list_to_numpy(batch.rows.column("loss_mask"), 16).copy()
    ids = fixed_list_to_numpy(batch.rows.column("input_ids"), 16)
    boundary = 4  # EOS of the first document (BOS + 3 tokens + EOS)
    targets[0, boundary] = ids[0, boundary + 1]
    mask[0, boundary] = 1
    broken = batch.rows.set_column(
        batch.rows.schema.get_field_index("target_ids"),
        batch.rows.schema.field("target_ids"),
        pa.FixedSizeListArray.from_arrays(pa.array(targets.ravel()), 16),
    ).set_column(
        batch.rows.schema.get_field_index("loss_mask"),
        batch.rows.schema.field("loss_mask"),
        pa.FixedSizeListArray.from_arrays(pa.array(mask.ravel()), 16),
    )
    problems = validate_rows(broken, 16, VOCAB)
    assert any(p.startswith("target_ids: target crosses a document") for p in problems)


def test_validate_rows_reports_a_missing_column_and_a_wrong_length() -> None:
    (batch,) = run_pack([docs_table([3])], PackingConfig(seq_len=16))
    assert "num_docs: required column missing" in validate_rows(
        batch.rows.drop(["num_docs"]), 16, VOCAB
    )
    assert any(
        p.startswith("input_ids: expected fixed_size_list of 32")
        for p in validate_rows(batch.rows, 32, VOCAB)
    )


def test_a_negative_doc_id_is_refused_because_it_would_read_as_padding() -> None:
    with pytest.raises(PackingInputError, match="doc_id -1"):
        run_pack([docs_table([3], first_id=-1)], PackingConfig(seq_len=8))


@pytest.mark.parametrize("policy", ["best_fit", "packed_rows", "single_doc"])
def test_no_documents_pack_into_no_batches(policy: str) -> None:
    config = PackingConfig(seq_len=16, policy=policy, packing_telemetry=True)
    assert run_pack([], config) == []
    assert run_pack([docs_table([]), docs_table([])], config) == []
    assert merge_telemetry([]) is None


@pytest.mark.parametrize("empty", ["train", "validation"])
def test_a_split_without_documents_gets_no_batch_and_the_other_keeps_its_base(empty: str) -> None:
    full = "validation" if empty == "train" else "train"
    table = docs_table([5, 40, 0, 17], [full] * 4)
    batches = run_pack([table], PackingConfig(seq_len=16, window_docs=2, fim_rate=0.5))
    assert batches and {b.split for b in batches} == {full}
    pack_ids = [i for b in batches for i in b.rows.column("pack_id").to_pylist()]
    assert pack_ids == list(range(PACK_ID_BASE[full], PACK_ID_BASE[full] + len(pack_ids)))
    assert reconstruct(batches, 16).keys() == expected_stream(table).keys()


def test_documents_waiting_for_a_window_do_not_keep_their_input_tables_alive() -> None:
    """One validation document in each of 40 train-heavy tables: the validation window fills
    only at the end, and its waiting documents must hold their own bytes, not each whole
    input table (memory would then grow with the corpus)."""
    config = PackingConfig(seq_len=512, window_docs=64)
    tables_bytes = 0

    def tables():
        nonlocal tables_bytes
        for t in range(40):
            splits = ["train"] * 63 + ["validation"]
            table = docs_table([2000] * 64, splits, first_id=t * 64)
            tables_bytes += table.nbytes
            yield table

    consumed = []
    stream = pack(tables(), config, SPECIAL)
    for batch in stream:
        consumed.append(batch.split)
        if len(consumed) == 40:  # every train window is out; validation still waits
            held = pa.total_allocated_bytes()
            break
    waiting = 40 * 2000 * 5  # the 40 validation documents' tokens and kinds
    assert consumed.count("validation") == 0
    assert held < 4 * waiting + tables_bytes / 40, (held, tables_bytes)  # not 40 tables
    assert [b.split for b in stream] == ["validation"]


def test_an_integer_weight_draws_every_document_exactly_that_many_times() -> None:
    keys = draw_keys(["s"] * 500, [f"f{i}.h" for i in range(500)])
    for weight in (1.0, 2.0, 3.0):
        assert set(document_draws(keys, weight, seed=0).tolist()) == {int(weight)}
    assert max_draws(2.0) == 2 and max_draws(2.5) == 3 and max_draws(0.5) == 1


@pytest.mark.parametrize("weight", [0.1, 0.5, 1.5, 2.5])
def test_a_fractional_weight_draws_its_weight_on_average(weight: float) -> None:
    keys = draw_keys(["s"] * 20_000, [f"dir/f{i}.h" for i in range(20_000)])
    draws = document_draws(keys, weight, seed=0)
    assert set(draws.tolist()) == {int(weight), int(weight) + 1}
    assert abs(draws.mean() - weight) < 0.02


def test_a_draw_belongs_to_its_document_whatever_else_is_drawn_with_it() -> None:
    paths = [f"f{i}.h" for i in range(300)]
    keys = draw_keys(["s"] * 300, paths)
    draws = document_draws(keys, 0.5, seed=3)
    order = np.random.default_rng(1).permutation(300)
    again = document_draws(draw_keys(["s"] * 300, [paths[i] for i in order]), 0.5, seed=3)
    assert (again == draws[order]).all()  # neither order nor company changes a draw
    assert (document_draws(keys, 0.5, seed=4) != draws).any()  # the seed does
    # the same path in another source is another document
    assert (document_draws(draw_keys(["t"] * 300, paths), 0.5, seed=3) != draws).any()
    with pytest.raises(ValueError, match="must be > 0"):
        document_draws(keys, 0.0, seed=0)


def test_a_blocks_pieces_name_the_copy_it_packs() -> None:
    config = PackingConfig(seq_len=64, window_docs=4)
    batches = list(pack_block([docs_table([10, 80, 30])], "train", 3, config, SPECIAL, copy=2))
    pieces = pa.concat_tables([b.pieces for b in batches])
    assert set(pieces["copy"].to_pylist()) == {2}
    assert min(pieces["pack_id"].to_pylist()) == PACK_ID_BASE["train"] + (3 << 32)


@pytest.mark.parametrize(
    ("documents", "expected"),
    [(0, 1), (1, 1), (14 * 1024, 1), (64 * 1024, 1), (64 * 1024 + 1, 2), (10**9, 16)],
)
def test_a_split_is_cut_into_at_most_64_blocks_of_at_most_16_windows(
    documents: int, expected: int
) -> None:
    config = PackingConfig(window_docs=1024)
    windows = packing.block_windows(config, documents)
    assert windows == expected
    blocks = -(-documents // (1024 * windows))
    assert blocks <= packing.TARGET_BLOCKS or windows == packing.MAX_BLOCK_WINDOWS


def test_a_configured_block_size_wins_over_the_split_size() -> None:
    config = PackingConfig(window_docs=1024, windows_per_task=3)
    assert packing.block_windows(config, 10**9) == 3
    assert packing.block_windows(config, 1) == 3
