"""megacpp-pipeline: pinned C++ sources in, promoted packed-row training snapshots out.

The library never imports dagster; `assets/` and `resources/` are the thin Dagster shell.
"""

__version__ = "0.1.0"
