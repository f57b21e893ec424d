"""Node operations (sparkfleet/fleet/ops/): exact commands, and parsers fed the real tools' output.

The outputs below are in the formats the real tools print (sources in the modules' docstrings): docker
CLI 27's `ps -q --no-trunc`, `inspect` (a JSON array; `Error: No such object: ID` on stderr, exit 1),
`logs`, the daemon-down and socket-permission messages, and bash's `command not found` (exit 127).
The shell parts of the log command run in a real bash against a `docker` on PATH that answers as the
real CLI does.
"""

from __future__ import annotations

import json
import subprocess
from types import SimpleNamespace

import pytest

from sparkfleet.fleet import ops as c
from sparkfleet.fleet.nodeside.engram_copy import MANIFEST
from sparkfleet.fleet.transport import Result, RunEachByRun
from sparkfleet.naming import ENGRAM_MANIFEST
from sparkfleet.runner.ops import NodeCommands

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

ID1 = "4f66ad9a0b2e1b6d8a8c3c7f1f0b8a1e5d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a"
ID2 = "9c1b7e4d2a3f5e6d7c8b9a0f1e2d3c4b5a69788796a5b4c3d2e1f0a9b8c7d6e5"
DAEMON_DOWN = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"
SOCKET_DENIED = ("permission denied while trying to connect to the Docker daemon socket at "
                 "unix:///var/run/docker.sock: Get \"http://%2Fvar%2Frun%2Fdocker.sock/v1.47/containers/json\": "
                 "dial unix /var/run/docker.sock: connect: permission denied")


def inspect_doc(cid: str, name: str, status: str, code: int = 0, error: str = "") -> dict:
    """A container as `docker inspect` prints it (the fields read here and some neighbours)."""
    return {"Id": cid, "Created": "2026-12-01T09:30:01.123456789Z", "Path": "vllm", "Args": ["serve"],
            "State": {"Status": status, "Running": status == "running", "Paused": False, "Restarting": False,
                      "OOMKilled": False, "Dead": status == "dead", "Pid": 4242 if status == "running" else 0,
                      "ExitCode": code, "Error": error, "StartedAt": "2026-12-01T09:30:01.5Z",
                      "FinishedAt": "0001-01-01T00:00:00Z"},
            "Name": f"/{name}", "RestartCount": 0, "Config": {"Labels": {"sparkfleet.profile": "dcp2"}}}


def test_lane_containers_by_label_only() -> None:
    lane = c.LaneContainers("dcp2")
    assert lane.command() == "docker ps -a -q --no-trunc --filter label=sparkfleet.profile=dcp2"
    assert c.LaneContainers("dcp2", running_only=True).command() == (
        "docker ps -q --no-trunc --filter label=sparkfleet.profile=dcp2")
    assert c.LaneContainers("x y").command() == "docker ps -a -q --no-trunc --filter 'label=sparkfleet.profile=x y'"
    assert c.LaneContainers("dcp2", run_id="r1").command() == (
        "docker ps -a -q --no-trunc --filter label=sparkfleet.profile=dcp2 --filter label=sparkfleet.run=r1")
    assert lane.parse(Result("n", True, stdout=f"{ID1}\n{ID2}\n", exit_code=0)) == [ID1, ID2]
    assert lane.parse(Result("n", True, stdout="", exit_code=0)) == []
    assert not lane.changes


