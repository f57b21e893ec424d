"""Running `sparkfleet` in a test and reading what it printed: the `--json` event lines of up/down/restore."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import signal
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

from sparkfleet.cli.main import main

LAB_NODES = ("reddie", "asusi", "bluey", "spark4")  # the repo's `lab` inventory


def default_sigint() -> None:
    """In a child about to be sent Ctrl-C: SIGINT as a terminal's shell leaves it. A test run started in the
    background of a non-interactive shell inherits SIGINT ignored, and the child would never see it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run(capsys, *argv: str) -> tuple[int, list[dict]]:
    """`sparkfleet ARGV --json`: the exit code and every JSON event line it printed."""
    code = main([*argv, "--json"])
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    return code, events


def heal_and_down(lab, capsys, profile: str = "dcp2") -> None:
    """After a test: the lab's faults healed and the lane down (what it printed read away)."""
    lab.heal()
    main(["down", "--profile", profile, "--inventory", "sim", "--json"])
    capsys.readouterr()


def rank_has_lines(rank: int):
    """A predicate on `up --json` events: rank `rank`'s container runs and has logged (the lane is booting)."""
    return lambda e: e["event"] == "ranks" and any(r["rank"] == rank and r["state"] == "running" and r["lines"] > 0
                                                   for r in e["ranks"])


def up_acting_once(argv: list[str], *, when, act, env: dict | None = None,
                   timeout_s: float) -> tuple[int | None, list[dict], float | None]:
    """`sparkfleet up ARGV --json` as its own process, its events read as they come; `act(process)` runs once,
    at the first event `when(event)` holds for. Returns up's exit code (None if it ran past `timeout_s` after its
    output ended: then it is killed), every event, and the time `act` returned (None if it never ran)."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "from sparkfleet.cli.main import main; raise SystemExit(main())",
                             "up", *argv, "--json"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            cwd=Path(__file__).resolve().parent.parent, env=env,
                            preexec_fn=default_sigint)  # an `act` may press Ctrl-C
    events, acted = [], None
    try:
        for line in proc.stdout:
            if not line.startswith("{"):
                continue
            events.append(e := json.loads(line))
            if acted is None and when(e):
                act(proc)
                acted = time.time()
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return code, events, acted


def result(events: list[dict]) -> dict:
    return next(e for e in events if e["event"] == "result")


def steps(events: list[dict]) -> dict[str, str]:
    """Each step's final status (the `start` events left out)."""
    return {e["step"]: e["status"] for e in events if e["event"] == "step" and e["status"] != "start"}


def step(events: list[dict], name: str) -> dict:
    return next(e for e in events if e["event"] == "step" and e["step"] == name and e["status"] != "start")


def findings(events: list[dict], name: str) -> list[dict]:
    """Every finding a step reported."""
    return [f for e in events if e["event"] == "findings" and e["step"] == name for f in e["findings"]]


def record_of(events: list[dict]) -> dict:
    """The run record the run's result names, read from the state dir."""
    run_id = result(events)["run_id"]
    return json.loads((Path(os.environ["SPARKFLEET_STATE"]) / "runs" / f"{run_id}.json").read_text())


def node_containers(sim, node: str) -> list[dict]:
    """Every container of a node as `docker inspect` shows it, oldest first, straight from the node's docker:
    its real daemon (sim up --docker daemon), or the shim's state."""
    if sim.docker == "daemon":  # a node that is off or whose daemon is down cannot say: never read as "none"
        ps = sim.exec(node, ["docker", "ps", "-aq", "--no-trunc"])
        assert ps.returncode == 0, f"{node}: docker ps: {ps.stderr.decode(errors='replace').strip()}"
        ids = ps.stdout.decode().split()
        found = json.loads(sim.exec(node, ["docker", "inspect", *ids]).stdout) if ids else []
        return sorted(found, key=lambda c: c["Created"])
    return json.loads((sim.state_dir(node) / "docker.json").read_text())["containers"]


