"""MinHash signatures of C++ files, computed over whole batches with numpy.

Decides what a file's near-duplicate fingerprint is: shingles of C++ lexical tokens with
comments and whitespace dropped (seed: a re-indented or re-licensed copy is still a copy).
No shingle ever exists as a Python string: token bytes are hashed once with a polynomial
hash computed from one prefix sum per block of text, k tokens fold into a 64-bit shingle hash
with array arithmetic, and signing runs over all shingles of a batch at once, chunk by chunk
so that each array pass stays in the CPU cache.

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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]

PERMUTATION_SCHEME = "affine64"  # datasketch 2.0 name of the family implemented here
EMPTY_HASH = np.uint64(0xFFFFFFFFFFFFFFFF)  # signature value of a file with no shingle

# Comments go, replaced by a space so `a/**/b` stays two tokens. A pattern that also
# steps over string literals runs at about 15 MB/s in `re` (it must try three start bytes
# everywhere); this one opens with the literal `/` and its possessive loops never backtrack
# (the classic "up to the first */" form), so it runs at several hundred MB/s. The price:
# `//` or `/*` inside a string literal starts a comment here. Every copy of a file is lexed
# alike, so that costs a few tokens of evidence; an unterminated `/*` is left as tokens so it
# can never swallow the rest of a file.
_COMMENT = re.compile(rb"/(?:/[^\n]*+|\*[^*]*+\*++(?:[^/*][^*]*+\*++)*+/)")

# Byte classes: whitespace (dropped); identifier/number bytes, whose runs form one token
# (bytes >= 0x80 count as identifier so UTF-8 names stay whole); punctuation, where each
# byte is a token (`->` is two tokens in every file alike, which is all shingling needs).
# As a bytes.translate table: one C pass per block gives every byte's class.
_SPACE, _WORD, _PUNCT = 0, 1, 2
_BYTE_CLASS = bytes(
    _SPACE
    if b in b" \t\n\v\f\r"
    else _WORD
    if b >= 0x80 or b == ord("_") or chr(b).isalnum()
    else _PUNCT
    for b in range(256)
)

_POLY = 0x100000001B3  # FNV-64 prime: odd, so it has an inverse mod 2**64
_POLY_INV = pow(_POLY, -1, 1 << 64)
_SHINGLE_MULT = np.uint64(0x9E3779B97F4A7C15)  # golden-ratio odd constant folding tokens

# Text per slice of the dedup gate (dedup._slices): bounds the gate's working memory.
TOKEN_BATCH_BYTES = 2 << 20
# Bytes per tokenizing block, cut after a newline (tokens never span one): small enough that
# a block's per-byte arrays stay in the L2 cache, large enough that numpy's per-call
# overhead stays small. Blocks change nothing but speed: every token is hashed alone.
TOKEN_BLOCK_BYTES = 64 << 10
# Array elements per cache-sized chunk of the per-token and per-shingle passes.
CHUNK = 32 << 10
# Shingles per permutation block: num_perm x block uint64 stays near the L2 cache.
PERMUTATION_BLOCK = 2048


def fmix64(values: U64) -> U64:
    """MurmurHash3's 64-bit finalizer, a bijection that avalanches every input bit."""
    return _fmix64_inplace(values.copy(), np.empty_like(values))


def _fmix64_inplace(h: U64, scratch: U64) -> U64:
    """fmix64 of h, written over h (scratch: any uint64 array of h's length)."""
    with np.errstate(over="ignore"):
        np.right_shift(h, np.uint64(33), out=scratch)
        h ^= scratch
        h *= np.uint64(0xFF51AFD7ED558CCD)
        np.right_shift(h, np.uint64(33), out=scratch)
        h ^= scratch
        h *= np.uint64(0xC4CEB9FE1A85EC53)
        np.right_shift(h, np.uint64(33), out=scratch)
        h ^= scratch
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
        # Twice a block covers every ordinary block; only a block stretched by a very long
        # line (blocks end at a newline) needs (exactly) more.
        size = max(n, 2 * TOKEN_BLOCK_BYTES + 1)
        ramp_pow = np.full(size, _POLY, dtype=np.uint64)
        ramp_pow[0] = 1
        ramp_inv = np.full(size, _POLY_INV, dtype=np.uint64)
        ramp_inv[0] = 1
        with np.errstate(over="ignore"):
            self.pow = np.cumprod(ramp_pow, dtype=np.uint64)
            self.inv = np.cumprod(ramp_inv, dtype=np.uint64)


