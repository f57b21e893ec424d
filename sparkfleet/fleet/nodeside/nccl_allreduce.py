#!/usr/bin/env python3
"""sparkfleet NCCL all-reduce: the transport NCCL really picks between a lane's ranks, and its latency.

Runs inside the lane's own image (torch with NCCL is in it), one process per rank, with the lane's
NCCL environment; `NCCL_DEBUG=INFO` (set here unless given) makes NCCL say which network and which
transport each channel uses, which the controller reads (fleet/ops/allreduce.py) and judges (checks/nccl.py).
It also runs alone on any machine with a GPU and torch:

    python3 nccl_allreduce.py --world-size 1

One line of stdout is a JSON document, {"sparkfleet_nccl": {rank, world_size, versions, device,
latency_us per message size}} (NCCL may still log after it). Sizes are bytes of bf16 data; the
decode step's all-reduces are 48-400 KB (INV-28). Exit 0 on success, 1 when torch, NCCL
or CUDA failed, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

DEFAULT_SIZES = "49152,409600"
DEFAULT_PORT = 29571


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="all-reduce across ranks with NCCL; prints one JSON line")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--master-addr", default="127.0.0.1")
    p.add_argument("--master-port", type=int, default=DEFAULT_PORT)
    p.add_argument("--local-rank", type=int, default=0, help="the CUDA device of this rank")
    p.add_argument("--sizes", default=DEFAULT_SIZES, help="message sizes in bytes, comma-separated")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for every rank")
    a = p.parse_args(argv)
    if a.world_size < 1 or not 0 <= a.rank < a.world_size:
        p.error(f"--rank {a.rank} must be in 0..{a.world_size - 1}")
    try:
        a.size_list = [int(s) for s in a.sizes.split(",") if s.strip()]
    except ValueError:
        p.error(f"--sizes {a.sizes!r}: expected bytes, comma-separated")
    if not a.size_list or any(s < 2 or s % 2 for s in a.size_list):
        p.error("--sizes: every size must be an even number of bytes (bf16 elements)")
    return a


def main(argv: list[str]) -> int:
    a = parse_args(argv)
    os.environ.setdefault("NCCL_DEBUG", "INFO")
    os.environ.setdefault("NCCL_DEBUG_SUBSYS", "INIT,NET")
    try:  # the lane's image has torch, the node's own Python need not: the reply says which it lacked
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        print(json.dumps({"sparkfleet_nccl": {"rank": a.rank, "error": f"torch is not importable: {exc}"}}))
        return 1
    out: dict = {"rank": a.rank, "world_size": a.world_size, "torch": torch.__version__}
    try:
        torch.cuda.set_device(a.local_rank)
        out["device"] = torch.cuda.get_device_name(a.local_rank)
        out["cuda"] = torch.version.cuda
        version = torch.cuda.nccl.version()
        out["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        dist.init_process_group("nccl", init_method=f"tcp://{a.master_addr}:{a.master_port}", rank=a.rank,
                                world_size=a.world_size, timeout=datetime.timedelta(seconds=a.timeout))
        latency = {}
        for size in a.size_list:
            t = torch.ones(size // 2, dtype=torch.bfloat16, device="cuda")
            for _ in range(a.warmup):
                dist.all_reduce(t)
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(a.iters):
                dist.all_reduce(t)
            end.record()
            torch.cuda.synchronize()
            latency[str(size)] = round(start.elapsed_time(end) * 1000.0 / a.iters, 2)  # ms -> us
        out["latency_us"] = latency
        out["iters"] = a.iters
        dist.barrier()
        dist.destroy_process_group()
    except Exception as exc:  # CUDA, NCCL or rendezvous: the document says what, NCCL's own lines say why
        out["error"] = f"{type(exc).__name__}: {exc}"
        sys.stdout.flush()
        print(json.dumps({"sparkfleet_nccl": out}))
        return 1
    out["finished_at"] = time.time()
    sys.stdout.flush()
    print(json.dumps({"sparkfleet_nccl": out}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
