"""classified_files: each file's language (`c++` or `c`; headers decided from their content
and the source's other files) and whether it is a vendored copy of another project; C-only
files are dropped as not_cpp unless `stages.language.keep_c`."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Mapping
from typing import Any

import pyarrow.compute as pc

from megacpp_pipeline.core.gate import GateResult
from megacpp_pipeline.core.ledger import DropReason
from megacpp_pipeline.core.schemas import CLASSIFIED_FILES
from megacpp_pipeline.gates import language
from megacpp_pipeline.pipeline.context import SourceInputs, StageContext
from megacpp_pipeline.pipeline.registry import Grain, Markdown, PreparedGate, Stage
from megacpp_pipeline.stages import names
from megacpp_pipeline.storage.store import Manifest


def _gate(inputs: SourceInputs) -> PreparedGate:
    config, spec = inputs.config, inputs.source
    # every file seen in the source, kept or not (a .c file outside the include globs still
    # says the source is C): the collect ledger lists them all
    seen = [
        p for t in inputs.tables(names.RAW_FILES, "ledger", ["path"]) for p in t["path"].to_pylist()
    ]
    siblings = language.Siblings.of(seen, config)
    prefixes = list(spec.vendored_paths)
    salt = hashlib.sha256(f"{siblings.fingerprint()}\0{prefixes}".encode()).hexdigest()[:16]
    return PreparedGate(lambda table: language.run(table, config, siblings, prefixes), salt=salt)


def class_counts(result: GateResult) -> Counter[str]:
    """Files per language and vendored files, over a gate result's kept rows."""
    kept = result.kept
    out: Counter[str] = Counter(f"language:{v}" for v in kept["language"].to_pylist())
    out["vendored:kept"] = int(pc.sum(kept["vendored"]).as_py() or 0)
    return out


def _report(ctx: StageContext, manifest: Manifest, stats: Mapping[str, float]) -> dict[str, Any]:
    rows = [
        f"| {k.removeprefix('language:')} | {int(v)} |"
        for k, v in sorted(stats.items())
        if k.startswith("language:")
    ]
    return {
        "vendored_files": int(stats.get("vendored:kept", 0)),
        "languages": Markdown("\n".join(["| language | kept files |", "|---|---:|", *rows])),
    }


STAGE = Stage(
    name=names.CLASSIFIED_FILES,
    grain=Grain.PER_SOURCE,
    group="gates",
    description="Each file's language (c++ or c; headers by their content and the source's "
    "other files) and a vendored flag (third_party/, vendor/, ... or the catalog's "
    "vendored_paths); C-only files dropped as not_cpp unless keep_c.",
    input=names.NORMALIZED_FILES,
    reads=(names.RAW_FILES,),
    config_key="language",
    config=language.LanguageConfig,
    code=(
        language.__name__,
        "megacpp_pipeline.gates.vendored",
        "megacpp_pipeline.gates.cpp_text",
        __name__,
    ),
    schema=CLASSIFIED_FILES,
    content_column="content_sha256",
    drop_reasons=(DropReason.NOT_CPP,),
    writes_ledger=True,
    gate=_gate,
    summarize=class_counts,
    report=_report,
)
