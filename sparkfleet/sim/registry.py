"""SIMULATION support: the lab's image registry, so the nodes' real dockerds show real RepoDigests.

Debian's `docker-registry` (the Distribution registry, 2.8) runs on this machine on the lab's
management network, at the bridge's address (the nodes' route to this machine), port PORT; its
storage is under the lab's directory. Every node's dockerd takes it as its Docker Hub mirror
(`--registry-mirror`, as sites point their nodes at a local mirror) and may push to it over plain
HTTP (`--insecure-registry`: the lab's own network). `sim up --docker daemon` loads each node's image
archive, pushes each image once (from the first node that holds it) as `ADDRESS/<repo>:<tag>`, and
has every node `docker pull <repo>:<tag>`: the pull goes through the mirror, so `docker image
inspect` shows `RepoDigests: [<repo>@sha256:...]` with the digest the registry computed, the same on
every node, which a profile's `image.digest` pin is checked against (checks/image.py). Without the
management network (no network namespaces) there is no registry: images are loaded only, with no
RepoDigests, as a locally built image has none.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from sparkfleet.schema.errors import UserError
from sparkfleet.sim import daemon, netlab, node, paths

BINARY = "/usr/bin/docker-registry"  # Debian's package docker-registry
PORT = 5000  # the registry's own default (its config's http.addr :5000)
START_TIMEOUT_S = 30.0
PUSH_TIMEOUT_S = 120.0


def address() -> str:
    """host:port the nodes reach the registry at (this machine's end of the management bridge)."""
    return f"{netlab.MGMT_NET.network_address + 1}:{PORT}"


def missing() -> list[str]:
    return [] if os.access(BINARY, os.X_OK) else [f"{BINARY} (Debian package docker-registry)"]


def _dir() -> Path:
    return paths.sim_dir() / "registry"


def config(storage: Path) -> str:
    """The registry's config (the Debian package's, less auth: the lab's network is its own)."""
    return (f"version: 0.1\nlog:\n  level: warn\n  fields:\n    service: registry\n"
            f"storage:\n  filesystem:\n    rootdirectory: {storage}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: {address()}\n")


def start() -> int:
    """Start the registry and wait until it answers /v2/; its pid (kept in the lab's manifest)."""
    d = _dir()
    (d / "storage").mkdir(parents=True, exist_ok=True)
    (d / "config.yml").write_text(config(d / "storage"))
    with open(d / "registry.log", "ab") as log:
        proc = subprocess.Popen([BINARY, "serve", str(d / "config.yml")], stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    (d / "registry.pid").write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        with contextlib.suppress(urllib.error.URLError, OSError):
            with urllib.request.urlopen(f"http://{address()}/v2/", timeout=2) as r:  # noqa: S310 - the lab's own
                if r.status == 200:
                    return proc.pid
        time.sleep(0.1)
    tail = (d / "registry.log").read_text(errors="replace").strip().splitlines()[-3:]
    raise UserError(f"sim registry: {BINARY} did not answer on {address()} within {START_TIMEOUT_S:g} s: "
                    + (" | ".join(tail) or "no log"))


def stop() -> None:
    """End the registry by its pid file (safe when it never started)."""
    try:
        pid = int((_dir() / "registry.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    daemon.stop(pid, Path(BINARY).name, grace_s=5)
    shutil.rmtree(_dir(), ignore_errors=True)


def _docker(node_dir: Path, name: str, *argv: str) -> None:
    r = node.run_in(node_dir, ["/usr/bin/docker", *argv], timeout_s=PUSH_TIMEOUT_S)
    if r is None or r.returncode != 0:
        why = (r.stderr or r.stdout).decode(errors="replace").strip().splitlines()[-1:] if r else ["no answer"]
        raise UserError(f"simulated node {name}: docker {argv[0]} {argv[-1]} failed: {' '.join(why)}")


def hub_path(ref: str) -> str | None:
    """The repository path a Docker Hub ref has in a registry ("library/x:t" for "x:t"); None for a ref
    naming another registry (its first part a host: a '.' or ':' in it, or localhost), which no Docker Hub
    mirror serves."""
    first, slash, _rest = ref.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return None
    return ref if slash else f"library/{ref}"


def publish(node_dir: Path, name: str, refs: list[str], pushed: set[str]) -> None:
    """Push each of the node's loaded Docker Hub images not pushed yet (adding it to `pushed`), then pull
    every one through the mirror, so the node's RepoDigests are the registry's. Images of other registries
    stay loaded only (no RepoDigests): a Docker Hub mirror does not serve them."""
    for ref in refs:
        path = hub_path(ref)
        if path is None:
            continue
        if ref not in pushed:
            there = f"{address()}/{path}"
            _docker(node_dir, name, "tag", ref, there)
            _docker(node_dir, name, "push", there)
            _docker(node_dir, name, "rmi", there)
            pushed.add(ref)
        _docker(node_dir, name, "pull", ref)
