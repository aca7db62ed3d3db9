"""Where the per-file work of a run executes. `local` (the default): this host, a source or a
shard slice to each forked worker (pipeline/parallel.py). `ray`: one Ray task per slice of
an input shard, on any node of a Ray cluster (pipeline/ray_engine.py); the Dagster step
stays the driver and commits. Both write the same rows in the same order, so a snapshot is
the same whichever ran it.

The choice comes from `megacpp run --engine`, the pipeline resource's config, or
MEGACPP_ENGINE; the cluster from `--ray-address` or Ray's own RAY_ADDRESS, and with neither
the ray engine starts a local Ray instance sized to this machine. The edge (the CLI, the
resource) hands its environment to `Engine.choose`; the library reads none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

ENGINE_ENV = "MEGACPP_ENGINE"
RAY_ADDRESS_ENV = "RAY_ADDRESS"


class EngineKind(StrEnum):
    LOCAL = "local"
    RAY = "ray"


@dataclass(frozen=True)
class Engine:
    kind: EngineKind = EngineKind.LOCAL
    address: str | None = None  # a Ray cluster ("ray://host:10001", "host:6379", "auto")
    # input parquet bytes per Ray task: a shard larger than this is cut into row slices
    task_bytes: int = 1 << 20

    @classmethod
    def choose(cls, kind: str | None, address: str | None, environ: Mapping[str, str]) -> Engine:
        """The engine a run asked for: arguments first, then MEGACPP_ENGINE / RAY_ADDRESS in
        `environ`."""
        raw = (kind or environ.get(ENGINE_ENV) or EngineKind.LOCAL.value).strip().lower()
        try:
            chosen = EngineKind(raw)
        except ValueError:
            names = ", ".join(k.value for k in EngineKind)
            raise ValueError(f"engine {raw!r}: expected one of {names}") from None
        if chosen is EngineKind.LOCAL:
            if address:
                raise ValueError(f"a Ray address ({address}) was given with the local engine")
            return cls()
        return cls(chosen, address or environ.get(RAY_ADDRESS_ENV) or None)

    @property
    def distributed(self) -> bool:
        return self.kind is not EngineKind.LOCAL

    def describe(self) -> dict[str, Any]:
        """What a manifest and a run's tags record."""
        if self.kind is EngineKind.LOCAL:
            return {"engine": "local"}
        return {"engine": "ray", "ray_address": self.address or "local instance"}


LOCAL = Engine()
