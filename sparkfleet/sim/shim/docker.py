"""`docker`: the emulator the unprivileged lab falls back to (ps, images, inspect, run, logs, stop, rm...),
written to the real CLI's output formats (docs/sim-layout.md).

THIS IS A SIMULATION: no GPU, container or RDMA device exists behind these commands.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

from .engine import _lane, rank_faults_due, start_engine
from .gpu import _mark_busy, step_times
from .render import render
from .state import (
    DAEMON_DOWN,
    ENGINE_STOP_WAIT_S,
    STATE,
    ZERO_TIME,
    ShimError,
    load,
    locked,
    parse_time,
    rfc3339,
    save,
)

# `docker run` options that take a value; every other option is a boolean (docker/cli's run flags).
RUN_VALUE_FLAGS = {
    "-a", "--attach", "--add-host", "--annotation", "--blkio-weight", "--blkio-weight-device", "--cap-add",
    "--cap-drop", "--cgroup-parent", "--cgroupns", "--cidfile", "-c", "--cpu-shares", "--cpu-period",
    "--cpu-quota", "--cpu-rt-period", "--cpu-rt-runtime", "--cpus", "--cpuset-cpus", "--cpuset-mems",
    "--detach-keys", "--device", "--device-cgroup-rule", "--device-read-bps", "--device-read-iops",
    "--device-write-bps", "--device-write-iops", "--dns", "--dns-option", "--dns-search", "--domainname",
    "--entrypoint", "-e", "--env", "--env-file", "--expose", "--gpus", "--group-add", "--health-cmd",
    "--health-interval", "--health-retries", "--health-start-interval", "--health-start-period",
    "--health-timeout", "-h", "--hostname", "--ip", "--ip6", "--ipc", "--isolation", "--kernel-memory",
    "-l", "--label", "--label-file", "--link", "--link-local-ip", "--log-driver", "--log-opt",
    "--mac-address", "-m", "--memory", "--memory-reservation", "--memory-swap", "--memory-swappiness",
    "--mount", "--name", "--network", "--net", "--network-alias", "--net-alias", "--oom-score-adj", "--pid",
    "--pids-limit", "--platform", "-p", "--publish", "--pull", "--restart", "--runtime", "--security-opt",
    "--shm-size", "--stop-signal", "--stop-timeout", "--storage-opt", "--sysctl", "--tmpfs", "--ulimit",
    "-u", "--user", "--userns", "--uts", "-v", "--volume", "--volume-driver", "--volumes-from", "-w",
    "--workdir",
}


RUN_BOOL_FLAGS = {
    "-d", "--detach", "-i", "--interactive", "-t", "--tty", "--rm", "--privileged", "--init", "--read-only",
    "-P", "--publish-all", "--oom-kill-disable", "--no-healthcheck", "-q", "--quiet", "--sig-proxy",
    "--disable-content-trust", "--use-api-socket",
}


def _docker_ready(root: Path) -> dict:
    docker = load(root, "docker.json")
    if docker.get("daemon") != "up":
        raise ShimError(DAEMON_DOWN, 1)
    return docker


def _short(image_or_container_id: str) -> str:
    return image_or_container_id.split(":", 1)[-1][:12]


def _find_container(docker: dict, ref: str) -> dict | None:
    for c in docker["containers"]:
        if c["Name"] == "/" + ref.lstrip("/") or c["Id"] == ref:
            return c
    matches = [c for c in docker["containers"] if len(ref) >= 1 and c["Id"].startswith(ref)]
    return matches[0] if len(matches) == 1 else None


def _find_image(docker: dict, ref: str) -> dict | None:
    if "@" in ref:  # repo[:tag]@sha256:...: the digest decides
        repo, digest = ref.split("@", 1)
        repo = repo.rsplit(":", 1)[0] if ":" in repo.rsplit("/", 1)[-1] else repo
        for img in docker["images"]:
            if f"{repo}@{digest}" in img["RepoDigests"]:
                return img
        return None
    tagged = ref if ":" in ref.rsplit("/", 1)[-1] else ref + ":latest"
    for img in docker["images"]:
        if tagged in img["RepoTags"] or img["Id"] == ref or img["Id"] == "sha256:" + ref:
            return img
    bare = ref.removeprefix("sha256:")
    matches = [i for i in docker["images"] if len(bare) >= 4 and i["Id"].removeprefix("sha256:").startswith(bare)]
    return matches[0] if len(matches) == 1 else None


def human_duration(seconds: float) -> str:
    """Docker's units.HumanDuration, as `docker ps` shows ages."""
    s = int(seconds)
    if s < 1:
        return "Less than a second"
    if s == 1:
        return "1 second"
    if s < 60:
        return f"{s} seconds"
    m = s // 60
    if m == 1:
        return "About a minute"
    if m < 60:
        return f"{m} minutes"
    h = round(s / 3600)
    if h == 1:
        return "About an hour"
    if h < 48:
        return f"{h} hours"
    if h < 24 * 7 * 2:
        return f"{h // 24} days"
    return f"{h // (24 * 7)} weeks"


