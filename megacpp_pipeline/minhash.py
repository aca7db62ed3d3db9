"""MinHash signatures of C++ files, computed over whole batches with numpy.

Decides what a file's near-duplicate fingerprint is: shingles of C++ lexical tokens with
comments and whitespace dropped (seed: a re-indented or re-licensed copy is still a copy).
No shingle ever exists as a Python string: token bytes are hashed once with a polynomial
hash computed from one prefix sum per batch, k tokens fold into a 64-bit shingle hash with
array arithmetic, and signing runs over all shingles of a batch at once.

Two signing schemes, both 64-bit:
- ``one_permutation_signatures`` (the gate's default): one hash per shingle picks a bin and
  each bin keeps its minimum, empty bins densified; O(shingles) work.
- ``signatures``: num_perm true permutations, datasketch 2.0's ``affine64`` scheme bit for
  bit (MurmurHash3 64-bit finalizer pre-mix, then ``a_k * h + b_k mod 2**64`` with ``a_k``
  odd, parameters drawn as datasketch draws them from ``np.random.RandomState(seed)``), so
  it equals ``datasketch.MinHash(num_perm, seed, scheme="affine64")`` fed the same shingle
  hashes; O(shingles x num_perm) work.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]

PERMUTATION_SCHEME = "affine64"  # datasketch 2.0 name of the family implemented here
EMPTY_HASH = np.uint64(0xFFFFFFFFFFFFFFFF)  # signature value of a file with no shingle

# Comments go, replaced by a space so `a/**/b` stays two tokens. A pattern that also
# steps over string literals runs at about 15 MB/s in `re` (it must try three start bytes
# everywhere); this one has the literal prefix `/` and runs at about 250 MB/s. The price:
# `//` or `/*` inside a string literal starts a comment here. Every copy of a file is lexed
# alike, so that costs a few tokens of evidence; an unterminated `/*` is left as tokens so it
# can never swallow the rest of a file.
_COMMENT = re.compile(rb"//[^\n]*|/\*.*?\*/", re.S)

# Byte classes: whitespace (dropped); identifier/number bytes, whose runs form one token
# (bytes >= 0x80 count as identifier so UTF-8 names stay whole); punctuation, where each
# byte is a token (`->` is two tokens in every file alike, which is all shingling needs).

_POLY = 0x100000001B3  # FNV-64 prime: odd, so it has an inverse mod 2**64
_POLY_INV = pow(_POLY, -1, 1 << 64)
_SHINGLE_MULT = np.uint64(0x9E3779B97F4A7C15)  # golden-ratio odd constant folding tokens

# Bytes of stripped text hashed per polynomial pass: bounds the power tables and prefix
# sums to a few arrays of 8 bytes x this (16 MB each), whatever the shard size.
TOKEN_BATCH_BYTES = 2 << 20
# Shingles per permutation block: num_perm x block uint64 stays near the L2 cache.
PERMUTATION_BLOCK = 2048


def fmix64(values: U64) -> U64:
    """MurmurHash3's 64-bit finalizer, a bijection that avalanches every input bit."""
    with np.errstate(over="ignore"):
        h = values ^ (values >> np.uint64(33))
        h *= np.uint64(0xFF51AFD7ED558CCD)
        h ^= h >> np.uint64(33)
        h *= np.uint64(0xC4CEB9FE1A85EC53)
        h ^= h >> np.uint64(33)
    return h


def strip_comments(text: bytes) -> bytes:
    """The text with // and /* */ comments replaced by one space."""
    return _COMMENT.sub(b" ", text)


@dataclass
class TokenHashes:
    """Per-token 64-bit hashes of a batch of files, CSR-style: file i owns
    ``hashes[offsets[i]:offsets[i + 1]]``."""

    hashes: U64
    offsets: I64


class _PowerTable:
    """POLY**j and POLY**-j mod 2**64 for j < capacity, grown on demand and reused."""

    def __init__(self) -> None:
        self.pow: U64 = np.ones(1, dtype=np.uint64)
        self.inv: U64 = np.ones(1, dtype=np.uint64)

    def ensure(self, n: int) -> None:
        if len(self.pow) >= n:
            return
        # One allocation covers every ordinary batch; only a single file larger than a batch
        # needs (exactly) more.
        size = max(n, TOKEN_BATCH_BYTES + 1)
        ramp_pow = np.full(size, _POLY, dtype=np.uint64)
        ramp_pow[0] = 1
        ramp_inv = np.full(size, _POLY_INV, dtype=np.uint64)
        ramp_inv[0] = 1
        with np.errstate(over="ignore"):
            self.pow = np.cumprod(ramp_pow, dtype=np.uint64)
            self.inv = np.cumprod(ramp_inv, dtype=np.uint64)


