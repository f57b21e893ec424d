"""Shared fixtures: the repo's ops directory, and scratch copies of it that tests may break."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from sparkfleet.opsdir import Spec
from tests import realhome

REPO = Path(__file__).resolve().parent.parent

# The lab is one per machine (fixed ports, namespace names, the sim's state). `make test` runs the tests marked
# `unit` (no lab, namespace, sshd, dockerd or fixed port) in a pytest of their own beside the others, which keep
# to one process so their modules' labs come up one at a time. A `unit` test that brings up a lab fails at once
# (_unit_tests_start_no_lab), so a wrong mark cannot race the other process's lab.
_running: list[pytest.Item] = []


def pytest_runtest_setup(item: pytest.Item) -> None:
    _running[:] = [item]  # read by the lab guard while this test's fixtures (a module's lab among them) set up


@pytest.fixture(autouse=True, scope="session")
def _unit_tests_start_no_lab():
    from sparkfleet.sim import lab

    real_up = lab.up

    def guarded(*args, **kwargs):
        if _running and _running[0].get_closest_marker("unit") is not None:
            raise AssertionError(f"{_running[0].nodeid} is marked unit but brings up the lab: unit tests run beside "
                                 "the lab's, which is one per machine; take the module's `unit` mark off")
        return real_up(*args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lab, "up", guarded)
        yield


_module_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::", 1)[0]
    _module_seconds[path] = _module_seconds.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter) -> None:
    """Where the suite's time goes, a line per module (setup, call and teardown summed), slowest first."""
    if not _module_seconds:
        return
    total = sum(_module_seconds.values())
    terminalreporter.write_sep("=", f"seconds by module (of {total:.0f} s of test time)")
    for path, secs in sorted(_module_seconds.items(), key=lambda kv: -kv[1])[:25]:
        terminalreporter.write_line(f"{secs:8.1f} s  {path}")


@pytest.fixture(autouse=True, scope="session")
def _own_home(tmp_path_factory: pytest.TempPathFactory):
    """The suite runs with a HOME of its own and leaves the real one as it found it: a plain local node's `~` is
    this process's HOME (helpers shipped to ~/.cache/sparkfleet/bin, and a copy the user's own `sparkfleet
    facts` left there changed what a test saw), and so is every default under a home (~/.config/sparkfleet,
    ~/.ssh/config). The XDG base variables go too (their defaults follow HOME). The lab's nodes are not
    affected: their home is the passwd one, inside each node's own tree (sim/node.py home_dir). The build
    caches made before pytest runs (`make llama-rpc`, the real-vLLM build) stay the real user's: their
    variables name them unless already set (tests/realhome.py). At the end sparkfleet's dirs in the real home
    must be as they were at the start, else the session fails here naming what changed (its check is shown
    to fail in tests/test_home_isolation.py)."""
    watched = realhome.watched()
    caches = realhome.build_caches()
    before = realhome.snapshot(watched, skip=list(caches.values()))
    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as mp:
        for var, path in caches.items():
            mp.setenv(var, str(path))
        for var in realhome.XDG_BASES:
            mp.delenv(var, raising=False)
        mp.setenv("HOME", str(home))
        yield home
    left = realhome.changes(before, realhome.snapshot(watched, skip=list(caches.values())))
    if left:
        pytest.fail(f"the suite changed the real home {realhome.REAL_HOME} ({len(left)} entries):\n  "
                    + "\n  ".join(left[:20]), pytrace=False)


@pytest.fixture(autouse=True, scope="session")
def _own_state_dir(tmp_path_factory: pytest.TempPathFactory):
    """The suite never reads or writes the user's state dir (~/.local/state/sparkfleet: runs, harvested
    Engram ranges, restore points): a stored harvest there changed what `check` judged. Fixtures and tests
    that need a state dir of their own still set SPARKFLEET_STATE over this one."""
    with pytest.MonkeyPatch.context() as mp:
        if not os.environ.get("SPARKFLEET_STATE"):
            mp.setenv("SPARKFLEET_STATE", str(tmp_path_factory.mktemp("user-state")))
        yield


@pytest.fixture(autouse=True, scope="session")
def _lab_chosen():
    """The tests' fleet is the repo's `lab` inventory, chosen on purpose (a command that contacts nodes
    refuses the shipped example left as the default: tests/test_cli_example.py runs that case). Its own
    MonkeyPatch, for the session: a test's `monkeypatch` keeps its usual teardown order."""
    with pytest.MonkeyPatch.context() as mp:
        if not os.environ.get("SPARKFLEET_INVENTORY"):
            mp.setenv("SPARKFLEET_INVENTORY", "lab")
        yield


@pytest.fixture
def repo_spec() -> Spec:
    return Spec(REPO)


