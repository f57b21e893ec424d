"""`--dry-run` touches nothing: nodes whose shell records every command they receive get none from
`up/down/restore/check --nccl --fabric/patches push/engram-local --dry-run`, SSH nodes get no connection, and
`--dry-run=facts` sends them only reads."""

from __future__ import annotations

import json
import shlex
import socket
import threading
from pathlib import Path

import pytest
import yaml

from sparkfleet.cli.main import main

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)


def recording_inventory(ops: Path, log: Path, *, answer: bool) -> None:
    """inventories/rec.yaml: the lab's nodes, each entered through a shell that appends every command it
    receives to `log`; with `answer` it then runs the command here (read-only facts) with the test's HOME as
    the node's (as a login gives one: the local transport passes a wrapped node nothing of this machine's env,
    and a command without HOME would take the real user's from passwd), else it fails as an unreachable node
    does."""
    rec, bin_dir = ops / "rec.sh", ops / "node-bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text("#!/bin/sh\nexit 0\n")  # `docker ps -q` on a node with no container
    (bin_dir / "docker").chmod(0o755)
    # nodes run in parallel: each command is appended whole, under a lock on the log
    rec.write_text("#!/bin/bash\nnode=$1; shift\n"
                   f"exec 9>>{log}; flock 9; printf '%s\\t%s\\n' \"$node\" \"${{*: -1}}\" >&9; exec 9>&-\n"
                   + (f'export PATH={bin_dir}:/usr/bin:/bin HOME={shlex.quote(str(Path.home()))}\nexec "$@"\n'
                      if answer else "exit 255\n"))
    rec.chmod(0o755)
    data = yaml.safe_load((ops / "inventories" / "lab.yaml").read_text())
    data["name"], data["example"] = "rec", False
    for name, node in data["nodes"].items():
        node["transport"] = "local"
        node["wrapper"] = [str(rec), name]
    (ops / "inventories" / "rec.yaml").write_text(yaml.safe_dump(data))


def events(capsys) -> list[dict]:
    return [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]


