"""Repository documents vs file documents on the demo corpus (the C/C++ files normalize keeps
from the pythran, pybind11 and nanobind wheels in .cache/wheels), tokenized with a byte-level
BPE (vocab 32768) trained on the demo itself:

- packing at seq_len 2048, 8192 and 65536 (best fit, default window): rows, utilization and
  the share of rows that hold one document end to end (telemetry.whole_document_rows), in
  file mode, repository mode with the default max_tokens, and repository mode with
  max_tokens = seq_len - 2 (what a shorter-context run would configure);
- document length distributions in both modes;
- the cost of the include graph and grouping, and of the whole build (markers, assembly,
  hashes), per MB of source text; marker tokens as a share of all tokens.

    .venv/bin/python -m bench.bench_repository [--json PATH] [--repeat 3]

Prints markdown; the last stdout line is the JSON dict of figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from megacpp_pipeline.core.catalog import SplitConfig
from megacpp_pipeline.core.schemas import RAW_FILES, git_blob_sha
from megacpp_pipeline.corpus.packing import PackedBatch, PackingConfig, merge_telemetry, pack
from megacpp_pipeline.corpus.repository import (
    DocumentsConfig,
    build_repository_documents,
    include_graph,
    length_distribution,
    plan_documents,
    whole_document_rows,
)
from megacpp_pipeline.corpus.tokenizer import SpecialIds, TokenizerConfig, train_tokenizer
from megacpp_pipeline.gates import normalize
from megacpp_pipeline.gates.tokenization import assign_split

REPO = Path(__file__).resolve().parent.parent
WHEELS = {
    "pythran": "pythran-0.19.0-py3-none-any.whl",
    "pybind11": "pybind11-3.1.0-py3-none-any.whl",
    "nanobind": "nanobind-3.1.0-py3-none-any.whl",
}
SEQ_LENS = (2048, 8192, 65536)


def demo_sources(wheels: Path) -> dict[str, pa.Table]:
    """source id -> normalize's kept rows (path, text, ...) of that wheel."""
    out = {}
    for source_id, name in WHEELS.items():
        path = wheels / name
        if not path.is_file():
            raise SystemExit(f"{path}: demo wheel missing; `make demo-wheels` downloads it")
        with zipfile.ZipFile(path) as archive:
            rows = [
                {
                    "source_id": source_id,
                    "path": info.filename,
                    "revision": "0" * 40,
                    "blob_sha": git_blob_sha(data := archive.read(info)),
                    "size": len(data),
                    "content": data,
                }
                for info in archive.infolist()
                if not info.is_dir()
            ]
        raw = pa.Table.from_pylist(rows, schema=RAW_FILES)
        out[source_id] = normalize.run(raw, normalize.NormalizeConfig()).kept
    return out


def tokenized(source: pa.Table, tok: Any, config: SplitConfig) -> pa.Table:
    """tokenized_docs-like rows (with text): ids from the trained BPE, chunk kinds all 0 (no
    FIM here, so kinds do not change a figure), the pipeline's own split rule."""
    texts = source.column("text").to_pylist()
    ids = [e.ids for e in tok.encode_batch_fast(texts, add_special_tokens=False)]
    n = len(texts)
    return pa.table(
        {
            "source_id": source.column("source_id"),
            "path": source.column("path"),
            "revision": source.column("revision"),
            "blob_sha": source.column("blob_sha"),
            "size": source.column("size"),
            "content_sha256": source.column("content_sha256"),
            "license_expression": pa.nulls(n, pa.string()),
            "license_source": ["repo-declared"] * n,
            "structure_source": ["syntax"] * n,
            "split": assign_split(source.column("source_id"), source.column("path"), config),
            "num_tokens": pa.array([len(i) for i in ids], pa.int32()),
            "token_ids": pa.array(ids, pa.list_(pa.int32())),
            "chunk_kind": pa.array([np.zeros(len(i), np.uint8) for i in ids], pa.list_(pa.uint8())),
            "text": source.column("text"),
        }
    )


def with_ids(tables: list[pa.Table]) -> Iterator[pa.Table]:
    next_id = 0
    for t in tables:
        cols = [
            c for c in ("token_ids", "chunk_kind", "split", "member_starts") if c in t.schema.names
        ]
        yield t.select(cols).append_column(
            "doc_id", pa.array(range(next_id, next_id + t.num_rows), pa.int32())
        )
        next_id += t.num_rows