def lane_containers(sim, profile: str | None, nodes: tuple[str, ...] = LAB_NODES) -> dict[str, list[dict]]:
    """Every node's containers of a lane (profile None: of any lane), oldest first (node_containers)."""
    return {node: [c for c in node_containers(sim, node)
                   if (c["Config"]["Labels"] or {}).get("sparkfleet.profile") == profile
                   or (profile is None and "sparkfleet.profile" in (c["Config"]["Labels"] or {}))]
            for node in nodes}


def container_log(sim, node: str, cid: str) -> str:
    """A container's log, stdout and stderr in the order written: the real daemon's json-file log (each
    record's `log`), or the shim's log file."""
    if sim.docker == "daemon":
        path = sim.exec(node, ["docker", "inspect", "-f", "{{.LogPath}}", cid]).stdout.decode().strip()
        lines = (sim.root(node) / path.lstrip("/")).read_bytes().decode(errors="replace").split("\n")
        return "".join(json.loads(line)["log"] for line in lines if line)
    # bytes, not read_text: its universal newlines would turn a tqdm bar's `\r` into a line break
    return (sim.state_dir(node) / "logs" / f"{cid}.log").read_bytes().decode(errors="replace")


def why_up_failed(sim, events: list[dict], profile: str, tail: int = 25) -> str:
    """An assertion message for an `up` that should have served: its reason whole, each failed step's message
    and findings, and every rank's state and log tail (a failed run stops its ranks but keeps them), so a
    failure in CI, where the lab is gone afterwards, says what the engine itself said."""
    out = [str(result(events).get("reason"))]
    out += [f"step {e['step']}: {e.get('summary', '')}" for e in events
            if e["event"] == "step" and e["status"] == "fail"]
    out += [f"  {f}" for e in events if e["event"] == "findings" for f in e["findings"] if f.get("status") == "fail"]
    for node, cs in lane_containers(sim, profile, tuple(sim.inventory().nodes)).items():  # the Station too
        for c in cs:
            log = container_log(sim, node, c["Id"]).splitlines()[-tail:]
            out.append(f"--- {node} {c['Name']} {c['State']['Status']} exit {c['State'].get('ExitCode')}")
            out += log
    return "\n".join(out)

LOG_WAIT_S = 10.0  # dockerd logs a container's line as soon as it reads it; a loaded 2-core machine is slower
REPULLED_AT = "2026-12-01T00:00:00Z"  # when the re-pulled build of a tag was made (its config's `created`)


def container_write(sim, node: str, cid: str, text: str) -> None:
    """The container's main process writes `text` to its stdout, as its engine does: on the real daemon
    through its pid 1's stdout (`docker exec`), and only once dockerd has logged `text` through its last
    newline (dockerd's log copier keeps a line back until its newline); on the shim, its log file."""
    if sim.docker != "daemon":
        with (sim.state_dir(node) / "logs" / f"{cid}.log").open("a") as f:
            f.write(text)
        return
    before = container_log(sim, node, cid)
    r = sim.exec(node, ["docker", "exec", cid, "/bin/sh", "-c", 'printf "%s" "$1" >/proc/1/fd/1', "sh", text])
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    done = text[:text.rfind("\n") + 1]
    if not done:
        return
    last = done[:-1].rsplit("\n", 1)[-1] + "\n"
    deadline = time.monotonic() + LOG_WAIT_S
    while last not in container_log(sim, node, cid)[len(before):]:
        assert time.monotonic() < deadline, f"dockerd on {node} did not log {last!r} within {LOG_WAIT_S:.0f} s"
        time.sleep(0.05)


def _image_id(sim, node: str, ref: str) -> str:
    r = sim.exec(node, ["docker", "image", "inspect", "-f", "{{.Id}}", ref])
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return r.stdout.decode().strip()


