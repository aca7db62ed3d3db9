"""Dagster resources and instance parts: the pipeline resource every generated asset uses
(catalog, store, cache), and the local instance's event log storage."""
