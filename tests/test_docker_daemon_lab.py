"""`up` and `down` where every node runs its own real Docker daemon (Debian's dockerd inside the node's root
and network namespace; sim up --docker daemon): what Docker itself refuses reaches the operator, and
`sim down` leaves nothing of the daemons on this machine.

SIMULATION: the sim engine stands in for vLLM inside the real containers. Needs root and docker.io.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from sparkfleet.schema.errors import UserError
from sparkfleet.sim import dockerd, lab
from tests.cli_run import LAB_NODES, findings, lane_containers, result, run, steps
from tests.conftest import engram_copies

# Without root there is no daemon to meet (skipped); as root in CI a missing docker.io is a failure.
pytestmark = pytest.mark.skipif(os.geteuid() != 0 or (bool(dockerd.missing()) and not os.environ.get("CI")),
                                reason="a real dockerd per node needs " + "; ".join(dockerd.missing()))

# the containers, not the links (test_fabric_sim's): under load the fabric probe's 48 KB round trips can fail a
# healthy veth and stop up before the launch these tests are about
UP = ("up", "--profile", "dcp2", "--inventory", "sim", "--gates", "models,count100", "--poll", "0.2",
      "--probe-seconds", "1", "--no-fabric-probe")


def daemons() -> list[str]:
    """dockerd and containerd processes on this machine (their command lines name no node dir)."""
    out = subprocess.run(["pgrep", "-a", "-x", "dockerd|containerd|containerd-shim-runc-v2"], capture_output=True,
                         text=True).stdout
    return out.splitlines()


def host_traces() -> dict[str, object]:
    """What a dockerd started by hand leaves on this machine (/etc/docker/key.json, a `docker` cgroup in
    each hierarchy), the lab's cgroup parents, and the mounts: none of it may change across the lab."""
    cgroups = sorted(str(p) for p in Path("/sys/fs/cgroup").glob("*/**/docker")
                     if p.is_dir()) if Path("/sys/fs/cgroup").is_dir() else []
    return {"etc": sorted(os.listdir("/etc")), "etc/docker": sorted(os.listdir("/etc/docker"))
            if os.path.isdir("/etc/docker") else None, "docker cgroups": cgroups,
            "lab cgroups": [str(d) for n in (*LAB_NODES, "station") for d in
                            dockerd.cgroup_dirs(dockerd.cgroup_parent(n))],
            "mounts": sorted(Path("/proc/self/mountinfo").read_text().splitlines())}


def test_a_daemon_that_does_not_come_up_fails_sim_up_naming_the_node_and_its_log(tmp_path, monkeypatch):
    """reddie's dockerd cannot start (its data-root is a file: dockerd refuses it and exits): `sim up` names
    the node and the last line dockerd logged, and tears everything down: no lab dir, daemon, cgroup or
    mount is left. The bound is lowered to 3 s so the test does not wait the full READY_TIMEOUT_S."""
    from sparkfleet.sim import sandbox

    monkeypatch.setenv("SPARKFLEET_STATE", str(tmp_path / "state"))
    monkeypatch.setattr(dockerd, "READY_TIMEOUT_S", 3.0)
    real_build = sandbox.build_node

    def broken_data_root(node_dir, *args, **kwargs):
        real_build(node_dir, *args, **kwargs)
        if node_dir.name == "reddie":
            (node_dir / "fs" / "var" / "lib" / "docker").write_text("not a directory\n")

    monkeypatch.setattr(sandbox, "build_node", broken_data_root)
    before, traces = daemons(), host_traces()
    try:
        with pytest.raises(UserError) as exc:
            lab.up("lab", transport="ssh", docker="daemon")
    finally:
        lab.down()  # if it came up after all, leave no lab for the next test
    assert re.fullmatch(r"simulated node reddie: its Docker daemon did not come up within 3 s: .*/var/lib/docker.*",
                        str(exc.value)), str(exc.value)
    assert not (tmp_path / "state" / "sim").exists()
    assert daemons() == before and host_traces() == traces


@pytest.fixture(scope="module")
def dsim(tmp_path_factory):
    state = tmp_path_factory.mktemp("state")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPARKFLEET_STATE", str(state))
        before, traces = daemons(), host_traces()
        s = lab.up("lab", transport="ssh", docker="daemon")
        try:
            engram_copies(s)
            yield s
        finally:
            lab.down()
        assert daemons() == before
        assert host_traces() == traces
        assert not state.joinpath("sim").exists()


