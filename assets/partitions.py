"""One partition per operational source, read from the catalog when definitions load."""

import dagster as dg

from megacpp_pipeline.core.catalog import load_catalog
from resources.pipeline import config_path


def source_partitions() -> dg.StaticPartitionsDefinition:
    catalog = load_catalog(config_path())
    return dg.StaticPartitionsDefinition([s.id for s in catalog.operational])


SOURCES = source_partitions()
