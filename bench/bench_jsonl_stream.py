"""Streaming JSONL -> parquet converter vs the bare libraries, on real C++ headers.

Builds a JSONL corpus of {path, content, license} records from Debian's C++ headers (boost,
libc++, nlohmann-json; whatever is installed), then times in one process:
  converter   jsonl_stream.convert (line parsing, validation, shard reopen+check, fsync, sha256)
  bare_json   json.loads per line + pa.array + pq.write_table per shard (no checks, no fsync)
  pyarrow_json  pyarrow.json.read_json of the whole file + pq.write_table (C++ parser, no
                per-line error reporting: one bad line fails the file)
Usage: .venv/bin/python -m bench.bench_jsonl_stream [--mb 50] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.json as pajson
import pyarrow.parquet as pq

from megacpp_pipeline.collect.jsonl_stream import JSONL_RECORDS, JsonlConverterConfig, convert

HEADER_ROOTS = [
    (Path("/usr/include/boost"), "BSL-1.0"),
    (Path("/usr/lib/llvm-14/include/c++/v1"), "Apache-2.0 WITH LLVM-exception"),
    (Path("/usr/include/nlohmann"), "MIT"),
]


def build_corpus(target: Path, max_bytes: int) -> tuple[int, int]:
    written = rows = 0
    with open(target, "wb") as out:
        for root, license_id in HEADER_ROOTS:
            if not root.is_dir():
                continue
            for path in sorted(p for p in root.rglob("*") if p.is_file()):
                text = path.read_bytes().decode("utf-8", errors="replace")
                record = {"path": str(path.relative_to(root.parent)), "content": text}
                record["license"] = license_id
                line = json.dumps(record, ensure_ascii=False).encode() + b"\n"
                out.write(line)
                written += len(line)
                rows += 1
                if written >= max_bytes:
                    return written, rows
    return written, rows


def bare_json(src: Path, out: Path, rows_per_file: int) -> None:
    out.mkdir()
    batch: list[dict] = []
    index = 0

    def flush() -> None:
        nonlocal index
        table = pa.table(
            {
                "path": pa.array([r["path"] for r in batch], pa.string()),
                "content": pa.array([r["content"] for r in batch], pa.string()),
                "license": pa.array([r.get("license") for r in batch], pa.string()),
                "revision": pa.array([r.get("revision") for r in batch], pa.string()),
                "line_no": pa.array(range(len(batch)), pa.int64()),
            },
            schema=JSONL_RECORDS,
        )
        pq.write_table(table, out / f"part-{index:05d}.parquet", compression="zstd")
        index += 1
        batch.clear()

    with open(src, "rb") as f:
        for line in f:
            batch.append(json.loads(line))
            if len(batch) == rows_per_file:
                flush()
    if batch:
        flush()


def pyarrow_json(src: Path, out: Path, rows_per_file: int) -> None:
    out.mkdir()
    # Records are whole files: a block must hold the longest line.
    table = pajson.read_json(src, read_options=pajson.ReadOptions(block_size=16 << 20))
    for index, start in enumerate(range(0, table.num_rows, rows_per_file)):
        part = table.slice(start, rows_per_file)
        pq.write_table(part, out / f"part-{index:05d}.parquet", compression="zstd")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=float, default=50.0)
    parser.add_argument("--rows-per-file", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="bench_jsonl_"))
    try:
        src = work / "corpus.jsonl"
        size, rows = build_corpus(src, int(args.mb * 1e6))
        if rows == 0:
            print("no C++ headers found under", [str(r) for r, _ in HEADER_ROOTS])
            return 1
        config = JsonlConverterConfig(rows_per_file=args.rows_per_file)
        runners = {
            "converter": lambda out: convert(src, out, config),
            "bare_json": lambda out: bare_json(src, out, args.rows_per_file),
            "pyarrow_json": lambda out: pyarrow_json(src, out, args.rows_per_file),
        }
        seconds: dict[str, float] = {}
        for name, run in runners.items():
            times = []
            for i in range(args.repeats):
                out = work / f"{name}-{i}"
                t0 = time.perf_counter()
                run(out)
                times.append(time.perf_counter() - t0)
                shutil.rmtree(out)
            seconds[name] = statistics.median(times)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    mb = size / 1e6
    figures = {
        "input_mb": round(mb, 1),
        "records": rows,
        "rows_per_file": args.rows_per_file,
        **{f"{k}_s": round(v, 3) for k, v in seconds.items()},
        **{f"{k}_mb_s": round(mb / v, 1) for k, v in seconds.items()},
        "converter_vs_bare_json": round(seconds["converter"] / seconds["bare_json"], 2),
        "converter_vs_pyarrow_json": round(seconds["converter"] / seconds["pyarrow_json"], 2),
    }
    print(f"JSONL -> parquet, {mb:.1f} MB, {rows} records of real C++ headers, median of 3\n")
    print("| run | seconds | MB/s | vs converter |")
    print("|---|---|---|---|")
    for name, secs in seconds.items():
        ratio = seconds["converter"] / secs
        print(f"| {name} | {secs:.3f} | {mb / secs:.1f} | converter takes {ratio:.2f}x |")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
