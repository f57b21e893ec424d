"""The srun transport (slurm.ssh: false) against stand-in `squeue` and `srun` that record their argv.

The stand-ins are this file's, told what to do by files beside them (the transport passes them no
environment of the test's): `squeue` prints squeue.txt (id|comment, as `-o %A|%k` does), `srun` records
its argv and runs the task's argv (everything from its first non-option word) here, or fails as srun does
when it cannot allocate (refuse: srun's own error line). The real srun and squeue run in
tests/test_slurm_lab.py."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from sparkfleet.fleet.srun import ForwardRefused, SrunTransport
from sparkfleet.opsdir import Spec
from sparkfleet.schema.base import SpecError
from sparkfleet.schema.inventory import Node, Slurm, Ssh, Storage

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

REFUSED = "srun: error: Unable to allocate resources: Requested nodes are busy"


@pytest.fixture
def fake(tmp_path: Path, monkeypatch) -> Path:
    """A bin dir with the stand-ins first on PATH; their argv land in tmp_path/srun.log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "srun.log"
    (bin_dir / "squeue").write_text('#!/bin/bash\ncat "$(dirname "$0")/squeue.txt" 2>/dev/null; exit 0\n')
    (bin_dir / "srun").write_text(
        "#!/bin/bash\n"
        f"printf '%s\\n' \"$*\" >> {shlex.quote(str(log))}\n"
        'if [ -e "$(dirname "$0")/refuse" ]; then cat "$(dirname "$0")/refuse" >&2; exit 1; fi\n'
        'while [ "${1#-}" != "$1" ]; do shift; done\n'  # srun's options end at the task's argv
        'exec "$@"\n')
    for f in ("squeue", "srun"):
        (bin_dir / f).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return log


def node(name: str = "bluey") -> Node:
    return Node(name=name, ssh=Ssh(host="10.0.0.3"), hardware="gb10", storage=Storage(model_root="/m", cache_dir="/c"),
                transport="srun", slurm=Slurm(conf="/etc/slurm/lab.conf", partition="sparks", account="lab-a"))


def test_a_command_runs_as_a_job_of_its_own_when_no_sparkfleet_job_holds_the_node(fake: Path, tmp_path: Path) -> None:
    (tmp_path / "bin" / "squeue.txt").write_text("813|someone else's job\n")  # no run label: never joined
    got = SrunTransport().run([node()], 'echo "out $FOO"; cat; echo err >&2; exit 3', stdin="in\n",
                              env={"FOO": "bar"}, timeout_s=90)["bluey"]
    assert (got.ok, got.exit_code, got.error, got.stdout) == (False, 3, "exit", "out bar\nin\n")  # marker taken off
    assert got.stderr == "err\n"
    argv = fake.read_text().splitlines()
    assert len(argv) == 1 and argv[0].startswith(
        "--nodes=1 --ntasks=1 --nodelist=bluey --quiet --job-name=sparkfleet-step --time=2 --immediate=45 "
        "--partition=sparks --account=lab-a bash -c ")


def test_a_command_joins_the_sparkfleet_job_that_holds_the_node(fake: Path, tmp_path: Path) -> None:
    (tmp_path / "bin" / "squeue.txt").write_text("813|someone else's job\n812|sparkfleet.run=20261205-0700-abcd\n")
    got = SrunTransport().run([node()], "echo here")["bluey"]
    assert (got.ok, got.stdout) == (True, "here\n")
    assert fake.read_text().startswith("--nodes=1 --ntasks=1 --nodelist=bluey --quiet --jobid=812 --overlap bash -c ")


def test_srun_that_cannot_start_the_command_is_not_run_not_a_failed_command(fake: Path, tmp_path: Path) -> None:
    (tmp_path / "bin" / "refuse").write_text(REFUSED + "\n")
    got = SrunTransport().run([node()], "echo never")["bluey"]
    assert (got.ok, got.error, got.stdout) == (False, "not-run", "")
    assert got.message == f"bluey: the command could not be run on the node: {REFUSED}"


def test_put_writes_through_the_nodes_own_cat(fake: Path, tmp_path: Path) -> None:
    target = tmp_path / "node" / "helper.py"
    got = SrunTransport().put([node()], b"print(1)\n", str(target), mode=0o755)["bluey"]
    assert got.ok, got.message
    assert target.read_bytes() == b"print(1)\n" and target.stat().st_mode & 0o777 == 0o755


def test_nothing_is_forwarded_through_srun() -> None:
    with pytest.raises(ForwardRefused, match="bluey is reached through srun"), \
            SrunTransport().forward(node(), 8410):
        pass


def _inventory(ops_root: Path, slurm: str) -> None:
    path = ops_root / "inventories" / "lab.yaml"
    path.write_text(path.read_text() + f"launcher: slurm\nslurm:\n{slurm}")


def test_slurm_ssh_false_puts_every_ssh_node_on_srun(ops_root: Path) -> None:
    _inventory(ops_root, "  partition: sparks\n  ssh: false\n")
    inv = Spec(ops_root).inventory("lab")
    assert {n.transport for n in inv.nodes.values()} == {"srun"}
    assert all(n.slurm is not None and n.slurm.partition == "sparks" for n in inv.nodes.values())


def test_slurm_ssh_false_with_a_login_node_is_refused_naming_the_field(ops_root: Path) -> None:
    _inventory(ops_root, "  login: {host: login.example}\n  ssh: false\n")
    with pytest.raises(SpecError) as err:
        Spec(ops_root).inventory("lab")
    assert "slurm.login: with slurm.ssh: false the compute nodes are reached by srun run on this machine" in \
        str(err.value)


def test_a_head_bound_to_loopback_on_srun_nodes_is_refused_at_plan(ops_root: Path, tmp_path: Path, monkeypatch,
                                                                    capsys) -> None:
    """No SSH tunnel reaches a loopback-bound API through srun: `plan` refuses the lane naming the head and the
    bind, instead of `up` waiting out the boot budget for an answer that cannot come."""
    import json

    from sparkfleet.cli.main import main

    monkeypatch.setenv("SPARKFLEET_STATE", str(tmp_path / "state"))
    _inventory(ops_root, "  partition: sparks\n  ssh: false\n")
    code = main(["plan", "--profile", "dcp2", "--root", str(ops_root), "-i", "lab", "-o", "host=127.0.0.1", "--json"])
    found = [(f["check"], f.get("node"), f["message"]) for f in json.loads(capsys.readouterr().out)["findings"]
             if f["check"] == "endpoint"]
    assert code == 2 and found == [("endpoint", "reddie", "the lane's API binds 127.0.0.1 on reddie, which is reached "
                                    "through srun (slurm.ssh: false): nothing here can reach it, no SSH tunnel "
                                    "carries it")]


def test_the_wrapper_writes_to_the_status_pipe_the_local_transport_opens() -> None:
    """slurm/step.py names the pipe's variable itself (importing fleet/local.py would load paramiko into every
    srun command's wrapper): the two names must stay one."""
    from sparkfleet.fleet.local import NOT_RUN_FD
    from sparkfleet.slurm import step

    assert step.NOT_RUN_FD == NOT_RUN_FD
