"""The fleet lock taken by a controller whose user on the nodes is not root, through `sparkfleet down`.

No simulated lab: each node is this machine, its commands run in a real bash as uid ME (not root, no
capabilities) in a mount namespace of their own where /run/lock is a fresh sticky directory (mode 1777,
as on Ubuntu/DGX OS). The lock command runs unchanged against the real /run/lock path. The nodes' PATH has
no docker (docker_free_path), so nothing past the lock can touch this machine's containers (a `down` that gets that far
fails at its stop step, as on a node without docker).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from sparkfleet.cli.main import main
from sparkfleet.runner.lock import STALE_AFTER_S
from tests.conftest import REPO

SPARKS = ("reddie", "asusi", "bluey", "spark4")
ME, OTHER = 4243, 4244  # uids with no name on this machine: the node says "uid N"


def docker_free_path(d: Path) -> str:
    """The node's PATH: one dir of links to this machine's /usr/sbin and /usr/bin tools, less docker's (the
    machine may well have a docker CLI: Debian's docker.io, or one in /usr/local/bin)."""
    d.mkdir(parents=True)
    for src in (Path("/usr/sbin"), Path("/usr/bin")):
        for tool in sorted(src.iterdir()):
            if not tool.name.startswith("docker") and not (d / tool.name).exists():
                (d / tool.name).symlink_to(tool)
    return str(d)


def need(*tools: str) -> None:
    missing = [t for t in tools if not os.path.exists(t)]
    if os.geteuid() != 0 or missing:
        pytest.skip("needs root (to enter a mount namespace and drop to another uid) and " + ", ".join(tools))


@pytest.fixture
def nodes(tmp_path, ops_root, monkeypatch, request) -> dict[str, Path]:
    """An inventory `userlock` of the lab's nodes, each a node as described above; its /run/lock dirs."""
    need("/usr/bin/unshare", "/usr/bin/setpriv", "/usr/bin/flock")
    monkeypatch.setenv("SPARKFLEET_STATE", str(tmp_path / "state"))
    inv = yaml.safe_load((REPO / "inventories/lab.yaml").read_text())
    inv["name"], inv["example"] = "userlock", False
    dirs = {}
    bin_dir = Path(tempfile.mkdtemp(prefix="sf-nodocker-"))  # not under tmp_path: uid ME must reach it
    bin_dir.chmod(0o755)
    request.addfinalizer(lambda: shutil.rmtree(bin_dir))
    path = docker_free_path(bin_dir / "bin")
    for name, node in inv["nodes"].items():  # the Station too (its group must resolve); dcp2 runs on the Sparks
        d = dirs[name] = tmp_path / "nodes" / name / "run-lock"
        d.mkdir(parents=True)
        d.chmod(0o1777)
        inner = (f'mount --bind "$0" /run/lock && exec /usr/bin/setpriv --reuid {ME} --regid {ME} --clear-groups '
                 f'-- /usr/bin/env PATH={path} "$@"')
        wrapper = tmp_path / "nodes" / name / "enter"
        wrapper.write_text(f"#!/bin/sh\n# node {name}: this machine, {d} as its /run/lock, commands as uid {ME}\n"
                           f"exec /usr/bin/unshare --mount --propagation private -- /bin/sh -c {shlex.quote(inner)} "
                           f"{shlex.quote(str(d))} \"$@\"\n")
        wrapper.chmod(0o755)
        node.update(transport="local", wrapper=[str(wrapper)])
    (ops_root / "inventories/userlock.yaml").write_text(yaml.safe_dump(inv, sort_keys=False))
    return dirs


def plant(d: Path, uid: int) -> str:
    """A lock another controller left a day and more ago (its host cannot be asked: only age judges it),
    owned on the node by `uid`."""
    text = json.dumps({"user": "ops", "host": "laptop-2", "pid": 4242, "run_id": "20261130-010203-abcd",
                       "command": "sparkfleet up dcp2", "lane": "dcp2", "since": "2026-11-30T01:02:03+0000"},
                      sort_keys=True)
    lock = d / "sparkfleet.lock"
    lock.write_text(text + "\n")
    os.chown(lock, uid, uid)
    t = time.time() - STALE_AFTER_S - 600
    os.utime(lock, (t, t))
    return text


def down(ops_root: Path, capsys) -> tuple[int, list[dict], str]:
    code = main(["down", "--profile", "dcp2", "--inventory", "userlock", "--root", str(ops_root), "--json"])
    cap = capsys.readouterr()
    return code, [json.loads(x) for x in cap.out.splitlines() if x.startswith("{")], cap.err


def listing(d: Path) -> list[tuple[str, int, bytes]]:
    return sorted((p.name, p.stat().st_uid, p.read_bytes()) for p in d.iterdir())


def test_another_users_stale_lock_in_sticky_run_lock_is_refused_naming_owner_and_remedy(nodes, ops_root,
                                                                                       capsys) -> None:
    text = plant(nodes["reddie"], OTHER)
    code, events, err = down(ops_root, capsys)
    assert code == 75, err
    age = (STALE_AFTER_S + 600) / 3600
    assert err == (
        f"sparkfleet: reddie: the fleet lock /run/lock/sparkfleet.lock is stale (it is {age:.1f} h old (older than "
        f"{STALE_AFTER_S / 3600:.1f} h) and its host cannot be asked) but belongs to uid {OTHER}, and this run's "
        f"user there, uid {ME}, cannot remove it: /run/lock is sticky (mode 1777: only a file's owner or root may "
        "remove it); rm said: rm: cannot remove '/run/lock/sparkfleet.lock': Operation not permitted; it holds "
        "'sparkfleet up dcp2' by ops@laptop-2 pid 4242 (run 20261130-010203-abcd) since 2026-11-30T01:02:03+0000; "
        "nothing was done: on reddie, run `sudo rm /run/lock/sparkfleet.lock` (or remove it as uid "
        f"{OTHER}), then run again\n")
    assert not [e for e in events if e["event"] in ("step", "findings")]  # nothing ran past the lock
    # the bytes on disk: the stale lock as it was; the other nodes' locks (taken by this run) given back
    assert listing(nodes["reddie"]) == [("sparkfleet.lock", OTHER, (text + "\n").encode())]
    for node in ("asusi", "bluey", "spark4", "station"):
        assert listing(nodes[node]) == []


def test_a_non_root_take_over_of_its_own_users_stale_lock_leaves_nothing_behind(nodes, ops_root, capsys) -> None:
    plant(nodes["reddie"], ME)
    code, events, err = down(ops_root, capsys)
    warned = [(f["node"], f["status"], f["message"].split(":")[0]) for e in events
              if e["event"] == "findings" and e["step"] == "lock" for f in e["findings"]]
    assert warned == [("reddie", "warn", "took over a stale fleet lock (it is 24.2 h old (older than 24.0 h) and "
                                         "its host cannot be asked)")]
    # the run went on: its stop step is the first to need docker, which these nodes do not have
    res = next(e for e in events if e["event"] == "result")
    assert code == 1 and res["reason"].startswith("stop: no node answered; reddie (missing-binary), "), err
    for node in nodes:  # given back, and no temp or guard file anywhere
        assert listing(nodes[node]) == []
