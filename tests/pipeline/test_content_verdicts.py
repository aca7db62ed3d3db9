"""Content checks that stand on an earlier pass (pipeline/checks.py, `rescan_content`): scrub's
rescan over a real run of the test corpus. A pass records what it proved (the version, its
manifest's sha256, a fingerprint of the code and config); given that record back, the next
pass over the same version reads no text while its objects still hash to the manifest, and
over a new version inspects only the rows whose text the recorded version did not hold.
(What the gate's own pass inspected, held in its process, is tests/pipeline/test_gate_scans.py;
here the checks run without it, as in another process.)
Every row's text is hashed against its content_sha256 each pass, so a row that lies about
its text fails the check even where its hash was vouched for."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from megacpp_pipeline.core.schemas import (
    TextLayoutError,
    text_digests,
    text_sha256,
)
from megacpp_pipeline.pipeline.checks import (
    VERIFIED,
    ShardScan,
    Verified,
    _hashed_rows,
    forget_gate_scans,
    verdict_fingerprint,
)
from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.registry import CheckOutcome
from megacpp_pipeline.stages.decontaminate import RESCAN_CLEAN
from megacpp_pipeline.stages.enrich import SPANS_INSIDE_TEXT
from megacpp_pipeline.stages.removals import NOTHING_REMOVED_CONTINUES
from megacpp_pipeline.stages.scrub import NO_DETECTOR_FIRES
from megacpp_pipeline.stages.tokenize import ROUND_TRIP
from tests.fixtures.pipeline_corpus import write_catalog
from tests.fixtures.scrubbed_versions import SECRET, SOURCE, STAGE, first_text, rewritten
from tests.fixtures.stage_runs import context, evaluate, run_through


@pytest.fixture(scope="module")
def scrubbed(tmp_path_factory: pytest.TempPathFactory) -> StageContext:
    tmp = tmp_path_factory.mktemp("verdicts")
    catalog, _ = write_catalog(tmp / "corpus")
    ctx = run_through(context(tmp, catalog, "first"), STAGE)
    forget_gate_scans()  # a check in another process than the gate's: no note of its pass
    return ctx


def _check(ctx: StageContext, prior: Verified | None = None) -> CheckOutcome:
    return evaluate(
        replace(ctx, prior_verdicts={SOURCE: prior} if prior else {}),
        STAGE,
        NO_DETECTOR_FIRES,
        SOURCE,
    )


def _recorded(outcome: CheckOutcome) -> Verified:
    assert outcome.passed, outcome.description
    verified = Verified.from_json(outcome.metadata[VERIFIED], "run-1")
    assert verified is not None
    return verified


def _scrubbed_and_recorded(tmp: Path) -> tuple[StageContext, Verified]:
    """A fresh run of the test corpus through scrub, and its check's first recorded pass."""
    catalog, _ = write_catalog(tmp / "corpus")
    ctx = run_through(context(tmp, catalog, "first"), STAGE)
    return ctx, _recorded(_check(ctx))


def test_a_first_pass_reads_every_text_and_records_the_version_it_proved(
    scrubbed: StageContext,
) -> None:
    outcome = _check(scrubbed)
    manifest = scrubbed.store.latest(STAGE, SOURCE)
    assert outcome.metadata["files_rescanned"] == manifest.rows > 0
    assert outcome.metadata["files_trusted"] == 0
    recorded = _recorded(outcome)
    assert recorded.version == scrubbed.store.relative(scrubbed.store.version_dir(manifest))
    assert recorded.manifest_sha256 == scrubbed.store.manifest_sha256(manifest)


def test_a_pass_over_the_recorded_version_reads_no_text(scrubbed: StageContext) -> None:
    recorded = _recorded(_check(scrubbed))
    again = _check(scrubbed, recorded)
    assert again.passed, again.description
    assert again.metadata["files_rescanned"] == 0
    assert again.metadata["files_trusted"] == scrubbed.store.latest(STAGE, SOURCE).rows
    assert "run-1" in again.metadata["stood_on"]
    assert _recorded(again) == recorded  # the same facts, proved again


