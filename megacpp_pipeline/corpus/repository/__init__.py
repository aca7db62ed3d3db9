"""Repository-level documents (`stages: {documents: {mode: repository}}`): a source's kept files
grouped (the whole source, split along directories past `max_tokens`) and concatenated in
`#include` order, each file introduced by a path marker, for long-context training; file mode
(one document per file) stays the default and is untouched by anything here.

The path marker is a comment line, `// <path>\\n`, tokenized as ordinary text, not a special
token. A special token needs an id in the tokenizer: the ids are fixed (SPECIAL_TOKENS, 0..12)
and checked on every load, and a pinned `tokenizer.json` we did not train has no
`<|file_sep|>` to give, so a special would work only for tokenizers we train. A comment line
works with any tokenizer, keeps every document valid C++ (the concatenation still reads as
code, as DeepSeek-Coder's path comments do), and decodes back to exactly the text the
document holds. What it costs: a few tokens per file (measured in bench_repository), and the
marker is not machine-findable in the token stream, so `document_files` (start_token,
num_tokens) is how a file is found, and FIM per file takes its member boundaries from there.
A file that does not end in a newline is given one (its member's separator), so every marker
stays a line of its own.

Modules: config.py (DocumentsConfig), includes.py (directives, roots, resolution),
order.py (include order, cycles), grouping.py (directory split), assemble.py (token streams,
document_files, the stage-facing build_repository_documents), telemetry.py (length
distribution, rows that hold one document end to end).
"""

from megacpp_pipeline.corpus.repository.assemble import (
    DOCUMENT_FILES,
    MARKER_KIND,
    REPOSITORY_DOCUMENTS,
    RepositoryDocuments,
    RepositoryInputError,
    build_repository_documents,
    document_files_problems,
    file_document_files,
    marker_text,
    separator_text,
    split_member,
)
from megacpp_pipeline.corpus.repository.config import DocumentMode, DocumentsConfig
from megacpp_pipeline.corpus.repository.grouping import PlannedDocument, plan_documents
from megacpp_pipeline.corpus.repository.includes import (
    Include,
    IncludeGraph,
    default_include_roots,
    include_graph,
    scan_includes,
)
from megacpp_pipeline.corpus.repository.order import Ordering, include_order
from megacpp_pipeline.corpus.repository.telemetry import (
    LengthDistribution,
    WholeDocumentRows,
    distribution_of_counts,
    length_counts,
    length_distribution,
    whole_document_rows,
)

__all__ = [
    "DOCUMENT_FILES",
    "MARKER_KIND",
    "REPOSITORY_DOCUMENTS",
    "DocumentMode",
    "DocumentsConfig",
    "Include",
    "IncludeGraph",
    "LengthDistribution",
    "Ordering",
    "PlannedDocument",
    "RepositoryDocuments",
    "RepositoryInputError",
    "WholeDocumentRows",
    "build_repository_documents",
    "default_include_roots",
    "distribution_of_counts",
    "document_files_problems",
    "file_document_files",
    "include_graph",
    "include_order",
    "length_counts",
    "length_distribution",
    "marker_text",
    "plan_documents",
    "scan_includes",
    "separator_text",
    "split_member",
    "whole_document_rows",
]
