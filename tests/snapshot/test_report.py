"""The quality report: one HTML page with a valid PNG per plot, numbers that equal the
snapshot's ledger, the same bytes on every render, and "no data" instead of a crash."""

from __future__ import annotations

import hashlib
import json
import re
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from megacpp_pipeline.core.ledger import LEDGER_SCHEMA, DropReason
from megacpp_pipeline.gates.enrich import KIND_NAMES
from megacpp_pipeline.snapshot.layout import MANIFEST, SnapshotManifest
from megacpp_pipeline.snapshot.packed_rows import PAD_DOC_ID
from megacpp_pipeline.snapshot.promote import read_manifest
from megacpp_pipeline.snapshot.report import (
    PLOT_FILES,
    REPORT_HTML,
    ReportConfig,
    ReportInputError,
    ReportInputs,
    ReportResult,
    duplicate_cluster_sizes,
    ledger_funnel,
    render_report,
    scan_rows,
)
from tests.fixtures.snapshot_fixture import DOCUMENTS_SCHEMA, SnapshotFixture, build_snapshot

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# the pipeline's ledger stages in order (the registry's)
STAGES = [
    "raw_files",
    "normalized_files",
    "licensed_files",
    "scrubbed_files",
    "deduped_files",
    "enriched_files",
    "tokenized_docs",
    "packed_rows",
]

# What the pipeline dropped on the way, file by file: (stage, reason, how many, dup_of index).
DROPS = [
    ("raw_files", DropReason.NOT_INCLUDED, 2, None),
    ("normalized_files", DropReason.BINARY, 2, None),
    ("normalized_files", DropReason.GENERATED_FILE, 3, None),
    ("licensed_files", DropReason.LICENSE_DENIED, 1, None),
    ("deduped_files", DropReason.EXACT_DUPLICATE, 2, 0),  # cluster of 3 around kept doc 0
    ("deduped_files", DropReason.EXACT_DUPLICATE, 2, 1),  # cluster of 3 around kept doc 1
    ("deduped_files", DropReason.NEAR_DUPLICATE, 1, 2),  # cluster of 2 around kept doc 2
]


def _write_pipeline_ledger(fixture: SnapshotFixture) -> pa.Table:
    """Replace the fixture's all-kept ledger and single source with what a real run leaves:
    two sources, and files dropped at several stages, duplicates naming their representative."""
    root = fixture.path
    documents = pq.read_table(root / "documents.parquet")
    sources = np.where(documents.column("doc_id").to_numpy() % 3 == 0, "boost", "nlohmann_json")
    documents = documents.set_column(
        documents.schema.get_field_index("source_id"), "source_id", pa.array(sources)
    ).cast(DOCUMENTS_SCHEMA)
    pq.write_table(documents, root / "documents.parquet")
    kept_paths = documents.column("path").to_pylist()
    rows = [
        {"source_id": s, "path": p, "stage": "snapshot", "status": "kept", "dup_of": None}
        for s, p in zip(sources.tolist(), kept_paths, strict=True)
    ]
    for stage, reason, count, dup_index in DROPS:
        for i in range(count):
            rows.append(
                {
                    "source_id": "boost",
                    "path": f"boost/{reason}/{dup_index}/{i}.hpp",
                    "stage": str(stage),
                    "status": "dropped",
                    "reason": str(reason),
                    "dup_of": None if dup_index is None else f"boost:{kept_paths[dup_index]}",
                }
            )
    ledger = pa.Table.from_pylist(rows, schema=LEDGER_SCHEMA)
    pq.write_table(ledger, root / "ledger.parquet")
    return ledger


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> SnapshotFixture:
    fixture = build_snapshot(tmp_path_factory.mktemp("report") / "snapshot", seq_len=32)
    _write_pipeline_ledger(fixture)
    return fixture


@pytest.fixture(scope="module")
def report(snapshot: SnapshotFixture) -> ReportResult:
    """One render with every kind of stage stats, shared by the tests that only read it."""
    return render_report(_stage_inputs(snapshot.path), snapshot.path.parent / "report")


def _stage_inputs(root: Path) -> ReportInputs:
    return ReportInputs(
        snapshot_dir=root,
        license_stats={
            "decision:allowed": 52,
            "decision:denied": 1,
            "source:file": 40,
            "source:repo-declared": 13,
            "expr:MIT": 30,
            "expr:BSL-1.0": 22,
            "expr:GPL-3.0-only": 1,
            "files_in": 53,
        },
        scrub_stats={"kind:email": 7, "kind:ipv4": 2, "kind:private_key": 1, "files_in": 53},
        packing_telemetry={"utilization": 0.9, "docs_per_row": 1.7, "histogram": [0, 3, 70]},
        stages=STAGES,
    )


