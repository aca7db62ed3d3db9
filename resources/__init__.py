"""Dagster resources: the shard store and the source catalog, configured from the
environment so that `dagster dev`, the CLI and the tests point at the same places."""

from resources.pipeline import CatalogResource, ShardStoreResource, default_resources

__all__ = ["CatalogResource", "ShardStoreResource", "default_resources"]
