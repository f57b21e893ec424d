"""NCCL's real transport, judged: a rank of an RDMA lane whose NCCL chose TCP sockets fails.

NCCL falls back from RDMA to TCP sockets without an error: the only sign is in its NCCL_DEBUG=INFO lines,
which fleet/ops/allreduce.py reads from each rank's run into an NcclTranscript (the formats are cited there).
A rank whose network is Socket, or any of whose channels go via NET/Socket, fails for a lane that
expects RDMA. A rank that printed none of these lines cannot be judged (and says so).
"""

from __future__ import annotations

from sparkfleet.findings import Finding
from sparkfleet.fleet.ops.allreduce import NcclTranscript, transcript

CHECK = "nccl"


def latency(t: NcclTranscript) -> str:
    lat = (t.result or {}).get("latency_us") or {}
    return ", ".join(f"{int(k) // 1024} KB {v:g} us" for k, v in lat.items())


def verdict(node: str, rank: int, t: NcclTranscript, *, expects_rdma: bool, exit_code: int | None,
            error: str | None = None) -> Finding:
    """One finding for one rank: fail on sockets for an RDMA lane, or when the all-reduce did not run."""
    expected = "NCCL over RDMA (Using network IB, channels via NET/IB)" if expects_rdma else "the all-reduce runs"
    seen = t.describe() + (f"; all-reduce {latency(t)}" if latency(t) else "")
    failed_run = error or (t.result or {}).get("error") or (None if exit_code in (0, None) else f"exit {exit_code}")
    if expects_rdma and t.on_socket:
        return Finding(CHECK, "fail", f"rank {rank}: NCCL fell back to TCP sockets (NET/Socket), not RDMA",
                       "check that the container sees the HCA (--device /dev/infiniband, NCCL_IB_HCA), the "
                       "GID index (NCCL_IB_GID_INDEX) and that the port is ACTIVE; NCCL_NET=IB makes a "
                       "fallback an error instead", node=node, observed=seen, expected=expected)
    if failed_run:
        last = t.warnings[-1] if t.warnings else ""
        return Finding(CHECK, "fail", f"rank {rank}: the NCCL all-reduce did not complete: {failed_run}"
                       + (f" (NCCL WARN {last})" if last else ""), "run it by hand with --dry-run's command "
                       "and read NCCL's lines", node=node, observed=seen, expected=expected)
    if expects_rdma and not t.on_rdma:
        return Finding(CHECK, "warn", f"rank {rank}: NCCL's transport is not in its output: not judged",
                       "make sure NCCL_DEBUG=INFO reaches the container (and NCCL_DEBUG_SUBSYS includes INIT,NET)",
                       node=node, observed=seen, expected=expected)
    how = ("RDMA with GPUDirect" if t.gdrdma else "RDMA") if t.on_rdma else f"network {t.network or '?'}"
    return Finding(CHECK, "ok", f"rank {rank}: NCCL over {how}" + (f", all-reduce {latency(t)}" if latency(t) else ""),
                   node=node, observed=seen, expected=expected)


def expects_rdma(ranks: list) -> bool:
    """A lane of several ranks whose nodes all have RDMA must all-reduce over it."""
    return len(ranks) > 1 and all(r.node.rdma is not None for r in ranks)


def judge(runs: list, rdma: bool) -> tuple[list[Finding], list[dict]]:
    """Findings and a summary per rank from the ranks' runs (fleet/ops/allreduce.py RankRun: rank, node, result, and
    the transcript its operation read from the result)."""
    findings: list[Finding] = []
    seen: list[dict] = []
    for x in runs:
        res = x.result
        t = x.transcript if getattr(x, "transcript", None) is not None else transcript(res)
        unreachable = res is not None and not res.ok and res.exit_code is None
        findings.append(verdict(x.node, x.rank, t, expects_rdma=rdma,
                                exit_code=res.exit_code if res is not None else None,
                                error=(res.message or res.error) if unreachable else
                                ("no result" if res is None else None)))
        seen.append({"rank": x.rank, "node": x.node, "network": t.network, "via": dict(t.via), "result": t.result,
                     "exit_code": res.exit_code if res is not None else None})
    return findings, seen
