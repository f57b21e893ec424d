"""Grafana dashboards as Python data (serialised with json.dumps; no templates: `{{node}}` legends stay literal).

- Fleet: node up and facts age, MemAvailable against earlyoom's SIGTERM line, GPU SM clock with the
  latch band marked, latched GPUs, clock-event reasons, power, lanes and their containers, Engram
  source per rank, check and gate results, runs.
- Lane: vLLM's serving metrics (REFERENCE.md §1) for the lane's engine, plus what the lane is (image,
  checkpoint) and its containers.
- Bench: not generated. No bench metrics are exported yet (there is no bench exporter in sparkfleet),
  and a dashboard is only built from series that exist.

Every sparkfleet series is named through `names`, so the dashboards follow the exporter. Variables:
`datasource`, `profile` and `node` (on the Lane dashboard `node` narrows the container panels), with
"All" meaning `.*`. Every panel has a description.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from sparkfleet.engines.registry import NAMES, engine_for
from sparkfleet.metrics import names as n

DS = {"type": "prometheus", "uid": "${datasource}"}
GRID_W = 24
SCHEMA_VERSION = 39
RATE = "$__rate_interval"

NODE_SEL = '{node=~"$node"}'
PROFILE_SEL = '{profile=~"$profile"}'
QUANTILES = (0.5, 0.9, 0.99)


def target(expr: str, legend: str = "", *, instant: bool = False, table: bool = False) -> dict[str, Any]:
    """One query of a panel (refIds are assigned by `panel`)."""
    t: dict[str, Any] = {"datasource": DS, "expr": expr, "legendFormat": legend, "range": not instant,
                         "instant": instant}
    if table:
        t["format"] = "table"
    return t


def panel(title: str, description: str, targets: list[dict[str, Any]], *, kind: str = "timeseries",
          unit: str = "short", w: int = 12, h: int = 8, thresholds: list[dict[str, Any]] | None = None,
          mappings: list[dict[str, Any]] | None = None, custom: dict[str, Any] | None = None,
          options: dict[str, Any] | None = None) -> dict[str, Any]:
    """A panel without id/position (`layout` assigns them)."""
    for i, t in enumerate(targets):
        t["refId"] = chr(ord("A") + i)
    defaults: dict[str, Any] = {"unit": unit}
    if thresholds is not None:
        defaults["thresholds"] = {"mode": "absolute", "steps": thresholds}
    if mappings is not None:
        defaults["mappings"] = mappings
    if custom is not None:
        defaults["custom"] = custom
    return {"type": kind, "title": title, "description": description, "datasource": DS,
            "gridPos": {"h": h, "w": w, "x": 0, "y": 0}, "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": options or {}, "targets": targets}


def row(title: str) -> dict[str, Any]:
    return {"type": "row", "title": title, "collapsed": False, "gridPos": {"h": 1, "w": GRID_W, "x": 0, "y": 0},
            "panels": []}


def layout(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ids in order and positions left to right, top to bottom on Grafana's 24-column grid."""
    x = y = row_h = 0
    out = []
    for i, item in enumerate(items, start=1):
        item = copy.deepcopy(item)
        w, h = item["gridPos"]["w"], item["gridPos"]["h"]
        if item["type"] == "row" or x + w > GRID_W:
            x, y, row_h = 0, y + row_h, 0
        item["id"] = i
        item["gridPos"].update(x=x, y=y)
        x += w
        row_h = max(row_h, h)
        if item["type"] == "row":
            x, y, row_h = 0, y + h, 0
        out.append(item)
    return out


def variable_datasource() -> dict[str, Any]:
    return {"type": "datasource", "name": "datasource", "label": "Data source", "query": "prometheus",
            "current": {}, "hide": 0, "refresh": 1, "regex": "", "options": []}


def variable_query(name: str, label: str, metric: str, key: str) -> dict[str, Any]:
    """A multi-value variable from a label's values; "All" is `.*`, which also matches series without it."""
    q = f"label_values({metric}, {key})"
    return {"type": "query", "name": name, "label": label, "datasource": DS, "definition": q,
            "query": {"query": q, "refId": f"{name}-values"}, "refresh": 2, "includeAll": True, "multi": True,
            "allValue": ".*", "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
            "sort": 1, "hide": 0, "options": []}


