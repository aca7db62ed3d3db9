"""The per-file gates: each decides every file of one source on its own."""
