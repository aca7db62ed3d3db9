"""Windows of n units over C++ text: decides which lexer tokens are words (identifiers,
keywords, literals) and hashes every run of n units, with the punctuation between them, in
one vectorised pass over a batch (polynomial prefix sums, so any n costs one subtraction).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from megacpp_pipeline.corpus import minhash

# The lexer hashes a token from its bytes alone, so each punctuation (or control) byte has
# one fixed hash: a token is a word unless its hash is one of these. A small table indexed
# by some bits of the hash, where the punctuation hashes do not collide, tests every token
# with one gather.
PUNCTUATION = minhash.token_hashes(
    [" ".join(chr(b) for b in range(128) if chr(b) not in " \t\n\v\f\r_" and not chr(b).isalnum())]
).hashes
_TABLE_BITS = 12
_SHIFT = np.uint64(
    next(
        s
        for s in range(64 - _TABLE_BITS)
        if len(np.unique(PUNCTUATION >> np.uint64(s) & np.uint64((1 << _TABLE_BITS) - 1)))
        == len(PUNCTUATION)
    )
)
_SLOT = np.uint64((1 << _TABLE_BITS) - 1)
_PUNCT_TABLE = np.zeros(1 << _TABLE_BITS, dtype=np.uint64)
_PUNCT_TABLE[(PUNCTUATION >> _SHIFT & _SLOT).astype(np.intp)] = PUNCTUATION
_MULT = np.uint64(0x9E3779B97F4A7C15)  # odd: invertible mod 2**64
_MULT_INV = np.uint64(pow(int(_MULT), -1, 1 << 64))


def is_word(hashes: minhash.U64) -> npt.NDArray[np.bool_]:
    return _PUNCT_TABLE[(hashes >> _SHIFT & _SLOT).astype(np.intp)] != hashes


def _powers(base: np.uint64, n: int) -> minhash.U64:
    out = np.empty(max(n, 1), dtype=np.uint64)
    out[0] = 1
    with np.errstate(over="ignore"):
        out[1:] = base
        np.cumprod(out, out=out)
    return out


@dataclass(frozen=True)
class Windows:
    """Runs of m units inside one file: hash, file, and the lexer tokens they span."""

    hashes: minhash.U64
    file: minhash.I64
    first: minhash.I64  # first lexer token, counted from the start of the batch
    count: minhash.I64  # lexer tokens spanned (m in token mode)


class LexedBatch:
    """A batch of texts lexed once, ready to hash windows of any length: the units (every
    token, or the words only), their files, and prefix sums of the polynomial hash."""

    def __init__(self, texts: Sequence[str], unit: str) -> None:
        self.tokens = minhash.token_hashes(texts)
        t = self.tokens.hashes
        self.units = np.flatnonzero(is_word(t)) if unit == "word" else np.arange(len(t))
        self.file_of = np.searchsorted(self.tokens.offsets, self.units, side="right") - 1
        n = len(t)
        with np.errstate(over="ignore"):
            self.prefix = np.zeros(n + 1, dtype=np.uint64)
            np.cumsum(t * _powers(_MULT, n), out=self.prefix[1:])
        self.inverse = _powers(_MULT_INV, n)

    def units_per_file(self) -> minhash.I64:
        return np.bincount(self.file_of, minlength=len(self.tokens.offsets) - 1)

    def hashes(self, m: int) -> minhash.U64:
        """The hash of the window of m units starting at each unit, over all the lexer
        tokens it spans (so punctuation between words counts for equality but not for the
        length); windows that run into the next file are hashed too, and dropped by
        `windows` or by the caller once they hit."""
        lo = self.units[: max(len(self.units) - m + 1, 0)]
        hi = self.units[m - 1 :] + 1
        with np.errstate(over="ignore"):
            return (self.prefix[hi] - self.prefix[lo]) * self.inverse[lo]

    def windows(self, m: int, at: minhash.I64 | None = None) -> Windows:
        """The windows of m units that stay in one file (of those starting at units `at`)."""
        k = np.arange(max(len(self.units) - m + 1, 0)) if at is None else at
        k = k[self.file_of[k] == self.file_of[k + m - 1]]
        lo, hi = self.units[k], self.units[k + m - 1] + 1
        with np.errstate(over="ignore"):
            h = (self.prefix[hi] - self.prefix[lo]) * self.inverse[lo]
        return Windows(h, self.file_of[k], lo, hi - lo)
