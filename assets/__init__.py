"""The Dagster shell: one module per gate, each an asset plus its blocking checks."""
