"""docs/benchmarks.md and its plots, generated from one harness run (bench/harness.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.harness import Results, Scale

REPO = Path(__file__).resolve().parent.parent


def _fmt(value: float | int | None, digits: int = 2) -> str:
    if value is None:
        return "—"
    if isinstance(value, int):
        return f"{value:,}"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def _verdict(passed: bool | None) -> str:
    return {True: "**pass**", False: "**MISS**", None: "—"}[passed]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _group_rows(scales: list[Scale]) -> tuple[list[str], list[str]]:
    names: list[str] = []
    for s in scales:
        for g in (s.run or {}).get("stages", []):
            if g["name"] not in names:
                names.append(g["name"])
    return names, [f"{s.scale}x" for s in scales if s.run]


def _command(command: str) -> str:
    """`make bench`'s own command in backticks; a description of several runs as written."""
    return f"`{command}` (`make bench`)" if command.startswith(".venv/") else command


def _load(run: dict[str, Any]) -> str:
    load = run.get("load_average")
    return f"; load average {load[0]:.1f} -> {load[1]:.1f}" if load else ""


def write(results: Results, scales: list[Scale], docs: Path, plots: Path) -> None:
    plots.mkdir(parents=True, exist_ok=True)
    images = _plots(results, scales, plots)
    m = results.machine
    out: list[str] = []
    add = out.append
    add("# Benchmarks\n")
    add(
        f"Generated on {results.date} by {_command(results.command)}, "
        f"{results.wall_s / 60:.1f} minutes{' (quick mode)' if results.quick else ''}. "
        f"Every figure is in `bench/results/{results.date}.json`. This page is overwritten by "
        "each run.\n"
    )
    add(
        "These machines are shared and noisy: the ratios (a gate and its bare library timed "
        "in one process on the same inputs) are what count; absolute rates belong to the "
        "machine below.\n"
    )
    add("## Machine\n")
    add("| | |\n|---|---|")
    add(f"| CPU | {m['cpu']} |")
    add(f"| cores (nproc) | {m['nproc']} |")
    add(f"| memory | {m['memory_gib']} GiB |")
    add(f"| kernel | {m['kernel']} |")
    add(f"| python | {m['python']} |")
    load = f"{m['load_average_at_start']} at start, {m.get('load_average_at_end')} at end"
    add(f"| load average (1, 5, 15 min) | {load} |")
    libs = ", ".join(f"{k} {v}" for k, v in m["libraries"].items() if v)
    absent = ", ".join(k for k, v in m["libraries"].items() if not v)
    add(f"| libraries | {libs} |")
    if absent:
        add(f"| not installed | {absent} |")
    add("")

    add("## Targets\n")
    add("| line | target | measured | result |\n|---|---|---:|---|")
    for line in results.lines:
        if line["target"]:
            value = line["ratio"] if line["ratio"] is not None else line["gate"]
            shown = f"{_fmt(value)}" + ("x" if line["ratio"] is not None else f" {line['unit']}")
            add(
                f"| {line['stage']}: {_cell(line['what'])} | {line['target']} | {shown} "
                f"| {_verdict(line['passed'])} |"
            )
    for fit in results.fits:
        if fit["target"]:
            add(
                f"| end to end: {fit['what']} | {fit['target']} | {_fmt(fit['exponent'])} "
                f"| {_verdict(fit['passed'])} {_cell(fit['note'])} |"
            )
    add("")

    add("## Per stage: the gate against its bare library, same process, same inputs\n")
    add(
        "| stage | gate vs bare | unit | gate | bare | ratio | target | result "
        "| gate files/s | bare files/s | note |"
    )
    add("|---|---|---|---:|---:|---:|---|---|---:|---:|---|")
    for line in results.lines:
        add(
            f"| {line['stage']} | {_cell(line['what'])} | {line['unit']} | {_fmt(line['gate'])} "
            f"| {_fmt(line['bare'])} | {_fmt(line['ratio'], 3)} | {line['target']} "
            f"| {_verdict(line['passed'])} | {_fmt(line['gate_files_s'], 0)} "
            f"| {_fmt(line['bare_files_s'], 0)} | {_cell(line['note'])} |"
        )
    add("\nThe command behind each line (run from the repository root, after `make demo-wheels`")
    add("and `.venv/bin/python -m bench --no-e2e` has unpacked the wheels once):\n")
    add("| script | seconds | command | note |\n|---|---:|---|---|")
    for script in results.stage_scripts:
        add(
            f"| {script['module']} | {script['seconds']:.0f} | `{script['command']}` "
            f"| {_cell(script['note'])} |"
        )
    if "stage_ratios" in images:
        add(f"\n![per-stage ratios]({images['stage_ratios']})\n")

    add("## End to end: `megacpp run` on the demo corpus scaled up\n")
    add(
        "Scale k is the C++ files of the three demo wheels (copy 0) plus k-1 copies with "
        "seeded token-level mutations (about 30% of code identifiers renamed occurrence by "
        "occurrence; comments, literals and `#include` lines untouched), as three `dir` "
        "sources. Each run gets a fresh data dir, DAGSTER_HOME and cache. `megacpp run` runs "
        "every stage group (and source) as a Dagster run in a forked process of its own, and "
        "the per-file gates fork workers: peak memory is the proportional set size (PSS) "
        "summed over the whole process tree, sampled every 0.2 s from /proc, so pages the "
        "forks share count once. Each run's own kernel high-water mark (VmHWM, which includes "
        "the pages it inherits at fork) is reported beside it.\n"
    )
    add(
        "| scale | files | MB in | wall s | CPU s | MB/s in | tokens out | tokens/s "
        "| peak RSS MB | documents | result |"
    )
    add("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for s in scales:
        r = s.run
        if r is None:
            add(f"| {s.scale}x | | | | | | | | | | {_cell(s.skipped)} |")
            continue
        ok = r["returncode"] == 0
        mbps = s.mb_in / r["wall_s"]
        tps = r["tokens_out"] / r["wall_s"] if r["tokens_out"] else None
        status = "ok" if ok else _cell(r["error"] or "failed")
        add(
            f"| {s.scale}x | {s.files:,} | {s.mb_in:.1f} | {r['wall_s']:.0f} "
            f"| {_fmt(r.get('cpu_s'), 0)} | {mbps:.2f} "
            f"| {_fmt(r['tokens_out'])} | {_fmt(tps, 0)} | {r['peak_rss_mb']:.0f} "
            f"| {_fmt(r['documents'])} | {status}{_load(r)} |"
        )
    add(
        "\nReproduce one scale: `.venv/bin/python -m bench --no-stages --scales N` (or by hand: "
        "`.venv/bin/python -m bench.scaleup --scale N` writes "
        "`.cache/bench/scale-Nx/sources.yaml`, then `megacpp run --config` it with a fresh "
        "`--data-dir` and `DAGSTER_HOME`).\n"
    )
    names, labels = _group_rows(scales)
    if names:
        add(
            "Per stage group: wall seconds summed over partitions, CPU seconds of the process "
            "tree, peak tree PSS while it ran, and (in brackets) the largest VmHWM of its own "
            "process:\n"
        )
        add("| stage group | " + " | ".join(labels) + " |")
        add("|---|" + "---:|" * len(labels))
        for name in names:
            cells = []
            for s in scales:
                if not s.run:
                    continue
                g = next((g for g in s.run["stages"] if g["name"] == name), None)
                cpu = f", {g['cpu_s']:.0f} CPU s" if g and g.get("cpu_s") else ""
                own = g.get("process_peak_rss_mb") if g else None
                hwm = f" ({own:.0f})" if own else ""
                cells.append(
                    f"{g['seconds']:.1f} s{cpu} / {g['peak_rss_mb']:.0f} MB{hwm}" if g else "—"
                )
            add(f"| {name} | " + " | ".join(cells) + " |")
        add("")
    add("| fit | exponent or ratio | points | target | result | note |")
    add("|---|---:|---:|---|---|---|")
    for fit in results.fits:
        add(
            f"| {fit['what']} | {_fmt(fit['exponent'])} | {fit['points']} | {fit['target']} "
            f"| {_verdict(fit['passed'])} | {_cell(fit['note'])} |"
        )
    add(
        "\nA wall-time exponent only means something if the machine's load stayed level across "
        "the scales (see the load averages above and per run); the CPU-seconds exponent, "
        "sampled from /proc, is the steadier figure on a shared machine."
    )
    for key in ("scaling", "e2e_stages"):
        if key in images:
            add(f"\n![{key}]({images[key]})")
    add("")
    profile = REPO / results.profile if results.profile else None
    text = profile.read_text().splitlines() if profile and profile.is_file() else []
    if text:
        add("## Profile of the smallest scale (pyinstrument)\n")
        add(f"Full text: `{results.profile}`. The first 60 lines:\n")
        add("```")
        out.extend(text[:60])
        add("```\n")
    docs.parent.mkdir(parents=True, exist_ok=True)
    docs.write_text("\n".join(out) + "\n")


def _plots(results: Results, scales: list[Scale], plots: Path) -> dict[str, str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}
    images: dict[str, str] = {}
    ratio_lines = [line for line in results.lines if line["ratio"] is not None and line["target"]]
    if ratio_lines:
        fig, ax = plt.subplots(figsize=(8, 0.5 * len(ratio_lines) + 1.2))
        labels = [f"{line['stage']}: {line['what'][:60]}" for line in ratio_lines]
        values = [line["ratio"] for line in ratio_lines]
        colors = ["tab:green" if line["passed"] else "tab:red" for line in ratio_lines]
        rows = list(range(len(ratio_lines)))
        ax.barh(rows, values, color=colors)
        for y, line in zip(rows, ratio_lines, strict=True):
            target = float(line["target"].split()[1])
            ax.plot([target, target], [y - 0.4, y + 0.4], color="black", linewidth=2)
        ax.set_yticks(rows, labels, fontsize=7)
        ax.set_xscale("log")
        ax.set_xlabel("gate / bare library, same process (black: target)")
        ax.invert_yaxis()
        fig.tight_layout()
        fig.savefig(plots / "stage_ratios.png", dpi=110)
        plt.close(fig)
        images["stage_ratios"] = f"{plots.name}/stage_ratios.png"
    done = [s for s in scales if s.run and s.run["returncode"] == 0]
    if done:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.6))
        xs = [s.mb_in for s in done]
        for ax, key, label in ((a1, "wall_s", "wall time, s"), (a2, "peak_rss_mb", "peak RSS, MB")):
            ys = [s.run[key] for s in done if s.run]
            ax.loglog(xs, ys, "o-", label="measured")
            ax.loglog(xs, [ys[0] * x / xs[0] for x in xs], "--", color="grey", label="linear")
            if key == "peak_rss_mb":
                ax.loglog(xs, [ys[0] * 1.3] * len(xs), ":", color="red", label="1.3x of 1x")
            for x, y, s in zip(xs, ys, done, strict=True):
                ax.annotate(f"{s.scale}x", (x, y), textcoords="offset points", xytext=(4, -10))
            ax.set_xlabel("raw C++ in, MB")
            ax.set_ylabel(label)
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(plots / "scaling.png", dpi=110)
        plt.close(fig)
        images["scaling"] = f"{plots.name}/scaling.png"
        names, labels = _group_rows(done)
        fig, ax = plt.subplots(figsize=(8, 3.8))
        bottom = [0.0] * len(done)
        for name in names:
            secs = []
            for s in done:
                assert s.run
                g = next((g for g in s.run["stages"] if g["name"] == name), None)
                secs.append(g["seconds"] if g else 0.0)
            ax.bar(labels, secs, bottom=bottom, label=name[:50])
            bottom = [b + v for b, v in zip(bottom, secs, strict=True)]
        ax.set_ylabel("seconds (sum over partitions)")
        ax.legend(fontsize=6, loc="upper left")
        fig.tight_layout()
        fig.savefig(plots / "e2e_stages.png", dpi=110)
        plt.close(fig)
        images["e2e_stages"] = f"{plots.name}/e2e_stages.png"
    return images


def summary(results: Results) -> str:
    rows: list[str] = []
    for line in results.lines:
        value = line["ratio"] if line["ratio"] is not None else line["gate"]
        rows.append(
            f"{_verdict(line['passed']).strip('*'):5} {line['stage']}: {line['what']}: "
            f"{_fmt(value, 3)} {'x' if line['ratio'] is not None else line['unit']}"
            f" {('(target ' + line['target'] + ')') if line['target'] else ''}"
        )
    for s in results.scales:
        r: dict[str, Any] | None = s["run"]
        if r is None:
            rows.append(f"      e2e {s['scale']}x: {s['skipped']}")
        else:
            rows.append(
                f"      e2e {s['scale']}x: {s['mb_in']:.1f} MB in, {r['wall_s']:.0f} s, "
                f"peak RSS {r['peak_rss_mb']:.0f} MB, tokens {r['tokens_out']}, "
                f"exit {r['returncode']} {r['error'] or ''}"
            )
    for fit in results.fits:
        rows.append(
            f"{_verdict(fit['passed']).strip('*'):5} {fit['what']}: {_fmt(fit['exponent'])} "
            f"(target {fit['target'] or 'none'}) {fit['note']}"
        )
    return "\n".join(rows)