def test_inspect_states_and_a_vanished_container() -> None:
    out = json.dumps([inspect_doc(ID1, "sf-dcp2-r1", "running"), inspect_doc(ID2, "sf-dcp2-r2", "exited", 137)],
                     indent=4)
    both = c.Inspect(((ID1, "sf-dcp2-r1"), (ID2, "sf-dcp2-r2")))
    assert both.command() == f"docker inspect {ID1} {ID2}" and not both.changes
    got = both.parse(Result("n", True, stdout=out, exit_code=0))
    assert got == {ID1: c.ContainerState("running", 0), ID2: c.ContainerState("exited", 137)}
    # one of two gone: exit 1, the found one still printed, the other named on stderr
    res = Result("n", False, stdout=json.dumps([inspect_doc(ID1, "sf-dcp2-r1", "running")]),
                 stderr=f"Error: No such object: {ID2}\n", exit_code=1, error="exit")
    assert both.parse(res) == {
        ID1: c.ContainerState("running", 0), ID2: c.ContainerState("missing")}
    # the only one gone: `[]` on stdout
    res = Result("n", False, stdout="[]\n", stderr=f"Error: No such object: {ID2}\n", exit_code=1, error="exit")
    assert c.Inspect(((ID2, "sf-dcp2-r2"),)).parse(res) == {ID2: c.ContainerState("missing")}
    # a short id the launch printed matches the full id docker reports
    res = Result("n", True, stdout=json.dumps([inspect_doc(ID1, "x", "created")]), exit_code=0)
    assert c.Inspect(((ID1[:12], "sf-dcp2-r1"),)).parse(res) == {ID1[:12]: c.ContainerState("created", 0)}


@pytest.mark.parametrize("stderr, code, kind, says", [
    (DAEMON_DOWN, 1, "docker-down", "the docker daemon is not running"),
    (SOCKET_DENIED, 1, "permission", "no access to the docker socket"),
    ("bash: line 1: docker: command not found", 127, "missing-binary", "docker is not installed on the node"),
    ("sh: 1: docker: not found", 127, "missing-binary", "docker is not installed on the node"),
])
def test_a_command_that_ran_and_failed_is_not_reach(stderr: str, code: int, kind: str, says: str) -> None:
    res = Result("bluey", False, stdout="[]\n" if "docker" in stderr else "", stderr=stderr + "\n", exit_code=code,
                 error="exit")
    for err in (c.classify(res), c.Inspect(((ID1, "a"),)).parse(res), c.LaneContainers("dcp2").parse(res)):
        assert isinstance(err, c.NodeError)
        assert (err.node, err.kind) == ("bluey", kind) and err.message.startswith(says)
        assert err.remedy == c.REMEDIES[kind]
    (f,) = c.failures({"bluey": res})
    assert (f.check, f.status, f.node) == (kind, "fail", "bluey")


def test_an_unanswering_node_is_reach() -> None:
    res = Result("bluey", False, error="unreachable", message="bluey (10.0.0.3:22): connection refused")
    err = c.classify(res)
    assert err == c.NodeError("bluey", "reach", "bluey (10.0.0.3:22): connection refused", c.REMEDIES["reach"])


