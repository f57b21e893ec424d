"""Failure modes of docs/failure-modes.md caused through the command a user runs, on the simulated lab.

THE LAB IS A SIMULATION (sparkfleet/sim): each idle sim fault changes what a node reports (its processes, its
mounts, its GID table, its GPU's step timings); `check` and `up` are the real code. One lab for the module (the
shared `sim` fixture); every test heals what it broke. A refused `up` must have started nothing: no lane
container on any node.
"""

from __future__ import annotations

import json

import pytest

from sparkfleet.cli.main import main
from tests.cli_run import LAB_NODES, lane_containers, result, run, steps
from tests.cli_run import findings as step_findings

FAST = ["--gates", "models", "--poll", "0.2", "--no-probe"]
EVERY_NODE = (*LAB_NODES, "station")


@pytest.fixture(autouse=True)
def healed(sim, capsys):
    yield
    sim.heal()
    capsys.readouterr()


def check(capsys, profile: str, *extra: str) -> tuple[int, list[dict]]:
    """`sparkfleet check --profile P --json`: the exit code and its findings."""
    code = main(["check", "--profile", profile, "--inventory", "sim", "--json", *extra])
    return code, json.loads(capsys.readouterr().out)["findings"]


def judged(fs: list[dict], *checks: str) -> list[tuple]:
    """(node, check, status, message) of the findings of these checks that are not ok."""
    return [(f.get("node"), f["check"], f["status"], f["message"]) for f in fs
            if f["check"] in checks and f["status"] != "ok"]


def nothing_launched(sim, profile: str) -> None:
    assert lane_containers(sim, profile, EVERY_NODE) == {n: [] for n in EVERY_NODE}


def refused_at_check(sim, capsys, profile: str, *extra: str) -> list[dict]:
    """`up` that stops at its check step: exit 1, nothing launched; the failed findings."""
    code, events = run(capsys, "up", "--profile", profile, "--inventory", "sim", *FAST, *extra)
    assert code == 1, result(events)
    assert result(events)["reason"].startswith("check: ")
    assert steps(events)["check"] == "fail"
    assert not [s for s in steps(events) if s.startswith("launch")]
    nothing_launched(sim, profile)
    return [f for f in step_findings(events, "check") if f["status"] == "fail"]


def refused_by_plan(sim, capsys, profile: str, *extra: str) -> list[dict]:
    """`up` refused by the lane's rules before it touches a node: exit 2, outcome refused."""
    code, events = run(capsys, "up", "--profile", profile, "--inventory", "sim", *FAST, *extra)
    assert code == 2, result(events)
    assert (result(events)["outcome"], list(steps(events))) == ("refused", ["plan"])
    nothing_launched(sim, profile)
    return [f for f in step_findings(events, "plan") if f["status"] == "fail"]


# -- the idle sim faults, through `check` and (where it refuses before launch) `up` ---------------------------

V23_MODEL = "/models/DeepSeek-V4.1-Flash-1017-1bae0e1088993b9b82de08f59de5be5a34e42170"  # gb300-v23 on the station
CIFS = (f"model dir {V23_MODEL} is on cifs: pinned copies page-fault from it and DSpark reads it twice; over SMB "
        "neither converges (35 min to load)")
NO_EARLYOOM = "earlyoom is not running: when memory runs out, the watchdogs reset the node"
NO_CACHE = ("bind-mount source /nvme/cache does not exist: Docker would bind an empty directory in its place (a "
            "missing patch file failed the import minutes later)")


@pytest.mark.parametrize("node, fault, params, profile, check_name, want", [
    ("asusi", "earlyoom-off", {}, "dcp2", "earlyoom", ("asusi", "earlyoom", "fail", NO_EARLYOOM)),
    ("station", "cifs-model", {}, "gb300-v23", "storage", ("station", "storage", "fail", CIFS)),
    ("asusi", "missing-mount-source", {"what": "cache"}, "dcp2", "mounts", ("asusi", "mounts", "fail", NO_CACHE)),
], ids=["earlyoom-off", "cifs-model", "missing-cache-dir"])
def test_an_idle_fault_fails_check_and_up_starts_nothing(sim, capsys, node, fault, params, profile, check_name,
                                                        want) -> None:
    code, healthy = check(capsys, profile)
    assert judged(healthy, check_name) == []
    sim.fault(node, fault, **params)
    code, fs = check(capsys, profile)
    assert code == 1
    assert [x for x in judged(fs, *{f["check"] for f in fs}) if x[2] == "fail"] == [want]  # the one failure
    failed = refused_at_check(sim, capsys, profile)
    assert [(f["node"], f["check"], f["status"], f["message"]) for f in failed] == [want]


