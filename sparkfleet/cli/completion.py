"""`sparkfleet completion bash|zsh`: tab completion generated from sparkfleet's own argument parser.

The script holds every command, subcommand and option as the parser defines them (so it cannot
drift from the CLI), and asks `sparkfleet completion --values KIND` at tab time for what changes:
profile names, node names (of the inventory on the command line, else the default one), restore
points, run ids and inventories. zsh uses the same function through bashcompinit.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from pathlib import Path

ORDER = 96
_ABSTRACT = re.compile(r"^abstract:\s*true\s*(#.*)?$", re.M)  # a base `plan` refuses: never offered
KINDS = ("commands", "profiles", "nodes", "restore-points", "runs", "inventories")

# which argument (by dest) completes to which dynamic kind
BY_DEST = {"profile": "profiles", "control": "profiles", "candidate": "profiles", "node": "nodes",
           "nodes": "nodes", "inventory": "inventories", "run": "runs", "run_id": "runs"}
FILES = {"root", "out", "known_hosts", "from_known_hosts", "bars", "prompt_set", "playbook_file", "playbook",
         "dir", "file"}

EPILOG = """examples:
  source <(sparkfleet completion bash)                       # this shell
  sparkfleet completion bash > ~/.local/share/bash-completion/completions/sparkfleet
  sparkfleet completion zsh > "${fpath[1]}/_sparkfleet"       # or: source <(sparkfleet completion zsh)
  sparkfleet completion --values nodes --inventory sim       # what the script asks at tab time"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("completion", help="print bash or zsh tab completion (commands, profiles, nodes, "
                       "restore points)", description="Print a completion script generated from sparkfleet's "
                       "own parser.", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("shell", nargs="?", choices=("bash", "zsh"), help="the shell to print the script for")
    p.add_argument("--values", choices=KINDS, help="print the current values of one kind, one per line")
    p.add_argument("--inventory", "-i", metavar="NAME|FILE", help="for --values nodes (default: the user's)")
    p.add_argument("--root", metavar="DIR", help="ops directory")
    p.set_defaults(func=run)


def _kind(action: argparse.Action, command: str) -> str:
    """What one argument completes to: a dynamic kind, `files`, `choice:a b`, or `` (nothing)."""
    if action.choices and not isinstance(action, argparse._SubParsersAction):
        return "choice:" + ",".join(map(str, action.choices))
    if command == "restore" and action.dest == "name":
        return "restore-points"
    if command == "show" and action.dest == "profile":
        return "profiles"
    if action.dest in BY_DEST:
        return BY_DEST[action.dest]
    if action.dest in FILES or (action.metavar or "").upper() in ("FILE", "DIR", "NAME|FILE", "V1|FILE"):
        return "files"
    return ""


def describe(parser: argparse.ArgumentParser, command: str = "") -> dict:
    """{options, takes: {option: kind}, positionals: [kind], sub: {name: describe(...)}} of one parser."""
    doc: dict = {"options": [], "takes": {}, "positionals": [], "sub": {}}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                doc["sub"][name] = describe(child, name if not command else command)
            continue
        if action.option_strings:
            doc["options"] += action.option_strings
            if action.nargs != 0:
                for opt in action.option_strings:
                    doc["takes"][opt] = _kind(action, command)
        else:
            doc["positionals"].append(_kind(action, command))
    return doc


def _case(doc: dict, indent: str) -> list[str]:
    """Set opts/subs/pos (and want, from $prev) for one command path."""
    out = [f'{indent}opts={shlex.quote(" ".join(doc["options"]))}',
           f'{indent}subs={shlex.quote(" ".join(doc["sub"]))}',
           f'{indent}pos={shlex.quote(" ".join(k or "-" for k in doc["positionals"]))}',
           f"{indent}case $prev in"]
    for opt, kind in doc["takes"].items():
        out.append(f"{indent}  {shlex.quote(opt)}) want={shlex.quote(kind or '-')} ;;")
    out.append(f"{indent}esac")
    return out


