"""What a stage runs with: the catalog, the store, the registry and the run's identity
(`StageContext`), and for a per-file gate what it may read of one source besides its input
shards (`SourceInputs`, which records every version it reads so the manifest lists it).

The runner hands a stage's body and checks the context `for_stage(stage)`: reading another
stage's versions, config or code version through it is refused unless the stage declares
that stage (Registry.reads_of), so the registry is the whole truth about what depends on
what. Stage code reads other stages through `latest`, never `store.latest`."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
from pydantic import BaseModel

from megacpp_pipeline.core.catalog import Catalog, SourceSpec
from megacpp_pipeline.pipeline.engine import LOCAL, Engine
from megacpp_pipeline.pipeline.executor import Executor, LocalExecutor
from megacpp_pipeline.pipeline.parallel import cpu_count
from megacpp_pipeline.pipeline.registry import Registry, Stage
from megacpp_pipeline.pipeline.reuse import INPUTS, RECOMPUTE_ENV, body_inputs
from megacpp_pipeline.snapshot import layout
from megacpp_pipeline.storage.file_cache import FileResultCache
from megacpp_pipeline.storage.store import Manifest, ShardStore, VersionWriter

# Where a run keeps per-file results, fetched archives and git mirrors unless told
# (--cache-dir, MEGACPP_CACHE_DIR): `.cache/` in the repository whatever the working
# directory, for `megacpp run`, `megacpp plan` and `megacpp cache` alike.
DEFAULT_CACHE_DIR = Path(__file__).resolve().parents[2] / ".cache"


def _ignore(message: str) -> None:
    pass


class UndeclaredReadError(RuntimeError):
    """A stage read a stage it does not declare (Stage.input, Stage.reads)."""


@dataclass
class StageContext:
    catalog: Catalog
    store: ShardStore
    registry: Registry
    cache_dir: Path  # per-file results, fetched archives and git mirrors
    run_id: str | None = None
    # source -> the revision the refresh that launched this run resolved (tracked branches)
    pins: Mapping[str, str] = field(default_factory=dict)
    log: Callable[[str], None] = _ignore
    workers: int | None = None  # forked workers of this host (None: every CPU it may use)
    engine: Engine = LOCAL  # where per-file stages run (pipeline/engine.py)
    # the stage whose work this context serves: its reads of other stages are checked
    # against what it declares (None: the orchestration's own, unchecked)
    reader: Stage | None = None
    # stages this process runs later in the same run, each after the blocking checks of
    # the one before: a per-file gate runs those of them it can in its own pass over the
    # files, and their steps commit what it wrote (pipeline/file_stage.py)
    ahead: frozenset[str] = frozenset()
    # partition -> what the reading stage's version of it is computed from, recorded in the
    # version `begin` opens (pipeline/reuse.py; a per-file gate records its own at commit)
    inputs: Mapping[str | None, str] = field(default_factory=dict)
    # False: every version is computed again even where its inputs did not change (the
    # per-file result cache still serves); MEGACPP_RECOMPUTE=1 sets it for a whole run
    reuse: bool = field(default_factory=lambda: os.environ.get(RECOMPUTE_ENV, "") in ("", "0"))
    # partition -> what an earlier pass of the check being evaluated proved, as the
    # orchestrator recorded it (pipeline/checks.py, `Verified`); empty outside a check or
    # where nothing was recorded: a content check then reads everything
    prior_verdicts: Mapping[str | None, Any] = field(default_factory=dict)
    # stage -> its code version, hashed once for this context and every copy made of it
    # (`for_stage`, `replace`): one version per stage for the whole run or step, and a
    # per-source step does not read every module of the stage again at each call
    code_versions: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    def for_stage(self, stage: Stage) -> StageContext:
        """This context for `stage`'s body or checks."""
        return replace(self, reader=stage)

    def may_read(self, name: str) -> None:
        """Refuse a read of stage `name` that the reading stage did not declare."""
        reader = self.reader
        if reader is None or name == reader.name or name in self.registry.reads_of(reader):
            return
        raise UndeclaredReadError(
            f"stage {reader.name!r} reads {name!r} but does not declare it "
            f"(declared: {', '.join(self.registry.reads_of(reader)) or 'nothing'})"
        )

    def executor(self) -> Executor:
        """A fresh executor for one stage's maps (its per-node figures are that stage's):
        forked workers of this host, or Ray tasks on the engine's cluster."""
        if self.engine.distributed:
            from megacpp_pipeline.pipeline import ray_engine  # the optional extra

            return ray_engine.RayExecutor(self.engine, self.host_workers)
        return LocalExecutor(self.host_workers)

    def host_executor(self) -> LocalExecutor:
        """Forked workers of this host whatever the engine: for work on this host's own
        files (a snapshot being built, its Megatron export)."""
        return LocalExecutor(self.host_workers)

    @property
    def host_workers(self) -> int:
        return self.workers if self.workers is not None else cpu_count()

    def config(self, stage: Stage | str) -> Any:
        """A stage's config: the reading stage's own, or one it lists in config_reads."""
        s = self.registry.get(stage) if isinstance(stage, str) else stage
        reader = self.reader
        if reader is not None and s.name != reader.name and s.name not in reader.config_reads:
            raise UndeclaredReadError(
                f"stage {reader.name!r} reads the config of {s.name!r} but does not declare "
                f"it (config_reads: {', '.join(reader.config_reads) or 'nothing'})"
            )
        return self.registry.config_of(s, self.catalog)

    def code_version(self, stage: Stage | str) -> str:
        s = self.registry.get(stage) if isinstance(stage, str) else stage
        self.may_read(s.name)
        return self.code_version_unchecked(s)

    def code_version_unchecked(self, stage: Stage) -> str:
        """`code_version` without the read check, for what the orchestration asks of every
        stage (which of them collection keeps metadata files for)."""
        if stage.name not in self.registry or self.registry.get(stage.name) is not stage:
            return self.registry.code_version(stage, self.catalog)  # not the run's: not kept
        version = self.code_versions.get(stage.name)
        if version is None:
            version = self.registry.code_version(stage, self.catalog)
            self.code_versions[stage.name] = version
        return version

    def begin(self, stage: Stage, partition: str | None, config: Any) -> VersionWriter:
        """A new version of `stage` (this run's, at its code version); the latest version of
        the partition, verified first, is re-hashed by this host's forked workers when it is
        large (ShardStore.verify_objects), not by this process."""
        version = self.store.begin(
            stage.name,
            partition,
            code_version=self.code_version(stage),
            config=config,
            run_id=self.run_id,
            mapper=self.host_executor().map_light,
        )
        if self.reader is not None and self.reader.name == stage.name and partition in self.inputs:
            version.manifest.extra[INPUTS] = expected = self.inputs[partition]

            def still_the_inputs(manifest: Manifest) -> None:
                # another run committed what this body reads while it ran: the version may
                # hold newer or mixed inputs, so it records none and never stands
                if body_inputs(self, stage, partition) != expected:
                    manifest.extra.pop(INPUTS, None)
                    self.log(f"{stage.name}: its inputs moved while it ran; it will not stand")

            version.before_commit = still_the_inputs
        return version

    def file_cache(
        self, stage: Stage, code_version: str, salt: str, source: str
    ) -> FileResultCache:
        """One stage's per-file results for one source: in the store (`file-results/`) when
        it is an object store, so every node of a cluster and every later run share them;
        else under the cache dir."""
        if self.store.is_local:
            root: Path | str = self.cache_dir / "file-results"
            return FileResultCache(root, stage.name, code_version, salt, source=source)
        return FileResultCache(
            self.store.join("file-results"),
            stage.name,
            code_version,
            salt,
            source=source,
            fs=self.store.fs,
        )

    def sources(self) -> list[str]:
        """The operational sources, in catalog order (the per-source partitions)."""
        return [s.id for s in self.catalog.operational]

    def partitions(self, stage: Stage | str) -> list[str | None]:
        """A stage's partitions: every source for a per-source stage, the one for a global."""
        s = self.registry.get(stage) if isinstance(stage, str) else stage
        return list(self.sources()) if s.per_source else [None]

    def latest(self, stage: str, source: str | None = None) -> Manifest:
        """The latest version of `stage`: the source's partition for a per-source stage, the
        only one for a global stage."""
        self.may_read(stage)
        per_source = self.registry.get(stage).per_source
        return self.store.latest(stage, source if per_source else None)

    def input_table(self, stage: Stage, source: str) -> str:
        """The table of the input's version that holds `source`'s rows: a global input keeps
        each source in a `data:<source>` table."""
        assert stage.input is not None
        return layout.data_table(None if self.registry.get(stage.input).per_source else source)

    def upstream_hashes(self, manifests: list[Manifest]) -> dict[str, str]:
        return {f"{m.asset}/{m.partition}": self.store.manifest_sha256(m) for m in manifests}