def test_a_missing_engram_dir_fails_check_and_stops_up_at_the_engram_step(sim, capsys) -> None:
    """bluey's node-local Engram dir is gone (the copies with it): `check` says the copy is missing, `up`
    stops before any rank starts instead of letting rank 2 read its rows over NFS (FM-11, FM-24)."""
    sim.fault("bluey", "missing-mount-source")  # --what engram: /nvme/engram-local
    code, fs = check(capsys, "dcp2")
    assert code == 1
    copy = "/nvme/engram-local/df42c109f1defefcbfcedbe7d905718a12266e40"
    assert judged(fs, "storage", "engram-copy") == [
        ("bluey", "storage", "warn", f"the rank's Engram copy {copy} is not made yet (there is room for it)"),
        ("bluey", "engram-copy", "fail", "rank 2 (bluey): no engram-manifest.json: the copy is missing or incomplete: "
         "falls back to reading the model directory over NFS (6-8 ms a step against 3, ENG-16)")]
    code, events = run(capsys, "up", "--profile", "dcp2", "--inventory", "sim", *FAST)
    assert code == 1 and steps(events)["engram"] == "fail"
    assert [(f["node"], f["status"]) for f in step_findings(events, "engram") if f["status"] == "fail"] == [
        ("bluey", "fail")]
    assert not [s for s in steps(events) if s.startswith("launch")]
    nothing_launched(sim, "dcp2")


def test_a_wrong_gid_index_is_named_by_check(sim, capsys) -> None:
    """A global IPv6 address moves bluey's RoCE v2 IPv4 entry from 3 to 5: `check` fails naming the index the
    lane's fixed NCCL_IB_GID_INDEX would miss, and the right one (tests/test_sick_fleet.py does it through up)."""
    sim.fault("bluey", "wrong-gid")
    code, fs = check(capsys, "dcp2")
    assert code == 1
    assert judged(fs, "rdma") == [
        ("bluey", "rdma", "fail", "rank 2: NCCL_IB_GID_INDEX=3 on HCA rocep1s0f0,roceP2p1s0f0 is not this node's "
         "RoCE v2 IPv4 entry for 192.168.192.13; the right index is 5")]


def test_slow_state_is_seen_by_the_probe(sim, capsys) -> None:
    """reddie's steps after an idle pause take 94 ms against 63 back to back (the seeds' figures, FM-10): the
    clock probe of `check --probe` warns on reddie alone, and its clock is fine."""
    code, healthy = check(capsys, "dcp2", "--probe")
    assert judged(healthy, "slow-state", "clock") == []
    sim.fault("reddie", "slow-state")
    code, fs = check(capsys, "dcp2", "--probe")
    assert code == 0
    assert judged(fs, "slow-state", "clock") == [
        ("reddie", "slow-state", "warn", "slow state: steps after idle are 1.492x slower than back to back")]


def test_the_station_under_its_host_floor_is_refused_before_launch(sim, capsys) -> None:
    """The pin-hot hook aborts under 10 GiB of host memory at re-home time (FM-43): `up` refuses first."""
    sim.fault("station", "low-memory")
    failed = refused_at_check(sim, capsys, "gb300-v23")
    assert [(f["node"], f["check"]) for f in failed] == [("station", "memory")]
    assert failed[0]["message"].startswith("MemAvailable 8.0 GiB is below 10.0 GiB")


# -- the lane's own sizing: checks over the profile, through `check` and `up` ----------------------------------

GMU = ("KV sized by --gpu-memory-utilization 0.80 on 4 ranks: each rank gets what it profiled (4.1-6.7 GiB across "
       "the four Sparks at 0.80) and the pool follows the smallest rank")