_POWERS = _PowerTable()


def _hash_token_buffer(buf: npt.NDArray[np.uint8]) -> tuple[U64, I64]:
    """Hashes and start offsets of the tokens in one byte buffer (files joined by '\\n')."""
    # Byte classes by comparison (a 256-entry lookup costs more than these passes).
    word = (buf | np.uint8(0x20)) - np.uint8(ord("a")) < 26
    word |= buf - np.uint8(ord("0")) < 10
    word |= buf == ord("_")
    word |= buf >= 0x80
    space = buf - np.uint8(9) < 5  # \t \n \v \f \r
    space |= buf == ord(" ")
    # A token starts at every punctuation byte and at the first byte of a word run; the
    # buffer ends with '\n', so every word run ends inside it.
    start = ~(word | space)
    start[0] |= word[0]
    start[1:] |= word[1:] > word[:-1]
    starts = np.flatnonzero(start)
    # Polynomial hash of a token's bytes from one prefix sum: sum_j buf[j] * POLY**(j - s).
    # Whitespace weighs zero, so a token's sum runs from its start to the next token's
    # start (or the end of the buffer) and token ends are never needed.
    n = len(buf)
    _POWERS.ensure(n)
    with np.errstate(over="ignore"):
        prefix = np.empty(n + 1, dtype=np.uint64)
        prefix[0] = 0
        np.multiply(buf * ~space, _POWERS.pow[:n], out=prefix[1:], dtype=np.uint64)
        np.cumsum(prefix[1:], out=prefix[1:])
        at_starts = prefix[np.append(starts, n)]
        poly = np.diff(at_starts)
        poly *= _POWERS.inv[starts]
    return fmix64(poly), starts