def test_a_record_under_another_fingerprint_is_not_stood_on(scrubbed: StageContext) -> None:
    recorded = _recorded(_check(scrubbed))
    other = replace(recorded, fingerprint="0" * 32)  # other detectors or another config
    outcome = _check(scrubbed, other)
    assert outcome.metadata["files_rescanned"] == scrubbed.store.latest(STAGE, SOURCE).rows
    assert outcome.metadata["files_trusted"] == 0
    assert outcome.metadata["stood_on"] == "none"


def test_a_record_of_another_manifest_is_not_stood_on(scrubbed: StageContext) -> None:
    recorded = _recorded(_check(scrubbed))
    forged = replace(recorded, manifest_sha256="f" * 64)  # the version's folder, other bytes
    outcome = _check(scrubbed, forged)
    assert outcome.passed
    assert outcome.metadata["files_trusted"] == 0
    assert outcome.metadata["files_rescanned"] == scrubbed.store.latest(STAGE, SOURCE).rows


def test_a_new_version_reads_only_the_text_the_recorded_one_did_not_hold(
    tmp_path: Path,
) -> None:
    ctx, recorded = _scrubbed_and_recorded(tmp_path)
    rows = ctx.store.latest(STAGE, SOURCE).rows

    rewritten(ctx, lambda t: first_text(t, "int changed_only_here() { return 7; }\n"))
    clean = _check(ctx, recorded)
    assert clean.passed, clean.description
    assert clean.metadata["files_trusted"] == rows - 1
    assert clean.metadata["files_rescanned"] == 1

    rewritten(ctx, lambda t: first_text(t, SECRET))
    dirty = _check(ctx, _recorded(clean))
    assert not dirty.passed
    assert dirty.metadata["files_rescanned"] == 1
    assert dirty.description is not None and SOURCE in dirty.description
    assert VERIFIED not in dirty.metadata  # a failing pass proves nothing


def test_a_recorded_version_no_longer_in_the_store_vouches_for_nothing(
    tmp_path: Path,
) -> None:
    ctx, recorded = _scrubbed_and_recorded(tmp_path)
    rows = ctx.store.latest(STAGE, SOURCE).rows
    rewritten(ctx, lambda t: t)  # a new version over the same texts
    gone = Path(ctx.store.join(recorded.version))
    (gone / "_COMPLETE").unlink()  # pruned: no longer a readable version
    outcome = _check(ctx, recorded)
    assert outcome.passed, outcome.description
    assert (outcome.metadata["files_rescanned"], outcome.metadata["files_trusted"]) == (rows, 0)
    assert outcome.metadata["stood_on"] == "none"


def test_a_row_whose_text_is_not_what_its_hash_says_fails_though_the_hash_was_vouched_for(
    tmp_path: Path,
) -> None:
    ctx, recorded = _scrubbed_and_recorded(tmp_path)
    first = ctx.store.read_shard(
        ctx.store.latest(STAGE, SOURCE), ctx.store.latest(STAGE, SOURCE).tables["data"].shards[0]
    )
    vouched = first.column("content_sha256")[0].as_py()
    path = first.column("path")[0].as_py()
    # the secret under the hash of a text the recorded pass inspected
    rewritten(ctx, lambda t: first_text(t, SECRET, sha=vouched))
    outcome = _check(ctx, recorded)
    assert not outcome.passed
    assert outcome.description is not None
    assert path in outcome.description and "content_sha256" in outcome.description


def test_the_recorded_version_with_a_changed_text_holder_fails(tmp_path: Path) -> None:
    ctx, recorded = _scrubbed_and_recorded(tmp_path)
    manifest = ctx.store.latest(STAGE, SOURCE)
    holders = {(h.dir, h.path) for s in manifest.tables["data"].shards for h in s.text_from or []}
    assert holders, "the scrubbed version names the shards that hold its text"
    held_dir, held_path = sorted(holders)[0]
    target = Path(ctx.store.join(held_dir)) / held_path
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    outcome = _check(ctx, recorded)
    assert not outcome.passed
    assert outcome.description is not None and held_path in outcome.description