def test_gmu_sized_kv_on_four_ranks_is_named(sim, capsys) -> None:
    """FM-16: dcp2 pins 6 GiB of KV per rank; without it the same lane is sized by gpu-memory-utilization."""
    code, fs = check(capsys, "dcp2")
    assert [(f["node"], f["status"], f["message"]) for f in fs if f["check"] == "kv-sizing"] == [
        ("reddie", "ok", "KV pinned at 6.0 GiB on each of the 4 ranks (--kv-cache-memory-bytes)")]
    code, fs = check(capsys, "dcp2", "-o", "flags.--kv-cache-memory-bytes=!unset")
    assert judged(fs, "kv-sizing") == [("reddie", "kv-sizing", "warn", GMU)]
    code, fs = check(capsys, "boot10")  # the seeds' boot 10 ran this way: shipped as it ran, and said
    assert judged(fs, "kv-sizing") == [("reddie", "kv-sizing", "warn", GMU)]


V12_CLASS = ("a v12-class lane (--cpu-offload-gb 60, --gpu-memory-utilization 0.97) at 1048576 context holds about "
             "two full-1M requests at once (v12: KV 4.89 GiB, 2.2x at 1M), and this lane takes ")


def test_more_than_two_full_1m_requests_are_sent_to_v11(sim, capsys) -> None:
    """FM-69: v12 (and v23, off60 util 0.97 at 1M) hold about two full-1M requests; v11 (off70) is the lane for
    more, and a v12-class lane limited to two seats is not warned."""
    code, fs = check(capsys, "gb300-v12")
    assert judged(fs, "long-context") == [
        ("station", "long-context", "warn", V12_CLASS + "vLLM's default number of seats")]
    [f] = [f for f in fs if f["check"] == "long-context"]
    assert "`sparkfleet up --profile gb300-v11`" in f["remedy"]
    code, fs = check(capsys, "gb300-v23")
    assert judged(fs, "long-context") == [("station", "long-context", "warn", V12_CLASS + "24 seats")]
    for profile, extra in (("gb300-v11", ()), ("gb300-v23", ("-o", "flags.--max-num-seqs=2"))):
        code, fs = check(capsys, profile, *extra)
        assert judged(fs, "long-context") == [] and any(f["check"] == "long-context" for f in fs)


def test_1m_context_on_vllm_across_the_sparks_is_unvalidated(sim, capsys) -> None:
    """FM-30: 1M context after the top-k fix was never re-run on vLLM Spark."""
    code, fs = check(capsys, "dcp2", "-o", "flags.--max-model-len=1048576")
    assert judged(fs, "long-context") == [("reddie", "long-context", "warn", (
        "--max-model-len 1048576 on vLLM across the Sparks: 1M context after the top-k fix has not been re-run on "
        "this stack (boot 7 died on a 32K request at 1M)"))]
    code, fs = check(capsys, "dcp2")  # 500K: what the seeds served
    assert judged(fs, "long-context") == []


ADAPTIVE = ("adaptive verification at --cpu-offload-gb 60: its varlen graph capture (~6.5 GiB) pushes experts into "
            "Grace and the seeds' lane could not boot at off60")


def test_adaptive_verification_at_off60_is_refused_before_launch(sim, capsys) -> None:
    """FM-46: the V2 runner's graph capture cannot boot at off60 on the Station."""
    failed = refused_at_check(sim, capsys, "gb300-v23",
                              "-o", "flags.--speculative-config.enable_adaptive_verification=true")
    assert [(f["node"], f["check"], f["message"]) for f in failed] == [("station", "graph-memory", ADAPTIVE)]


@pytest.mark.parametrize("extra, top, cap", [
    ((), 2048, 512),  # 1M context, bf16 KV: no HBM source
    (("-o", "flags.--max-model-len=524288"), 2048, 1024),  # a shorter context frees HBM: the cap is 1024
])
def test_graphs_above_the_kv_pools_cap_are_refused_before_launch(sim, capsys, extra, top, cap) -> None:
    """FM-47: graph memory is charged against KV; P1 reopens only with an HBM source and a cap of 512 or 1024."""
    sizes = "flags.--cudagraph-capture-sizes=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048]"
    failed = refused_at_check(sim, capsys, "gb300-v23", "-o", sizes, *extra)
    assert [(f["node"], f["check"], f["expected"]) for f in failed] == [("station", "graph-memory", f"<= {cap}")]
    assert failed[0]["message"].startswith(f"CUDA graphs captured up to {top} tokens: vLLM charges graph memory "
                                           "against KV")