def best_seconds(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def pack_figures(tables: list[pa.Table], seq_len: int) -> dict[str, float | int]:
    config = PackingConfig(seq_len=seq_len, packing_telemetry=True)
    batches: list[PackedBatch] = list(pack(with_ids(tables), config, SpecialIds()))
    rows = whole_document_rows(batches, seq_len)
    telemetry = merge_telemetry(batches)
    assert telemetry is not None
    return {
        "rows": rows.rows,
        "utilization": round(rows.utilization, 4),
        "one_doc_share": round(rows.one_whole_document_share, 4),
        "half_doc_share": round(rows.half_whole_document_share, 4),
        "cropped_doc_frac": round(telemetry.cropped_doc_frac, 4),
        "docs": telemetry.docs,
    }


def _mark(what: str) -> None:
    print(f"[{time.perf_counter() - _STARTED:6.1f} s] {what}", file=sys.stderr, flush=True)


_STARTED = time.perf_counter()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--wheels", type=Path, default=REPO / ".cache" / "wheels")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--repeat", type=int, default=3, help="timed runs (best taken)")
    args = parser.parse_args()

    sources = demo_sources(args.wheels)
    texts = [t for s in sources.values() for t in s.column("text").to_pylist()]
    mb = sum(len(t.encode()) for t in texts) / 1e6
    _mark(f"demo read and normalized: {len(texts)} files, {mb:.1f} MB")
    tok = train_tokenizer(texts, TokenizerConfig())
    split_config = SplitConfig()
    files = {sid: tokenized(s, tok, split_config) for sid, s in sources.items()}
    _mark("tokenized")
    figures: dict[str, Any] = {
        "files": len(texts),
        "mb": round(mb, 2),
        "tokens": int(sum(int(np.sum(f.column("num_tokens"))) for f in files.values())),
    }

    # Cost: the include graph + grouping alone, and the whole build, per MB of text.
    def graph_and_plan() -> None:
        for f in files.values():
            paths, txt = f.column("path").to_pylist(), f.column("text").to_pylist()
            graph = include_graph(paths, txt)
            counts = [int(f.column("num_tokens")[r].as_py()) for r in graph.rows]
            plan_documents(graph, counts, ["train"] * len(paths), 65534)

    config = DocumentsConfig(mode="repository")
    builds: dict[str, Any] = {}

    def build_all() -> None:
        for sid, f in files.items():
            builds[sid] = build_repository_documents(f, tok, config)

    graph_s = best_seconds(graph_and_plan, args.repeat)
    build_s = best_seconds(build_all, args.repeat)
    figures.update(
        graph_plan_seconds=round(graph_s, 3),
        graph_plan_s_per_mb=round(graph_s / mb, 4),
        build_seconds=round(build_s, 3),
        build_s_per_mb=round(build_s / mb, 4),
    )
    stats: dict[str, int] = {}
    for b in builds.values():
        for k, v in b.stats.items():
            stats[k] = stats.get(k, 0) + int(v)
    figures["graph"] = stats
    figures["per_source"] = {
        sid: {
            k: int(b.stats[k])
            for k in ("files", "documents", "edges", "edges_inside_documents", "broken_edges")
        }
        for sid, b in builds.items()
    }
    figures["marker_token_share"] = round(stats["marker_tokens"] / stats["document_tokens"], 4)
    figures["edges_inside_documents_share"] = round(
        stats["edges_inside_documents"] / max(1, stats["edges"]), 4
    )
    _mark("graph and build timed")

    file_tables = list(files.values())
    repo_tables = [b.documents for b in builds.values()]
    figures["lengths_file"] = length_distribution(
        pa.chunked_array([t.column("num_tokens") for t in file_tables])
    ).model_dump()
    figures["lengths_repository"] = length_distribution(
        pa.chunked_array([t.column("num_tokens") for t in repo_tables])
    ).model_dump()

    packing: dict[str, Any] = {}
    for seq_len in SEQ_LENS:
        packing[f"file_{seq_len}"] = pack_figures(file_tables, seq_len)
        packing[f"repository_{seq_len}"] = pack_figures(repo_tables, seq_len)
        if seq_len - 2 != config.max_tokens:  # at 65536 the default already is the fit
            fitted = DocumentsConfig(mode="repository", max_tokens=seq_len - 2)
            fitted_docs = [
                build_repository_documents(f, tok, fitted).documents for f in file_tables
            ]
            packing[f"repository_fit_{seq_len}"] = pack_figures(fitted_docs, seq_len)
        _mark(f"packed at {seq_len}")
    figures["packing"] = packing

    print(f"demo: {figures['files']} files, {figures['mb']} MB, {figures['tokens']:,} tokens\n")
    print(
        "| mode | seq_len | docs | rows | utilization | rows holding one doc end to end "
        "| rows half filled by one whole doc | cropped docs |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for key, f in packing.items():
        mode, seq_len = key.rsplit("_", 1)
        print(
            f"| {mode} | {seq_len} | {f['docs']} | {f['rows']} | {f['utilization']:.4f} | "
            f"{f['one_doc_share']:.4f} | {f['half_doc_share']:.4f} | {f['cropped_doc_frac']:.4f} |"
        )
    print("\n| lengths | docs | mean | p50 | p90 | p99 | max |")
    print("|---|---|---|---|---|---|---|")
    for mode in ("file", "repository"):
        d = figures[f"lengths_{mode}"]
        print(
            f"| {mode} | {d['documents']} | {d['mean']:.0f} | {d['p50']} | {d['p90']} | "
            f"{d['p99']} | {d['max']} |"
        )
    print(
        f"\ninclude graph + grouping: {graph_s:.3f} s ({graph_s / mb:.4f} s/MB); whole build "
        f"(markers, assembly, hashes): {build_s:.3f} s ({build_s / mb:.4f} s/MB); marker "
        f"tokens {figures['marker_token_share']:.2%} of repository tokens; include edges "
        f"kept inside a document {figures['edges_inside_documents_share']:.2%}"
    )
    print(f"graph: {json.dumps(stats)}")
    for sid, f in figures["per_source"].items():
        print(f"{sid}: {json.dumps(f)}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
