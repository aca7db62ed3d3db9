"""The forecast of one run: for every stage group (the registry's run groups, what `megacpp
run` materializes in one Dagster run each) its CPU seconds, its wall on the given number of
workers, the peak memory of its driver, of its largest worker and of all its processes
together, and the disk it writes, locally and to a bucket; then whether the run fits. A
group that needs more memory than the host has, or a run whose writes outgrow the free disk
of the filesystem they land on, is refused by name and figure (`megacpp plan` exits 3, and
`megacpp run` does not start: plan/command.py; the table: plan/table.py).

How figures move off the calibration host: CPU seconds and memory follow the MB collected
(rates.py); wall keeps its serial part (the driver's CPU and what is not CPU: start-up, I/O)
and divides its parallel part, the workers' CPU, by the workers; all-process memory adds or
removes, per worker, what one more worker added in the calibration (measured at one worker
and at the calibration's workers)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from megacpp_pipeline.core.catalog import Catalog
from megacpp_pipeline.pipeline.executor import LocalExecutor
from megacpp_pipeline.pipeline.registry import Registry
from megacpp_pipeline.plan.rates import Calibration, Rates, load_rates
from megacpp_pipeline.plan.sizing import (
    MB,
    SourceSize,
    StoreUsage,
    free_disk_mb,
    host_memory_mb,
    size_sources,
    store_usage,
)


@dataclass
class GroupForecast:
    stages: tuple[str, ...]
    cpu_s: float
    driver_cpu_s: float
    wall_s: float  # on `workers`
    driver_peak_mb: float
    worker_peak_mb: float  # the largest single process
    peak_mb: float  # every process of the group's run at once, at `workers`
    data_mb: float  # written to a local data dir (0 with an object store)
    cache_mb: float  # written to the cache dir (per-file results, or local builds)
    bucket_mb: float  # written to the object store (0 for a local data dir)
    unmeasured: list[str] = field(default_factory=list)  # stages no calibration group holds

    @property
    def local_mb(self) -> float:
        return self.data_mb + self.cache_mb

    @property
    def label(self) -> str:
        if len(self.stages) <= 3:
            return ", ".join(self.stages)
        return f"{self.stages[0]} .. {self.stages[-1]} ({len(self.stages)} stages)"


@dataclass
class Forecast:
    name: str
    sources: list[SourceSize]
    data_dir: str
    workers: int
    engine: str
    startup_s: float
    groups: list[GroupForecast]
    memory_mb: float  # what a group may use
    memory_from: str
    # where the run writes locally -> (free MB there, which of "data" and "cache" land there)
    disk: dict[str, tuple[float, tuple[str, ...]]]
    store_now: StoreUsage
    calibration: Calibration

    @property
    def files(self) -> int:
        return sum(s.listed.files for s in self.sources)

    @property
    def mb_in(self) -> float:
        return sum(s.listed.bytes for s in self.sources) / MB

    @property
    def wall_s(self) -> float:
        return self.startup_s + sum(g.wall_s for g in self.groups)

    @property
    def cpu_s(self) -> float:
        return sum(g.cpu_s for g in self.groups)

    @property
    def peak_mb(self) -> float:
        return max((g.peak_mb for g in self.groups), default=0.0)

    @property
    def local_mb(self) -> float:
        return sum(g.local_mb for g in self.groups)

    @property
    def bucket_mb(self) -> float:
        return sum(g.bucket_mb for g in self.groups)

    def problems(self) -> list[str]:
        """Why the run does not fit, one line per group or disk that does not: [] if it
        fits."""
        out = []
        for g in self.groups:
            if g.peak_mb > self.memory_mb:
                out.append(
                    f"stage group {g.label}: {g.peak_mb:,.0f} MB of memory at {self.workers} "
                    f"workers (driver {g.driver_peak_mb:,.0f} MB, largest worker "
                    f"{g.worker_peak_mb:,.0f} MB); {self.memory_mb:,.0f} MB {self.memory_from}"
                )
        for where, (free, parts) in self.disk.items():
            written = 0.0
            for g in self.groups:
                written += sum(getattr(g, f"{part}_mb") for part in parts)
                if written > free:
                    out.append(
                        f"stage group {g.label}: the run has written {_mb(written)} to "
                        f"{' and '.join(parts)} by its end; {_mb(free)} free at {where}"
                    )
                    break
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "sources": [
                {"source": s.source, "kind": s.kind, **asdict(s.listed)} for s in self.sources
            ],
            "files": self.files,
            "mb_in": round(self.mb_in, 3),
            "data_dir": self.data_dir,
            "workers": self.workers,
            "engine": self.engine,
            "startup_s": round(self.startup_s, 2),
            "groups": [
                {"stages": list(g.stages), **{k: v for k, v in asdict(g).items() if k != "stages"}}
                for g in self.groups
            ],
            "wall_s": round(self.wall_s, 2),
            "cpu_s": round(self.cpu_s, 2),
            "peak_mb": round(self.peak_mb, 1),
            "local_mb": round(self.local_mb, 3),
            "bucket_mb": round(self.bucket_mb, 3),
            "memory_mb": round(self.memory_mb, 1),
            "disk_free_mb": {k: round(free, 1) for k, (free, _) in self.disk.items()},
            "store_now": asdict(self.store_now),
            "problems": self.problems(),
            "calibration": self.calibration.model_dump(),
        }


def _mb(value: float) -> str:
    return f"{value:,.0f} MB" if value >= 10 else f"{value:.2f} MB"


def _device(path: str | Path) -> int:
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p.stat().st_dev


def forecast(
    catalog: Catalog,
    registry: Registry,
    sources: list[SourceSize],
    *,
    data_dir: str,
    cache_dir: Path,
    workers: int,
    engine: str = "local",
    rates: Rates | None = None,
    memory_mb: float | None = None,
    disk_mb: float | None = None,
    store_now: StoreUsage | None = None,
) -> Forecast:
    """The run's figures from the sources' sizes and the rates (the shipped ones unless
    given). `memory_mb` / `disk_mb`: what the run may use (default: this host's memory, the
    free space where it writes)."""
    rates = rates or load_rates()
    cal = rates.calibration
    mb = sum(s.listed.bytes for s in sources) / MB
    store_now = store_now or store_usage(data_dir)
    workers = max(1, workers)
    groups = []
    for stages in registry.run_groups():
        rated, unmeasured = rates.for_group(stages)
        if rated is None:  # a group of stages nothing measured: say so, count it as free
            groups.append(GroupForecast(stages, 0, 0, 0, 0, 0, 0, 0, 0, 0, list(stages)))
            continue
        cpu, driver_cpu = rated.cpu_s.at(mb), rated.driver_cpu_s.at(mb)
        wall_cal = rated.wall_s.at(mb)
        parallel = min(wall_cal, max(0.0, cpu - driver_cpu) / cal.workers)
        wall = wall_cal - parallel + parallel * cal.workers / workers
        driver_peak = rated.driver_peak_mb.at(mb)
        tree = rated.tree_peak_mb.at(mb)
        peak = max(driver_peak, tree + (workers - cal.workers) * rated.per_worker_mb.at(mb))
        data, cache = rated.data_mb.at(mb), rated.cache_mb.at(mb)
        groups.append(
            GroupForecast(
                stages=stages,
                cpu_s=cpu,
                driver_cpu_s=driver_cpu,
                wall_s=wall,
                driver_peak_mb=driver_peak,
                worker_peak_mb=rated.largest_process_mb.at(mb),
                peak_mb=peak,
                data_mb=data if store_now.local else 0.0,
                cache_mb=cache if store_now.local else rated.local_build_mb.at(mb),
                bucket_mb=0.0 if store_now.local else data + cache,
                unmeasured=unmeasured,
            )
        )
    disk: dict[str, tuple[float, tuple[str, ...]]]
    if disk_mb is not None:
        disk = {"(given)": (disk_mb, ("data", "cache"))}
    else:  # the data dir (when local) and the cache dir, as one when they share a filesystem
        places: dict[int, tuple[str, tuple[str, ...]]] = {}
        for part, path in (("cache", str(cache_dir)), ("data", data_dir)):
            if part == "data" and not store_now.local:
                continue
            dev = _device(path)
            where, parts = places.get(dev, (path, ()))
            places[dev] = (where, (*parts, part))
        disk = {where: (free_disk_mb(where), parts) for where, parts in places.values()}
    return Forecast(
        name=catalog.snapshot,
        sources=sources,
        data_dir=data_dir,
        workers=workers,
        engine=engine,
        startup_s=rates.startup_wall_s.at(mb),
        groups=groups,
        memory_mb=memory_mb if memory_mb is not None else host_memory_mb(),
        memory_from="given" if memory_mb is not None else "on this host",
        disk=disk,
        store_now=store_now,
        calibration=cal,
    )


def plan_run(
    catalog: Catalog,
    registry: Registry,
    *,
    data_dir: str,
    cache_dir: Path,
    workers: int,
    engine: str = "local",
    rates: Rates | None = None,
    memory_mb: float | None = None,
    disk_mb: float | None = None,
) -> Forecast:
    """Size every operational source (listing, not collecting; the sources side by side on
    up to `workers` forked workers of this host) and forecast the run."""
    sources = size_sources(catalog, cache_dir, LocalExecutor(workers).map)
    return forecast(
        catalog,
        registry,
        sources,
        data_dir=data_dir,
        cache_dir=cache_dir,
        workers=workers,
        engine=engine,
        rates=rates,
        memory_mb=memory_mb,
        disk_mb=disk_mb,
    )
