"""skip_pandas_probe for real, in fresh interpreters with pandas installed: after it, the
conversions the pipeline makes import no pandas (in the process and in one it forks), and
pandas stays importable and usable with pyarrow; `megacpp`'s code location applies it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("pandas")  # the dev extras install it (datasets); nothing to skip without


def _run(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_the_pipelines_conversions_import_no_pandas_and_pandas_still_works() -> None:
    out = _run(
        """
        import os, sys
        import pyarrow as pa
        from megacpp_pipeline.pipeline.no_pandas import skip_pandas_probe
        assert skip_pandas_probe()
        pa.array(["a"]); pa.table({"n": [1, 2]}); pa.Table.from_pylist([{"x": [1]}])
        pid = os.fork()
        if pid == 0:
            pa.array([b"x"])
            os._exit(3 if "pandas" in sys.modules else 0)
        _, status = os.waitpid(pid, 0)
        print("pandas" in sys.modules, os.waitstatus_to_exitcode(status))
        import pandas as pd
        print(pa.Table.from_pandas(pd.DataFrame({"a": [1, 2]})).to_pandas()["a"].tolist())
        """
    )
    assert out.splitlines() == ["False 0", "[1, 2]"]


def test_without_the_skip_pyarrow_imports_pandas() -> None:
    """The control: the same conversion imports pandas when nothing skipped the probe."""
    assert (
        _run("import sys, pyarrow as pa; pa.array(['a']); print('pandas' in sys.modules)") == "True"
    )


def test_the_code_location_skips_it() -> None:
    out = _run(
        """
        import sys
        import assets.defs
        import pyarrow as pa
        pa.table({"n": [1]})
        print("pandas" in sys.modules)
        """
    )
    assert out == "False"
