"""The plan as a person reads it: the sources as listed, one table of the stage groups'
figures and the run's totals, and the verdict (fits, or what does not and by how much)."""

from __future__ import annotations

from megacpp_pipeline.plan.forecast import Forecast
from megacpp_pipeline.plan.sizing import MB


def _row(cells: list[str], widths: list[int]) -> str:
    return "  ".join(
        c.ljust(w) if i == 0 else c.rjust(w)
        for i, (c, w) in enumerate(zip(cells, widths, strict=True))
    )


def render(f: Forecast) -> str:
    """The plan as one table (sources above it, the verdict below)."""
    lines = [
        f"plan for {f.name}: {len(f.sources)} sources, {f.files:,} files, {f.mb_in:,.1f} MB "
        f"(listed, not collected); {f.workers} workers, engine {f.engine}"
    ]
    for s in f.sources:
        lines.append(
            f"  {s.source:<20} {s.kind:<8} {s.listed.files:>9,} files {s.listed.bytes / MB:>10,.1f}"
            f" MB   {s.listed.how}"
        )
    header = ["stage group", "CPU s", "wall s", "driver MB", "worker MB", "peak MB",
              "local MB", "bucket MB"]  # fmt: skip
    body = [
        [
            g.label + (" *" if g.unmeasured else ""),
            f"{g.cpu_s:,.1f}",
            f"{g.wall_s:,.1f}",
            f"{g.driver_peak_mb:,.0f}",
            f"{g.worker_peak_mb:,.0f}",
            f"{g.peak_mb:,.0f}",
            f"{g.local_mb:,.1f}",
            f"{g.bucket_mb:,.1f}",
        ]
        for g in f.groups
    ]
    body.append(
        [
            "the run (with start-up)",
            f"{f.cpu_s:,.1f}",
            f"{f.wall_s:,.1f}",
            "",
            "",
            f"{f.peak_mb:,.0f}",
            f"{f.local_mb:,.1f}",
            f"{f.bucket_mb:,.1f}",
        ]
    )
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    lines += ["", _row(header, widths), *(_row(r, widths) for r in body), ""]
    if any(g.unmeasured for g in f.groups):
        missing = sorted({s for g in f.groups for s in g.unmeasured})
        lines.append(f"* no measured rate for {', '.join(missing)}: counted as free")
    disk = "; ".join(f"{free:,.0f} MB free at {where}" for where, (free, _) in f.disk.items())
    lines.append(
        f"memory: peak {f.peak_mb:,.0f} MB of {f.memory_mb:,.0f} MB {f.memory_from}; disk: "
        f"{f.local_mb:,.0f} MB local ({disk})"
        + (
            f"; bucket: {f.bucket_mb:,.0f} MB more on {f.store_now.bytes / MB:,.0f} MB "
            f"in {f.store_now.objects:,} objects now"
            if not f.store_now.local
            else ""
        )
    )
    cal = f.calibration
    lines.append(
        f"rates: {cal.engine} engine, {cal.workers} workers on {cal.host} ({cal.measured_at[:10]}, "
        f"commit {cal.commit[:10]}, demo at "
        + "/".join(f"{r.get('scale')}x" for r in cal.runs)
        + ")"
        + ("; the ray engine's figures are the local engine's" if f.engine != cal.engine else "")
    )
    problems = f.problems()
    lines.append("fits" if not problems else "DOES NOT FIT: " + "; ".join(problems))
    return "\n".join(lines)
