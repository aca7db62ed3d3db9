"""Why a JSONL conversion cannot go on: one exception type per rule, each str() one line
naming the file and the rule (the CLI prints it as is).
"""

from __future__ import annotations


class JsonlIngestError(Exception):
    """A conversion that cannot go on; str() is one line naming the file and the rule."""


class InputMissingError(JsonlIngestError):
    pass


class InputChangedError(JsonlIngestError):
    """The input no longer matches what the state file says was ingested."""


class ResumeConfigMismatchError(JsonlIngestError):
    pass


class ShardValidationError(JsonlIngestError):
    pass


class OutputLockedError(JsonlIngestError):
    pass


class ShardTooLargeError(JsonlIngestError):
    pass


class CompressedInputError(JsonlIngestError):
    """The input is a compressed file (gzip, zstd, ...), not JSONL text."""
