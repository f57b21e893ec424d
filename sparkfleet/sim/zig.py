"""SIMULATION: the simulated lab's stand-in for the Zig 0.17.0 toolchain (seed 002: "launch/setup.sh fetches
Zig 0.17.0"), installed as /usr/local/bin/zig in each node (sparkfleet/sim/tfbuild.py). Stdlib only: the
node's system Python runs this file as it is.

It takes what the seed's build runs, `zig build install native -D...`, in a checkout of the sim's stand-in
TensorFold source, and prints what Zig's build runner prints (ziglang/zig lib/compiler/build_runner.zig,
read at commit 001ff7b3, and src/main.zig for the missing build.zig):
- success prints nothing ("A proper command line application defaults to silently succeeding": the
  default summary is `failures`);
- an unknown step: "no step named '<name>'\\n  access the help menu with 'zig build -h'\\n", exit 1;
- no build.zig in the directory or a parent: two info lines and "error: no build.zig file found, in the
  current directory or any parent directories", exit 1;
- a compile error: "<file>:<line>:<col>: error: <message>" and "Build Summary: 0/<n> steps succeeded; 1
  failed", exit 1.
What it "compiles": the stand-in source's `@compileError("...")` lines are compile errors; otherwise
`install` writes zig-out/bin/<the exe's .name> whose bytes are a SIMULATION header and the sha256 of every
source file and -D option, so the same source, patches and options give the same bytes on every rank and a
different patch gives different bytes, as a reproducible build would.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys

VERSION = "0.17.0"
BUILTIN_STEPS = ("install", "uninstall")  # every build.zig has them (std.Build)
SKIP_DIRS = {".git", "zig-out", ".zig-cache", "zig-cache"}
STEP = re.compile(r'b\.step\("([^"]+)"')
EXE_NAME = re.compile(r'\.name\s*=\s*"([^"]+)"')
COMPILE_ERROR = re.compile(r'@compileError\("([^"]*)"\)')


def find_build_root(start: str) -> str | None:
    d = os.path.abspath(start)
    while True:
        if os.path.isfile(os.path.join(d, "build.zig")):
            return d
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent


def sources(root: str) -> list[str]:
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS)
        out += [os.path.join(d, f) for f in sorted(files)]
    return out


def compile_errors(root: str) -> list[str]:
    errs = []
    for path in sources(root):
        if not path.endswith(".zig") or os.path.basename(path) == "build.zig":
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, start=1):
                m = COMPILE_ERROR.search(line.split("//", 1)[0])
                if m:
                    errs.append(f"{os.path.relpath(path, root)}:{n}:{m.start() + 1}: error: {m.group(1)}")
    return errs


def build(argv: list[str]) -> int:
    root = find_build_root(os.getcwd())
    if root is None:
        sys.stderr.write("info: initialize build.zig template file with 'zig init'\n"
                         "info: see 'zig --help' for more options\n"
                         "error: no build.zig file found, in the current directory or any parent directories\n")
        return 1
    with open(os.path.join(root, "build.zig"), encoding="utf-8") as f:
        script = f.read()
    steps, options, prefix = [], [], os.path.join(root, "zig-out")
    args = iter(argv)
    for a in args:
        if a.startswith("-D"):
            options.append(a)
        elif a in ("-p", "--prefix"):
            prefix = os.path.abspath(next(args, "zig-out"))
        elif not a.startswith("-"):
            steps.append(a)
    declared = set(BUILTIN_STEPS) | set(STEP.findall(script))
    for s in reversed(steps):  # the build runner looks them up last first
        if s not in declared:
            sys.stderr.write(f"no step named '{s}'\n  access the help menu with 'zig build -h'\n")
            return 1
    errors = compile_errors(root)
    if errors:
        sys.stderr.write("\n".join(errors) + "\n")
        sys.stderr.write(f"Build Summary: 0/{len(steps) + 1} steps succeeded; 1 failed\n")
        return 1
    if "install" in steps or not steps:
        h = hashlib.sha256()
        for path in sources(root):
            h.update(os.path.relpath(path, root).encode() + b"\0")
            with open(path, "rb") as f:
                h.update(f.read())
        for o in options:
            h.update(b"-D\0" + o.encode())
        name = (EXE_NAME.findall(script) or ["main"])[0]
        os.makedirs(os.path.join(prefix, "bin"), exist_ok=True)
        with open(os.path.join(prefix, "bin", name), "wb") as f:
            f.write(b"#!/bin/sh\n# SIMULATION: stand-in TensorFold engine built by the sim's zig stand-in\n"
                    b"# inputs sha256 " + h.hexdigest().encode() + b"\n")
        os.chmod(os.path.join(prefix, "bin", name), 0o755)
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["version"]:
        print(VERSION)
        return 0
    if argv[:1] == ["build"]:
        return build(argv[1:])
    sys.stderr.write(f"SIMULATION: this zig stand-in runs only `zig version` and `zig build`, not {argv[:1]}\n")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