def token_hashes(texts: Sequence[str] | Sequence[bytes]) -> TokenHashes:
    """64-bit hashes of the C++ lexical tokens of each text, comments and whitespace dropped."""
    stripped = [strip_comments(t.encode("utf-8") if isinstance(t, str) else t) for t in texts]
    all_hashes: list[U64] = []
    counts = np.zeros(len(stripped), dtype=np.int64)
    i = 0
    while i < len(stripped):
        # Group files into one buffer of about TOKEN_BATCH_BYTES; '\n' keeps them apart.
        j, size = i, 0
        while j < len(stripped) and (j == i or size + len(stripped[j]) < TOKEN_BATCH_BYTES):
            size += len(stripped[j]) + 1
            j += 1
        group = stripped[i:j]
        buf = np.frombuffer(b"\n".join(group) + b"\n", dtype=np.uint8)
        hashes, starts = _hash_token_buffer(buf)
        file_starts = np.zeros(len(group), dtype=np.int64)
        np.cumsum([len(g) + 1 for g in group[:-1]], out=file_starts[1:])
        bounds = np.searchsorted(starts, np.append(file_starts, len(buf)))
        counts[i:j] = np.diff(bounds)
        all_hashes.append(hashes)
        i = j
    offsets = np.zeros(len(stripped) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    hashes = np.concatenate(all_hashes) if all_hashes else np.empty(0, dtype=np.uint64)
    return TokenHashes(hashes=hashes, offsets=offsets)


def shingle_hashes(tokens: TokenHashes, k: int) -> TokenHashes:
    """64-bit hashes of every run of k consecutive tokens inside one file (CSR like tokens).

    A file with fewer than k tokens has no shingle; its signature stays empty."""
    t = tokens.hashes
    n_files = len(tokens.offsets) - 1
    n = len(t) - k + 1
    if n <= 0:
        return TokenHashes(np.empty(0, np.uint64), np.zeros(n_files + 1, np.int64))
    with np.errstate(over="ignore"):
        folded = t[:n].copy()
        for j in range(1, k):
            folded *= _SHINGLE_MULT
            folded += t[j : n + j]
    folded = fmix64(folded)
    # A window is valid when its last token belongs to the same file as its first.
    per_file = np.diff(tokens.offsets)
    file_of_token = np.repeat(np.arange(n_files, dtype=np.int64), per_file)
    valid = file_of_token[:n] == file_of_token[k - 1 :]
    counts = np.maximum(per_file - (k - 1), 0)
    offsets = np.zeros(n_files + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return TokenHashes(hashes=folded[valid], offsets=offsets)


def permutations(num_perm: int, seed: int) -> tuple[U64, U64]:
    """(a, b) of datasketch 2.0's affine64 scheme for this seed (a odd: a bijection)."""
    gen = np.random.RandomState(seed)
    a = gen.randint(0, 1 << 63, num_perm, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    b = gen.randint(0, 1 << 64, num_perm, dtype=np.uint64)
    return a, b


def signatures(shingles: TokenHashes, a: U64, b: U64) -> U64:
    """MinHash signature per file, shape (files, num_perm); EMPTY_HASH rows have no shingle.

    Shingles are processed in blocks of PERMUTATION_BLOCK: one (num_perm x block) matrix
    product, a segmented min per file inside the block, and a min into the running
    signature for files that straddle blocks."""
    n_files = len(shingles.offsets) - 1
    num_perm = len(a)
    sig = np.full((n_files, num_perm), EMPTY_HASH, dtype=np.uint64)
    h = fmix64(shingles.hashes)
    total = len(h)
    if total == 0:
        return sig
    file_of_shingle = np.repeat(np.arange(n_files, dtype=np.int64), np.diff(shingles.offsets))
    a_col = a[:, None]
    b_col = b[:, None]
    work = np.empty((num_perm, PERMUTATION_BLOCK), dtype=np.uint64)
    for start in range(0, total, PERMUTATION_BLOCK):
        stop = min(start + PERMUTATION_BLOCK, total)
        block = work[:, : stop - start]
        with np.errstate(over="ignore"):
            np.multiply(a_col, h[None, start:stop], out=block)
            np.add(block, b_col, out=block)
        files = file_of_shingle[start:stop]
        seg = np.flatnonzero(np.diff(files, prepend=-1))
        mins = np.minimum.reduceat(block, seg, axis=1).T
        ids = files[seg]
        sig[ids] = np.minimum(sig[ids], mins)
    return sig


def estimated_jaccard(sig_a: U64, sig_b: U64) -> npt.NDArray[np.float32]:
    """Share of equal signature slots, row by row (the MinHash Jaccard estimate)."""
    return np.mean(sig_a == sig_b, axis=-1, dtype=np.float32)


def jaccard(shingles_a: U64, shingles_b: U64) -> float:
    """True Jaccard of two files' shingle sets."""
    sa, sb = np.unique(shingles_a), np.unique(shingles_b)
    if len(sa) == 0 and len(sb) == 0:
        return 1.0
    inter = len(np.intersect1d(sa, sb, assume_unique=True))
    return inter / (len(sa) + len(sb) - inter)


def one_permutation_signatures(shingles: TokenHashes, num_bins: int, seed: int) -> U64:
    """One-permutation MinHash with optimal densification, shape (files, num_bins).

    One seeded 64-bit hash per shingle; its top bits pick a bin and the file keeps the
    smallest hash per bin (Li, Owen & Zhang 2012): O(shingles) work instead of
    O(shingles x permutations). A bin no shingle fell into borrows the value of the first
    non-empty bin along a seeded probe sequence shared by all files (Shrivastava 2017,
    "optimal densification"), which keeps P[bin j agrees] = Jaccard for every j, so bands of
    bins form an LSH exactly as permutations do. Files with fewer shingles than bins borrow
    more, so their band collisions are more correlated than with true permutations."""
    n_files = len(shingles.offsets) - 1
    sig = np.full((n_files, num_bins), EMPTY_HASH, dtype=np.uint64)
    if len(shingles.hashes) == 0:
        return sig
    # Shingle hashes leave shingle_hashes already avalanched by fmix64, so the seed only
    # needs a bijection on top: XOR with a mixed seed reorders bins and values alike.
    seed_mix = fmix64(np.array([seed + 0x5BD1E995], dtype=np.uint64))[0]
    h = shingles.hashes ^ seed_mix
    # The top 32 bits scaled to [0, num_bins) pick the bin; the whole hash is the value.
    bins = ((h >> np.uint64(32)) * np.uint64(num_bins)) >> np.uint64(32)
    file_of_shingle = np.repeat(np.arange(n_files, dtype=np.int64), np.diff(shingles.offsets))
    cells = file_of_shingle * num_bins + bins.astype(np.int64)
    np.minimum.at(sig.reshape(-1), cells, h)
    return _densify(sig, seed)


_PROBES = 4  # seeded probe rounds before the rightward scan (see _densify)


def _densify(sig: U64, seed: int) -> U64:
    """Fill empty bins: each empty bin j looks at a fixed sequence of bins, the same for
    every file (a few seeded random probes, then j+1, j+2, ... circularly), and copies the
    first non-empty one. Any fixed sequence keeps P[files agree on bin j] = Jaccard: the
    first bin of the sequence that is non-empty in the union decides, and a value copied
    from another bin can never equal one native to bin j (the hash picks its bin). The
    random probes spread the borrowing (lower variance than a pure rotation); the scan
    ends it in a bounded number of array passes."""
    num_bins = sig.shape[1]
    filled = sig != EMPTY_HASH
    has_any = filled.any(axis=1)
    cells = np.flatnonzero(~filled & has_any[:, None])  # flat (file, bin) indices to fill
    if len(cells) == 0:
        return sig
    rows, cols = np.divmod(cells, num_bins)
    base = rows * num_bins
    probes = np.random.RandomState(seed ^ 0x0D15EA5E).randint(0, num_bins, (_PROBES, num_bins))
    flat_filled = filled.reshape(-1)
    source = np.full(len(cells), -1, dtype=np.int64)
    for attempt in range(_PROBES):
        candidate = base + probes[attempt, cols]
        source = np.where((source < 0) & flat_filled[candidate], candidate, source)
    # Next non-empty bin to the right, circularly: a reversed running minimum over the bin
    # indices of non-empty bins, on each row written twice.
    left = np.flatnonzero(source < 0)
    if len(left):
        todo, where = np.unique(rows[left], return_inverse=True)
        marks = np.where(filled[todo], np.arange(num_bins), 2 * num_bins)
        twice = np.concatenate([marks, marks + num_bins], axis=1)
        nxt = np.minimum.accumulate(twice[:, ::-1], axis=1)[:, ::-1][:, :num_bins] % num_bins
        source[left] = base[left] + nxt[where, cols[left]]
    out = sig.copy()
    out.reshape(-1)[cells] = sig.reshape(-1)[source]
    return out


def token_sequence_keys(tokens: TokenHashes) -> npt.NDArray[np.uint64]:
    """A 128-bit key per file from its token sequence, shape (files, 2): equal for files
    whose tokens are equal once comments and whitespace are gone.

    Each token is mixed with its position in the file before a per-file sum, so order
    counts; two independent mixes give 128 bits."""
    n_files = len(tokens.offsets) - 1
    keys = np.zeros((n_files, 2), dtype=np.uint64)
    if len(tokens.hashes) == 0:
        return keys
    per_file = np.diff(tokens.offsets)
    file_of_token = np.repeat(np.arange(n_files, dtype=np.int64), per_file)
    position = (
        np.arange(len(tokens.hashes), dtype=np.int64) - tokens.offsets[file_of_token]
    ).astype(np.uint64)
    with np.errstate(over="ignore"):
        low = fmix64(tokens.hashes ^ (position * _SHINGLE_MULT))
        high = fmix64(tokens.hashes + fmix64(position + np.uint64(0x2545F4914F6CDD1D)))
    nonempty = per_file > 0
    starts = tokens.offsets[:-1][nonempty]
    keys[nonempty, 0] = np.add.reduceat(low, starts)
    keys[nonempty, 1] = np.add.reduceat(high, starts)
    keys[:, 0] ^= per_file.astype(np.uint64)
    return keys


def band_hashes(sig: U64, bands: int, rows: int) -> U64:
    """One 64-bit hash per (file, band) of the band's `rows` signature slots, shape
    (files, bands); equal slots give equal band hashes, which is the LSH bucket key."""
    n_files = sig.shape[0]
    cut = sig[:, : bands * rows].reshape(n_files, bands, rows)
    with np.errstate(over="ignore"):
        acc = np.zeros((n_files, bands), dtype=np.uint64)
        for r in range(rows):
            acc = fmix64(acc * _SHINGLE_MULT + cut[:, :, r])
    return acc