def _rebuilt(saved: bytes) -> tuple[bytes, str]:
    """A `docker save` archive of one image as another build of it under the same tag (its config made at
    REPULLED_AT, its layers the same): (the archive, the new image id)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(saved)) as src, tarfile.open(fileobj=out, mode="w") as dst:
        (entry,) = json.loads(src.extractfile("manifest.json").read())
        cfg = json.loads(src.extractfile(entry["Config"]).read())
        cfg["created"] = REPULLED_AT
        for h in cfg.get("history") or []:
            h["created"] = REPULLED_AT
        data = json.dumps(cfg, sort_keys=True, separators=(",", ":")).encode()
        digest = hashlib.sha256(data).hexdigest()
        entry["Config"] = f"{digest}.json"
        for m in src.getmembers():
            if m.name in ("manifest.json", "repositories") or m.name.endswith(".json") and "/" not in m.name:
                continue
            dst.addfile(m, src.extractfile(m) if m.isfile() else None)
        for name, body in ((entry["Config"], data), ("manifest.json", json.dumps([entry]).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            dst.addfile(info, io.BytesIO(body))
    return out.getvalue(), "sha256:" + digest


def _repull(sim, node: str, ref: str, old: str) -> str:
    """The tag `ref` re-pulled on `node` (another build of its image); returns the tag's new image id."""
    if sim.docker == "daemon":
        saved = sim.exec(node, ["docker", "save", ref])
        assert saved.returncode == 0, saved.stderr.decode(errors="replace")
        data, new = _rebuilt(saved.stdout)
        tar = sim.state_dir(node) / "repulled.tar"
        tar.write_bytes(data)
        try:
            r = sim.exec(node, ["docker", "load", "-q", "-i", f"/{tar.relative_to(sim.root(node))}"])
        finally:
            tar.unlink()
        assert r.returncode == 0, r.stderr.decode(errors="replace")
        assert _image_id(sim, node, ref) == new
        return new
    path = sim.state_dir(node) / "docker.json"
    docker = json.loads(path.read_text())
    new = "sha256:" + hashlib.sha256(f"{old} re-pulled at {REPULLED_AT}".encode()).hexdigest()
    (image,) = [i for i in docker["images"] if i["Id"] == old]
    image["Id"] = new
    path.write_text(json.dumps(docker))
    return new


def _unpull(sim, node: str, ref: str, old: str, new: str) -> None:
    """The tag `ref` back on its old image `old`; the re-pulled build `new` removed unless a container runs it."""
    if sim.docker == "daemon":
        r = sim.exec(node, ["docker", "tag", old, ref])
        assert r.returncode == 0, r.stderr.decode(errors="replace")
        if not [c for c in node_containers(sim, node) if c["Image"] == new]:
            r = sim.exec(node, ["docker", "image", "rm", new])
            assert r.returncode == 0, r.stderr.decode(errors="replace")
        assert _image_id(sim, node, ref) == old
        return
    path = sim.state_dir(node) / "docker.json"
    docker = json.loads(path.read_text())
    for i in docker["images"]:
        if i["Id"] == new:
            i["Id"] = old
    path.write_text(json.dumps(docker))


@contextlib.contextmanager
def repulled(sim, nodes: tuple[str, ...], ref: str) -> Iterator[str]:
    """Within the block, the tag `ref` was re-pulled on each of `nodes`: another build of its image (one new
    id on every node), the old image kept for what still runs it; after it, the tag is back on the old image.
    Yields the new image id. On the real daemon this is `docker load` of a rebuilt archive; on the shim, its
    image record's id."""
    olds = {n: _image_id(sim, n, ref) if sim.docker == "daemon" else
            next(i["Id"] for i in json.loads((sim.state_dir(n) / "docker.json").read_text())["images"]
                 if ref in i["RepoTags"]) for n in nodes}
    done: dict[str, str] = {}
    try:
        for n in nodes:
            done[n] = _repull(sim, n, ref, olds[n])
        assert len(set(done.values())) == 1, done
        yield next(iter(done.values()))
    finally:
        for n, new in done.items():
            _unpull(sim, n, ref, olds[n], new)


def lane_states(sim, profile: str = "dcp2", nodes: tuple[str, ...] = LAB_NODES) -> dict[str, list[str]]:
    """Each node's container states of a lane (docker's State.Status), in the order docker holds them."""
    return {n: [c["State"]["Status"] for c in cs] for n, cs in lane_containers(sim, profile, nodes).items()}
