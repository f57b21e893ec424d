"""The lab's container images for the nodes' real dockerd: one deterministic archive per lab, `docker load`ed
on every node, so an image has the same id on every rank (drift's image-id check compares them).

THIS IS PART OF THE SIMULATED LAB. Each image a lab profile names is one small image: the stand-in
programs (sim/container.py) under BIN_DIR and /app (where llama.cpp's images keep their tools), a root
user, /tmp, and /bin, /lib, /sbin as links into /usr, which the sim's runtime binds in read-only from the
node (shim/runtime.py, as NVIDIA's runtime injects the driver's files). A vLLM image's entrypoint is
`vllm serve`, as vLLM's own image (its Dockerfile: `ENTRYPOINT ["vllm", "serve"]`). The archive is the
format `docker save` writes (moby image/tarexport: manifest.json, one config per image, its layers): the
image id is the sha256 of the config, so the same lab gives the same ids on every node and every run.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import shlex
import tarfile

BIN_DIR = "opt/sparkfleet-sim/bin"
APP_DIR = "app"
TOOLS = ("vllm", "llama-server", "rpc-server", "ggml-rpc-server", "python3", "tensorfold-serve")
# The lab's TensorFold recipe's scripts/serve.sh (the recipe a lane's ranks run: `bash .../serve.sh start`): in a
# real container it hands over to the image's TensorFold stand-in, which reads the rank's config.env as the
# recipe's script sources it (the docker shim reads the same file without running the script).
TENSORFOLD_SERVE_SCRIPT = ("#!/bin/bash\n# SIMULATION: the lab's stand-in for the TensorFold recipe's serve script "
                           "(sparkfleet/sim/image.py)\n"
                           f'exec /{BIN_DIR}/tensorfold-serve "$@"\n')
PATH = f"/{BIN_DIR}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CREATED = "2026-01-01T00:00:00Z"  # fixed: the same archive, and ids, on every build
VERSION_FILE = "opt/sparkfleet-sim/engine-version"
MERGED_USR = ("bin", "lib", "lib32", "lib64", "libx32", "sbin")


def _arch() -> str:
    """This machine's architecture as an OCI image names it (the lab's nodes run here)."""
    m = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(m, m)


def _add(tar: tarfile.TarFile, name: str, *, data: bytes | None = None, mode: int = 0o644,
         link: str | None = None, directory: bool = False) -> None:
    info = tarfile.TarInfo(name)
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "root", "root"
    if link is not None:
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, link, 0o777
        tar.addfile(info)
    elif directory:
        info.type, info.mode = tarfile.DIRTYPE, mode
        tar.addfile(info)
    else:
        info.size, info.mode = len(data or b""), mode
        tar.addfile(info, io.BytesIO(data or b""))


def tool_script(python: str, package_root: str) -> bytes:
    """The image's stand-in for each tool: run sim/container.py under the tool's own name."""
    return (f"#!/bin/sh\n# sparkfleet simulation: this image's tools are stand-ins (sparkfleet/sim/container.py)\n"
            f"PYTHONPATH={shlex.quote(package_root)} exec {shlex.quote(python)} -m sparkfleet.sim.container "
            '"$0" "$@"\n').encode()


def layer(python: str, package_root: str) -> bytes:
    """The one layer every lab image shares (a tar, deterministic)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for d in MERGED_USR:
            if os.path.islink(f"/{d}"):
                _add(tar, d, link=os.readlink(f"/{d}"))
        for d, mode in (("app", 0o755), ("etc", 0o755), ("opt", 0o755), ("opt/sparkfleet-sim", 0o755),
                        (BIN_DIR, 0o755), ("root", 0o700), ("tmp", 0o1777), ("usr", 0o755)):
            _add(tar, d, directory=True, mode=mode)
        _add(tar, "etc/passwd", data=b"root:x:0:0:root:/root:/bin/sh\n")
        _add(tar, "etc/group", data=b"root:x:0:\n")
        script = tool_script(python, package_root)
        for t in TOOLS:
            _add(tar, f"{BIN_DIR}/{t}", data=script, mode=0o755)
        for t in ("llama-server", "rpc-server", "ggml-rpc-server"):
            _add(tar, f"{APP_DIR}/{t}", link=f"/{BIN_DIR}/{t}")
    return buf.getvalue()


def config(ref: str, diff_ids: list[str], entrypoint: list[str] | None) -> bytes:
    cfg = {"architecture": _arch(), "os": "linux", "created": CREATED,
           "config": {"Env": [f"PATH={PATH}"], "Entrypoint": entrypoint, "Cmd": None if entrypoint else ["/bin/sh"],
                      "WorkingDir": "/"},
           "rootfs": {"type": "layers", "diff_ids": diff_ids},
           # the ref in the history, not a label: dockerd copies an image's labels into each container's
           "history": [{"created": CREATED, "created_by": "sparkfleet sim (sparkfleet/sim/image.py)", "comment": ref}]}
    return json.dumps(cfg, sort_keys=True, separators=(",", ":")).encode()


def tagged(ref: str) -> str:
    """`repo` -> `repo:latest`, as docker reads a reference without a tag (a registry port is not a tag)."""
    return ref if ":" in ref.rsplit("/", 1)[-1] else ref + ":latest"


def version_layer(version: str) -> bytes:
    """A second layer saying which engine version the image holds (VERSION_FILE), as a real image's
    own files would (vLLM's `vllm/_version.py`): the stand-in reads it from inside the container."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        _add(tar, VERSION_FILE, data=version.encode() + b"\n")
    return buf.getvalue()


def archive(images: dict[str, dict], python: str, package_root: str) -> tuple[bytes, dict[str, str]]:
    """(the `docker load` archive of every image ref -> {"entrypoint": [...] | None, "engine_version": str |
    None}, {ref: image id})."""
    data = layer(python, package_root)
    digest = hashlib.sha256(data).hexdigest()
    buf = io.BytesIO()
    manifest, ids, written = [], {}, {digest}
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        _add(tar, f"{digest}/layer.tar", data=data)
        for ref in sorted(images):
            layers = [digest]
            if images[ref].get("engine_version"):
                extra = version_layer(images[ref]["engine_version"])
                layers.append(hashlib.sha256(extra).hexdigest())
                if layers[-1] not in written:
                    written.add(layers[-1])
                    _add(tar, f"{layers[-1]}/layer.tar", data=extra)
            cfg = config(ref, ["sha256:" + d for d in layers], images[ref].get("entrypoint"))
            cid = hashlib.sha256(cfg).hexdigest()
            ids[ref] = "sha256:" + cid
            _add(tar, f"{cid}.json", data=cfg)
            manifest.append({"Config": f"{cid}.json", "RepoTags": [tagged(ref)],
                             "Layers": [f"{d}/layer.tar" for d in layers]})
        _add(tar, "manifest.json", data=json.dumps(manifest, separators=(",", ":")).encode())
    return buf.getvalue(), ids


