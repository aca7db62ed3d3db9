"""What the stages compute beyond calling a gate, as plain functions: licence decision
counts, chunk-kind bytes and coverage, span problems, the inputs outside a
file that decide its licence."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from megacpp_pipeline.core.gate import GateResult
from megacpp_pipeline.core.ledger import DropReason, drops
from megacpp_pipeline.gates.enrich import CHUNK_KINDS
from megacpp_pipeline.stages.enrich import kind_bytes, kind_coverage, span_problems
from megacpp_pipeline.stages.license import decision_counts, inputs_outside_the_file
from tests.fixtures.pipeline_corpus import write_catalog
from tests.fixtures.stage_runs import context, run_through


def test_decision_counts_cover_kept_and_dropped_files_with_their_licence_sources() -> None:
    kept = pa.table(
        {
            "license_source": ["file", "file", "repo-declared"],
            "license_expression": ["MIT", "BSL-1.0", None],
        }
    )
    dropped = drops(
        ["s", "s", "s"],
        ["a.h", "b.h", "c.h"],
        [DropReason.LICENSE_DENIED, DropReason.LICENSE_INVALID, DropReason.LICENSE_UNKNOWN],
        details=["file: GPL-3.0-only is not allowed", "reuse: NotALicense", None],
        license_expressions=["GPL-3.0-only", "NotALicense", None],
    )
    counts = decision_counts(GateResult(kept=kept, dropped=dropped))
    assert counts == {
        "decision:allowed": 3,
        "decision:denied": 1,
        "decision:invalid": 1,
        "decision:unknown": 1,
        "source:file": 3,
        "source:repo-declared": 1,
        "source:reuse": 1,
        "source:none": 1,
        "expr:MIT": 1,
        "expr:BSL-1.0": 1,
        "expr:GPL-3.0-only": 1,
        "expr:NotALicense": 1,
    }


def test_the_licence_salt_moves_with_the_declared_licence_and_any_reuse_file() -> None:
    base = inputs_outside_the_file("MIT", {"REUSE.toml": b"version = 1\n"})
    assert base == inputs_outside_the_file("MIT", {"REUSE.toml": b"version = 1\n"})
    assert base != inputs_outside_the_file("BSD-3-Clause", {"REUSE.toml": b"version = 1\n"})
    assert base != inputs_outside_the_file("MIT", {"REUSE.toml": b"version = 2\n"})
    assert base != inputs_outside_the_file("MIT", {})


def _spans(rows: list[tuple[str, list[tuple[int, int, int]]]]) -> pa.Table:
    return pa.table(
        {
            "path": [p for p, _ in rows],
            "text": ["x" * 100 for _ in rows],
            "chunk_starts": pa.array(
                [[s for s, _, _ in spans] for _, spans in rows], pa.list_(pa.int32())
            ),
            "chunk_ends": pa.array(
                [[e for _, e, _ in spans] for _, spans in rows], pa.list_(pa.int32())
            ),
            "chunk_kinds": pa.array(
                [[k for _, _, k in spans] for _, spans in rows], pa.list_(pa.uint8())
            ),
            "structure_source": ["syntax"] * len(rows),
            "build_context": pa.nulls(
                len(rows), pa.struct([pa.field("include_roots", pa.list_(pa.string()))])
            ),
        }
    )


def test_kind_bytes_sums_span_lengths_per_kind_and_files_per_structure_source() -> None:
    body, comment = CHUNK_KINDS["func_body"], CHUNK_KINDS["comment"]
    table = _spans([("a.h", [(0, 10, body), (10, 15, comment)]), ("b.h", [(0, 30, body)])])
    counts = kind_bytes(GateResult(kept=table))
    assert counts == {
        "kind_bytes:func_body": 40,
        "kind_bytes:comment": 5,
        "structure_source:syntax": 2,
    }
    coverage = kind_coverage(counts)
    assert coverage.splitlines()[2] == "| func_body | 40 | 88.9% |"
    assert kind_bytes(GateResult(kept=table.slice(0, 0))) == {}


def test_span_problems_name_each_file_with_a_span_outside_its_text() -> None:
    body = CHUNK_KINDS["func_body"]
    table = _spans(
        [("ok.h", [(0, 100, body)]), ("past.h", [(90, 101, body)]), ("back.h", [(20, 10, body)])]
    )
    assert span_problems(table) == [
        "past.h: a chunk span lies outside the text",
        "back.h: a chunk span lies outside the text",
    ]


def test_the_licence_rescan_names_every_kept_file_that_is_not_allowed() -> None:
    from megacpp_pipeline.stages.license import _ALLOWED

    rows = pa.table(
        {"path": ["a.h", "b.h", "c.h"], "license_decision": ["allowed", "denied", "allowed"]}
    )
    assert _ALLOWED.columns == ("path", "license_decision")
    assert _ALLOWED.inspect(None, rows) == ["b.h: denied"]
    assert _ALLOWED.inspect(None, rows.slice(0, 1)) == []


def test_removal_and_scrub_counts_cover_the_files_served_from_the_cache(tmp_path: Path) -> None:
    """A refresh serves most files from the per-file result cache: the counts the card and
    the UI show (files removed by each form of entry, replacements, files scrubbed) are the
    whole version's, the same as a cold run's, not only those of the files computed again."""
    catalog, _ = write_catalog(tmp_path / "corpus")
    catalog.write_text(catalog.read_text() + "removals:\n  - source: tree\n    path: src/lib1.cc\n")

    def counts(label: str) -> dict[str, dict[str, float]]:
        ctx = run_through(context(tmp_path, catalog, label), "scrubbed_files")
        out = {}
        for stage, source in (("removed_files", "tree"), ("scrubbed_files", "tree")):
            stats = ctx.store.latest(stage, source).stats
            out[stage] = {
                k: v
                for k, v in stats.items()
                if k.startswith(("removed_by:", "kind:", "files", "kept", "removed"))
                or k in ("replacements", "scrub_failed")
            }
            out[stage + " cached"] = {"cached_files": stats["cached_files"]}
        return out

    cold = counts("cold")
    assert cold["removed_files"]["removed_by:path"] == 1
    assert cold["scrubbed_files"]["replacements"] > 0
    other = tmp_path / "corpus" / "corpus_dir" / "src" / "lib2.cc"
    other.write_text(other.read_text() + "\nint refreshed() { return 2; }\n")
    refresh = counts("refresh")
    assert refresh["removed_files cached"]["cached_files"] > 0
    assert refresh["scrubbed_files cached"]["cached_files"] > 0
    assert refresh["removed_files"] == cold["removed_files"]
    assert refresh["scrubbed_files"] == cold["scrubbed_files"]
