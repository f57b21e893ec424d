"""Seed fidelity: every launch the seeds publish, compared flag for flag and env for env with `plan --json`.

The expected side is the seeds' own text (tests/fixtures/seed_commands/*.yaml: the command as printed, its
file and a quote), never the code's output. Allowed differences, each explicit:
- placeholders the seed prints (`<rdma-devices>`, `/path/to/vllm-cache`, `$HOOK`) stand for the inventory's
  value for that rank's node (or the lane's example value), resolved here and then compared exactly;
- sparkfleet's own container identity (`--name`, `--label`: the labels are how `stop` finds its containers);
- `sparkfleet_adds`: options sparkfleet renders that the seed does not print, each with its reason;
- `not_rendered`: seed options a lane cannot render because the seed does not give what they need.
Everything else is exact, value spelling included (`0.80` is not `0.8`); a JSON-valued argument compares
as JSON (the seeds print `{"cpu_offload": true}` and `{"cpu_offload":true}` for the same object).
The golden plans (tests/golden/plan) cover what the seeds do not print; see the README.
"""

from __future__ import annotations

import json
import posixpath
import shlex
from pathlib import Path

import pytest
import yaml

from sparkfleet.cli.main import main
from sparkfleet.placement import place
from sparkfleet.spec.load import Spec
from tests.conftest import REPO, copy_ops

FIXTURES = Path(__file__).parent / "fixtures" / "seed_commands"
DOCKER_BOOL = {"-d", "--detach", "--rm", "--init", "--privileged", "-i", "-t"}
OWN = {"--name", "--label"}  # sparkfleet's container identity


def fixtures() -> list[Path]:
    return sorted(FIXTURES.glob("*.yaml"))


def tokens(command: str) -> list[str]:
    """The printed command as argv: the seed's own `#` comment lines inside it dropped, continuations joined."""
    lines = [line for line in command.splitlines() if not line.strip().startswith("#")]
    return shlex.split(" ".join(line.rstrip().removesuffix("\\") for line in lines))


def parse(argv: list[str]) -> dict:
    """A `docker run` argv in parts: docker options, env, mounts, image, command words, engine flags."""
    assert argv[:2] == ["docker", "run"], argv[:2]
    i, options, env, mounts = 2, [], {}, []
    while argv[i].startswith("-"):
        opt = argv[i]
        if opt in DOCKER_BOOL:
            value, i = None, i + 1
        elif opt.startswith("--") and "=" in opt:
            opt, value = opt.split("=", 1)
            i += 1
        else:
            value, i = argv[i + 1], i + 2
        if opt in ("-e", "--env"):
            key, _, val = value.partition("=")
            assert key not in env, f"env {key} twice"
            env[key] = val
        elif opt in ("-v", "--volume"):
            mounts.append(value)
        elif opt not in OWN:
            options.append((opt, value))
    image, rest = argv[i], argv[i + 1:]
    j = next((k for k, t in enumerate(rest) if t.startswith("--")), len(rest))
    words, flags, key = rest[:j], {}, None
    for t in rest[j:]:
        if t.startswith("--"):
            assert t not in flags, f"flag {t} twice"
            key = t
            flags[key] = []
        else:
            flags[key].append(t)
    return {"options": sorted(options, key=str), "env": env, "mounts": sorted(mounts), "image": image,
            "command": words, "flags": {k: _values(v) for k, v in flags.items()}}


def _values(values: list[str]) -> list:
    if len(values) == 1 and values[0][:1] in "{[":
        try:
            return [json.loads(values[0])]
        except ValueError:
            pass
    return values


def resolve(name: str, lane: str, rank: int) -> str:
    """What a placeholder stands for on this rank: the inventory's per-node value, or the lane's."""
    sp = Spec(REPO)
    loaded = sp.profile(lane)
    p = loaded.profile
    ranks = place(loaded, sp.inventory("lab"))
    node = next(r.node for r in ranks if r.rank == rank)
    head = ranks[0].node
    values = {
        "fabric_ip": node.fabric_ip, "head_fabric_ip": head.fabric_ip,
        "rdma_devices": ",".join(node.rdma.hcas) if node.rdma else None,
        "fabric_iface": node.rdma.fabric_iface if node.rdma else None,
        "gid_index": str(node.rdma.gid_index) if node.rdma else None,  # `auto` until facts resolve it
        "model_host_dir": posixpath.join(node.storage.model_root, p.model.repo_dir),
        "cache_dir": node.storage.cache_dir,
        "engram_host_dir": posixpath.join(node.storage.engram_local_dir or "", p.engram_copy_name() or ""),
        "snapshot": p.model.snapshot or p.model.revision,
        "hook_dir": next((m.source for m in p.mounts if m.target == "/w"), None),
        "image": p.image.pinned,
    }
    assert values.get(name), f"placeholder kind {name!r} has no value for {lane} rank {rank}"
    return values[name]