def _status(c: dict, now: float) -> str:
    st = c["State"]
    if st["Running"]:
        return "Up " + human_duration(now - (parse_time(st["StartedAt"]) or now))
    if st["Status"] == "created":
        return "Created"
    ago = human_duration(now - (parse_time(st["FinishedAt"]) or now))
    return f"Exited ({st['ExitCode']}) {ago} ago"


def _ports(c: dict) -> str:
    out = []
    for cport, binds in sorted((c["NetworkSettings"].get("Ports") or {}).items()):
        for b in binds or []:
            host = "[::]" if b["HostIp"] == "::" else b["HostIp"]
            out.append(f"{host}:{b['HostPort']}->{cport}")
    return ", ".join(out)


def go_repr(value: Any) -> str:
    """How Go's text/template prints a value (maps sorted, as Go does)."""
    if value is None:
        return "<no value>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{go_repr(v)}" for k, v in sorted(value.items())) + "]"
    if isinstance(value, list):
        return "[" + " ".join(go_repr(v) for v in value) + "]"
    return str(value)


def _lookup(data: Any, path: str) -> Any:
    if path in ("", "."):
        return data
    for part in path.lstrip(".").split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


def go_template(template: str, data: Any) -> str:
    """The subset of Go templates scripts use with docker: {{.A.B}}, {{json .A}}, {{index .A "k"}}."""
    def action(m: re.Match) -> str:
        expr = m.group(1).strip()
        parts = re.findall(r'"[^"]*"|\S+', expr)
        if len(parts) == 1 and parts[0].startswith("."):
            return go_repr(_lookup(data, parts[0]))
        if len(parts) == 2 and parts[0] == "json" and parts[1].startswith("."):
            return json.dumps(_lookup(data, parts[1]), separators=(",", ":"))
        if len(parts) == 3 and parts[0] == "index" and parts[2].startswith('"'):
            return go_repr((_lookup(data, parts[1]) or {}).get(parts[2].strip('"')))
        if len(parts) == 2 and parts[0] == ".Label" and parts[1].startswith('"'):
            labels = data.get("Labels") or ""
            if isinstance(labels, str):  # docker ps rows: the CLI's "k=v,k2=v2" string
                labels = dict(kv.partition("=")[::2] for kv in labels.split(",") if kv)
            return go_repr(labels.get(parts[1].strip('"'), ""))
        raise ShimError(f"template parsing error: [sim] unsupported action {{{{{expr}}}}}", 1)
    text = template.replace("\\t", "\t").replace("\\n", "\n")
    return re.sub(r"\{\{(.*?)\}\}", action, text)


def _ps_row(c: dict, now: float, no_trunc: bool) -> dict:
    labels = c["Config"].get("Labels") or {}
    argv = (c["Config"].get("Entrypoint") or []) + (c["Config"].get("Cmd") or [])
    command = " ".join(argv)
    if not no_trunc and len(command) > 20:
        command = command[:19] + "…"
    return {
        "ID": c["Id"] if no_trunc else c["Id"][:12], "Names": c["Name"].lstrip("/"), "Image": c["Config"]["Image"],
        "Command": f'"{command}"', "Status": _status(c, now), "State": c["State"]["Status"], "Ports": _ports(c),
        "Labels": ",".join(f"{k}={v}" for k, v in sorted(labels.items())),
        "CreatedAt": created_at(parse_time(c["Created"]) or now),
        "RunningFor": human_duration(now - (parse_time(c["Created"]) or now)) + " ago",
        "Mounts": ",".join((b.split(":")[0].rstrip("/").rsplit("/", 1)[-1])[:20]
                           for b in c["HostConfig"].get("Binds") or []),
        "Networks": c["HostConfig"].get("NetworkMode") or "bridge", "LocalVolumes": "0", "Size": "0B",
    }


def created_at(t: float) -> str:
    """`docker ps`'s CreatedAt: Go's time.Time String() in the daemon's local zone (UTC on the sim's nodes)."""
    return _dt.datetime.fromtimestamp(t, tz=_dt.UTC).strftime("%Y-%m-%d %H:%M:%S +0000 UTC")


def _filters_match(c: dict, filters: list[str]) -> bool:
    labels = c["Config"].get("Labels") or {}
    for f in filters:
        key, _, value = f.partition("=")
        if key == "label":
            k, eq, v = value.partition("=")
            if k not in labels or (eq and labels[k] != v):
                return False
        elif key == "name":
            if not re.search(value, c["Name"].lstrip("/")):
                return False
        elif key == "status":
            if c["State"]["Status"] != value:
                return False
        elif key == "id":
            if not c["Id"].startswith(value):
                return False
        elif key == "ancestor":
            if c["Config"]["Image"] != value and c["Image"] != value:
                return False
        else:
            raise ShimError(f"Error response from daemon: invalid filter '{key}'", 1)
    return True


