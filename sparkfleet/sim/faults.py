"""Faults the simulated lab can inject per node, each a failure of docs/failure-modes.md or an inventory fact.

A fault is recorded in R/state/faults.json with its parameters. Most faults only change state and
let `shim.render` redraw proc/ and sys/ (so `heal` gives back the healthy files byte for byte); the
rest move something aside and back (a storage dir, the whole sandbox) or stop and restart an sshd.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkfleet.fleet.transport import telling_line
from sparkfleet.schema.errors import UserError
from sparkfleet.sim import clock, dockerd, netlab, node, paths, sandbox, shim, sshd, values
from sparkfleet.sim.paths import inside
from sparkfleet.sim.sandbox import image_record
from sparkfleet.sim.shim.faults import VANISH_WATCH_PID


@dataclass(frozen=True)
class Kind:
    name: str
    summary: str
    params: tuple[str, ...] = ()


KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("clock-latch", f"under load the SM clock sits at --mhz (default {values.CLOCK_LATCH_MHZ}, inside the "
         "630-950 MHz latch band) with no throttle reason (FM-09)", ("mhz",)),
    Kind("slow-state", f"the GPU's steps after an idle pause take {values.SLOW_AFTER_IDLE_MS:g} ms against "
         f"{values.STEP_MS:g} ms back to back (sim-gpu-load's step timings) (FM-10)"),
    Kind("low-memory", "MemAvailable drops to --gib (default: below the 100 GiB rank floor on GB10, below the "
         "10 GiB host floor on GB300) (HLT-03, FM-15)", ("gib",)),
    Kind("earlyoom-off", "no earlyoom process runs (its /etc/default/earlyoom stays) (INV-13, HLT-24)"),
    Kind("wrong-gid", "a global IPv6 address takes GID indexes 2/3, so the RoCE v2 IPv4 entry moves from 3 to 5 "
         "(INV-23)"),
    Kind("missing-mount-source", "the node's Engram dir (--what engram, default) or cache dir (--what cache) "
         "disappears (FM-12)", ("what",)),
    Kind("unreadable-part", "the node's facts helper cannot read one of its parts: --what mounts (default: /etc/mtab) "
         "or listening (/proc/net/tcp), an open() that fails with EACCES as an unreadable file does (the node's "
         "python3 on PATH is wrapped); its checks must say unknown, never ok (FM-44, FM-48)", ("what",)),
    Kind("cifs-model", "the model root is a CIFS/SMB mount instead of local NVMe or the head's NFS (FM-44)"),
    Kind("port-taken", "a foreign container without sparkfleet labels runs and listens on --port (default 8000) "
         "(FM-48)", ("port",)),
    Kind("unreachable", "the node cannot be reached: local mode's wrapper answers as ssh does for a host with no "
         "route, ssh mode stops the node's sshd (FM-25)"),
    Kind("docker-down", "the docker daemon is down: every docker command fails as the real CLI does"),
    Kind("daemon-slow", "the node's docker answers --seconds late (a daemon busy or wedged: every docker "
         "command waits that long first)", ("seconds",)),
    Kind("slow-link", f"the node's fabric link is rate-limited to --rate (default {values.SLOW_LINK_RATE}) with tc "
         "tbf both ways: on the node's fabric interface and on the bridge's end of its link (ssh mode as root)",
         ("rate",)),
    Kind("mtu-mismatch", f"the node's fabric interface has MTU --mtu (default {values.MTU_MISMATCH}) against the "
         "lab's 9000", ("mtu",)),
    Kind("driver-drift", "nvidia-smi on this node reports another driver version (--driver)", ("driver",)),
    Kind("rank-vanish", "the node's lane container is removed: at once if one runs, else as soon as the next one "
         "starts (--sticky: every later launch too, until healed)", ("sticky",)),
    Kind("rank-hang", "/health keeps answering 200 but no token is ever produced, on the running rank or else the "
         "next one (--sticky: every later launch too)", ("sticky",)),
    Kind("serve-crash", "the engine exits after it has served a few seconds, on the running rank or else the next "
         "one (--sticky: every later launch too)", ("sticky",)),
    Kind("slow-boot", "sim engine fault for the next launch on this node: the boot takes --factor times longer "
         "(default 10)", ("factor",)),
    *(Kind(name, f"sim engine fault for the next launch on this node: {what}") for name, what in (
        ("worker-crash", "the rank dies while loading weights"),
        ("kv-low", "the rank profiles less KV than the lane expects"),
        ("missing-patch", "an ImportError at model init (a patch file that was not mounted)"),
        ("engine-fatal", "a CUDA error line, then the rank exits"),
        ("engine-warning", "a scary WARNING line; the boot carries on"),
        ("garbage-tokens", "every answer is one repeated token (the wrong-commit symptom, FM-13)"),
        ("count-off-by-one", "counting answers skip a number"),
        ("needle-blind", "needle questions are never answered"),
        ("no-tool-calls", "text where a tool call was due"),
        ("nondeterministic", "identical requests get different text"),
        ("auth-open", "the API key is not checked"),
        ("stream-usage-missing", "streams never send the usage chunk"),
        ("memory-leak", "every request leaks memory"),
    )),
    Kind("engram-layer-nfs", "sim engine fault for the next launch on this node: its last Engram layer is read from "
         "the model directory (NFS), the other layers from the node-local copy (ENG-16: 6-8 ms a step, not 3)"),
    Kind("engram-rank-offset", "sim engine fault for the next launch on this node: its rank reads rank 0's Engram "
         "rows, not its own (the disk reader ignores the rank's row offset, FM-03/ENG-12): its boot log shows "
         "rank 0's rows"),
)}
ENGINE_FAULTS = frozenset(k for k, v in KINDS.items() if v.summary.startswith("sim engine fault"))


@dataclass
class Target:
    """One node as the fault code needs it: its tree (R), how to cut and restore its reachability, and its
    directory (to run commands inside the node)."""

    node: str
    root: Callable[[], Path]
    disconnect: Callable[[], None]
    reconnect: Callable[[], None]
    dir: Path | None = None


def check_params(kind: str, params: dict[str, Any]) -> dict[str, Any]:
    """Drop unset parameters; refuse ones the kind does not take."""
    given = {k: v for k, v in params.items() if v is not None}
    extra = sorted(set(given) - set(KINDS[kind].params))
    if extra:
        takes = ", ".join(f"--{p}" for p in KINDS[kind].params) or "no options"
        raise UserError(f"fault {kind} does not take --{extra[0]} (it takes {takes})")
    return given


def inject(t: Target, kind: str, params: dict[str, Any]) -> dict[str, Any]:
    """Turn the fault on; returns the parameters recorded in faults.json."""
    params = check_params(kind, params)
    root = t.root()
    with shim.locked(root):
        faults = shim.load(root, "faults.json")
        if kind in faults["faults"]:
            raise UserError(f"fault {kind} is already on for {t.node}; heal it first: sparkfleet sim heal {t.node} "
                            f"{kind}")
        recorded = APPLY[kind](root, params)
        faults["faults"][kind] = recorded
        shim.save(root, "faults.json", faults)
        shim.render(root)
    if kind == "unreachable":
        t.disconnect()
    if kind in ACT:
        ACT[kind](t, recorded)
    return recorded


def heal(t: Target, kind: str) -> bool:
    """Turn the fault off and restore exactly what it changed; False when it was not on."""
    if kind == "unreachable" and kind in active(t.root()):
        t.reconnect()
    root = t.root()
    with shim.locked(root):
        faults = shim.load(root, "faults.json")
        if kind not in faults["faults"]:
            return False
        recorded = faults["faults"][kind]
        HEAL.get(kind, _nothing)(root, recorded)
        del faults["faults"][kind]
        shim.save(root, "faults.json", faults)
        shim.render(root)
    if kind in UNACT:
        UNACT[kind](t, recorded)
    return True


def active(root: Path) -> dict[str, dict[str, Any]]:
    return shim.load(root, "faults.json")["faults"]


# -- per kind ---------------------------------------------------------------------------------


def _nothing(root: Path, params: dict[str, Any]) -> dict[str, Any]:
    return {}


def _slow_boot(root: Path, params: dict[str, Any]) -> dict[str, Any]:
    factor = params.get("factor")
    if factor is not None and not float(factor) >= 1:
        raise UserError(f"slow-boot --factor {factor}: expected a number of at least 1 (times the normal boot)")
    return {} if factor is None else {"factor": float(factor)}


def _clock_latch(root: Path, params: dict[str, Any]) -> dict[str, Any]:
    mhz = int(params.get("mhz", values.CLOCK_LATCH_MHZ))
    if mhz <= 0:
        raise UserError(f"--mhz {mhz}: expected a clock in MHz above 0")
    return {"mhz": mhz}


def _low_memory(root: Path, params: dict[str, Any]) -> dict[str, Any]:
    node = shim.load(root, "node.json")
    gib = float(params.get("gib", values.HARDWARE[node["hardware"]]["low_memory_gib"]))
    total_gib = node["meminfo"]["total_kb"] / (1024 * 1024)
    if not 0 <= gib < total_gib:
        raise UserError(f"--gib {gib:g}: expected 0 <= GiB < MemTotal ({total_gib:g} GiB)")
    return {"gib": gib, "available_kb": round(gib * 1024 * 1024)}


def _wrong_gid(root: Path, params: dict[str, Any]) -> dict[str, Any]:
    node = shim.load(root, "node.json")
    if not any(p.get("ipv4") for p in node["rdma"]):
        raise UserError(f"{node['node']} has no RoCE port with a fabric IP (no rdma/fabric_ip in the inventory)")
    return {}


def _stash(root: Path, what: str) -> Path:
    return root / shim.STATE / "stash" / what


def _missing_source(root: Path, params: dict[str, Any]) -> dict[str, Any]:
    node = shim.load(root, "node.json")
    st = node["storage"]
    what = params.get("what") or ("engram" if st.get("engram_local_dir") else "cache")
    keys = {"engram": "engram_local_dir", "cache": "cache_dir"}
    if what not in keys:
        raise UserError(f"--what {what}: expected engram or cache")
    path = st.get(keys[what])
    if not path:
        raise UserError(f"{node['node']} has no {keys[what]} in the inventory")
    src = inside(root, path)
    if not src.exists():
        raise UserError(f"{path} is already missing on {node['node']}")
    os.replace(src, _stash(root, what))  # moved aside, contents kept, so heal puts back the same tree
    return {"what": what, "path": path}


def _unmissing_source(root: Path, params: dict[str, Any]) -> None:
    target = inside(root, params["path"])
    if target.is_dir() and not any(target.iterdir()):
        target.rmdir()  # e.g. `docker run -v` re-created it empty, as dockerd does
    if target.exists():
        raise UserError(f"cannot heal missing-mount-source: {params['path']} exists again and is not empty; "
                        f"the original is kept in {_stash(root, params['what'])}")
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(_stash(root, params["what"]), target)


def _port_taken(root: Path, params: dict[str, Any]) -> dict[str, Any]:
    port = int(params.get("port", 8000))
    if not 1 <= port <= 65535:
        raise UserError(f"--port {port}: expected 1-65535")
    node = shim.load(root, "node.json")
    if node.get("dockerd"):  # the node's real daemon: the foreign lane is a real container (_foreign_run)
        return {"port": port, "daemon": True}
    docker = shim.load(root, "docker.json")
    name = f"foreign-lane-{port}"
    if any(c["Name"] == "/" + name for c in docker["containers"]):
        raise UserError(f"a container named {name} already exists on {node['node']}")
    image = next((i for i in docker["images"] if values.FOREIGN_IMAGE in i["RepoTags"]), None)
    added_image = image is None
    if image is None:
        image = image_record(values.FOREIGN_IMAGE, [])
        docker["images"].append(image)
    cid = hashlib.sha256(f"sparkfleet-sim foreign {node['node']} {port}".encode()).hexdigest()
    docker["containers"].append(shim.container_record(
        node, cid, name, values.FOREIGN_IMAGE, image["Id"],
        ["vllm", "serve", "/models/glm-5.3", "--port", str(port)], labels=dict(values.FOREIGN_LABELS),
        network="bridge", ports={f"{port}/tcp": [{"HostIp": "", "HostPort": str(port)}]},
        created=values.FOREIGN_STARTED_AT, running=True, pid=values.FOREIGN_PID))
    shim.save(root, "docker.json", docker)
    return {"port": port, "container": cid, "added_image": added_image}


LISTENER = ("import os,signal,socket,sys;s=socket.socket(socket.AF_INET6);"
            "s.setsockopt(socket.IPPROTO_IPV6,socket.IPV6_V6ONLY,0);s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
            "s.bind(('::',int(sys.argv[1])));s.listen();open(sys.argv[2],'w').write(str(os.getpid()));"
            "signal.signal(signal.SIGTERM,lambda *a:sys.exit(0));signal.pause()")


def _in_node(t: Target, argv: list[str], detach: bool = False) -> None:
    if t.dir is not None:
        node.run_in(t.dir, argv, detach=detach)


def _docker(t: Target, *argv: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    """The node's own docker CLI, run inside the node (a node with its own dockerd)."""
    r = node.run_in(t.dir, ["/usr/bin/docker", *argv], stdin=stdin, timeout_s=120) if t.dir else None
    if r is None:
        raise UserError(f"{t.node}: the node is not running, so its docker cannot be reached")
    return r


