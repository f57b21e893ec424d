"""`sparkfleet sim up|down|status|fault|heal`: the simulated lab (a stand-in of an inventory on this machine)."""

from __future__ import annotations

import argparse

from sparkfleet.cli.common import EXIT_OK, add_inventory, add_json, add_root, out, print_json
from sparkfleet.sim import faults, lab

ORDER = 90
TAG = "[sim]"  # every line the sim prints starts with this: nobody should mistake it for the real lab


def say(line: str) -> None:
    out.print(f"{TAG} {line}", markup=False, highlight=False)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sim", help="a simulated copy of the lab on this machine (SIMULATION), for rehearsal and tests",
        description="Build, inspect, break and remove a simulated lab: one sandbox per inventory node with "
        "its own root (bubblewrap), processes, hostname and, as root in ssh mode, network; shims for nvidia-smi, "
        "docker and ibdev2netdev. Everything it "
        "prints is labelled [sim]. Nothing here touches real hardware.",
        epilog="examples:\n  sparkfleet sim up                      # local transport\n"
        "  sparkfleet sim up --transport ssh --force   # one real sshd inside each node\n"
        "  sparkfleet sim up --transport ssh --docker shim   # the docker stand-in even as root\n"
        "  sparkfleet sim fault asusi clock-latch\n  sparkfleet sim fault reddie port-taken --port 8410\n"
        "  sparkfleet sim heal                    # every fault on every node\n"
        "  sparkfleet sim status --json\n  sparkfleet sim down",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ss = p.add_subparsers(dest="sim_command", metavar="ACTION")
    ss.required = True

    up = ss.add_parser("up", help="build the simulated lab under <state_dir>/sim/")
    add_root(up)
    add_inventory(up, default="lab")
    add_json(up)
    up.add_argument("--transport", choices=("local", "ssh"), default="local",
                    help="local: commands enter each node directly; ssh: a real sshd inside each node (as root: "
                    "in the node's own network namespace) (default: local)")
    up.add_argument("--launcher", choices=("ssh", "slurm"), default="ssh",
                    help="slurm: a real Slurm (munged, slurmctld here, one slurmd per node) and an inventory with "
                    "launcher: slurm; needs --transport ssh as root (default: ssh)")
    up.add_argument("--force", action="store_true", help="tear down an existing simulated lab first")
    up.add_argument("--docker", choices=lab.DOCKER_MODES, default=None,
                    help="daemon: a real Docker daemon inside each node (root; Debian docker.io); shim: the "
                    f"docker stand-in (default: ${lab.DOCKER_ENV}, else daemon as root with docker.io installed, "
                    "else shim)")
    up.set_defaults(func=run_up)

    down = ss.add_parser("down", help="stop every sshd the sim started and remove the sandboxes (idempotent)")
    add_json(down)
    down.set_defaults(func=run_down)

    st = ss.add_parser("status", help="nodes, transport, faults, sshd pids and ports")
    add_json(st)
    st.set_defaults(func=run_status)

    ex = ss.add_parser("exec", help="run a command inside a node as the controller would (stdin, stdout, exit code)",
                       epilog="example:\n  sparkfleet sim exec asusi -- docker ps -a",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    ex.add_argument("node")
    ex.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD ...")
    ex.set_defaults(func=run_exec)

    kinds = "\n".join(f"  {k.name:<21} {k.summary}" for k in faults.KINDS.values())
    f = ss.add_parser("fault", help="inject a fault on one node", epilog=f"kinds:\n{kinds}",
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    f.add_argument("node")
    f.add_argument("kind", metavar="KIND", help="one of: " + ", ".join(faults.KINDS))
    f.add_argument("--mhz", type=int, help="clock-latch: the latched SM clock under load")
    f.add_argument("--gib", type=float, help="low-memory: MemAvailable in GiB")
    f.add_argument("--what", choices=("engram", "cache", "mounts", "listening"),
                   help="missing-mount-source: which dir disappears (engram, cache); unreadable-part: which facts "
                   "part the node cannot read (mounts, listening)")
    f.add_argument("--port", type=int, help="port-taken: the port the foreign container listens on")
    f.add_argument("--rate", help="slow-link: tc tbf rate (e.g. 100mbit)")
    f.add_argument("--mtu", type=int, help="mtu-mismatch: the node's fabric MTU")
    f.add_argument("--driver", help="driver-drift: the driver version nvidia-smi reports")
    f.add_argument("--factor", type=float, help="slow-boot: how many times longer the boot takes (default 10)")
    f.add_argument("--seconds", type=float, help="silent-tune: how long the rank stays silent (default 30); "
                   "daemon-slow: how late the node's docker answers; clock-skew: how far the node's clock is off "
                   "(negative: behind; --seconds=-300)")
    f.add_argument("--sticky", action="store_true", default=None,
                   help="rank-vanish, rank-hang, serve-crash: every later launch on the node too, until healed")
    f.add_argument("--off", type=float, help="power-cycle: seconds before the node boots again (default 10)")
    add_json(f)
    f.set_defaults(func=run_fault)

    h = ss.add_parser("heal", help="heal one fault, every fault on a node, or all faults")
    h.add_argument("node", nargs="?")
    h.add_argument("kind", nargs="?", metavar="KIND")
    add_json(h)
    h.set_defaults(func=run_heal)


def run_up(args: argparse.Namespace) -> int:
    sim = lab.up(args.inventory, transport=args.transport, ops_root=args.root, force=args.force,
                 docker=args.docker, launcher=args.launcher)
    status = sim.status()
    if args.json:
        print_json(status)
        return EXIT_OK
    say(f"SIMULATION of inventory {args.inventory!r} built in {status['dir']} (transport {sim.transport}, "
        f"docker {sim.manifest.get('docker', 'shim')})")
    for name, node in status["nodes"].items():
        where = (f"  sshd {node['sshd']['address']}:{node['sshd']['port']} pid {node['sshd']['pid']}"
                 if "sshd" in node else "")
        say(f"  {name:<10} {node['hardware']:<6} {node['dir']}{where}")
    say(f"inventory: {status['inventory']}  (pass it as --inventory sim)")
    if status["known_hosts"]:
        say(f"host keys pinned in {status['known_hosts']}")
    if status.get("slurm"):
        say(f"slurm: {status['slurm']['conf']} (partition {status['slurm']['partition']})")
    for part in sim.manifest.get("without_root", []):
        say(f"needs root, so not here: {part}")
    for skipped in sim.manifest.get("skipped_profiles", []):
        say(f"profile skipped (did not load): {skipped}")
    for why in sim.manifest.get("engines_missing", []):
        say(f"engine not installed: {why}")
    say(f"make it this shell's default inventory: {default_line()}")
    return EXIT_OK


def default_line() -> str:
    """The shell command that makes the simulated lab this shell's default inventory.

    The sim's inventory lives in the state dir, so a state dir that is not the user's default
    (from $SPARKFLEET_STATE) goes on the same line.
    """
    import shlex

    from sparkfleet.userconfig import setting

    line = "export SPARKFLEET_INVENTORY=sim"
    state = setting("state")
    if state.source.startswith("env") or state.source.startswith("--"):
        line += f" SPARKFLEET_STATE={shlex.quote(state.value)}"
    return line


def run_exec(args: argparse.Namespace) -> int:
    """The command inside the node: its streams are this terminal's, its exit code ours."""
    from sparkfleet.schema.errors import UserError

    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        raise UserError("sim exec: give the command after the node: sparkfleet sim exec NODE -- CMD ...")
    return lab.require().exec(args.node, argv, timeout_s=None, capture=False).returncode


def run_down(args: argparse.Namespace) -> int:
    removed = lab.down()
    if args.json:
        print_json({"simulation": True, "removed": removed})
    else:
        say("simulated lab stopped and removed" if removed else "no simulated lab to remove")
    return EXIT_OK


def run_status(args: argparse.Namespace) -> int:
    sim = lab.current()
    if sim is None:
        if args.json:
            print_json({"simulation": True, "exists": False})
        else:
            say("no simulated lab (build one with `sparkfleet sim up`)")
        return EXIT_OK
    status = sim.status()
    if args.json:
        print_json({"exists": True, **status})
        return EXIT_OK
    from rich.text import Text

    from sparkfleet.cli.tables import Column, render

    rows = []
    for name, node in status["nodes"].items():
        sshd = ""
        if "sshd" in node:
            pid = node["sshd"]["pid"]
            sshd = f"{node['sshd']['address']}:{node['sshd']['port']} " + (f"pid {pid}" if pid else "stopped")
        fl = ", ".join(k + "".join(f" {p}={v}" for p, v in params.items() if p in faults.KINDS[k].params
                                   or p == "what")
                       for k, params in node["faults"].items())
        rows.append([f"{TAG} {name}", node["hardware"], "yes" if node["reachable"] else Text("no", style="red"),
                     sshd, fl or "-"])
    render([Column(c) for c in ("node", "hardware", "reachable", "sshd")] + [Column("faults", wrap=True)], rows,
           title=f"{TAG} SIMULATION: simulated lab, transport {status['transport']} ({status['dir']})")
    say(f"inventory: {status['inventory']}")
    return EXIT_OK


def run_fault(args: argparse.Namespace) -> int:
    sim = lab.require()
    params = {"mhz": args.mhz, "gib": args.gib, "what": args.what, "port": args.port, "rate": args.rate,
              "mtu": args.mtu, "driver": args.driver, "factor": args.factor,
              "seconds": args.seconds, "sticky": args.sticky, "off": args.off}
    recorded = sim.fault(args.node, args.kind, **params)
    if args.json:
        print_json({"simulation": True, "node": args.node, "fault": args.kind, "params": recorded})
        return EXIT_OK
    shown = ", ".join(f"{k}={v}" for k, v in recorded.items() if k in faults.KINDS[args.kind].params or k == "what")
    say(f"fault {args.kind} injected on {args.node}" + (f" ({shown})" if shown else "")
        + f": {faults.KINDS[args.kind].summary}")
    return EXIT_OK


def run_heal(args: argparse.Namespace) -> int:
    sim = lab.require()
    node, kind = args.node, args.kind
    if kind is None and node in faults.KINDS and node not in sim.nodes:
        node, kind = None, node  # `sim heal clock-latch`: that kind on every node
    healed = sim.heal(node, kind)
    if args.json:
        print_json({"simulation": True, "healed": [{"node": n, "fault": k} for n, k in healed]})
        return EXIT_OK
    if not healed:
        say("nothing to heal")
    for node, kind in healed:
        say(f"healed {kind} on {node}")
    return EXIT_OK
