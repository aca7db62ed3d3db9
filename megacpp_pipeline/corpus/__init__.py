"""The corpus-wide stages: dedup across sources, the tokenizer, packing."""