def test_graphs_up_to_1024_with_an_hbm_source_pass(sim, capsys) -> None:
    sizes = "flags.--cudagraph-capture-sizes=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]"
    code, fs = check(capsys, "gb300-v23", "-o", sizes, "-o", "flags.--kv-cache-dtype=nvfp4_ds_mla")
    assert judged(fs, "graph-memory") == []
    code, fs = check(capsys, "gb300-v23", "-o", sizes)  # the same list without one
    assert [x[2] for x in judged(fs, "graph-memory")] == ["fail"]


# -- lane rules: `up` refuses the lane before it touches a node (exit 2) ----------------------------------------

@pytest.mark.parametrize("profile, extra, check_name, message", [
    ("dcp2", ("-o", "env.MAX_JOBS=22"), "jit-guard", "MAX_JOBS=22: the seeds' safe value is 2"),  # FM-02
    ("dcp2", ("-o", "env.FLASHINFER_NVCC_THREADS=8"), "jit-guard",
     "FLASHINFER_NVCC_THREADS=8: the seeds' safe value is 1"),  # FM-02
    ("dcp2", ("-o", "flags.--block-size=64"), "block-size", "a vLLM lane on GB10 needs --block-size 128 (has 64)"),
    ("dcp2", ("-o", "flags.--enforce-eager=true"), "eager",
     "eager mode (--enforce-eager) is the throughput ceiling: ~200 ms a step"),  # FM-08
    ("nvfp4", (), "servable", "lane 'nvfp4' never served: "),  # FM-19
    ("gb300-v23", ("-o", "flags.--default-chat-template-kwargs={reasoning_effort: medium}"), "reasoning-effort",
     "reasoning_effort 'medium': the V4.1 chat template returns 400"),  # FM-56
    ("gb300-v23", ("-o", "flags.--moe-backend=megamoe"), "megamoe",
     "MegaMoE on one GPU: it needs expert parallel, then OOMs at construction (268.8 GiB needed, 249.8 available)"),
    ("gb300-v23", ("-o", "flags.--speculative-config.num_speculative_tokens_per_batch_size=[[1, 8, 3], [9, 24, 1]]"),
     "k-schedule", "band [1, 8, 3] drafts k=3 inside a num_speculative_tokens=5 schedule: it pays the full 5-token "
     "verify for 3"),  # FM-58
], ids=["FM-02-max-jobs", "FM-02-nvcc-threads", "FM-04", "FM-08", "FM-19", "FM-56", "FM-57", "FM-58"])
def test_up_refuses_a_lane_its_rules_refuse(sim, capsys, profile, extra, check_name, message) -> None:
    failed = refused_by_plan(sim, capsys, profile, *extra)
    assert [f["check"] for f in failed] == [check_name]
    assert failed[0]["message"].startswith(message), failed[0]["message"]


def test_a_node_whose_clock_is_off_is_named_by_check(sim, capsys) -> None:
    """bluey's own clock 5 minutes behind (sim fault clock-skew: the node's clock, not this machine's): `check`
    warns on that node alone, by how far its clock is off the lane's other ranks."""
    import re

    sim.fault("bluey", "clock-skew", seconds=-300)
    code, fs = check(capsys, "dcp2")
    [(node, _, status, message)] = judged(fs, "drift")
    assert (node, status) == ("bluey", "warn")
    m = re.fullmatch(r"clock ([+-]\d+\.\d\d) s off the lane's other ranks", message)
    assert m and -302 < float(m.group(1)) < -298, message


# -- the Station's boot: what `up` sees while the lane comes up ---------------------------------------------

STATION_UP = ["up", "--profile", "gb300-v23", "--inventory", "sim", *FAST,
              "-o", "expect.kv_tokens=!unset"]  # the sim's Station KV is not a seed figure (docs/sim-layout.md)


@pytest.fixture
def station_down(capsys):
    yield
    main(["down", "--profile", "gb300-v23", "--inventory", "sim", "--json"])
    capsys.readouterr()