def _markdown_numbers(markdown: str) -> dict[str, int]:
    """The summary table of the markdown as {metric: integer value}."""
    numbers = {}
    for metric, value in re.findall(r"^\| ([^|]+?) \| ([\d,]+) \|$", markdown, re.M):
        numbers[metric] = int(value.replace(",", ""))
    return numbers


def _assert_valid_png(path: Path) -> None:
    """Walk the PNG chunk by chunk: magic, IHDR first, every CRC right, IEND last, and none
    of the chunks that would make two renders differ (tIME, a Software text)."""
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, path
    offset, kinds = 8, []
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        kind = data[offset + 4 : offset + 8]
        body = data[offset + 8 : offset + 8 + length]
        (crc,) = struct.unpack(">I", data[offset + 8 + length : offset + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"{path}: bad CRC in {kind!r}"
        if kind == b"tEXt":
            assert not body.startswith(b"Software"), path
        kinds.append(kind)
        offset += 12 + length
    assert kinds[0] == b"IHDR" and kinds[-1] == b"IEND", path
    assert b"tIME" not in kinds, path
    width, height = struct.unpack(">II", data[16:24])
    assert width > 100 and height > 100


def test_report_writes_one_page_and_a_valid_png_per_plot(report: ReportResult) -> None:
    out = report.html.parent
    assert report.html.name == REPORT_HTML
    page = report.html.read_text()
    for name in PLOT_FILES.values():
        _assert_valid_png(out / name)
        assert f'src="{name}"' in page, f"the page does not show {name}"
    # self-contained: every image is a sibling file, nothing absolute or remote
    assert sorted(re.findall(r'src="([^"]+)"', page)) == sorted(PLOT_FILES.values())
    assert str(out) not in page and "://" not in page
    written = {f.path.name: f.sha256 for f in report.files}
    assert set(written) == {*PLOT_FILES.values(), REPORT_HTML}
    for f in report.files:
        assert f.path.parent == out
        assert hashlib.sha256(f.path.read_bytes()).hexdigest() == f.sha256
    assert sorted(p.name for p in out.iterdir()) == sorted(written), "stray or tmp files left"
    for name in PLOT_FILES.values():
        assert f"`{name}`" in report.markdown


def test_markdown_funnel_equals_the_ledger_counts(
    snapshot: SnapshotFixture, report: ReportResult
) -> None:
    ledger = pq.read_table(snapshot.path / "ledger.parquet")
    numbers = _markdown_numbers(report.markdown)

    status = ledger.column("status")
    assert numbers["files collected"] == ledger.num_rows == 48 + 13
    assert numbers["files kept"] == pc.sum(pc.equal(status, "kept")).as_py() == 48
    assert numbers["files dropped"] == pc.sum(pc.equal(status, "dropped")).as_py() == 13
    by_reason = {
        f"dropped at {row['stage']}: {row['reason']}": row["count_all"]
        for row in ledger.filter(pc.equal(status, "dropped"))
        .group_by(["stage", "reason"])
        .aggregate([([], "count_all")])
        .to_pylist()
    }
    reported = {k: v for k, v in numbers.items() if k.startswith("dropped at ")}
    assert reported == by_reason
    assert reported["dropped at deduped_files: exact_duplicate"] == 4
    assert numbers["files kept"] + sum(reported.values()) == numbers["files collected"]
    assert report.metrics["files_collected"] == ledger.num_rows


def test_funnel_follows_the_pipeline_order_and_ends_at_kept(snapshot: SnapshotFixture) -> None:
    stage_order = STAGES
    funnel = ledger_funnel(pq.read_table(snapshot.path / "ledger.parquet"), stage_order)

    drop_stages = [stage for stage, _, _ in funnel.drops]
    assert drop_stages == sorted(drop_stages, key=stage_order.index)
    remaining = funnel.remaining_after()
    assert remaining == sorted(remaining, reverse=True)
    assert remaining[stage_order.index("raw_files")] == 61 - 2
    assert remaining[-1] == funnel.kept == 48


def test_a_stage_outside_the_pipeline_enum_still_counts() -> None:
    ledger = pa.Table.from_pylist(
        [
            {"source_id": "s", "path": "a.hpp", "stage": "snapshot", "status": "kept"},
            {"source_id": "s", "path": "b.hpp", "stage": "snapshot", "status": "dropped",
             "reason": "unaccounted"},
            {"source_id": "s", "path": "c.hpp", "stage": "normalized_files", "status": "dropped"},
        ],
        schema=LEDGER_SCHEMA,
    )  # fmt: skip
    funnel = ledger_funnel(ledger)
    assert funnel.drops == [
        ("normalized_files", "(none)", 1),
        ("snapshot", "unaccounted", 1),
    ]
    assert funnel.stages[-1] == "snapshot"
    assert funnel.remaining_after()[-1] == funnel.kept == 1


def test_two_renders_of_the_same_snapshot_are_byte_identical(
    snapshot: SnapshotFixture, report: ReportResult, tmp_path: Path
) -> None:
    again = render_report(_stage_inputs(snapshot.path), tmp_path / "again")

    assert [f.sha256 for f in again.files] == [f.sha256 for f in report.files]
    for a, b in zip(report.files, again.files, strict=True):
        assert a.path.read_bytes() == b.path.read_bytes(), a.path.name
    assert again.markdown == report.markdown


def test_plots_drawn_by_forked_workers_are_the_same_bytes(
    snapshot: SnapshotFixture, report: ReportResult, tmp_path: Path
) -> None:
    # what the stage does: every plot a task of the host executor's forked workers
    from megacpp_pipeline.pipeline.executor import LocalExecutor

    executor = LocalExecutor(2, cap=False)
    forked = render_report(_stage_inputs(snapshot.path), tmp_path / "forked", mapper=executor.map)
    assert [f.path.name for f in forked.files] == [f.path.name for f in report.files]
    assert [f.sha256 for f in forked.files] == [f.sha256 for f in report.files]
    tasks = sum(work.tasks for work in executor.stats.nodes.values())
    assert tasks == len(report.files) - 1  # a task per PNG; the page is the caller's


def test_a_fresh_interpreter_renders_the_same_bytes(
    snapshot: SnapshotFixture, report: ReportResult, tmp_path: Path
) -> None:
    # Dagster materializes in a new process each run: no state of this one may leak in.
    code = (
        "import json, sys\nfrom pathlib import Path\n"
        "from tests.snapshot.test_report import _stage_inputs\n"
        "from megacpp_pipeline.snapshot.report import render_report\n"
        "r = render_report(_stage_inputs(Path(sys.argv[1])), Path(sys.argv[2]))\n"
        "print(json.dumps([f.sha256 for f in r.files]))\n"
    )
    there = subprocess.run(
        [sys.executable, "-c", code, str(snapshot.path), str(tmp_path / "there")],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(there.stdout.strip().splitlines()[-1]) == [f.sha256 for f in report.files]


def _empty_snapshot(root: Path) -> Path:
    root.mkdir(parents=True)
    empty = SnapshotManifest(
        snapshot_id="empty", name="empty", created_at="2026-01-01T00:00:00Z", code_version="t",
        config_hash="0" * 64, seq_len=64, vocab_size=512, tokenizer={}, splits={}, documents=0,
        ledger={}, inputs={}, files=[],
    )  # fmt: skip
    (root / MANIFEST).write_text(empty.model_dump_json())
    pq.write_table(LEDGER_SCHEMA.empty_table(), root / "ledger.parquet")
    pq.write_table(DOCUMENTS_SCHEMA.empty_table(), root / "documents.parquet")
    return root


def test_an_empty_snapshot_with_zero_stats_renders_no_data_plots(tmp_path: Path) -> None:
    root = _empty_snapshot(tmp_path / "empty")
    inputs = ReportInputs(
        root,
        license_stats={"decision:allowed": 0, "source:file": 0},
        scrub_stats={"kind:email": 0},
        dedup_clusters=pa.table({"cluster_id": pa.array([], pa.int64()), "size": []}),
        chunk_kind_bytes={"func_body": 0.0},
        packing_telemetry={},
    )
    result = render_report(inputs, tmp_path / "report")

    for name in PLOT_FILES.values():
        _assert_valid_png(tmp_path / "report" / name)
    numbers = _markdown_numbers(result.markdown)
    assert numbers["files collected"] == numbers["files kept"] == numbers["packed rows"] == 0
    assert numbers["scrub replacements"] == numbers["duplicate clusters"] == 0
    assert result.metrics["row_utilization"] == 0.0
    assert "snapshot empty" in result.html.read_text()


def test_chunk_kind_coverage_counts_only_the_valid_tokens_of_every_row(
    snapshot: SnapshotFixture,
) -> None:
    manifest = read_manifest(snapshot.path)
    rows = scan_rows(snapshot.path, manifest, ReportConfig(batch_rows=5), kinds=True)

    expected = np.zeros(256, np.int64)
    for truth in snapshot.splits.values():
        in_doc = truth.columns["doc_ids"] != PAD_DOC_ID
        expected += np.bincount(truth.columns["chunk_kind"][in_doc], minlength=256)
    np.testing.assert_array_equal(rows.kind_tokens, expected)
    assert rows.kind_tokens.sum() == sum(s.tokens for s in manifest.splits.values())
    assert len(KIND_NAMES) > int(np.flatnonzero(expected).max())


def test_row_utilization_is_valid_tokens_over_row_capacity(
    snapshot: SnapshotFixture, report: ReportResult
) -> None:
    manifest = read_manifest(snapshot.path)
    rows = sum(s.rows for s in manifest.splits.values())
    tokens = sum(s.tokens for s in manifest.splits.values())

    assert report.metrics["packed_rows"] == rows
    assert report.metrics["row_utilization"] == pytest.approx(tokens / (rows * 32), abs=1e-6)
    stats = scan_rows(snapshot.path, manifest, ReportConfig(utilization_bins=7), kinds=False)
    assert {split: int(h.sum()) for split, h in stats.utilization_hist.items()} == {
        split: s.rows for split, s in manifest.splits.items()
    }
    assert not stats.kind_tokens.any(), "kinds were decoded although not asked for"


def test_duplicate_clusters_come_from_dup_of_when_no_cluster_table_is_given(
    snapshot: SnapshotFixture, report: ReportResult
) -> None:
    ledger = pq.read_table(snapshot.path / "ledger.parquet")
    assert sorted(duplicate_cluster_sizes(None, ledger).tolist()) == [2, 3, 3]
    assert report.metrics["duplicate_clusters"] == 3
    assert report.metrics["files_in_duplicate_clusters"] == 3 + 3 + 2

    clusters = pa.table({"cluster_id": [0, 1, 2], "size": [4, 9, 1], "representative": list("abc")})
    assert duplicate_cluster_sizes(clusters, ledger).tolist() == [4, 9]


def test_stage_stats_reach_the_summary(snapshot: SnapshotFixture, report: ReportResult) -> None:
    numbers = _markdown_numbers(report.markdown)

    assert numbers["license allowed"] == 52 and numbers["license denied"] == 1
    assert numbers["scrub replacements"] == 7 + 2 + 1  # files_in is not a replacement
    assert numbers["sources"] == 2
    assert numbers["document tokens"] == sum(len(d) for d in snapshot.documents.values())
    assert report.metrics["packing:docs_per_row"] == 1.7
    page = report.html.read_text()
    snapshot_id = read_manifest(snapshot.path).snapshot_id
    assert "license allowed" in page and f"snapshot {snapshot_id}" in page


def test_chunk_kind_bytes_stand_in_for_rows_without_a_chunk_kind_column(
    report: ReportResult, tmp_path: Path
) -> None:
    fixture = build_snapshot(tmp_path / "snapshot", with_chunk_kind=False)
    manifest = read_manifest(fixture.path)
    assert not scan_rows(fixture.path, manifest, ReportConfig(), kinds=True).kind_tokens.any()

    given = render_report(
        ReportInputs(fixture.path, chunk_kind_bytes={"func_body": 900.0, "comment": 100.0}),
        tmp_path / "given",
    )
    name = PLOT_FILES["chunk_kinds"]
    _assert_valid_png(tmp_path / "given" / name)
    assert given.files[4].path.name == name
    assert given.files[4].sha256 != report.files[4].sha256, "bytes did not replace the rows"


def test_a_snapshot_without_its_ledger_is_refused_naming_the_file(tmp_path: Path) -> None:
    root = _empty_snapshot(tmp_path / "broken")
    (root / "ledger.parquet").unlink()
    with pytest.raises(ReportInputError, match="ledger.parquet"):
        render_report(ReportInputs(root), tmp_path / "report")


def test_a_ledger_of_many_row_groups_counts_the_same_as_one(tmp_path: Path) -> None:
    # the ledger and documents are read with their labels dictionary-encoded; every row
    # group brings its own dictionary, and the drops still group across them
    one = build_snapshot(tmp_path / "one", dropped=6, row_group_rows=1024)
    many = build_snapshot(tmp_path / "many", dropped=6, row_group_rows=3)
    assert pq.ParquetFile(many.path / "ledger.parquet").metadata.num_row_groups > 3
    results = [render_report(ReportInputs(f.path), tmp_path / f.path.name) for f in (one, many)]
    metrics = [{k: v for k, v in r.metrics.items() if k != "snapshot_id"} for r in results]
    assert metrics[0] == metrics[1]
    drops = {k: v for k, v in metrics[1].items() if k.startswith("dropped:")}
    assert sum(drops.values()) == 6 and len(drops) == 2, drops  # exact and near duplicates
    assert "exact_duplicate" in results[1].html.read_text()
