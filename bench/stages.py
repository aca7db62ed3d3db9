"""The per-stage scripts (bench/bench_*.py), each run as its own subprocess: every script
times a gate and the bare library call it wraps in one process on the same inputs and prints
its figures as JSON. Here they become lines with a ratio and a pass/miss against the
project's targets (issue 10). A script that is missing, fails or overruns its time limit
becomes a note, not a harness failure."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Line:
    stage: str
    what: str  # the gate's call and the bare call it is compared with
    unit: str
    gate: float | None
    bare: float | None
    ratio: float | None  # gate / bare, in the same process on the same inputs
    target: str  # e.g. ">= 0.5 x bare"; "" when the figure is reported without a target
    passed: bool | None  # None: no target, or not measured
    command: str
    gate_files_s: float | None = None
    bare_files_s: float | None = None
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Script:
    module: str
    full: list[str]
    quick: list[str]
    timeout_s: float
    lines: Callable[[dict[str, Any], str], list[Line]]


def _ratio_line(
    stage: str,
    what: str,
    gate: float | None,
    bare: float | None,
    minimum: float | None,
    command: str,
    *,
    unit: str = "MB/s",
    files_per_mb: float | None = None,
    bare_files_per_mb: float | None = None,
    note: str = "",
) -> Line:
    ratio = gate / bare if gate is not None and bare else None
    passed = None if minimum is None or ratio is None else ratio >= minimum
    bare_fpm = bare_files_per_mb if bare_files_per_mb is not None else files_per_mb
    return Line(
        stage=stage,
        what=what,
        unit=unit,
        gate=gate,
        bare=bare,
        ratio=ratio,
        target=f">= {minimum:g} x bare" if minimum is not None else "",
        passed=passed,
        command=command,
        gate_files_s=gate * files_per_mb if gate is not None and files_per_mb else None,
        bare_files_s=bare * bare_fpm if bare is not None and bare_fpm else None,
        note=note,
    )


def _normalize_license(f: dict[str, Any], cmd: str) -> list[Line]:
    raw_fpm = f["files"] / f["raw_mb"]
    text_fpm = f["normalized_files"] / f["normalized_text_mb"]
    bare = f["bare_read_sha256_mb_s"]
    return [
        _ratio_line(
            "normalize",
            "normalize.run vs read + sha256",
            f["normalize_mb_s"],
            bare,
            0.5,
            cmd,
            files_per_mb=raw_fpm,
            note=f"{f['files']} files, {f['raw_mb']} MB (every file of the three wheels)",
        ),
        _ratio_line(
            "license",
            "license.run vs read + sha256 of the same files",
            f["license_mb_s"],
            f.get("bare_read_sha256_license_files_mb_s", bare),
            0.5,
            cmd,
            files_per_mb=text_fpm,
            bare_files_per_mb=text_fpm if "bare_read_sha256_license_files_mb_s" in f else raw_fpm,
            note=f"{f['normalized_files']} files, {f['normalized_text_mb']} MB kept text "
            "(the files normalize keeps; the bare loop reads the same files)",
        ),
    ]


def _scrub(f: dict[str, Any], cmd: str) -> list[Line]:
    if "scrub_mb_s" not in f:
        return []
    fpm = f["files"] / f["megabytes"]
    corpus = f"{f['files']} files, {f['megabytes']} MB (demo wheels + Debian headers if present)"
    return [
        _ratio_line(
            "scrub",
            "scrub.run vs detect-secrets 1.5 scan_file",
            f["scrub_mb_s"],
            f["detect_secrets_scan_mb_s"],
            0.5,
            cmd,
            files_per_mb=fpm,
            note=corpus + "; detect-secrets on a 0.5 MB prefix",
        ),
        _ratio_line(
            "scrub",
            "scrub.run vs read + sha256 (floor, no target)",
            f["scrub_mb_s"],
            f["read_sha256_mb_s"],
            None,
            cmd,
            files_per_mb=fpm,
            note=f"recall targets met on the three labelled sets: {f.get('targets_met')}",
        ),
    ]


def _dedup(f: dict[str, Any], cmd: str) -> list[Line]:
    out: list[Line] = []
    sig = f.get("signatures")
    if sig:
        fpm = sig["signature_files"] / sig["signature_sample_mb"]
        out.append(
            _ratio_line(
                "dedup",
                "MinHash signatures, one_permutation vs datasketch update_batch (CPU s)",
                sig["one_permutation_mb_per_cpu_s"],
                sig["datasketch_mb_per_cpu_s"],
                10.0,
                cmd,
                unit="MB per CPU s",
                files_per_mb=fpm,
                note=f"{sig['signature_files']} files, {sig['signature_sample_mb']} MB; "
                f"wall-clock ratio {sig['speedup_one_permutation_wall']:.1f}x",
            )
        )
    for run in f.get("gate", []):
        out.append(
            _ratio_line(
                "dedup",
                f"find_duplicates, whole gate with LSH, demo x{run['copies']} (no bare call)",
                run["gate_mb_s"],
                None,
                None,
                cmd,
                files_per_mb=run["files"] / run["mb"],
                note=f"peak RSS {run['peak_rss_mb']:.0f} MB; exact "
                f"{run['stats'].get('dropped_exact_duplicate', 0)}, near "
                f"{run['stats'].get('dropped_near_duplicate', 0)}",
            )
        )
    for name, row in f.get("labelled", {}).items():
        if isinstance(row, dict) and name == "one_permutation":
            out.append(
                Line(
                    "dedup",
                    "labelled near-duplicates (default config): recall at J >= 0.8",
                    "fraction",
                    row["recall_at_0.8"],
                    None,
                    None,
                    "",
                    None,
                    cmd,
                    note=f"precision {row['precision']:.3f}",
                )
            )
    return out


def _enrich(f: dict[str, Any], cmd: str) -> list[Line]:
    fpm = f["demo_files"] / f["demo_mb"]
    return [
        _ratio_line(
            "enrich",
            "enrich.run vs bare tree-sitter Parser.parse loop (CPU s)",
            f["gate_mb_s"],
            f["bare_parse_mb_s"],
            0.5,
            cmd,
            unit="MB per CPU s",
            files_per_mb=fpm,
            note=f"{f['demo_files']} files, {f['demo_mb']} MB; wall-clock ratio "
            f"{f['gate_wall_mb_s'] / f['bare_parse_wall_mb_s']:.2f}",
        )
    ]


def _tokenize_pack(f: dict[str, Any], cmd: str) -> list[Line]:
    fpm = f["corpus_files"] / f["corpus_mb"]
    encoders: list[Line] = []
    if "cpu_gate_fast_mb_s" in f:
        encoders = [
            _ratio_line(
                "tokenize",
                "tokenization.run: fast encoder vs tokenizers (the gate until now), CPU s",
                f["cpu_gate_fast_mb_s"],
                f["cpu_gate_tokenizers_mb_s"],
                4.0,
                cmd,
                unit="MB per CPU s",
                files_per_mb=fpm,
                note=f"ids identical: {f['ids_identical']}; tokenizers on one thread "
                f"{f['cpu_gate_tokenizers_1t_mb_s']} MB per CPU s "
                f"({f['cpu_gate_fast_vs_gate_tokenizers_1t']}x); bare tokenizers "
                f"{f['cpu_bare_tokenizers_mb_s']}",
            ),
            _ratio_line(
                "tokenize",
                "tokenization.run (fast encoder) vs bare tiktoken encode_ordinary_batch, CPU s",
                f["cpu_gate_fast_mb_s"],
                f["cpu_bare_tiktoken_mb_s"],
                0.8,
                cmd,
                unit="MB per CPU s",
                files_per_mb=fpm,
                note=f"bare tiktoken with the placeholders as specials, to numpy: "
                f"{f['cpu_bare_tiktoken_specials_mb_s']} MB per CPU s",
            ),
        ]
    if "stage_and_checks_mb_per_cpu_s_fast" in f:
        encoders.append(
            _ratio_line(
                "tokenize",
                "tokenized_docs stage + its checks: fast encoder vs tokenizers, CPU s",
                f["stage_and_checks_mb_per_cpu_s_fast"],
                f["stage_and_checks_mb_per_cpu_s_tokenizers"],
                4.0,
                cmd,
                unit="MB per CPU s",
                note=f"the whole demo as one source, {f['stage_mb']} MB of enriched text; "
                f"stage alone {f['stage_fast_vs_tokenizers']}x; tokenized_docs files of the "
                f"two runs identical: {f['stage_files_identical']}",
            )
        )
    return [
        _ratio_line(
            "tokenize",
            "tokenization.run vs bare Tokenizer.encode_batch",
            f["gate_mb_s"],
            f["bare_encode_batch_mb_s"],
            0.8,
            cmd,
            files_per_mb=fpm,
            note=f"{f['corpus_files']} files, {f['corpus_mb']} MB, {f['tokens']} tokens "
            f"(one demo file in {f.get('every', 1)}); "
            f"gate {f['gate_mtok_s']} M tokens/s ({f.get('gate_encoder', 'tokenizers')}, "
            f"{f.get('gate_threads', '')} threads)",
        ),
        *encoders,
        Line(
            "packing",
            "pack(best_fit, seq_len 2048), M tokens per CPU s",
            "M tokens/s/core",
            f["best_fit_mtok_s_2048_cpu"],
            None,
            None,
            ">= 20 M tokens/s/core",
            f["best_fit_mtok_s_2048_cpu"] >= 20,
            cmd,
            note=f"wall {f['best_fit_mtok_s_2048_wall']} M tokens/s; utilization "
            f"{f.get('util_best_fit_2048')}; peak RSS x1/x4/x16 "
            f"{f.get('pack_peak_rss_mb_x1')}/{f.get('pack_peak_rss_mb_x4')}/"
            f"{f.get('pack_peak_rss_mb_x16')} MB",
        ),
    ]


def _loader(f: dict[str, Any], cmd: str) -> list[Line]:
    ratio = f.get("ratio_loader_warm_b8_ids_prefetch_tokens_vs_memmap")
    memmap = f.get("memmap_b8_tok_s")
    wait = f["warm_queue_wait_mean_ms"]
    lines = [
        Line(
            "loader",
            "PackedRowsLoader (warm, prefetch, batch 8, input_ids) vs np.memmap batch copies",
            "M tokens/s",
            f["loader_warm_b8_ids_prefetch_tok_s"] / 1e6,
            memmap / 1e6 if memmap else None,
            ratio,
            ">= 0.5 x memmap",
            None if ratio is None else ratio >= 0.5,
            cmd,
            note="ratio: median of passes paired with a memmap pass right before each; "
            f"without the prefetch thread {_opt(f, 'loader_warm_b8_ids_sync')}, batch 64 "
            f"with prefetch {_opt(f, 'loader_warm_b64_ids_prefetch')}, all 8 columns "
            f"(bytes/s) {_opt(f, 'loader_warm_b8_all_prefetch', 'bytes')}",
        ),
        Line(
            "loader",
            f"queue wait per batch at a simulated {f['step_ms']:.0f} ms step (warm cache)",
            "ms",
            wait,
            None,
            None,
            "~0 (mean <= 1 ms)",
            wait <= 1.0,
            cmd,
            note=f"p95 {f['warm_queue_wait_p95_ms']:.2f} ms, max {f['warm_queue_wait_max_ms']:.2f}"
            f" ms; cold cache mean {f['cold_queue_wait_mean_ms']:.2f} ms",
        ),
    ]
    for read, what in (("doc", "per document"), ("sample", "random 2049-token samples")):
        own = f.get(f"own_idx_{read}_tok_s", f.get("own_idx_tok_s") if read == "doc" else None)
        megatron = f.get(f"megatron_core_{read}_tok_s")
        ratio = f.get(f"ratio_own_idx_vs_megatron_core_{read}")
        if ratio is None and own and megatron:
            ratio = own / megatron
        versions = (
            f"megatron-core {f.get('megatron_core_version')}, torch {f.get('torch_version')}; "
            "ratio: median of paired passes"
            if megatron
            else "megatron-core not installed (pip install -e '.[megatron]')"
        )
        lines.append(
            Line(
                "loader",
                f"own .idx reader vs megatron-core IndexedDataset, {what}",
                "M tokens/s",
                own / 1e6 if own else None,
                megatron / 1e6 if megatron else None,
                ratio,
                "",
                None,
                cmd,
                note=versions,
            )
        )
    return lines


def _opt(figures: dict[str, Any], name: str, per: str = "tokens") -> str:
    value = figures.get(f"ratio_{name}_{per}_vs_memmap")
    return f"{value:.2f}" if isinstance(value, int | float) else "—"


def _jsonl(f: dict[str, Any], cmd: str) -> list[Line]:
    fpm = f["records"] / f["input_mb"]
    return [
        _ratio_line(
            "jsonl",
            "jsonl_stream.convert vs json.loads + pq.write_table",
            f["converter_mb_s"],
            f["bare_json_mb_s"],
            0.5,
            cmd,
            files_per_mb=fpm,
            note=f"{f['records']} records, {f['input_mb']} MB of Debian headers as JSONL; "
            f"pyarrow.json {f['pyarrow_json_mb_s']} MB/s",
        )
    ]


def scripts(wheels: Path) -> list[Script]:
    w = ["--wheels", str(wheels)]
    return [
        Script(
            "bench_normalize_license",
            [*w, "--repeat", "3"],
            [*w, "--repeat", "1"],
            600,
            _normalize_license,
        ),
        Script(
            "bench_scrub",
            [*w, "--repeat", "3"],
            [*w, "--repeat", "1", "--per-kind", "20", "--per-decoy", "10"],
            600,
            _scrub,
        ),
        Script(
            "bench_dedup",
            [*w, "--families", "100", "--datasketch-mb", "4", "--copies", "4"],
            [*w, "--families", "20", "--datasketch-mb", "1", "--copies", "2"],
            900,
            _dedup,
        ),
        Script(
            "bench_enrich",
            [*w, "--repeat", "1", "--boost-sample", "250"],
            [*w, "--repeat", "1", "--boost-sample", "50"],
            900,
            _enrich,
        ),
        Script(
            "bench_tokenize_pack",
            ["--corpus", str(wheels), "--repeat", "2"],
            ["--corpus", str(wheels), "--repeat", "1"],
            900,
            _tokenize_pack,
        ),
        Script(
            "bench_loader",
            ["--rows", "4096", "--passes", "3"],
            ["--rows", "1024", "--passes", "2", "--steps", "50"],
            600,
            _loader,
        ),
        Script("bench_jsonl_stream", ["--mb", "30"], ["--mb", "8", "--repeats", "1"], 600, _jsonl),
    ]


@dataclass
class ScriptResult:
    module: str
    command: str
    seconds: float
    lines: list[Line]
    figures: dict[str, Any] | None
    note: str = ""


def run_script(script: Script, quick: bool, out_dir: Path, reuse: bool = False) -> ScriptResult:
    """Run one script; with `reuse`, take the figures an earlier run of the very same command
    left in out_dir instead (each script's ratios come from one process either way)."""
    args = script.quick if quick else script.full
    json_path = out_dir / f"{script.module}.json"
    done_path = out_dir / f"{script.module}.done"  # the command and its seconds, on success
    shown = " ".join(a if not a.startswith("/") else _short(a) for a in args)
    command = f".venv/bin/python -m bench.{script.module} {shown}".strip()
    if not (REPO / "bench" / f"{script.module}.py").exists():
        return ScriptResult(script.module, command, 0.0, [], None, "script not present: skipped")
    if reuse and done_path.exists() and json_path.exists():
        done = json.loads(done_path.read_text())
        if done["command"] == command:
            figures = json.loads(json_path.read_text())
            note = f"figures reused from the run of {done['at']}"
            lines = script.lines(figures, command)
            return ScriptResult(script.module, command, done["seconds"], lines, figures, note)
    json_path.unlink(missing_ok=True)
    done_path.unlink(missing_ok=True)
    started = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", f"bench.{script.module}", *args, "--json", str(json_path)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=script.timeout_s,
        )
    except subprocess.TimeoutExpired:
        seconds = time.monotonic() - started
        note = f"stopped at its {script.timeout_s:.0f} s limit"
        return ScriptResult(script.module, command, seconds, [], None, note)
    seconds = time.monotonic() - started
    (out_dir / f"{script.module}.log").write_text(proc.stdout + "\n--- stderr\n" + proc.stderr)
    if proc.returncode != 0 or not json_path.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        note = f"exit {proc.returncode}: {tail[0][:300]}"
        return ScriptResult(script.module, command, seconds, [], None, note)
    figures = json.loads(json_path.read_text())
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    done_path.write_text(json.dumps({"command": command, "seconds": seconds, "at": at}))
    try:
        lines = script.lines(figures, command)
    except (KeyError, TypeError, ZeroDivisionError) as e:
        note = f"figures not as expected ({type(e).__name__}: {e}); raw JSON kept"
        return ScriptResult(script.module, command, seconds, [], figures, note)
    return ScriptResult(script.module, command, seconds, lines, figures)


def _short(path: str) -> str:
    try:
        return str(Path(path).relative_to(REPO))
    except ValueError:
        return path
