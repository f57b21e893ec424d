"""A facts part a node could not read is unknown, never ok (issue 39 §1).

The node-side helper (fleet/nodeside/facts.py) turns a part it cannot read into an empty default plus an
error line ("listening: cannot read /proc/net/tcp: Permission denied"). Here each check that reads a part
gets hand-built facts shaped exactly so, and must say "could not judge, because <that line>"; before, an
empty socket table read as "nothing holds :8410" (FM-48) and an empty mount table as "model dir present,
mount unknown" (FM-44). Then `up`'s check step: it stops on such an unknown unless --accept-unknown, which
the record keeps; the idle clock's "not judged" never stops it.
"""

from __future__ import annotations

import posixpath
from pathlib import Path

import pytest

from sparkfleet.checks.context import part_error
from sparkfleet.findings import Finding
from sparkfleet.fleet.nodefacts import NodeFacts
from sparkfleet.opsdir import Spec
from sparkfleet.plan import make_plan
from sparkfleet.runner.context import RunContext, RunOptions
from sparkfleet.runner.record import Record
from sparkfleet.runner.steps import STEPS
from sparkfleet.schema.playbook import Step
from tests.test_checks import check, healthy, lane

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

BECAUSE = "could not judge, because "
TCP = "listening: cannot read /proc/net/tcp: Permission denied"
MOUNTS = "mounts: Permission denied"


@pytest.fixture
def dcp2(repo_spec: Spec):
    profile, inv, plan = lane(repo_spec, "dcp2")
    return profile, inv, plan, healthy(profile, inv, plan)


def not_ok(findings: list[Finding], name: str, node: str) -> list[tuple[str, str]]:
    return [(f.status, f.message) for f in findings if f.check == name and f.node == node and f.status != "ok"]


def judged(findings: list[Finding], name: str, node: str) -> list[tuple[str, str]]:
    return [(f.status, f.message) for f in findings if f.check == name and f.node == node]


def test_part_error_reads_the_helpers_error_lines_by_part_name() -> None:
    f = NodeFacts(node="n", hostname="n", collected_at=0.0, helper_version="1",
                  errors=[TCP, "nvidia-smi (versions): not found", "path /x: helper failed: OSError: boom"])
    assert part_error(f, "listening") == TCP
    assert part_error(f, "nvidia-smi") is None  # the versions part's line is not the GPU part's
    assert part_error(f, "path /x") == "path /x: helper failed: OSError: boom"
    assert part_error(f, "mounts", "listening") == TCP
    assert part_error(f, "mounts") is None


def test_an_unread_socket_table_is_unknown_not_nothing_holds_the_port(dcp2) -> None:
    """FM-48: the head's :8410 cannot be judged free when /proc/net/tcp was not read."""
    profile, inv, plan, facts = dcp2
    assert judged(check(profile, inv, plan, facts), "conflicts", "reddie")[0][1].startswith("nothing holds :8410")
    facts["reddie"].listening = []
    facts["reddie"].errors = [TCP]
    found = check(profile, inv, plan, facts)
    assert judged(found, "conflicts", "reddie") == [("unknown", BECAUSE + TCP)]
    (f,) = [x for x in found if x.check == "conflicts" and x.node == "reddie"]
    assert f.unread == "listening" and f.observed == TCP
    assert "--accept-unknown" in f.remedy and "sparkfleet facts --node reddie" in f.remedy
    # a foreign container found anyway still fails: an unread part never hides what was read
    facts["reddie"].docker.containers = []  # type: ignore[union-attr]
    assert judged(check(profile, inv, plan, facts), "conflicts", "asusi")[0][0] == "ok"


def test_an_unread_mount_table_is_unknown_not_model_dir_present_mount_unknown(repo_spec: Spec) -> None:
    """FM-44: on the Station the model dir is on CIFS; with /etc/mtab unread its filesystem is not known."""
    profile, inv, plan = lane(repo_spec, "gb300-v23")
    facts = healthy(profile, inv, plan)
    mdir = posixpath.join("/models", profile.model.repo_dir)
    for info in facts["station"].paths.values():
        info.mount = None  # what the helper reports with no mount table
    facts["station"].mounts = []
    facts["station"].errors = [MOUNTS]
    found = check(profile, inv, plan, facts)
    storage = judged(found, "storage", "station")
    assert ("unknown", BECAUSE + MOUNTS) in storage
    assert not [s for s in storage if s[1].startswith(f"model dir {mdir}")]  # never "present"
    facts["station"].errors = []
    assert (f"model dir {mdir} present") in [m for _, m in judged(check(profile, inv, plan, facts), "storage",
                                                                    "station")]  # what it said before


