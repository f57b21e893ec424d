"""`sparkfleet config`: the defaults in effect (inventory, root, state dir, SSH config) and where each came from."""

from __future__ import annotations

import argparse

from sparkfleet.cli.common import EXIT_OK, add_json, out, print_json

ORDER = 95

EPILOG = """examples:
  sparkfleet config                       # each setting, its value and its source
  export SPARKFLEET_INVENTORY=sim         # this shell's default inventory (`sim up` prints this line)

The config file is YAML with any of these keys (relative paths are taken from the file's dir):
  inventory: lab
  root: ~/ops
  state: ~/.local/state/sparkfleet
  ssh_config: ~/.ssh/config
Precedence: command-line option, then the environment variable, then the file, then the default."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="show the defaults in effect and where each came from",
                       description="Print every per-user setting (default inventory, ops root, state dir, SSH "
                       "config), its value and its source: an option, an environment variable, the user's config "
                       "file ($SPARKFLEET_CONFIG or $XDG_CONFIG_HOME/sparkfleet/config.yaml) or the default.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_json(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sparkfleet.userconfig import KNOWN, config_path, setting

    path = config_path()
    rows = []
    for name, known in KNOWN.items():
        s = setting(name)
        value = s.value
        if name == "root" and value is None:
            from sparkfleet.root import find_root

            try:
                value, s = str(find_root()), type(s)(name, str(find_root()), "default (this checkout)")
            except Exception:  # noqa: BLE001 - no checkout here: shown as unset
                value = None
        rows.append({"name": name, "value": value, "source": s.source, "env": known.env})
    if args.json:
        print_json({"config_file": str(path), "exists": path.is_file(), "settings": rows})
        return EXIT_OK
    from sparkfleet.cli.tables import Column, render

    out.print(f"config file: {path}" + ("" if path.is_file() else " (not present)"), markup=False)
    cols = [Column("setting"), Column("value", wrap=True), Column("source", wrap=True)]
    render(cols, [[r["name"], r["value"] or "-", r["source"]] for r in rows], wide=getattr(args, "wide", False))
    return EXIT_OK