def run_bash(tmp_path, docker_script: str, command: str) -> subprocess.CompletedProcess:
    (tmp_path / "docker").write_text("#!/bin/sh\n" + docker_script)
    (tmp_path / "docker").chmod(0o755)
    p = subprocess.run(["bash", "-c", command], capture_output=True, env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    # decoded as the transports decode (fleet/local.py): text=True's universal newlines would turn `\r` into `\n`
    return subprocess.CompletedProcess(p.args, p.returncode, p.stdout.decode(), p.stderr.decode())


def as_result(p: subprocess.CompletedProcess) -> Result:
    return Result("n", p.returncode == 0, p.stdout, p.stderr, p.returncode, None if p.returncode == 0 else "exit")


def read(tmp_path, docker_script: str, seen: int) -> list[str] | c.NodeError:
    op = c.Logs(ID1, seen)
    assert not op.changes
    return op.parse(as_result(run_bash(tmp_path, docker_script, op.command())))


def test_logs_since_keeps_stderr_lines_and_counts_from_the_last_seen(tmp_path) -> None:
    # the engine writes to both streams; `docker logs` passes them on as two streams
    script = 'echo "INFO started"; echo "WARNING odd" >&2; echo "INFO loaded"; exit 0\n'
    assert read(tmp_path, script, 0) == [
        "INFO started", "WARNING odd", "INFO loaded"]
    assert read(tmp_path, script, 2) == ["INFO loaded"]
    assert read(tmp_path, script, 3) == []
    assert read(tmp_path, "exit 0\n", 0) == []


def test_logs_errors_are_errors_never_log_lines(tmp_path) -> None:
    gone = f'echo "Error response from daemon: No such container: {ID1}" >&2; exit 1\n'
    err = read(tmp_path, gone, 40)
    assert err == c.NodeError("n", "no-such-container", f"docker logs: no such container {ID1}", "")
    down = f'echo "{DAEMON_DOWN}" >&2; exit 1\n'
    err = read(tmp_path, down, 0)
    assert isinstance(err, c.NodeError) and err.kind == "docker-down"
    assert err.message == f"docker logs failed: the docker daemon is not running: {DAEMON_DOWN}"


def test_stop_rail2_and_drop_caches() -> None:
    assert c.Stop((ID1, ID2)).command() == f"docker rm -f {ID1} {ID2}"
    assert c.Stop((ID1,), remove=False).command() == f"docker stop {ID1}"
    add = c.Rail2Alias("192.168.193.11/24", "enP2p1s0f0np0", add=True)
    assert add.command() == (
        "ip addr del 192.168.193.11/24 dev enP2p1s0f0np0 2>/dev/null; ip addr add 192.168.193.11/24 dev enP2p1s0f0np0")
    assert c.Rail2Alias("192.168.193.11/24", "enP2p1s0f0np0", add=False).command() == (
        "ip addr del 192.168.193.11/24 dev enP2p1s0f0np0 2>/dev/null || true")
    drop = c.DropCaches()
    assert drop.command() == "sync && sysctl -q -w vm.drop_caches=3"
    assert drop.parse(Result("n", True, exit_code=0)) is True
    denied = "sysctl: permission denied on key \"vm.drop_caches\""
    assert drop.parse(Result("n", False, stderr=denied + "\n", exit_code=255, error="exit")) == denied
    assert drop.parse(Result("n", False, error="unreachable")) is None
    assert c.Stop((ID1,)).changes and add.changes and drop.changes
    busy = Result("n", False, stderr=DAEMON_DOWN + "\n", exit_code=1, error="exit")
    assert c.Stop((ID1,)).parse(busy).kind == "docker-down" and c.Stop((ID1,)).parse(Result("n", True)) is None


def test_operations_make_one_node_commands_that_changes_when_any_does() -> None:
    reads = c.on("list", {"a": c.LaneContainers("dcp2"), "b": c.ReadFile("/x y")}, 30)
    assert (reads.what, reads.commands, reads.changes, reads.timeout_s, reads.serial) == (
        "list", {"a": "docker ps -a -q --no-trunc --filter label=sparkfleet.profile=dcp2", "b": "cat '/x y'"},
        False, 30, False)
    mixed = c.on("stop", {"a": c.ReadFile("/x"), "b": c.Stop((ID1,))}, 120, serial=True)
    assert mixed.changes and mixed.serial and mixed.commands["b"] == f"docker rm -f {ID1}"


def test_a_rank_s_start_reads_the_container_id_docker_run_printed_else_its_name() -> None:
    start = c.StartRank("docker pull -q img >/dev/null\ndocker run -d --name sf-dcp2-r0 img\n", "sf-dcp2-r0")
    assert start.command() == "docker pull -q img >/dev/null\ndocker run -d --name sf-dcp2-r0 img\n" and start.changes
    assert start.parse(Result("n", True, stdout=f"Unable to find image locally\n{ID1}\n")) == ID1
    assert start.parse(Result("n", True, stdout="")) == "sf-dcp2-r0"
    assert start.parse(Result("n", False, stderr=DAEMON_DOWN + "\n", exit_code=125, error="exit")).kind == "docker-down"
    env = c.on("start rank(s) 0", {"a": start}, 300, env={"VLLM_API_KEY": "k"}, files={"a": {"/x": "y"}})
    assert (env.env, env.files, env.changes, env.timeout_s) == ({"VLLM_API_KEY": "k"}, {"a": {"/x": "y"}}, True, 300)
    ready = c.ReadyCheck("(: </dev/tcp/10.0.0.2/50052) 2>/dev/null")
    assert ready.command() == "(: </dev/tcp/10.0.0.2/50052) 2>/dev/null" and ready.parse(Result("n", True)) is None
    assert ready.parse(Result("n", False, stderr="rpc-server does not accept\n", exit_code=1, error="exit")).kind == \
        "failed"


def test_the_one_name_of_the_engram_manifest() -> None:
    assert MANIFEST == ENGRAM_MANIFEST  # the node-side copier is stdlib-only and spells it itself


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict]] = []

    def emit(self, event: str, **data) -> None:
        self.seen.append((event, data))


