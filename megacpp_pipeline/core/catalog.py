"""The source catalog (`sources.yaml`): what may enter the corpus, pinned to exact revisions.

Seed rule: keep the active training slice pinned to explicit revisions and the larger
catalog as metadata. A wrong, missing or unknown field fails before any work starts, with a
message that names the source and the field.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

if TYPE_CHECKING:
    from megacpp_pipeline.pipeline.registry import Registry

DEFAULT_INCLUDE = [
    "**/*.h",
    "**/*.hpp",
    "**/*.cc",
    "**/*.cpp",
    "**/*.cxx",
    "**/*.hh",
    "**/*.hxx",
    "**/*.ipp",
    "**/*.inl",
]
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class CatalogError(Exception):
    """sources.yaml is wrong; the message names the file, the source and the field."""


class SourceSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^[a-z0-9_-]+$")
    kind: Literal["git", "archive", "dir", "jsonl"]
    uri: str
    sha256: str | None = None
    revision: str | None = None
    track: str | None = None  # git branch resolved to a commit at refresh time
    subdir: str | None = None
    include: list[str] = Field(default_factory=lambda: list(DEFAULT_INCLUDE))
    exclude: list[str] = Field(default_factory=list)
    declared_license: str | None = None
    role: Literal["operational", "catalog"] = "operational"
    compile_commands: str | None = None  # path of a compile_commands.json inside the source
    # path prefixes inside the source that hold vendored copies of other projects (besides
    # the usual third_party/, vendor/, external/ ... folders); dedup keeps upstream copies first
    vendored_paths: list[str] = Field(default_factory=list)
    # how much of the training mixture this source is: its documents are packed `weight`
    # times on average (0.5: about half of them once; 2.5: each twice, half of them three
    # times), by a seeded hash of each document (corpus/packing.py: document_draws)
    weight: float = Field(default=1.0, gt=0.0, le=1000.0)

    @field_validator("sha256")
    @classmethod
    def _sha256_is_hex(cls, v: str | None) -> str | None:
        if v is not None and not _HEX64.match(v):
            raise ValueError("must be 64 lowercase hex characters")
        return v

    @field_validator("revision")
    @classmethod
    def _revision_is_commit(cls, v: str | None) -> str | None:
        if v is not None and not _HEX40.match(v):
            raise ValueError("must be an exact 40-hex commit id, not a branch or tag name")
        return v

    @field_validator("subdir", "compile_commands")
    @classmethod
    def _relative_inside(cls, v: str | None) -> str | None:
        if v is None:
            return v
        p = Path(v)
        if p.is_absolute() or ".." in p.parts:
            raise ValueError("must be a relative path inside the source")
        return p.as_posix()

    @model_validator(mode="after")
    def _pinned(self) -> SourceSpec:
        if self.kind == "archive" and self.sha256 is None:
            raise ValueError("archive sources need sha256 (verified before extraction)")
        operational_git = self.kind == "git" and self.role == "operational"
        if operational_git and self.revision is None and self.track is None:
            raise ValueError("operational git sources need revision (an exact commit)")
        if self.kind != "git" and self.track is not None:
            raise ValueError("track is only for git sources")
        if self.kind != "git" and self.revision is not None:
            raise ValueError("revision is only for git sources (archives pin by sha256)")
        return self


class RemovalSpec(BaseModel):
    """One `removals:` entry: exactly one of {source}, {source, path}, {sha256}, {file}, each
    with an optional reason. `path` is a glob as in a source's include list (`**/` spans
    folders); `sha256` names content (every copy, in every source); `file` is a JSONL file
    of such entries (not `file` again), relative to the yaml's folder."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str | None = None
    path: str | None = None
    sha256: str | None = None
    file: str | None = None
    reason: str | None = None

    @field_validator("source")
    @classmethod
    def _source_id(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[a-z0-9_-]+", v):
            raise ValueError("must be a source id ([a-z0-9_-]+)")
        return v

    @field_validator("sha256")
    @classmethod
    def _hex(cls, v: str | None) -> str | None:
        if v is not None and not _HEX64.match(v.lower()):
            raise ValueError("must be 64 hex characters (the sha256 of the collected file)")
        return None if v is None else v.lower()

    @field_validator("path")
    @classmethod
    def _relative(cls, v: str | None) -> str | None:
        if v is not None and (not v or v.startswith("/") or ".." in v.split("/")):
            raise ValueError("must be a relative glob inside the source")
        return v

    @model_validator(mode="after")
    def _one_form(self) -> RemovalSpec:
        if self.path is not None and self.source is None:
            raise ValueError("path needs source")
        forms = [f for f in ("source", "sha256", "file") if getattr(self, f) is not None]
        if len(forms) != 1:
            raise ValueError(
                "needs exactly one of source (with an optional path), sha256 or file"
                + (f"; has {' and '.join(forms)}" if forms else "")
            )
        return self

    def describe(self) -> str:
        if self.sha256 is not None:
            what = f"sha256 {self.sha256}"
        elif self.file is not None:
            what = f"file {self.file}"
        elif self.path is not None:
            what = f"source {self.source} path {self.path}"
        else:
            what = f"source {self.source}"
        return what + (f" (reason: {self.reason})" if self.reason else "")


class BenchmarkSpec(BaseModel):
    """One `benchmarks:` entry of sources.yaml: a pinned file of tasks and the fields whose
    text counts. A record's task id is its `id_field` value, or its 1-based record number
    (JSONL line, parquet row) when `id_field` is null."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^[a-z0-9_.-]+$")
    uri: str  # a local path (relative: to the yaml's folder) or file:// URI
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    format: Literal["jsonl", "parquet"]
    fields: list[str] = Field(min_length=1)
    id_field: str | None = "task_id"

    @field_validator("uri")
    @classmethod
    def _local(cls, v: str) -> str:
        if "://" in v and not v.startswith("file://"):
            raise ValueError("must be a local path or file:// URI (pin a downloaded copy)")
        return v

    @field_validator("fields")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("names a field twice")
        return v

    def path(self, base_dir: Path) -> Path:
        p = Path(self.uri.removeprefix("file://")).expanduser()
        return p if p.is_absolute() else (base_dir / p).resolve()


class ShardConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_rows: int = Field(default=20_000, gt=0)
    max_bytes: int = Field(default=64 << 20, gt=0)


class CollectLimits(BaseModel):
    """Bounds that keep a hostile archive (zip bomb) from exhausting the machine."""

    model_config = ConfigDict(extra="forbid")
    max_file_bytes: int = Field(default=16 << 20, gt=0)
    max_total_bytes: int = Field(default=4 << 30, gt=0)
    max_files: int = Field(default=500_000, gt=0)
    max_compression_ratio: float = Field(default=200.0, gt=1)


class RefreshConfig(BaseModel):
    """The nightly refresh: when it runs (cron, in `timezone`)."""

    model_config = ConfigDict(extra="forbid")
    cron: str = Field(default="0 2 * * *", pattern=r"^\S+( \S+){4}$")
    timezone: str = "UTC"


def _stage_configs(registry: Registry | None) -> dict[str, type[BaseModel]]:
    """`stages:` section name -> config model, from the stage registry in use (the default
    one unless the caller validates against another)."""
    if registry is None:
        from megacpp_pipeline.stages import default_registry

        registry = default_registry()
    return registry.config_models()


class Catalog(BaseModel):
    model_config = ConfigDict(extra="forbid")

    snapshot: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    seq_len: int = Field(default=2048, ge=16, le=1 << 20)
    sources: list[SourceSpec] = Field(min_length=1)
    shards: ShardConfig = Field(default_factory=ShardConfig)
    collect: CollectLimits = Field(default_factory=CollectLimits)
    refresh: RefreshConfig = Field(default_factory=RefreshConfig)
    stages: dict[str, dict[str, Any]] = Field(default_factory=dict)  # per-gate config sections
    # content that must not be in the corpus: removal requests and evaluation benchmarks
    removals: list[RemovalSpec] = Field(default_factory=list)
    benchmarks: list[BenchmarkSpec] = Field(default_factory=list)
    base_dir: Path = Field(default=Path("."), exclude=True)

    @model_validator(mode="after")
    def _unique_ids(self) -> Catalog:
        seen: set[str] = set()
        for s in self.sources:
            if s.id in seen:
                raise ValueError(f"duplicate source id {s.id!r}")
            seen.add(s.id)
        return self

    @model_validator(mode="after")
    def _unique_benchmarks(self) -> Catalog:
        ids = [b.id for b in self.benchmarks]
        if len(ids) != len(set(ids)):
            raise ValueError(f"benchmarks: duplicate id in {ids}")
        return self

    @field_validator("stages")
    @classmethod
    def _known_stages(
        cls, v: dict[str, dict[str, Any]], info: ValidationInfo
    ) -> dict[str, dict[str, Any]]:
        models = _stage_configs((info.context or {}).get("registry"))
        for stage, section in v.items():
            if stage not in models:
                raise ValueError(f"unknown stage {stage!r} (known: {', '.join(models)})")
            try:
                models[stage].model_validate(section or {})
            except ValidationError as e:
                first = e.errors()[0]
                loc = ".".join(str(x) for x in first["loc"])
                raise ValueError(f"stages.{stage}.{loc}: {first['msg']}") from None
        return v

    @property
    def operational(self) -> list[SourceSpec]:
        return [s for s in self.sources if s.role == "operational"]

    @functools.cached_property
    def sources_by_id(self) -> dict[str, SourceSpec]:
        return {s.id: s for s in self.sources}

    def source(self, source_id: str) -> SourceSpec:
        try:
            return self.sources_by_id[source_id]
        except KeyError:
            raise CatalogError(f"no source {source_id!r} in the catalog") from None

    def resolve_uri(self, spec: SourceSpec) -> str:
        """Relative paths resolve against the yaml's folder; URLs stay as they are."""
        if "://" in spec.uri:
            return spec.uri
        p = Path(spec.uri).expanduser()
        return str(p if p.is_absolute() else (self.base_dir / p).resolve())

    def source_order(self) -> dict[str, int]:
        return {s.id: i for i, s in enumerate(self.sources)}


def _describe(error: dict[str, Any], data: Any) -> str:
    loc = list(error["loc"])
    where = []
    if len(loc) >= 2 and loc[0] == "sources" and isinstance(loc[1], int):
        idx = loc[1]
        sid = None
        if isinstance(data, dict) and isinstance(data.get("sources"), list):
            src = data["sources"][idx] if idx < len(data["sources"]) else None
            sid = src.get("id") if isinstance(src, dict) else None
        where.append(f"source {sid!r}" if sid else f"sources[{idx}]")
        loc = loc[2:]
    field = ".".join(str(x) for x in loc) or "(the entry itself)"
    msg = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        msg = "unknown key (typo?)"
    return f"{' '.join(where) + ': ' if where else ''}field {field}: {msg}"


def parse_catalog(
    data: Any, *, base_dir: Path, origin: str = "sources.yaml", registry: Registry | None = None
) -> Catalog:
    """The catalog in `data`; its `stages:` sections are validated against `registry`'s
    config models (the default registry's when None)."""
    try:
        catalog = Catalog.model_validate(data, context={"registry": registry})
    except ValidationError as e:
        lines = [_describe(err, data) for err in e.errors()]  # type: ignore[arg-type]
        raise CatalogError(f"{origin}: " + "; ".join(lines)) from None
    catalog.base_dir = base_dir
    _check_files(catalog, origin)
    return catalog


def _check_files(catalog: Catalog, origin: str) -> None:
    """What the entries point at, before any work: removal request files are read and every
    line validated, benchmark files match their pins."""
    from megacpp_pipeline.corpus.decontaminate import BenchmarkError, verify_benchmark
    from megacpp_pipeline.gates.removals import RemovalError, load_removals

    try:
        load_removals(
            catalog.removals,
            catalog.base_dir,
            known_sources={s.id for s in catalog.sources},
            origin=origin,
        )
        for spec in catalog.benchmarks:
            verify_benchmark(spec, catalog.base_dir)
    except (RemovalError, BenchmarkError) as e:
        raise CatalogError(str(e)) from None


# libyaml's loader where PyYAML has it: the pure-Python one takes ~3 ms a source, which
# for thousands of sources made reading the catalog cost more than the run's other work
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_catalog(path: str | Path, registry: Registry | None = None) -> Catalog:
    """The validated catalog at `path`. Parsed once per content: every asset and check of a
    run asks for it, and the answer only changes when the file does (so callers share one
    Catalog and must not change it)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise CatalogError(f"{path}: no such file") from None
    return _parsed(str(path.resolve()), str(path), raw, registry)


@functools.lru_cache(maxsize=8)
def _parsed(resolved: str, origin: str, raw: bytes, registry: Registry | None) -> Catalog:
    try:
        data = yaml.load(raw.decode("utf-8"), Loader=_YAML_LOADER)
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise CatalogError(f"{origin}: not valid YAML ({e})") from None
    if not isinstance(data, dict):
        raise CatalogError(f"{origin}: expected a mapping with snapshot, seq_len and sources")
    return parse_catalog(data, base_dir=Path(resolved).parent, origin=origin, registry=registry)
