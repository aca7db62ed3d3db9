"""The pipeline's stages in order: the registry every other part derives from. Each entry
lives in a module of its own in this package (what the stage reads, writes and checks); the
work itself is in the gate and corpus modules it calls.

To add a per-file gate: write the gate (megacpp_pipeline/gates/<name>.py), its entry
(megacpp_pipeline/stages/<name>.py, a `Stage` with `gate=`), and add one line below,
`.insert(<name>.STAGE, after=names.<stage>)`: the stage that read `<stage>`'s output reads
the gate's instead, so no other stage module changes.
"""

from __future__ import annotations

from megacpp_pipeline.pipeline.registry import Registry
from megacpp_pipeline.stages import (
    catalog,
    collect,
    decontaminate,
    dedup,
    documents,
    enrich,
    language,
    license,
    megatron,
    normalize,
    packing,
    quality,
    removals,
    report,
    scrub,
    snapshot,
    tokenize,
    tokenizer,
)


def default_registry() -> Registry:
    return Registry(
        [
            catalog.STAGE,
            collect.STAGE,
            normalize.STAGE,
            language.STAGE,
            quality.STAGE,
            license.STAGE,
            removals.STAGE,
            scrub.STAGE,
            dedup.STAGE,
            decontaminate.STAGE,
            enrich.STAGE,
            tokenizer.STAGE,
            tokenize.STAGE,
            documents.STAGE,
            packing.STAGE,
            snapshot.STAGE,
            megatron.STAGE,
            report.STAGE,
        ]
    )  # a new per-file gate: .insert(<module>.STAGE, after=names.<the stage before it>)