def test_the_removals_check_stands_on_a_recorded_pass_of_the_very_version(
    scrubbed: StageContext,
) -> None:
    first = evaluate(scrubbed, "removed_files", NOTHING_REMOVED_CONTINUES, SOURCE)
    recorded = _recorded(first)
    again = evaluate(
        replace(scrubbed, prior_verdicts={SOURCE: recorded}),
        "removed_files",
        NOTHING_REMOVED_CONTINUES,
        SOURCE,
    )
    assert again.passed, again.description
    assert again.metadata["files_trusted"] == scrubbed.store.latest("removed_files", SOURCE).rows
    assert _recorded(again) == recorded


def test_outside_the_orchestrator_nothing_is_stood_on(scrubbed: StageContext) -> None:
    """A context with no records (a bench, a test, a check run by hand) reads every text."""
    outcome = _check(scrubbed)
    assert outcome.metadata["stood_on"] == "none"
    assert outcome.metadata["files_rescanned"] == scrubbed.store.latest(STAGE, SOURCE).rows


def test_decontamination_s_rescan_stands_on_its_recorded_pass_too(tmp_path: Path) -> None:
    catalog, _ = write_catalog(tmp_path / "corpus")
    ctx = run_through(context(tmp_path, catalog, "first"), "decontaminated_files")
    first = evaluate(ctx, "decontaminated_files", RESCAN_CLEAN)
    recorded = _recorded(first)
    assert first.metadata["files_rescanned"] > 0
    again = evaluate(
        replace(ctx, prior_verdicts={None: recorded}), "decontaminated_files", RESCAN_CLEAN
    )
    assert again.passed, again.description
    assert (again.metadata["files_rescanned"], again.metadata["files_trusted"]) == (
        0,
        first.metadata["files_rescanned"],
    )


def test_a_null_slot_hashes_as_the_empty_text_whatever_bytes_its_offsets_span() -> None:
    """A writer may leave bytes under a null slot (an Arrow IPC file keeps them): they are
    not the row's text."""
    offsets = pa.py_buffer(np.array([0, 6, 13], np.int32).tobytes())
    validity = pa.py_buffer(bytes([0b10]))  # row 0 null, row 1 valid
    array = pa.StringArray.from_buffers(2, offsets, pa.py_buffer(b"SECRETint x;\n"), validity, 1)
    assert array.to_pylist() == [None, "int x;\n"]
    assert text_digests(array) == [text_sha256(""), text_sha256("int x;\n")]
    assert text_digests(array.slice(1)) == [text_sha256("int x;\n")]


@pytest.mark.parametrize("kind", [pa.string(), pa.large_string()])
def test_text_digests_are_the_schema_s_content_hashes_of_any_array_layout(kind) -> None:
    texts = ["", "int x;\n", "é ünïcode\n", "a" * 5000, "\r\n\t"]
    whole = pa.array(texts * 3, kind)
    layouts = [
        whole,
        whole.slice(3, 7),
        pa.chunked_array([whole.slice(0, 4), whole.slice(4)]),
        pa.chunked_array([], kind),
    ]
    for array in layouts:
        assert text_digests(array) == [text_sha256(t) for t in array.to_pylist()]


@pytest.mark.parametrize(
    ("stage", "check", "counted"),
    [
        ("enriched_files", SPANS_INSIDE_TEXT, "files"),
        ("tokenized_docs", ROUND_TRIP, "documents_checked"),
    ],
)
def test_a_check_of_more_than_the_text_stands_only_on_the_very_version_recorded(
    tokenized: StageContext, stage: str, check: str, counted: str
) -> None:
    first = evaluate(tokenized, stage, check, SOURCE)
    recorded = _recorded(first)
    rows = tokenized.store.latest(stage, SOURCE).rows
    assert first.metadata[counted] == rows > 0
    again = evaluate(replace(tokenized, prior_verdicts={SOURCE: recorded}), stage, check, SOURCE)
    assert again.passed, again.description
    assert (again.metadata[counted], again.metadata["files_trusted"]) == (0, rows)
    # another version of the partition: the record says nothing of its rows, read them all
    elsewhere = replace(recorded, version=recorded.version + "-other")
    other = evaluate(replace(tokenized, prior_verdicts={SOURCE: elsewhere}), stage, check, SOURCE)
    assert (other.metadata[counted], other.metadata["files_trusted"]) == (rows, 0)


