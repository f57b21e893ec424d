"""`sparkfleet trust NODE... | --all`: show each node's SSH host key fingerprint and pin it when the user says so.

sparkfleet checks host keys strictly against its own known_hosts; this is the one place keys get in.
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.markup import escape

from sparkfleet.cli.common import EXIT_FAIL, EXIT_OK, add_inventory, add_json, add_root, err, out, print_json, spec
from sparkfleet.fleet import hostkeys
from sparkfleet.spec.errors import UserError
from sparkfleet.spec.inventory import Node

ORDER = 80
GOOD = ("pinned", "already-pinned", "replaced", "local")

EPILOG = """examples:
  sparkfleet trust reddie                 # show reddie's key fingerprint, pin it if you answer y
  sparkfleet trust --all --yes            # pin every node's current key without asking (first setup)
  sparkfleet trust asusi --replace        # asusi was reinstalled: verify the new key, then re-pin it

Compare the fingerprint with the node's own (on its console: ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub)
before you pin it. Exit status: 0 when every named node ends up pinned, 1 otherwise, 2 for bad input.
"""


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
    p.add_argument("--timeout", type=float, default=10.0, metavar="S", help="per-node connect timeout (default 10)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.all and args.nodes:
        raise UserError("trust: name nodes or pass --all, not both")
    if not args.all and not args.nodes:
        raise UserError("trust: name the nodes to trust, or pass --all (see `sparkfleet trust --help`)")
    inventory = spec(args).inventory(args.inventory)
    if args.all:
        nodes = list(inventory.nodes.values())
    else:
        unknown = [n for n in args.nodes if n not in inventory.nodes]
        if unknown:
            raise UserError(f"trust: no node named {', '.join(map(repr, unknown))} in inventory {inventory.name} "
                            f"(known: {', '.join(inventory.nodes)})")
        nodes = [inventory.nodes[n] for n in dict.fromkeys(args.nodes)]
    path = Path(args.known_hosts).expanduser() if args.known_hosts else hostkeys.default_known_hosts()

    # Fetch every key at once (a dead node costs one timeout, not one per node), then ask in order.
    with ThreadPoolExecutor(max_workers=max(1, min(len(nodes), 32))) as pool:
        fetched = list(pool.map(lambda n: _fetch(n, path, args.timeout), nodes))
    rows = [_decide(node, got, path, args) for node, got in zip(nodes, fetched, strict=True)]
    if args.json:
        print_json({"known_hosts": str(path), "nodes": rows})
    return EXIT_OK if all(r["status"] in GOOD for r in rows) else EXIT_FAIL


def _fetch(node: Node, path: Path, timeout_s: float) -> hostkeys.FetchedKey | Exception | None:
    if node.transport != "ssh":
        return None
    try:
        prefer = list(hostkeys.pinned(path, node.ssh.host, node.ssh.port))
        return hostkeys.fetch_host_key(node.ssh.host, node.ssh.port, timeout_s=timeout_s, prefer=prefer)
    except Exception as exc:  # noqa: BLE001 - reported for this node; the others go on
        return exc


def _decide(node: Node, got: hostkeys.FetchedKey | Exception | None, path: Path, args: argparse.Namespace) -> dict:
    """Show one node's key, pin it if confirmed; return its JSON row."""
    host, port = node.ssh.host, node.ssh.port
    row: dict = {"node": node.name, "host": host, "port": port, "key_type": None, "fingerprint": None}
    say = err if args.json else out  # with --json, stdout is only the JSON document

    def done(status: str, message: str, style: str = "") -> dict:
        say.print(f"  [{style}]{escape(message)}[/]" if style else f"  {escape(message)}", highlight=False)
        return {**row, "status": status, "message": message}

    if got is None:
        say.print(f"[bold]{node.name}[/]  transport: local", highlight=False)
        return done("local", "runs on this machine (transport: local); there is no SSH host key to pin")
    if isinstance(got, Exception):
        say.print(f"[bold]{node.name}[/]  {escape(host)}:{port}", highlight=False)
        reason = getattr(got, "strerror", None) or str(got) or type(got).__name__
        return done("unreachable", f"cannot fetch the host key: {reason}; check the node is up and its address "
                    f"in the inventory", "bold red")
    row.update(key_type=got.key_type, fingerprint=got.fingerprint)
    say.print(f"[bold]{node.name}[/]  {escape(host)}:{port}  {got.key_type}  {got.fingerprint}", highlight=False)
    pinned = hostkeys.pinned(path, host, port)
    row["pinned"] = {t: hostkeys.fingerprint(k) for t, k in pinned.items()}
    if pinned.get(got.key_type) == got.key:
        return done("already-pinned", f"already pinned in {path}", "green")
    if pinned:
        old = ", ".join(f"{fp} ({t})" for t, fp in row["pinned"].items())
        entry = escape(hostkeys.host_entry(host, port))
        err.print(f"  [bold red]WARNING: HOST KEY CHANGED for {node.name} ({entry})[/]: "
                  f"pinned {old}, the node now offers {got.fingerprint} ({got.key_type}). The node was "
                  f"reinstalled or someone is in between; verify the new key out of band.", highlight=False)
        if not args.replace:
            return done("changed", f"refused: a different key is pinned; after verifying, re-pin with "
                        f"`sparkfleet trust {node.name} --replace`", "bold red")
        if not _confirm(args, f"Replace the pinned key of {node.name} with {got.fingerprint}?"):
            return done("declined", "not replaced; the old key stays pinned")
        hostkeys.pin(path, host, port, got.key, replace=True)
        return done("replaced", f"replaced in {path}", "green")
    if not _confirm(args, f"Pin this key for {node.name}?"):
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
