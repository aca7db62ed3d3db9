"""The stage registry: the one ordered list of the pipeline's stages. Everything that needs
the stages' order or names derives it from here: the Dagster assets and their checks, the
CLI's run plan, the catalog's `stages:` sections, the ledger's stage column, the snapshot's
ledger order and the nightly refresh head (STYLE: say a fact once).

A stage is data: its name (the asset key and the ledger's stage name), its grain, the stage
whose output it transforms (`input`, the chain) and the others it reads, its config model,
its code, and either a per-file gate (`gate`: run shard by shard, source by source, by the
runner) or a body of its own.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pydantic import BaseModel

from megacpp_pipeline.core.gate import GateResult
from megacpp_pipeline.core.ledger import LEDGER_SCHEMA
from megacpp_pipeline.pipeline.libraries import library_versions
from megacpp_pipeline.storage.versions import canonical_json, schema_fingerprint

if TYPE_CHECKING:
    from megacpp_pipeline.core.catalog import Catalog, SourceSpec
    from megacpp_pipeline.pipeline.context import SourceInputs, StageContext
    from megacpp_pipeline.storage.store import Manifest


class Grain(StrEnum):
    PER_SOURCE = "per_source"  # one partition per operational source
    GLOBAL = "global"  # one output for the whole corpus


class RegistryError(ValueError):
    """The stage list is inconsistent; the message names the stage and the field."""


class Markdown(str):
    """A metadata value to render as markdown (the shell turns it into Dagster's)."""


class PathValue(str):
    """A metadata value that names a file (the UI shows it as a path)."""


@dataclass(frozen=True)
class CheckOutcome:
    passed: bool
    metadata: Mapping[str, Any] = field(default_factory=dict)
    description: str | None = None  # the first problem, naming the file or partition


@dataclass(frozen=True)
class Check:
    """A blocking check on a stage's output: a named property and how to evaluate it on one
    partition (None for a global stage) from the store alone."""

    name: str
    description: str
    fn: Callable[[StageContext, Stage, str | None], CheckOutcome]
    # reads every text of the version and records what its pass proved (VERIFIED in its
    # metadata): the orchestration hands it the earlier passes' records of its partitions
    # (StageContext.prior_verdicts; pipeline/checks.py, rescan_content)
    verdicts: bool = False

    def evaluate(self, ctx: StageContext, stage: Stage, partition: str | None) -> CheckOutcome:
        """The outcome on one partition, the check reading only what its stage declares."""
        return self.fn(ctx.for_stage(stage), stage, partition)


@dataclass(frozen=True)
class PreparedGate:
    """A per-file gate ready for one source: the function over one shard, what besides the
    row decides its result (`salt`: the declared licence, the compile database, the
    tokenizer), and what to record in the version's manifest."""

    gate: Callable[[pa.Table], GateResult]
    salt: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)
    # whether its per-file results go through the result cache: not when the gate does
    # less work for a row than the cache does (keying, writing, proving an entry), e.g.
    # the removals gate of a source no request names
    cached: bool = True


@dataclass(frozen=True)
class Materialized:
    """One partition's output as the UI shows it."""

    partition: str | None
    metadata: Mapping[str, Any]
    stats: Mapping[str, float] = field(default_factory=dict)  # its version's counters
    messages: tuple[str, ...] = ()  # what it logged in a worker, for the driver's log


Body = Callable[["StageContext", "Stage", "str | None"], Materialized]
# A per-source stage's work over all the run's partitions at once, mapping its own tasks
# across them; its outputs in partition order.
SourcesBody = Callable[["StageContext", "Stage", Sequence[str | None]], Iterator[Materialized]]