class SourceInputs:
    """What a per-file gate may read for one source besides its input: the source's spec,
    the stage's config, and other stages' versions (each one read is recorded)."""

    def __init__(self, ctx: StageContext, stage: Stage, spec: SourceSpec, config: Any) -> None:
        self.ctx = ctx
        self.stage = stage
        self.source = spec
        self.config: Any = config
        self.read: list[Manifest] = []

    @property
    def catalog(self) -> Catalog:
        return self.ctx.catalog

    def manifest(self, stage: str) -> Manifest:
        if stage not in self.stage.upstream:
            raise UndeclaredReadError(
                f"stage {self.stage.name!r} reads {stage!r} but does not declare it"
            )
        m = self.ctx.latest(stage, self.source.id)
        if all(r.version != m.version or r.asset != m.asset for r in self.read):
            self.read.append(m)
        return m

    def tables(
        self, stage: str, table: str = layout.DATA, columns: list[str] | None = None
    ) -> Iterator[pa.Table]:
        yield from self.ctx.store.iter_tables(self.manifest(stage), table, columns)

    def metadata_files(self, keep: Callable[[str], bool]) -> dict[str, bytes]:
        """The source's non-corpus files collect kept for the gates (REUSE metadata, the
        compile database), path -> bytes, for the paths `keep` accepts."""
        out: dict[str, bytes] = {}
        for t in self.tables(self.ctx.registry.collection(), "metadata"):
            for path, content in zip(t["path"].to_pylist(), t["content"].to_pylist(), strict=True):
                if keep(path):
                    out[path] = content
        return out

    def code_version(self, stage: str) -> str:
        if stage not in self.stage.upstream:
            raise UndeclaredReadError(
                f"stage {self.stage.name!r} reads {stage!r} but does not declare it"
            )
        return self.ctx.code_version(stage)

    def artifact(self, stage: str, relpath: str) -> tuple[str, str]:
        """A file of another stage's latest version: (a local path holding it, its recorded
        sha256); on an object store, a checked copy in the cache dir."""
        m = self.manifest(stage)
        entry = next((f for f in m.files if f.path == relpath), None)
        if entry is None:
            raise ValueError(f"{self.ctx.store.version_dir(m)}: no {relpath} in the manifest")
        store = self.ctx.store
        where = f"{store.version_dir(m)}/{relpath}"
        path = store.local_copy(where, entry.sha256, self.ctx.cache_dir)
        return path, entry.sha256


def config_dump(config: BaseModel | None) -> Mapping[str, Any]:
    return config.model_dump(mode="json") if config is not None else {}
