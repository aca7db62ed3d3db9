"""Keep pyarrow from importing pandas in the pipeline's own processes.

pyarrow looks for pandas the first time a process converts a Python sequence (`pa.array`
of a list, `pa.table` of a dict): its lazy shim and Arrow's C++ conversion each import
pandas if it is installed, once per process. The pipeline never hands pyarrow a pandas
object, yet with the dev extras installed (`datasets` pulls pandas in) every `megacpp run`
paid that import in its driver: 0.25-0.4 CPU s and about 40 MB of resident memory, shared by
every run group it forks. `skip_pandas_probe()` makes that first conversion while an import
of pandas fails, so both look once, find none, and never look again in this process or the
ones it forks. pandas itself stays importable: `Table.to_pandas` and `from_pandas` import it
when called. What a process that skipped the probe gives up is pyarrow recognizing pandas'
scalars (`pd.NA`, `pd.Timestamp`) inside plain Python lists.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType


class _NoPandas:
    """A meta path finder that refuses pandas (installed only while probing)."""

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name == "pandas" or name.startswith("pandas."):
            raise ImportError("pandas is not probed in a megacpp pipeline process")
        return None


def skip_pandas_probe() -> bool:
    """Make pyarrow's first Python-sequence conversion in this process without pandas; True
    when done here, False when pandas is imported already (nothing to save)."""
    if "pandas" in sys.modules:
        return False
    import pyarrow as pa

    finder = _NoPandas()
    sys.meta_path.insert(0, finder)
    try:
        pa.array(["probe"])  # the shim's and the C++ conversion's one look, both refused
    finally:
        sys.meta_path.remove(finder)
    return True
