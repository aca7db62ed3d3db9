"""The source catalog (`sources.yaml`): what may enter the corpus, pinned to exact revisions.

Seed rule: keep the active training slice pinned to explicit revisions and the larger
catalog as metadata. A wrong, missing or unknown field fails before any work starts, with a
message that names the source and the field.
"""

from __future__ import annotations

import functools
import re
import zoneinfo
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

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
# One size policy: the largest file (raw bytes) any stage takes. Collection refuses a larger
# one before reading past the limit, so no later stage ever holds more of one file. A source
# may set its own (`max_file_bytes:` in its entry).
DEFAULT_MAX_FILE_BYTES = 1 << 20
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
    max_file_bytes: int | None = Field(default=None, gt=0)  # this source's size policy

    @field_validator("include", "exclude")
    @classmethod
    def _globs_inside(cls, v: list[str]) -> list[str]:
        for pattern in v:
            if pattern.startswith("/") or ".." in pattern.replace("\\", "/").split("/"):
                raise ValueError(
                    f"{pattern!r} reaches outside the source (`..` or an absolute path); "
                    "patterns match paths relative to the source root"
                )
        return v

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


class CollectLimits(BaseModel):
    """Bounds that keep a hostile archive (zip bomb) from exhausting the machine. The size of
    one file is the catalog's `max_file_bytes` (one size policy for every stage)."""

    model_config = ConfigDict(extra="forbid")
    max_total_bytes: int = Field(default=4 << 30, gt=0)
    max_files: int = Field(default=500_000, gt=0)
    max_compression_ratio: float = Field(default=200.0, gt=1)


class SplitConfig(BaseModel):
    """Which documents are held out for validation: a file is `validation` when a keyed hash
    of (source id, path) falls under the fraction. Its own section: the tokenizer trains on
    the train split alone and the tokenize stage labels every file with it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    validation_fraction: float = Field(default=0.02, ge=0.0, le=1.0)
    # Changing the salt reshuffles the split; keep it fixed across snapshots so a document
    # never moves from validation into train.
    salt: str = "megacpp-split-v1"


class RefreshConfig(BaseModel):
    """The nightly refresh: when it runs (cron, in `timezone`). The cron's five fields are
    checked here; whether Dagster can schedule them, where the schedule is built (the
    library does not import Dagster)."""

    model_config = ConfigDict(extra="forbid")
    cron: str = Field(default="0 2 * * *", pattern=r"^\S+( \S+){4}$")
    timezone: str = "UTC"

    @field_validator("timezone")
    @classmethod
    def _known_timezone(cls, v: str) -> str:
        try:
            zoneinfo.ZoneInfo(v)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"unknown time zone {v!r} (an IANA name, e.g. UTC or Europe/Berlin)"
            ) from None
        return v


class Catalog(BaseModel):
    # frozen: every asset and check of a run shares the one parsed catalog
    model_config = ConfigDict(extra="forbid", frozen=True)

    snapshot: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    seq_len: int = Field(default=2048, ge=16, le=1 << 20)
    max_file_bytes: int = Field(default=DEFAULT_MAX_FILE_BYTES, gt=0)
    sources: list[SourceSpec] = Field(min_length=1)
    collect: CollectLimits = Field(default_factory=CollectLimits)
    refresh: RefreshConfig = Field(default_factory=RefreshConfig)
    split: SplitConfig = Field(default_factory=SplitConfig)
    stages: dict[str, dict[str, Any]] = Field(default_factory=dict)  # per-gate config sections
    # content that must not be in the corpus: removal requests and evaluation benchmarks
    removals: list[RemovalSpec] = Field(default_factory=list)
    benchmarks: list[BenchmarkSpec] = Field(default_factory=list)
    base_dir: Path = Field(default=Path("."), exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _one_size_policy(cls, data: Any) -> Any:
        """Settings that moved out of a stage's section: say where the one setting is (or
        that it is none)."""
        if not isinstance(data, dict):
            return data
        places = [("collect", (data.get("collect") or {}))]
        stages = data.get("stages") or {}
        if isinstance(stages, dict):
            places += [(f"stages.{k}", stages.get(k) or {}) for k in ("normalize", "enrich")]
        for where, section in places:
            if isinstance(section, dict) and "max_file_bytes" in section:
                raise ValueError(
                    f"{where}.max_file_bytes: there is one size policy now: set max_file_bytes "
                    "at the top of sources.yaml (or in a source's entry for that source)"
                )
        if "shards" in data:
            # accepted once and never applied: a per-file stage writes one shard per slice
            # of its input whatever the limits, so a catalog setting could not hold
            raise ValueError(
                "shards: not a setting of sources.yaml (it was never applied): a per-file "
                "stage writes one shard per slice of its input, and the other stages' shard "
                "limits are the pipeline resource's (max_rows_per_shard, "
                "max_bytes_per_shard); remove the section"
            )
        tokenize = stages.get("tokenize") if isinstance(stages, dict) else None
        for old, new in (("validation_fraction", "validation_fraction"), ("split_salt", "salt")):
            if isinstance(tokenize, dict) and old in tokenize:
                raise ValueError(
                    f"stages.tokenize.{old}: the train/validation split has its own section "
                    f"now: set split.{new} at the top of sources.yaml"
                )
        return data

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
        models: Mapping[str, type[BaseModel]] | None = (info.context or {}).get("stage_models")
        if models is None:  # parsed alone: the pipeline checks the sections (load_catalog)
            return v
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

    def file_limit(self, spec: SourceSpec) -> int:
        """The size policy for one source: its own max_file_bytes, else the catalog's."""
        return spec.max_file_bytes or self.max_file_bytes

    def size_policy(self) -> dict[str, int]:
        """Every source's limit, for the versions of the stages that apply it."""
        return {s.id: self.file_limit(s) for s in self.sources}

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
    msg = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        msg = "unknown key (typo?)"
    if not loc and not where:
        return msg  # a rule over the whole file: the message names its fields itself
    field = ".".join(str(x) for x in loc) or "(the entry itself)"
    return f"{' '.join(where) + ': ' if where else ''}field {field}: {msg}"