def test_a_missing_model_dir_still_fails_when_only_the_mount_table_was_unread(dcp2) -> None:
    profile, inv, plan, facts = dcp2
    mdir = "/mnt/models/models--deepseek-ai--DeepSeek-V4.1-Flash"
    info = facts["bluey"].paths[mdir]
    info.exists, info.mount = False, None
    facts["bluey"].errors = [MOUNTS]
    assert not_ok(check(profile, inv, plan, facts), "storage", "bluey") == [
        ("fail", f"model dir {mdir} is missing")]


def test_a_path_the_helper_failed_on_is_unknown_not_missing(dcp2) -> None:
    """`path P` failed: PathInfo(exists=False) is the helper's default, so the mounts check said "does not exist"."""
    profile, inv, plan, facts = dcp2
    src = "/nvme/cache"  # asusi's cache dir: a bind source of its launch
    error = f"path {src}: helper failed: OSError: [Errno 5] Input/output error"
    facts["asusi"].paths[src].exists = False
    found = check(profile, inv, plan, facts)
    assert not_ok(found, "mounts", "asusi")[0][1] == f"bind-mount source {src} does not exist: Docker would bind " \
        "an empty directory in its place (a missing patch file failed the import minutes later)"  # truly missing
    facts["asusi"].errors = [error]
    found = check(profile, inv, plan, facts)
    assert not_ok(found, "mounts", "asusi") == [("unknown", BECAUSE + error)]
    assert not_ok(found, "storage", "asusi") == [("unknown", BECAUSE + error)]  # its free space, too


def test_unread_meminfo_is_unknown(dcp2) -> None:
    profile, inv, plan, facts = dcp2
    facts["bluey"].meminfo = None
    facts["bluey"].errors = ["meminfo: Permission denied"]
    assert judged(check(profile, inv, plan, facts), "memory", "bluey") == [
        ("unknown", BECAUSE + "meminfo: Permission denied")]


def test_an_unread_process_list_is_unknown_not_earlyoom_not_running(dcp2) -> None:
    profile, inv, plan, facts = dcp2
    eo = facts["spark4"].earlyoom
    assert eo is not None
    eo.running, eo.pid, eo.argv = False, None, []  # what an empty process list gives
    error = "processes: helper failed: PermissionError: [Errno 13] Permission denied: '/proc'"
    facts["spark4"].errors = [error]
    assert judged(check(profile, inv, plan, facts), "earlyoom", "spark4") == [("unknown", BECAUSE + error)]
    facts["spark4"].earlyoom = None
    facts["spark4"].errors = ["earlyoom: helper failed: ValueError: boom"]
    assert judged(check(profile, inv, plan, facts), "earlyoom", "spark4") == [
        ("unknown", BECAUSE + "earlyoom: helper failed: ValueError: boom")]


def test_no_gpu_because_nvidia_smi_failed_is_unknown(dcp2) -> None:
    profile, inv, plan, facts = dcp2
    facts["asusi"].gpus = []
    facts["asusi"].errors = ["nvidia-smi: not found"]
    assert judged(check(profile, inv, plan, facts), "clock", "asusi") == [
        ("unknown", BECAUSE + "nvidia-smi: not found")]


def test_unlisted_rdma_ports_are_unknown_in_rdma_and_fabric(dcp2) -> None:
    profile, inv, plan, facts = dcp2
    error = "rdma rocep1s0f0: cannot list ports: Permission denied"
    facts["bluey"].rdma = [p for p in facts["bluey"].rdma if p.hca != "rocep1s0f0"]
    facts["bluey"].errors = [error]
    found = check(profile, inv, plan, facts)
    assert judged(found, "rdma", "bluey") == [("unknown", BECAUSE + error)]
    assert not_ok(found, "fabric", "bluey") == [("unknown", BECAUSE + error)]


def test_unread_links_are_unknown(dcp2) -> None:
    profile, inv, plan, facts = dcp2
    facts["asusi"].links = {}
    facts["asusi"].errors = ["links: helper failed: OSError: boom"]
    assert not_ok(check(profile, inv, plan, facts), "fabric", "asusi") == [
        ("unknown", BECAUSE + "links: helper failed: OSError: boom")]


def test_an_unread_image_list_is_unknown_not_image_absent(dcp2) -> None:
    profile, inv, plan, facts = dcp2
    error = "docker images: permission denied while trying to connect to the Docker daemon socket"
    facts["spark4"].docker.images = []  # type: ignore[union-attr]
    facts["spark4"].errors = [error]
    found = check(profile, inv, plan, facts)
    assert judged(found, "image", "spark4") == [("unknown", BECAUSE + error)]
    assert not_ok(found, "drift", "spark4") == [("unknown", BECAUSE + error + " (not compared: image id)")]


