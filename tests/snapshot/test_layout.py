"""The snapshot layout module is the only place the snapshot's file and table names are
spelled: every other module of the library and the Dagster layer refers to them through it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from megacpp_pipeline.snapshot import layout

REPO = Path(__file__).resolve().parents[2]
NAMES = (
    layout.MANIFEST,
    layout.COMPLETE,
    layout.TOKENIZER,
    layout.DOCUMENTS,
    layout.DOCUMENT_FILES,
    layout.PIECES,
    layout.LEDGER,
    layout.CARD,
    f"{layout.DATA}:",
)


def _code_strings(path: Path) -> list[tuple[int, str]]:
    """String constants of a module's code, f-string parts included; docstrings are prose
    and may name a file."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    ]


def _spelled(path: Path) -> list[str]:
    return [
        f"{path.relative_to(REPO)}:{line}: {text!r}"
        for line, text in _code_strings(path)
        for name in NAMES
        if name in text
    ]


def test_no_module_but_the_layout_spells_a_snapshot_name() -> None:
    modules = [
        p
        for top in ("megacpp_pipeline", "assets", "resources")
        for p in sorted((REPO / top).rglob("*.py"))
        if p != REPO / "megacpp_pipeline" / "snapshot" / "layout.py"
    ]
    assert len(modules) > 50
    assert [hit for path in modules for hit in _spelled(path)] == []


def test_the_check_finds_a_spelled_name(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        '"""Reads documents.parquet (prose may name it)."""\n'
        'PATH = "documents.parquet"\n'
        'def f(split):\n    return f"data:{split}"\n'
    )
    found = [(line, text) for line, text in _code_strings(module) if any(n in text for n in NAMES)]
    assert found == [(2, "documents.parquet"), (4, "data:")]


@pytest.mark.parametrize("split", layout.SPLITS)
def test_data_tables_round_trip(split: str) -> None:
    assert layout.is_data_table(layout.data_table(split))
    assert layout.data_table(split) == f"{layout.DATA}:{split}"
    assert layout.data_table() == layout.DATA and layout.is_data_table(layout.DATA)
    assert not layout.is_data_table("ledger")