def core_script(parser: argparse.ArgumentParser) -> str:
    """`_sparkfleet_complete CWORD WORD...`: sets `cands` (the matching words) or `files=1`.

    Written in the syntax bash and zsh (under `emulate -L ksh`) share: 0-based arrays, [[ ]], (( )).
    """
    doc = describe(parser)
    every = [doc, *doc["sub"].values(), *(s for d in doc["sub"].values() for s in d["sub"].values())]
    takes_value = sorted({o for d in every for o in d["takes"]})
    lines = [
        "_sparkfleet_complete() {",
        "  local cword=$1; shift",
        "  local -a sw; sw=(\"$@\")",
        "  local cur=${sw[cword]} prev='' cpath='' i w skip=0 npos=0 inv='' root='' opts subs pos want='' list c",
        "  ((cword > 0)) && prev=${sw[cword-1]}",
        f"  local valued=' {' '.join(takes_value)} '",
        "  cands=(); files=0",
        "  _sparkfleet_at ''",
        "  for ((i=1; i<cword; i++)); do",
        "    w=${sw[i]}",
        "    if ((skip)); then skip=0; continue; fi",
        "    case $w in",
        "      --inventory|-i) inv=${sw[i+1]}; skip=1; continue ;;",
        "      --root) root=${sw[i+1]}; skip=1; continue ;;",
        "      --*=*) continue ;;",
        "      -*) [[ $valued == *\" $w \"* ]] && skip=1; continue ;;",
        "    esac",
        "    if [[ \" $subs \" == *\" $w \"* ]]; then cpath=\"$cpath $w\"; npos=0; else npos=$((npos + 1)); fi",
        "    _sparkfleet_at \"$cpath\"",
        "  done",
        "  _sparkfleet_at \"$cpath\"",
        "  case $prev in --inventory|-i) want=inventories ;; --root) want=files ;; esac",
        "  if [[ -z $want && $cur != -* ]]; then",
        "    if [[ -n $subs ]]; then want=\"choice:$subs\"",
        "    else",
        "      local -a p; p=($pos)",
        "      if ((npos < ${#p[@]})); then want=${p[npos]}; elif ((${#p[@]})); then want=${p[${#p[@]}-1]}; fi",
        "      [[ $want == - ]] && want=''",
        "    fi",
        "  fi",
        "  if [[ $cur == -* ]]; then list=$opts",
        "  else",
        "    case $want in",
        "      files) files=1; return 0 ;;",
        "      choice:*) list=${want#choice:}; list=${list//,/ } ;;",
        "      profiles|nodes|restore-points|runs|inventories)",
        "        list=$(sparkfleet completion --values \"$want\" ${inv:+--inventory \"$inv\"} "
        "${root:+--root \"$root\"} 2>/dev/null) ;;",
        "      *) list='' ;;",
        "    esac",
        "  fi",
        "  for c in $list; do [[ $c == \"$cur\"* ]] && cands+=(\"$c\"); done",
        "  return 0",
        "}",
        "_sparkfleet_at() {",
        "  want=''",
        "  case \"$1\" in",
    ]

    def walk(d: dict, path: str) -> None:
        lines.append(f"    {shlex.quote(path)})")
        lines.extend(_case(d, "      "))
        lines.append("      ;;")
        for name, child in d["sub"].items():
            walk(child, f"{path} {name}")

    walk(doc, "")
    lines += ["  esac", "}", ""]
    return "\n".join(lines)


def bash_script(parser: argparse.ArgumentParser) -> str:
    return ("# sparkfleet completion for bash (generated from sparkfleet's parser: `sparkfleet completion bash`)\n"
            + core_script(parser) + """_sparkfleet() {
  local -a cands; local files
  _sparkfleet_complete "$COMP_CWORD" "${COMP_WORDS[@]}"
  if ((files)); then COMPREPLY=($(compgen -f -- "${COMP_WORDS[COMP_CWORD]}")); else COMPREPLY=("${cands[@]}"); fi
}
complete -o default -F _sparkfleet sparkfleet
""")


def zsh_script(parser: argparse.ArgumentParser) -> str:
    return ("#compdef sparkfleet\n# sparkfleet completion for zsh (generated from sparkfleet's parser: "
            "`sparkfleet completion zsh`)\n" + core_script(parser).replace("_sparkfleet_complete() {\n",
            "_sparkfleet_complete() {\n  emulate -L ksh\n").replace("_sparkfleet_at() {\n",
            "_sparkfleet_at() {\n  emulate -L ksh\n") + """_sparkfleet() {
  local -a cands; local files
  _sparkfleet_complete $((CURRENT - 1)) "${words[@]}"
  if ((files)); then _files; else compadd -- "${cands[@]}"; fi
}
if (( $+functions[compdef] )); then compdef _sparkfleet sparkfleet; fi
""")


def values(kind: str, inventory: str | None, root: str | None) -> list[str]:
    """The current names of one kind (cheap: file names and plain YAML, no model validation)."""
    if kind == "commands":
        from sparkfleet.cli.main import build_parser

        return sorted(describe(build_parser())["sub"])
    from sparkfleet.root import find_root, state_dir

    if kind in ("runs", "restore-points"):
        d = state_dir() / ("runs" if kind == "runs" else "restore")
        return sorted(p.stem for p in d.glob("*.json"))
    base = find_root(root)
    if kind == "profiles":
        return sorted(p.stem for p in (base / "profiles").glob("*.yaml")
                      if not p.stem.startswith("_") and not _ABSTRACT.search(p.read_text()))
    if kind == "inventories":
        return sorted({p.stem for p in (base / "inventories").glob("*.yaml")} | {"sim"})
    import yaml

    from sparkfleet.spec.load import Spec
    from sparkfleet.userconfig import value

    path = Spec(base).inventory_path(inventory or value("inventory") or "lab")
    data = yaml.safe_load(Path(path).read_text()) or {}
    return sorted((data.get("nodes") or {}).keys())


def run(args: argparse.Namespace) -> int:
    if args.values:
        try:
            sys.stdout.write("".join(f"{v}\n" for v in values(args.values, args.inventory, args.root)))
        except Exception:  # noqa: BLE001 - completion must stay silent: no list is better than a traceback
            return 1
        return 0
    if not args.shell:
        from sparkfleet.spec.errors import UserError

        raise UserError("completion: name the shell (bash or zsh), or pass --values KIND")
    from sparkfleet.cli.main import build_parser

    parser = build_parser()
    sys.stdout.write(bash_script(parser) if args.shell == "bash" else zsh_script(parser))
    return 0


if __name__ == "__main__":  # for debugging the parser description
    from sparkfleet.cli.main import build_parser

    print(json.dumps(describe(build_parser()), indent=1))
