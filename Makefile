# The two quick-start commands. Each bootstraps tox if the machine lacks it; tox
# builds the pinned environment once (.tox/oracle) and every command reuses it.
PYTHON ?= python3
TOX := $(PYTHON) -m tox
IN_ENV := $(TOX) exec -q -e oracle --

.PHONY: gate test test-figures bench speed tox cpp-port drift

tox:
	@$(PYTHON) -m tox --version >/dev/null 2>&1 || $(PYTHON) -m pip install -q 'tox>=4.10'

## gate: `parity gate` for per_request against the pinned oracle on the ci suite, every level;
## writes summary.md, junit.xml, results.parquet and gate.json to reports/out/gate-per_request. The first
## step builds the environment with the harness installed in it (.tox/oracle/bin/parity); tox exec alone does not
gate: tox
	$(TOX) -q -e oracle --notest
	$(IN_ENV) python -m harness gate --suite ci --port per_request --out reports/out/gate-per_request

## test: lint, type-check and the test suite (the browser test needs Debian's chromium); the
## legacy oracle's environment (vllm==0.27.1, .tox/vllm-0.27.1) is built first: its tests call it
test: tox
	tools/ensure_chromium.sh
	$(TOX) -e vllm-0.27.1 --notest
	$(TOX) -e oracle -- $(PYTEST_ARGS)

## test-figures: `make test` timed with pytest's 25 slowest tests, written into docs/figures.md
test-figures: tox
	$(IN_ENV) python -m benchmarks.test_durations

## drift: what upstream changed since the pin, for the newest release set up here (vllm==0.33.0:
## its environment, about 9.4 GB, is built on first use); writes reports/drift/<date>.md and .json
drift: tox
	$(IN_ENV) python -m harness drift --against vllm==0.33.0

## bench: L1 throughput, the L2/L3 cost per case, a worker's memory and input generation (scripts that print, not tests), written into docs/figures.md
bench: tox
	$(IN_ENV) python -m benchmarks.figures layout-throughput python -m benchmarks.layout_throughput
	$(IN_ENV) python -m benchmarks.figures numeric-cost python -m benchmarks.numeric_cost
	$(IN_ENV) python -m benchmarks.figures worker-memory python -m benchmarks.worker_memory
	$(IN_ENV) python -m benchmarks.figures input-cost python -m benchmarks.input_cost

## speed: benchmarks/speed.py: the ci gate with --jobs 1 and 2, the kill matrix before the pool and
## cache, cold and warm, and the nightly default run (about 45 minutes in all), written into docs/figures.md
speed: tox
	$(IN_ENV) python -m benchmarks.figures speed python -m benchmarks.speed --nightly --json reports/out/speed/figures.json

## cpp-port: the C++ reference port: planner, merge and prefill loop (docs/external-port-protocol.md);
## -ffp-contract=off keeps every float operation rounded on its own, as the oracle's numpy arithmetic is.
## The tests build their copy with this target (CPP_PORT=their path, CPP_PORT_EXTRA_FLAGS=-Werror).
CPP_PORT ?= build/cpp-port
CPP_PORT_FLAGS := -O2 -std=c++17 -ffp-contract=off -Wall -Wextra
cpp-port:
	mkdir -p $(dir $(CPP_PORT)) && g++ $(CPP_PORT_FLAGS) $(CPP_PORT_EXTRA_FLAGS) -o $(CPP_PORT) ports/cpp/per_request_port.cpp