def parse_catalog(
    data: Any,
    *,
    base_dir: Path,
    origin: str = "sources.yaml",
    stage_models: Mapping[str, type[BaseModel]] | None = None,
) -> Catalog:
    """The catalog in `data`, relative paths against `base_dir`; its `stages:` sections are
    validated against `stage_models` (section -> config model) when given."""
    try:
        return Catalog.model_validate(
            {**data, "base_dir": base_dir} if isinstance(data, dict) else data,
            context={"stage_models": stage_models},
        )
    except ValidationError as e:
        lines = [_describe(err, data) for err in e.errors()]  # type: ignore[arg-type]
        raise CatalogError(f"{origin}: " + "; ".join(lines)) from None


# libyaml's loader where PyYAML has it: the pure-Python one takes ~3 ms a source, which
# for thousands of sources made reading the catalog cost more than the run's other work
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_catalog(
    path: str | Path, stage_models: Mapping[str, type[BaseModel]] | None = None
) -> Catalog:
    """The catalog at `path`, parsed (see parse_catalog). Parsed once per content and
    models: every asset and check of a run asks for it, and the answer only changes when
    the file does (the Catalog is frozen, so sharing it is safe)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise CatalogError(f"{path}: no such file") from None
    models = tuple(sorted(stage_models.items())) if stage_models is not None else None
    return _parsed(str(path.resolve()), str(path), raw, models)


@functools.lru_cache(maxsize=8)
def _parsed(
    resolved: str, origin: str, raw: bytes, models: tuple[tuple[str, type[BaseModel]], ...] | None
) -> Catalog:
    try:
        data = yaml.load(raw.decode("utf-8"), Loader=_YAML_LOADER)
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise CatalogError(f"{origin}: not valid YAML ({e})") from None
    if not isinstance(data, dict):
        raise CatalogError(f"{origin}: expected a mapping with snapshot, seq_len and sources")
    stage_models = dict(models) if models is not None else None
    return parse_catalog(
        data, base_dir=Path(resolved).parent, origin=origin, stage_models=stage_models
    )
