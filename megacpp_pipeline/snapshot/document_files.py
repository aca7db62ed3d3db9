"""document_files.parquet: where every kept file of a snapshot sits (its document, position
and token span; schemas.DOCUMENT_FILES), read the same way by every snapshot reader."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from megacpp_pipeline.corpus.repository import file_document_files
from megacpp_pipeline.snapshot import layout

_LOW_CARDINALITY = ("source_id", "license_expression")


def doc_id_filter(lo: int | None, hi: int | None) -> list[tuple[str, str, int]] | None:
    """The rows whose doc_id is in [lo, hi) (None: unbounded on that side), as a parquet
    filter: row groups whose statistics lie outside are never read."""
    bounds = []
    if lo is not None:
        bounds.append(("doc_id", ">=", int(lo)))
    if hi is not None:
        bounds.append(("doc_id", "<", int(hi)))
    return bounds or None


def read_labelled(
    path: Path,
    columns: list[str] | None,
    labels: list[str],
    doc_ids: tuple[int | None, int | None] = (None, None),
) -> pa.Table:
    """A snapshot table with its low-cardinality string columns (`labels`) dictionary-encoded:
    a few bytes a row where a Python string per row would be held. Every row group brings its
    own dictionary; they are unified here so Arrow can group across them. `doc_ids`: only
    the rows whose doc_id is in that [lo, hi)."""
    filters = doc_id_filter(*doc_ids)
    table = pq.read_table(path, columns=columns, read_dictionary=labels, filters=filters)
    return table.unify_dictionaries()


def read_document_files(
    snapshot_dir: Path,
    columns: list[str] | None = None,
    *,
    dictionary: bool = False,
    doc_ids: tuple[int | None, int | None] = (None, None),
) -> pa.Table:
    """The snapshot's document_files, in doc_id then position order (`dictionary`: source
    and licence dictionary-encoded, a few bytes a file; `doc_ids`: only the files of the
    documents in that [lo, hi)). A snapshot from before document_files.parquet (schema
    version 1) had one file per document: its table is derived from documents.parquet."""
    path = Path(snapshot_dir) / layout.DOCUMENT_FILES
    if path.exists():
        wanted = [c for c in _LOW_CARDINALITY if columns is None or c in columns]
        return read_labelled(path, columns, wanted if dictionary else [], doc_ids)
    documents = pq.read_table(
        Path(snapshot_dir) / layout.DOCUMENTS, filters=doc_id_filter(*doc_ids)
    )
    if "text_tokens" in documents.column_names:  # num_tokens there is as packed (BOS, EOS)
        documents = documents.drop_columns(["num_tokens"])
        documents = documents.rename_columns(
            ["num_tokens" if n == "text_tokens" else n for n in documents.column_names]
        )
    derived = file_document_files(documents)
    return derived.select(columns) if columns is not None else derived