def test_negative_available_kv_is_fatal_and_stops_the_boot(sim, capsys, station_down) -> None:
    """FM-45: a budget that leaves nothing for KV (here a gpu-memory-utilization of 0.05) makes vLLM log a negative
    `Available KV cache memory`: `up` fails the boot on that line at once and stops the rank. The boot budget is
    the profile's 5,400 s (a cold autotune): here 30 s (the line comes about 1 s into the wait, a healthy
    Station boot serves in about 4 s), so a fast-fail that broke fails this test in seconds, not in 90 minutes."""
    code, events = run(capsys, *STATION_UP, "-o", "flags.--gpu-memory-utilization=0.05", "--boot-budget", "30")
    assert code == 1
    reason = result(events)["reason"]
    assert reason.startswith("wait_ready: rank 0 logged a fatal line: ") and "Available KV cache memory: -" in reason
    assert reason.endswith("(on station); every rank of this launch was stopped")
    assert [c["State"]["Status"] for c in lane_containers(sim, "gb300-v23", ("station",))["station"]] == ["exited"]


def test_changed_kernel_shapes_are_named_before_the_station_retunes(sim, capsys, station_down) -> None:
    """FM-41: seeding the autotune cache cannot help once the capture list changed against the last good run:
    `up` says so while the lane boots; the same launch again says nothing."""
    def shape_messages(events: list[dict]) -> list[str]:
        return [e["text"] for e in events if e["event"] == "message" and "kernel shapes changed" in e["text"]]

    code, events = run(capsys, *STATION_UP)
    assert code == 0, result(events)
    assert shape_messages(events) == []  # the first good run: nothing to compare with
    code, events = run(capsys, *STATION_UP, "-o", "flags.--cudagraph-capture-sizes=[1, 2, 4, 8]")
    assert code == 0, result(events)
    assert shape_messages(events) == [
        "kernel shapes changed since the last good run (--cudagraph-capture-sizes): seeding the autotune cache "
        "cannot help; the first boot retunes (75-90 min, LCH-G3)"]


STATION_CACHE = "/home/milo/dsv41/vllm-cache"  # the lab inventory's cache_dir on the station (INV-55)
TUNE_DIRS = "flashinfer_autotune_cache"  # where the lab's engine keeps its hash dirs (sim/values.py AUTOTUNE_SUBDIR)


def test_a_station_clock_behind_the_controllers_still_gets_its_new_hash_dir_seeded(sim, capsys, station_down) -> None:
    """FM-40: a hash-input change that leaves kernel shapes alone (--max-model-len, LCH-G2) makes the Station's vLLM
    tune into a new, empty hash dir, 74 minutes unless the newest configs land there before the tuner reads it.
    The Station's clock is 5 minutes behind the controller's: `up` still seeds the new dir, judging "new" by the
    Station's own clock, and the engine loads the seeded configs instead of retuning."""
    import time

    from tests.cli_run import container_log, record_of

    cache = sim.root("station") / STATION_CACHE.lstrip("/") / TUNE_DIRS
    code, events = run(capsys, *STATION_UP)  # the tuned hash dir a good run leaves (a cold tune on a new lab)
    assert code == 0, result(events)
    before = {d.name for d in cache.iterdir()}
    assert [d for d in before if (cache / d / "autotune_configs.json").is_file()]

    sim.fault("station", "clock-skew", seconds=-300)
    station_now = float(sim.exec("station", ["date", "+%s.%N"]).stdout)
    assert -310 < station_now - time.time() < -290  # the node's own clock, not the controller's
    code, events = run(capsys, *STATION_UP, "-o", "flags.--max-model-len=524288")
    assert code == 0, result(events)
    new = sorted({d.name for d in cache.iterdir()} - before)
    assert len(new) == 1, new  # the changed launch's hash dir, made by the engine as it started
    [rank] = lane_containers(sim, "gb300-v23", ("station",))["station"]
    log = container_log(sim, "station", rank["Id"])
    assert "Autotuning process starts" not in log  # no retune: unseeded, the engine tunes here (74 min on a Station)
    assert f"[Autotuner]: Loaded 168 configs from /root/.cache/vllm/{TUNE_DIRS}/{new[0]}/autotune_configs.json" in log
    seeded = f"{STATION_CACHE}/{TUNE_DIRS}/{new[0]}"
    assert [e["text"] for e in events if e["event"] == "message" and "autotune" in e["text"]] == [
        f"seeded autotune cache {seeded} on station"]
    rec = record_of(events)
    assert rec["data"]["autotune_seeded"] == [seeded]
    assert rec["data"]["log_facts"]["0"]["autotune_loaded"] == 168  # the configs of the first run's tune


