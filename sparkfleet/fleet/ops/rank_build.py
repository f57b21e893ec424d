"""Building an engine on a rank (sparkfleet/engines/build_recipe.py gives the published commands): the build in a
staging dir, moving it into place, removing a failed stage, and hashing the built artefact.

The build script prints `sparkfleet-build: step NAME` before each step and, last, one
`sparkfleet-build: artefact {json}` line with the staged artefact's hashes; the hash alone prints the
same line. enginebuild.py drives these, decides whether the ranks agree, and keeps the pin.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import shlex
from dataclasses import dataclass, field

from sparkfleet.engines.build_recipe import EngineBuild
from sparkfleet.fleet.ops.base import Done, Op
from sparkfleet.fleet.transport import Result

MARK = "sparkfleet-build:"  # the lines the build script prints between the programs' own output
TAIL_LINES = 12  # of a failed step's output, in the finding
BUILD_TIMEOUT_S = 3600.0  # a bound, not an estimate: the seeds give no build time

# Runs on the node with plain python3: sha256 of every file under the dir on stdin (JSON), or missing.
TREE_HASH_SCRIPT = (
    "import hashlib,json,os,sys\n"
    "top=sys.stdin.read().strip()\n"
    "out={}\n"
    "for d,dirs,files in os.walk(top):\n"
    "    dirs.sort()\n"
    "    for f in sorted(files):\n"
    "        p=os.path.join(d,f)\n"
    "        h=hashlib.sha256()\n"
    "        if os.path.islink(p):\n"
    "            h.update(os.readlink(p).encode())\n"
    "        else:\n"
    "            with open(p,'rb') as fh:\n"
    "                for b in iter(lambda: fh.read(1<<20), b''): h.update(b)\n"
    "        out[os.path.relpath(p,top)]=h.hexdigest()\n"
    f"print({MARK!r}, 'artefact', json.dumps({{'dir':top,'exists':os.path.isdir(top),'files':out}}))\n"
)


def tree_digest(files: dict[str, str]) -> str:
    """One sha256 for a tree: over `sha256sum`-style lines (`<sha256>  <path>`), sorted by path."""
    text = "".join(f"{files[p]}  {p}\n" for p in sorted(files))
    return hashlib.sha256(text.encode()).hexdigest()


def hash_command() -> str:
    return f"python3 -c {shlex.quote(TREE_HASH_SCRIPT)}"


def build_script(b: EngineBuild) -> str:
    """The shell a rank runs: each published command in turn (its name printed first, so a failure is
    reported under it), stopping at the first that fails; then the staged artefact's hashes."""
    q = shlex.quote
    parent = posixpath.dirname(b.stage)
    # the build dir's parent (TensorFold: the recipe dir) must be there: a build is never put where nothing
    # would serve it
    missing = f"{parent}: no such directory on this node (the parent of the build dir {b.dir})"
    lines = ["exec 2>&1", f"printf '%s\\n' {q(MARK + ' step prepare')}",
             f"[ -d {q(parent)} ] || {{ printf '%s\\n' {q(missing)}; exit 1; }}",
             f"rm -rf -- {q(b.stage)} && cd -- {q(parent)} || exit 1",
             f"printf '%s\\n' {q(MARK + ' step ' + b.fetch.name)}", f"{b.fetch.command} || exit 1",
             f"cd -- {q(b.stage)} || exit 1"]
    for s in b.steps:
        lines += [f"printf '%s\\n' {q(MARK + ' step ' + s.name)}", f"{s.command} || exit 1"]
    lines += [f"printf '%s\\n' {q(MARK + ' step hash the artefact')}",
              f"printf '%s' {q(posixpath.join(b.stage, b.artefact))} | {hash_command()} || exit 1"]
    return "\n".join(lines)


def install_script(b: EngineBuild) -> str:
    """Move the stage into place (the previous build aside first, removed once the new one is there)."""
    q = shlex.quote
    old = b.dir + ".sparkfleet-old"
    return (f"rm -rf -- {q(old)} && {{ [ ! -e {q(b.dir)} ] || mv -- {q(b.dir)} {q(old)}; }} && "
            f"mv -- {q(b.stage)} {q(b.dir)} && rm -rf -- {q(old)}")


def cleanup_script(b: EngineBuild) -> str:
    return f"rm -rf -- {shlex.quote(b.stage)}"


@dataclass
class RankBuild:
    """One node's build: the artefact's files, or the step that failed and its last lines."""

    node: str
    ok: bool
    files: dict[str, str] = field(default_factory=dict)
    step: str = ""
    tail: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def digest(self) -> str | None:
        return tree_digest(self.files) if self.ok else None


def parse_build(node: str, stdout: str, ok: bool, message: str, elapsed: float) -> RankBuild:
    """What the build script printed: the artefact line, or the last step named and what followed it."""
    step, after, artefact = "", [], None
    for line in stdout.splitlines():
        if line.startswith(MARK + " step "):
            step, after = line[len(MARK + " step "):], []
        elif line.startswith(MARK + " artefact "):
            artefact = json.loads(line[len(MARK + " artefact "):])
        else:
            after.append(line)
    if ok and artefact is not None:
        if not artefact["files"]:
            return RankBuild(node, False, step="hash the artefact", seconds=elapsed,
                             tail=[f"the build installed nothing under {artefact['dir']}"])
        return RankBuild(node, True, files=artefact["files"], seconds=elapsed)
    tail = [ln for ln in after if ln.strip()][-TAIL_LINES:] or ([message] if message else [])
    return RankBuild(node, False, step=step or "reach the node", tail=tail, seconds=elapsed)


@dataclass(frozen=True)
class BuildEngine(Op[RankBuild]):
    """Build on a rank, in the staging dir (`build_script`). Its answer: the artefact's files, or the step that
    failed and its last lines."""

    build: EngineBuild
    changes = True
    timeout_s = BUILD_TIMEOUT_S

    def command(self) -> str:
        return build_script(self.build)

    def parse(self, result: Result) -> RankBuild:
        return parse_build(result.node, result.stdout, result.ok, result.message or result.stderr.strip(),
                           result.elapsed_s)


@dataclass(frozen=True)
class InstallBuild(Op[str | None]):
    """Move a rank's stage into the build dir (`install_script`). Its answer: None when moved, else what the node
    said (its last 300 characters)."""

    build: EngineBuild
    changes = True

    def command(self) -> str:
        return install_script(self.build)

    def parse(self, result: Result) -> str | None:
        return None if result.ok else (result.stderr or result.stdout or result.message).strip()[-300:]


@dataclass(frozen=True)
class RemoveStage(Done):
    """Remove a failed build's stage (`cleanup_script`)."""

    build: EngineBuild
    changes = True

    def command(self) -> str:
        return cleanup_script(self.build)


@dataclass(frozen=True)
class HashArtefact(Op[dict | str]):
    """The built artefact's hashes on a rank (the dir goes on stdin, `stdin()`). Its answer: {dir, exists,
    files} as the hash script prints it, or why it could not be read."""

    build: EngineBuild

    def stdin(self) -> str:
        return self.build.artefact_dir

    def command(self) -> str:
        return hash_command()

    def parse(self, result: Result) -> dict | str:
        line = next((ln for ln in result.stdout.splitlines() if ln.startswith(MARK + " artefact ")), None)
        return json.loads(line[len(MARK + " artefact "):]) if result.ok and line else (
            result.message or result.stderr.strip() or "no answer")