def test_unread_versions_are_unknown_in_drift(dcp2) -> None:
    profile, inv, plan, facts = dcp2
    facts["bluey"].versions = None
    facts["bluey"].errors = ["versions: helper failed: OSError: boom"]
    assert not_ok(check(profile, inv, plan, facts), "drift", "bluey") == [
        ("unknown", BECAUSE + "versions: helper failed: OSError: boom (not compared: NVIDIA driver, CUDA, kernel, "
         "docker)")]


# -- up's check step: stop on an unread part unless --accept-unknown ----------------------------------------

class Events:
    def emit(self, *a, **k) -> None:
        pass


def check_step(sp: Spec, tmp_path: Path, facts: dict, **options):
    loaded, inv = sp.profile("dcp2"), sp.inventory("lab")
    pb = sp.playbook("up")
    plan = make_plan(loaded, inv, pb, sp.root)
    ctx = RunContext(sp, loaded, inv, pb, plan, None, Record("r", "up", "dcp2", "lab", "up"),  # type: ignore[arg-type]
                     Events(), RunOptions(**options), tmp_path)
    ctx.facts = facts
    return STEPS["check"](ctx, Step(step="check")), ctx


def test_up_stops_on_an_unread_part_and_goes_on_with_accept_unknown(repo_spec: Spec, dcp2, tmp_path: Path) -> None:
    _, _, _, facts = dcp2
    facts["reddie"].listening = []
    facts["reddie"].errors = [TCP]
    result, ctx = check_step(repo_spec, tmp_path, facts)
    assert (result.status, result.summary) == (
        "fail", "1 check(s) could not judge a part the node could not read: nothing was started "
        "(--accept-unknown goes on without them)")
    assert [(f.node, f.check, f.message) for f in result.findings if f.unread] == [
        ("reddie", "conflicts", BECAUSE + TCP)]
    assert "accepted_unknowns" not in ctx.record.data

    result, ctx = check_step(repo_spec, tmp_path, facts, accept_unknown=True)
    assert result.status == "warn" and result.summary.endswith(", 1 unknown(s) accepted (--accept-unknown)")
    assert ctx.record.data["accepted_unknowns"] == [
        {"check": "conflicts", "status": "unknown", "message": BECAUSE + TCP, "node": "reddie",
         "remedy": result.findings[[f.unread for f in result.findings].index("listening")].remedy,
         "observed": TCP, "expected": "nothing else holds :8410, :29551, the GPU", "unread": "listening"}]
    assert ctx.record.as_dict()["data"]["accepted_unknowns"][0]["unread"] == "listening"  # the typed record takes it


def test_the_idle_clocks_not_judged_does_not_stop_up(repo_spec: Spec, dcp2, tmp_path: Path) -> None:
    """The healthy lane's idle clock snapshot is "unknown" (not judged) with no unread part: up goes on."""
    _, _, _, facts = dcp2
    result, ctx = check_step(repo_spec, tmp_path, facts)
    assert any(f.check == "clock" and f.status == "unknown" for f in result.findings)
    assert result.status in ("ok", "warn") and "accepted_unknowns" not in ctx.record.data


def test_the_helper_says_when_proc_net_tcp_alone_is_unreadable(monkeypatch) -> None:
    """Before, only both tables unread made an error line: an unread /proc/net/tcp beside a readable tcp6 lost
    every IPv4 listener without a word, and the port read as free."""
    from sparkfleet.fleet.nodeside import facts as helper

    tcp6 = ("  sl  local_address rem_address st tx_queue rx_queue tr tm->when retrnsmt uid timeout inode\n"
            "   0: 00000000000000000000000000000000:0016 00000000000000000000000000000000:0000 0A 00000000:00000000 "
            "00:00000000 00000000 0 0 4242 1 0000000000000000 100 0 0 10 0\n")

    def read_text(path: str) -> str:
        if path == "/proc/net/tcp":
            raise PermissionError(13, "Permission denied", path)
        if path == "/proc/net/tcp6":
            return tcp6
        raise AssertionError(path)

    monkeypatch.setattr(helper, "read_text", read_text)
    errors: list[str] = []
    got = helper.listening({}, errors)
    assert [(x["port"], x["address"]) for x in got] == [(22, "::")]
    assert errors == [TCP]
    # no tcp6 table at all (a kernel without IPv6) is not an error
    monkeypatch.setattr(helper, "read_text", lambda p: (_ for _ in ()).throw(FileNotFoundError(2, "No such file",
                                                                                                p)))
    errors = []
    assert helper.listening({}, errors) == [] and errors == [
        "listening: cannot read /proc/net/tcp: No such file"]
