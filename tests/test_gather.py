"""What the controller asks each node, shipping the helper by sha256, gathering in parallel, GID `auto`.

The transport here is this test's own: it runs each node's command with /bin/sh in a per-node home
and sandbox (so the real sha256 guard and the real helper run), writes `put` files under that home,
and records every call, so round trips can be counted per node.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest

from sparkfleet.cli.main import main
from sparkfleet.fleet import ship
from sparkfleet.fleet.gather import facts_requests, gather, plan_for, resolve_gid_indexes
from sparkfleet.fleet.nodefacts import FactsRequest, Gid, NodeFacts, RdmaPort
from sparkfleet.fleet.transport import Result, RunEachByRun
from sparkfleet.opsdir import Spec
from sparkfleet.schema.inventory import Node
from tests.noderoot import argv_in_root

REPO = Path(__file__).resolve().parent.parent
REVISION = "df42c109f1defefcbfcedbe7d905718a12266e40"
REPO_DIR = "models--deepseek-ai--DeepSeek-V4.1-Flash"


def _python_dir() -> str:
    """The directory of the real python3 (not a pyenv shim), so `python3` resolves on a narrow PATH."""
    out = subprocess.run(["python3", "-c", "import sys; print(sys.executable)"], capture_output=True, text=True,
                         timeout=30).stdout.strip()
    return os.path.dirname(out or sys.executable)


PYTHON_DIR = _python_dir()


# -- facts_requests --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def spec() -> Spec:
    return Spec(REPO)


def test_dcp2_requests_per_node(spec: Spec) -> None:
    inv = spec.inventory("lab")
    loaded = spec.profile("dcp2")
    plan = plan_for(loaded, inv, spec.root)
    reqs = facts_requests(inv, plan, loaded.profile)
    assert list(reqs) == ["reddie", "asusi", "bluey", "spark4"]  # the lane's nodes only, rank order
    engram = f"/nvme/engram-local/{REVISION}"
    assert reqs["reddie"].paths == ["/nvme/hf", "/nvme/engram-local", "/nvme/cache", f"/nvme/hf/{REPO_DIR}", engram]
    for worker in ("asusi", "bluey", "spark4"):
        assert reqs[worker].node == worker
        assert reqs[worker].paths == ["/mnt/models", "/nvme/engram-local", "/nvme/cache",
                                      f"/mnt/models/{REPO_DIR}", engram]
    # cross-check: every -v source of every launch is asked on that launch's node
    for launch in plan.launches:
        sources = [launch.argv[i + 1].split(":")[0] for i, t in enumerate(launch.argv) if t == "-v"]
        assert sources and set(sources) <= set(reqs[launch.node].paths)


def test_station_lane_mounts_and_bare_nodes(spec: Spec) -> None:
    inv = spec.inventory("lab")
    loaded = spec.profile("gb300-v23")
    reqs = facts_requests(inv, plan_for(loaded, inv, spec.root), loaded.profile, nodes=["reddie"])
    assert reqs["station"].paths == [
        "/models", "/home/milo/dsv41/vllm-cache",
        "/models/DeepSeek-V4.1-Flash-1017-1bae0e1088993b9b82de08f59de5be5a34e42170",
        "/home/milo/dsv41/hook/sitecustomize.py", "/home/milo/dsv41/hook",  # the profile's own bind mounts
    ]
    assert reqs["reddie"].paths == ["/nvme/hf", "/nvme/engram-local", "/nvme/cache"]  # storage dirs only


def test_tensorfold_lane_asks_its_own_dirs(spec: Spec) -> None:
    inv = spec.inventory("lab")
    loaded = spec.profile("tf1017")
    reqs = facts_requests(inv, plan_for(loaded, inv, spec.root), loaded.profile)
    assert reqs["asusi"].paths == ["/mnt/models", "/nvme/engram-local", "/nvme/cache",
                                   "/DeepSeek-V4.1-Flash-1017-EXL3-3.5bpw", "/opt/deepseek-v4.1-tensorfold-tp4-4xgb10",
                                   # the rank's own config.env bind source (written by the launch; checks skip it)
                                   "/opt/deepseek-v4.1-tensorfold-tp4-4xgb10/.sparkfleet-tf1017-r1.config.env"]


def test_unknown_node_is_a_user_error(spec: Spec) -> None:
    from sparkfleet.schema.errors import UserError

    with pytest.raises(UserError, match="'nope' is not in inventory"):
        facts_requests(spec.inventory("lab"), nodes=["nope"])


# -- a transport that really runs the commands, per node -------------------------------------

def node(name: str) -> Node:
    return Node(name=name, ssh={"host": "127.0.0.1"}, hardware="gb10",
                storage={"model_root": "/models", "cache_dir": "/cache"})


class FakeTransport(RunEachByRun):
    def __init__(self, base: Path, *, canned: dict[str, Result] | None = None, bad_put: set[str] = frozenset()):
        self.base = base
        self.canned = canned or {}
        self.bad_put = bad_put
        self.calls: list[tuple[str, str]] = []
        self.commands: list[str] = []
        self.lock = threading.Lock()
        (base / "tools").mkdir(parents=True, exist_ok=True)  # no nvidia-smi, docker or ibdev2netdev here

    def home(self, n: Node | str) -> Path:
        return self.base / getattr(n, "name", n) / "home"

    def root(self, n: Node | str) -> Path:
        root = self.base / getattr(n, "name", n) / "root"
        if not (root / "proc/meminfo").exists():
            (root / "proc").mkdir(parents=True, exist_ok=True)
            (root / "proc/meminfo").write_text("MemTotal: 126701056 kB\nMemAvailable: 120000000 kB\n")
            (root / "models").mkdir()
        return root

    def count(self, kind: str, name: str) -> int:
        return sum(1 for k, n in self.calls if (k, n) == (kind, name))

    def run(self, nodes: list[Node], command: str, *, stdin: str | None = None, timeout_s: float = 60.0,
            env: dict[str, str] | None = None) -> dict[str, Result]:
        out = {}
        for n in nodes:
            with self.lock:
                self.calls.append(("run", n.name))
                self.commands.append(command)
            if n.name in self.canned:
                out[n.name] = self.canned[n.name]
                continue
            self.home(n).mkdir(parents=True, exist_ok=True)
            # the node's files are its root's; its home and the (empty) tools dir are bound where they are
            argv = argv_in_root(self.root(n), ["/bin/sh", "-c", f'cd "$HOME" && {command}'],
                                extra=[self.home(n), self.base / "tools"])
            p = subprocess.run(argv, input=stdin or "", capture_output=True, text=True, timeout=timeout_s,
                               env={"HOME": str(self.home(n)), "PATH": f"{self.base / 'tools'}{os.pathsep}{PYTHON_DIR}"})
            out[n.name] = Result(n.name, p.returncode == 0, p.stdout, p.stderr, p.returncode,
                                 None if p.returncode == 0 else "exit",
                                 "" if p.returncode == 0 else f"{n.name}: command exited with status {p.returncode}")
        return out

    def put(self, nodes: list[Node], data: bytes, remote_path: str, *, mode: int = 0o644) -> dict[str, Result]:
        assert remote_path.startswith("~/")
        out = {}
        for n in nodes:
            with self.lock:
                self.calls.append(("put", n.name))
            path = self.home(n) / remote_path[2:]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data + b"# torn write\n" if n.name in self.bad_put else data)
            path.chmod(mode)
            out[n.name] = Result(n.name, True)
        return out

    def close(self) -> None:
        pass


def helper_on(t: FakeTransport, name: str) -> Path:
    return t.home(name) / ".cache/sparkfleet/bin/facts.py"


# -- shipping --------------------------------------------------------------------------------

def test_run_helper_ships_once_then_one_round_trip(tmp_path: Path) -> None:
    t = FakeTransport(tmp_path)
    nodes = [node("a"), node("b")]
    stdin = {n.name: FactsRequest(node=n.name, paths=["/models"]).model_dump_json() for n in nodes}

    first = ship.run_helper(t, nodes, "facts.py", stdin)
    assert all(r.ok for r in first.values()), first
    for name in ("a", "b"):
        assert (t.count("run", name), t.count("put", name)) == (2, 1)  # 97, put, run again
        assert helper_on(t, name).read_bytes() == ship.helper_bytes("facts.py")
        assert helper_on(t, name).stat().st_mode & 0o777 == 0o755
        assert json.loads(first[name].stdout)["node"] == name  # each node got its own request

    t.calls.clear()
    second = ship.run_helper(t, nodes, "facts.py", stdin)
    assert all(r.ok for r in second.values())
    assert sorted(t.calls) == [("run", "a"), ("run", "b")]  # steady state: one round trip per node

    # a tampered copy on one node is replaced; the other node is not touched again
    helper_on(t, "a").write_bytes(helper_on(t, "a").read_bytes() + b"\nprint('tampered')\n")
    t.calls.clear()
    third = ship.run_helper(t, nodes, "facts.py", stdin)
    assert third["a"].ok and "tampered" not in third["a"].stdout
    assert (t.count("run", "a"), t.count("put", "a")) == (2, 1)
    assert (t.count("run", "b"), t.count("put", "b")) == (1, 0)
    assert helper_on(t, "a").read_bytes() == ship.helper_bytes("facts.py")


def test_guard_is_one_shell_command_with_the_hash(tmp_path: Path) -> None:
    cmd = ship.guard_command("facts.py")
    assert cmd.startswith("python3 -c ") and ship.helper_sha256("facts.py") in cmd
    assert "~/.cache/sparkfleet/bin/facts.py" in cmd
    with pytest.raises(ValueError, match="no node-side helper"):
        ship.guard_command("../facts.py")


def test_copy_that_still_differs_fails(tmp_path: Path) -> None:
    t = FakeTransport(tmp_path, bad_put={"a"})
    res = ship.run_helper(t, [node("a"), node("b")], "facts.py", {"a": '{"node": "a"}', "b": '{"node": "b"}'})
    assert res["b"].ok
    assert not res["a"].ok and "still differs" in res["a"].message and res["a"].exit_code == ship.MISSING
    ens = ship.ensure_helper(t, [node("a"), node("b")])
    assert not ens["a"].ok and "still differs" in ens["a"].message
    assert ens["b"].ok and ens["b"].message == "current"


def test_ensure_helper_checks_then_ships(tmp_path: Path) -> None:
    t = FakeTransport(tmp_path)
    first = ship.ensure_helper(t, [node("a")])
    assert first["a"].ok and first["a"].message == "shipped"
    assert (t.count("run", "a"), t.count("put", "a")) == (2, 1)  # check, put, verify
    t.calls.clear()
    again = ship.ensure_helper(t, [node("a")])
    assert again["a"].message == "current" and t.calls == [("run", "a")]


def test_python3_missing_is_explained(tmp_path: Path) -> None:
    t = FakeTransport(tmp_path, canned={"a": Result("a", False, stderr="sh: 1: python3: not found", exit_code=127,
                                                    error="exit")})
    res = ship.run_helper(t, [node("a")], "facts.py")
    assert not res["a"].ok and "python3 not found on a" in res["a"].message


# -- gather ------------------------------------------------------------------------------------

def test_gather_returns_others_when_nodes_fail(tmp_path: Path) -> None:
    down = Result("down", False, error="unreachable", message="down: connection refused (10.0.0.9:22)")
    canned = {
        "down": down,
        "garbage": Result("garbage", True, stdout="Traceback (most recent call last):\n  oops\n", exit_code=0),
        "schema": Result("schema", True, stdout='{"node": "schema", "hostname": "x"}\n', exit_code=0),
        "other": Result("other", True, exit_code=0, stdout=json.dumps(
            {"node": "elsewhere", "hostname": "x", "collected_at": 1.0, "helper_version": "1"})),
    }
    t = FakeTransport(tmp_path, canned=canned)
    nodes = [node(n) for n in ("good", "down", "garbage", "schema", "other", "good2")]
    reqs = {"good": FactsRequest(node="good", paths=["/models", "/absent"])}
    facts = gather(t, nodes, reqs)
    assert list(facts) == ["good", "down", "garbage", "schema", "other", "good2"]
    good = facts["good"]
    assert isinstance(good, NodeFacts) and good.node == "good" and not good.simulated  # not a sim inventory
    assert good.meminfo.mem_total_bytes == 126701056 * 1024
    assert good.paths["/models"].exists and not good.paths["/absent"].exists
    assert isinstance(facts["good2"], NodeFacts) and list(facts["good2"].paths) == []  # default request
    assert facts["down"] is down
    assert "printed invalid JSON" in facts["garbage"].message and not facts["garbage"].ok
    assert "do not match this sparkfleet's schema" in facts["schema"].message
    assert "collected_at" in facts["schema"].message
    assert "answered for node 'elsewhere'" in facts["other"].message


# -- GID index `auto` -----------------------------------------------------------------------

def _facts(name: str, ports: list[RdmaPort]) -> NodeFacts:
    return NodeFacts(node=name, hostname=name, collected_at=0.0, helper_version="1", rdma=ports)


def _gid(i: int, kind: str, ipv4: str | None, netdev: str = "enp1s0f0np0") -> Gid:
    return Gid(index=i, gid=f"::{i}", type=kind, ipv4=ipv4, netdev=netdev)


def test_resolve_gid_indexes(spec: Spec) -> None:
    inv = spec.inventory("lab")
    fabric = RdmaPort(hca="rocep1s0f0", port=1, state="ACTIVE", netdev="enp1s0f0np0", gids=[
        _gid(0, "IB/RoCE v1", None), _gid(1, "RoCE v2", None), _gid(2, "IB/RoCE v1", "192.168.192.11"),
        _gid(3, "RoCE v2", None), _gid(5, "RoCE v2", "192.168.192.11")])
    rail2 = RdmaPort(hca="roceP2p1s0f0", port=1, netdev="enP2p1s0f0np0",
                     gids=[_gid(3, "RoCE v2", "192.168.193.12", "enP2p1s0f0np0")])
    # asusi's fabric port carries an alias too: the entry with its own fabric IP wins
    asusi = RdmaPort(hca="rocep1s0f0", port=1, netdev="enp1s0f0np0", gids=[
        _gid(3, "RoCE v2", "10.9.9.9"), _gid(4, "RoCE v2", "192.168.192.12")])
    facts = {
        "reddie": _facts("reddie", [rail2, fabric]),
        "asusi": _facts("asusi", [asusi]),
        "bluey": Result("bluey", False, error="timeout", message="timed out"),
        "spark4": _facts("spark4", [RdmaPort(hca="rocep1s0f0", port=1, netdev="enp1s0f0np0",
                                             gids=[_gid(1, "RoCE v2", None)])]),
    }
    got = resolve_gid_indexes(inv.nodes.values(), facts)
    assert got == {"reddie": 5, "asusi": 4}  # bluey failed, spark4 has no IPv4 RoCE v2, station has no RDMA
    fixed = inv.nodes["bluey"].model_copy(update={"rdma": inv.nodes["bluey"].rdma.model_copy(update={"gid_index": 7})})
    assert resolve_gid_indexes([fixed], {}) == {"bluey": 7}


# -- the command ------------------------------------------------------------------------------

def _inventory(tmp_path: Path) -> Path:
    path = tmp_path / "inv.yaml"
    path.write_text("""\
