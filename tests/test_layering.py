"""The library never imports dagster: a trainer can `import megacpp_pipeline.loader`
without pulling in the orchestrator."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import megacpp_pipeline

REPO = Path(__file__).resolve().parent.parent


def test_no_library_module_imports_dagster() -> None:
    modules = [m.name for m in pkgutil.iter_modules(megacpp_pipeline.__path__, "megacpp_pipeline.")]
    assert len(modules) >= 8
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        "bad = sorted(k for k in sys.modules if k == 'dagster' or k.startswith('dagster.'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "", f"dagster imported by the library: {out.stdout}"


def test_no_library_source_mentions_a_dagster_import() -> None:
    for path in (REPO / "megacpp_pipeline").rglob("*.py"):
        text = path.read_text()
        assert "import dagster" not in text and "from dagster" not in text, path
