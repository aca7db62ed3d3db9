"""The measured rates a plan scales: for each stage group, every figure as a line in the MB of
C++ a run collects (`fixed + per_mb * MB`), fitted by the bench (bench/bench_plan.py) to
end-to-end runs of the demo corpus at several scales on one host, and shipped as rates.json
beside this module. Wall is as measured on that host's cores; the forecast moves it to other
core counts by the share of the group's CPU its workers spent."""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

RATES_FILE = "rates.json"


class RatesError(ValueError):
    """The rates file is missing or not one; names the file."""


class Linear(BaseModel):
    """A figure as a line in the corpus size: fixed + per_mb * MB."""

    model_config = ConfigDict(extra="forbid")
    fixed: float = 0.0
    per_mb: float = 0.0

    def at(self, mb: float) -> float:
        return self.fixed + self.per_mb * mb


def fit_linear(mb: Sequence[float], values: Sequence[float]) -> Linear:
    """Least squares over the measured runs, kept non-negative: a negative intercept is
    refitted through the origin, a negative slope becomes a constant (the mean)."""
    x, y = np.asarray(mb, float), np.asarray(values, float)
    if x.size == 0:
        return Linear()
    if x.size == 1 or np.ptp(x) == 0:
        line = Linear(per_mb=y.mean() / x.mean()) if x.mean() else Linear(fixed=y.mean())
    else:
        slope, intercept = np.polyfit(x, y, 1)
        if slope < 0:
            line = Linear(fixed=y.mean())
        elif intercept < 0:
            line = Linear(per_mb=(x @ y) / (x @ x))
        else:
            line = Linear(fixed=intercept, per_mb=slope)
    return Linear(fixed=_round(line.fixed), per_mb=_round(line.per_mb))


def _round(value: float) -> float:
    """Six significant digits: what a few runs on a shared host support, and a rates file a
    person can read."""
    return float(f"{float(value):.6g}")


class GroupRates(BaseModel):
    """One stage group's figures, each a line in the MB collected."""

    model_config = ConfigDict(extra="forbid")
    stages: list[str]
    cpu_s: Linear  # CPU seconds of the whole process tree while the group ran
    driver_cpu_s: Linear  # of the run's own processes (not its workers): the serial part
    wall_s: Linear  # on the calibration host's cores
    driver_peak_mb: Linear  # the Dagster run's own high-water mark (VmHWM)
    largest_process_mb: Linear  # the largest single process (a worker, or the driver)
    tree_peak_mb: Linear  # every process of the run together (PSS, shared pages once)
    data_mb: Linear  # what the group leaves in the data dir (versions, snapshot, export)
    cache_mb: Linear  # its per-file results (the cache dir; in the bucket with an object store)
    local_build_mb: Linear  # built on local disk even with an object store (snapshot, export)
    # what one more worker adds to every process together: the same run measured with one
    # worker and with the calibration's workers, the difference per worker
    per_worker_mb: Linear = Field(default_factory=Linear)


class Calibration(BaseModel):
    """Where and on what the rates were measured."""

    model_config = ConfigDict(extra="forbid")
    measured_at: str
    commit: str
    host: str
    cores: int  # CPUs the runs had
    workers: int  # MEGACPP_WORKERS of the runs
    memory_mb: float
    engine: str
    runs: list[dict[str, Any]] = Field(default_factory=list)  # scale, files, mb, wall_s, ...


class Rates(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schema_version: int = 1
    calibration: Calibration
    startup_wall_s: Linear  # `megacpp run` outside its groups: imports, the instance, the end
    groups: list[GroupRates]

    def for_group(self, stages: Sequence[str]) -> tuple[GroupRates | None, list[str]]:
        """The measured group holding most of `stages`, and the stages no group measured."""
        best, overlap = None, 0
        for g in self.groups:
            n = len(set(g.stages) & set(stages))
            if n > overlap:
                best, overlap = g, n
        measured = {s for g in self.groups for s in g.stages}
        return best, [s for s in stages if s not in measured]


def load_rates(path: str | Path | None = None) -> Rates:
    """The rates at `path`, or the ones shipped with the package."""
    try:
        if path is None:
            raw = resources.files(__package__).joinpath(RATES_FILE).read_bytes()
            where = f"{__package__}/{RATES_FILE}"
        else:
            raw, where = Path(path).read_bytes(), str(path)
    except OSError as e:
        raise RatesError(f"{path or RATES_FILE}: cannot read the rates ({e})") from e
    try:
        return Rates.model_validate(json.loads(raw))
    except ValueError as e:
        raise RatesError(f"{where}: not a rates file ({e})") from e
