"""The exporter's second, optional command per node: earlyoom kills from the journal, and Engram manifests.

The facts helper has no journal field (and its schema is shared), so this is a separate `python3 -c`
one-liner (stdlib only, like the clock probe), the request as JSON on stdin:

    {"journal": true, "since": 1796000000, "manifests": ["/nvme/engram-local/<rev>/engram-manifest.json"]}

It prints one JSON line: the node's own time (`now`, so the next window starts where this one ended on the
node's clock, with no controller/node clock skew), the earlyoom kill lines counted in
`journalctl -u earlyoom --since @SINCE --until @NOW` (the first poll only opens the window), and a
small projection of each manifest. A node whose journal cannot be read says why (`readable: false`):
journalctl missing, not permitted (the user is not in `adm`/`systemd-journal`), failing, or no journal on
the node at all (neither of journald's stores exists: journalctl then prints nothing and exits 0).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Any

from sparkfleet.fleet.transport import Result

MANIFEST_KEYS = ("schema", "complete", "format", "mode", "verified", "completed_at", "layers")
SIGNALS = ("SIGTERM", "SIGKILL")

SCRIPT = r'''
import json, os, re, shutil, subprocess, sys, time
req = json.loads(sys.stdin.read() or "{}")
now = time.time()
out = {"extras": 1, "now": now}
if req.get("journal"):
    j = shutil.which("journalctl")
    # journalctl prints nothing and exits 0 where journald keeps no journal at all, which would read as
    # "no kills"; a journal lives in one of journald's two storage dirs (persistent or volatile).
    stores = [d for d in ("/var/log/journal", "/run/log/journal") if os.path.isdir(d)]
    if j is None:
        out["journal"] = {"readable": False, "why": "no journalctl on PATH"}
    elif not stores:
        out["journal"] = {"readable": False, "why": "no journal on this node (no /var/log/journal or /run/log/journal)"}
    else:
        since = int(req["since"]) if req.get("since") is not None else int(now)
        until = int(now)
        try:
            r = subprocess.run([j, "-u", "earlyoom", "--since", "@%d" % since, "--until", "@%d" % until,
                                "--no-pager", "-o", "cat"], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired) as e:
            out["journal"] = {"readable": False, "why": "journalctl: %s" % e}
        else:
            err = r.stderr.strip()
            if r.returncode != 0 or re.search(r"insufficient permissions|not seeing messages|No journal files", err):
                first = err.splitlines()[0] if err else "exit %d" % r.returncode
                out["journal"] = {"readable": False, "why": "journalctl: " + first[:200]}
            else:
                kills = {"SIGTERM": 0, "SIGKILL": 0}
                for m in re.finditer(r"sending (SIGTERM|SIGKILL) to process", r.stdout):
                    kills[m.group(1)] += 1
                out["journal"] = {"readable": True, "since": since, "until": until, "kills": kills}
keep = @KEEP@
manifests = {}
for path in req.get("manifests") or []:
    try:
        with open(path) as f:
            m = json.load(f)
        if not isinstance(m, dict):
            raise ValueError("not a JSON object")
        src = m.get("source") if isinstance(m.get("source"), dict) else {}
        d = {k: m.get(k) for k in keep}
        d["source"] = {"revision": src.get("revision")}
        manifests[path] = {"manifest": d}
    except FileNotFoundError:
        manifests[path] = {"missing": True}
    except (OSError, ValueError) as e:
        manifests[path] = {"error": str(e)[:200]}
out["manifests"] = manifests
print(json.dumps(out))
'''.replace("@KEEP@", repr(MANIFEST_KEYS))

COMMAND = "python3 -c " + shlex.quote(SCRIPT)


@dataclass
class Extras:
    """One node's answer."""

    now: float
    journal: dict[str, Any] | None = None  # {"readable", "why"?, "since"?, "until"?, "kills"?}
    manifests: dict[str, dict[str, Any]] = field(default_factory=dict)  # path -> {"manifest"|"missing"|"error"}


def request(*, journal: bool, since: float | None, manifests: list[str]) -> str:
    """The stdin document for one node."""
    return json.dumps({"journal": journal, "since": since, "manifests": manifests})


def parse(r: Result) -> Extras | str:
    """The node's answer, or why there is none (one line)."""
    if not r.ok:
        return r.message or r.error or f"exit {r.exit_code}"
    for line in reversed(r.stdout.strip().splitlines()):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and doc.get("extras") == 1:
            return Extras(now=float(doc["now"]), journal=doc.get("journal"), manifests=doc.get("manifests") or {})
    tail = (r.stderr.strip().splitlines() or [""])[-1]
    return "the journal/manifest command printed no result" + (f" ({tail[:200]})" if tail else "")