def _opts(argv: list[str], value_flags: set[str], bool_flags: set[str],
          interspersed: bool = True) -> tuple[dict[str, list[str]], list[str]]:
    """Split `argv` into options (flag -> values) and positionals, as docker's flag parser does; with
    interspersed=False (run) everything from the first positional on (IMAGE COMMAND...) is positional."""
    opts: dict[str, list[str]] = {}
    pos: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--" or (pos and not interspersed):
            pos += argv[i + 1:] if arg == "--" else argv[i:]
            break
        if arg.startswith("-") and arg != "-":
            key, eq, value = arg.partition("=")
            if key in value_flags:
                if not eq:
                    if i + 1 >= len(argv):
                        raise ShimError(f"flag needs an argument: {key}", 125)
                    value = argv[i + 1]
                    i += 1
                opts.setdefault(key, []).append(value)
            elif key in bool_flags:
                opts.setdefault(key, []).append(value or "true")
            elif not arg.startswith("--") and all(f"-{ch}" in bool_flags for ch in arg[1:]):
                for ch in arg[1:]:  # combined short booleans: -it, -dit
                    opts.setdefault(f"-{ch}", []).append("true")
            else:
                raise ShimError(f"unknown flag: {key}\nSee 'docker --help'.", 125)
        else:
            pos.append(arg)
        i += 1
    return opts, pos


def _get(opts: dict[str, list[str]], *names: str) -> list[str]:
    return [v for n in names for v in opts.get(n, [])]


def _flag(opts: dict[str, list[str]], *names: str) -> bool:
    vals = _get(opts, *names)
    return bool(vals) and vals[-1] not in ("false", "0")


def docker_ps(argv: list[str], root: Path) -> int:
    opts, pos = _opts(argv, {"-f", "--filter", "--format", "-n", "--last"},
                      {"-a", "--all", "-q", "--quiet", "--no-trunc", "-s", "--size", "-l", "--latest"})
    if pos:
        raise ShimError(f'"docker ps" accepts no arguments.\nSee \'docker ps --help\'.\n\nUsage:  docker ps '
                        f"[OPTIONS]\n\nList containers (got {pos[0]!r})", 1)
    docker = _refreshed(root)
    now = time.time()
    everyone = _flag(opts, "-a", "--all")
    rows = [c for c in reversed(docker["containers"])  # newest first, like docker
            if (everyone or c["State"]["Running"]) and _filters_match(c, _get(opts, "-f", "--filter"))]
    no_trunc = _flag(opts, "--no-trunc")
    if _flag(opts, "-q", "--quiet"):
        for c in rows:
            print(c["Id"] if no_trunc else c["Id"][:12])
        return 0
    fmt = _get(opts, "--format")
    if fmt:
        for c in rows:
            print(go_template(fmt[-1], _ps_row(c, now, no_trunc)))
        return 0
    table = [["CONTAINER ID", "IMAGE", "COMMAND", "CREATED", "STATUS", "PORTS", "NAMES"]]
    for c in rows:
        r = _ps_row(c, now, no_trunc)
        table.append([r["ID"], r["Image"], r["Command"], r["RunningFor"], r["Status"], r["Ports"], r["Names"]])
    _print_table(table)
    return 0