_POWERS = _PowerTable()


def _hash_token_block(block: bytes) -> tuple[U64, I64]:
    """Hashes and start offsets of the tokens in one block of text that ends with '\n'."""
    buf = np.frombuffer(block, dtype=np.uint8)
    code = np.frombuffer(block.translate(_BYTE_CLASS), dtype=np.uint8)
    # A token starts at every punctuation byte and at the first byte of a word run; the
    # block ends with '\n', so every word run ends inside it.
    word = code == _WORD
    start = code == _PUNCT
    start[0] |= word[0]
    start[1:] |= word[1:] > word[:-1]
    starts = np.flatnonzero(start)
    count = len(starts)
    if count == 0:
        return np.empty(0, dtype=np.uint64), starts
    # Polynomial hash of a token's bytes from one prefix sum: sum_j buf[j] * POLY**(j - s).
    # Whitespace weighs zero, so a token's sum runs from its start to the next token's
    # start (or the end of the block) and token ends are never needed.
    n = len(buf)
    _POWERS.ensure(n)
    weights = buf * (code != _SPACE)
    with np.errstate(over="ignore"):
        prefix = np.multiply(weights, _POWERS.pow[:n], dtype=np.uint64)
        np.cumsum(prefix, out=prefix)
        at = prefix[starts[1:] - 1]  # sums up to each next token's start
        poly = np.empty(count, dtype=np.uint64)
        poly[:-1] = at
        poly[-1] = prefix[-1]
        poly[1:] -= at
        inv = np.take(_POWERS.inv, starts)
        poly *= inv
    return _fmix64_inplace(poly, inv), starts


def _blocks(texts: Sequence[str | bytes]) -> Iterator[tuple[bytes, int, list[int]]]:
    """The comment-stripped texts as blocks of about TOKEN_BLOCK_BYTES, each ending with
    '\n': small files joined by '\n', a large one cut after newlines. Yields (block, index of
    the first file that starts in it, where in the block each file that starts in it starts)."""
    group: list[bytes] = []
    offsets: list[int] = []
    size = 0
    first = 0
    for i, text in enumerate(texts):
        data = strip_comments(text.encode("utf-8") if isinstance(text, str) else text)
        if group and size + len(data) >= TOKEN_BLOCK_BYTES:
            yield b"\n".join([*group, b""]), first, offsets
            group, offsets, size = [], [], 0
        if len(data) < TOKEN_BLOCK_BYTES:
            if not group:
                first = i
            group.append(data)
            offsets.append(size)
            size += len(data) + 1
            continue
        lo = 0
        while lo < len(data):
            hi = data.find(b"\n", lo + TOKEN_BLOCK_BYTES - 1) + 1 or len(data)
            yield data[lo:hi] + b"\n", i, [0] if lo == 0 else []
            lo = hi
    if group:
        yield b"\n".join([*group, b""]), first, offsets


def token_hashes(texts: Sequence[str] | Sequence[bytes]) -> TokenHashes:
    """64-bit hashes of the C++ lexical tokens of each text, comments and whitespace dropped."""
    first_token = np.zeros(len(texts) + 1, dtype=np.int64)
    parts: list[U64] = []
    done = 0  # tokens in the blocks before this one
    for block, first, offsets in _blocks(texts):
        hashes, starts = _hash_token_block(block)
        # A file's tokens are those that start at or after its offset in the block.
        first_token[first : first + len(offsets)] = done + np.searchsorted(starts, offsets)
        parts.append(hashes)
        done += len(hashes)
    first_token[-1] = done
    hashes = np.concatenate(parts) if parts else np.empty(0, dtype=np.uint64)
    return TokenHashes(hashes=hashes, offsets=first_token)


