"""The built-in stages' names, once: the asset key, the store's folder and the ledger's
`stage`. Each built-in entry takes its name from here, and every stage names what it reads
from here (`input`, `reads`, `config_reads`, `ctx.latest(...)`), so a rename is one line
and `Stage.reads` spells what the code reads. A new gate that no other stage reads may
spell its own name in its entry."""

from __future__ import annotations

SOURCE_CATALOG = "source_catalog"
RAW_FILES = "raw_files"
NORMALIZED_FILES = "normalized_files"
CLASSIFIED_FILES = "classified_files"
QUALITY_FILES = "quality_files"
LICENSED_FILES = "licensed_files"
REMOVED_FILES = "removed_files"
SCRUBBED_FILES = "scrubbed_files"
DEDUPED_FILES = "deduped_files"
DECONTAMINATED_FILES = "decontaminated_files"
ENRICHED_FILES = "enriched_files"
TOKENIZER = "tokenizer"
TOKENIZED_DOCS = "tokenized_docs"
DOCUMENTS = "documents"
PACKED_ROWS = "packed_rows"
SNAPSHOT = "snapshot"
MEGATRON_DATASET = "megatron_dataset"
QUALITY_REPORT = "quality_report"