def docker(sim, node: str, *argv: str) -> subprocess.CompletedProcess:
    return sim.exec(node, ["docker", *argv])


def test_up_serves_in_real_containers_and_down_removes_them(dsim, capsys):
    code, events = run(capsys, *UP)
    assert code == 0, result(events)
    running = lane_containers(dsim, "dcp2")
    assert {n: [c["State"]["Status"] for c in cs] for n, cs in running.items()} == {n: ["running"] for n in LAB_NODES}
    c = running["asusi"][0]
    # dockerd's own record of the launch: what the lane asked for, as the real daemon parsed it
    assert c["HostConfig"]["Ulimits"] == [{"Name": "memlock", "Hard": -1, "Soft": -1}]
    assert c["HostConfig"]["NetworkMode"] == "host" and c["HostConfig"]["IpcMode"] == "host"
    assert [d["PathOnHost"] for d in c["HostConfig"]["Devices"]] == ["/dev/infiniband"]
    assert c["HostConfig"]["DeviceRequests"][0]["Capabilities"] == [["gpu"]]
    assert c["HostConfig"]["Runtime"] == "nvidia"
    # every rank runs the same image id (one archive loaded on every node)
    assert len({cs[0]["Image"] for cs in running.values()}) == 1
    logs = docker(dsim, "reddie", "logs", "sf-dcp2-r0").stdout.decode() + \
        docker(dsim, "reddie", "logs", "sf-dcp2-r0").stderr.decode()
    assert "Starting vLLM API server" in logs or "Application startup complete" in logs, logs[-2000:]
    code, events = run(capsys, "down", "--profile", "dcp2", "--inventory", "sim")
    assert code == 0, result(events)
    assert lane_containers(dsim, "dcp2") == {n: [] for n in LAB_NODES}


def test_a_name_docker_holds_fails_the_launch_naming_node_and_conflict(dsim, capsys):
    """A container the operator started by hand under a rank's name (no sparkfleet labels: never touched):
    the real daemon refuses the rank's `docker run` (125, Conflict); `up` fails naming the node and
    Docker's words, stops the ranks it started, and leaves the foreign container as it was."""
    made = docker(dsim, "asusi", "run", "-d", "--name", "sf-dcp2-r1", "--entrypoint", "python3",
                  "aidendle94/sparkrun-vllm-dsv41-gb10:production-1.2", "-c", "import time; time.sleep(600)")
    assert made.returncode == 0, made.stderr
    foreign = made.stdout.decode().strip()
    try:
        code, events = run(capsys, *UP)
        assert code != 0
        text = json.dumps(events)
        assert re.search(r'Conflict\. The container name \\"/sf-dcp2-r1\\" is already in use', text), text[-3000:]
        assert "asusi" in result(events)["reason"] or any(f.get("node") == "asusi"
                                                          for s in steps(events) for f in findings(events, s))
        assert {n: [c["State"]["Status"] for c in cs if c["State"]["Status"] == "running"]
                for n, cs in lane_containers(dsim, "dcp2").items()} == {n: [] for n in LAB_NODES}
        still = json.loads(docker(dsim, "asusi", "inspect", foreign).stdout)
        assert still[0]["State"]["Status"] == "running" and still[0]["Name"] == "/sf-dcp2-r1"
    finally:
        docker(dsim, "asusi", "rm", "-f", foreign)
        run(capsys, "down", "--profile", "dcp2", "--inventory", "sim")


def test_a_flag_docker_refuses_fails_the_launch_with_dockers_words(dsim, capsys):
    """An option value only Docker's own parser judges (`--ulimit memlock=lots`): the CLI exits 125 with
    its message, and `up` reports it for the rank, launching nothing."""
    code, events = run(capsys, *UP, "-o", "docker.--ulimit=[memlock=lots]")
    assert code != 0
    text = json.dumps(events)
    assert "invalid argument" in text and "memlock=lots" in text, text[-3000:]
    launch = [s for s in steps(events) if s.startswith("launch")]
    assert launch and any(steps(events)[s] == "fail" for s in launch), steps(events)
    assert {n: [c["State"]["Status"] for c in cs if c["State"]["Status"] == "running"]
            for n, cs in lane_containers(dsim, "dcp2").items()} == {n: [] for n in LAB_NODES}
    run(capsys, "down", "--profile", "dcp2", "--inventory", "sim")


IMAGE = "aidendle94/sparkrun-vllm-dsv41-gb10:production-1.2"  # dcp2's image (profiles/production-1.2.yaml)


