"""`sparkfleet trust NODE... | --all`: show each node's SSH host key fingerprint and pin it when the user says so.

sparkfleet checks host keys strictly against its own known_hosts; this is the one place keys get in.
A node behind jump hosts (ProxyJump) has each hop's key shown and pinned first, then its own key is
fetched through the hops (whose keys must then be pinned). `--from-known-hosts [FILE]` takes the
keys from an OpenSSH known_hosts (default ~/.ssh/known_hosts) instead of from the network.
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from sparkfleet.cli.common import (
    EXIT_FAIL,
    EXIT_OK,
    add_inventory,
    add_json,
    add_root,
    err,
    fleet_inventory,
    out,
    print_json,
    spec,
)
from sparkfleet.schema.errors import UserError
from sparkfleet.schema.inventory import Hop, Node

ORDER = 80
GOOD = ("pinned", "already-pinned", "replaced", "local")

EPILOG = """examples:
  sparkfleet trust reddie                 # show reddie's key fingerprint, pin it if you answer y
  sparkfleet trust --all --yes            # pin every node's current key without asking (first setup)
  sparkfleet trust asusi --replace        # asusi was reinstalled: verify the new key, then re-pin it
  sparkfleet trust --all --from-known-hosts   # import the keys ssh already knows (~/.ssh/known_hosts)

