"""The Dagster shell: definitions load and validate, every gate carries a blocking check,
the UI groups the gates in order."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

GATES = [
    "source_catalog",
    "raw_files",
    "normalized_files",
    "licensed_files",
    "scrubbed_files",
    "deduped_files",
    "enriched_files",
    "tokenizer",
    "tokenized_docs",
    "packed_rows",
    "snapshot",
    "megatron_dataset",
    "quality_report",
]

_PROBE = """
import json, warnings
warnings.filterwarnings("ignore")
import definitions
defs = definitions.defs
graph = defs.resolve_asset_graph()
out = {}
for key in graph.get_all_asset_keys():
    node = graph.get(key)
    checks = [c for c in graph.asset_check_keys if c.asset_key == key]
    blocking = [c.name for c in checks if graph.get_check_spec(c).blocking]
    out[key.to_user_string()] = {
        "group": node.group_name,
        "blocking": blocking,
        "partitioned": node.partitions_def is not None,
        "description": bool(node.description),
        "deps": sorted(k.to_user_string() for k in node.parent_keys),
    }
print(json.dumps(out))
"""


def _env() -> dict[str, str]:
    return {**os.environ, "MEGACPP_CONFIG": str(REPO / "examples/demo/sources.yaml")}


def test_every_gate_is_an_asset_with_a_blocking_check_and_a_description() -> None:
    import json

    out = subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=REPO, env=_env(), capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-3000:]
    graph = json.loads(out.stdout.strip().splitlines()[-1])
    for gate in GATES:
        assert gate in graph, f"{gate} missing from the definitions"
        assert graph[gate]["blocking"], f"{gate} has no blocking asset check"
        assert graph[gate]["description"], f"{gate} has no description"
    assert graph["raw_files"]["partitioned"] and not graph["deduped_files"]["partitioned"]
    assert graph["normalized_files"]["deps"] == ["raw_files"]
    assert graph["deduped_files"]["deps"] == ["scrubbed_files"]
    assert {g["group"] for g in graph.values()} >= {"collect", "gates", "tokens", "snapshot"}
    assert len(graph["snapshot"]["blocking"]) == 8


def test_dagster_definitions_validate_passes_on_the_workspace(tmp_path: Path) -> None:
    import shutil

    shutil.copyfile(REPO / "dagster.yaml", tmp_path / "dagster.yaml")
    dagster = Path(sys.executable).parent / "dagster"
    out = subprocess.run(
        [str(dagster), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=REPO,
        env={**_env(), "DAGSTER_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]


def test_a_bad_catalog_fails_definitions_loading_with_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "sources.yaml"
    bad.write_text("snapshot: x\nsources:\n  - id: a\n    kind: dir\n    uri: .\n    rol: x\n")
    out = subprocess.run(
        [sys.executable, "-c", "import definitions"],
        cwd=REPO,
        env={**_env(), "MEGACPP_CONFIG": str(bad)},
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0
    assert "source 'a': field rol: unknown key" in out.stderr
