"""Conflicts: whatever holds the lane's port, master port or GPU, found by port and GPU, never by name.

The seeds' safety check matched only `dsfv-*` container names and a GLM lane on :30001 stayed live
during a launch (docs/failure-modes.md FM-48; HLT-02). Here a container without sparkfleet labels is foreign: it is
named and never touched. A container of this lane is stale (an earlier launch; `up` stops it first,
FM-01). A container of another sparkfleet lane holding the port or GPU refuses the lane (DESIGN OQ-01).
"""

from __future__ import annotations

from sparkfleet.findings import Finding
from sparkfleet.fleet.nodefacts import Container
from sparkfleet.naming import LABEL_PREFIX, PROFILE_LABEL, RUN_LABEL

from .context import CheckContext, part_error, unread

CHECK = "conflicts"
LIVE = ("running", "restarting", "paused")  # states that keep their ports and GPU
OWN = f"{LABEL_PREFIX}."
FOREIGN_REMEDY = ("sparkfleet never stops what it did not start: stop it yourself or pick another lane "
                  "(docs/failure-modes.md FM-48)")


def describe(c: Container) -> str:
    run = c.labels.get(RUN_LABEL)
    return f"{c.name} ({c.image}, {c.state}" + (f", run {run}" if run else "") + ")"


def check(ctx: CheckContext) -> list[Finding]:
    out: list[Finding] = []
    p = ctx.profile
    ports: dict[int, str] = {}
    if p.port is not None:
        ports[p.port] = "port"
    if p.master_port is not None and len(ctx.plan.ranks) > 1:
        ports.setdefault(p.master_port, "master port")
    for r, f in ctx.ranks():
        node = r.node.name
        launch = ctx.launch(node)
        if launch is not None and launch.spec is not None:
            watch = dict(launch.spec.ports)  # what this rank's container listens on (its adapter says)
        else:
            # only the head serves the API and the rendezvous; every rank needs its GPU
            watch = ports if r.rank == 0 else {}
        held_what = ", ".join([f":{port}" for port in watch] + ["the GPU"])
        expected = f"nothing else holds {held_what}"
        mine: list[Finding] = []
        docker_ok = f.docker is not None and f.docker.available
        containers = f.docker.containers if f.docker and docker_ok else []
        published: set[int] = set()
        for c in containers:
            live = c.state in LIVE
            held = [f":{port} ({what})" for port, what in watch.items() if live and port in c.host_ports]
            published |= {port for port in watch if live and port in c.host_ports}
            if live and c.gpus:
                held.append("the GPU")
            lane = c.labels.get(PROFILE_LABEL)
            holds = f"; holds {', '.join(held)}" if held else ""
            if lane == p.name:
                mine.append(Finding(CHECK, "warn", f"container {c.name} is from an earlier launch of this lane{holds}",
                                    f"`sparkfleet up` stops it first (relaunch race, docs/failure-modes.md FM-01); or "
                                    f"`sparkfleet down --profile {p.name}`", node=node, observed=describe(c),
                                    expected=expected))
            elif not held:
                continue
            elif lane:
                mine.append(Finding(CHECK, "fail", f"sparkfleet lane {lane} holds {', '.join(held)} "
                                    f"(container {c.name})", f"stop that lane first: `sparkfleet down --profile "
                                    f"{lane}` (one lane per port, DESIGN OQ-01)", node=node, observed=describe(c),
                                    expected=expected))
            elif any(k.startswith(OWN) for k in c.labels):
                labels = ", ".join(f"{k}={v}" for k, v in sorted(c.labels.items()) if k.startswith(OWN))
                mine.append(Finding(CHECK, "warn", f"sparkfleet container {c.name} ({labels}) holds {', '.join(held)}",
                                    f"let it finish, or `docker rm -f {c.name}` on {node}", node=node,
                                    observed=describe(c), expected=expected))
            else:
                mine.append(Finding(CHECK, "fail", f"foreign container {c.name} holds {', '.join(held)}",
                                    FOREIGN_REMEDY, node=node, observed=describe(c) + ", no sparkfleet labels",
                                    expected=expected))
        hostnet = [c for c in containers if c.state in LIVE and c.network_mode == "host"]
        # an unread socket table or container list is empty, not "nothing holds the port" (FM-48)
        for error in filter(None, (part_error(f, "listening") if watch else None,
                                   part_error(f, "docker inspect") if docker_ok else None)):
            mine.append(unread(CHECK, node, error, expected))
        for port, what in (watch.items() if not part_error(f, "listening") else ()):
            listeners = [x for x in f.listening if x.port == port]
            if not listeners or port in published:
                continue  # nobody, or the publishing container above (docker-proxy) already named
            who = ", ".join(f"{x.process or '?'} (pid {x.pid if x.pid is not None else '?'}) on {x.address}"
                            for x in listeners)
            stale = [c.name for c in hostnet if c.labels.get(PROFILE_LABEL) == p.name]
            if stale:
                mine.append(Finding(CHECK, "warn", f":{port} ({what}) is held by {who}, most likely this lane's "
                                    f"running container {', '.join(stale)}",
                                    "`sparkfleet up` stops it first and checks again (docs/failure-modes.md FM-01)",
                                    node=node,
                                    observed=f"listening: {who}", expected=expected))
                continue
            suspects = [describe(c) for c in hostnet]
            mine.append(Finding(CHECK, "fail", f":{port} ({what}) is held by {who}"
                                + (f"; host-network containers here: {', '.join(suspects)}" if suspects else ""),
                                FOREIGN_REMEDY, node=node, observed=f"listening: {who}", expected=expected))
        if not docker_ok:
            mine.append(Finding(CHECK, "warn", "docker not available: containers were not checked",
                                f"check the docker daemon on {node}", node=node,
                                observed=(f.docker.error if f.docker else None) or "docker not reported",
                                expected=expected))
        if not mine:
            mine.append(Finding(CHECK, "ok", f"nothing holds {held_what}", node=node,
                                observed=f"{len(containers)} container(s), {len(f.listening)} listening socket(s)",
                                expected=expected))
        out += mine
    return out
