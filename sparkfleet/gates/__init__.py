"""Answer gates: check that a lane answers correctly before it is called serving (CATALOG §5.3).

Every gate speaks only HTTP to an OpenAI-compatible endpoint (vLLM, TensorFold, SGLang or the sim
engine) and returns a GateResult: pass/fail/skip, the evidence (what was sent, what came back, why
it failed) and the time it took. `run.run_gates` runs a set; `run.gates_step` is the `up` step.
"""
