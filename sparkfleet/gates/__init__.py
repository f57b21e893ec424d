"""Answer gates: check that a lane answers correctly before it is called serving.

Every gate speaks only HTTP to an OpenAI-compatible endpoint (vLLM, TensorFold, SGLang or the sim
engine) and returns a GateResult: pass/fail/skip, its checks (each with what was sent, what came
back and why it failed) and the time it took.

    models       /health 200; /v1/models lists every served name; each name answers
    count100     "count from 1 to 100" at temperature 0, thinking off: exactly 1..100
    needle       a fresh nonce at a chosen depth in fresh random filler (32K; --long: 128K and the
                 seeds' exact lengths up to 500K)
    image        generated PNGs: stripes, two images, a 2x2 grid (skipped with vision off)
    tools        T1 call, T2 round trip, T3 parallel, T4 forced tool_choice; plain and streamed
                 (skipped with tools off)
    reasoning    thinking on request returns reasoning separately (never reasoning_effort medium)
    streaming    a usage block ends the stream; streamed text == non-streamed text
    auth         no key / wrong key refused, the key served (skipped without api_key_env)
    determinism  prompts at temperature 0 alone and all at once give identical text
    soak         N streams for T minutes, unique-tagged checked prompts, MemAvailable sampled

`run.run_gates(base_url, profile, only, options)` runs a set; `run.gates_step(ctx, st)` is the
`gates` step of `up`; `sparkfleet gates` is the command (cli/gates.py).
"""
