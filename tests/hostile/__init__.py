"""Hostile inputs for the pipeline, generated at test time (nothing stored as binaries)."""