def _print_table(rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("   ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())


def docker_images(argv: list[str], root: Path) -> int:
    opts, pos = _opts(argv, {"-f", "--filter", "--format"}, {"-a", "--all", "-q", "--quiet", "--no-trunc",
                                                            "--digests"})
    docker = _docker_ready(root)
    images = list(docker["images"])
    if pos:
        images = [i for i in images if any(t.rsplit(":", 1)[0] == pos[0] or t == pos[0] for t in i["RepoTags"])]
    no_trunc = _flag(opts, "--no-trunc")
    if _flag(opts, "-q", "--quiet"):
        for img in images:
            print(img["Id"] if no_trunc else _short(img["Id"]))
        return 0
    fmt = _get(opts, "--format")
    table = [["REPOSITORY", "TAG", "IMAGE ID", "CREATED", "SIZE"]]
    for img in images:
        for tag in img["RepoTags"] or ["<none>:<none>"]:
            repo, _, t = tag.rpartition(":")
            row = {"Repository": repo, "Tag": t, "ID": img["Id"] if no_trunc else _short(img["Id"]),
                   "Digest": (img["RepoDigests"] or ["@<none>"])[0].split("@", 1)[1],
                   "CreatedAt": img["Created"], "Size": f"{img['Size'] / 1e9:.1f}GB"}
            if fmt:
                print(go_template(fmt[-1], row))
            else:
                age = human_duration(time.time() - (parse_time(img["Created"]) or time.time())) + " ago"
                table.append([repo, t, row["ID"], age, row["Size"]])
    if not fmt:
        _print_table(table)
    return 0


def docker_inspect(argv: list[str], root: Path, kind: str | None = None) -> int:
    opts, pos = _opts(argv, {"-f", "--format", "--type"}, {"-s", "--size"})
    if not pos:
        raise ShimError("\"docker inspect\" requires at least 1 argument.\nSee 'docker inspect --help'.", 1)
    docker = _refreshed(root)
    kind = kind or (_get(opts, "--type") or [None])[-1]
    found, code = [], 0
    for ref in pos:
        obj = None
        if kind in (None, "container"):
            obj = _find_container(docker, ref)
        if obj is None and kind in (None, "image"):
            obj = _find_image(docker, ref)
        if obj is None:
            what = {"container": "container", "image": "image"}.get(kind or "", "object")
            sys.stderr.write(f"Error: No such {what}: {ref}\n")
            code = 1
            continue
        found.append(obj)
    fmt = _get(opts, "-f", "--format")
    if fmt:
        for obj in found:
            print(go_template(fmt[-1], obj))
    else:
        print(json.dumps(found, indent=4))
    return code


def _parse_ports(specs: list[str]) -> dict[str, list[dict[str, str]]]:
    out: dict[str, list[dict[str, str]]] = {}
    for spec in specs:
        proto = "tcp"
        if "/" in spec:
            spec, proto = spec.rsplit("/", 1)
        parts = spec.split(":")
        if len(parts) == 1:
            ip, host, cport = "", "", parts[0]
        elif len(parts) == 2:
            ip, host, cport = "", parts[0], parts[1]
        else:
            ip, host, cport = ":".join(parts[:-2]), parts[-2], parts[-1]
        if not cport.isdigit() or (host and not host.isdigit()):
            raise ShimError(f"docker: invalid containerPort: {spec}\nSee 'docker run --help'.", 125)
        out.setdefault(f"{cport}/{proto}", []).append({"HostIp": ip.strip("[]"), "HostPort": host})
    return out


def _gpus(spec: str | None) -> list[dict] | None:
    if spec is None:
        return None
    req = {"Driver": "", "Count": 0, "DeviceIDs": None, "Capabilities": [["gpu"]], "Options": {}}
    if spec == "all":
        req["Count"] = -1
    elif spec.isdigit():
        req["Count"] = int(spec)
    elif spec.startswith("device="):
        req["DeviceIDs"] = spec.split("=", 1)[1].strip('"').split(",")
    else:
        raise ShimError(f"docker: invalid argument \"{spec}\" for \"--gpus\" flag\nSee 'docker run --help'.", 125)
    return [req]


def _kv_list(values: list[str]) -> dict[str, str]:
    out = {}
    for v in values:
        k, _, val = v.partition("=")
        out[k] = val
    return out


def docker_run(argv: list[str], root: Path) -> int:
    opts, pos = _opts(argv, RUN_VALUE_FLAGS, RUN_BOOL_FLAGS, interspersed=False)
    if not pos:
        raise ShimError("\"docker run\" requires at least 1 argument.\nSee 'docker run --help'.", 125)
    image_ref, cmd = pos[0], pos[1:]
    if not _flag(opts, "-d", "--detach") and gpu_load_seconds(_get(opts, "--entrypoint"), cmd) is not None:
        return run_gpu_load(root, image_ref, gpu_load_seconds(_get(opts, "--entrypoint"), cmd) or 0.0)
    with locked(root):
        docker = _docker_ready(root)
        node = load(root, "node.json")
        for spec in _get(opts, "--ulimit"):
            check_ulimit(spec)
        image = _find_image(docker, image_ref)
        if image is None and (_get(opts, "--pull") or [""])[-1] == "never":
            raise ShimError(f"docker: Error response from daemon: No such image: {image_ref}.\n"
                            "See 'docker run --help'.", 125)
        if image is None:
            raise ShimError(f"Unable to find image '{image_ref}' locally\ndocker: Error response from daemon: "
                            f"[sim] no registry in the sparkfleet simulation; {image_ref} is not on node "
                            f"{node['node']} (`docker images` lists what is).\nSee 'docker run --help'.", 125)
        seq = int(docker.get("next_seq", 1))
        name = (_get(opts, "--name") or [f"sim_container_{seq}"])[-1]
        other = next((c for c in docker["containers"] if c["Name"] == "/" + name), None)
        if other is not None:
            raise ShimError(f'docker: Error response from daemon: Conflict. The container name "/{name}" is already '
                            f'in use by container "{other["Id"]}". You have to remove (or rename) that container to '
                            "be able to reuse that name.\nSee 'docker run --help'.", 125)
        network = (_get(opts, "--network", "--net") or ["bridge"])[-1]
        ports = _parse_ports(_get(opts, "-p", "--publish"))
        if network == "host" and ports:
            sys.stderr.write("WARNING: Published ports are discarded when using host network mode\n")
            ports = {}
        binds = _get(opts, "-v", "--volume")
        for b in binds:
            src = b.split(":", 1)[0]
            if src.startswith("/") and not (root / src.lstrip("/")).exists():
                # like dockerd: a missing bind source becomes an empty directory (the FM-12 trap)
                (root / src.lstrip("/")).mkdir(parents=True)
        # `-e NAME` without a value takes it from the docker client's environment, as the real CLI does
        env = [e if "=" in e else f"{e}={os.environ.get(e, '')}" for e in _get(opts, "-e", "--env")
               if "=" in e or e in os.environ]
        labels = _kv_list(_get(opts, "-l", "--label"))
        now = time.time()
        cid = hashlib.sha256(f"sparkfleet-sim container {node['node']} {seq}".encode()).hexdigest()
        detach = _flag(opts, "-d", "--detach")
        entrypoint = _get(opts, "--entrypoint")
        running = detach  # a foreground container has nothing to run in the sim: it exits at once
        container = container_record(
            node, cid, name, image_ref, image["Id"], cmd, entrypoint=entrypoint, env=env, labels=labels,
            network=network, ports=ports, binds=binds, created=rfc3339(now), running=running,
            pid=container_pid(node, cid),
            host_config={
                "RestartPolicy": {"Name": (_get(opts, "--restart") or ["no"])[-1], "MaximumRetryCount": 0},
                "AutoRemove": _flag(opts, "--rm"), "IpcMode": (_get(opts, "--ipc") or ["private"])[-1],
                "Privileged": _flag(opts, "--privileged"), "CapAdd": _get(opts, "--cap-add") or None,
                "Devices": [{"PathOnHost": d.split(":")[0], "PathInContainer": (d.split(":") + [d])[1],
                             "CgroupPermissions": "rwm"} for d in _get(opts, "--device")],
                "DeviceRequests": _gpus((_get(opts, "--gpus") or [None])[-1]),
            })
        docker["next_seq"] = seq + 1
        due = rank_faults_due(root) if running and _lane(container) else []
        if running:
            (root / STATE / "logs").mkdir(exist_ok=True)
            start_engine(root, container, due)
        if "rank-vanish" in due:  # the sim's rank-vanish fault: the container is gone as soon as it started
            stop_engine(container, 0.0, signal.SIGKILL)
        elif running or not container["HostConfig"]["AutoRemove"]:  # --rm and exited at once: nothing is left
            docker["containers"].append(container)
            (root / STATE / "logs").mkdir(exist_ok=True)
            (root / STATE / "logs" / f"{cid}.log").touch()
        save(root, "docker.json", docker)
        render(root)
    if detach:
        print(cid)
    else:
        sys.stderr.write("[sim] docker run: foreground containers exit at once in the sparkfleet simulation "
                         "(no process runs)\n")
    return 0


# go-units' ulimit names (docker's --ulimit NAME=SOFT[:HARD], github.com/docker/go-units ulimit.go)
ULIMIT_NAMES = {"as", "core", "cpu", "data", "fsize", "locks", "memlock", "msgqueue", "nice", "nofile", "nproc",
                "rss", "rtprio", "rttime", "sigpending", "stack"}
IMAGE_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # an image's PATH, as dockerd's


def image_env(env: list[str] | None) -> list[str]:
    """A container's Config.Env as dockerd makes it: the run's -e, then the image's variables not set."""
    env = list(env or [])
    return env + ([] if any(e.startswith("PATH=") for e in env) else [IMAGE_PATH])


def check_ulimit(spec: str) -> None:
    """Refuse a --ulimit as the docker CLI's flag parser does (go-units ParseUlimit), exit 125."""
    def bad(why: str) -> ShimError:
        return ShimError(f'invalid argument "{spec}" for "--ulimit" flag: {why}\nSee \'docker run --help\'.', 125)
    name, sep, values = spec.partition("=")
    if not sep:
        raise bad(f"invalid ulimit argument: {spec}")
    if name not in ULIMIT_NAMES:
        raise bad(f"invalid ulimit type: {name}")
    parts = values.split(":")
    if len(parts) > 2:
        raise bad(f"too many limit value arguments - {values}, can only have up to two, `soft[:hard]`")
    for v in parts:
        try:
            int(v)
        except ValueError:
            raise bad(f'strconv.ParseInt: parsing "{v}": invalid syntax') from None
    if len(parts) == 2 and int(parts[0]) > int(parts[1]):
        raise bad(f"ulimit soft limit must be less than or equal to hard limit: {parts[0]} > {parts[1]}")


def gpu_load_seconds(entrypoint: list[str], cmd: list[str]) -> float | None:
    """A foreground container running a torch matmul load (`python3 -c SCRIPT SECONDS ...`, the clock probe's
    load in the lane's image): its duration; None for anything else. The sim stands in for torch and the GPU."""
    argv = entrypoint[-1:] + cmd
    if len(argv) >= 4 and os.path.basename(argv[0]).startswith("python") and argv[1] == "-c" \
            and "import torch" in argv[2]:
        try:
            return float(argv[3])
        except ValueError:
            return None
    return None


def run_gpu_load(root: Path, image_ref: str, seconds: float) -> int:
    """`docker run --rm IMAGE python3 -c <torch load>`: the GPU reads busy for SECONDS, then the load's line."""
    docker = _docker_ready(root)
    if _find_image(docker, image_ref) is None:
        raise ShimError(f"docker: Error response from daemon: No such image: {image_ref}", 125)
    return gpu_load(root, seconds)


def gpu_load(root: Path, seconds: float) -> int:
    """The clock probe's torch load itself (in the shim's container, or in a real one: sim/container.py)."""
    until = round(time.time() + seconds, 3)
    _mark_busy(root, until)
    try:
        time.sleep(seconds)
    finally:
        _mark_busy(root, 0, only_if=until)
    steps = step_times(root, seconds)
    print(json.dumps({"step_ms": {"after_idle": steps["after_idle"], "back_to_back": steps["back_to_back"],
                                  "idle_seen": True}}))
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (our child, not reaped yet) is not alive
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][:1] != "Z"
    except OSError:
        return False


def reap(docker: dict) -> bool:
    """Mark containers whose engine process ended as exited (with its exit code); True if any changed."""
    changed = False
    for c in docker.get("containers", []):
        sp = c.get("SimProcess")
        if not sp or not c["State"]["Running"]:
            continue
        exit_file = Path(sp["exit_file"])
        if exit_file.is_file():
            try:
                rc = int(exit_file.read_text().strip() or "1")
            except ValueError:
                rc = 1
        elif not _alive(int(sp["pid"])):
            rc = 137
        else:
            continue
        c["State"].update({"Status": "exited", "Running": False, "Pid": 0, "ExitCode": rc,
                           "FinishedAt": rfc3339(time.time())})
        c["NetworkSettings"]["Ports"] = {}
        changed = True
    return changed


def _refreshed(root: Path) -> dict:
    """docker.json after noticing engines that exited (so ps/inspect/logs tell the truth)."""
    with locked(root):
        docker = _docker_ready(root)
        if reap(docker):
            save(root, "docker.json", docker)
            render(root)
    return docker


def stop_engine(c: dict, wait_s: float, sig_first: int = signal.SIGTERM) -> int | None:
    """End a container's engine: SIGTERM, then SIGKILL after `wait_s`; the exit code when known."""
    sp = c.get("SimProcess")
    if not sp:
        return None
    pid, exit_file = int(sp["pid"]), Path(sp["exit_file"])
    for sig, grace in ((sig_first, wait_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        deadline = time.time() + grace
        while time.time() < deadline and _alive(pid) and not exit_file.is_file():
            time.sleep(0.05)
        if not _alive(pid) or exit_file.is_file():
            break
    with contextlib.suppress(OSError, ValueError):
        return int(exit_file.read_text().strip())
    return None


def container_record(node: dict, cid: str, name: str, image_ref: str, image_id: str, cmd: list[str], *,
                     entrypoint: list[str] | None = None, env: list[str] | None = None,
                     labels: dict[str, str] | None = None, network: str = "bridge",
                     ports: dict[str, list[dict[str, str]]] | None = None, binds: list[str] | None = None,
                     created: str, running: bool, pid: int, host_config: dict | None = None) -> dict:
    """One container as `docker inspect` shows it (the fields docs/sim-layout.md lists, and their neighbours)."""
    ports = ports or {}
    hc = {"Binds": binds or None, "NetworkMode": network, "PortBindings": ports,
          "RestartPolicy": {"Name": "no", "MaximumRetryCount": 0}, "AutoRemove": False, "IpcMode": "private",
          "Privileged": False, "CapAdd": None, "Devices": [], "DeviceRequests": None}
    hc.update(host_config or {})
    return {
        "Id": cid, "Created": created, "Path": (entrypoint or cmd or [""])[0],
        "Args": (cmd if entrypoint else cmd[1:]),
        "State": {"Status": "running" if running else "exited", "Running": running, "Paused": False,
                  "Restarting": False, "OOMKilled": False, "Dead": False, "Pid": pid if running else 0,
                  "ExitCode": 0, "Error": "", "StartedAt": created,
                  "FinishedAt": ZERO_TIME if running else created},
        "Image": image_id, "Name": "/" + name, "RestartCount": 0,
        "HostConfig": hc,
        "Config": {"Hostname": node["hostname"] if network == "host" else cid[:12], "Env": image_env(env),
                   "Cmd": cmd or None, "Image": image_ref, "Entrypoint": entrypoint or None,
                   "Labels": labels or {}, "ExposedPorts": {p: {} for p in ports} or None},
        "NetworkSettings": {"Ports": _published(ports) if running else {}},
    }


def container_pid(node: dict, cid: str) -> int:
    """A container's main process id: stable per container, so a restart shows the same /proc entry."""
    return int(node["sim"]["container_pid_base"]) + 10 * (int(cid[:6], 16) % 5000)


def _published(ports: dict[str, list[dict[str, str]]]) -> dict[str, list[dict[str, str]]]:
    out = {}
    for cport, binds in ports.items():
        rows = []
        for b in binds:
            if not b["HostPort"]:
                continue
            if b["HostIp"]:
                rows.append({"HostIp": b["HostIp"], "HostPort": b["HostPort"]})
            else:
                rows += [{"HostIp": "0.0.0.0", "HostPort": b["HostPort"]}, {"HostIp": "::", "HostPort": b["HostPort"]}]
        out[cport] = rows
    return out


def _change(argv: list[str], root: Path, verb: str) -> int:
    """stop / kill / start / rm: change containers' state, print each name as docker does."""
    value_flags = {"-t", "--time", "-s", "--signal"}
    bool_flags = {"-f", "--force", "-v", "--volumes", "-a", "--attach", "-i", "--interactive"}
    opts, pos = _opts(argv, value_flags, bool_flags)
    if not pos:
        raise ShimError(f"\"docker {verb}\" requires at least 1 argument.\nSee 'docker {verb} --help'.", 1)
    code = 0
    with locked(root):
        docker = _docker_ready(root)
        node = load(root, "node.json")
        reap(docker)
        now = time.time()
        for ref in pos:
            c = _find_container(docker, ref)
            if c is None:
                if verb == "rm":  # docker 20.10's rm: "Error: ...", and with -f not an error (exit 0)
                    sys.stderr.write(f"Error: No such container: {ref}\n")
                    code = code if _flag(opts, "-f", "--force") else 1
                else:
                    sys.stderr.write(f"Error response from daemon: No such container: {ref}\n")
                    code = 1
                continue
            st = c["State"]
            if verb in ("stop", "kill") or (verb == "rm" and st["Running"] and _flag(opts, "-f", "--force")):
                if verb == "kill" and not st["Running"]:
                    sys.stderr.write(f"Error response from daemon: cannot kill container: {ref}: container "
                                     f"{c['Id']} is not running\n")
                    code = 1
                    continue
                if st["Running"]:
                    exit_code = node["sim"]["stop_exit_code"] if verb == "stop" else node["sim"]["kill_exit_code"]
                    real = stop_engine(c, ENGINE_STOP_WAIT_S if verb == "stop" else 0.0,
                                       signal.SIGTERM if verb == "stop" else signal.SIGKILL)
                    exit_code = real if real is not None else exit_code
                    st.update({"Status": "exited", "Running": False, "Pid": 0, "ExitCode": exit_code,
                               "FinishedAt": rfc3339(now)})
                    c["NetworkSettings"]["Ports"] = {}
                if c["HostConfig"].get("AutoRemove") and verb != "rm":
                    _remove(root, docker, c)
            elif verb == "rm":
                if st["Running"]:
                    sys.stderr.write(f'Error response from daemon: cannot remove container "{c["Name"]}": container '
                                     "is running: stop the container before removing or force remove\n")
                    code = 1
                    continue
            elif verb == "start" and not st["Running"]:
                st.update({"Status": "running", "Running": True, "ExitCode": 0, "FinishedAt": ZERO_TIME,
                           "StartedAt": rfc3339(now),
                           "Pid": container_pid(node, c["Id"])})
                if c.get("SimProcess"):
                    start_engine(root, c)
                c["NetworkSettings"]["Ports"] = _published(c["HostConfig"].get("PortBindings") or {})
            if verb == "rm":
                _remove(root, docker, c)
            print(ref)
        save(root, "docker.json", docker)
        render(root)
    return code


def _remove(root: Path, docker: dict, c: dict) -> None:
    if c in docker["containers"]:
        docker["containers"].remove(c)
    with contextlib.suppress(FileNotFoundError):
        (root / STATE / "logs" / f"{c['Id']}.log").unlink()


def since_time(value: str) -> float:
    """docker's --since (and --until) value as a Unix time: a duration before now (`10m`, `1h30m`, `45s`,
    Go's units), an RFC 3339 time (`2026-12-05T00:10:00Z`, with fraction or offset) or Unix seconds."""
    if re.fullmatch(r"(?:\d+(?:\.\d+)?(?:ns|us|µs|ms|s|m|h))+", value):
        units = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
        return time.time() - sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)",
                                                                             value))
    if re.fullmatch(r"\d+(?:\.\d+)?", value):
        return float(value)
    try:
        t = _dt.datetime.fromisoformat(re.sub(r"(\.\d{6})\d+", r"\1", value).replace("Z", "+00:00"))
    except ValueError:
        raise ShimError(f'Error response from daemon: invalid value for "since": failed to parse value as time '
                        f'or duration: "{value}"', 1) from None
    return (t if t.tzinfo else t.replace(tzinfo=_dt.UTC)).timestamp()


