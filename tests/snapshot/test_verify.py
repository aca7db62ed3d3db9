"""The round-trip promotion check decodes documents in bounded batches and still names the
one document whose tokens no longer decode to its source text."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from megacpp_pipeline.snapshot import verify
from megacpp_pipeline.snapshot.promote import read_manifest
from tests.fixtures.snapshot_fixture import build_snapshot


@pytest.mark.parametrize("batch_tokens", [1 << 20, 64])
def test_round_trip_checks_every_document_in_bounded_batches(tmp_path, monkeypatch, batch_tokens):
    monkeypatch.setattr(verify, "_DECODE_BATCH_TOKENS", batch_tokens)
    fixture = build_snapshot(tmp_path / "snap", docs_per_split={"train": 30, "validation": 6})
    manifest = read_manifest(fixture.path)
    out = verify.check_round_trip(fixture.path, manifest, sample=1000)
    assert out.passed, out.problems
    assert out.metrics["documents_checked"] == 36


def test_round_trip_names_the_document_that_no_longer_decodes(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(verify, "_DECODE_BATCH_TOKENS", 64)
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
