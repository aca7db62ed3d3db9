"""A catalog validated for a run: parsed against the registry's stage config models (an
unknown stage or field fails naming it), then what its entries point at checked before
any work: removal request files read and every line validated, benchmark files matched
against their pins. core/catalog.py only parses; this layer knows the stages and gates."""

from __future__ import annotations

from pathlib import Path

from megacpp_pipeline.core.catalog import Catalog, CatalogError, read_catalog
from megacpp_pipeline.core.kept import Kept
from megacpp_pipeline.corpus.decontaminate import BenchmarkError, verify_benchmark
from megacpp_pipeline.gates.removals import RemovalError, load_removals
from megacpp_pipeline.pipeline.registry import Registry

_CHECKED: Kept[int, Catalog] = Kept(8)  # catalogs whose files were checked, by identity


def load_catalog(path: str | Path, registry: Registry) -> Catalog:
    """The catalog at `path`, validated against `registry` and its files checked (once per
    parsed catalog: read_catalog hands the same frozen object out while the file is the
    same)."""
    catalog = read_catalog(path, registry.config_models())

    def checked() -> Catalog:  # kept, so that its id is no other catalog's while it is kept
        check_files(catalog, str(path))
        return catalog

    return _CHECKED.get(id(catalog), checked)


def check_files(catalog: Catalog, origin: str) -> None:
    """What the entries point at, before any work: removal request files are read and every
    line validated, benchmark files match their pins."""
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
