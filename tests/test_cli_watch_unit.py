"""`watch --unit` writes a unit that watches the fleet this shell would: read back, unquoted as systemd does,
its ExecStart run in its WorkingDirectory with only its Environment= gives the same watch (the same unit again)."""

from __future__ import annotations

import json
import os
import pwd
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SPARKFLEET = str(Path(sys.executable).parent / "sparkfleet")
ME = pwd.getpwuid(os.getuid())


def systemd_words(line: str) -> list[str]:
    """One ExecStart= (or Environment=) value split and unquoted the way systemd does: words on whitespace,
    "..." groups with \\" and \\\\ escapes, then %% -> % (specifiers) and $$ -> $ (ExecStart= only)."""
    words, i = [], 0
    while i < len(line):
        if line[i].isspace():
            i += 1
            continue
        if line[i] == '"':
            j, word = i + 1, ""
            while line[j] != '"':
                if line[j] == "\\":
                    j += 1
                word += line[j]
                j += 1
            i = j + 1
        else:
            m = re.match(r"\S+", line[i:])
            assert m is not None
            word, i = m.group(0), i + m.end()
        words.append(word.replace("%%", "%"))
    return words


def unit_settings(text: str) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            settings.setdefault(key, []).append(value)
    return settings


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKFLEET_")}
    return {**env, "SPARKFLEET_STATE": str(tmp_path / "state"), "SPARKFLEET_CONFIG": str(tmp_path / "none.yaml"),
            **extra}


def _mine(tmp_path: Path) -> Path:
    """The operator's own inventory: the lab's nodes under another name, in a dir of its own."""
    d = tmp_path / "fleet"
    d.mkdir(exist_ok=True)
    inv = d / "mine.yaml"
    inv.write_text((REPO / "inventories" / "lab.yaml").read_text().replace("name: lab", "name: mine"))
    return inv


def _unit(argv: list[str], env: dict[str, str], cwd: Path) -> str:
    proc = subprocess.run([SPARKFLEET, "watch", *argv, "--unit"], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _cases(tmp_path: Path) -> dict[str, tuple[list[str], dict[str, str], Path]]:
    inv = _mine(tmp_path)
    conf = inv.parent / "config.yaml"
    conf.write_text("inventory: mine.yaml\n")  # relative to the config file's dir
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    return {
        "-i relative": (["--profile", "dcp2", "-i", "mine.yaml"], _env(tmp_path), inv.parent),
        "env relative": (["--profile", "dcp2"], _env(tmp_path, SPARKFLEET_INVENTORY="fleet/mine.yaml"), tmp_path),
        "config file": (["--profile", "dcp2"], _env(tmp_path, SPARKFLEET_CONFIG=str(conf)), elsewhere),
    }


@pytest.mark.parametrize("how", ["-i relative", "env relative", "config file"])
def test_the_unit_names_the_inventory_wherever_it_came_from(how: str, tmp_path: Path) -> None:
    argv, env, cwd = _cases(tmp_path)[how]
    s = unit_settings(_unit([*argv, "--interval", "20"], env, cwd))
    exec_start = systemd_words(s["ExecStart"][0].replace("$$", "$"))
    assert exec_start == [SPARKFLEET, "watch", "--profile", "dcp2", "--interval", "20",
                          "--inventory", str(tmp_path / "fleet" / "mine.yaml"), "--root", str(REPO)]
    assert s["User"] == [ME.pw_name] and s["WorkingDirectory"] == [str(REPO)]
    assert [systemd_words(e) for e in s["Environment"]] == [[f"SPARKFLEET_STATE={tmp_path / 'state'}"]]
    assert s["Restart"] == ["on-failure"] and s["RestartPreventExitStatus"] == ["1 2 75 130 143"]
    assert s["StartLimitBurst"] == ["3"] and s["StartLimitIntervalSec"] == ["1800"]


def run_exec_start(text: str, tmp_path: Path, *more: str) -> subprocess.CompletedProcess:
    """The unit's ExecStart (plus `more`) as systemd starts it: in its WorkingDirectory, with only its
    Environment= over a service's bare PATH and HOME (and no config file of this shell)."""
    s = unit_settings(text)
    exec_start = systemd_words(s["ExecStart"][0].replace("$$", "$"))
    service_env = {"PATH": "/usr/bin:/bin", "HOME": ME.pw_dir, "SPARKFLEET_CONFIG": str(tmp_path / "none.yaml")}
    for e in s["Environment"]:
        key, value = systemd_words(e)[0].split("=", 1)
        service_env[key] = value
    return subprocess.run([*exec_start, *more], capture_output=True, text=True, env=service_env,
                          cwd=s["WorkingDirectory"][0], timeout=120)


def test_running_the_units_exec_start_watches_the_same_fleet(tmp_path: Path) -> None:
    """ExecStart as systemd would start it (its cwd, its environment only, no config file of this shell)
    resolves the same inventory, root and state: asked for its own unit, it prints the same one."""
    argv, env, cwd = _cases(tmp_path)["config file"]
    text = _unit([*argv, "--failures", "3"], env, cwd)
    proc = run_exec_start(text, tmp_path, "--unit")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == text


def test_user_and_ssh_config(tmp_path: Path) -> None:
    ssh = tmp_path / "ssh config"
    ssh.write_text("")
    env = _env(tmp_path, SPARKFLEET_INVENTORY="lab", SPARKFLEET_SSH_CONFIG=str(ssh))
    s = unit_settings(_unit(["--profile", "dcp2", "--user", "sparkops"], env, tmp_path))
    assert s["User"] == ["sparkops"]
    assert "--user" not in s["ExecStart"][0] and "sparkops" not in s["ExecStart"][0]
    assert sorted(systemd_words(e)[0] for e in s["Environment"]) == [f"SPARKFLEET_SSH_CONFIG={ssh}",
                                                                     f"SPARKFLEET_STATE={tmp_path / 'state'}"]


def test_the_units_exec_start_watches_the_lab(sim, tmp_path: Path) -> None:
    """The unit's ExecStart, run as systemd would (its cwd, only its environment), watches the lab's lane: its
    probe fails against the lab's head; under --dry-run it stops and starts nothing, looks at the lab's nodes,
    finds no container of dcp2 there (nobody brought it up: as after a `down`) and stands down, exit 0 (the
    operator has the lane)."""
    from sparkfleet.root import sim_inventory_path

    inv = sim_inventory_path()
    env = _env(tmp_path, SPARKFLEET_STATE=os.environ["SPARKFLEET_STATE"])  # the lab's own state dir
    text = _unit(["--profile", "dcp2", "-i", str(inv), "--interval", "1", "--failures", "1", "--probe-timeout", "1",
                  "--dry-run"], env, tmp_path)
    exec_start = systemd_words(unit_settings(text)["ExecStart"][0].replace("$$", "$"))
    assert exec_start[exec_start.index("--inventory") + 1] == str(inv)
    proc = run_exec_start(text, tmp_path, "--json")
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
    last = json.loads(proc.stdout.splitlines()[-1])
    assert last["code"] == 0 and "the operator has the lane" in json.dumps(last), last