def dashboard(uid: str, title: str, description: str, items: list[dict[str, Any]],
              variables: list[dict[str, Any]], tags: list[str]) -> dict[str, Any]:
    return {"uid": uid, "title": title, "description": description, "tags": tags, "editable": True,
            "graphTooltip": 1, "schemaVersion": SCHEMA_VERSION, "version": 1, "refresh": "30s",
            "time": {"from": "now-1h", "to": "now"}, "timezone": "", "annotations": {"list": []}, "links": [],
            "templating": {"list": [variable_datasource(), *variables]}, "panels": layout(items)}


UP_MAPPING = [{"type": "value", "options": {"0": {"text": "down", "color": "red"},
                                             "1": {"text": "up", "color": "green"}}}]
PASS_MAPPING = [{"type": "value", "options": {"0": {"text": "fail", "color": "red"},
                                               "1": {"text": "pass", "color": "green"}}}]
RED_GREEN = [{"color": "red", "value": None}, {"color": "green", "value": 1}]
GREEN_RED = [{"color": "green", "value": None}, {"color": "red", "value": 1}]


def _sel(*parts: str) -> str:
    return "{" + ", ".join(parts) + "}"


def fleet(latch_band: tuple[int, int] | None = (630, 950)) -> dict[str, Any]:
    """The Fleet dashboard. `latch_band` (the GB10 class's, from the inventory) colours the clock panel."""
    node, prof, updown = 'node=~"$node"', 'profile=~"$profile"', 'playbook=~"up|restore"'
    band_steps = None
    band_custom = None
    if latch_band is not None:
        lo, hi = latch_band
        band_steps = [{"color": "green", "value": None}, {"color": "red", "value": lo},
                      {"color": "green", "value": hi + 1}]
        band_custom = {"thresholdsStyle": {"mode": "area"}}
    items = [
        row("Nodes"),
        panel("Nodes up", "1 when the node answered the exporter's last facts poll (one round trip per node); "
              "0 when it did not, and then its readings are left out until it answers again.",
              [target(f"{n.NODE_UP}{NODE_SEL}", "{{node}}")], kind="stat", w=8, h=5,
              thresholds=RED_GREEN, mappings=UP_MAPPING),
        panel("Facts age", "Seconds since each node's facts last arrived; grows while a node does not answer.",
              [target(f"{n.NODE_FACTS_AGE}{NODE_SEL}", "{{node}}")], unit="s", w=8, h=5),
        panel("earlyoom running", "1 when an earlyoom process runs on the node (INV-13); without it a memory "
              "spike wedges a GB10 instead of killing one process.",
              [target(f"{n.EARLYOOM_RUNNING}{NODE_SEL}", "{{node}}")], kind="stat", w=8, h=5,
              thresholds=RED_GREEN, mappings=UP_MAPPING),
        panel("MemAvailable vs earlyoom's SIGTERM line", "MemAvailable per node (unified memory on GB10) against "
              "the MemAvailable at which earlyoom sends SIGTERM (its -m percent of MemTotal).",
              [target(f"{n.MEM_AVAILABLE}{NODE_SEL}", "{{node}} MemAvailable"),
               target(f"{n.EARLYOOM_SIGTERM}{NODE_SEL}", "{{node}} earlyoom SIGTERM")], unit="bytes"),
        panel("Headroom above earlyoom", "MemAvailable minus earlyoom's SIGTERM threshold: below 0 earlyoom "
              "starts killing (HLT-24).",
              [target(f"{n.MEM_AVAILABLE}{NODE_SEL} - on (node) {n.EARLYOOM_SIGTERM}{NODE_SEL}", "{{node}}")],
              unit="bytes", thresholds=[{"color": "red", "value": None}, {"color": "green", "value": 0}]),
        panel("earlyoom kills", "earlyoom SIGTERM/SIGKILL lines in each node's journal per interval, and whether "
              "the journal could be read at all (0: journalctl missing or not permitted, as on the simulated "
              "lab, so kills cannot be seen).",
              [target(f"sum by (node, signal) (increase({n.EARLYOOM_KILLS}{NODE_SEL}[{RATE}]))",
                      "{{node}} {{signal}}"),
               target(f"{n.EARLYOOM_JOURNAL}{NODE_SEL}", "{{node}} journal readable")]),
        panel("Node uptime", "Seconds since each node booted, as of its last facts.",
              [target(f"{n.NODE_UPTIME}{NODE_SEL}", "{{node}}")], unit="s"),
        row("GPU"),
        panel("GPU SM clock (latch band marked)", "SM clock per GPU with the hardware class's latch band "
              "(GB10: 630-950 MHz, shaded red). An idle GPU reads low with reason GpuIdle: only a low clock "
              "under load is a latch (see Latched GPUs).",
              [target(f"{n.GPU_SM_CLOCK}{NODE_SEL}", "{{node}} GPU {{gpu}}"),
               target(f"{n.GPU_MAX_SM_CLOCK}{NODE_SEL}", "{{node}} GPU {{gpu}} max"),
               target(f"{n.GPU_LATCH_LOW}{NODE_SEL}", "{{node}} latch band low"),
               target(f"{n.GPU_LATCH_HIGH}{NODE_SEL}", "{{node}} latch band high")],
              unit="MHz", thresholds=band_steps, custom=band_custom),
        panel("Latched GPUs", "1 when a GPU's clock is latched: judged under load only (GpuIdle clear), inside "
              "the latch band or below the class's fraction of max with no throttle reason (FM-09). Under load "
              "shows whether the sample could be judged at all.",
              [target(f"{n.GPU_LATCHED}{NODE_SEL}", "{{node}} GPU {{gpu}} latched"),
               target(f"{n.GPU_UNDER_LOAD}{NODE_SEL}", "{{node}} GPU {{gpu}} under load")],
              kind="state-timeline", thresholds=GREEN_RED),
        panel("Active clock-event reasons", "NVML clock-event reasons set on each GPU (GpuIdle, SwPowerCap, "
              "HwSlowdown, ...); a low clock under load with none of them set is a latch.",
              [target(f"max by (node, gpu, reason) ({n.GPU_REASON}{NODE_SEL}) > 0", "{{node}} {{reason}}")],
              kind="state-timeline"),
        panel("GPU power", "Power draw per GPU (nvidia-smi power.draw).",
              [target(f"{n.GPU_POWER}{NODE_SEL}", "{{node}} GPU {{gpu}}")], unit="watt"),
        row("Fabric"),
        panel("Fabric links up", "1 when the node's fabric interface is up with carrier and 0 when down or "
              "missing; the RDMA port's state beside it (ACTIVE = 1).",
              [target(f"{n.FABRIC_LINK_UP}{NODE_SEL}", "{{node}} {{iface}}"),
               target(f"{n.RDMA_PORT_ACTIVE}{NODE_SEL}", "{{node}} {{hca}}/{{port}} active")],
              kind="state-timeline", thresholds=RED_GREEN, mappings=UP_MAPPING),
        panel("Fabric MTU", "MTU of each node's fabric interface: every rank of a lane needs the same one (a "
              "smaller MTU on one rank slows or breaks RoCE for the whole lane).",
              [target(f"{n.FABRIC_LINK_MTU}{NODE_SEL}", "{{node}} {{iface}}")]),
        panel("Clock offset", "Each node's clock minus the exporter's when its facts arrived: nodes far apart "
              "put the ranks' log lines and records out of order.",
              [target(f"{n.NODE_CLOCK_OFFSET}{NODE_SEL}", "{{node}}")], unit="s"),
        row("Lanes"),
        panel("Lanes", "What each lane is: engine, image, model and checkpoint revision, so the lane name does "
              "not hide which checkpoint serves.",
              [target(f"{n.LANE_INFO}{PROFILE_SEL}", instant=True, table=True)], kind="table", w=24, h=5),
        panel("Lane containers", "Every container sparkfleet launched (by label), per node and rank, with its "
              "docker state.",
              [target(f"{n.LANE_CONTAINER_STATE}{_sel(prof, node)}", instant=True, table=True)], kind="table"),
        panel("Container uptime", "Seconds each running lane container has been up (long-running lanes prefill "
              "slower, MET-22).",
              [target(f"{n.LANE_CONTAINER_UPTIME}{_sel(prof, node)}", "{{node}} rank {{rank}}")], unit="s"),
        panel("Engram source per rank", "Where each rank reads its Engram rows (node-local copy or NFS), from the "
              "lane's newest up/restore run; NFS costs 6-8 ms a step against 3 (ENG-16).",
              [target(f"{n.ENGRAM_SOURCE}{PROFILE_SEL} == 1", instant=True, table=True)], kind="table"),
        panel("Engram local copy valid", "1 when the rank's node-local copy has a complete manifest for the lane's "
              "checkpoint and format (read each poll); 0: missing or stale, the rank would read NFS.",
              [target(f"{n.ENGRAM_COPY_VALID}{PROFILE_SEL}", "{{profile}} rank {{rank}} ({{node}})")],
              kind="state-timeline", thresholds=RED_GREEN, mappings=PASS_MAPPING),
        row("Checks, gates and runs"),
        panel("Check results", "Preflight checks of the lane's newest run that ran them: pass (ok or warn) or "
              "fail, per node and check.",
              [target(f"{n.CHECK_PASSED}{_sel(prof, node)}", instant=True, table=True)], kind="table",
              thresholds=RED_GREEN, mappings=PASS_MAPPING),
        panel("Gate results", "Answer gates of the lane's newest run that ran them (skipped gates left out).",
              [target(f"{n.GATE_PASSED}{PROFILE_SEL}", instant=True, table=True)], kind="table",
              thresholds=RED_GREEN, mappings=PASS_MAPPING),
        panel("Age of check and gate results", "How long ago the checks and gates above ran.",
              [target(f"time() - {n.CHECK_TIME}{PROFILE_SEL}", "{{profile}} checks"),
               target(f"time() - {n.GATE_TIME}{PROFILE_SEL}", "{{profile}} gates")], unit="s"),
        panel("Runs by outcome", "Run records of this inventory per lane, playbook and outcome.",
              [target(f"sum by (profile, playbook, outcome) ({n.RUNS}{PROFILE_SEL})", instant=True, table=True)],
              kind="table"),
        panel("up / restore duration", "How long the newest `up` and `restore` of each lane took (a healthy "
              "boot on the Sparks is about 11 min, LCH-14).",
              [target(f"{n.LAST_RUN_DURATION}{_sel(prof, updown)}", "{{profile}} {{playbook}}")],
              unit="s"),
        panel("Exporter poll duration", "How long the exporter's last fleet poll took; a poll longer than the "
              "interval delays the next one.", [target(f"{n.POLL_DURATION}", "poll")], unit="s"),
    ]
    return dashboard("sparkfleet-fleet", "sparkfleet / Fleet",
                     "The nodes around the lanes: reachability, memory against earlyoom, GPU clocks (latch), "
                     "lanes, Engram sources, check and gate results. From `sparkfleet exporter`.", items,
                     [variable_query("profile", "Lane", n.LANE_INFO.name, "profile"),
                      variable_query("node", "Node", n.NODE_UP.name, "node")], ["sparkfleet", "fleet"])


