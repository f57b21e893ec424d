"""The seeds' measuring method as code: `sparkfleet bench` and `sparkfleet bracket`.

- `promptsets`: prompt set v1 (prompts/v1.yaml, 8 categories plus a counting ceiling) or a user's
  YAML file; every result carries the file's sha256.
- `aclient`: the async httpx client; streams are read by the gates' StreamParser (one way to read SSE
  and usage blocks).
- `runner`: C streams released together per cell, warm-up, usage-block token counts only, per-stream
  decode, aggregate and TTFT, cold prefill, DSpark acceptance and other traffic from /metrics deltas,
  caveats. `run_bench(base_url, prompt_set, BenchOptions(...))`.
- `vllm_metrics`: vLLM's /metrics counters as snapshots and deltas (acceptance formulas of REFERENCE §1).
- `report`: results.json (raw per request), report.md (tables per category, mean of 8, ceiling apart),
  PNG plots with the `plots` extra.
- `bracket`: CTL → CAND → CTL in one window against a pre-registered bars file; never promotes.

docs/bench.md has the method, the output format and the client's measured overhead.
"""