class Transport(RunEachByRun):
    def __init__(self) -> None:
        self.ran: list[str] = []

    def run(self, nodes, command, **kw):
        self.ran.append(command)
        return {n.name: Result(n.name, True, stdout="", exit_code=0) for n in nodes}


def test_dry_run_prints_every_command_and_runs_none_or_only_reads() -> None:
    """--dry-run: every command shown, none run; --dry-run=facts: only the read-only ones run."""
    from sparkfleet.fleet.op import Executor, shown_as

    def a_step():
        listed = yield NodeCommands("list", {"a": "docker ps -q", "b": "docker ps -q"}, changes=False)
        done = yield NodeCommands("stop", {"a": "docker rm -f x", "b": "docker rm -f 'y z'"})
        return f"listed {sorted(listed) if listed else listed}, stopped {done}"

    nodes = {n: SimpleNamespace(name=n) for n in "ab"}

    def executor(dry_run: bool, reads: bool = False) -> tuple[Executor, Events, Transport]:
        events, transport = Events(), Transport()
        return Executor(transport, nodes, dry_run=dry_run, reads=reads, show=shown_as(events.emit)), \
            events, transport

    ex, events, transport = executor(dry_run=True)
    assert ex.drive(a_step()) == "listed None, stopped None"
    assert transport.ran == []
    assert events.seen == [("would", {"what": "list", "node": "a", "command": "docker ps -q"}),
                           ("would", {"what": "list", "node": "b", "command": "docker ps -q"}),
                           ("would", {"what": "stop", "node": "a", "command": "docker rm -f x"}),
                           ("would", {"what": "stop", "node": "b", "command": "docker rm -f 'y z'"})]
    ex, events, transport = executor(dry_run=True, reads=True)
    assert ex.drive(a_step()) == "listed ['a', 'b'], stopped None"
    assert transport.ran == ["docker ps -q"]
    assert events.seen == [("would", {"what": "stop", "node": "a", "command": "docker rm -f x"}),
                           ("would", {"what": "stop", "node": "b", "command": "docker rm -f 'y z'"})]
    ex, events, transport = executor(dry_run=False)
    assert ex.drive(a_step()).startswith("listed ['a', 'b'], stopped {'a': Result(") and events.seen == []
    assert sorted(transport.ran) == ["docker ps -q", "docker rm -f 'y z'", "docker rm -f x"]


def test_the_fleet_lock_stale_rule() -> None:
    from sparkfleet.runner.lock import stale_why

    me = {"host": "ctl", "pid": 10}
    alive = {11}.__contains__
    assert stale_why({"host": "ctl", "pid": 11}, 1e9, me, alive) is None  # alive here: never, whatever its age
    assert stale_why({"host": "ctl", "pid": 12}, 0.0, me, alive) == "its process 12 on ctl is gone"
    assert stale_why({"host": "ctl", "pid": 10, "run_id": "r1"}, 0.0, me, alive) == \
        "left by an earlier run of this process (run r1)"
    assert stale_why({"host": "other", "pid": 12}, 99.0, me, alive, bound_s=100.0) is None
    assert stale_why({"host": "other", "pid": 12}, None, me, alive, bound_s=100.0) is None
    assert stale_why({}, 101.0, me, alive, bound_s=100.0) is not None  # unreadable: only its age judges it


