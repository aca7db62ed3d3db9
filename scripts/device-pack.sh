#!/usr/bin/env bash
# Packs what scripts/device-scaleout.sh needs on a lent machine with Python 3.12 and no network,
# into .devcarry/ (git-ignored; a run carries it, 64 MiB with the working tree):
#   site.tar.xz    the runtime packages that machine lacks (or has at other versions), for
#                  cp312 manylinux x86-64, at this venv's versions; the shared objects stripped,
#                  and pyarrow without Flight, the cloud file systems, headers and tests
#   corpus.tar.xz  the C++ files of the three demo wheels (bench/scaleup.py builds from them)
# Needs python3.12 here (pyenv) for the one wheel built from source (reuse).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYENV_VERSION=${PYENV_VERSION:-3.12.1}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
plat=(--python-version 3.12 --implementation cp --platform linux_x86_64)
for n in 1 2014 _2_17 _2_24 _2_27 _2_28 _2_31 _2_34 _2_35; do plat+=(--platform "manylinux${n}_x86_64"); done
.venv/bin/python -m pip freeze | grep -v -e '^-e' -e megacpp -e '^reuse=' >"$work/constraints.txt"
.venv/bin/python -c "import tomllib; d = tomllib.load(open('pyproject.toml', 'rb'));
print('\n'.join(x for x in d['project']['dependencies'] if not x.startswith(('dagster-webserver', 'reuse'))))" >"$work/deps.txt"
python3.12 -m pip download -q --only-binary=:all: "${plat[@]}" -d "$work/whl" -r "$work/deps.txt" -c "$work/constraints.txt"
python3.12 -m pip download -q --no-deps --only-binary=:all: "${plat[@]}" -d "$work/whl" \
  "$(grep -i '^python-debian=' "$work/constraints.txt")" "$(grep -i '^python-magic=' "$work/constraints.txt")"
python3.12 -m pip wheel -q --no-deps -w "$work/whl" "$(grep -i '^reuse=' <(.venv/bin/python -m pip freeze))"
# The lent machine's image has the rest (numpy, scipy, matplotlib, grpcio, tokenizers, tiktoken,
# pyyaml, regex, xxhash, rich, click, jinja2, requests, psutil, ...: device/KINDS.md).
carry="alembic annotated_types antlr4_python3_runtime boolean_py coloredlogs dagster dagster_pipes
  dagster_shared datasketch detect_secrets docstring_parser google_re2 grpcio_health_checking
  humanfriendly license_expression mako pathlib_abc platformdirs polars polars_runtime_32 protobuf
  pyarrow pydantic pydantic_core python_debian python_magic python_dotenv pytz reuse sqlalchemy
  structlog tomli tomlkit toposort tree_sitter tree_sitter_cpp typing_extensions typing_inspection
  tzdata universal_pathlib watchdog truststore"
wheels=()
for n in $carry; do wheels+=("$(ls "$work/whl/$n"-[0-9]*.whl | head -1)"); done
python3.12 -m pip install -q --no-index --no-deps --no-compile --target "$work/site" "${wheels[@]}"
rm -rf "$work/site/bin"
(
  cd "$work/site/pyarrow"
  rm -f libarrow_flight.so.* _flight*.so libarrow_python_flight* libarrow_s3.so.* _s3fs*.so \
    _pyarrow_cpp_tests* _orc* _dataset_orc* _hdfs* _gcsfs* _azurefs* \
    libarrow_python.so libarrow_python.so.*.*.* libarrow_python_parquet_encryption.so \
    libarrow_python_parquet_encryption.so.*.*.*
  rm -rf include includes src tests
  find . \( -name '*.pyx' -o -name '*.pxd' -o -name '*.pxi' -o -name '*.cpp' -o -name '*.h' \) -delete
)
find "$work/site" -name '*.so*' -type f -exec strip --strip-unneeded {} +
mkdir -p .devcarry
tar -C "$work/site" -cf - . | xz -T0 -9 >.devcarry/site.tar.xz
.venv/bin/python - "$work/cpp" <<'PY'
import pathlib, sys, zipfile
from bench.scaleup import CPP_SUFFIXES
out = pathlib.Path(sys.argv[1])
for wheel in sorted(pathlib.Path(".cache/wheels").glob("*.whl")):
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            if pathlib.PurePosixPath(info.filename).suffix in CPP_SUFFIXES and not info.is_dir():
                z.extract(info, out / wheel.name)
PY
tar -C "$work/cpp" -cf - . | xz -T0 -9 >.devcarry/corpus.tar.xz
du -b .devcarry/*
