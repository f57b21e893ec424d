"""Link facts, the stack's versions and file hashes from the node-side facts helper (issue 15).

The interfaces are real: a network namespace of this test's own (unique name) with veth pairs, the
helper run inside it with `ip netns exec`, which mounts that namespace's own /sys. RDMA ports have no
stand-in on this machine, so the port part reads a hand-built tree through the module's IB path.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sparkfleet.fleet.nodefacts import NodeFacts
from tests.test_nodeside_facts import HELPER, PYTHON3

needs_netns = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                                 reason="network namespaces need root and iproute2")


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def netns():
    name = f"sf-facts-{os.getpid()}"
    ip("netns", "add", name)
    try:
        ip("-n", name, "link", "add", "fab0", "type", "veth", "peer", "name", "fab1")
        ip("-n", name, "link", "add", "dn0", "type", "veth", "peer", "name", "dn1")
        ip("-n", name, "link", "set", "fab0", "mtu", "9000")
        ip("-n", name, "link", "set", "fab1", "mtu", "9000")
        for dev in ("fab0", "fab1", "dn1"):
            ip("-n", name, "link", "set", dev, "up")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


def helper_in(ns: str, request: dict, bin_dir: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "SPARKFLEET_SIM_ROOT"}
    env["PATH"] = f"{bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin"
    p = subprocess.run(["ip", "netns", "exec", ns, PYTHON3, str(HELPER)], input=json.dumps(request),
                       capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@needs_netns
def test_links_of_the_named_interfaces(netns: str, tmp_path: Path) -> None:
    data = helper_in(netns, {"node": "n1", "interfaces": ["fab0", "dn0", "eth9"]}, tmp_path)
    f = NodeFacts.model_validate(data)
    assert list(f.links) == ["fab0", "dn0", "eth9"]
    up, down, missing = f.links["fab0"], f.links["dn0"], f.links["eth9"]
    assert (up.exists, up.operstate, up.carrier, up.mtu) == (True, "up", 1, 9000)
    assert up.speed_mbps == 10000  # a veth reports 10000 (TESTBED.md)
    assert {"rx_errors", "tx_errors", "rx_dropped", "tx_dropped", "carrier_changes"} <= set(up.counters)
    # dn0 was never set up: operstate down, and the kernel will not say carrier or speed
    assert (down.exists, down.operstate, down.carrier, down.speed_mbps, down.mtu) == (True, "down", None, None, 1500)
    assert missing.exists is False and missing.operstate is None


def test_versions_and_hashes(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\n[ $# -eq 0 ] && echo '| NVIDIA-SMI 580.95.05    Driver Version: 580.95.05"
                   "    CUDA Version: 13.0     |' && exit 0\nexit 0\n")
    dock = bin_dir / "docker"
    dock.write_text("#!/bin/sh\ncase \"$1\" in ps) exit 0;; images) exit 0;; version) echo 28.3.3;; esac\n")
    smi.chmod(0o755)
    dock.chmod(0o755)
    patch = tmp_path / "patch.py"
    patch.write_bytes(b"print('patched')\n")
    env = {k: v for k, v in os.environ.items() if k != "SPARKFLEET_SIM_ROOT"}
    env["PATH"] = f"{bin_dir}:/usr/bin:/bin"
    req = {"node": "n", "hash_paths": [str(patch), str(tmp_path / "absent.py")]}
    p = subprocess.run([PYTHON3, str(HELPER)], input=json.dumps(req), capture_output=True, text=True, env=env,
                       timeout=60)
    f = NodeFacts.model_validate_json(p.stdout)
    assert f.versions is not None
    with open("/proc/sys/kernel/osrelease") as fh:
        assert f.versions.kernel == fh.read().strip()
    assert (f.versions.driver, f.versions.cuda, f.versions.docker) == ("580.95.05", "13.0", "28.3.3")
    assert f.hashes == {str(patch): hashlib.sha256(b"print('patched')\n").hexdigest(),
                        str(tmp_path / "absent.py"): None}


def test_rdma_port_link_layer_rate_and_counters(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("sparkfleet_nodeside_facts_fabric", HELPER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    port = tmp_path / "rocep1s0f0/ports/1"
    (port / "counters").mkdir(parents=True)
    (port / "link_layer").write_text("Ethernet\n")
    (port / "phys_state").write_text("5: LinkUp\n")
    (port / "rate").write_text("200 Gb/sec (4X HDR)\n")
    (port / "counters/symbol_error").write_text("0\n")
    (port / "counters/link_downed").write_text("3\n")
    mod.IB = str(tmp_path)
    assert mod.rdma_link("rocep1s0f0", 1) == {"link_layer": "Ethernet", "phys_state": "LinkUp",
                                              "rate": "200 Gb/sec (4X HDR)",
                                              "counters": {"symbol_error": 0, "link_downed": 3}}
    assert mod.rdma_link("absent", 1) == {"link_layer": None, "phys_state": None, "rate": None, "counters": {}}


def test_carrier_changes_is_read_where_the_kernel_keeps_it(tmp_path: Path) -> None:
    """/sys/class/net/IFACE/carrier_changes, beside statistics/ (the kernel's Documentation/ABI/testing/
    sysfs-class-net); issue 39: it was read from statistics/, where no kernel has it, and never reported."""
    spec = importlib.util.spec_from_file_location("sparkfleet_nodeside_facts_carrier", HELPER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    iface = tmp_path / "enp1s0f0np0"
    (iface / "statistics").mkdir(parents=True)
    (iface / "operstate").write_text("up\n")
    (iface / "statistics/rx_errors").write_text("0\n")
    (iface / "carrier_changes").write_text("7\n")
    mod.NET = str(tmp_path)
    assert mod.net_link("enp1s0f0np0")["counters"] == {"rx_errors": 0, "carrier_changes": 7}