def shingle_hashes(tokens: TokenHashes, k: int) -> TokenHashes:
    """64-bit hashes of every run of k consecutive tokens inside one file (CSR like tokens).

    A file with fewer than k tokens has no shingle; its signature stays empty."""
    t = tokens.hashes
    n_files = len(tokens.offsets) - 1
    n = len(t) - k + 1
    per_file = np.diff(tokens.offsets)
    counts = np.maximum(per_file - (k - 1), 0)
    offsets = np.zeros(n_files + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    if n <= 0:
        return TokenHashes(np.empty(0, np.uint64), offsets)
    # A window is valid when its last token belongs to the same file as its first: the
    # k - 1 windows before each inner file boundary are not.
    valid = np.ones(n, dtype=bool)
    if k > 1 and n_files > 1:
        inner = tokens.offsets[1:-1]
        crossing = (inner[:, None] - np.arange(1, k, dtype=np.int64)).ravel()
        valid[crossing[(crossing >= 0) & (crossing < n)]] = False
    out = np.empty(int(offsets[-1]), dtype=np.uint64)
    # Chunk by chunk so the k-fold and the finalizer run in the cache.
    folded = np.empty(min(n, CHUNK), dtype=np.uint64)
    scratch = np.empty_like(folded)
    at = 0
    with np.errstate(over="ignore"):
        for lo in range(0, n, CHUNK):
            hi = min(lo + CHUNK, n)
            f = folded[: hi - lo]
            f[:] = t[lo:hi]
            for j in range(1, k):
                f *= _SHINGLE_MULT
                f += t[lo + j : hi + j]
            _fmix64_inplace(f, scratch[: hi - lo])
            keep = valid[lo:hi]
            kept = int(np.count_nonzero(keep))
            np.compress(keep, f, out=out[at : at + kept])
            at += kept
    return TokenHashes(hashes=out, offsets=offsets)


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
    flat = sig.reshape(-1)
    offsets = shingles.offsets
    total = len(shingles.hashes)
    # The top 32 bits scaled to [0, num_bins) pick the bin; the whole hash is the value.
    # For a power of two that is the top log2(num_bins) bits: one shift, same bins.
    top_bits = num_bins.bit_length() - 1
    one_shift = num_bins == 1 << top_bits and 1 <= top_bits <= 32
    values = np.empty(min(total, CHUNK), dtype=np.uint64)
    cells = np.empty_like(values)
    # Chunk by chunk, so every pass runs in the cache.
    for lo in range(0, total, CHUNK):
        hi = min(lo + CHUNK, total)
        h = np.bitwise_xor(shingles.hashes[lo:hi], seed_mix, out=values[: hi - lo])
        if one_shift:
            c = np.right_shift(h, np.uint64(64 - top_bits), out=cells[: hi - lo])
        else:
            c = np.right_shift(h, np.uint64(32), out=cells[: hi - lo])
            c *= np.uint64(num_bins)
            c >>= np.uint64(32)
        # Plus the flat index of each shingle's file row.
        first = int(np.searchsorted(offsets, lo, side="right")) - 1
        last = int(np.searchsorted(offsets, hi, side="left"))
        edges = np.clip(offsets[first : last + 1], lo, hi)
        in_chunk = edges[1:] - edges[:-1]
        at = c.view(np.int64)
        at += np.repeat(np.arange(first * num_bins, last * num_bins, num_bins), in_chunk)
        np.minimum.at(flat, at, h)
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
    cols = cells % num_bins
    base = cells - cols
    probes = np.random.RandomState(seed ^ 0x0D15EA5E).randint(0, num_bins, (_PROBES, num_bins))
    flat_filled = filled.reshape(-1)
    source = np.full(len(cells), -1, dtype=np.int64)
    # Last probe first, so that of the probes that hit a non-empty bin the first one stays.
    for attempt in reversed(range(_PROBES)):
        candidate = base + probes[attempt][cols]
        np.copyto(source, candidate, where=flat_filled[candidate])
    # The rest take the next non-empty bin to the right, circularly: the first non-empty flat
    # index at or after the cell if it is still in the cell's row, else the row's first.
    left = np.flatnonzero(source < 0)
    if len(left):
        marks = np.where(flat_filled, np.arange(flat_filled.size), flat_filled.size)
        next_filled = np.minimum.accumulate(marks[::-1])[::-1]
        row = base[left]
        right = next_filled[cells[left]]
        source[left] = np.where(right < row + num_bins, right, next_filled[row])
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
