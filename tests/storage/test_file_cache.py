"""The per-file result cache: a refresh recomputes only changed files, gives the same output
as a cold run, and a config or code change invalidates exactly its stage."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from megacpp_pipeline.core.gate import GateResult
from megacpp_pipeline.core.ledger import LEDGER_SCHEMA
from megacpp_pipeline.core.schemas import NORMALIZED_FILES, RAW_FILES, git_blob_sha
from megacpp_pipeline.gates import normalize
from megacpp_pipeline.storage.file_cache import FileResultCache, cached_gate_call, row_keys

SCHEMAS = {"kept": NORMALIZED_FILES, "dropped": LEDGER_SCHEMA}


def _raw(files: dict[str, bytes]) -> pa.Table:
    paths = sorted(files)
    return pa.table(
        {
            "source_id": ["demo"] * len(paths),
            "path": paths,
            "revision": ["r"] * len(paths),
            "blob_sha": [git_blob_sha(files[p]) for p in paths],
            "size": [len(files[p]) for p in paths],
            "content": [files[p] for p in paths],
        },
        schema=RAW_FILES,
    )


def _corpus(n: int = 40) -> dict[str, bytes]:
    files = {
        f"include/m{i}.hpp": (
            f"#pragma once\nnamespace m{i} {{\ninline int value() {{ return {i}; }}\n}}\n"
        ).encode()
        for i in range(n)
    }
    files["include/blob.h"] = b"\x00\x01\x02" * 50  # dropped as binary: cached as a drop too
    return files


class CountingGate:
    """The real normalize gate, counting how many files it actually saw."""

    def __init__(self, config: normalize.NormalizeConfig) -> None:
        self.config = config
        self.files_seen = 0

    def __call__(self, table: pa.Table) -> GateResult:
        self.files_seen += table.num_rows
        return normalize.run(table, self.config)


def _call(cache: FileResultCache, table: pa.Table, gate: CountingGate) -> GateResult:
    result, _hits = cached_gate_call(cache, table, row_keys(table, "blob_sha"), gate, SCHEMAS)
    return result


def test_a_refresh_with_one_changed_file_recomputes_only_that_file(tmp_path: Path) -> None:
    cfg = normalize.NormalizeConfig()
    cache = FileResultCache(tmp_path, "normalize", "code-1", "cfg-1")
    files = _corpus()
    cold_gate = CountingGate(cfg)
    cold = _call(cache, _raw(files), cold_gate)
    assert cold_gate.files_seen == 41
    assert cold.kept.num_rows == 40 and cold.dropped.num_rows == 1

    files["include/m7.hpp"] = b"#pragma once\nint changed() { return 7; }\n"
    warm_gate = CountingGate(cfg)
    warm = _call(FileResultCache(tmp_path, "normalize", "code-1", "cfg-1"), _raw(files), warm_gate)
    assert warm_gate.files_seen == 1
    reference = normalize.run(_raw(files), cfg)
    assert warm.kept.equals(reference.kept)
    assert warm.dropped.equals(reference.dropped)


def test_a_fully_cached_run_gives_the_cold_output_without_calling_the_gate(
    tmp_path: Path,
) -> None:
    cfg = normalize.NormalizeConfig()
    table = _raw(_corpus())
    cold = _call(FileResultCache(tmp_path, "normalize", "c", "k"), table, CountingGate(cfg))
    gate = CountingGate(cfg)
    warm = _call(FileResultCache(tmp_path, "normalize", "c", "k"), table, gate)
    assert gate.files_seen == 0
    assert warm.kept.equals(cold.kept) and warm.dropped.equals(cold.dropped)


def test_config_or_code_change_invalidates_exactly_that_stage(tmp_path: Path) -> None:
    cfg = normalize.NormalizeConfig()
    table = _raw(_corpus(10))
    _call(FileResultCache(tmp_path, "normalize", "c1", "k1"), table, CountingGate(cfg))
    _call(FileResultCache(tmp_path, "scrub", "c1", "k1"), table, CountingGate(cfg))
    for code, conf in (("c2", "k1"), ("c1", "k2")):
        gate = CountingGate(cfg)
        _call(FileResultCache(tmp_path, "normalize", code, conf), table, gate)
        assert gate.files_seen == 11
    untouched = CountingGate(cfg)
    _call(FileResultCache(tmp_path, "scrub", "c1", "k1"), table, untouched)
    assert untouched.files_seen == 0


def test_an_entry_without_its_index_file_is_a_miss(tmp_path: Path) -> None:
    cfg = normalize.NormalizeConfig()
    table = _raw(_corpus(5))
    cache = FileResultCache(tmp_path, "normalize", "c", "k")
    _call(cache, table, CountingGate(cfg))
    for index in Path(cache.dir).glob("e-*.arrow"):
        if index.name.count(".") == 1:
            index.unlink()  # as if the process died before writing it
    gate = CountingGate(cfg)
    _call(FileResultCache(tmp_path, "normalize", "c", "k"), table, gate)
    assert gate.files_seen == 6