# -- the chat template: pinned by sha256 on every rank ---------------------------------------------------------

TEMPLATE = "/opt/templates/dsv41-1017.jinja"  # where the lane's engine reads its chat template, in the container


@pytest.fixture(scope="module")
def template_ops(tmp_path_factory):
    """A copy of the ops directory with a patch set holding one chat template, and dcp2 taking it from there."""
    import hashlib

    from tests.conftest import copy_ops

    ops = copy_ops(tmp_path_factory.mktemp("ops"))
    body = b"{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}<|Assistant|>\n"
    (ops / "patches/tmpl").mkdir()
    (ops / "patches/tmpl/dsv41-1017.jinja").write_bytes(body)
    (ops / "patches/tmpl/manifest.yaml").write_text(
        f"name: tmpl\ndescription: a chat template\nfiles:\n- source: dsv41-1017.jinja\n"
        f"  sha256: {hashlib.sha256(body).hexdigest()}\n  target: {TEMPLATE}\n")
    (ops / "profiles/dcp2-tmpl.yaml").write_text(f"extends: dcp2\npatches: tmpl\nflags:\n  --chat-template: {TEMPLATE}\n")
    return ops, hashlib.sha256(body).hexdigest()


def test_a_chat_template_from_the_patch_set_is_checked_on_every_rank(sim, capsys, template_ops) -> None:
    """FM-33: the template comes from the lane's patch set, so every rank's copy is hashed and compared with the
    manifest's sha256; bound from the node's cache dir instead, it is pinned by nothing and `up` refuses."""
    ops, digest = template_ops
    root = ("--root", str(ops))
    assert main(["patches", "push", "--profile", "dcp2-tmpl", "--inventory", "sim", *root, "--json"]) == 0
    capsys.readouterr()
    code, fs = check(capsys, "dcp2-tmpl", *root)
    assert [(f["node"], f["status"], f["message"]) for f in fs if f["check"] == "chat-template"] == [
        (n, "ok", f"chat template {TEMPLATE} is dsv41-1017.jinja of patch set tmpl, sha256 {digest[:12]}")
        for n in LAB_NODES]
    loose = "/cache/templates/dsv41-1017.jinja"  # under the lane's cache bind: a file each node has its own of
    failed = refused_at_check(sim, capsys, "dcp2", "-o", f"flags.--chat-template={loose}")
    assert [(f["node"], f["check"], f["message"]) for f in failed] == [
        (n, "chat-template", f"chat template {loose} is bound from /nvme/cache/templates/dsv41-1017.jinja on {n}, "
         "which no patch set pins: each rank could serve another template") for n in LAB_NODES]


# -- the engine in the image: pinned, and launched so it cannot pad DSpark batches ----------------------------

def test_an_image_that_is_not_the_pinned_one_is_refused_before_launch(sim, capsys) -> None:
    """FM-06/FM-13: the engine (its FlashInfer, its commit) is the image's; a digest pin that the node's image
    does not carry stops `up` before any rank starts."""
    pin = "sha256:" + "a" * 64
    failed = refused_at_check(sim, capsys, "dcp2", "-o", f"image.digest={pin}")
    assert sorted({(f["node"], f["check"]) for f in failed}) == sorted((n, "image") for n in LAB_NODES)
    assert all(pin in f["expected"] for f in failed), failed


def test_a_capture_list_that_would_pad_dspark_batches_is_named_by_plan(capsys) -> None:
    """FM-14: the production lanes' shipped list misses 45 of the rule's sizes for k=5, max_num_seqs=8; `plan`
    names it (a warning: `up` launches the list as the seeds shipped it; drop the list to have it generated)."""
    assert main(["plan", "--profile", "dcp2", "--json"]) == 0
    [cap] = [f for f in json.loads(capsys.readouterr().out)["findings"] if f["check"] == "capture-sizes"]
    assert (cap["status"], cap["message"], cap["where"]) == (
        "warn", "capture sizes miss [45] required by the rule for k=5, max_num_seqs=8", "profiles/production-1.2.yaml:48")