def _quantiles(key: str, sel: str) -> list[dict[str, Any]]:
    return [target(_each_engine("histograms", key, f"histogram_quantile({q:g}, sum by (le, profile) "
                                f"(rate({{m}}_bucket{sel}[{RATE}])))"), f"{{{{profile}}}} p{q * 100:g}")
            for q in QUANTILES]


def _metrics() -> list[Any]:
    """Every engine's MetricNames (engines/*.py METRICS), in the registry's order."""
    return [m for m in (engine_for(name).metrics for name in NAMES) if m is not None]


def _one(m: Any, kind: str, key: str) -> str | None:
    return m.per_pos if kind == "per_pos" else getattr(m, kind).get(key)


def engine_series(kind: str, key: str, *, fallback: bool = False) -> list[str]:
    """Every engine's series for `key`, and with `fallback` their older names too."""
    names: list[str] = []
    for m in _metrics():
        series = [_one(m, kind, key)] + ([m.fallbacks.get(key)] if fallback else [])
        names += [x for x in series if x and x not in names]
    return names


def _each_engine(kind: str, key: str, expr: str) -> str:
    """`expr` (with {m} for the series name) for every engine that exports `key`, joined with `or`: one
    panel for vLLM's and llama.cpp's names; a lane has one engine, so one side."""
    return " or ".join(expr.replace("{m}", x) for x in engine_series(kind, key))


