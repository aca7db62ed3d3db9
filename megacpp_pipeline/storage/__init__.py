"""Where stage outputs live: versioned shard folders and the per-file result cache."""
