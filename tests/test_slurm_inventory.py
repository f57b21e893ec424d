"""`launcher: slurm` in the inventory: validated where it is read, bad input named by file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkfleet.cli.main import main
from sparkfleet.opsdir import Spec

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

HEAD = "name: lab\nexample: true\n"


def _with(ops_root: Path, block: str) -> None:
    path = ops_root / "inventories/lab.yaml"
    text = path.read_text()
    assert text.count(HEAD) == 1
    path.write_text(text.replace(HEAD, HEAD + block))


def _plan(ops_root: Path, capsys: pytest.CaptureFixture) -> tuple[int, str]:
    code = main(["plan", "--profile", "dcp2", "--root", str(ops_root)])
    return code, capsys.readouterr().err.strip()


def test_ssh_stays_the_default(repo_spec: Spec) -> None:
    inv = repo_spec.inventory("lab")
    assert inv.launcher == "ssh" and inv.slurm is None


def test_slurm_section_read(ops_root: Path) -> None:
    _with(ops_root, "launcher: slurm\nslurm:\n  conf: /etc/slurm/slurm.conf\n  partition: sparks\n"
          "  account: lab-a\n  qos: normal\n  time: 1-00:00:00\n  reservation: maint_1\n"
          "  login: {host: login.example, user: alice}\n")
    inv = Spec(ops_root).inventory("lab")
    s = inv.slurm
    assert inv.launcher == "slurm"
    assert (s.conf, s.partition, s.account, s.qos, s.time, s.reservation, s.ssh) == (
        "/etc/slurm/slurm.conf", "sparks", "lab-a", "normal", "1-00:00:00", "maint_1", True)
    assert (s.login.host, s.login.user, s.login.port) == ("login.example", "alice", 22)


@pytest.mark.parametrize("block, expected", [
    ("launcher: slurm\n", "inventories/lab.yaml:9: launcher: launcher: slurm needs a slurm: section "
     "(at least {} for Slurm's defaults)"),
    ("launcher: slurrm\n", "inventories/lab.yaml:9: launcher: Input should be 'ssh' or 'slurm' (got 'slurrm')"),
    ("launcher: slurm\nslurm:\n  partition: a b\n", "inventories/lab.yaml:11: slurm.partition: 'a b' is not a "
     "Slurm name (letters, digits, '.', '_', '-')"),
    ("launcher: slurm\nslurm:\n  account: \"x\\n#SBATCH --uid=0\"\n", "inventories/lab.yaml:11: slurm.account: "
     "'x\\n#SBATCH --uid=0' is not a Slurm name (letters, digits, '.', '_', '-')"),
    ("launcher: slurm\nslurm:\n  partition: p\n  time: 2h\n", "inventories/lab.yaml:12: slurm.time: '2h' is not a "
     "Slurm time limit (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or UNLIMITED; sbatch --time)"),
    ("launcher: slurm\nslurm:\n  conf: slurm.conf\n", "inventories/lab.yaml:11: slurm.conf: must be an absolute "
     "path (the slurm.conf the Slurm commands read)"),
    ("launcher: slurm\nslurm:\n  partitions: p\n", "inventories/lab.yaml:11: slurm.partitions: unknown field"),
    ("launcher: slurm\nslurm:\n  login: {user: bob}\n", "inventories/lab.yaml:11: slurm.login.host: set host "
     "(an address or an SSH config Host) or alias"),
])
def test_bad_slurm_section(ops_root: Path, capsys: pytest.CaptureFixture, block: str, expected: str) -> None:
    _with(ops_root, block)
    code, err = _plan(ops_root, capsys)
    assert code == 2 and err.startswith("sparkfleet: " + expected), err
    assert "Traceback" not in err