OPS_DIRS = ("inventories", "profiles", "templates", "playbooks", "patches")


def copy_ops(root: Path) -> Path:
    """A copy of the repo's ops directory (inventories, profiles, templates, playbooks, patches) at `root`."""
    for name in OPS_DIRS:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, root / name)
        else:
            (root / name).mkdir(parents=True)
    return root


@pytest.fixture
def ops_root(tmp_path: Path) -> Path:
    """A scratch copy of the repo's ops directory that a test may break."""
    return copy_ops(tmp_path / "ops")


ENGRAM_TENSORS = "model.layers.{layer}.engram.*"  # the Engram tensors of the lab nodes' checkpoint


def engram_copies(sim, profile: str = "dcp2", root: Path = REPO) -> None:
    """Every rank of `profile` gets its node-local Engram copy on the lab, made by the real copier (engram_copy.py
    under the node's root, as fleet mode runs it there) from the checkpoint its node holds, of the rows the sim
    engine will read: the rank's 1/TP share of each table, its row count read from the checkpoint's header
    (ENG-03). A wrong copy makes the engine read NFS and `up` fail. Copies persist on the node roots."""
    from sparkfleet.engram import fleet
    from sparkfleet.fleet.nodeside import engram_copy as ec
    from sparkfleet.placement import place
    from sparkfleet.sim import values

    spec = Spec(root)
    loaded = spec.profile(profile)
    p, e = loaded.profile, loaded.profile.engram
    assert e is not None
    for r in place(loaded, spec.inventory("lab")):
        dest, source = fleet.copy_dir(p, r.node), fleet.source_dir(p, r.node)
        node_root = sim.root(r.node.name)
        if r.rank in e.nfs_ranks or dest is None or (node_root / dest.lstrip("/") / ec.MANIFEST).is_file():
            continue
        shards = [ec.read_shard(str(f)) for f in sorted((node_root / source.lstrip("/")).glob("*.safetensors"))]
        rows = {layer: s.tensors[name].shape[0] for s in shards for layer in e.layers
                if (name := values.ENGRAM_TENSOR.format(layer=layer)) in s.tensors}
        ec.copy(ec.CopyRequest(source=source, dest=dest, tensors=ENGRAM_TENSORS, shards=list(e.shards),
                               ranges={k: (n * r.rank // p.tp, n * (r.rank + 1) // p.tp) for k, n in rows.items()},
                               revision=p.model.revision if p.model else None, tp=p.tp, rank=r.rank),
                root=str(node_root))


SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else None)


def ssh_lab_needed(*, root: bool = False) -> None:
    """The SSH lab's parts are here (OpenSSH's sshd; root for its network namespaces, where a test needs them),
    or the test ends: a failure under CI, which installs them and runs as root (.ci/run), else a skip."""
    missing = "sshd is not installed" if SSHD is None else \
        "ssh mode's network namespaces need root" if root and os.geteuid() != 0 else None
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"CI runs the SSH lab as root with openssh-server (.ci/run): {missing}")
        pytest.skip(missing)


def sim_lab(tmp_path_factory, transport: str = "local"):
    """A simulated lab of the repo's `lab` inventory in a state dir of its own, for a module's tests; down after.
    dcp2's ranks hold their node-local Engram copies (engram_copies): dcp2 and its relatives expect them."""
    from sparkfleet.sim import lab

    if transport == "ssh":
        ssh_lab_needed()
    state = tmp_path_factory.mktemp("state")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPARKFLEET_STATE", str(state))
        s = lab.up("lab", transport=transport)
        try:
            engram_copies(s)
            yield s
        finally:
            lab.down()


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    """The repo's `lab` inventory as a simulated lab, one per test module (a module may define its own)."""
    yield from sim_lab(tmp_path_factory)


@pytest.fixture(scope="module")
def ssh_sim(tmp_path_factory):
    """The same lab with its nodes behind OpenSSH sshd, host keys checked strictly (as root each node is a
    network namespace of its own), one per test module."""
    yield from sim_lab(tmp_path_factory, transport="ssh")


@pytest.fixture
def lane_cleaned(sim, capsys):
    """After the test: faults healed and the dcp2 lane down on the sim lab."""
    yield
    from tests.cli_run import heal_and_down

    heal_and_down(sim, capsys)


def tensorfold_built(profile: str = "tf1017") -> None:
    """The lane's engine built and pinned on the sim lab (`sparkfleet build`), as `up` requires of a lane
    with tensorfold.build: the lab's stand-in source, patches and zig (sparkfleet/sim/tfbuild.py)."""
    from sparkfleet.cli.main import main

    assert main(["build", "--profile", profile, "--inventory", "sim", "--json"]) == 0