def docker_logs(argv: list[str], root: Path) -> int:
    opts, pos = _opts(argv, {"-n", "--tail", "--since", "--until"},
                      {"-f", "--follow", "-t", "--timestamps", "--details"})
    if len(pos) != 1:
        raise ShimError("\"docker logs\" requires exactly 1 argument.\nSee 'docker logs --help'.", 1)
    docker = _refreshed(root)
    c = _find_container(docker, pos[0])
    if c is None:
        raise ShimError(f"Error: No such container: {pos[0]}", 1)  # docker 20.10's logs words it so
    log = root / STATE / "logs" / f"{c['Id']}.log"
    # bytes as the engine wrote them: read_text() and splitlines() would turn tqdm's \r into line ends, which
    # docker does not (its log records end at \n)
    text = log.read_bytes().decode(errors="replace") if log.is_file() else ""
    tail = _get(opts, "-n", "--tail")
    lines = text.split("\n")
    lines = [x + "\n" for x in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
    since = _get(opts, "--since")
    if since and log.is_file() and since_time(since[-1]) > log.stat().st_mtime:
        # the shim keeps no time per line (docker's json-file log does): a line counts as written when the
        # log last changed, so a --since after that shows none and one before it shows every line
        lines = []
    if tail and tail[-1] != "all":
        lines = lines[-int(tail[-1]):] if int(tail[-1]) else []
    sys.stdout.write("".join(lines))
    sys.stdout.flush()
    if _flag(opts, "-f", "--follow"):
        offset = len(text.encode())
        while True:  # follow until the container stops, as `docker logs -f` does
            time.sleep(0.2)
            if log.is_file():
                with open(log, "rb") as fh:
                    fh.seek(offset)
                    chunk = fh.read()
                offset += len(chunk)
                sys.stdout.write(chunk.decode(errors="replace"))
                sys.stdout.flush()
            try:
                current = _find_container(load(root, "docker.json"), c["Id"])
            except (OSError, ValueError):  # the node went away (unreachable fault, sim down)
                return 1
            if current is None or not current["State"]["Running"]:
                return 0
    return 0


def docker_info(argv: list[str], root: Path, version: bool = False) -> int:
    opts, _ = _opts(argv, {"-f", "--format"}, set())
    node = load(root, "node.json")
    docker = load(root, "docker.json")
    if version and docker.get("daemon") != "up":
        print(f"Client:\n Version:           {node['sim']['docker_version']}\n (sparkfleet simulation)")
    docker = _docker_ready(root)
    ver = node["sim"]["docker_version"]
    data = {"ServerVersion": ver, "Name": node["hostname"], "Containers": len(docker["containers"]),
            "ContainersRunning": sum(c["State"]["Running"] for c in docker["containers"]),
            "Images": len(docker["images"]), "OperatingSystem": "DGX OS (sparkfleet simulation)",
            "Client": {"Version": ver}, "Server": {"Version": ver}}
    fmt = _get(opts, "-f", "--format")
    if fmt:
        print(go_template(fmt[-1], data))
    elif version:
        print(f"Client:\n Version:           {ver}\n\nServer: Docker Engine (sparkfleet simulation)\n Engine:\n"
              f"  Version:          {ver}")
    else:
        print(f"[sim] sparkfleet simulation of dockerd on {node['node']}\nServer:\n Containers: {data['Containers']}"
              f"\n  Running: {data['ContainersRunning']}\n Images: {data['Images']}\n Server Version: {ver}\n"
              f" Operating System: {data['OperatingSystem']}")
    return 0


DOCKER_GLOBAL_VALUE = {"-H", "--host", "--context", "-c", "--config", "-l", "--log-level"}


def docker(argv: list[str], root: Path) -> int:
    slow = load(root, "faults.json")["faults"].get("daemon-slow")
    if slow:  # the daemon-slow fault: every command waits first, as against a daemon slow to answer
        time.sleep(float(slow["seconds"]))
    while argv and argv[0].startswith("-"):  # global options come before the command
        flag = argv.pop(0)
        if flag.partition("=")[0] in DOCKER_GLOBAL_VALUE and "=" not in flag and argv:
            argv.pop(0)
    if not argv:
        raise ShimError("Usage:  docker [OPTIONS] COMMAND\n\n[sim] sparkfleet simulation of the docker CLI", 1)
    cmd, rest = argv[0], argv[1:]
    if cmd in ("container", "image") and rest:
        sub, rest = rest[0], rest[1:]
        cmd = {("container", "ls"): "ps", ("container", "list"): "ps", ("container", "ps"): "ps",
               ("image", "ls"): "images", ("image", "list"): "images"}.get((cmd, sub), f"{cmd}-{sub}")
    table = {
        "ps": lambda: docker_ps(rest, root), "images": lambda: docker_images(rest, root),
        "inspect": lambda: docker_inspect(rest, root),
        "container-inspect": lambda: docker_inspect(rest, root, "container"),
        "image-inspect": lambda: docker_inspect(rest, root, "image"),
        "run": lambda: docker_run(rest, root), "container-run": lambda: docker_run(rest, root),
        "logs": lambda: docker_logs(rest, root), "container-logs": lambda: docker_logs(rest, root),
        "info": lambda: docker_info(rest, root), "version": lambda: docker_info(rest, root, version=True),
    }
    for verb in ("stop", "kill", "start", "rm"):
        table[verb] = table[f"container-{verb}"] = (lambda v: lambda: _change(rest, root, v))(verb)
    if cmd not in table:
        known = ", ".join(sorted(k for k in table if "-" not in k))
        raise ShimError(f"docker: '{cmd}' is not a docker command.\nSee 'docker --help'\n"
                        f"[sim] the sparkfleet simulation supports: {known}", 1)
    return table[cmd]()
