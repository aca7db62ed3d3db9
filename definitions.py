"""The code location `dagster dev` loads (workspace.yaml): the Definitions built from the
stage registry by `assets.defs.build_defs`, lazily, from MEGACPP_CONFIG / MEGACPP_DATA_DIR /
MEGACPP_CACHE_DIR or the demo's defaults. Nothing is read at import."""

import os

import dagster as dg

from assets.defs import DEFAULT_CACHE_DIR, DEFAULT_CONFIG, DEFAULT_DATA_DIR, build_defs


@dg.definitions
def defs() -> dg.Definitions:
    return build_defs(
        os.environ.get("MEGACPP_CONFIG", str(DEFAULT_CONFIG)),
        os.environ.get("MEGACPP_DATA_DIR", str(DEFAULT_DATA_DIR)),
        cache_dir=os.environ.get("MEGACPP_CACHE_DIR", str(DEFAULT_CACHE_DIR)),
    )
