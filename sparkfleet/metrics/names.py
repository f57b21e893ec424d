"""Every metric the exporter serves, in one place: name, type, labels and HELP text.

The collector builds its families from these, the dashboards name their series through them, and a
test checks that the two agree, so renaming a metric here renames it everywhere. Conventions
(Prometheus naming): `sparkfleet_` prefix, the unit in the name (`_bytes`, `_seconds`, `_mhz`,
`_watts`), counters end in `_total`, 0/1 gauges for flags (pass=1, up=1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sparkfleet.checks import probe

# NVML clock-event reason bits (REFERENCE.md §4): the `reason` label of GPU_REASON
REASONS: dict[int, str] = probe.REASONS

Kind = Literal["gauge", "counter"]


@dataclass(frozen=True)
class Metric:
    name: str  # as exposed and queried (counters with their `_total`)
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    source: str = "facts"  # where the value comes from (docs/metrics.md groups by it)

    def __str__(self) -> str:
        return self.name


def _m(name: str, kind: Kind, help_: str, labels: tuple[str, ...] = (), source: str = "facts") -> Metric:
    if kind == "counter" and not name.endswith("_total"):
        raise ValueError(f"counter {name} must end in _total")
    return Metric(name, kind, help_, labels, source)


NODE = ("node",)
GPU = ("node", "gpu")

# -- nodes (the facts poll) -------------------------------------------------------------------------
NODE_UP = _m("sparkfleet_node_up", "gauge",
             "1 when the node answered the exporter's last facts poll, 0 when it did not; the node's facts "
             "series are left out while it does not answer.", ("node", "group", "hardware"))
NODE_INFO = _m("sparkfleet_node_info", "gauge",
               "Always 1; the node's inventory group(s), hardware class and whether it is sparkfleet's "
               "simulated lab (simulated=\"true\").", ("node", "group", "hardware", "simulated"))
NODE_FACTS_AGE = _m("sparkfleet_node_facts_age_seconds", "gauge",
                    "Seconds since the exporter last got facts from the node (grows while it does not answer; "
                    "absent until it answered once).", NODE)
NODE_UPTIME = _m("sparkfleet_node_uptime_seconds", "gauge", "The node's uptime as of its last facts.", NODE)
NODE_POLL_FAILURES = _m("sparkfleet_node_poll_failures_total", "counter",
                        "Facts polls the node did not answer, by cause (unreachable, timeout, auth, hostkey-*, "
                        "exit, error).", ("node", "error"))
MEM_TOTAL = _m("sparkfleet_node_memory_total_bytes", "gauge", "MemTotal from the node's /proc/meminfo.", NODE)
MEM_AVAILABLE = _m("sparkfleet_node_memory_available_bytes", "gauge",
                   "MemAvailable from the node's /proc/meminfo (unified memory on GB10).", NODE)
EARLYOOM_RUNNING = _m("sparkfleet_earlyoom_running", "gauge", "1 when an earlyoom process runs on the node.", NODE)
EARLYOOM_SIGTERM = _m("sparkfleet_earlyoom_sigterm_threshold_bytes", "gauge",
                      "MemAvailable at or below which earlyoom sends SIGTERM (its -m percent of MemTotal); "
                      "headroom = sparkfleet_node_memory_available_bytes - this.", NODE)
EARLYOOM_KILLS = _m("sparkfleet_earlyoom_kills_total", "counter",
                    "earlyoom 'sending SIGTERM|SIGKILL to process' lines in the node's journal (journalctl -u "
                    "earlyoom), counted poll by poll; stays 0 where the journal cannot be read "
                    "(see sparkfleet_earlyoom_journal_readable).", ("node", "signal"), "journal")
EARLYOOM_JOURNAL = _m("sparkfleet_earlyoom_journal_readable", "gauge",
                      "1 when the last poll could read earlyoom's journal on the node; 0 when journalctl is "
                      "missing (as on simulated nodes) or not permitted, so kills cannot be seen.", NODE, "journal")

# -- GPUs ---------------------------------------------------------------------------------------------
GPU_SM_CLOCK = _m("sparkfleet_gpu_sm_clock_mhz", "gauge", "SM clock (nvidia-smi clocks.sm) at the last poll.", GPU)
GPU_MAX_SM_CLOCK = _m("sparkfleet_gpu_max_sm_clock_mhz", "gauge", "Maximum SM clock (clocks.max.sm).", GPU)
GPU_REASONS = _m("sparkfleet_gpu_clock_event_reasons", "gauge",
                 "Clock-event reasons bitmask (clocks_event_reasons.active; 0x1 GpuIdle, 0x4 SwPowerCap, ...).", GPU)
GPU_REASON = _m("sparkfleet_gpu_clock_event_reason_active", "gauge",
                "1 when this clock-event reason bit is set at the last poll, else 0 (one series per NVML reason).",
                ("node", "gpu", "reason"))
GPU_POWER = _m("sparkfleet_gpu_power_watts", "gauge", "GPU power draw (nvidia-smi power.draw).", GPU)
GPU_UNDER_LOAD = _m("sparkfleet_gpu_clock_under_load", "gauge",
                    "1 when the last clock sample can be judged: the GpuIdle reason bit was clear (the GPU was "
                    "busy). 0 means idle: a low idle clock is normal and never counts as latched.", GPU)
GPU_LATCHED = _m("sparkfleet_gpu_clock_latched", "gauge",
                 "1 when the SM clock is latched: judged under load only (GpuIdle clear), the clock sits inside "
                 "the hardware class's latch band or below its fraction of the max clock with no throttle reason "
                 "to explain it (the same rule as `sparkfleet check --probe`, per sample). Only for hardware "
                 "classes with latch thresholds (GB10).", GPU)
GPU_LATCH_LOW = _m("sparkfleet_gpu_clock_latch_band_low_mhz", "gauge",
                   "Lower edge of the hardware class's SM clock latch band (GB10: 630 MHz).", NODE, "inventory")
GPU_LATCH_HIGH = _m("sparkfleet_gpu_clock_latch_band_high_mhz", "gauge",
                    "Upper edge of the hardware class's SM clock latch band (GB10: 950 MHz).", NODE, "inventory")

# -- lanes ---------------------------------------------------------------------------------------------
LANE_INFO = _m("sparkfleet_lane_info", "gauge",
               "Always 1; what a lane is: engine, image (as the head container runs it, else the profile's), "
               "model and checkpoint revision (the profile's model.revision; 'unknown' when unset).",
               ("profile", "engine", "image", "model", "checkpoint", "group"), "profile")
LANE_CONTAINER_STATE = _m("sparkfleet_lane_container_state", "gauge",
                          "Always 1; one series per container sparkfleet launched (labelled sparkfleet.profile), "
                          "with its docker state (running, exited, ...).",
                          ("node", "profile", "rank", "container", "state"))
LANE_CONTAINER_UPTIME = _m("sparkfleet_lane_container_uptime_seconds", "gauge",
                           "Seconds a running lane container had been up at the last poll (node clock).",
                           ("node", "profile", "rank", "container"))
ENGRAM_SOURCE = _m("sparkfleet_engram_source", "gauge",
                   "Where each rank reads its Engram rows, as the newest up/restore run of the lane found "
                   "(its engram step): 1 on the series of the source in use, 0 on the other.",
                   ("profile", "rank", "node", "source"), "records")
ENGRAM_COPY_VALID = _m("sparkfleet_engram_local_copy_valid", "gauge",
                       "1 when the rank's node-local Engram copy has a complete manifest for the lane's checkpoint "
                       "and format (read each poll; same rule as `sparkfleet engram-local`), 0 when it is missing "
                       "or does not match (the rank would fall back to NFS). Ranks meant to read NFS have none.",
                       ("profile", "rank", "node"), "engram")
PATCHES_VERIFIED = _m("sparkfleet_patches_verified", "gauge",
                      "1 when the newest run of the lane verified every file of its patch set on the node "
                      "(the patches step), else 0.", ("profile", "node", "patch_set"), "records")

# -- fabric (issue 15) ------------------------------------------------------------------------------------
LINK = ("node", "iface")
FABRIC_LINK_UP = _m("sparkfleet_fabric_link_up", "gauge",
                    "1 when the node's fabric interface is up with carrier (/sys/class/net operstate, carrier), "
                    "0 when down or missing; per inventory rdma interface.", LINK)
FABRIC_LINK_MTU = _m("sparkfleet_fabric_link_mtu_bytes", "gauge",
                     "MTU of the node's fabric interface; every rank of a lane must have the same.", LINK)
FABRIC_LINK_SPEED = _m("sparkfleet_fabric_link_speed_bytes", "gauge",
                       "Negotiated rate of the node's fabric interface in bytes per second (/sys/class/net speed, "
                       "as node_exporter's node_network_speed_bytes); absent when the kernel does not say.", LINK)
RDMA_PORT_ACTIVE = _m("sparkfleet_rdma_port_active", "gauge",
                      "1 when the RDMA port (/sys/class/infiniband HCA/ports/N/state) is ACTIVE, else 0.",
                      ("node", "hca", "port"))
NODE_CLOCK_OFFSET = _m("sparkfleet_node_clock_offset_seconds", "gauge",
                       "The node's clock minus the exporter's when its facts arrived (one round trip: a little "
                       "low by the transit time); nodes far apart put logs and records out of order.", NODE)
PROBE_LINK_BANDWIDTH = _m("sparkfleet_fabric_probe_bytes_per_second", "gauge",
                          "One-way TCP bandwidth (bytes/s) the lane's newest fabric probe measured between two "
                          "ranks over their fabric IPs (64 MB each way), per direction (src -> dst).",
                          ("profile", "link", "src", "dst"), "records")
PROBE_LINK_RTT = _m("sparkfleet_fabric_probe_rtt_seconds", "gauge",
                    "Round trip of a message of size_bytes between two ranks over their fabric IPs (the least "
                    "of the probe's echoes), from the lane's newest fabric probe.",
                    ("profile", "link", "size_bytes"), "records")
PROBE_LINK_OK = _m("sparkfleet_fabric_probe_link_ok", "gauge",
                   "1 when the link passed the lane's newest fabric probe (within the class's ratio of the other "
                   "links' median, and reachable), 0 when it failed.", ("profile", "link"), "records")
PROBE_TIME = _m("sparkfleet_fabric_probe_timestamp_seconds", "gauge",
                "When the lane's newest fabric probe ran (unix time, end of the fabric_probe step).",
                ("profile",), "records")

# -- run records -----------------------------------------------------------------------------------------
CHECK_PASSED = _m("sparkfleet_check_passed", "gauge",
                  "Preflight check results of the lane's newest run that ran checks: 1 pass (ok or warn), "
                  "0 fail; per node and check.", ("profile", "node", "check"), "records")
CHECK_TIME = _m("sparkfleet_check_timestamp_seconds", "gauge",
                "When the checks in sparkfleet_check_passed ran (unix time, end of the check step).",
                ("profile",), "records")
GATE_PASSED = _m("sparkfleet_gate_passed", "gauge",
                 "Answer gate results of the lane's newest run that ran gates: 1 pass, 0 fail (skipped gates "
                 "are left out).", ("profile", "gate"), "records")
GATE_TIME = _m("sparkfleet_gate_timestamp_seconds", "gauge",
               "When the gates in sparkfleet_gate_passed ran (unix time, end of the gates step).",
               ("profile",), "records")
RUNS = _m("sparkfleet_runs_total", "counter",
          "Run records of this inventory (up, restore, down, ...) by outcome (ok, failed, refused, interrupted).",
          ("profile", "playbook", "outcome"), "records")
LAST_RUN_DURATION = _m("sparkfleet_last_run_duration_seconds", "gauge",
                       "Duration of the newest run of each lane and playbook (e.g. how long `up` or `restore` "
                       "took), whatever its outcome.", ("profile", "playbook"), "records")
LAST_RUN_TIME = _m("sparkfleet_last_run_timestamp_seconds", "gauge",
                   "When the newest run of each lane and playbook finished (unix time).",
                   ("profile", "playbook"), "records")
STARTUP = _m("sparkfleet_startup_seconds", "gauge",
             "The startup receipt of the lane's newest run that started a head: seconds from the head's container "
             "start to each point (port_open, health, ready, first_token), as wait_ready saw it; a point not "
             "reached is left out.", ("profile", "point"), "records")
LAST_RUN_OK = _m("sparkfleet_last_run_ok", "gauge",
                 "1 when the newest run of each lane and playbook ended ok, else 0.", ("profile", "playbook"),
                 "records")

# -- watch (its status file, <state_dir>/watch/<profile>.json, written after every probe) ---------------
WATCH_STATE = _m("sparkfleet_watch_state", "gauge",
                 "1 on the state `sparkfleet watch` of the lane is in (watching, suspect, backoff, restarting, "
                 "stopped, stood-down, ended), 0 on the others.", ("profile", "state"), "watch")
WATCH_RESTARTS = _m("sparkfleet_watch_restarts_total", "counter",
                    "Group restarts watch began since it started, by reason (probe-failed, rank-exited, "
                    "rank-vanished, job-ended: a Slurm lane's job, memory).", ("profile", "reason"), "watch")
WATCH_PROBE_OK = _m("sparkfleet_watch_probe_ok", "gauge",
                    "1 when watch's last probe got the right answer from the lane (a tiny checked count at "
                    "temperature 0), else 0.", ("profile",), "watch")
WATCH_PROBE_LATENCY = _m("sparkfleet_watch_probe_latency_seconds", "gauge",
                         "How long the last probe's generation request took (absent when it got no answer).",
                         ("profile",), "watch")
WATCH_BUDGET_LEFT = _m("sparkfleet_watch_restart_budget_left", "gauge",
                       "Restarts watch may still begin in its window (--max-restarts per --window).",
                       ("profile",), "watch")
WATCH_UPDATED = _m("sparkfleet_watch_last_update_timestamp_seconds", "gauge",
                   "When watch last wrote its status (unix time); it stops moving when watch is gone.",
                   ("profile",), "watch")

# -- the exporter itself ------------------------------------------------------------------------------
POLLS = _m("sparkfleet_exporter_polls_total", "counter", "Fleet polls the exporter has finished.", (), "exporter")
POLL_DURATION = _m("sparkfleet_exporter_last_poll_duration_seconds", "gauge",
                   "How long the exporter's last fleet poll took (facts and journal, every node in parallel).",
                   (), "exporter")
POLL_TIME = _m("sparkfleet_exporter_last_poll_timestamp_seconds", "gauge",
               "When the exporter's last fleet poll finished (unix time).", (), "exporter")

ALL: tuple[Metric, ...] = tuple(v for v in globals().values() if isinstance(v, Metric))
BY_NAME: dict[str, Metric] = {m.name: m for m in ALL}
