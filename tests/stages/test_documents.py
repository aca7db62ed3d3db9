"""The documents stage's own computations: file-mode documents numbered on from a first
doc_id with their one member, and the document_files consistency rules (every kept file in
exactly one document, members at 0..n-1 tiling the document) each named when broken."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from megacpp_pipeline.core.schemas import DOCUMENT_FILES, DOCUMENT_TOKENS, TOKENIZED_DOCS
from megacpp_pipeline.corpus.repository import document_files_problems
from megacpp_pipeline.stages.documents import file_documents


def tokenized(paths: list[str], lengths: list[int]) -> pa.Table:
    rows: list[dict[str, Any]] = []
    for path, n in zip(paths, lengths, strict=True):
        rows.append({
            "source_id": "s", "path": path, "revision": "r", "blob_sha": "b", "size": n,
            "content_sha256": f"sha-{path}", "language": "c++", "vendored": False,
            "license_expression": "MIT", "license_source": "file", "scrub_kinds": [],
            "structure_source": "syntax", "split": "train", "num_tokens": n,
            "token_ids": list(range(n)), "chunk_kind": [0] * n,
        })  # fmt: skip
    return pa.Table.from_pylist(rows, schema=TOKENIZED_DOCS)


def test_file_documents_number_on_from_the_first_id_each_with_one_member_at_zero() -> None:
    docs = file_documents(tokenized(["a.h", "b.h"], [3, 5]), first_doc_id=7)
    assert docs.schema == DOCUMENT_TOKENS
    assert docs["doc_id"].to_pylist() == [7, 8]
    assert docs["num_files"].to_pylist() == [1, 1]
    assert docs["member_starts"].to_pylist() == [[0], [0]]
    assert docs["token_ids"].to_pylist() == [[0, 1, 2], [0, 1, 2, 3, 4]]
    assert file_documents(tokenized([], []), 3).num_rows == 0


def test_file_documents_name_the_columns_a_table_without_classes_lacks() -> None:
    with pytest.raises(ValueError, match=r"lack columns \['language', 'vendored'\]"):
        file_documents(tokenized(["a.h"], [2]).drop(["language", "vendored"]), 0)


def _member(doc: int, position: int, path: str, start: int, n: int) -> dict[str, Any]:
    return {
        "doc_id": doc,
        "position": position,
        "source_id": "s",
        "path": path,
        "content_sha256": f"sha-{path}",
        "license_expression": "MIT",
        "start_token": start,
        "num_tokens": n,
    }


def _repository() -> tuple[pa.Table, pa.Table]:
    """Two documents: doc 0 holds a.h (4 tokens) then b.h (6); doc 1 holds c.h (5)."""
    documents = pa.table({"doc_id": pa.array([0, 1], pa.int32()), "num_files": [2, 1],
                          "num_tokens": [10, 5]})  # fmt: skip
    files = pa.Table.from_pylist(
        [_member(0, 0, "a.h", 0, 4), _member(0, 1, "b.h", 4, 6), _member(1, 0, "c.h", 0, 5)],
        schema=DOCUMENT_FILES,
    )
    return documents, files


def _with(files: pa.Table, row: int, **changes: Any) -> pa.Table:
    rows = files.to_pylist()
    rows[row].update(changes)
    return pa.Table.from_pylist(rows, schema=DOCUMENT_FILES)


def test_consistent_documents_and_files_have_no_problem() -> None:
    documents, files = _repository()
    assert document_files_problems(documents, files, {"s": 3}) == []


@pytest.mark.parametrize(
    ("row", "changes", "kept", "problem"),
    [
        (1, {"path": "a.h"}, 3, "document_files: a file is listed more than once"),
        (1, {"start_token": 5}, 3, "doc 0: member 1 does not start where the last ends"),
        (1, {"position": 2}, 3, "doc 0: member positions are not 0..n-1"),
        (1, {"num_tokens": 7}, 3, "doc 0: document_files hold 11 tokens, documents say 10"),
        (
            2,
            {"doc_id": 0, "position": 2, "start_token": 10},
            3,
            "doc 0: document_files hold 3 files",
        ),
        (0, {}, 4, "s: 4 kept files but 3 in documents"),
    ],
)
def test_each_inconsistency_is_named(
    row: int, changes: dict[str, Any], kept: int, problem: str
) -> None:
    documents, files = _repository()
    problems = document_files_problems(documents, _with(files, row, **changes), {"s": kept})
    assert any(p.startswith(problem) for p in problems), problems


def test_doc_ids_that_skip_a_number_are_named() -> None:
    documents, files = _repository()
    documents = documents.set_column(0, "doc_id", pa.array([0, 2], pa.int32()))
    assert "documents: doc_ids are not 0..N-1 in order" in document_files_problems(
        documents, files, {"s": 3}
    )
