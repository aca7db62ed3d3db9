"""Quality rules and the C/C++ language decision next to normalize in one run, plus what
they decide on real headers: each rule's drop rate, the files it drops, the language of the
headers whose extension does not say it, and the vendored counts.

Timing: every repeat runs normalize (over the raw demo files), quality and language (over
what normalize kept) once each, in turn; each figure is the median over repeats, so load
from other work falls on all three alike. MB/s is over each step's own input bytes; s/MB is
seconds per MB of the raw corpus, the figure to add up for the whole pipeline.

Corpora: the demo wheels (.cache/wheels, `make demo`), and Debian's headers when installed
(libc++ 14, Boost, nlohmann-json; glibc, zlib and the kernel's UAPI headers as real C).
With --tree-sitter-c DIR (a `pip install --target DIR tree-sitter-c`), the lexical language
decision is compared with parsing each header with tree-sitter-c and tree-sitter-cpp.

    .venv/bin/python -m bench.bench_quality [--repeat 3] [--json PATH] [--tree-sitter-c DIR]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from megacpp_pipeline.gates import language, normalize, quality
from tests.fixtures import real_cpp

PYTHRAN_VENDORED = ["pythran/boost/", "pythran/xsimd/"]


def _median_seconds(steps: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeat):
        for name, step in steps.items():
            gc.collect()
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def _text_mb(table: pa.Table) -> float:
    return float(pa.compute.sum(pa.compute.binary_length(table["text"])).as_py() or 0) / 1e6


def timing(repeat: int) -> dict[str, Any]:
    raw = pa.concat_tables(
        real_cpp.raw_table(source_id, real_cpp.wheel_files(source_id))
        for source_id in real_cpp.DEMO_WHEELS
    )
    raw_mb = float(pa.compute.sum(raw["size"]).as_py()) / 1e6
    norm_config = normalize.NormalizeConfig()
    normalized = normalize.run(raw, norm_config).kept
    text_mb = _text_mb(normalized)
    paths = normalized["path"].to_pylist()
    q_config, l_config = quality.QualityConfig(), language.LanguageConfig()
    seconds = _median_seconds(
        {
            "normalize": lambda: normalize.run(raw, norm_config),
            "quality": lambda: quality.run(normalized, q_config),
            "language": lambda: language.run(normalized, l_config, paths),
        },
        repeat,
    )
    figures: dict[str, Any] = {"raw_mb": round(raw_mb, 2), "normalized_text_mb": round(text_mb, 2)}
    for name, own_mb in (("normalize", raw_mb), ("quality", text_mb), ("language", text_mb)):
        figures[f"{name}_s"] = round(seconds[name], 3)
        figures[f"{name}_mb_s"] = round(own_mb / seconds[name], 1)
        figures[f"{name}_s_per_raw_mb"] = round(seconds[name] / raw_mb, 4)
    for name in ("quality", "language"):
        figures[f"{name}_over_normalize_time"] = round(seconds[name] / seconds["normalize"], 2)
    return figures


def quality_report(table: pa.Table) -> dict[str, Any]:
    """Per rule: files it fires on (alone, whatever the order) and files it decides."""
    config = quality.QualityConfig()
    texts = table["text"].combine_chunks()
    outcomes = quality.evaluate(quality.measure(texts), config)
    n = table.num_rows
    result = quality.run(table, config)
    rules = {}
    for outcome in outcomes:
        fired = int(outcome.fires.sum())
        decided = result.stats.get(f"low_quality:{outcome.rule}", 0)
        rules[outcome.rule] = {
            "fires": fired,
            "fires_pct": round(100 * fired / max(n, 1), 2),
            "drops": decided,
        }
    return {
        "files": n,
        "mb": round(_text_mb(table), 2),
        "dropped": result.dropped.num_rows,
        "dropped_pct": round(100 * result.dropped.num_rows / max(n, 1), 2),
        "rules": rules,
        "dropped_files": dict(
            zip(
                result.dropped["path"].to_pylist(),
                result.dropped["detail"].to_pylist(),
                strict=True,
            )
        ),
    }


def language_report(
    table: pa.Table, source_paths: list[str], vendored_prefixes: list[str] | None = None
) -> dict[str, Any]:
    result = language.run(table, language.LanguageConfig(keep_c=True), source_paths)
    kept = result.kept.select(["path", "language"]).to_pylist()
    by_ext: Counter[str] = Counter()
    for row in kept:
        ext = language._extension(row["path"]) or "(none)"
        if ext in (".h", "(none)", ".inc"):
            by_ext[f"{ext} {row['language']}"] += 1
    stats = result.stats
    report: dict[str, Any] = {
        "files": table.num_rows,
        "headers_decided_by_content": stats["header:c++"] + stats["header:c"],
        "header_cpp": stats["header:c++"],
        "header_c": stats["header:c"],
        "by_extension": dict(sorted(by_ext.items())),
        "decided_by": {
            k.split(":", 1)[1]: v for k, v in sorted(stats.items()) if "decided_by" in k
        },
        "c_files": sorted(r["path"] for r in kept if r["language"] == "c")[:20],
        "vendored_by_convention": stats["vendored"],
    }
    if vendored_prefixes:
        declared = language.run(
            table, language.LanguageConfig(keep_c=True), source_paths, vendored_prefixes
        )
        report["vendored_with_declared_prefixes"] = declared.stats["vendored"]
        report["declared_prefixes"] = vendored_prefixes
    return report


def tree_sitter_comparison(corpora: dict[str, pa.Table], path: Path) -> dict[str, Any]:
    """Lexical decision vs. comparing tree-sitter-c and tree-sitter-cpp parse errors (the
    grammar with fewer error bytes wins) on the headers whose extension does not decide."""
    sys.path.insert(0, str(path))
    import tree_sitter
    import tree_sitter_c  # type: ignore[import-not-found]
    import tree_sitter_cpp

    parsers = {
        "c": tree_sitter.Parser(tree_sitter.Language(tree_sitter_c.language())),
        "c++": tree_sitter.Parser(tree_sitter.Language(tree_sitter_cpp.language())),
    }

    def error_bytes(parser: tree_sitter.Parser, data: bytes) -> int:
        root = parser.parse(data).root_node
        total, stack = 0, [root] if root.has_error else []
        while stack:
            node = stack.pop()
            if node.is_error or node.is_missing:
                total += max(node.end_byte - node.start_byte, 1)
            elif node.has_error:
                stack.extend(node.children)
        return total

    config = language.LanguageConfig(keep_c=True)
    out = {}
    for name, table in corpora.items():
        ext_decides = set(config.cpp_extensions) | set(config.c_extensions)
        rows = [
            i
            for i, p in enumerate(table["path"].to_pylist())
            if language._extension(p) not in ext_decides
        ]
        if not rows:
            continue
        texts = table["text"].take(pa.array(rows, pa.int64())).combine_chunks()
        data = [t.encode() for t in texts.to_pylist()]
        mb = sum(map(len, data)) / 1e6
        start = time.perf_counter()
        lexical = language.run(
            table.take(pa.array(rows, pa.int64())), config, table["path"].to_pylist()
        )
        lexical_s = time.perf_counter() - start
        timed: dict[str, float] = {}
        errors: dict[str, list[int]] = {}
        for lang, parser in parsers.items():
            start = time.perf_counter()
            errors[lang] = [error_bytes(parser, d) for d in data]
            timed[lang] = time.perf_counter() - start
        verdicts = Counter(
            "c++" if cpp < c else "c" if c < cpp else "tie"
            for c, cpp in zip(errors["c"], errors["c++"], strict=True)
        )
        out[name] = {
            "headers": len(rows),
            "lexical": {
                "c++": lexical.stats["language:c++"],
                "c": lexical.stats["language:c"],
                "mb_s": round(mb / lexical_s, 1),
            },
            "tree_sitter": {**dict(verdicts), "mb_s": round(mb / (timed["c"] + timed["c++"]), 2)},
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--tree-sitter-c", type=Path, help="a --target dir with tree_sitter_c")
    args = parser.parse_args()
    if not real_cpp.demo_wheels_present():
        sys.exit(f"demo wheels missing under {real_cpp.WHEELS_DIR}: run `make demo`")

    figures: dict[str, Any] = {"timing_demo": timing(args.repeat)}
    corpora: dict[str, pa.Table] = {s: real_cpp.demo_normalized(s) for s in real_cpp.DEMO_WHEELS}
    corpora["demo"] = pa.concat_tables(corpora[s] for s in real_cpp.DEMO_WHEELS)
    missing = []
    for name, tree in {**real_cpp.DEBIAN_CPP, **real_cpp.DEBIAN_C}.items():
        if real_cpp.debian_installed(tree):
            corpora[name] = real_cpp.debian_normalized(tree)
        else:
            missing.append(tree.package)
    figures["debian_missing"] = missing

    if "boost" in corpora:  # a larger, steadier figure for the per-MB cost of the two gates
        boost = corpora["boost"]
        boost_paths = boost["path"].to_pylist()
        seconds = _median_seconds(
            {
                "quality": lambda: quality.run(boost, quality.QualityConfig()),
                "language": lambda: language.run(boost, language.LanguageConfig(), boost_paths),
            },
            max(1, args.repeat - 1),
        )
        mb = _text_mb(boost)
        figures["timing_boost"] = {
            "text_mb": round(mb, 1),
            **{f"{k}_mb_s": round(mb / v, 1) for k, v in seconds.items()},
        }

    cpp_corpora = ["pythran", "pybind11", "nanobind", "demo", "libcxx", "boost", "nlohmann"]
    figures["quality"] = {
        name: quality_report(corpora[name]) for name in cpp_corpora if name in corpora
    }
    figures["language"] = {}
    for name, table in corpora.items():
        paths = table["path"].to_pylist()
        prefixes = PYTHRAN_VENDORED if name in ("pythran", "demo") else None
        figures["language"][name] = language_report(table, paths, prefixes)
    if args.tree_sitter_c:
        figures["tree_sitter"] = tree_sitter_comparison(
            {k: v for k, v in corpora.items() if k != "demo"}, args.tree_sitter_c
        )

    _print_tables(figures)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


def _print_tables(figures: dict[str, Any]) -> None:
    t = figures["timing_demo"]
    print(f"demo: {t['raw_mb']} MB raw, {t['normalized_text_mb']} MB after normalize\n")
    print("| step | MB/s (own input) | s per raw MB | time vs normalize |")
    print("|---|---:|---:|---:|")
    for name in ("normalize", "quality", "language"):
        ratio = t.get(f"{name}_over_normalize_time", 1.0)
        print(f"| {name} | {t[f'{name}_mb_s']} | {t[f'{name}_s_per_raw_mb']} | {ratio} |")
    if "timing_boost" in figures:
        b = figures["timing_boost"]
        print(f"\nBoost ({b['text_mb']} MB): quality {b['quality_mb_s']} MB/s, "
              f"language {b['language_mb_s']} MB/s")  # fmt: skip
    rules = quality.RULES
    print("\n| corpus | files | dropped | " + " | ".join(rules) + " |")
    print("|---|---:|---:|" + "---:|" * len(rules))
    for name, q in figures["quality"].items():
        cells = " | ".join(
            f"{q['rules'][r]['fires']} ({q['rules'][r]['fires_pct']}%)" for r in rules
        )
        print(f"| {name} | {q['files']} | {q['dropped']} ({q['dropped_pct']}%) | {cells} |")
    for name in ("libcxx", "nlohmann", "pybind11", "nanobind"):
        if name in figures["quality"]:
            for path, detail in figures["quality"][name]["dropped_files"].items():
                print(f"  {name}: {path}: {detail}")
    print("\n| corpus | headers by content | c++ | c | decided by | vendored |")
    print("|---|---:|---:|---:|---|---:|")
    for name, lang in figures["language"].items():
        vendored = str(lang["vendored_by_convention"])
        if "vendored_with_declared_prefixes" in lang:
            vendored += f" ({lang['vendored_with_declared_prefixes']} with declared prefixes)"
        decided = ", ".join(f"{k} {v}" for k, v in lang["decided_by"].items())
        print(
            f"| {name} | {lang['headers_decided_by_content']} | {lang['header_cpp']} | "
            f"{lang['header_c']} | {decided} | {vendored} |"
        )
    if "tree_sitter" in figures:
        print("\n| corpus | headers | lexical c++/c (MB/s) | tree-sitter c++/c/tie (MB/s) |")
        print("|---|---:|---|---|")
        for name, ts in figures["tree_sitter"].items():
            lex, tsv = ts["lexical"], ts["tree_sitter"]
            print(
                f"| {name} | {ts['headers']} | {lex['c++']}/{lex['c']} ({lex['mb_s']}) | "
                f"{tsv.get('c++', 0)}/{tsv.get('c', 0)}/{tsv.get('tie', 0)} ({tsv['mb_s']}) |"
            )
    print()
    print(json.dumps({k: v for k, v in figures.items() if k.startswith("timing")}))


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
