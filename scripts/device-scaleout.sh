#!/usr/bin/env bash
# The scale-out bench on a lent 16-core machine that has Python 3.12 and no network (issue 25):
# the packages it lacks come unpacked from .devcarry/site.tar.xz and the demo's C++ from
# .devcarry/corpus.tar.xz, both made here by scripts/device-pack.sh. Results go to $OUT.
#   scripts/device-scaleout.sh SCALE:WORKERS...   e.g. 4:2,8,16 16:16
# Each SCALE:WORKERS is one `bench_scaleout workers` (pinned when the machine has 16 CPUs);
# its JSON is $OUT/workers-<scale>x-w<workers>.json and its runs' Dagster step timelines
# $OUT/steps-<scale>x-w<workers>.txt, printed as a short table at the end of each.
set -euo pipefail
out=${OUT:-/tmp/device-out}
mkdir -p "$out" /tmp/site
py=python3
started=$(date +%s)
$py - <<'PY'
import tarfile, zipfile, pathlib
tarfile.open(".devcarry/site.tar.xz").extractall("/tmp/site", filter="fully_trusted")
tarfile.open(".devcarry/corpus.tar.xz").extractall("/tmp/cpp", filter="fully_trusted")
wheels = pathlib.Path(".cache/wheels"); wheels.mkdir(parents=True, exist_ok=True)
for root in sorted(pathlib.Path("/tmp/cpp").iterdir()):
    with zipfile.ZipFile(wheels / root.name, "w", zipfile.ZIP_STORED) as z:
        for p in sorted(root.rglob("*")):
            if p.is_file():
                z.write(p, p.relative_to(root).as_posix())
PY
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
echo "unpacked in $(( $(date +%s) - started )) s; $(nproc) CPUs; $($py --version)"
$py -c "import pyarrow, polars, dagster, tokenizers, tiktoken, numpy; print('pyarrow', pyarrow.__version__, 'polars', polars.__version__, 'dagster', dagster.__version__, 'tokenizers', tokenizers.__version__, 'numpy', numpy.__version__)"
pin=()
[ "$(nproc)" -ge 16 ] && pin=(--pin)
for phase in "${@:-4:2,8,16}"; do
  scale=${phase%%:*} counts=${phase#*:}
  name="${scale}x-w${counts//,/-}"
  json="$out/workers-$name.json" log="/tmp/workers-$name.log"
  $py -m bench.bench_scaleout workers --scale "$scale" --workers "$counts" "${pin[@]}" \
    --work "/tmp/scaleout-$name" >"$json" 2>"$log" || { tail -40 "$log"; exit 1; }
  grep "^\[scaleout\]" "$log" || true
  $py - "$json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("scale", r["scale"], "cpus", r["cpus"], "pinned", r["pinned"])
for n, run in r["runs"].items():
    print(f"w{n}: wall {run['wall_s']} s, cpu {run['cpu_s']} s, driver {run['driver_share']}, {run['snapshot']}")
    for g, v in run["groups"].items():
        print(f"   {g:34s} wall {v['wall_s']:7.2f} cpu {v['cpu_s']:7.2f} drv {v['driver_cpu_s']:6.2f} largest {v['largest_process_mb']:.0f} MB")
for k, c in r["compare"].items():
    print(k, "wall", c["wall_speedup"], "same snapshot", c["same_snapshot"], "slowest", c["slowest_group"])
    print("  ", c["stage_group_speedup"])
PY
  # each run's Dagster steps, start and length, from its event log (which steps do not shrink)
  $py - "/tmp/scaleout-$name" >"$out/steps-$name.txt" <<'PY'
import datetime, pathlib, sqlite3, sys
for work in sorted(pathlib.Path(sys.argv[1]).glob("w*")):
    home, t0 = work / "dagster_home", None
    print(f"== {work.name}")
    runs = sqlite3.connect(home / "history" / "runs.db")
    for (run_id,) in runs.execute("select run_id from runs order by create_timestamp"):
        db = sqlite3.connect(home / "history" / "runs" / f"{run_id}.db")
        starts = {}
        for kind, step, ts in db.execute(
            "select dagster_event_type, step_key, timestamp from event_logs"
            " where dagster_event_type is not null order by id"
        ):
            ts = datetime.datetime.fromisoformat(str(ts)).timestamp()
            t0 = ts if t0 is None else t0
            if kind == "STEP_START":
                starts[step] = ts
            elif kind in ("STEP_SUCCESS", "STEP_FAILURE") and step in starts:
                print(f"{starts[step] - t0:8.2f} {ts - starts[step]:7.2f}  {step}")
PY
  echo "after $name: $(( $(date +%s) - started )) s"
done
echo "total $(( $(date +%s) - started )) s"