def sh(command: str) -> Result:
    p = subprocess.run(["bash", "-c", command], capture_output=True, text=True)
    return Result("n", p.returncode == 0, p.stdout, p.stderr, p.returncode, None if p.returncode == 0 else "exit")


def take(path: str, holder: str, stale: str | None = None) -> c.LockAnswer | c.LockStuck | c.NodeError:
    op = c.LockTake(path, holder, stale)
    return op.parse(sh(op.command()))


def test_the_fleet_lock_commands_in_a_real_bash(tmp_path) -> None:
    """Take, refuse, take over only the lock judged stale, give back only one's own: the exact commands."""
    path = str(tmp_path / "lock" / "sparkfleet.lock")
    a, b = json.dumps({"user": "o'neil", "pid": 1}), json.dumps({"user": "b", "pid": 2})
    assert take(path, a) == c.LockAnswer(True)
    held = take(path, b)
    assert isinstance(held, c.LockAnswer) and not held.taken and held.holder == a and 0 <= held.age_s < 60
    other = take(path, b, stale=json.dumps({"user": "x"}))
    assert not other.taken and other.holder == a  # not the lock judged stale: left alone
    sh(c.LockRelease(path, b).command())  # not b's: left alone
    assert (tmp_path / "lock/sparkfleet.lock").read_text() == a + "\n"
    assert take(path, b, stale=a).taken
    assert (tmp_path / "lock/sparkfleet.lock").read_text() == b + "\n"
    sh(c.LockRelease(path, b).command())
    assert list((tmp_path / "lock").iterdir()) == []  # the take-over's flock left no file behind
    blocked = c.LockTake(str(tmp_path / "f" / "x.lock"), a)
    failed = blocked.parse(sh(blocked.command().replace(
        "mkdir -p", "touch " + str(tmp_path / "f") + " && mkdir -p")))
    assert isinstance(failed, c.NodeError) and "File exists" in failed.message


def test_a_take_over_waits_for_another_on_the_lock_directory(tmp_path) -> None:
    """Two take-overs of one stale lock are serialised by a flock on the lock's directory (no guard file):
    while another process holds it, the take-over waits and removes nothing."""
    import fcntl
    import os

    d = tmp_path / "lock"
    d.mkdir()
    stale, mine = json.dumps({"user": "gone"}), json.dumps({"user": "me"})
    (d / "sparkfleet.lock").write_text(stale + "\n")
    fd = os.open(d, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        proc = subprocess.Popen(["bash", "-c", c.LockTake(str(d / "sparkfleet.lock"), mine, stale=stale).command()],
                                stdout=subprocess.PIPE, text=True)
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=1.0)
        assert (d / "sparkfleet.lock").read_text() == stale + "\n"
    finally:
        os.close(fd)  # the flock goes with it
    assert proc.wait(timeout=30) == 0 and proc.stdout.read() == "taken\n"
    assert sorted(p.name for p in d.iterdir()) == ["sparkfleet.lock"]
    assert (d / "sparkfleet.lock").read_text() == mine + "\n"