@pytest.fixture
def rec(ops_root: Path, tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    monkeypatch.setenv("SPARKFLEET_STATE", str(tmp_path / "state"))
    log = tmp_path / "received.log"
    recording_inventory(ops_root, log, answer=False)
    return ops_root, log


def test_up_dry_run_sends_nothing_and_shows_every_step_s_commands(rec, capsys) -> None:
    ops, log = rec
    code = main(["up", "--profile", "dcp2", "--root", str(ops), "-i", "rec", "--dry-run", "--json"])
    seen = events(capsys)
    assert code == 0, seen[-3:]
    assert not log.exists(), log.read_text()
    would = [e for e in seen if e["event"] == "would"]
    what = {e["what"] for e in would}
    assert {"take the fleet lock", "list the lane's containers", "stop the lane's containers", "drop the page cache",
            "run facts.py", "read each rank's Engram manifest"} <= what, what
    # a command that depends on a read names what it stands for
    stops = {e["node"]: e["command"] for e in would if e["what"] == "stop the lane's containers"}
    assert stops == {n: f"docker rm -f '<ids of the lane'\"'\"'s containers on {n}>'"
                     for n in ("reddie", "asusi", "bluey", "spark4")}
    # every rank's launch, workers before the head
    starts = [e for e in would if e["what"].startswith("start rank")]
    assert [e["node"] for e in starts][-1] == "reddie" and {e["node"] for e in starts} == set(stops)
    assert all("docker run" in e["command"] for e in starts)
    # the steps that need the live lane show their node commands too: wait_ready one poll's reads of every rank
    # (its container id a placeholder), expect the facts after load, each after the launch
    order = [e["what"] for e in would]
    last_start = max(i for i, w in enumerate(order) if w.startswith("start rank"))
    inspect = {e["node"]: e["command"] for e in would if e["what"] == "inspect the ranks"}
    assert inspect == {n: f"docker inspect '<id of rank {r}'\"'\"'s container on {n}>'"
                       for r, n in enumerate(("reddie", "asusi", "bluey", "spark4"))}
    logs = {e["node"] for e in would if e["what"] == "read the ranks' new log lines"}
    assert logs == set(stops) and order.index("inspect the ranks") > last_start
    assert order.index("read the ranks' new log lines") > order.index("inspect the ranks")
    assert [i for i, w in enumerate(order) if w == "run facts.py"][-1] > order.index("read the ranks' new log lines")
    assert sum(w == "run facts.py" for w in order) == 8  # the facts step's and expect's, per node
    done = {e["step"]: e["summary"] for e in seen if e["event"] == "step" and e["status"] != "start"}
    assert done["wait_ready"].startswith("would poll http://") and "/health and /v1/models" in done["wait_ready"]
    assert done["expect"].startswith("would assert the profile's expectations")
    assert done["gates"].startswith("would run gates ")
    assert [e for e in seen if e["event"] == "result"][0]["outcome"] == "ok"


def test_down_restore_check_nccl_patches_push_engram_local_dry_run_send_nothing(rec, capsys) -> None:
    ops, log = rec
    root = ["--root", str(ops), "-i", "rec"]
    assert main(["down", "--profile", "dcp2", *root, "--dry-run", "--json"]) == 0
    down = events(capsys)
    assert {"stop the lane's containers"} <= {e["what"] for e in down if e["event"] == "would"}
    assert main(["restore", "dcp2", *root, "--dry-run", "--json"]) == 0
    restored = events(capsys)
    assert {"take the fleet lock", "stop the lane's containers", "run facts.py"} <= \
        {e["what"] for e in restored if e["event"] == "would"}
    assert [e for e in restored if e["event"] == "result"][0]["outcome"] == "ok"
    assert main(["check", "--profile", "dcp2", *root, "--nccl", "--fabric", "--dry-run", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["contacted"] == [] and [c["node"] for c in doc["nccl"]["commands"]] == \
        ["reddie", "asusi", "bluey", "spark4"]
    # the facts it would gather: the helper's command per node, shown by the executor, not only the nodes' names
    facts = [w for w in doc["would"] if w["what"] == "run facts.py"]
    assert [w["node"] for w in facts] == doc["would_gather_facts"] == ["reddie", "asusi", "bluey", "spark4"]
    assert all(w["command"].startswith("python3 ") and json.loads(w["stdin"])["node"] == w["node"] for w in facts)
    # the executor showed the all-reduce it would run, exactly the commands the report names, and the probe
    shown = [(w["node"], w["command"]) for w in doc["would"] if w["what"] == "NCCL all-reduce in the lane's image"]
    assert shown == [(c["node"], c["command"]) for c in doc["nccl"]["commands"]]
    rounds = [w for w in doc["would"] if w["what"].startswith("fabric probe round")]
    assert len(rounds) == 6 and all(json.loads(w["stdin"])["mode"] == "drive" for w in rounds)
    (ops / "profiles/dcp2-patched.yaml").write_text("extends: dcp2\npatches: probe\n")
    assert main(["patches", "push", "--profile", "dcp2-patched", *root, "--dry-run", "--json"]) == 0
    pushed = events(capsys)
    assert {e["what"] for e in pushed} == {"hash patch set 'probe'", "copy patch set 'probe' files that differ"}
    writes = [e for e in pushed if "write" in e]
    assert len(writes) == 4 and all(e["write"].endswith("/probe/sparkfleet_patch_probe.py") for e in writes)
    assert main(["engram-local", "--profile", "dcp2", *root, "--whole-shards", "--dry-run", "--json"]) == 0
    copies = events(capsys)
    assert {e["what"] for e in copies} == {"run engram_copy.py"} and len(copies) == 4
    assert not log.exists(), log.read_text()


def test_up_dry_run_opens_no_ssh_connection(ops_root: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    """SSH nodes at a listener that counts connections: --dry-run makes none."""
    monkeypatch.setenv("SPARKFLEET_STATE", str(tmp_path / "state"))
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.2)
    accepted: list[object] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            accepted.append(conn)
            conn.close()

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    data = yaml.safe_load((ops_root / "inventories" / "lab.yaml").read_text())
    data["name"], data["example"] = "tcp", False
    for node in data["nodes"].values():
        node["ssh"] = {"host": "127.0.0.1", "port": srv.getsockname()[1], "user": "root"}
    (ops_root / "inventories" / "tcp.yaml").write_text(yaml.safe_dump(data))
    # a head whose API is bound to loopback is reached through an SSH tunnel: shown by the executor, not opened
    (ops_root / "profiles" / "dcp2-loopback.yaml").write_text("extends: dcp2\nhost: 127.0.0.1\n")
    try:
        code = main(["up", "--profile", "dcp2", "--root", str(ops_root), "-i", "tcp", "--dry-run", "--json"])
        seen = events(capsys)
        looped = main(["up", "--profile", "dcp2-loopback", "--root", str(ops_root), "-i", "tcp", "--dry-run",
                       "--json"])
        tunnelled = events(capsys)
    finally:
        stop.set()
        t.join(2)
        srv.close()
    assert code == 0, seen[-3:]
    assert looped == 0, tunnelled[-3:]
    assert accepted == []
    assert not [e for e in seen if e["event"] == "would" and e["what"].startswith("forward a local port")]
    tunnels = [e for e in tunnelled if e["event"] == "would" and e["what"].startswith("forward a local port")]
    assert [(e["node"], e["command"]) for e in tunnels] == [("reddie", "ssh -N -L <a free local port>:127.0.0.1:8410 reddie")]


READS = ("python3 -c 'import hashlib, os, sys",  # the facts helper's sha256 guard (reads its copy)
         "python3 -c '#!/usr/bin/env python3",  # the facts helper run inline: nothing shipped
         "docker ps -a -q --no-trunc --filter",  # the lane's containers
         "cat ",  # the Engram manifests
         "python3 -c 'import hashlib,json,sys")  # the patch files' sha256 (fleet/ops/patches.py HASH_SCRIPT)


def test_dry_run_facts_sends_only_reads(ops_root: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("SPARKFLEET_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no facts helper shipped here: it must run inline
    log = tmp_path / "received.log"
    recording_inventory(ops_root, log, answer=True)
    main(["up", "--profile", "dcp2", "--root", str(ops_root), "-i", "rec", "--dry-run=facts", "--json"])
    seen = events(capsys)
    received = [line.split("\t", 1) for line in log.read_text().splitlines() if "\t" in line]
    assert {n for n, _ in received} == {"reddie", "asusi", "bluey", "spark4"}
    assert all(cmd.startswith(READS) for _, cmd in received), [c[:80] for _, c in received
                                                                 if not c.startswith(READS)]
    assert any(cmd.startswith(READS[1]) for _, cmd in received)  # facts really ran, inline
    assert not (tmp_path / "home" / ".cache").exists()  # and nothing was shipped
    facts = [e for e in seen if e["event"] == "step" and e["step"] == "facts" and e["status"] != "start"]
    assert facts and "node(s) answered" in facts[0]["summary"]
    # every other verb under --dry-run=facts: the nodes receive reads only (no all-reduce, probe, copy, push)
    root = ["--root", str(ops_root), "-i", "rec"]
    (ops_root / "profiles/dcp2-patched.yaml").write_text("extends: dcp2\npatches: probe\n")
    for argv in (["down", "--profile", "dcp2"], ["restore", "dcp2"], ["check", "--profile", "dcp2", "--nccl", "--fabric"],
                 ["patches", "push", "--profile", "dcp2-patched"], ["engram-local", "--profile", "dcp2", "--whole-shards"]):
        before = log.read_text().count("\n")
        main([*argv, *root, "--dry-run=facts", "--json"])
        shown = capsys.readouterr().out
        received = [line.split("\t", 1)[1] for line in log.read_text().splitlines()[before:] if "\t" in line]
        assert all(cmd.startswith(READS) for cmd in received), (argv, [c[:80] for c in received
                                                                       if not c.startswith(READS)])
        assert '"would"' in shown or "would" in shown, argv  # what it did not run, it showed
    assert not (tmp_path / "home" / ".cache").exists()


def test_verbose_shows_each_command_as_it_runs(rec, capsys) -> None:
    """-v: a `command` event per node for every command the executor runs (none without -v)."""
    ops, log = rec
    main(["up", "--profile", "dcp2", "--root", str(ops), "-i", "rec", "--json"])
    assert [e for e in events(capsys) if e["event"] == "command"] == []
    before = log.read_text().count("\n")
    main(["up", "--profile", "dcp2", "--root", str(ops), "-i", "rec", "-v", "--json"])
    ran = [e for e in events(capsys) if e["event"] == "command"]
    received = [line.split("\t", 1) for line in log.read_text().splitlines()[before:] if "\t" in line]
    # every command a node received was shown, node by node, first line for first line
    assert sorted((n, c) for n, c in received) == sorted((e["node"], e["command"].split("\n")[0]) for e in ran)
    assert {e["node"] for e in ran if e["what"] == "take the fleet lock"} == {"reddie", "asusi", "bluey", "spark4"}
