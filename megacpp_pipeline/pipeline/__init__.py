"""The stage registry and running stages without Dagster."""
