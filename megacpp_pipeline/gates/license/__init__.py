"""The license gate: decides, per file, which licence governs it (SPDX tags, REUSE metadata, a
standard notice, the source's declared licence, none: in that order) and whether policy lets
it into the corpus. Seed rule: read file-level metadata, not repository badges, and validate
every id and exception against the real SPDX lists.

gate.py runs it over a table; beside it: spdx.py (the pinned lists), expressions.py (parsing
and validation), header.py (leading comments, SPDX tags), notices.py (standard notice texts),
reuse.py (REUSE metadata), policy.py (allow lists and the decision), config.py.
"""

from megacpp_pipeline.gates.license.config import LicenseConfig
from megacpp_pipeline.gates.license.expressions import (
    Combination,
    ExpressionNode,
    LicenseTerm,
    ParsedExpression,
    combine_and,
    parse_expression,
)
from megacpp_pipeline.gates.license.gate import (
    LicenseInputError,
    LicenseSource,
    markdown_summary,
    run,
)
from megacpp_pipeline.gates.license.header import find_spdx_identifiers, leading_comments
from megacpp_pipeline.gates.license.notices import match_notice
from megacpp_pipeline.gates.license.policy import Decision, DecisionKind, LicensePolicy, decide
from megacpp_pipeline.gates.license.reuse import ReuseMetadataError, is_reuse_metadata_path
from megacpp_pipeline.gates.license.spdx import SpdxLists, spdx_lists

__all__ = [
    "Combination",
    "Decision",
    "DecisionKind",
    "ExpressionNode",
    "LicenseConfig",
    "LicenseInputError",
    "LicensePolicy",
    "LicenseSource",
    "LicenseTerm",
    "ParsedExpression",
    "ReuseMetadataError",
    "SpdxLists",
    "combine_and",
    "decide",
    "find_spdx_identifiers",
    "is_reuse_metadata_path",
    "leading_comments",
    "markdown_summary",
    "match_notice",
    "parse_expression",
    "run",
    "spdx_lists",
]
