"""Each module's libraries read off its imports and resolved to their installed versions:
a real distribution written into a temporary folder stands for an upgrade, and each version
is read by a fresh interpreter, as a run after the upgrade would."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from megacpp_pipeline.pipeline.libraries import library_versions
from megacpp_pipeline.stages import default_registry

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "examples" / "demo" / "sources.yaml"


def _distribution(root: Path, name: str, version: str) -> None:
    """A real installed distribution (its dist-info) providing the module `name`."""
    (root / name).mkdir(exist_ok=True)
    (root / name / "__init__.py").write_text("")
    info = root / f"{name}-0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "top_level.txt").write_text(f"{name}\n")
    (info / "RECORD").write_text(f"{name}/__init__.py,,\n")


_VERSIONS = """
import json, sys
from megacpp_pipeline.pipeline.libraries import library_versions
from megacpp_pipeline.pipeline.registry import Grain, Registry, Stage
from tests.fixtures.catalogs import load_catalog
stage = Stage(name="g", grain=Grain.GLOBAL, description="", group="g", code=("fakegate",),
              body=lambda *a: None)
version = Registry([stage]).code_version(stage, load_catalog(sys.argv[1]))
print(json.dumps([library_versions(["fakegate"]), version]))
"""


def test_a_librarys_version_is_part_of_the_code_of_each_stage_importing_it(
    tmp_path: Path,
) -> None:
    """A new grammar or encoder under the same gate code makes the stage stale and its
    result cache another namespace (each version read by a fresh interpreter, as a run
    after an upgrade would)."""
    (tmp_path / "fakegate.py").write_text(
        "import os, json as j\n"
        "def parse(text):\n"
        "    from fakegrammar.tables import rules  # a lazy import counts too\n"
        "    return rules\n"
    )

    def versions(grammar: str) -> tuple[list[str], str]:
        _distribution(tmp_path, "fakegrammar", grammar)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))
        out = subprocess.run(
            [sys.executable, "-c", _VERSIONS, str(DEMO)], env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        libraries, version = json.loads(out.stdout)
        return libraries, version

    old, old_version = versions("1.0")
    new, new_version = versions("1.1")
    py = f"python=={sys.version_info.major}.{sys.version_info.minor}"
    assert old == [py, "fakegrammar==1.0"]
    assert new == [py, "fakegrammar==1.1"]
    assert old_version != new_version
    assert versions("1.0")[1] == old_version  # stable: the same environment, the same version


def test_an_optional_import_that_is_not_installed_reads_absent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "optgate.py").write_text(
        "try:\n    import surely_not_installed_xyz\nexcept ImportError:\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "surely_not_installed_xyz==absent" in library_versions(["optgate"])


@pytest.mark.parametrize(
    ("stage", "libraries"),
    [
        ("enriched_files", ["tree-sitter", "tree-sitter-cpp"]),
        ("tokenized_docs", ["tiktoken", "tokenizers"]),
        ("scrubbed_files", ["detect-secrets", "google-re2"]),  # re2 is google-re2's module
        ("licensed_files", ["license-expression", "reuse"]),
        ("quality_files", ["polars", "pyarrow"]),
    ],
)
def test_the_stages_carry_the_libraries_that_decide_for_them(
    stage: str, libraries: list[str]
) -> None:
    got = library_versions(default_registry().get(stage).code)
    for name in libraries:
        assert f"{name}=={importlib.metadata.version(name)}" in got


def test_a_module_no_distribution_provides_reads_local(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A project's own helper beside a gate it added (tests/pipeline/test_adding_a_gate.py
    adds one from the tests package): code, versioned where a stage lists it, not refused."""
    (tmp_path / "strayhelper.py").write_text("X = 1\n")  # on the path, installed by nobody
    (tmp_path / "straygate.py").write_text("import os, strayhelper as h\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert library_versions(["straygate"])[1:] == ["strayhelper==local"]
