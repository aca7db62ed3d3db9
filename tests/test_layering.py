"""The library never imports the Dagster shell or dagster itself: a trainer can
`import megacpp_pipeline.loader` without pulling in the orchestrator, and the library's CLI
works without it. The shell (assets/, resources/, definitions.py) is the only Dagster code."""

from __future__ import annotations

import ast
import importlib.util
import pkgutil
import subprocess
import sys
from pathlib import Path

import megacpp_pipeline

REPO = Path(__file__).resolve().parent.parent
SHELL = ("dagster", "assets", "resources", "definitions")
# library modules that exist for an optional extra and need it to import (the static test
# below still reads their source): module -> the package it needs
OPTIONAL = {"megacpp_pipeline.pipeline.ray_engine": "ray"}


def test_no_library_module_imports_dagster_or_the_shell() -> None:
    modules = [
        m.name
        for m in pkgutil.walk_packages(megacpp_pipeline.__path__, "megacpp_pipeline.")
        if m.name not in OPTIONAL or importlib.util.find_spec(OPTIONAL[m.name]) is not None
    ]
    assert len(modules) >= 40
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        f"bad = sorted(k for k in sys.modules if k.split('.')[0] in {SHELL!r})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "", f"imported by the library: {out.stdout}"


def test_no_library_source_imports_the_shell_even_inside_a_function() -> None:
    for path in sorted((REPO / "megacpp_pipeline").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] not in SHELL, f"{path}:{node.lineno} imports {name}"


# The library's own layers, lowest first: a module may import its own layer and those
# below it, never one above. core holds the contracts (rows, ledger, catalog), storage the
# shard store, the per-file and corpus-wide algorithms sit on both, snapshot and loader read
# what they write, pipeline runs stages over all of it, stages declare the DAG, cli is the
# edge that reads the environment; plan (the pre-flight forecast of a run's stage groups, a
# command of that edge) sizes sources with collect and forecasts the registry's groups.
LAYERS = {
    "core": 0,
    "storage": 1,
    "collect": 2,
    "gates": 2,
    "corpus": 2,
    "snapshot": 3,
    "loader": 3,
    "pipeline": 4,
    "stages": 5,
    "cli": 6,
    "plan": 6,
}


# The snapshot's format modules: the file and table names and the packed-row contract.
# Writers in every layer and the loader share them, so any layer may import them; they
# import nothing from the library but each other.
FORMAT = ("megacpp_pipeline.snapshot.layout", "megacpp_pipeline.snapshot.packed_rows")


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "megacpp_pipeline" or len(parts) < 2 or parts[1] == "__init__":
        return None
    return LAYERS[parts[1]]


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from package import module` imports that module (and the package's __init__)
            found += [
                (node.lineno, f"{node.module}.{a.name}")
                if _is_module(f"{node.module}.{a.name}")
                else (node.lineno, node.module)
                for a in node.names
            ]
    return found


def _is_module(name: str) -> bool:
    path = REPO / name.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def test_every_library_package_has_a_layer() -> None:
    packages = {p.name for p in (REPO / "megacpp_pipeline").iterdir() if p.is_dir()}
    modules = {p.stem for p in (REPO / "megacpp_pipeline").glob("*.py")} - {"__init__"}
    assert (packages | modules) - {"__pycache__"} == set(LAYERS)


def test_no_library_module_imports_a_layer_above_its_own() -> None:
    upward = []
    for path in sorted((REPO / "megacpp_pipeline").rglob("*.py")):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts)
        own = _layer(module)
        for line, name in _imports(path):
            theirs = _layer(name)
            if name in FORMAT:
                continue
            if own is not None and theirs is not None and theirs > own:
                upward.append(f"{module}:{line} imports {name}")
    assert upward == []


def test_the_format_modules_import_nothing_from_the_library() -> None:
    for module in FORMAT:
        path = REPO / (module.replace(".", "/") + ".py")
        inward = [
            n
            for _, n in _imports(path)
            if n.split(".")[0] == "megacpp_pipeline" and n not in FORMAT
        ]
        assert inward == [], f"{module} imports {inward}"
