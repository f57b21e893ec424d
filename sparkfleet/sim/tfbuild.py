"""SIMULATION: what a lab node needs for `sparkfleet build` of a TensorFold lane, since no TensorFold source
and no Zig 0.17.0 are reachable here.

- A stand-in of the fork (bertholomus/TensorFold, branch deepseek-v41-zig-tp4), made with the real git: a
  bare repository at /var/lib/sparkfleet-sim/tensorfold/TensorFold.git in each node, every file of it
  saying SIMULATION. The node's ~/.gitconfig points the profile's source URL there (git's own
  `url.<base>.insteadOf`), so the controller runs the seed's `git clone -b BRANCH URL` unchanged. The
  stand-in commit cannot have the seed's hash 5940208, so a tag of that name carries it: `git checkout
  5940208` resolves it as git resolves any name, refs before abbreviated object names (gitrevisions(7)).
- Three stand-in patches (the seed's bytes are not published), made by the real `git format-patch`, in the
  profile's tensorfold.build.patches dir: the seed's `git am DIR/*.patch` applies them.
- The Zig stand-in (sparkfleet/sim/zig.py) as /usr/local/bin/zig.
The ~/.gitconfig also gives the node a git identity: `git am` commits, and a node without one fails there,
as a real one would.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

from sparkfleet.schema.inventory import Node
from sparkfleet.schema.profile import Profile
from sparkfleet.sim.paths import inside

REPO_NODE_DIR = "/var/lib/sparkfleet-sim/tensorfold/TensorFold.git"  # the stand-in fork, in each node
SHEBANG = "#!/usr/bin/python3\n"  # the node's system Python (as the shims' stubs)
IDENTITY = ("sparkfleet sim", "sim@sparkfleet.invalid")
GIT_ENV = {"GIT_AUTHOR_NAME": IDENTITY[0], "GIT_AUTHOR_EMAIL": IDENTITY[1], "GIT_COMMITTER_NAME": IDENTITY[0],
           "GIT_COMMITTER_EMAIL": IDENTITY[1], "GIT_AUTHOR_DATE": "2026-10-17T00:00:00Z",
           "GIT_COMMITTER_DATE": "2026-10-17T00:00:00Z", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}

BUILD_ZIG = """// SIMULATION: stand-in for TensorFold's build.zig (not published in the seeds). The sim's zig
// stand-in (sparkfleet/sim/zig.py) reads the step names and the exe's name from this file.
const std = @import("std");

pub fn build(b: *std.Build) void {
    const exe = b.addExecutable(.{ .name = "tensorfold", .root_source_file = b.path("src/main.zig") });
    b.installArtifact(exe);
    const native = b.step("native", "SIMULATION: stands in for the recipe's native kernels");
    native.dependOn(b.getInstallStep());
}
"""
MAIN_ZIG = """// SIMULATION: stand-in for TensorFold's engine source (DeepSeek-V4.1 TP4, not reachable here).
const patches = @import("patches.zig");
pub fn main() void {
    _ = patches.applied;
}
"""
PATCHES = (  # (file name, subject, line added to src/patches.zig): the seed's three, their bytes unpublished
    ("0001-sim-stand-in-engine-patch-1.patch", "SIMULATION: stand-in for engine patch 1", "pub const one = 1;"),
    ("0002-sim-stand-in-engine-patch-2.patch", "SIMULATION: stand-in for engine patch 2", "pub const two = 2;"),
    ("0003-sim-stand-in-engine-patch-3.patch", "SIMULATION: stand-in for engine patch 3", "pub const three = 3;"),
)

_MADE: dict[tuple[str, str], tuple[Path, dict[str, bytes]]] = {}
_KEEP: list[tempfile.TemporaryDirectory] = []


def _git(cwd: Path, *args: str) -> str:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("GIT_")}, **GIT_ENV}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def stand_in(branch: str, commit: str) -> tuple[Path, dict[str, bytes]]:
    """(the bare stand-in repository, its patches by file name), made once per branch and commit name."""
    if (branch, commit) in _MADE:
        return _MADE[(branch, commit)]
    tmp = tempfile.TemporaryDirectory(prefix="sparkfleet-sim-tensorfold-")
    _KEEP.append(tmp)
    work = Path(tmp.name) / "work"
    (work / "src").mkdir(parents=True)
    (work / "README.md").write_text("SIMULATION: a stand-in for bertholomus/TensorFold (branch "
                                    f"{branch}), made by sparkfleet/sim/tfbuild.py. It is not TensorFold.\n")
    (work / "build.zig").write_text(BUILD_ZIG)
    (work / "src" / "main.zig").write_text(MAIN_ZIG)
    (work / "src" / "patches.zig").write_text("// SIMULATION: the stand-in patches add their lines here\n"
                                              "pub const applied = true;\n")
    _git(work, "init", "-q", "-b", branch)
    _git(work, "add", "-A")
    _git(work, "commit", "-q", "-m", f"SIMULATION: stand-in for engine commit {commit}")
    _git(work, "tag", commit)  # `git checkout <commit>` finds the ref (see the module docstring)
    bare = Path(tmp.name) / "TensorFold.git"
    _git(Path(tmp.name), "clone", "-q", "--bare", str(work), str(bare))
    for _name, subject, line in PATCHES:
        with (work / "src" / "patches.zig").open("a") as f:
            f.write(line + "\n")
        _git(work, "commit", "-q", "-am", subject)
    out = Path(tmp.name) / "patches"
    _git(work, "format-patch", "-q", "-o", str(out), f"{commit}..HEAD")
    made = sorted(out.glob("*.patch"))
    patches = {name: p.read_bytes() for (name, _s, _l), p in zip(PATCHES, made, strict=True)}
    _MADE[(branch, commit)] = (bare, patches)
    return _MADE[(branch, commit)]


def place(root: Path, node: Node, profiles: list[Profile], bin_dir: Path, home: str) -> None:
    """The stand-in fork, patches, git config and zig in one node, for every lane with a TensorFold build."""
    builds = [p.tensorfold.build for p in profiles if p.tensorfold and p.tensorfold.build]
    if not builds:
        return
    config = [f"[user]\n\tname = {IDENTITY[0]}\n\temail = {IDENTITY[1]}\n"]
    for b in builds:
        bare, patches = stand_in(b.branch, b.commit)
        repo = inside(root, REPO_NODE_DIR)
        if not repo.exists():
            shutil.copytree(bare, repo)
        config.append(f'[url "file://{REPO_NODE_DIR}"]\n\tinsteadOf = {b.source}\n')
        pdir = inside(root, b.patches)
        pdir.mkdir(parents=True, exist_ok=True)
        for name, data in patches.items():
            (pdir / name).write_bytes(data)
    gitconfig = inside(root, home) / ".gitconfig"
    gitconfig.parent.mkdir(parents=True, exist_ok=True)
    gitconfig.write_text("# SIMULATION: the lab node's git config (sparkfleet/sim/tfbuild.py)\n"
                         + "".join(dict.fromkeys(config)))
    zig = bin_dir / "zig"
    bin_dir.mkdir(parents=True, exist_ok=True)
    zig.write_text(SHEBANG + (Path(__file__).parent / "zig.py").read_text())
    zig.chmod(zig.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