def _ratio(num: tuple[str, str], den: tuple[str, str], s: str, by: str = "profile", on: str = "") -> str:
    """rate(num) / rate(den) per lane, for each engine that exports both (one side per engine)."""
    parts = [f"sum by ({by}) (rate({a}{s}[{RATE}])) / {on}sum by (profile) (rate({b}{s}[{RATE}]))"
             for m in _metrics() if (a := _one(m, *num)) and (b := _one(m, *den))]
    return parts[0] if len(parts) == 1 else " or ".join(f"({x})" for x in parts)


def lane() -> dict[str, Any]:
    """The Lane dashboard: vLLM's own metrics, scraped from the head's /metrics with a `profile` label."""
    s = PROFILE_SEL
    sn = _sel('profile=~"$profile"', 'node=~"$node"')  # the lane's containers, on the chosen nodes
    items = [
        row("Lane"),
        panel("Lane", "The lane's engine, image and checkpoint revision (from the exporter).",
              [target(f"{n.LANE_INFO}{s}", instant=True, table=True)], kind="table", w=24, h=5),
        panel("Lane containers", "Containers of the lane per node and rank, with their docker state.",
              [target(f"{n.LANE_CONTAINER_STATE}{sn}", instant=True, table=True)], kind="table"),
        panel("Container uptime", "Seconds each running container of the lane has been up.",
              [target(f"{n.LANE_CONTAINER_UPTIME}{sn}", "{{node}} rank {{rank}}")], unit="s"),
        row("Watch"),
        panel("Watch state", "What `sparkfleet watch` is doing for the lane (watching, suspect, backoff, "
              "restarting, stopped, stood-down, ended), from its status file.",
              [target(f"{n.WATCH_STATE}{s} == 1", instant=True, table=True)], kind="table", w=8, h=6),
        panel("Probe verdict", "1 when watch's last probe got the right answer (a tiny checked count at "
              "temperature 0, thinking off).", [target(f"{n.WATCH_PROBE_OK}{s}", "{{profile}}")], kind="stat",
              w=4, h=6, mappings=PASS_MAPPING, thresholds=RED_GREEN),
        panel("Restart budget left", "Restarts watch may still begin in its window; at 0 a failure leaves the "
              "lane stopped.", [target(f"{n.WATCH_BUDGET_LEFT}{s}", "{{profile}}")], kind="stat", w=4, h=6,
              thresholds=RED_GREEN),
        panel("Since watch's last update", "Seconds since watch last wrote its status; it grows when watch is "
              "gone.", [target(f"time() - {n.WATCH_UPDATED}{s}", "{{profile}}")], kind="stat", unit="s", w=8, h=6),
        panel("Probe latency", "How long the last probe's generation request took.",
              [target(f"{n.WATCH_PROBE_LATENCY}{s}", "{{profile}}")], unit="s"),
        panel("Restarts by reason", "Group restarts watch began since it started, by reason.",
              [target(f"sum by (profile, reason) ({n.WATCH_RESTARTS}{s})", "{{profile}} {{reason}}")]),
        row("Serving"),
        panel("Requests running / waiting", "Requests in the engine's batch, and requests queued for it.",
              [target(_each_engine("gauges", "running", "sum by (profile) ({m}" + s + ")"), "{{profile}} running"),
               target(_each_engine("gauges", "waiting", "sum by (profile) ({m}" + s + ")"), "{{profile}} waiting")]),
        panel("KV cache usage", "Fraction of the KV cache in use ("
              + ", then ".join(engine_series("gauges", "kv_usage", fallback=True))
              + ": an older image's name is read when the current one is absent).",
              [target("max by (profile) (" + " or ".join(
                  f"{m}{s}" for m in engine_series("gauges", "kv_usage", fallback=True)) + ")", "{{profile}}")],
              unit="percentunit"),
        panel("Prompt and generation tokens/s", "Prefill (prompt) and decode (generation) token throughput.",
              [target(_each_engine("counters", "prompt_tokens", "sum by (profile) (rate({m}" + s + f"[{RATE}]))"),
                      "{{profile}} prompt tok/s"),
               target(_each_engine("counters", "generation_tokens", "sum by (profile) (rate({m}" + s + f"[{RATE}]))"),
                      "{{profile}} generation tok/s")]),
        panel("Time to first token", "TTFT quantiles (p50, p90, p99) from the engine's histogram.",
              _quantiles("ttft", s), unit="s"),
        panel("Inter-token latency", "Inter-token latency quantiles (p50, p90, p99) from the engine's histogram.",
              _quantiles("itl", s), unit="s"),
        panel("Preemptions", "Requests preempted per interval (KV cache pressure); the seeds' lanes ran with "
              "zero.", [target(_each_engine("counters", "preemptions", f"sum by (profile) (increase({{m}}{s}"
                                            f"[{RATE}]))"), "{{profile}}")]),
        panel("Finished requests", "Requests finished per interval, by reason (stop, length, abort).",
              [target(_each_engine("counters", "requests", f"sum by (profile, finished_reason) (increase({{m}}{s}"
                                   f"[{RATE}]))"), "{{profile}} {{finished_reason}}")]),
        panel("Prefix cache hit rate", "Prompt tokens served from the prefix cache, over tokens queried.",
              [target(_ratio(("counters", "prefix_cache_hits"), ("counters", "prefix_cache_queries"), s),
                      "{{profile}}")], unit="percentunit"),
        row("DSpark speculative decoding"),
        panel("Mean acceptance length", "Tokens per step: 1 + accepted draft tokens per draft (max k+1, 6 at "
              "k=5; MET-05). Only with --speculative-config.",
              [target("1 + " + _ratio(("counters", "accepted"), ("counters", "drafts"), s), "{{profile}}")]),
        panel("Draft acceptance rate", "Accepted draft tokens over drafted tokens.",
              [target(_ratio(("counters", "accepted"), ("counters", "draft_tokens"), s), "{{profile}}")],
              unit="percentunit"),
        panel("Acceptance per draft position", "Share of drafts whose token at each position was accepted "
              "(MET-06; the seeds saw 59.5 / 30.4 / 13.9 / 6.1 / 2.8 %).",
              [target(_ratio(("per_pos", ""), ("counters", "drafts"), s, by="profile, position",
                             on="on (profile) group_left () "), "{{profile}} position {{position}}")],
              unit="percentunit", w=24),
    ]
    return dashboard("sparkfleet-lane", "sparkfleet / Lane",
                     "A lane's serving metrics from its engine's /metrics on the head (labelled with the lane by "
                     "the generated scrape config), with the lane's image and checkpoint.", items,
                     [variable_query("profile", "Lane", n.LANE_INFO.name, "profile"),
                      variable_query("node", "Node", n.NODE_UP.name, "node")],
                     ["sparkfleet", "lane", *(name for name in NAMES if engine_for(name).metrics is not None)])


def all_dashboards(latch_band: tuple[int, int] | None = (630, 950)) -> dict[str, dict[str, Any]]:
    """File name -> dashboard. No Bench dashboard: no bench metrics are exported yet."""
    return {"sparkfleet-fleet.json": fleet(latch_band), "sparkfleet-lane.json": lane()}


def panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    """Every non-row panel (rows here are flat: their panels follow them)."""
    return [p for p in dash["panels"] if p["type"] != "row"]


def queries(dash: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) for every target of every panel."""
    return [(p["title"], t["expr"]) for p in panels(dash) for t in p["targets"]]


def series_names(expr: str) -> set[str]:
    """The sparkfleet_* and engine (each adapter's prefix: vllm:*, llamacpp:*) names an expression reads
    (histogram suffixes included)."""
    prefixes = "|".join(re.escape(m.prefix) for m in _metrics())
    return set(re.findall(rf"\b(sparkfleet_[a-z0-9_]+|(?:{prefixes})[a-z0-9_:]+)", expr))
