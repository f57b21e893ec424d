"""`bench` refuses a lane with a latched rank (the probe's verdict) unless told; `gates` and `bench` reach a
loopback-bound head through an SSH tunnel of their own.

THE LAB IS A SIMULATION (sparkfleet/sim): the clock-latch fault holds the SM clock in the latch band only
under load, so only the probe's load reveals it. Uses the sim's fixed ports: run under the lab lock.
"""

from __future__ import annotations

import json
from contextlib import contextmanager

from sparkfleet.cli.main import main
from sparkfleet.fleet.connect import api_base
from sparkfleet.schema.inventory import Node

BENCH = ["bench", "--profile", "dcp2", "--inventory", "sim", "--probe", "--concurrency", "1", "--categories",
         "prose", "--max-tokens", "12", "--no-warmup", "--json"]


def test_bench_refuses_a_latched_rank_unless_told(sim, capsys, monkeypatch, tmp_path) -> None:
    from sparkfleet.fleet.nodeside import clock_probe

    image_load = clock_probe.image_load
    monkeypatch.setattr(clock_probe, "image_load", lambda image, seconds=0.5: image_load(image, 0.5))  # a short load
    try:
        assert main(["up", "--profile", "dcp2", "--inventory", "sim", "--gates", "models", "--poll", "0.2",
                     "--no-probe", "--no-fabric-probe", "--json"]) == 0, capsys.readouterr().out[-2000:]
        capsys.readouterr()
        sim.fault("asusi", "clock-latch")  # the lane serves; asusi's clock latches under load from now on
        code = main([*BENCH, "--out", str(tmp_path / "refused")])
        cap = capsys.readouterr()
        assert code == 2
        assert cap.err.startswith("sparkfleet: bench dcp2: the GPU clock is latched under load on asusi (")
        assert "asusi: clock latched" in cap.err and cap.err.rstrip().endswith("or bench anyway with --allow-latched")
        assert not (tmp_path / "refused").exists()  # nothing was benched, nothing written

        code = main([*BENCH, "--allow-latched", "--out", str(tmp_path / "allowed")])
        res = json.loads(capsys.readouterr().out)
        assert code == 0
        assert res["probe"]["allowed_latched"] == ["asusi"]
        assert res["probe"]["nodes"]["asusi"]["clock"]["state"] == "latched"
        assert {n: v["clock"]["state"] for n, v in res["probe"]["nodes"].items() if n != "asusi"} == {
            "reddie": "fast", "bluey": "fast", "spark4": "fast"}
    finally:
        sim.heal()
        main(["down", "--profile", "dcp2", "--inventory", "sim", "--json"])
        capsys.readouterr()


class Forwarding:
    """A transport whose forward is seen opening and closing (what SshTransport.forward does over SSH)."""

    def __init__(self) -> None:
        self.log: list[str] = []

    @contextmanager
    def forward(self, node: Node, remote_port: int, remote_host: str = "127.0.0.1"):
        self.log.append(f"open {node.name} {remote_host}:{remote_port}")
        try:
            yield 40123
        finally:
            self.log.append("closed")


def test_a_loopback_bound_head_is_reached_through_a_tunnel_closed_after(repo_spec) -> None:
    head = repo_spec.inventory("lab").nodes["reddie"]  # an SSH node (10.10.0.11 in the example inventory)
    assert head.transport == "ssh"
    t = Forwarding()
    said = []
    with api_base(head, 8001, "127.0.0.1", t, on_tunnel=said.append) as url:
        assert url == "http://127.0.0.1:40123" and t.log == ["open reddie 127.0.0.1:8001"]
    assert t.log[-1] == "closed" and said == ["http://127.0.0.1:40123"]
    with api_base(head, 8000, "0.0.0.0", t) as url:  # bound to every address: the head's own
        assert url == f"http://{head.ssh.host}:8000"
    assert t.log == ["open reddie 127.0.0.1:8001", "closed"]
