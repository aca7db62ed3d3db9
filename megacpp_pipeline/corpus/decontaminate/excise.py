"""Excision: decides which bytes of a contaminated file to cut (each matched window plus a
margin, widened to whole lines) and when the file must be dropped instead (more cuts than
allowed, nothing left, or still matching). NeMo Curator's rule: 200 characters, 10 splits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from megacpp_pipeline.corpus import minhash
from megacpp_pipeline.corpus.decontaminate.config import DecontaminateConfig
from megacpp_pipeline.corpus.decontaminate.index import BenchmarkIndex, Contamination


@dataclass(frozen=True)
class Cut:
    text: str
    spans: int
    bytes: int


def _blanked(text: str) -> bytes:
    """The text's UTF-8 with comments blanked to spaces of the same length (so offsets stay
    those of the text and tokens those of the lexer), ending with a newline."""
    data = bytearray(text.encode("utf-8"))
    # minhash's comment pattern and block lexer, which are private there
    for m in minhash._COMMENT.finditer(bytes(data)):
        data[m.start() : m.end()] = b" " * (m.end() - m.start())
    return bytes(data + b"\n")


def token_offsets(text: str) -> tuple[minhash.U64, minhash.I64]:
    """The token hashes of minhash.token_hashes([text]) and the byte offset in the text's
    UTF-8 where each token starts."""
    return minhash._hash_token_block(_blanked(text))


def excise(
    text: str, matches: Sequence[Contamination], config: DecontaminateConfig, index: BenchmarkIndex
) -> Cut | None:
    """The text with every matched window cut, plus the margin, widened to whole lines; None
    when the file should be dropped instead (too many cuts, nothing left, still matching)."""
    data = text.encode("utf-8")
    blanked = _blanked(text)
    _, starts = minhash._hash_token_block(blanked)
    nexts = [*starts[1:].tolist(), len(data)]
    ranges = []
    for c in matches:
        for first, count in c.token_spans:
            last = first + count - 1
            # a token ends where the whitespace (or blanked comment) before the next begins
            end = int(starts[last]) + len(blanked[starts[last] : nexts[last]].rstrip())
            lo = max(int(starts[first]) - config.excise_margin, 0)
            hi = min(end + config.excise_margin, len(data))
            lo = data.rfind(b"\n", 0, lo) + 1
            nl = data.find(b"\n", hi)
            hi = len(data) if nl < 0 else nl + 1
            ranges.append((lo, hi))
    ranges.sort()
    merged: list[list[int]] = []
    for lo, hi in ranges:
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    if len(merged) > config.max_excisions:
        return None
    parts, at = [], 0
    for lo, hi in merged:
        parts.append(data[at:lo])
        at = hi
    parts.append(data[at:])
    out = b"".join(parts).decode("utf-8")
    if not out.strip() or index.match([out]):
        return None
    return Cut(out, len(merged), len(data) - len(out.encode("utf-8")))