@dataclass(frozen=True)
class Stage:
    name: str  # the asset key and the ledger's stage name, e.g. "normalized_files"
    grain: Grain
    description: str
    group: str  # the UI group: collect, gates, tokens, snapshot
    input: str | None = None  # the stage whose output this one transforms (the chain)
    # other stages it reads (their data, stats or artifacts), by their name constants:
    # StageContext refuses a read of any stage not declared here
    reads: tuple[str, ...] = ()
    # it also reads every earlier stage that writes ledger rows (the snapshot's ledger):
    # the registry resolves them, so an inserted gate is read too
    reads_ledgers: bool = False
    # stages whose config alone it reads (the catalog's, so a later stage's too: removals
    # sign removed files with dedup's near-duplicate settings); covered by its code version
    config_reads: tuple[str, ...] = ()
    config_key: str | None = None  # its section under `stages:` in sources.yaml
    config: type[BaseModel] | None = None
    # defaults a config takes from the catalog itself (packing's seq_len)
    catalog_defaults: Callable[[Catalog], Mapping[str, Any]] | None = None
    code: tuple[str, ...] = ()  # modules whose source is this stage's code
    # what else of the catalog versions it (the catalog stage: the whole catalog)
    version_data: Callable[[Catalog], Any] | None = None
    schema: pa.Schema | None = None  # the rows of its `data` table
    content_column: str | None = None  # what a per-file gate reads of a row (cache key)
    # output columns whose rows usually hold the bytes of an input column of another name
    # (normalize's text: its input's content, as it was): the result cache leaves them to
    # the input, as it does a column the gate passes through
    cache_from: Mapping[str, str] = field(default_factory=dict)
    side_tables: Mapping[str, pa.Schema] = field(default_factory=dict)
    drop_reasons: tuple[str, ...] = ()
    writes_ledger: bool = False
    # non-corpus files of a source this stage reads (REUSE metadata, the compile database):
    # collection keeps every path one of the stages asks for in the source's metadata table
    metadata_files: Callable[[SourceSpec, str], bool] | None = None
    # per-file stages: the gate for one source; the runner maps it over the input's slices
    # (a per-source stage: one version per source; a global one: one version whose
    # `data:<source>` tables keep the sources apart)
    gate: Callable[[SourceInputs], PreparedGate] | None = None
    # recomputes the gate's stats families (prefix before ':') over its whole output, cached
    # rows included, since a gate's own stats only cover the files it saw
    summarize: Callable[[GateResult], Counter[str]] | None = None
    body: Body | None = None  # any other stage: its work for one partition
    # a latest version computed from the same inputs stands and the body is not run
    # (pipeline/reuse.py; a per-file gate's always may): its body's whole output is its
    # version, or what else it writes is checked by `still_whole`
    reusable: bool = False
    # a reusable stage whose version names a folder beside it (the snapshot): what its
    # standing version reports when that folder is still whole, None when it is not (the
    # body runs again)
    still_whole: Callable[[StageContext, Manifest], Mapping[str, Any] | None] | None = None
    # what else a reusable body reads that no version it reads holds (the snapshot's card
    # counts the removal requests), hashed into its inputs id
    inputs_salt: Callable[[StageContext], str] | None = None
    # or, for a per-source stage, its work over all its partitions at once, spreading its
    # own tasks across them (collection: a large source's slices beside the small sources)
    sources_body: SourcesBody | None = None
    # what a per-file stage shows beyond the standard summary, from its version and stats
    report: Callable[[StageContext, Manifest, Mapping[str, float]], Mapping[str, Any]] | None = None
    checks: tuple[Check, ...] = ()  # beyond the standard ones the runner adds
    manifest_check: bool = True  # its version verifies from disk (standard check)
    kinds: tuple[str, ...] = ("parquet",)
    owners: tuple[str, ...] = ("team:data",)

    @property
    def per_source(self) -> bool:
        return self.grain is Grain.PER_SOURCE

    @property
    def upstream(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(([self.input] if self.input else []) + list(self.reads)))