Compare the fingerprint with the node's own (on its console: ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub)
before you pin it. Nodes behind a ProxyJump (ssh.proxy_jump or ~/.ssh/config) have their jump hosts' keys
shown and pinned first.
"""


@dataclass
class Target:
    """One host key to trust: a node, or a jump host on the way to one."""

    name: str  # the node's name; for a jump host "jump host user@host:port"
    host: str
    port: int
    via: list[Hop] = field(default_factory=list)  # hops before it
    node: Node | None = None  # None for a jump host
    local: bool = False


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trust", help="pin nodes' SSH host keys (sparkfleet checks them strictly)",
                       description="Fetch each node's SSH host key (trusting nothing), print its SHA256 "
                       "fingerprint, and pin it in sparkfleet's known_hosts when you confirm or pass --yes. "
                       "A key that differs from the pinned one is refused unless --replace is given.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_root(p)
    add_inventory(p)
    add_json(p)
    p.add_argument("nodes", nargs="*", metavar="NODE", help="node names from the inventory")
    p.add_argument("--all", action="store_true", help="every node in the inventory")
    p.add_argument("--yes", "-y", action="store_true", help="pin without asking")
    p.add_argument("--replace", action="store_true",
                   help="replace a different, already pinned key (only after verifying the new one)")
    p.add_argument("--known-hosts", metavar="FILE",
                   help="known_hosts file to pin into (default: known_hosts in the state dir)")
    p.add_argument("--from-known-hosts", nargs="?", const="~/.ssh/known_hosts", metavar="FILE",
                   help="take the keys from an OpenSSH known_hosts (default ~/.ssh/known_hosts) instead of "
                   "fetching them; each is still shown and confirmed")
    p.add_argument("--timeout", type=float, default=10.0, metavar="S", help="per-node connect timeout (default 10)")
    p.set_defaults(func=run)


def targets(nodes: list[Node]) -> list[Target]:
    """Every key to trust, jump hosts before the nodes behind them, each once."""
    seen: set[tuple] = set()
    out: list[Target] = []
    for node in nodes:
        if node.transport != "ssh":
            out.append(Target(node.name, "", 0, node=node, local=True))
            continue
        for i, hop in enumerate(node.ssh.jump):
            key = (hop.host, hop.port, tuple(map(str, node.ssh.jump[:i])))
            if key not in seen:
                seen.add(key)
                out.append(Target(f"jump host {hop}", hop.host, hop.port, list(node.ssh.jump[:i])))
        out.append(Target(node.name, node.ssh.host, node.ssh.port, list(node.ssh.jump), node=node))
    return out


def run(args: argparse.Namespace) -> int:
    from sparkfleet.fleet import hostkeys

    if args.all and args.nodes:
        raise UserError("trust: name nodes or pass --all, not both")
    if not args.all and not args.nodes:
        raise UserError("trust: name the nodes to trust, or pass --all (see `sparkfleet trust --help`)")
    inventory = fleet_inventory(spec(args), args.inventory)
    if args.all:
        nodes = list(inventory.nodes.values())
    else:
        unknown = [n for n in args.nodes if n not in inventory.nodes]
        if unknown:
            raise UserError(f"trust: no node named {', '.join(map(repr, unknown))} in inventory {inventory.name} "
                            f"(known: {', '.join(inventory.nodes)})")
        nodes = [inventory.nodes[n] for n in dict.fromkeys(args.nodes)]
    path = Path(args.known_hosts).expanduser() if args.known_hosts else hostkeys.default_known_hosts()
    todo = targets(nodes)
    if args.from_known_hosts:
        source = Path(args.from_known_hosts).expanduser()
        if not source.is_file():
            raise UserError(f"trust --from-known-hosts: {source}: no such file")
        rows = [r for t in todo for r in _import(t, source, path, args)]
    else:
        rows = _fetch_all(todo, path, args)
    node_rows = [r for r in rows if not r.get("jump_host")]
    if args.json:
        print_json({"known_hosts": str(path), "nodes": node_rows,
                    "jump_hosts": [r for r in rows if r.get("jump_host")]})
    else:
        summary(node_rows)
    return EXIT_OK if rows and all(r["status"] in GOOD for r in rows) else EXIT_FAIL


def summary(node_rows: list[dict]) -> None:
    """One last line: how many nodes' keys are pinned, and each node that is not with why (at 64 nodes the
    failures would otherwise hide among the fingerprints)."""
    bad = [r for r in node_rows if r["status"] not in GOOD]
    line = f"{len(node_rows) - len(bad)} of {len(node_rows)} node(s) pinned or already pinned"
    if bad:
        line += "; not pinned: " + ", ".join(f"{r['node']} ({r['status']})" for r in bad)
    out.print(line, style="bold red" if bad else None, markup=False, highlight=False, soft_wrap=True)


def _fetch_all(todo: list[Target], path: Path, args: argparse.Namespace) -> list[dict]:
    """Fetch and decide, hop depth by hop depth: a key behind a hop is fetched once the hop is pinned."""
    rows: list[dict] = []
    by_depth: dict[int, list[Target]] = {}
    for t in todo:
        by_depth.setdefault(len(t.via), []).append(t)
    transport = None
    try:
        for depth in sorted(by_depth):
            level = by_depth[depth]
            if depth and transport is None:
                from sparkfleet.fleet.ssh import SshTransport

                transport = SshTransport(path, connect_timeout_s=args.timeout)
            # every key of a level at once (a dead node costs one timeout, not one per node), then ask in order
            with ThreadPoolExecutor(max_workers=max(1, min(len(level), 32))) as pool:
                fetched = list(pool.map(lambda t, tr=transport: _fetch(t, path, args.timeout, tr), level))
            rows += [_decide(t, got, path, args) for t, got in zip(level, fetched, strict=True)]
    finally:
        if transport is not None:
            transport.close()
    return rows


def _fetch(t: Target, path: Path, timeout_s: float, transport):
    from sparkfleet.fleet import hostkeys

    if t.local:
        return None
    try:
        prefer = list(hostkeys.pinned(path, t.host, t.port))
        sock = None
        if t.via:
            gateway = transport._gateway(t.via)
            sock = gateway.transport.open_channel("direct-tcpip", (t.host, t.port), ("", 0), timeout=timeout_s)
        return hostkeys.fetch_host_key(t.host, t.port, timeout_s=timeout_s, prefer=prefer, sock=sock)
    except Exception as exc:  # noqa: BLE001 - reported for this node; the others go on
        return exc


def _import(t: Target, source: Path, path: Path, args: argparse.Namespace) -> list[dict]:
    """Rows for the keys `source` (an OpenSSH known_hosts) holds for this target, one per key type."""
    from sparkfleet.fleet import hostkeys

    if t.local:
        return [_decide(t, None, path, args)]
    found = hostkeys.pinned(source, t.host, t.port)
    if not found:
        say = err if args.json else out
        say.print(f"{t.name}  {t.host}:{t.port}", markup=False, highlight=False)
        message = (f"no key for {hostkeys.host_entry(t.host, t.port)} in {source}; fetch it with "
                   f"`sparkfleet trust {t.node.name if t.node else '...'}`")
        say.print(f"  {message}", markup=False, highlight=False)
        return [_row(t, "not-in-file", message)]
    return [_decide(t, hostkeys.FetchedKey(t.host, t.port, key), path, args, source=source)
            for key in found.values()]


def _row(t: Target, status: str, message: str, **extra) -> dict:
    row = {"node": t.node.name if t.node else t.name, "host": t.host, "port": t.port, "key_type": None,
           "fingerprint": None, **extra, "status": status, "message": message}
    if t.node is None:
        row["jump_host"] = True
    if t.via:
        row["via"] = [str(h) for h in t.via]
    return row


def _decide(t: Target, got, path: Path, args: argparse.Namespace, source: Path | None = None) -> dict:
    """Show one key, pin it if confirmed; return its JSON row."""
    from rich.markup import escape

    from sparkfleet.fleet import hostkeys

    host, port = t.host, t.port
    say = err if args.json else out  # with --json, stdout is only the JSON document
    extra: dict = {}

    def done(status: str, message: str, style: str = "") -> dict:
        say.print(f"  [{style}]{escape(message)}[/]" if style else f"  {escape(message)}", highlight=False)
        return _row(t, status, message, **extra)

    via = "".join(f" via {h}" for h in reversed(t.via))
    if t.local:
        kind = t.node.transport if t.node is not None else "local"
        say.print(f"[bold]{t.name}[/]  transport: {kind}", highlight=False)
        how = "reached through srun (slurm.ssh: false)" if kind == "srun" else "runs on this machine (transport: local)"
        return done("local", f"{how}; there is no SSH host key to pin")
    if isinstance(got, Exception):
        say.print(f"[bold]{escape(t.name)}[/]  {escape(host)}:{port}{escape(via)}", highlight=False)
        reason = getattr(got, "strerror", None) or str(got) or type(got).__name__
        return done("unreachable", f"cannot fetch the host key: {reason}; check the node is up and its address "
                    f"in the inventory", "bold red")
    extra.update(key_type=got.key_type, fingerprint=got.fingerprint)
    if source is not None:
        extra["from"] = str(source)
    origin = f"  (from {source})" if source else ""
    say.print(f"[bold]{escape(t.name)}[/]  {escape(host)}:{port}{escape(via)}  {got.key_type}  {got.fingerprint}"
              f"{escape(origin)}", highlight=False)
    pinned = hostkeys.pinned(path, host, port)
    extra["pinned"] = {k: hostkeys.fingerprint(v) for k, v in pinned.items()}
    if pinned.get(got.key_type) == got.key:
        return done("already-pinned", f"already pinned in {path}", "green")
    # a fetched key of another type than the pinned one means the server lost that key: a change;
    # an imported file may just list more key types than are pinned: only the same type can differ
    changed = got.key_type in pinned if source is not None else bool(pinned)
    again = f"sparkfleet trust {t.node.name if t.node else '...'}"
    if changed:
        old = ", ".join(f"{fp} ({k})" for k, fp in extra["pinned"].items())
        entry = escape(hostkeys.host_entry(host, port))
        err.print(f"  [bold red]WARNING: HOST KEY CHANGED for {escape(t.name)} ({entry})[/]: "
                  f"pinned {old}, the node now offers {got.fingerprint} ({got.key_type}). The node was "
                  f"reinstalled or someone is in between; verify the new key out of band.", highlight=False)
        if not args.replace:
            return done("changed", f"refused: a different key is pinned; after verifying, re-pin with "
                        f"`{again} --replace`", "bold red")
        if not _confirm(args, f"Replace the pinned key of {t.name} with {got.fingerprint}?"):
            return done("declined", "not replaced; the old key stays pinned")
        hostkeys.pin(path, host, port, got.key, replace=True)
        return done("replaced", f"replaced in {path}", "green")
    if not _confirm(args, f"Pin this key for {t.name}?"):
        return done("declined", "not pinned")
    hostkeys.pin(path, host, port, got.key)
    return done("pinned", f"pinned in {path}", "green")


def _confirm(args: argparse.Namespace, question: str) -> bool:
    """y/N on stderr; no answer (EOF, no stdin) is no."""
    if args.yes:
        return True
    err.print(f"  {question} [y/N] ", end="", markup=False, highlight=False)
    try:
        answer = sys.stdin.readline()
    except (OSError, ValueError, AttributeError):  # closed or missing stdin
        answer = ""
    if not answer.endswith("\n"):
        err.print()
    return answer.strip().lower() in ("y", "yes")