def test_the_round_trip_s_record_is_bound_to_the_tokenizer_it_decoded_with(
    tokenized: StageContext,
) -> None:
    recorded = _recorded(evaluate(tokenized, "tokenized_docs", ROUND_TRIP, SOURCE))
    stage = tokenized.registry.get("tokenized_docs")
    assert recorded.fingerprint == verdict_fingerprint(
        tokenized, stage, ROUND_TRIP, _tokenizer_sha256(tokenized)
    )
    assert recorded.fingerprint != verdict_fingerprint(tokenized, stage, ROUND_TRIP, "0" * 64)


def _tokenizer_sha256(ctx: StageContext) -> str:
    manifest = ctx.store.latest("tokenizer", None)
    return next(f.sha256 for f in manifest.files if f.path == "tokenizer.json")


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory: pytest.TempPathFactory) -> StageContext:
    tmp = tmp_path_factory.mktemp("tokenized")
    catalog, _ = write_catalog(tmp / "corpus")
    return run_through(context(tmp, catalog, "first"), "tokenized_docs")


def test_a_slice_with_no_rows_has_nothing_to_hash_or_inspect() -> None:
    empty = pa.table(
        {"path": pa.array([], pa.string()), "text": pa.array([], pa.string()),
         "content_sha256": pa.array([], pa.string())}
    )  # fmt: skip
    clean = np.array([text_sha256("int x;\n")], dtype="S64")
    for vouched in (None, clean):
        problems, inspect, noted = _hashed_rows(empty, vouched, [(0, 0, ShardScan.of([]))])
        assert problems == [] and inspect.tolist() == [] and noted.tolist() == []


@pytest.mark.parametrize(
    "column",
    [
        pa.array(["int secret;\n", "int x;\n"], pa.string_view()),
        pa.array(["int x;\n", "int x;\n"], pa.string()).dictionary_encode(),
        pa.nulls(2),
    ],
    ids=["string_view", "dictionary", "nulls"],
)
def test_a_text_column_in_another_layout_fails_the_slice_instead_of_being_hashed(
    column: pa.Array,
) -> None:
    """A view array's buffers hold 16-byte views, not offsets: hashed as offsets, a row's
    digest would be of other bytes than its text (a secret could carry a vouched hash)."""
    with pytest.raises(TextLayoutError, match=f"stored as {column.type}"):
        text_digests(column)
    rows = pa.table(
        {"path": ["a.cpp", "b.cpp"], "text": column,
         "content_sha256": [text_sha256("int x;\n")] * 2}
    )  # fmt: skip
    with pytest.raises(TextLayoutError):
        _hashed_rows(rows, None)


def test_a_slice_whose_stored_text_is_a_view_fails_naming_its_shard(tmp_path: Path) -> None:
    """Through the store, as a check's task reads it: the slice fails with its shard named;
    none of its rows is trusted or handed to the check's inspection."""
    from megacpp_pipeline.pipeline.checks import RowCheck, _inspect_task, _RowJob
    from megacpp_pipeline.storage import slices
    from megacpp_pipeline.storage.store import ShardStore

    store = ShardStore(str(tmp_path / "data"))
    schema = pa.schema(
        [("path", pa.string()), ("text", pa.string_view()), ("content_sha256", pa.string())]
    )
    rows = pa.table(
        {"path": ["a.cpp"], "text": ["int x;\n"], "content_sha256": [text_sha256("int x;\n")]},
        schema=schema,
    )
    with store.begin("scrubbed_files", "src", code_version="c1") as v:
        v.table("data", schema).write(rows)
        m = v.commit()
    vdir = store.version_dir(m)
    pieces = tuple(slices.Piece(vdir, s, 0, s.rows) for s in m.tables["data"].shards)
    inspected: list[int] = []
    check = RowCheck(("path", "text"), lambda _, t: inspected.append(t.num_rows) or [])
    clean = np.array([text_sha256("int x;\n")], dtype="S64")
    notes = {s.path: ShardScan.of([text_sha256("int x;\n")]) for s in m.tables["data"].shards}
    done = _inspect_task(_RowJob(store, check, None, True, clean, notes), pieces)
    assert (done.rows, done.trusted, done.by_gate, inspected) == (1, 0, 0, [])
    problems = done.problems
    assert len(problems) == 1 and pieces[0].path in problems[0] and "string_view" in problems[0]