def _foreign_run(t: Target, params: dict[str, Any]) -> None:
    """port-taken on a node with its own dockerd: somebody else's lane, a real container on the host network
    (the lab's daemons have no bridge to publish a port through) whose server listens on the port. Its image
    is loaded first where the node lacks it. What it made is added to the fault's record for heal; a run
    docker refuses (a name in use) drops the fault and says docker's words."""
    port, name = params["port"], f"foreign-lane-{params['port']}"
    added = _docker(t, "image", "inspect", values.FOREIGN_IMAGE).returncode != 0
    if added:
        r = _docker(t, "load", "-q", stdin=sandbox.images_archive({values.FOREIGN_IMAGE: {"entrypoint": None}}))
        if r.returncode != 0:
            _drop_fault(t, "port-taken")
            raise UserError(f"{t.node}: port-taken: docker load of {values.FOREIGN_IMAGE} failed: "
                            f"{telling_line(r.stderr.decode(errors='replace'))}")
    pid_file = f"/{shim.STATE}/foreign-{port}.pid"
    labels = [a for k, v in values.FOREIGN_LABELS.items() for a in ("--label", f"{k}={v}")]
    r = _docker(t, "run", "-d", "--name", name, "--network", "host", *labels, values.FOREIGN_IMAGE,
                "python3", "-c", LISTENER, str(port), pid_file)
    if r.returncode != 0:
        if added:
            _docker(t, "image", "rm", values.FOREIGN_IMAGE)
        _drop_fault(t, "port-taken")
        raise UserError(f"{t.node}: port-taken: docker run of {name} failed: "
                        f"{telling_line(r.stderr.decode(errors='replace'))}")
    _wait_file(t.root() / shim.STATE / f"foreign-{port}.pid")
    root = t.root()
    with shim.locked(root):
        faults = shim.load(root, "faults.json")
        faults["faults"]["port-taken"].update(container=r.stdout.decode().strip(), added_image=added)
        shim.save(root, "faults.json", faults)