def test_the_stuck_answer_of_a_take_over(tmp_path) -> None:
    """What a take-over prints when rm cannot remove the stale lock, read back (the node command runs in
    a real bash in tests/test_fleet_lock_user.py)."""
    out = "stuck 1001 ops 1000 dgx 1777\nrm: cannot remove '/run/lock/sparkfleet.lock': Operation not permitted\n"
    assert c.LockTake("/run/lock/sparkfleet.lock", "me").parse(Result("n", True, out, "", 0)) == c.LockStuck(
        1001, "ops", 1000, "dgx", 0o1777, "rm: cannot remove '/run/lock/sparkfleet.lock': Operation not permitted")
    nameless = c.LockTake("/run/lock/sparkfleet.lock", "me").parse(Result("n", True, "stuck 4244 UNKNOWN 4243 - 755\nrm: x\n", "", 0))
    assert (nameless.owner, nameless.me, nameless.sticky) == ("", "", False)


# a head's log as vLLM writes it: a tqdm bar redrawn after `\r` (tqdm/std.py:457), padded to the last
# display's length, ended by one `\n` at close; a form feed and a U+2028 inside an engine's message; and
# a bar still moving (no `\n` yet) at the end
BAR = ("Capturing CUDA graphs (decode, FULL):   0%|          | 0/3 [00:00<?, ?it/s]"
       "\rCapturing CUDA graphs (decode, FULL):  33%|███       | 1/3 [00:00<00:00, 9.80it/s]"
       "\rCapturing CUDA graphs (decode, FULL): 100%|██████████| 3/3 [00:00<00:00, 9.90it/s]\n")
HEAD_LOG = ("INFO 12-01 09:30:01 [api_server.py:1351] vLLM API server version 0.11.0\n" + BAR
            + "INFO 12-01 09:30:02 [core.py:1] a\x0cb\u2028c\x1ed\x85e\n"
            + "Loading safetensors checkpoint shards:  40%|████      | 2/5")


def test_log_tails_split_lines_as_the_reader_does(tmp_path) -> None:
    """watch's, the bundle's and `logs`' tail see the lines `Logs` (the reader) sees: split on `\\n` only
    (splitlines would cut the bar into 3 lines and the message into 5), the bar still moving counted as
    `docker logs --tail` counts it."""
    (tmp_path / "head.log").write_text(HEAD_LOG)
    script = f'cat {tmp_path / "head.log"}\n'  # `docker logs` passes the bytes on as the engine wrote them
    tail = c.LogTail(ID1)
    assert tail.command() == f"docker logs --tail 60 {ID1} 2>&1" and not tail.changes
    assert c.LogTail(ID1, None, "10m").command() == f"docker logs --since 10m {ID1} 2>&1"
    got = tail.parse(as_result(run_bash(tmp_path, script, tail.command())))
    assert got == [HEAD_LOG.split("\n")[0], BAR[:-1], "INFO 12-01 09:30:02 [core.py:1] a\x0cb\u2028c\x1ed\x85e",
                   "Loading safetensors checkpoint shards:  40%|████      | 2/5"]
    assert read(tmp_path, script, 0) == got[:3]  # the reader: the same lines, the unfinished one left for later
    assert tail.parse(Result("n", True, stdout="", exit_code=0)) == []
    gone = Result("n", False, stderr=f"Error response from daemon: No such container: {ID1}\n", exit_code=1,
                  error="exit")
    assert tail.parse(gone) == [f"(cannot read logs: Error response from daemon: No such container: {ID1})"]


def test_what_a_terminal_shows_of_a_bar_line() -> None:
    from sparkfleet.engines.logs import shown, text

    assert shown(BAR) == "Capturing CUDA graphs (decode, FULL): 100%|██████████| 3/3 [00:00<00:00, 9.90it/s]"
    assert shown("\x1b[1;36m(EngineCore_DP0 pid=7)\x1b[0;0m INFO x\r\x1b[0m\r\n") == \
        "\x1b[1;36m(EngineCore_DP0 pid=7)\x1b[0;0m INFO x"  # colour kept; a colour-only segment is blank
    assert text("\x1b[1;36m(EngineCore_DP0 pid=7)\x1b[0;0m INFO x\r\x1b[0m\r\n") == "INFO x"
