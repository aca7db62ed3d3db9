"""Scaled-up copies of the demo corpus for the end-to-end benchmark: the C++ files of the
three demo wheels, then k-1 copies of them with seeded token-level mutations, written as
`dir` sources in a catalog of their own.

A mutated copy renames about `rate` of the identifiers in code, one occurrence at a time
(never inside comments, string literals, numbers or `#include` lines, never a C++ keyword or
directive). At the default 0.3 a copy is typically 0.4-0.7 Jaccard-similar to its original on
5-token shingles: no exact duplicate, below the dedup threshold, so dedup does real work on every
copy and every later stage sees the corpus grow; licence notices and SPDX lines stay intact.

    .venv/bin/python -m bench.scaleup --scale 4 --out /tmp/scaled   # writes sources.yaml
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import zipfile
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parent.parent
WHEELS_DIR = REPO / ".cache" / "wheels"
DEMO = (("pythran", "0.19.0"), ("pybind11", "3.1.0"), ("nanobind", "3.1.0"))
DECLARED_LICENSE = "BSD-3-Clause"  # as examples/demo/sources.yaml declares for all three
CPP_SUFFIXES = (".h", ".hpp", ".cc", ".cpp", ".cxx", ".hh", ".hxx", ".ipp", ".inl")
MUTATION_VERSION = "v2"  # bump when _mutate changes, so cached copies are rebuilt

_KEYWORDS = """alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t
    char16_t char32_t class compl concept const consteval constexpr constinit const_cast
    continue co_await co_return co_yield decltype default delete do double dynamic_cast else
    enum explicit export extern false float for friend goto if inline int long mutable
    namespace new noexcept not not_eq nullptr operator or or_eq private protected public
    register reinterpret_cast requires return short signed sizeof static static_assert
    static_cast struct switch template this thread_local throw true try typedef typeid
    typename union unsigned using virtual void volatile wchar_t while xor xor_eq override final
    defined std size_t int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t uint64_t"""
CPP_KEYWORDS = frozenset(_KEYWORDS.split())
# One left-to-right pass: comments, literals, numbers, `#include` lines and directive names
# are matched (and kept as they are) before an identifier can match inside them.
_TOKEN = re.compile(
    r"(?P<keep>//[^\n]*|/\*.*?\*/|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'"
    r"|\d[\w.']*|\#[ \t]*(?:include|import|include_next)\b[^\n]*|\#[ \t]*[a-z]+)"
    r"|(?P<ident>[A-Za-z_][A-Za-z0-9_]*)",
    re.DOTALL,
)
_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"


def mutate(text: str, rng: random.Random, rate: float) -> str:
    """`text` with about `rate` of its code identifiers renamed, occurrence by occurrence.

    One `re.split` pass (C speed) yields [between, keep, ident, between, keep, ident, ...];
    the random choices for all identifiers are drawn at once with numpy, seeded from `rng`.
    """
    parts = _TOKEN.split(text)
    idents = parts[2::3]
    if not idents:
        return text
    draws = np.random.default_rng(rng.getrandbits(64))
    renamed = draws.random(len(idents)) < rate
    suffixes = draws.integers(0, len(_ALPHABET), size=(len(idents), 2))
    for i in np.flatnonzero(renamed).tolist():
        word = idents[i]
        if word is not None and word not in CPP_KEYWORDS:
            a, b = suffixes[i]
            parts[2 + 3 * i] = f"{word}_{_ALPHABET[a]}{_ALPHABET[b]}"
    return "".join(filter(None, parts))


@dataclass(frozen=True)
class ScaledCorpus:
    catalog: Path  # sources.yaml with one dir source per demo wheel
    scale: int
    files: int
    bytes: int  # raw C++ bytes in (all copies)


def unpack_demo(wheels: Path, into: Path) -> dict[str, Path]:
    """The demo wheels unzipped whole under into/<name>/ (once), as the per-stage scripts
    expect them for --wheels; name -> root."""
    roots = {}
    for name, version in DEMO:
        root, done = into / name, into / f".{name}.complete"
        roots[name] = root
        if done.exists():
            continue
        wheel = next(wheels.glob(f"{name}-{version}-*.whl"), None)
        if wheel is None:
            raise FileNotFoundError(f"{name}=={version} wheel not in {wheels}: run `make bench`")
        shutil.rmtree(root, ignore_errors=True)
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(root)
        done.touch()
    return roots


def cpp_files(root: Path) -> Iterator[Path]:
    for path in sorted(root.rglob("*")):
        if path.suffix in CPP_SUFFIXES and path.is_file() and not path.is_symlink():
            yield path


def _write_copy(args: tuple[Path, Path, int, int, float]) -> None:
    source_root, target, copy, seed, rate = args
    for path in cpp_files(source_root):
        rel = path.relative_to(source_root).as_posix()
        out = target / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        raw = path.read_bytes()
        if copy:
            rng = random.Random(f"{seed}:{copy}:{source_root.name}:{rel}")
            text = raw.decode("utf-8", "surrogateescape")
            raw = mutate(text, rng, rate).encode("utf-8", "surrogateescape")
        out.write_bytes(raw)
    (target.parent / f".{target.name}.complete").touch()


def build(
    scale: int, work: Path, *, wheels: Path = WHEELS_DIR, seed: int = 0, rate: float = 0.3
) -> ScaledCorpus:
    """The demo at `scale`x under work/: copies are cached (copy j depends only on seed, rate
    and j), and each scale's sources hard-link them as <source>/copy-NN/<path>."""
    roots = unpack_demo(wheels, work / "wheels")
    copies_dir = work / f"copies-{MUTATION_VERSION}-seed{seed}-rate{rate}"
    todo = [
        (roots[name], copies_dir / f"copy-{copy:02d}" / name, copy, seed, rate)
        for copy in range(scale)
        for name, _ in DEMO
        if not (copies_dir / f"copy-{copy:02d}" / f".{name}.complete").exists()
    ]
    if todo:
        with ProcessPoolExecutor(max_workers=len(os.sched_getaffinity(0))) as pool:
            list(pool.map(_write_copy, todo))

    scale_dir = work / f"scale-{scale}x"
    shutil.rmtree(scale_dir, ignore_errors=True)
    files = size = 0
    sources = []
    for name, _ in DEMO:
        source_root = scale_dir / name
        for copy in range(scale):
            origin = copies_dir / f"copy-{copy:02d}" / name
            for path in cpp_files(origin):
                out = source_root / f"copy-{copy:02d}" / path.relative_to(origin)
                out.parent.mkdir(parents=True, exist_ok=True)
                os.link(path, out)
                files += 1
                size += path.stat().st_size
        sources.append(
            {
                "id": name,
                "kind": "dir",
                "uri": str(source_root),
                "declared_license": DECLARED_LICENSE,
                "role": "operational",
            }
        )
    catalog = scale_dir / "sources.yaml"
    catalog.write_text(
        yaml.safe_dump(
            {"snapshot": f"bench-{scale}x", "seq_len": 2048, "sources": sources}, sort_keys=False
        )
    )
    return ScaledCorpus(catalog=catalog, scale=scale, files=files, bytes=size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scale", type=int, default=1)
    parser.add_argument("--out", type=Path, default=REPO / ".cache" / "bench")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rate", type=float, default=0.3)
    args = parser.parse_args()
    corpus = build(args.scale, args.out, seed=args.seed, rate=args.rate)
    print(f"{corpus.files} files, {corpus.bytes / 1e6:.1f} MB -> {corpus.catalog}")


if __name__ == "__main__":
    main()