def lane_launch(capsys, lane: str, rank: int) -> tuple[dict, dict]:
    assert main(["plan", "--profile", lane, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    return plan, next(s for s in plan["steps"] if s["step"] == "launch" and s["rank"] == rank)


@pytest.mark.parametrize("path", fixtures(), ids=lambda p: p.stem)
def test_seed_command_matches_its_lane(capsys, path: Path) -> None:
    fx = yaml.safe_load(path.read_text())
    assert fx["file"] and fx["quote"] and fx["lane"], "every fixture names its seed file, a quote and its lane"
    seed_argv = tokens(fx["command"])
    for i, t in enumerate(seed_argv):
        for placeholder, kind in (fx.get("placeholders") or {}).items():
            if placeholder in t:
                seed_argv[i] = t = t.replace(placeholder, resolve(kind, fx["lane"], fx["rank"]))
    unresolved = [t for t in seed_argv if "<" in t and ">" in t]
    assert not unresolved, f"placeholders without a mapping in {path.name}: {unresolved}"
    for option in fx.get("not_rendered") or {}:  # drop them from the seed side, and say which they are
        opt, value = option.split(" ", 1)
        k = next(k for k in range(len(seed_argv) - 1) if seed_argv[k:k + 2] == [opt, value])
        del seed_argv[k:k + 2]
    want = parse(seed_argv)
    plan, launch = lane_launch(capsys, fx["lane"], fx["rank"])
    got = parse(launch["argv"])
    for flag, why in (fx.get("sparkfleet_adds") or {}).items():
        assert why and flag in got["flags"], f"{flag} is listed as added by sparkfleet but is not in the plan"
        del got["flags"][flag]
    assert got["image"] == want["image"]
    assert got["command"] == want["command"]
    assert got["options"] == want["options"]
    assert got["mounts"] == want["mounts"]
    assert got["env"] == want["env"]
    assert got["env"] == launch["env"]  # plan's env is the argv's -e, nothing else
    assert got["flags"] == want["flags"]
    if fx.get("not_rendered"):  # the lane says why: its patch set is a seed gap
        assert any(f["check"] == "patch-set" and "nothing will be mounted" in f["message"] for f in plan["findings"])


def test_fidelity_catches_a_respelled_value(capsys, tmp_path: Path) -> None:
    """The comparison is exact: the same lane with gmu written as a YAML float (0.8) no longer matches."""
    fx = yaml.safe_load((FIXTURES / "seed003-production-1.2-dcp2.yaml").read_text())
    argv = tokens(fx["command"])
    want = parse(argv)
    assert want["flags"]["--gpu-memory-utilization"] == ["0.80"]
    ops = copy_ops(tmp_path / "ops")
    base = ops / "profiles/spark-vllm.yaml"
    base.write_text(base.read_text().replace('--gpu-memory-utilization: "0.80"', "--gpu-memory-utilization: 0.80"))
    assert main(["plan", "--profile", "dcp2", "--json", "--root", str(ops)]) == 0
    plan = json.loads(capsys.readouterr().out)
    head = next(s for s in plan["steps"] if s["step"] == "launch" and s["rank"] == 0)
    assert parse(head["argv"])["flags"]["--gpu-memory-utilization"] == ["0.8"] != want["flags"]["--gpu-memory-utilization"]


def test_every_seed_lane_has_its_fixture() -> None:
    lanes = {yaml.safe_load(p.read_text())["lane"] for p in fixtures()}
    assert {"gb300-v18", "gb300-1017-v21cfg", "sglang-dryrun", "dcp2", "production-1.1"} <= lanes