name: test
nodes:
  alpha:
    ssh: {host: 127.0.0.1}
    hardware: gb10
    storage: {model_root: /models, cache_dir: /cache}
    simulation: true   # what `sim up` writes: output about the node is tagged [sim]
  beta:
    ssh: {host: 127.0.0.2}
    hardware: gb10
    storage: {model_root: /models, cache_dir: /cache}
groups:
  all: [alpha, beta]
""")
    return path


@pytest.fixture
def fake_connect(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Install sparkfleet.fleet.connect.transport_for -> a FakeTransport, whatever the real module holds."""
    made: dict = {}

    def install(**kwargs) -> dict:
        def transport_for(nodes, known_hosts=None):
            made["transport"] = FakeTransport(tmp_path / "nodes", **kwargs)
            made["nodes"] = [n.name for n in nodes]
            return made["transport"]

        module = types.ModuleType("sparkfleet.fleet.connect")
        module.transport_for = transport_for
        monkeypatch.setitem(sys.modules, "sparkfleet.fleet.connect", module)
        return made

    return install


def test_cli_json_all_nodes(tmp_path: Path, fake_connect, capsys: pytest.CaptureFixture) -> None:
    made = fake_connect()
    code = main(["facts", "--root", str(REPO), "--inventory", str(_inventory(tmp_path)), "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and made["nodes"] == ["alpha", "beta"]
    assert set(data) == {"alpha", "beta"}
    assert data["alpha"]["simulated"] is True and list(data["alpha"]["paths"]) == ["/models", "/cache"]
    NodeFacts.model_validate(data["beta"])


def test_cli_text_marks_sim_and_fails_on_a_dead_node(tmp_path: Path, fake_connect,
                                                      capsys: pytest.CaptureFixture) -> None:
    fake_connect(canned={"beta": Result("beta", False, error="unreachable",
                                        message="beta: connection refused (127.0.0.2:22)")})
    code = main(["facts", "--root", str(REPO), "--inventory", str(_inventory(tmp_path)), "--node", "alpha,beta"])
    text = capsys.readouterr().out
    assert code == 1
    assert "alpha [sim]" in text and "114.4 GiB available of 120.8 GiB" in text
    assert "/models dir" in text and "nvidia-smi: not found" in text
    assert "beta  FAILED beta: connection refused (127.0.0.2:22)" in text
    assert "1 of 2 node(s) answered; failed: beta" in text


def test_cli_unknown_node_exits_2(tmp_path: Path, fake_connect, capsys: pytest.CaptureFixture) -> None:
    fake_connect()
    code = main(["facts", "--root", str(REPO), "--inventory", str(_inventory(tmp_path)), "--node", "gamma"])
    assert code == 2 and "'gamma' is not in inventory" in capsys.readouterr().err


def test_a_bad_fanout_is_refused_before_any_node_is_dialled(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("SPARKFLEET_FANOUT", "0")
    code = main(["facts", "--root", str(REPO), "--inventory", str(_inventory(tmp_path)), "--json"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err == ("sparkfleet: fanout (from env SPARKFLEET_FANOUT): expected a whole number >= 1, "
                            "got '0'\n"), captured.err
