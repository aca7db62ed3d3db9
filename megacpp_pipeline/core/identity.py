"""A file's identity as a number: order-free sums of two 64-bit hashes of (source, path).
Equal sums over two lists of files mean the same files the same number of times (but by
chance, about 2^-128), so tasks that each see a part of a table can prove it holds the same
files as another without any of them holding either whole."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import xxhash

MASK64 = (1 << 64) - 1
_SEEDS = (0, 0x9E3779B97F4A7C15)  # two independent 64-bit hashes of a file's identity

Sums = tuple[int, int]
NONE: Sums = (0, 0)


def identity_sums(sources: Sequence[str], paths: Sequence[str]) -> Sums:
    """The sums over the files (sources[i], paths[i])."""
    keys = [
        f"{s}\0{p}".encode("utf-8", "surrogatepass") for s, p in zip(sources, paths, strict=True)
    ]
    a, b = (sum(xxhash.xxh3_64_intdigest(k, seed=seed) for k in keys) & MASK64 for seed in _SEEDS)
    return a, b


def added(parts: Iterable[Sums]) -> Sums:
    """The sums of several parts: the sums over all their files together."""
    a, b = NONE
    for x, y in parts:
        a, b = (a + x) & MASK64, (b + y) & MASK64
    return a, b
