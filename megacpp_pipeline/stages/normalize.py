"""normalized_files: UTF-8, LF-normalized C/C++ text; binaries, Git LFS and git-annex
pointers, minified, generated and non-C++ files dropped with a reason (the cheap filters,
first). Oversized files never get here: collection applies the one size policy."""

from __future__ import annotations

from megacpp_pipeline.core.ledger import DropReason
from megacpp_pipeline.core.schemas import NORMALIZED_FILES
from megacpp_pipeline.gates import normalize
from megacpp_pipeline.pipeline.context import SourceInputs
from megacpp_pipeline.pipeline.registry import Grain, PreparedGate, Stage
from megacpp_pipeline.stages import names


def _gate(inputs: SourceInputs) -> PreparedGate:
    config = inputs.config
    return PreparedGate(lambda table: normalize.run(table, config))


STAGE = Stage(
    name=names.NORMALIZED_FILES,
    grain=Grain.PER_SOURCE,
    group="gates",
    description="UTF-8, LF-normalized C/C++ text with its original encoding recorded; binaries,"
    " LFS/annex pointers, minified/data-like, generated and non-C++ files dropped with a reason.",
    input=names.RAW_FILES,
    config_key="normalize",
    config=normalize.NormalizeConfig,
    code=(normalize.__name__, __name__),
    schema=NORMALIZED_FILES,
    content_column="blob_sha",
    cache_from={"text": "content"},  # a file already UTF-8 and LF: its text is its bytes
    drop_reasons=(
        DropReason.BINARY,
        DropReason.UNDECODABLE,
        DropReason.EMPTY,
        DropReason.POINTER_FILE,
        DropReason.LONG_LINES,
        DropReason.MEAN_LINE_LENGTH,
        DropReason.LOW_ALNUM,
        DropReason.GENERATED_FILE,
        DropReason.NOT_CPP,
    ),
    writes_ledger=True,
    gate=_gate,
)