def _foreign_rm(t: Target, params: dict[str, Any]) -> None:
    """Heal of _foreign_run: its container removed, its image too where the fault loaded it."""
    _docker(t, "rm", "-f", f"foreign-lane-{params['port']}")
    if params.get("added_image"):
        _docker(t, "image", "rm", values.FOREIGN_IMAGE)
    (t.root() / shim.STATE / f"foreign-{params['port']}.pid").unlink(missing_ok=True)


def _drop_fault(t: Target, kind: str) -> None:
    root = t.root()
    with shim.locked(root):
        faults = shim.load(root, "faults.json")
        faults["faults"].pop(kind, None)
        shim.save(root, "faults.json", faults)
        shim.render(root)


def _listen(t: Target, params: dict[str, Any]) -> None:
    """The foreign lane's server: a real socket listening on the port inside the node (on a node with its own
    dockerd, in the foreign lane's real container)."""
    if params.get("daemon"):
        _foreign_run(t, params)
        return
    pid_file = f"/{shim.STATE}/foreign-{params['port']}.pid"
    _in_node(t, ["/usr/bin/python3", "-c", LISTENER, str(params["port"]), pid_file], detach=True)
    _wait_file(t.root() / shim.STATE / f"foreign-{params['port']}.pid")


def _unlisten(t: Target, params: dict[str, Any]) -> None:
    if params.get("daemon"):
        _foreign_rm(t, params)
        return
    pid_file = f"/{shim.STATE}/foreign-{params['port']}.pid"
    _in_node(t, ["/bin/sh", "-c", f"kill $(cat {pid_file}) 2>/dev/null; rm -f {pid_file}"])