def registry_digest(ref: str) -> str:
    """The manifest digest the lab's registry serves for a Docker Hub ref (its Docker-Content-Digest), asked over
    the registry's HTTP API, not through any node's Docker."""
    import urllib.request

    from sparkfleet.sim import registry

    path, _, tag = registry.hub_path(ref).rpartition(":")
    req = urllib.request.Request(f"http://{registry.address()}/v2/{path}/manifests/{tag}", method="HEAD",
                                 headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"})
    with urllib.request.urlopen(req, timeout=10) as r:  # noqa: S310 - the lab's own registry
        return r.headers["Docker-Content-Digest"]


def test_every_node_pulled_the_lab_images_through_the_registry(dsim):
    """The nodes' RepoDigests are the digest the lab's registry serves (pulled through the Docker Hub mirror),
    the same on every rank; an image of another registry (ghcr.io) is loaded only and has none."""
    digest = registry_digest(IMAGE)
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), digest
    for n in LAB_NODES:
        got = json.loads(docker(dsim, n, "image", "inspect", "-f", "{{json .RepoDigests}}", IMAGE).stdout)
        assert got == [f"aidendle94/sparkrun-vllm-dsv41-gb10@{digest}"], (n, got)
    other = docker(dsim, "station", "image", "inspect", "-f", "{{json .RepoDigests}}", "ghcr.io/ggml-org/llama.cpp:full")
    assert json.loads(other.stdout) == [], other


def test_a_pinned_digest_serves_and_a_wrong_one_is_refused_before_launch(dsim, capsys):
    """image.digest pinned to the registry's digest: the check passes on every rank and the real dockerds run
    `ref@digest`. Pinned to another digest (a re-pushed tag, FM-13): `up` fails at the check naming each rank's
    digest and the pin, and starts nothing."""
    digest = registry_digest(IMAGE)
    code, events = run(capsys, *UP, "-o", f"image.digest={digest}")
    assert code == 0, result(events)
    ok = [(f.get("node"), f["message"]) for f in findings(events, "check") if f["check"] == "image"]
    assert sorted(ok) == [(n, f"image {IMAGE} present with the pinned digest") for n in sorted(LAB_NODES)]
    running = lane_containers(dsim, "dcp2")
    assert {n: [c["Config"]["Image"] for c in cs] for n, cs in running.items()} == \
        {n: [f"{IMAGE}@{digest}"] for n in LAB_NODES}
    code, events = run(capsys, "down", "--profile", "dcp2", "--inventory", "sim")
    assert code == 0, result(events)
    wrong = "sha256:" + "0" * 64
    code, events = run(capsys, *UP, "-o", f"image.digest={wrong}")
    assert code == 1, result(events)
    bad = [(f.get("node"), f["message"]) for f in findings(events, "check") if f["check"] == "image"]
    assert sorted(bad) == [(n, f"image {IMAGE} on rank {LAB_NODES.index(n)} ({n}) is not the pinned one: it has "
                               f"{digest}, the profile pins {wrong}") for n in sorted(LAB_NODES)]
    assert "launch:workers" not in steps(events) and lane_containers(dsim, "dcp2") == {n: [] for n in LAB_NODES}


def test_sim_exec_runs_inside_the_node(dsim):
    r = dsim.exec("bluey", ["sh", "-c", "hostname; docker info --format '{{.Name}} {{.DefaultRuntime}}'"])
    assert r.stdout.decode().split("\n")[:2] == ["bluey", "bluey nvidia"], r


def test_a_daemon_slower_than_the_facts_bound_is_reported_for_that_node(dsim, capsys):
    """daemon-slow past the facts helper's docker bound (DOCKER_TIMEOUT_S): `facts` says so for that node,
    within the bound, and the other nodes' docker is read as usual."""
    from sparkfleet.cli.main import main
    from sparkfleet.fleet.nodeside.facts import DOCKER_TIMEOUT_S

    dsim.fault("bluey", "daemon-slow", seconds=DOCKER_TIMEOUT_S + 2)
    try:
        main(["facts", "--inventory", "sim", "--node", "bluey,asusi", "--json"])
        out = json.loads(capsys.readouterr().out)
    finally:
        dsim.heal("bluey", "daemon-slow")
    text = json.dumps(out)
    assert f"timed out after {DOCKER_TIMEOUT_S:g} s" in text, text[:3000]
    ok = docker(dsim, "bluey", "version", "--format", "{{.Server.Version}}")
    assert ok.returncode == 0  # healed: the real CLI, at once
