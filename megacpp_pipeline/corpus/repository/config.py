"""The documents stage's config: what a document is (one file, or one repository's files in
include order) and how long a repository document may grow before it is split by directory.
Every threshold of the repository package lives here."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

# The longest rows the pipeline trains on (the long-context seq_len of the issue).
LONG_CONTEXT_SEQ_LEN = 65536


class DocumentMode(StrEnum):
    FILE = "file"  # one document per kept file (the behaviour before repository mode)
    REPOSITORY = "repository"  # a source's files concatenated in #include order


class DocumentsConfig(BaseModel):
    """`stages: {documents: {mode: file | repository, max_tokens: N}}`."""

    model_config = ConfigDict(extra="forbid")

    mode: DocumentMode = DocumentMode.FILE
    # A repository document's own tokens (path markers included, BOS/EOS not). The default is
    # the longest row less BOS and EOS: every document that is not one oversized file then
    # fits one row at seq_len 65536 whole, and a source larger than that is split along its
    # directories rather than cut mid-file by the packer. Lower it for shorter contexts.
    max_tokens: int = Field(default=LONG_CONTEXT_SEQ_LEN - 2, ge=1)