_EARLYOOM_PIDS = ("import os\nfor p in os.listdir('/proc'):\n try:\n  "
                  "print(p) if p.isdigit() and open(f'/proc/{p}/comm').read().strip() == 'earlyoom' else None\n"
                  " except OSError:\n  pass")


def _earlyoom_stop(t: Target, params: dict[str, Any]) -> None:
    """Stop the node's earlyoom process (found in the node's own /proc)."""
    _in_node(t, ["/bin/sh", "-c", f"for p in $(python3 -c \"{_EARLYOOM_PIDS}\"); do kill $p; done; "
                 f"while [ -n \"$(python3 -c \"{_EARLYOOM_PIDS}\")\" ]; do sleep 0.01; done"])


def _earlyoom_start(t: Target, params: dict[str, Any]) -> None:
    _in_node(t, ["/bin/sh", "-c", " ".join(shlex.quote(a) for a in shim.earlyoom_argv(t.root()))
                 + f" >/dev/null 2>&1 & while [ -z \"$(python3 -c \"{_EARLYOOM_PIDS}\")\" ]; do sleep 0.01; done"])


def _wait_file(path: Path, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not path.is_file():
        time.sleep(0.02)


def _unport_taken(root: Path, params: dict[str, Any]) -> None:
    if params.get("daemon"):
        return  # nothing in the shim's state: the container is the daemon's (_foreign_rm)
    docker = shim.load(root, "docker.json")
    gone = [c for c in docker["containers"] if c["Id"] == params["container"]]
    docker["containers"] = [c for c in docker["containers"] if c["Id"] != params["container"]]
    for c in gone:
        with_logs = root / shim.STATE / "logs" / f"{c['Id']}.log"
        if with_logs.exists():
            with_logs.unlink()
    if params.get("added_image"):
        iid = next((i["Id"] for i in docker["images"] if values.FOREIGN_IMAGE in i["RepoTags"]), None)
        if iid and not any(c["Image"] == iid for c in docker["containers"]):
            docker["images"] = [i for i in docker["images"] if i["Id"] != iid]
    shim.save(root, "docker.json", docker)


def _daemon(state: str) -> Callable[[Path, dict[str, Any]], Any]:
    def change(root: Path, params: dict[str, Any]) -> dict[str, Any]:
        docker = shim.load(root, "docker.json")
        docker["daemon"] = state
        shim.save(root, "docker.json", docker)
        return {}
    return change


def _fabric_port(root: Path) -> dict:
    node = shim.load(root, "node.json")
    port = next((p for p in node["rdma"] if p.get("ipv4")), None)
    if port is None:
        raise UserError(f"{node['node']} has no fabric interface with a fabric IP (no rdma/fabric_ip in the inventory)")
    return port


def _own_net(root: Path, kind: str) -> None:
    node = shim.load(root, "node.json")
    if not node.get("netns"):
        raise UserError(f"{kind} needs nodes with their own network: `sparkfleet sim up --transport ssh` as root")


def _slow_link(root: Path, params: dict[str, Any]) -> dict[str, Any]:
    _own_net(root, "slow-link")
    rate = str(params.get("rate", values.SLOW_LINK_RATE))
    if not re.fullmatch(r"\d+(\.\d+)?([kmg]?bit|[kmg]?bps)", rate):
        raise UserError(f"--rate {rate}: expected a tc rate such as 100mbit or 1gbit")
    iface = _fabric_port(root)["netdev"]
    return {"rate": rate, "iface": iface, "peer": netlab.fabric_peer(shim.load(root, "node.json")["node"], iface)}


def _mtu_mismatch(root: Path, params: dict[str, Any]) -> dict[str, Any]:
    mtu = int(params.get("mtu", values.MTU_MISMATCH))
    if not 576 <= mtu <= 9216:
        raise UserError(f"--mtu {mtu}: expected 576-9216")
    port = _fabric_port(root)
    return {"mtu": mtu, "iface": port["netdev"], "netns": bool(shim.load(root, "node.json").get("netns"))}


def _driver_drift(root: Path, params: dict[str, Any]) -> dict[str, Any]:
    node = shim.load(root, "node.json")
    driver = str(params.get("driver") or values.DRIFTED_DRIVER[node["hardware"]])
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?", driver):
        raise UserError(f"--driver {driver}: expected a driver version such as 580.95.05")
    return {"driver": driver}


def _netns_run(t: Target, *argv: str) -> None:
    proc = subprocess.run([*netlab.exec_argv(t.node), *argv], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise UserError(f"{t.node}: `{' '.join(argv)}` failed: {proc.stderr.strip()}")


def _rank_fault(kind: str) -> Callable[[Path, dict[str, Any]], dict[str, Any]]:
    def record(root: Path, params: dict[str, Any]) -> dict[str, Any]:
        return {"sticky": bool(params.get("sticky")), "acted": False}  # acted: it has hit a rank once
    return record


def _rank_act(t: Target, params: dict[str, Any], kind: str) -> None:
    """Act on the node's running lane ranks (inside the node: its docker state, its processes)."""
    if t.dir is None:
        return
    since = f"{time.time():.3f}"
    proc = node.run_in(t.dir, ["/usr/bin/python3", f"{node.SHIM_DIR}/sim-fault", kind])
    if proc is None or proc.returncode != 0:
        raise UserError(f"{t.node}: sim-fault {kind} failed: {proc.stderr.decode().strip() if proc else ''}")
    acted = int(proc.stdout.decode().strip() or 0)
    if (kind == "rank-vanish" and (not acted or params.get("sticky"))
            and shim.load(t.root(), "node.json").get("dockerd")):
        # a real container cannot remove itself at its start, as the shim's do: a watcher in the node does
        node.run_in(t.dir, ["/usr/bin/python3", f"{node.SHIM_DIR}/sim-fault", "--watch-vanish", since], detach=True)
        _wait_file(t.root() / shim.STATE / VANISH_WATCH_PID)
    if acted > 0:
        root = t.root()
        with shim.locked(root):
            faults = shim.load(root, "faults.json")
            if kind in faults["faults"]:
                faults["faults"][kind]["acted"] = True
                shim.save(root, "faults.json", faults)


def _rank_unact(t: Target, params: dict[str, Any]) -> None:
    """Heal of rank-vanish on a node with its own dockerd: its watcher (if still waiting) stopped."""
    pid_file = t.root() / shim.STATE / VANISH_WATCH_PID
    if t.dir is not None and pid_file.exists():
        node.run_in(t.dir, ["/bin/sh", "-c", f"kill $(cat /{shim.STATE}/{VANISH_WATCH_PID}) 2>/dev/null; "
                            f"rm -f /{shim.STATE}/{VANISH_WATCH_PID}"])


def _tbf_on(t: Target, params: dict[str, Any]) -> None:
    _netns_run(t, "tc", "qdisc", "add", "dev", params["iface"], "root", "tbf", "rate", params["rate"],
               *values.SLOW_LINK_TBF)
    if params.get("peer"):  # what the node receives leaves the bridge's end: a slow link is slow both ways
        _fabric_run("tc", "qdisc", "add", "dev", params["peer"], "root", "tbf", "rate", params["rate"],
                    *values.SLOW_LINK_TBF)


def _tbf_off(t: Target, params: dict[str, Any]) -> None:
    _netns_run(t, "tc", "qdisc", "del", "dev", params["iface"], "root")
    if params.get("peer"):
        _fabric_run("tc", "qdisc", "del", "dev", params["peer"], "root")


def _fabric_run(*argv: str) -> None:
    """A command in the lab's fabric namespace (the bridge and the nodes' link ends)."""
    proc = subprocess.run(["ip", "netns", "exec", netlab.FABRIC_NS, *argv], capture_output=True, text=True,
                          timeout=30)
    if proc.returncode != 0:
        raise UserError(f"{netlab.FABRIC_NS}: `{' '.join(argv)}` failed: {proc.stderr.strip()}")


def _mtu_on(t: Target, params: dict[str, Any]) -> None:
    if params.get("netns"):
        _netns_run(t, "ip", "link", "set", "dev", params["iface"], "mtu", str(params["mtu"]))


def _mtu_off(t: Target, params: dict[str, Any]) -> None:
    if params.get("netns"):
        _netns_run(t, "ip", "link", "set", "dev", params["iface"], "mtu", str(netlab.FABRIC_MTU))


def _daemon_slow(root: Path, params: dict[str, Any]) -> dict[str, Any]:
    if params.get("seconds") is None:
        raise UserError("daemon-slow needs --seconds: how late the node's docker answers")
    seconds = float(params["seconds"])
    if not 0 < seconds <= 600:
        raise UserError(f"--seconds {seconds:g}: expected more than 0 and at most 600")
    return {"seconds": seconds}


SLOW_DOCKER = "docker"  # on a node with its own dockerd: a wrapper over the real CLI in the node's shim dir


def _slow_on(t: Target, params: dict[str, Any]) -> None:
    """A real dockerd's node: its `docker` (first on PATH) waits, then runs the real CLI. The shim's docker
    reads the fault itself."""
    if t.dir is not None and shim.load(t.root(), "node.json").get("dockerd"):
        wrapper = t.dir / "bin" / SLOW_DOCKER
        wrapper.write_text("#!/bin/sh\n# sparkfleet simulation: the daemon-slow fault\n"
                           f"sleep {float(params['seconds']):g}\nexec /usr/bin/docker \"$@\"\n")
        wrapper.chmod(0o755)


def _slow_off(t: Target, params: dict[str, Any]) -> None:
    if t.dir is not None and shim.load(t.root(), "node.json").get("dockerd"):
        (t.dir / "bin" / SLOW_DOCKER).unlink(missing_ok=True)


# unreadable-part: what the node's python3 may not open, per part of the facts helper (fleet/nodeside/facts.py)
UNREADABLE = {"mounts": ("/etc/mtab",), "listening": ("/proc/net/tcp",)}
UNREADABLE_PY = "python3"  # the wrapper in the node's shim dir (first on PATH), over /usr/bin/python3
UNREADABLE_DIR = "sim-unreadable"  # beside it: the sitecustomize.py the wrapper puts on PYTHONPATH
# An audit hook, not a chmod: the lab's nodes run as root (CAP_DAC_OVERRIDE reads any mode), and /proc/net is
# the kernel's. Only an open() of the listed paths fails, as the kernel fails an unreadable file.
UNREADABLE_SITE = """\
# sparkfleet simulation: the unreadable-part fault (sparkfleet/sim/faults.py)
import errno, os, sys
_DENIED = {denied!r}
def _deny(event, args):
    if event == "open" and args and isinstance(args[0], str) and args[0] in _DENIED:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), args[0])
sys.addaudithook(_deny)
"""


def _unreadable(root: Path, params: dict[str, Any]) -> dict[str, Any]:
    what = params.get("what", "mounts")
    if what not in UNREADABLE:
        raise UserError(f"unreadable-part --what {what}: expected one of {', '.join(UNREADABLE)}")
    return {"what": what, "paths": list(UNREADABLE[what])}


def _unreadable_on(t: Target, params: dict[str, Any]) -> None:
    assert t.dir is not None
    site = t.dir / "bin" / UNREADABLE_DIR
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(UNREADABLE_SITE.format(denied=set(params["paths"])))
    wrapper = t.dir / "bin" / UNREADABLE_PY
    wrapper.write_text("#!/bin/sh\n# sparkfleet simulation: the unreadable-part fault\n"
                       f"PYTHONPATH={node.SHIM_DIR}/{UNREADABLE_DIR}${{PYTHONPATH:+:$PYTHONPATH}} "
                       "exec /usr/bin/python3 \"$@\"\n")
    wrapper.chmod(0o755)


def _unreadable_off(t: Target, params: dict[str, Any]) -> None:
    assert t.dir is not None
    (t.dir / "bin" / UNREADABLE_PY).unlink(missing_ok=True)
    shutil.rmtree(t.dir / "bin" / UNREADABLE_DIR, ignore_errors=True)


APPLY: dict[str, Callable[[Path, dict[str, Any]], dict[str, Any]]] = {
    "slow-link": _slow_link, "mtu-mismatch": _mtu_mismatch, "driver-drift": _driver_drift,
    "clock-latch": _clock_latch, "slow-state": _nothing, "low-memory": _low_memory, "earlyoom-off": _nothing,
    "wrong-gid": _wrong_gid,
    "missing-mount-source": _missing_source, "cifs-model": _nothing, "port-taken": _port_taken,
    "unreachable": _nothing, "docker-down": _daemon("down"), "daemon-slow": _daemon_slow,
    "unreadable-part": _unreadable,
    **{k: _nothing for k in ENGINE_FAULTS},
    "slow-boot": _slow_boot,
    **{k: _rank_fault(k) for k in shim.RANK_FAULTS},
}

def _dockerd_stop(t: Target, params: dict[str, Any]) -> None:
    """docker-down on a node with its own dockerd: that daemon stops (its containers with it), as
    `systemctl stop docker` does; the docker CLI then fails as the real one does without its daemon."""
    if t.dir is not None and shim.load(t.root(), "node.json").get("dockerd"):
        dockerd.stop_daemon(t.dir)


def _dockerd_start(t: Target, params: dict[str, Any]) -> None:
    if t.dir is not None and shim.load(t.root(), "node.json").get("dockerd"):
        dockerd.start_daemon(t.dir, t.node)


# Faults that act on the running node (processes, sockets), run after the state is recorded / removed.
ACT: dict[str, Callable[[Target, dict[str, Any]], None]] = {
    "port-taken": _listen, "earlyoom-off": _earlyoom_stop, "slow-link": _tbf_on, "mtu-mismatch": _mtu_on,
    "docker-down": _dockerd_stop, "daemon-slow": _slow_on, "unreadable-part": _unreadable_on,
    **{k: (lambda t, p, k=k: _rank_act(t, p, k)) for k in shim.RANK_FAULTS}}
UNACT: dict[str, Callable[[Target, dict[str, Any]], None]] = {
    "port-taken": _unlisten, "earlyoom-off": _earlyoom_start, "slow-link": _tbf_off, "mtu-mismatch": _mtu_off,
    "docker-down": _dockerd_start, "daemon-slow": _slow_off, "rank-vanish": _rank_unact,
    "unreadable-part": _unreadable_off}
HEAL: dict[str, Callable[[Path, dict[str, Any]], Any]] = {
    "missing-mount-source": _unmissing_source, "port-taken": _unport_taken, "docker-down": _daemon("up"),
}


# -- power-cycle (FM-25 in its serving form): the node loses power and comes back --------------------------

POWER_OFF_S = 10.0  # sim input: how long a power-cycled node stays off unless --off says (a real boot: minutes)
BOOT_UPTIME_S = 41.87  # sim input: /proc/uptime's seconds once a power-cycled node answers again (at most the
# time it was off: the sim's node answers at once, so a short outage boots it when the power went)
POWER_EXIT_CODE = 255  # what `docker ps -a` shows for a container that was running when the host lost power
# (dockerd's restore finds no task for it and marks it stopped with exit status 255; no --restart on a lane)


def _power_cycle(root: Path, params: dict[str, Any]) -> dict[str, Any]:
    off = float(params.get("off", POWER_OFF_S))
    if not off >= 0:
        raise UserError(f"power-cycle --off {off:g}: expected 0 or more seconds before the node is back")
    return {"off": off, "off_at": time.time(), "back": False}


def _power_off(t: Target, params: dict[str, Any]) -> None:
    """Cut the power: every process of the node ends at once (its init and pid namespace: engines, sshd,
    earlyoom, dockerd); what lives in RAM is lost (/run, the page cache, runtime addresses); /nvme, /var
    and the rest of its disks are kept. A detached "power supply" boots it after --off seconds."""
    if t.dir is None or node.running_pid(t.dir) is None:
        raise UserError(f"{t.node} is not running: nothing to power-cycle")
    node.stop(t.dir)
    root = t.root()
    with shim.locked(root):
        _lose_ram(root)
        shim.render(root)
    if params["off"] > 0:
        supply = subprocess.Popen([sys.executable, "-m", "sparkfleet.sim.faults", "power-on", t.node,
                                   str(params["off"]), str(params["off_at"])], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        _set_power(root, supply=supply.pid)
    else:
        _boot(t.node, params["off_at"])


def _lose_ram(root: Path) -> None:
    """What a power loss takes from the node's state: tmpfs (/run), the page cache, `ip addr add` aliases,
    and the docker stand-in's running containers (dockerd marks them exited when it starts again)."""
    run = root / "run"
    if run.is_dir():
        for entry in run.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    (run / "sshd").mkdir(parents=True, exist_ok=True)  # systemd-tmpfiles makes sshd's privsep dir at boot
    (root / shim.STATE / "net.json").unlink(missing_ok=True)
    (root / shim.STATE / "init.ready").unlink(missing_ok=True)
    node_state = shim.load(root, "node.json")
    node_state["meminfo"]["cached_kb"] = round(values.MEM_CACHED_GIB * 1024 * 1024)
    shim.save(root, "node.json", node_state)
    if not (root / shim.STATE / "docker.json").is_file():
        return  # a real dockerd keeps its own state and does its own restore
    docker = shim.load(root, "docker.json")
    now = shim.state.rfc3339(time.time())
    kept = []
    for c in docker["containers"]:
        if c["State"]["Running"]:
            if c["HostConfig"].get("AutoRemove"):
                continue  # --rm: dockerd removes it on restore
            c["State"].update({"Status": "exited", "Running": False, "Pid": 0, "ExitCode": POWER_EXIT_CODE,
                               "FinishedAt": now})
            c["NetworkSettings"]["Ports"] = {}
        kept.append(c)
    docker["containers"] = kept
    shim.save(root, "docker.json", docker)


def _set_power(root: Path, **changes: Any) -> None:
    with shim.locked(root):
        faults = shim.load(root, "faults.json")
        if "power-cycle" in faults["faults"]:
            faults["faults"]["power-cycle"].update(changes)
            shim.save(root, "faults.json", faults)


def _boot(name: str, off_at: float) -> None:
    """Power the node on: its init again (earlyoom, sshd, its own dockerd) in the same network namespace, as
    `sim up` starts it; `off_at`: when its power went."""
    nd = paths.node_dir(name)
    if node.running_pid(nd) is not None:
        return
    root = paths.node_root(name)
    with shim.locked(root):  # its uptime counts from its boot: BOOT_UPTIME_S when it answers, none before the outage
        node_state = shim.load(root, "node.json")
        node_state["uptime"] = shim.uptime_state(min(BOOT_UPTIME_S, time.time() - off_at),
                                                 node_state["uptime"]["idle_per_s"])
        shim.save(root, "node.json", node_state)
        shim.render(root)
    manifest = json.loads(paths.manifest_path().read_text())
    info = manifest["nodes"][name].get("ssh")
    argv = [sshd.find_sshd() or "/usr/sbin/sshd", "-D", "-f", info["config"], "-E", info["log"]] if info else None
    daemon = manifest.get("docker") == "daemon"
    node.start(nd, name, netns=netlab.netns_name(name) if manifest.get("netns") else None, sshd=argv,
               dockerd=daemon)
    if info:
        sshd.wait_banner(name, info["host"], info["port"])
    if daemon:  # booted as `sim up` boots a node: once its own dockerd answers (it restores its containers)
        dockerd.wait_ready(nd, name)
    _set_power(paths.node_root(name), back=True, back_at=time.time(), supply=None)


def _power_on(t: Target, params: dict[str, Any]) -> None:
    """heal: the node is back at once (its power supply, if still waiting, is ended first)."""
    supply = params.get("supply")
    if supply and _is_supply(int(supply), t.node):
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(supply), signal.SIGTERM)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and _is_supply(int(supply), t.node):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(int(supply), os.WNOHANG)
            time.sleep(0.02)
    if t.dir is not None and node.running_pid(t.dir) is None:
        _boot(t.node, float(params["off_at"]))


def _is_supply(pid: int, name: str) -> bool:
    """Whether pid is still this node's power supply (pids get reused)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z" and b"power-on" in argv and name.encode() in argv


def _supply_main(argv: list[str]) -> int:
    """`python -m sparkfleet.sim.faults power-on NODE SECONDS OFF_AT`: the power comes back after SECONDS."""
    name, seconds, off_at = argv[1], float(argv[2]), float(argv[3])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    time.sleep(seconds)

    if paths.node_dir(name).is_dir():  # the lab may have been torn down meanwhile
        _boot(name, off_at)
    return 0


KINDS["power-cycle"] = Kind(
    "power-cycle", f"the node loses power: every process and container on it ends (containers: Exited "
    f"({POWER_EXIT_CODE})), /run, the page cache and runtime addresses are lost, /nvme is kept; it boots again "
    f"(sshd, earlyoom, uptime from 0) after --off seconds (default {POWER_OFF_S:g}), or at once on heal (FM-25)",
    ("off",))
APPLY["power-cycle"] = _power_cycle
ACT["power-cycle"] = _power_off
UNACT["power-cycle"] = _power_on


# -- node-lost: a worker node's power goes while it serves (added for vLLM's multi-node /health, issue 24) --------


def _power(t: Target, what: str) -> None:
    """`sim-fault node-lost|node-back` inside the node (sim/shim/faults.py POWER)."""
    if t.dir is None:
        return
    proc = node.run_in(t.dir, ["/usr/bin/python3", f"{node.SHIM_DIR}/sim-fault", what])
    if proc is None or proc.returncode != 0:
        raise UserError(f"{t.node}: sim-fault {what} failed: {proc.stderr.decode().strip() if proc else ''}")


def _node_lost(t: Target, params: dict[str, Any]) -> None:
    """The ranks stop dead first (docker there still says running), then the node drops off the network: no
    probe can read it, and its peers see no connection close."""
    _power(t, "node-lost")
    t.disconnect()


def _node_back(t: Target, params: dict[str, Any]) -> None:
    t.reconnect()
    _power(t, "node-back")


KINDS["node-lost"] = Kind("node-lost", "the node loses power while serving: its lane ranks stop dead (no process "
                          "exits, no connection closes) and it cannot be reached; heal: it is back, without them")
APPLY["node-lost"] = _nothing
ACT["node-lost"] = _node_lost
UNACT["node-lost"] = _node_back


# -- a silent boot (FM-42): the head logs nothing for a while, busy or idle -----------------------------------

SILENT_TUNE_S = 30.0  # the sim's default: long enough to outlast a short stall window, short for a test


def _silent_tune(root: Path, params: dict[str, Any]) -> dict[str, Any]:
    seconds = params.get("seconds")
    if seconds is not None and not float(seconds) > 0:
        raise UserError(f"silent-tune --seconds {seconds}: expected seconds above 0")
    return {"seconds": float(seconds if seconds is not None else SILENT_TUNE_S)}


KINDS.update({k.name: k for k in (
    Kind("silent-tune", "sim engine fault for the next launch on this node: after loading its weights the rank "
         "logs nothing for --seconds (default 30) while it keeps a CPU busy, as the Station's autotune does, then "
         "boots on (FM-42)", ("seconds",)),
    Kind("boot-stall", "sim engine fault for the next launch on this node: after loading its weights the rank "
         "logs nothing and uses no CPU until it is stopped (a hung boot, FM-42)"),
    Kind("bimodal", "sim engine fault for the next launch on this node: every other burst of requests (each time "
         "the engine goes from idle to busy) decodes 1.55x slower, as the seeds' C4 cell read 189 and 122 tok/s "
         "(FM-53)"),
)})
ENGINE_FAULTS = ENGINE_FAULTS | {"silent-tune", "boot-stall", "bimodal"}
APPLY.update({"silent-tune": _silent_tune, "boot-stall": _nothing, "bimodal": _nothing})


# -- blackhole: a node that only times out (issue 26's second kind of unreachable) ---------------------------

BLACKHOLE_IFACE = "mgmt0"  # the node's management link (netlab.create): its sshd's address
BLACKHOLE_RULES = (("INPUT", "-i"), ("OUTPUT", "-o"))  # what arrives on the link, and what leaves by it


def _blackhole(root: Path, params: dict[str, Any]) -> dict[str, Any]:
    _own_net(root, "blackhole")
    if shutil.which("iptables") is None:
        raise UserError("blackhole drops packets with iptables in the node's network namespace: install it "
                        "(apt-get install iptables)")
    return {"iface": BLACKHOLE_IFACE}


def _drop_on(t: Target, params: dict[str, Any]) -> None:
    """Every packet on the node's management link dropped, both ways, inside the node's namespace: a SYN to
    its sshd gets no answer at all (no RST, no ICMP, as `unreachable`'s stopped sshd gives), so a connect
    only times out; an open connection hangs. (`ip route blackhole` fails local senders at once instead.)"""
    added = []
    try:
        for chain, way in BLACKHOLE_RULES:
            _netns_run(t, "iptables", "-w", "-A", chain, way, params["iface"], "-j", "DROP")
            added.append((chain, way))
    except UserError:
        for chain, way in added:  # nothing of a fault that did not take is left
            _netns_run(t, "iptables", "-w", "-D", chain, way, params["iface"], "-j", "DROP")
        _drop_fault(t, "blackhole")
        raise


def _drop_off(t: Target, params: dict[str, Any]) -> None:
    for chain, way in BLACKHOLE_RULES:
        _netns_run(t, "iptables", "-w", "-D", chain, way, params["iface"], "-j", "DROP")


KINDS["blackhole"] = Kind(
    "blackhole", f"every packet on the node's management link ({BLACKHOLE_IFACE}) is dropped both ways (iptables "
    "DROP in the node's namespace; ssh mode as root): a connect to its sshd gets no answer and only times out "
    "(FM-25, a node lost without a refusal)")
APPLY["blackhole"] = _blackhole
ACT["blackhole"] = _drop_on
UNACT["blackhole"] = _drop_off


# -- clock-skew (FM-40's Station clock): the node's own wall clock is off -------------------------------------

CLOCK_SKEW_S = -300.0  # sim input: the default skew, 5 minutes behind (the seeds give no figure)


def _clock_skew(root: Path, params: dict[str, Any]) -> dict[str, Any]:
    seconds = float(params.get("seconds", CLOCK_SKEW_S))
    if seconds == 0 or abs(seconds) > 10 * 365 * 86400:
        raise UserError(f"clock-skew --seconds {seconds:g}: expected a skew other than 0 (negative: the node's "
                        "clock is behind), of at most ten years")
    clock.build(root.parent / "bin")  # before render names it in the node's /etc/ld.so.preload
    return {"seconds": seconds}


KINDS["clock-skew"] = Kind(
    "clock-skew", f"the node's wall clock is --seconds off (default {CLOCK_SKEW_S:g}: behind): `date`, every "
    "program's time and the times on its files read the node's clock, not the controller's (Go programs such "
    "as dockerd excepted: sim/clock.c)", ("seconds",))
APPLY["clock-skew"] = _clock_skew


def _clock_unbuilt(t: Target, params: dict[str, Any]) -> None:
    """heal: the node's bin dir as it was (the library goes once /etc/ld.so.preload no longer names it)."""
    if t.dir is not None:
        (t.dir / "bin" / clock.LIBRARY).unlink(missing_ok=True)


UNACT["clock-skew"] = _clock_unbuilt


if __name__ == "__main__":
    sys.exit(_supply_main(sys.argv[1:]))
