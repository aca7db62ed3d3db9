"""Enrichment gate against a bare tree-sitter parse loop over the same files, in one run
(issue 6, "Measured"), plus the share of demo bytes per chunk kind and the parse_error_ratio
distribution on real library headers that calibrates `EnrichConfig.max_parse_error_ratio`.

Corpora: the demo wheels (pythran 0.19.0, pybind11 3.1.0, nanobind 3.1.0 unzipped under
--wheels; fetch with `pip download --no-deps pythran==0.19.0 pybind11==3.1.0 nanobind==3.1.0
-d /tmp/wheels` and unzip each into /tmp/wheels/x/<name>) and Debian's libc++-14, nlohmann
and a deterministic sample of Boost headers when those packages are installed.

    .venv/bin/python -m bench.bench_enrich [--wheels /tmp/wheels/x] [--boost-sample 4000]
                                           [--repeat 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import tree_sitter
import tree_sitter_cpp

from megacpp_pipeline.core.gate import GateResult
from megacpp_pipeline.core.ledger import DropReason
from megacpp_pipeline.core.schemas import DEDUPED_FILES, git_blob_sha, text_sha256
from megacpp_pipeline.gates import enrich

CPP_SUFFIXES = {".h", ".hh", ".hpp", ".hxx", ".ipp", ".inl", ".tcc", ".cpp", ".cc", ".cxx"}
LIBCXX = Path("/usr/lib/llvm-14/include/c++/v1")
NLOHMANN = Path("/usr/include/nlohmann")
BOOST = Path("/usr/include/boost")


def _cpp_files(root: Path, extensionless: bool = False) -> list[Path]:
    if not root.is_dir():
        return []
    return sorted(
        p
        for p in root.rglob("*")
        if p.is_file()
        and not p.is_symlink()
        and (p.suffix in CPP_SUFFIXES or (extensionless and p.suffix == ""))
    )


def _table(source_id: str, root: Path, files: list[Path]) -> pa.Table:
    raws = [f.read_bytes() for f in files]
    texts = [r.decode("utf-8", "replace") for r in raws]
    n = len(files)
    return pa.Table.from_pydict(
        {
            "source_id": [source_id] * n,
            "path": [f.relative_to(root).as_posix() for f in files],
            "revision": ["bench"] * n,
            "blob_sha": [git_blob_sha(r) for r in raws],
            "size": [len(r) for r in raws],
            "encoding": ["utf-8"] * n,
            "text": texts,
            "content_sha256": [text_sha256(t) for t in texts],
            "language": ["c++"] * n,
            "vendored": [False] * n,
            "license_expression": [None] * n,
            "license_source": ["none"] * n,
            "license_decision": ["allowed"] * n,
            "license_detail": [None] * n,
            "scrub_replacements": [0] * n,
            "scrub_kinds": [[] for _ in range(n)],
        },
        schema=DEDUPED_FILES,
    )


# CPU seconds of this process: the machines are shared, and both passes are single-threaded
# CPU work, so CPU time is the fair cost; wall time is printed beside it.
def _bare_parse(datas: list[bytes]) -> tuple[float, float]:
    parser = tree_sitter.Parser(tree_sitter.Language(tree_sitter_cpp.language()))
    cpu, wall = time.process_time(), time.perf_counter()
    for data in datas:
        parser.parse(data)
    return time.process_time() - cpu, time.perf_counter() - wall


SLICE_FILES = 200  # demo files per gate call: the bare and gate passes take turns by slice


def _passes(
    demo: list[pa.Table], config: enrich.EnrichConfig
) -> tuple[tuple[float, float], tuple[float, float], list[GateResult]]:
    """One bare pass and one gate pass over the demo, taking turns slice by slice, so a swing
    in machine load hits both alike: (bare CPU s, wall s), (gate CPU s, wall s), and the
    gate's result per wheel (kept for the calibration below, which so parses the demo once)."""
    bare = [0.0, 0.0]
    gate = [0.0, 0.0]
    per_wheel = []
    for table in demo:
        parts = []
        for lo in range(0, table.num_rows, SLICE_FILES):
            piece = table.slice(lo, SLICE_FILES)
            cpu, wall = _bare_parse([t.encode("utf-8") for t in piece["text"].to_pylist()])
            bare[0] += cpu
            bare[1] += wall
            cpu, wall = time.process_time(), time.perf_counter()
            parts.append(enrich.run(piece, config))
            gate[0] += time.process_time() - cpu
            gate[1] += time.perf_counter() - wall
        per_wheel.append(
            GateResult(
                kept=pa.concat_tables([r.kept for r in parts]),
                dropped=pa.concat_tables([r.dropped for r in parts]),
                stats=sum((r.stats for r in parts), Counter[str]()),
            )
        )
    return (bare[0], bare[1]), (gate[0], gate[1]), per_wheel


