# Two commands on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/sparkfleet profiles
	$(BIN)/sparkfleet plan --profile dcp2

test: $(STAMP)
	$(BIN)/ruff check sparkfleet tests $(wildcard bench)
	$(BIN)/pytest

lint: $(STAMP)
	$(BIN)/ruff check sparkfleet tests $(wildcard bench)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info
