"""A version whose inputs did not change is the answer again: the stage is not run.

Every version a per-file gate commits records what it was computed from (`inputs_id`, in
its manifest's extra under `inputs`): the whole library's code and the versions of the
libraries it imports (`pipeline_fingerprint`), the stage's code version and
config, what else its gate read (the gate's salt), the catalog as the partition sees it,
and the content of every upstream version it read (`versions.content_id`: the sha256 of
each shard and of each shard holding its text, never the folder or the time it was written
in). Before a stage computes a partition it works out that identity for the inputs it
would read now; when the partition's latest version records the same one, that version
stands and nothing is read, keyed, gated or written. Collection takes part by a source's
revision (a git commit or an archive's sha256 before anything is read, a directory's tree
hash once its files are hashed: stages/collect.py), so everything after an unchanged source
stands.

A stage that is not a per-file gate takes part when it says so (`Stage.reusable`: dedup,
documents, packing, the snapshot); its identity is taken from the latest version of
everything it declares it reads, and recorded by `StageContext.begin` (not at all when it
moved by the time the version commits: another run committed an input meanwhile). The
snapshot's version names a folder beside it: it stands only while that folder is still
whole, every file it lists with its sha256 and every other one (manifest, marker, card,
text release) with the sha256 the version recorded (`Stage.still_whole`). The Megatron
export is taken again while its marker names the snapshot, its code and every file's
sha256; the report is always rendered again.

The blocking checks still run on the version that stands, as after any materialization.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import megacpp_pipeline
from megacpp_pipeline.core.catalog import Catalog
from megacpp_pipeline.core.kept import Kept
from megacpp_pipeline.pipeline.libraries import library_versions
from megacpp_pipeline.snapshot import layout
from megacpp_pipeline.storage.store import Manifest, NoVersionError
from megacpp_pipeline.storage.versions import canonical_json, config_hash, content_id

if TYPE_CHECKING:
    from megacpp_pipeline.pipeline.context import StageContext
    from megacpp_pipeline.pipeline.registry import Stage

INPUTS = "inputs"  # the manifest's extra key holding its inputs_id
RECOMPUTE_ENV = "MEGACPP_RECOMPUTE"  # set (not 0): no version stands (StageContext.reuse)


@functools.cache
def pipeline_fingerprint() -> str:
    """Every file of the library (its modules and the rule files beside them) and the
    installed version of every library it imports (pipeline/libraries.py). A stage's code
    version names only its own modules and their libraries: it keys the result cache and
    Dagster's versions, which must not move with every edit elsewhere. A version stands
    only for the code that wrote it, since a change anywhere (the parquet options, the
    snapshot's writers, a library upgrade) can change what a stage would write now."""
    root = Path(megacpp_pipeline.__file__).resolve().parent
    return fingerprint(root, library_versions([megacpp_pipeline.__name__]))


def fingerprint(root: Path, libraries: Iterable[str]) -> str:
    """The sha256 of every file under `root` (by path and content; compiled files left
    out) and of `libraries` (each `name==version`, library_versions)."""
    h = hashlib.sha256(b"pipeline\0")
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if "__pycache__" in rel.split("/") or path.suffix == ".pyc":
            continue
        h.update(rel.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    for library in libraries:
        h.update(f"{library}\0".encode())
    return h.hexdigest()


# catalog sections whose readers declare them (Stage.version_data), and no per-source stage
# reads undeclared
_DECLARED_SECTIONS = ("removals", "benchmarks")


def inputs_id(
    ctx: StageContext,
    stage: Stage,
    partition: str | None,
    upstream: Iterable[Manifest],
    salts: Iterable[str] = (),
) -> str:
    """What a version of `stage` for `partition` computed from `upstream` is a function of.
    The same inputs in any order (or read twice) give the same id. A per-source stage
    whose input is corpus-wide reads only its source's table of it, so only that table
    counts (a change in another source leaves its version standing)."""
    h = hashlib.sha256(b"inputs\0")
    h.update(pipeline_fingerprint().encode() + b"\0")
    h.update(ctx.code_version(stage).encode() + b"\0")
    h.update(config_hash(ctx.config(stage)).encode() + b"\0")
    whole, entries = _catalog_json(ctx.catalog)
    catalog = dict(whole)
    if stage.per_source:  # a source's partition sees the catalog's settings and its own entry
        catalog["sources"] = [entries[partition]] if partition in entries else []
        # the removal requests and the benchmarks are read by the stages that declare them
        # (their code versions hold them, their salts what each source's files meet), so an
        # edit to them leaves every other stage's version of a source standing
        for section in _DECLARED_SECTIONS:
            del catalog[section]
    h.update(canonical_json(catalog) + b"\0")
    h.update(canonical_json(sorted(set(salts))) + b"\0")
    only = None
    if stage.per_source and stage.input and not ctx.registry.get(stage.input).per_source:
        only = layout.data_table(partition)
    read = {
        f"{m.asset}/{m.partition}": content_id(m, only if m.asset == stage.input else None)
        for m in upstream
    }
    h.update(canonical_json(sorted(read.items())))
    return h.hexdigest()[:32]


# per process, a few catalogs as JSON (each parsed catalog is one frozen object, shared by a
# run's steps): dumping a catalog of N sources for each of N sources' versions grew as N^2
_CATALOG_JSON: Kept[int, tuple[Catalog, dict[str, Any], dict[str, Any]]] = Kept(4)


def _catalog_json(catalog: Catalog) -> tuple[dict[str, Any], dict[str, Any]]:
    """The catalog as JSON without its stages (a stage's config is in its code version, with
    those it reads), and each source's entry by id; neither may be changed."""

    def dumped() -> tuple[Catalog, dict[str, Any], dict[str, Any]]:
        whole = catalog.model_dump(mode="json")
        del whole["stages"]
        return catalog, whole, {s["id"]: s for s in whole["sources"]}

    _, whole, entries = _CATALOG_JSON.get(id(catalog), dumped)  # kept: its id stays its own
    return whole, entries


def standing(
    ctx: StageContext, stage: Stage, partition: str | None, inputs: str
) -> Manifest | None:
    """The partition's latest version when it was computed from exactly `inputs` and its
    objects are still the bytes it committed (one that does not verify is computed again,
    and the new version says what it replaced: ShardStore.begin)."""
    if not ctx.reuse:
        return None
    try:
        latest = ctx.store.latest(stage.name, partition)
    except NoVersionError:
        return None
    if latest.extra.get(INPUTS) != inputs:
        return None
    if ctx.store.verify_reused(latest, ctx.host_executor().map_light):
        return None
    return latest


def body_inputs(ctx: StageContext, stage: Stage, partition: str | None) -> str | None:
    """`inputs_id` of a body stage's partition from the latest version of every partition
    of every stage it reads (Registry.reads_of); None while one of them has none. The
    manifests are read one at a time, each dropped once hashed: a corpus-wide stage reads
    every source's version of every per-file stage, and together they hold every shard."""
    salts = [stage.inputs_salt(ctx)] if stage.inputs_salt is not None else []

    def upstream() -> Iterator[Manifest]:
        for name in ctx.registry.reads_of(stage):
            for source in ctx.sources() if ctx.registry.get(name).per_source else [None]:
                yield ctx.store.latest(name, source)

    try:
        return inputs_id(ctx, stage, partition, upstream(), salts)
    except NoVersionError:
        return None
