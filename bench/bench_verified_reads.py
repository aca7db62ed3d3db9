"""What verified reads cost: the demo scaled `--scale`x run through every stage in this process
(the library's runner, one worker, so every read happens here and is counted), once from an
empty data dir and once more over it (each new version then also verifies the one it
replaces). A ShardStore that counts what it verifies records the reads and bytes; then each
shard of the final versions is read with verification (`ShardStore.read_shard`) and without
(`pq.read_table` on its path, as the code read before), median of three, which gives the
seconds verification adds per byte on these real shards, and each shard's sha256 alone from
memory (an upper bound: reading the whole object into one buffer also makes the read itself
cheaper). Reported: the bytes each run verified, and those bytes' added seconds (and the
upper bound) as a share of the run's CPU seconds.

    .venv/bin/python -m bench.bench_verified_reads --scale 4 --out /tmp/verified-reads
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import shutil
import statistics
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from bench.scaleup import build
from megacpp_pipeline.pipeline.catalog import load_catalog
from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.runner import run_all
from megacpp_pipeline.stages import default_registry
from megacpp_pipeline.storage.store import Manifest, ShardInfo, ShardStore


class CountingStore(ShardStore):
    """A ShardStore that counts every object it verifies: reads, local copies (hashed), and
    the objects of versions it replaces."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.counts = {"reads": 0, "read_bytes": 0, "local_bytes": 0, "replaced_bytes": 0}

    def _read_verified(self, vdir: str, shard: ShardInfo) -> pa.Buffer:
        self.counts["reads"] += 1
        self.counts["read_bytes"] += shard.bytes
        return super()._read_verified(vdir, shard)

    def _check_local_file(
        self, local: Path, sha256: str, expected: ShardInfo | None, *, what: str
    ) -> None:
        self.counts["local_bytes"] += local.stat().st_size
        super()._check_local_file(local, sha256, expected, what=what)

    def verify_objects(self, manifest: Manifest) -> list[str]:
        self.counts["replaced_bytes"] += sum(s.bytes for s in manifest.all_shards())
        return super().verify_objects(manifest)


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def one_run(catalog: Path, data: Path, cache: Path) -> dict:
    registry = default_registry()
    store = CountingStore(str(data))
    ctx = StageContext(load_catalog(catalog, registry), store, registry, cache, workers=1)
    cpu, wall = _cpu_s(), time.monotonic()
    run_all(ctx)
    return {
        "cpu_s": round(_cpu_s() - cpu, 1),
        "wall_s": round(time.monotonic() - wall, 1),
        **store.counts,
    }


def _median_s(fn: object, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def read_costs(data: Path) -> dict:
    """Read-with-verify against read-without over every shard of the latest versions."""
    store = ShardStore(str(data))
    plain = verified = hashing = 0.0
    nbytes = shards = 0
    for asset in sorted((data / "assets").iterdir()):
        for part in sorted(p for p in asset.iterdir() if p.is_dir()):
            m = store.latest(asset.name, part.name)
            vdir = store.version_dir(m)
            for info in m.tables.values():
                for shard in info.shards:
                    path = f"{vdir}/{shard.path}"
                    plain += _median_s(lambda p=path: pq.read_table(p, filesystem=store.fs))
                    verified += _median_s(lambda v=vdir, s=shard: store.read_shard(v, s))
                    data = Path(path).read_bytes()
                    hashing += _median_s(lambda d=data: hashlib.sha256(d).hexdigest())
                    nbytes += shard.bytes
                    shards += 1
    return {
        "shards": shards,
        "bytes": nbytes,
        "read_without_verify_s": round(plain, 3),
        "read_with_verify_s": round(verified, 3),
        "added_s_per_gb": round((verified - plain) / max(nbytes, 1) * 1e9, 3),
        # the hash alone, from memory: what verifying costs if reading itself got no cheaper
        "sha256_s_per_gb": round(hashing / max(nbytes, 1) * 1e9, 3),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scale", type=int, default=4)
    p.add_argument("--out", type=Path, default=Path("/tmp/megacpp-verified-reads"))
    args = p.parse_args()
    corpus = build(args.scale, args.out / "corpus")
    data, cache = args.out / "data", args.out / "cache"
    shutil.rmtree(data, ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)
    runs = {"cold": one_run(corpus.catalog, data, cache)}
    runs["again"] = one_run(corpus.catalog, data, cache)  # replaces (and verifies) every version
    costs = read_costs(data)
    for run in runs.values():
        verified = run["read_bytes"] + run["local_bytes"] + run["replaced_bytes"]
        run["verified_bytes"] = verified
        run["verify_s_estimate"] = round(verified * costs["added_s_per_gb"] / 1e9, 2)
        run["share_of_run_cpu"] = round(run["verify_s_estimate"] / run["cpu_s"], 4)
        run["hash_s_upper_bound"] = round(verified * costs["sha256_s_per_gb"] / 1e9, 2)
        run["hash_share_of_run_cpu_upper_bound"] = round(
            run["hash_s_upper_bound"] / run["cpu_s"], 4
        )
    result = {"scale": args.scale, "files": corpus.files, "corpus_bytes": corpus.bytes}
    print(json.dumps({**result, "runs": runs, "read_costs": costs}, indent=1))


if __name__ == "__main__":
    main()