def _ratios(
    table: pa.Table, result: GateResult, config: enrich.EnrichConfig
) -> tuple[np.ndarray, float]:
    """(parse_error_ratio of every parsed file, share of parsed files with an ERROR node) as
    the gate with the ratio check off would report them, from a run with it on: the kept
    files' ratios plus those of the files dropped over the ratio, parsed again alone."""
    reasons = result.dropped.column("reason").to_pylist()
    over = {
        p
        for p, r in zip(result.dropped.column("path").to_pylist(), reasons, strict=True)
        if r == DropReason.PARSE_ERROR_RATIO
    }
    ratios = result.kept.column("parse_error_ratio").to_numpy()
    if over:
        again = table.filter(pc.is_in(table.column("path"), pa.array(sorted(over))))
        off = config.model_copy(update={"max_parse_error_ratio": 1.0})
        ratios = np.concatenate(
            [ratios, enrich.run(again, off).kept["parse_error_ratio"].to_numpy()]
        )
    with_err = result.stats["error_files"] / max(result.stats["files_parsed"], 1)
    return ratios, with_err


def _percentiles(values: np.ndarray) -> dict[str, float]:
    qs = {"p50": 50, "p90": 90, "p95": 95, "p99": 99, "p99.9": 99.9, "max": 100}
    if values.size == 0:
        return {}
    return {k: round(float(np.percentile(values, q)), 4) for k, q in qs.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--wheels", type=Path, default=Path("/tmp/wheels/x"))
    ap.add_argument("--boost-sample", type=int, default=4000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    demo = [
        _table(name, args.wheels / name, _cpp_files(args.wheels / name))
        for name in ("pythran", "pybind11", "nanobind")
    ]
    demo_table = pa.concat_tables(demo)
    if demo_table.num_rows == 0:
        raise SystemExit(f"no demo wheels under {args.wheels}; see this module's docstring")
    datas = [t.encode("utf-8") for t in demo_table.column("text").to_pylist()]
    mb = sum(map(len, datas)) / 1e6
    config = enrich.EnrichConfig()

    # Bare and gate passes alternate (slice by slice, repeat by repeat); report medians.
    bare_s, gate_s, bare_w, gate_w = [], [], [], []
    results: list[GateResult] = []
    enrich.run(demo_table.slice(0, 1), config)  # grammar + query compile outside the timing
    for _ in range(args.repeat):
        (cpu, wall), (gate_cpu, gate_wall_s), results = _passes(demo, config)
        bare_s.append(cpu)
        bare_w.append(wall)
        gate_s.append(gate_cpu)
        gate_w.append(gate_wall_s)
    stats = sum((r.stats for r in results), Counter[str]())
    kept = pa.concat_tables([r.kept for r in results])
    dropped_table = pa.concat_tables([r.dropped for r in results])
    bare_rate = mb / statistics.median(bare_s)
    gate_rate = mb / statistics.median(gate_s)
    bare_wall = mb / statistics.median(bare_w)
    gate_wall = mb / statistics.median(gate_w)
    kind_bytes = {k: stats[f"kind_bytes:{k}"] for k in enrich.KIND_NAMES}
    kept_bytes = sum(kind_bytes.values())
    kind_share = {k: round(v / kept_bytes, 4) for k, v in kind_bytes.items()}

    print(f"## Enrichment gate vs bare tree-sitter (demo wheels: {len(datas)} files, {mb:.1f} MB)")
    print(f"| pass | MB per CPU s (median of {args.repeat}) | MB per wall s |")
    print("|---|---|---|")
    print(f"| bare `Parser.parse(bytes)` loop | {bare_rate:.2f} | {bare_wall:.2f} |")
    print(f"| `enrich.run` (view + budget + spans + table) | {gate_rate:.2f} | {gate_wall:.2f} |")
    print(f"| gate / bare | {gate_rate / bare_rate:.2f} | {gate_wall / bare_wall:.2f} |")
    span_counts = pc.list_value_length(kept.column("chunk_starts"))
    without_spans = int(pc.sum(pc.equal(span_counts, 0)).as_py() or 0)
    reasons = dropped_table.column("reason").to_pylist()
    dropped = {r: reasons.count(r) for r in sorted(set(reasons))}
    print(
        f"\nkept {kept.num_rows} ({without_spans} without spans), "
        f"dropped {dropped_table.num_rows} {dropped}"
    )
    print("\n## Share of kept demo bytes by chunk kind")
    print("| kind | id | share |")
    print("|---|---|---|")
    for k in enrich.KIND_NAMES:
        print(f"| {k} | {enrich.CHUNK_KINDS[k]} | {kind_share[k]:.2%} |")

    # Calibration: every real header parsed with the ratio gate off (the demo wheels' figures
    # come from the timed runs above).
    demo_runs = dict(
        zip(("pythran", "pybind11", "nanobind"), zip(demo, results, strict=True), strict=True)
    )
    corpora: dict[str, pa.Table] = {
        "pythran": demo[0],
        "pybind11": demo[1],
        "nanobind": demo[2],
        "libc++-14": _table("libcxx", LIBCXX, _cpp_files(LIBCXX, extensionless=True)),
        "nlohmann": _table("nlohmann", NLOHMANN, _cpp_files(NLOHMANN)),
    }
    boost_files = _cpp_files(BOOST)
    if boost_files:
        step = max(1, len(boost_files) // args.boost_sample)
        corpora["boost-1.74 sample"] = _table("boost", BOOST, boost_files[::step])
    off = enrich.EnrichConfig(max_parse_error_ratio=1.0)
    print("\n## parse_error_ratio on real headers (bytes left unstructured under ERROR nodes)")
    print("| corpus | files | with ERROR | p50 | p90 | p99 | p99.9 | max | > default |")
    print("|---|---|---|---|---|---|---|---|---|")
    calibration: dict[str, Any] = {}
    all_ratios = []
    for name, table in corpora.items():
        if table.num_rows == 0:
            print(f"| {name} | absent | | | | | | | |")
            continue
        if name in demo_runs:
            ratios, with_err = _ratios(*demo_runs[name], config)
        else:
            res = enrich.run(table, off)
            ratios = res.kept.column("parse_error_ratio").to_numpy()
            with_err = res.stats["error_files"] / max(res.stats["files_parsed"], 1)
        all_ratios.append(ratios)
        pct = _percentiles(ratios)
        over = int((ratios > config.max_parse_error_ratio).sum())
        calibration[name] = {
            "files": table.num_rows,
            "with_error": round(with_err, 4),
            "over_default": over,
            **pct,
        }
        print(
            f"| {name} | {table.num_rows} | {with_err:.0%} | {pct['p50']} | {pct['p90']} | "
            f"{pct['p99']} | {pct['p99.9']} | {pct['max']} | {over} |"
        )
    ratios = np.concatenate(all_ratios) if all_ratios else np.zeros(0)
    calibration["all"] = {"files": int(ratios.size), **_percentiles(ratios)}
    overall = calibration["all"]
    over_all = int((ratios > config.max_parse_error_ratio).sum())
    print(
        f"| all | {ratios.size} | | {overall.get('p50')} | {overall.get('p90')} | "
        f"{overall.get('p99')} | {overall.get('p99.9')} | {overall.get('max')} | {over_all} |"
    )

    figures = {
        "demo_files": len(datas),
        "demo_mb": round(mb, 2),
        "bare_parse_mb_s": round(bare_rate, 3),
        "gate_mb_s": round(gate_rate, 3),
        "gate_over_bare": round(gate_rate / bare_rate, 3),
        "bare_parse_wall_mb_s": round(bare_wall, 3),
        "gate_wall_mb_s": round(gate_wall, 3),
        "demo_dropped": dropped,
        "demo_kept_without_spans": without_spans,
        "kind_share": kind_share,
        "default_max_parse_error_ratio": config.max_parse_error_ratio,
        "parse_error_ratio": calibration,
    }
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