class Registry:
    """The ordered stages. Immutable: `insert` returns a new registry."""

    def __init__(self, stages: Sequence[Stage]) -> None:
        self.stages: tuple[Stage, ...] = tuple(stages)
        self._by_name = {s.name: s for s in self.stages}
        self._validate()

    def _validate(self) -> None:
        names = [s.name for s in self.stages]
        seen: set[str] = set()
        config_keys: set[str] = set()
        for s in self.stages:
            if s.name in seen:
                raise RegistryError(f"stage {s.name!r}: the name is used twice")
            for up in s.upstream:
                if up not in seen:
                    raise RegistryError(
                        f"stage {s.name!r}: upstream {up!r} is not an earlier stage"
                    )
            for other in s.config_reads:
                if other not in names or self.stages[names.index(other)].config is None:
                    raise RegistryError(
                        f"stage {s.name!r}: config_reads {other!r} is not a stage with a config"
                    )
            if [s.gate, s.body, s.sources_body].count(None) != 2:
                raise RegistryError(
                    f"stage {s.name!r}: needs exactly one of gate, body and sources_body"
                )
            if s.sources_body is not None and not s.per_source:
                raise RegistryError(f"stage {s.name!r}: sources_body is for a per-source stage")
            if s.gate is not None:
                if s.input is None:
                    raise RegistryError(f"stage {s.name!r}: a per-file gate runs on an input")
                if s.schema is None or s.content_column is None:
                    raise RegistryError(
                        f"stage {s.name!r}: a per-file gate needs schema and content_column"
                    )
            if s.config_key:
                if s.config_key in config_keys:
                    raise RegistryError(
                        f"stage {s.name!r}: config section {s.config_key!r} is taken"
                    )
                if s.config is None:
                    raise RegistryError(f"stage {s.name!r}: config_key without a config model")
                config_keys.add(s.config_key)
            seen.add(s.name)

    # reading ---------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Stage]:
        return iter(self.stages)

    def __len__(self) -> int:
        return len(self.stages)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def get(self, name: str) -> Stage:
        try:
            return self._by_name[name]
        except KeyError:
            raise RegistryError(f"no stage {name!r} (known: {', '.join(self.names())})") from None

    def names(self) -> list[str]:
        return [s.name for s in self.stages]

    def config_models(self) -> dict[str, type[BaseModel]]:
        """`stages:` section name -> the config model that validates it."""
        return {s.config_key: s.config for s in self.stages if s.config_key and s.config}

    def is_metadata_file(self, spec: SourceSpec, path: str) -> bool:
        """Whether some stage reads this file of the source as metadata."""
        return any(s.metadata_files(spec, path) for s in self.stages if s.metadata_files)

    def collection(self) -> str:
        """The stage that collects: the first ledger stage, which lists every file seen and
        keeps the sources' metadata files (its `metadata` table)."""
        stages = self.ledger_stages()
        if not stages:
            raise RegistryError("no stage writes a ledger: nothing collects")
        return stages[0]

    def ledger_stages(self) -> list[str]:
        """The stages that write ledger rows, in order: the first lists every file seen."""
        return [s.name for s in self.stages if s.writes_ledger]

    def refresh_head(self) -> list[str]:
        """The first run of per-source stages (collect up to the first corpus-wide stage):
        what one source's refresh run materializes on its own."""
        head: list[str] = []
        for s in self.stages:
            if s.per_source:
                head.append(s.name)
            elif head:
                break
        return head

    def run_groups(self) -> list[tuple[str, ...]]:
        """The stages cut into as few groups as their grains allow, in dependency order: a
        group takes every stage of its grain whose reads (reads_of: its Dagster deps) are done
        or in the group (what `megacpp run` materializes in one Dagster run each, and what
        the plan sizes)."""
        done: set[str] = set()
        groups: list[tuple[str, ...]] = []
        while len(done) < len(self.stages):
            grain = next(
                s.per_source
                for s in self.stages
                if s.name not in done and set(self.reads_of(s)) <= done
            )
            group: list[str] = []
            grew = True
            while grew:
                grew = False
                for s in self.stages:
                    if s.name in done or s.name in group or s.per_source != grain:
                        continue
                    if set(self.reads_of(s)) <= done | set(group):
                        group.append(s.name)
                        grew = True
            groups.append(tuple(group))
            done.update(group)
        return groups

    def reads_of(self, stage: Stage) -> tuple[str, ...]:
        """Every stage `stage` reads: its input, its declared reads, and the earlier ledger
        stages when it reads them all."""
        names = list(stage.upstream)
        if stage.reads_ledgers:
            earlier = self.names()[: self.names().index(stage.name)]
            names += [n for n in earlier if self.get(n).writes_ledger]
        return tuple(dict.fromkeys(names))

    def pass_after(self, stage: Stage) -> tuple[str, ...]:
        """The per-source gates that can run in one pass over the files with `stage`'s gate
        (pipeline/file_stage.py), in order: each comes right after the one before it in the
        list, takes that one's output as its input, and reads nothing else that is not
        done before `stage` runs."""
        if stage.gate is None or not stage.per_source:
            return ()
        names = self.names()
        before = set(names[: names.index(stage.name)])
        out: list[str] = []
        previous = stage
        for s in self.stages[names.index(stage.name) + 1 :]:
            others = set(self.reads_of(s)) - {previous.name}
            if s.gate is None or not s.per_source or s.input != previous.name:
                break
            if not others <= before:
                break
            out.append(s.name)
            previous = s
        return tuple(out)

    def downstream_of(self, name: str) -> list[str]:
        """Every stage that reads `name`'s output, directly or not, in order."""
        out: list[str] = []
        reached = {name}
        for s in self.stages:
            if reached.intersection(self.reads_of(s)):
                out.append(s.name)
                reached.add(s.name)
        return out

    # changing --------------------------------------------------------------------------
    def insert(self, stage: Stage, *, after: str) -> Registry:
        """A registry with `stage` placed right after `after`; `stage` takes `after`'s output
        as its input unless it names one, and every stage that took `after`'s output as its
        input takes `stage`'s instead (the chain rewires; `reads` stay as they are)."""
        self.get(after)
        if stage.name in self._by_name:
            raise RegistryError(f"stage {stage.name!r}: the name is used twice")
        new = stage if stage.input else replace(stage, input=after)
        out: list[Stage] = []
        for s in self.stages:
            if s.input == after:
                s = replace(s, input=new.name)
            out.append(s)
            if s.name == after:
                out.append(new)
        return Registry(out)

    # versions --------------------------------------------------------------------------
    def config_of(self, stage: Stage, catalog: Catalog) -> BaseModel | None:
        """The stage's config: its model's defaults, then what the catalog implies, then the
        `stages.<config_key>` section of sources.yaml."""
        if stage.config is None:
            return None
        section: dict[str, Any] = dict(catalog_defaults(stage, catalog))
        section.update(catalog.stages.get(stage.config_key or "", None) or {})
        return stage.config.model_validate(section)

    def code_version(self, stage: Stage, catalog: Catalog) -> str:
        """The hash of the stage's code and config: Dagster's code_version of its asset, the
        namespace of its per-file result cache. Change either and the stage is stale. Its
        code includes the installed version of every library that code imports (and
        Python's): a new tree-sitter-cpp grammar or tiktoken must not let the result cache
        serve what the old one decided."""
        h = hashlib.sha256(stage.name.encode())
        for module in stage.code:
            h.update(b"\0" + module_source(module))
        h.update(b"\0libraries:" + "\0".join(library_versions(stage.code)).encode())
        # what it writes is part of what it is: a table that gains a column is a new version
        tables = [stage.schema, *stage.side_tables.values()]
        if stage.writes_ledger:
            tables.append(LEDGER_SCHEMA)
        for schema in tables:
            if schema is not None:
                h.update(b"\0" + schema_fingerprint(schema).encode())
        config = self.config_of(stage, catalog)
        if config is not None:
            h.update(b"\0" + canonical_json(config.model_dump(mode="json")))
        # what it reads is part of what it is too: the stages it reads by name (their data
        # reaches it as data), and the config of each one whose config it reads
        h.update(b"\0config_reads:" + "\0".join(stage.config_reads).encode())
        h.update(b"\0reads:" + "\0".join(self.reads_of(stage)).encode())
        for name in stage.config_reads:
            read = self.config_of(self.get(name), catalog)
            if read is not None:
                h.update(b"\0" + canonical_json(read.model_dump(mode="json")))
        if stage.version_data is not None:
            h.update(b"\0" + canonical_json(stage.version_data(catalog)))
        return h.hexdigest()[:16]


def module_source(name: str) -> bytes:
    """The source of a module, or every file of a package, its data included (a gate split
    into a package is still one gate's code, and the rule files it reads decide as its code
    does: an SPDX list or gitleaks' rules changed under the same .py files must not let the
    per-file result cache serve the old decisions). Each file by its path in the package."""
    module = importlib.import_module(name)
    paths = getattr(module, "__path__", None)
    if paths is None:
        return inspect.getsource(module).encode()
    parts = []
    for root in sorted(Path(p) for p in paths):
        for f in sorted(root.rglob("*")):
            if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc":
                parts.append(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes())
    return b"\0".join(parts)


def catalog_defaults(stage: Stage, catalog: Catalog) -> Mapping[str, Any]:
    return stage.catalog_defaults(catalog) if stage.catalog_defaults else {}
