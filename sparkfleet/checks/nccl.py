"""NCCL's real transport: which network each rank's NCCL chose, read from its NCCL_DEBUG=INFO lines.

NCCL falls back from RDMA to TCP sockets without an error: the only sign is in its INFO lines
(vLLM's docs: look for `[send] via NET/IB/GDRDMA`, not `via NET/Socket`, REFERENCE.md). The lines
read here, in NCCL's own formats (NCCL logging docs, docs.nvidia.com/deeplearning/nccl/user-guide/
docs/troubleshooting/logging.html; src/transport/net_socket.cc and net_ib.cc), as an H200 printed
them (docs/receipts/nccl-allreduce-h200-world1.txt):

    host:pid:tid [0] NCCL INFO NET/IB : Using [0]rocep1s0f0:1/RoCE [RO]; OOB enp1s0f0np0:192.168.192.11<0>
    host:pid:tid [0] NCCL INFO NET/IB : No device found.
    host:pid:tid [0] NCCL INFO NET/Socket : Using [0]eth0:192.0.2.2<0>
    host:pid:tid [0] NCCL INFO Using network IB            (or: Using network Socket)
    host:pid:tid [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA
    host:pid:tid [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0

A rank whose network is Socket, or any of whose channels go via NET/Socket, fails for a lane that
expects RDMA. A rank that printed none of these lines cannot be judged (and says so).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field

from sparkfleet.findings import Finding

CHECK = "nccl"
_INFO = re.compile(r"NCCL INFO (.*)$")
_NETWORK = re.compile(r"^Using network (\S+)")
_VIA = re.compile(r"^Channel \S+ : .*? via (\S+)")
_IB_USING = re.compile(r"^NET/IB : Using (.*?)(?:;|$)")
_SOCKET_USING = re.compile(r"^NET/Socket : Using (.*)$")
_VERSION = re.compile(r"^NCCL version (\S+)")
_WARN = re.compile(r"NCCL WARN (.*)$")
RESULT_KEY = "sparkfleet_nccl"


@dataclass
class Transport:
    """What one rank's output says about NCCL's choices."""

    network: str | None = None  # "IB" | "Socket" | a plugin's name, from "Using network X"
    via: Counter = field(default_factory=Counter)  # "NET/IB/0/GDRDMA" -> channels, "P2P/IPC", ...
    ib_devices: str | None = None  # what NET/IB said it uses ("[0]rocep1s0f0:1/RoCE [RO]")
    socket_ifaces: str | None = None
    version: str | None = None
    warnings: list[str] = field(default_factory=list)
    result: dict | None = None  # the script's JSON document

    @property
    def on_socket(self) -> bool:
        return self.network == "Socket" or any(v.startswith("NET/Socket") for v in self.via)

    @property
    def on_rdma(self) -> bool:
        return self.network == "IB" or any(v.startswith("NET/IB") for v in self.via)

    @property
    def gdrdma(self) -> bool:
        return any(v.startswith("NET/IB") and "GDRDMA" in v for v in self.via)

    def describe(self) -> str:
        parts = [f"network {self.network or '?'}"]
        if self.via:
            parts.append("channels " + ", ".join(f"{k} x{n}" for k, n in sorted(self.via.items())))
        if self.ib_devices:
            parts.append(f"NET/IB {self.ib_devices.strip()}")
        if self.socket_ifaces and self.on_socket:
            parts.append(f"NET/Socket {self.socket_ifaces.strip()}")
        if self.version:
            parts.append(f"NCCL {self.version}")
        return "; ".join(parts)


def parse(text: str) -> Transport:
    """One rank's combined output (NCCL's lines and the script's JSON line)."""
    t = Transport()
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("{") and RESULT_KEY in line:
            try:
                doc = json.loads(line)
            except ValueError:
                doc = None
            if isinstance(doc, dict) and isinstance(doc.get(RESULT_KEY), dict):
                t.result = doc[RESULT_KEY]
            continue
        w = _WARN.search(line)
        if w:
            t.warnings.append(w.group(1).strip())
            continue
        m = _INFO.search(line)
        if not m:
            continue
        msg = m.group(1).strip()
        if (x := _NETWORK.match(msg)) is not None:
            t.network = x.group(1)
        elif (x := _VIA.match(msg)) is not None:
            t.via[x.group(1)] += 1
        elif (x := _IB_USING.match(msg)) is not None:
            t.ib_devices = x.group(1)
        elif (x := _SOCKET_USING.match(msg)) is not None:
            t.socket_ifaces = x.group(1)
        elif (x := _VERSION.match(msg)) is not None:
            t.version = x.group(1)
    return t


def transcript(result: object | None) -> Transport:
    """What a rank's run printed (a fleet Result: its stdout, then its stderr), read; nothing for no result."""
    if result is None:
        return parse("")
    return parse(getattr(result, "stdout", "") + "\n" + getattr(result, "stderr", ""))


def latency(t: Transport) -> str:
    lat = (t.result or {}).get("latency_us") or {}
    return ", ".join(f"{int(k) // 1024} KB {v:g} us" for k, v in lat.items())


def verdict(node: str, rank: int, t: Transport, *, expects_rdma: bool, exit_code: int | None,
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
    """Findings and a summary per rank from the ranks' runs (fleet/nccl.RankRun: rank, node, result, and the
    transcript its operation read from the result)."""
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
