"""`bench` (prompt set v1 at C1..C16, cold prefill, acceptance) and `bracket` (CTL → CAND → CTL)."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkfleet.cli.common import (
    EXIT_FAIL,
    EXIT_OK,
    add_accept_unknown,
    add_inventory,
    add_json,
    add_overrides,
    add_root,
    err,
    fleet_inventory,
    out,
    overrides,
    print_json,
    spec,
)
from sparkfleet.schema.errors import UserError

if TYPE_CHECKING:
    from sparkfleet.bench.bracket import BracketResult
    from sparkfleet.bench.promptsets import PromptSet
    from sparkfleet.bench.runner import BenchOptions, BenchResult
    from sparkfleet.opsdir import Spec
    from sparkfleet.runner.events import Events
    from sparkfleet.schema.load import Loaded

ORDER = 50


def register(sub: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser(
        "bench", help="benchmark a lane: prompt set v1 at C1..C16, cold prefill, DSpark acceptance",
        formatter_class=fmt,
        description="The seeds' bench: at each concurrency C, C streams of one category's prompt "
        "released together (one batch per cell), streaming, temperature 0, thinking off, after a warm-up; token "
        "counts from usage blocks only. Writes results.json (every request), report.md (tables per category and "
        "the mean of 8) and PNG plots (with the `plots` extra). Exit 0 when every cell measured, 1 when one errored.",
        epilog="examples:\n  sparkfleet bench --profile dcp2\n  sparkfleet bench --profile dcp2 --concurrency 1,4,8 "
        "--prefill\n  sparkfleet bench --profile tf1017 --endpoint http://127.0.0.1:8001 --json\n"
        "  sparkfleet bench --profile dcp2 --prompt-set my-prompts.yaml --out results/dcp2-run1")
    add_root(p)
    add_inventory(p)
    add_json(p)
    add_overrides(p)
    p.add_argument("--profile", "-p", required=True, help="the lane to benchmark (it must be serving)")
    p.add_argument("--endpoint", metavar="URL", help="API base URL (default: http://HEAD:PORT of the lane)")
    p.add_argument("--concurrency", "-c", default="1,2,3,4,5,6,8,16", metavar="LIST",
                   help="concurrency levels (default 1,2,3,4,5,6,8,16)")
    p.add_argument("--prompt-set", default="v1", metavar="v1|FILE", help="shipped set name or a YAML file")
    p.add_argument("--categories", metavar="LIST", help="only these categories of the set")
    p.add_argument("--prefill", action="store_true", help="also cold prefill at --prefill-tokens")
    p.add_argument("--prefill-only", action="store_true", help="cold prefill only, no concurrency sweep")
    p.add_argument("--prefill-tokens", default="2K,8K,32K,64K", metavar="LIST",
                   help="prefill prompt lengths (default 2K,8K,32K,64K; K = 1024)")
    p.add_argument("--ignore-eos", action="store_true", help="force every stream to its budget (ignore_eos)")
    p.add_argument("--max-tokens", type=int, metavar="N", help="override every prompt's budget")
    p.add_argument("--no-warmup", action="store_true", help="skip the warm-up batch")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="measure every cell N times back to back; cells whose repetitions differ by more than "
                   "1.2x are named bimodal (default 1)")
    p.add_argument("--probe", action="store_true",
                   help="run the clock latch / slow-state probe on the lane's nodes first and record it; a "
                   "latched rank refuses the bench (its figures would be the latched node's, FM-09)")
    p.add_argument("--allow-latched", action="store_true",
                   help="bench even when the probe finds a rank's GPU clock latched (the report says so)")
    p.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS", help="per request (default 600)")
    p.add_argument("--out", metavar="DIR", help="output directory (default: <state dir>/bench/<run>)")
    p.set_defaults(func=run_bench_cmd)

    b = sub.add_parser(
        "bracket", help="CTL -> CAND -> CTL in one window against pre-registered bars; never promotes",
        formatter_class=fmt,
        description="Bring the control up and bench it, the candidate, then the control again (one window); "
        "read each barred cell of the candidate against the mean of its two controls. Controls that drift "
        "apart beyond the bars file's band make the window invalid. Ends with the control serving and prints "
        "the decision for a person. Exit 0 when every bar passed in a valid window, 1 otherwise.",
        epilog="bars file: see docs/bench.md\n\nexamples:\n  sparkfleet bracket --control dcp2 --candidate dcp1 "
        "--bars bars/dcp1.yaml\n  sparkfleet bracket --control gb300-v23 --candidate gb300-configc --bars "
        "bars/configc.yaml --json")
    add_root(b)
    add_inventory(b)
    add_json(b)
    b.add_argument("--control", required=True, metavar="PROFILE", help="the lane run before and after the candidate")
    b.add_argument("--candidate", required=True, metavar="PROFILE",
                   help="the lane measured between the two control runs")
    b.add_argument("--bars", required=True, metavar="FILE", help="the pre-registered bars (YAML)")
    b.add_argument("--out", metavar="DIR", help="output directory (default: <state dir>/bench/<run>-bracket)")
    b.add_argument("--poll", type=float, default=1.0, metavar="SECONDS", help="poll interval while a lane boots")
    b.add_argument("--boot-budget", type=float, metavar="SECONDS", help="override the profiles' boot budget")
    add_accept_unknown(b, "each lane's up")
    b.add_argument("--gates", metavar="LIST", help="gates each `up` runs (default: the profile's set)")
    b.add_argument("--soak-minutes", type=float, metavar="M", help="soak length of each `up`'s gates")
    b.add_argument("--probe-seconds", type=float, metavar="SECONDS",
                   help="how long each `up`'s clock probe load runs (as up --probe-seconds)")
    b.set_defaults(func=run_bracket_cmd)


# ---------------------------------------------------------------------------------------------- helpers


def parse_ints(text: str, what: str, *, suffix_k: bool = False) -> tuple[int, ...]:
    """'1,2,8' -> (1, 2, 8); with suffix_k '2K,8K' -> (2048, 8192)."""
    values = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        m = re.fullmatch(r"(\d+)([kK]?)", item.replace("_", ""))
        if not m or (m.group(2) and not suffix_k):
            raise UserError(f"{what} {text!r}: expected numbers like " + ("2K,8K,32768" if suffix_k else "1,2,8"))
        values.append(int(m.group(1)) * (1024 if m.group(2) else 1))
    if not values:
        raise UserError(f"{what}: give at least one value")
    return tuple(values)


def _profile(sp: Spec, name: str, over: list | None = None) -> Loaded:
    loaded = sp.profile(name, over)
    if loaded.profile.abstract:
        raise UserError(f"{name} is a base for other lanes (abstract: true), not a lane")
    return loaded


def _api_key(loaded: Loaded) -> str | None:
    from sparkfleet.gates.run import GateSetupError, api_key_for

    try:
        return api_key_for(loaded.profile)
    except GateSetupError as exc:
        raise UserError(str(exc)) from None


def lane_endpoint(sp: Spec, loaded: Loaded, inventory_name: str) -> str:
    """http://<head>:<port> of the lane, by the rule the runner and the gates use."""
    from sparkfleet.cli.gates import endpoint_for
    from sparkfleet.placement import place

    ranks = place(loaded, sp.inventory(inventory_name))
    if loaded.profile.port is None:
        raise UserError(f"profile {loaded.profile.name} has no port: pass --endpoint URL")
    return endpoint_for(ranks[0].node, loaded.profile.port)


def _default_out(label: str) -> Path:
    from sparkfleet.root import state_dir
    from sparkfleet.runner.record import new_run_id

    return state_dir() / "bench" / f"{new_run_id()}-{label}"


def load_set(name: str) -> PromptSet:
    from sparkfleet.bench import promptsets

    try:
        return promptsets.load(name)
    except promptsets.PromptSetError as exc:
        raise UserError(str(exc)) from None


def show_cell_line(kind: str, item: Any) -> None:
    """One progress line per cell / prefill length, on stderr (stdout carries the report)."""
    if kind == "cell":
        c = item
        if c.error:
            err.print(f"  [bold red]ERR[/]  {c.category:<10} C{c.concurrency:<3} {c.error}", highlight=False)
        else:
            err.print(f"  ok   {c.category:<10} C{c.concurrency:<3} aggregate {c.aggregate_tps:8.1f} tok/s   "
                      f"per-stream {c.decode_tps or 0:7.1f}   TTFT {c.ttft_s or 0:.3f} s", highlight=False)
    elif kind == "prefill":
        p = item
        what = p.skipped or p.error or f"{p.prompt_tokens:,} tokens in {p.ttft_s:.3f} s = {p.tps:,.0f} tok/s"
        err.print(f"  prefill {p.target:>7,}: {what}", highlight=False, markup=False)
    elif kind == "note":
        err.print(f"  note: {item}", highlight=False, markup=False)


def probe_lane(sp: Spec, loaded: Loaded, inventory_name: str) -> dict:
    """The clock latch / slow-state probe on the lane's nodes (as `check --probe`), summarized."""
    from sparkfleet.checks import clock, probe
    from sparkfleet.cli.check import run_probes
    from sparkfleet.fleet.gather import facts_requests, gather_ops
    from sparkfleet.fleet.op import executor_for
    from sparkfleet.plan import make_plan

    inventory = fleet_inventory(sp, inventory_name)
    plan = make_plan(loaded, inventory, sp.playbook("up"), sp.root)
    nodes = [r.node for r in plan.ranks]
    ex = executor_for(nodes)
    try:
        facts = ex.drive(gather_ops(nodes, facts_requests(inventory, plan, loaded.profile)))
        runs = run_probes(ex, nodes, facts, loaded.profile, inventory, None)
    finally:
        ex.transport.close()
    verdicts = {name: probe.verdict(run, **clock.thresholds(inventory.hardware(inventory.nodes[name])))
                for name, run in runs.items()}
    parts = [f"{n}: clock {v['clock'].get('state')}, slow state {v['slow'].get('state')}"
             + (f" (ratio {v['slow']['ratio']})" if v["slow"].get("ratio") is not None else "")
             for n, v in verdicts.items()]
    summary = "; ".join(parts) if parts else "no node of this lane has clock thresholds (nothing probed)"
    return {"summary": summary, "nodes": verdicts, "at": time.time()}


# ---------------------------------------------------------------------------------------------- bench


def _bench_options(args: argparse.Namespace, loaded: Loaded, key: str | None) -> BenchOptions:
    from sparkfleet.bench.runner import BenchOptions

    try:
        return BenchOptions(
            concurrency=parse_ints(args.concurrency, "--concurrency"),
            categories=tuple(s.strip() for s in args.categories.split(",") if s.strip()) if args.categories else None,
            prefill=args.prefill or args.prefill_only, decode=not args.prefill_only,
            prefill_tokens=parse_ints(args.prefill_tokens, "--prefill-tokens", suffix_k=True),
            warmup=not args.no_warmup, repeat=args.repeat, max_num_seqs=max_num_seqs(loaded),
            ignore_eos=args.ignore_eos, max_tokens=args.max_tokens,
            model=loaded.profile.served_names[0] if loaded.profile.served_names else None,
            api_key=key, timeout_s=args.timeout)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def max_num_seqs(loaded: Loaded) -> int | None:
    """The lane's --max-num-seqs, as its profile sets it (None when unset: the engine's default is not known)."""
    from sparkfleet.checks.graphs import number

    n = number(loaded.profile.flags.get("--max-num-seqs"))
    return int(n) if n else None


def run_bench_cmd(args: argparse.Namespace) -> int:
    from sparkfleet.bench import promptsets

    sp = spec(args)
    loaded = _profile(sp, args.profile, overrides(args))
    key = _api_key(loaded)
    opts = _bench_options(args, loaded, key)
    pset = load_set(args.prompt_set)
    if opts.categories:
        try:
            pset.only(list(opts.categories))
        except promptsets.PromptSetError as exc:
            raise UserError(str(exc)) from None
    probe = probe_lane(sp, loaded, args.inventory) if args.probe else None
    stuck = latched(probe)
    if stuck and not args.allow_latched:
        raise UserError(f"bench {loaded.profile.name}: the GPU clock is latched under load on "
                        f"{', '.join(stuck)} ({probe['summary']}): every TP step waits for that node (FM-09), so "
                        "the figures would be its; unplug it for 30-60 s and probe again, or bench anyway with "
                        "--allow-latched")
    if stuck:
        probe["allowed_latched"] = stuck  # recorded with the result: these figures are a latched node's
    with ExitStack() as tunnel:  # an SSH local forward to a loopback-bound head, closed when the bench ends
        return _bench(args, loaded, opts, pset, probe, tunnel)


def latched(probe: dict | None) -> list[str]:
    """The nodes whose GPU clock the probe judged latched under load (the probe's own verdict)."""
    nodes = (probe or {}).get("nodes") or {}
    return [n for n, v in nodes.items() if (v.get("clock") or {}).get("state") == "latched"]


def _bench(args: argparse.Namespace, loaded: Loaded, opts: BenchOptions, pset: PromptSet, probe: dict | None,
           tunnel: ExitStack) -> int:
    from sparkfleet.bench import report
    from sparkfleet.bench.runner import run_bench
    from sparkfleet.cli.gates import lane_base
    from sparkfleet.gates.client import RequestFailed
    from sparkfleet.placement import place

    sp = spec(args)
    if args.endpoint:
        base = args.endpoint.rstrip("/")
    else:
        base = lane_base(tunnel, place(loaded, fleet_inventory(sp, args.inventory))[0].node, loaded.profile, args.json)
    if not args.json:
        err.print(f"bench {loaded.profile.name} at {base}: prompt set {pset.name} (sha256 {pset.sha256[:12]}), "
                  f"concurrency {','.join(map(str, opts.concurrency))}" + (", prefill" if opts.prefill else ""),
                  highlight=False, markup=False)
        if probe:
            err.print(f"  probe: {probe['summary']}", highlight=False, markup=False)
    try:
        result = run_bench(base, pset, opts, None if args.json else show_cell_line, profile=loaded.profile.name,
                           probe=probe)
    except RequestFailed as exc:
        raise UserError(f"bench {loaded.profile.name} at {base}: {exc}") from None
    out_dir = Path(args.out) if args.out else _default_out(loaded.profile.name)
    files = report.write(result, out_dir)
    if args.json:
        print_json({**result.as_dict(), "files": files})
    else:
        sys.stdout.write(report.markdown(result, files.get("plots") or None, files.get("plot_note")) + "\n")
        out.print(f"written: {out_dir}", markup=False)
    return EXIT_OK if result.ok else EXIT_FAIL


# ---------------------------------------------------------------------------------------------- bracket


class RunnerLanes:
    """The bracket's lanes through the runner's `up` and `down` playbooks (as `sparkfleet up/down`)."""

    def __init__(self, sp: Spec, inventory: str, events: Events, *, poll_s: float = 1.0,
                 boot_budget_s: float | None = None, gate_args: dict | None = None,
                 probe_seconds: float | None = None, accept_unknown: bool = False) -> None:
        self.sp, self.inventory_name, self.events = sp, inventory, events
        self.poll_s, self.boot_budget_s, self.gate_args = poll_s, boot_budget_s, gate_args or {}
        self.probe_seconds, self.accept_unknown = probe_seconds, accept_unknown

    def _play(self, profile: str, playbook: str) -> str:
        from sparkfleet.bench.bracket import BracketError
        from sparkfleet.runner.context import RunOptions
        from sparkfleet.runner.run import execute

        loaded = _profile(self.sp, profile)
        options = RunOptions(gate_args=self.gate_args if playbook == "up" else {}, poll_s=self.poll_s,
                             boot_budget_s=self.boot_budget_s, probe_seconds=self.probe_seconds,
                             accept_unknown=self.accept_unknown and playbook == "up")
        record = execute(self.sp, loaded, self.sp.inventory(self.inventory_name), self.sp.playbook(playbook),
                         options, self.events, f"sparkfleet bracket: {playbook} {profile}")
        if record.outcome != "ok":
            raise BracketError(f"{playbook} {profile}: {record.outcome}: {record.reason} (run {record.run_id})")
        return lane_endpoint(self.sp, loaded, self.inventory_name)

    def up(self, profile: str) -> str:
        return self._play(profile, "up")

    def down(self, profile: str) -> None:
        self._play(profile, "down")


def show_bracket(res: BracketResult) -> None:
    """The verdict table, the window's validity and the decision for a person."""
    def num(x: float | None) -> str:
        return "—" if x is None else f"{x:,.4g}"

    def pct(x: float | None, sign: bool = False) -> str:
        return "—" if x is None else (f"{100 * x:+.1f}%" if sign else f"{100 * x:.1f}%")

    style = {"pass": "green", "fail": "bold red", "drift": "yellow", "error": "bold red"}
    out.print(f"[bold]bracket[/] control {res.control} → candidate {res.candidate} → control {res.control}  "
              f"(bars {res.bars_file}, sha256 {res.bars_sha256[:12]}; drift band {100 * res.drift_band:.1f}%)",
              highlight=False)
    for a in res.arms:
        state = a.error or ("benched" + ("" if a.bench_ok else ", with errored cells"))
        out.print(f"  {a.arm:<10} {a.profile:<16} {a.endpoint or '-':<28} {state}", markup=False, highlight=False)
    if res.cells:
        head = f"{'cell':<22} {'control-1':>10} {'control-2':>10} {'spread':>7} {'candidate':>10} {'change':>8}  " \
               f"{'bar':<24} {'threshold':>10}  verdict"
        out.print(head, markup=False, highlight=False)
        for c in res.cells:
            out.print(f"{c.key:<22} {num(c.control_1):>10} {num(c.control_2):>10} {pct(c.spread):>7} "
                      f"{num(c.candidate):>10} {pct(c.change, True):>8}  {c.bar[:24]:<24} {num(c.threshold):>10}  "
                      f"[{style[c.verdict]}]{c.verdict.upper()}[/]", highlight=False)
    for w in res.warnings:
        out.print(f"[yellow]warning[/] {w}", highlight=False)
    verdict = ("[green]VALID[/]" if res.window_valid else "[bold red]INVALID[/]")
    out.print(f"window: {verdict}", highlight=False)
    out.print(f"DECISION (for a person): {res.decision}", markup=False, highlight=False)


def run_bracket_cmd(args: argparse.Namespace) -> int:
    from sparkfleet.bench import report
    from sparkfleet.bench.bracket import BarsError, load_bars, run_bracket
    from sparkfleet.bench.runner import run_bench
    from sparkfleet.runner.events import HumanEvents, JsonEvents

    sp = spec(args)
    try:
        bars = load_bars(args.bars)  # pre-registered: read and checked before any lane is touched
    except BarsError as exc:
        raise UserError(str(exc)) from None
    load_set(bars.prompt_set)
    keys = {}
    for name in (args.control, args.candidate):
        keys[name] = _api_key(_profile(sp, name))
        lane_endpoint(sp, _profile(sp, name), args.inventory)  # both lanes place on this inventory
    if args.control == args.candidate:
        raise UserError("--control and --candidate are the same profile; a bracket compares two lanes")
    out_dir = Path(args.out) if args.out else _default_out(f"bracket-{args.candidate}")
    out_dir.mkdir(parents=True, exist_ok=True)
    events = JsonEvents(sys.stderr) if args.json else HumanEvents(err)
    gate_args: dict = {}
    if args.gates:
        gate_args["only"] = args.gates
    if args.soak_minutes is not None:
        gate_args["soak_minutes"] = args.soak_minutes
    from sparkfleet.cli.lifecycle import probe_seconds

    lanes = RunnerLanes(sp, args.inventory, events, poll_s=args.poll, boot_budget_s=args.boot_budget,
                        gate_args=gate_args, probe_seconds=probe_seconds(args), accept_unknown=args.accept_unknown)
    profiles = {"control-1": args.control, "candidate": args.candidate, "control-2": args.control}

    def bench(endpoint: str, opts: BenchOptions, pset: PromptSet, arm: str) -> BenchResult:
        profile = _profile(sp, profiles[arm]).profile
        arm_opts = replace(opts, api_key=keys[profiles[arm]],
                           model=profile.served_names[0] if profile.served_names else None)
        return run_bench(endpoint, pset, arm_opts, None if args.json else show_cell_line, profile=profile.name)

    def save(arm: str, result: BenchResult) -> str:
        files = report.write(result, out_dir / arm)
        return str(files["results"])

    where = {"arm": "control-1", "phase": "start", "profile": args.control}

    def notify(arm: str, phase: str, data: dict) -> None:
        where.update(arm=arm, phase=phase, profile=data.get("profile", ""))
        if not args.json:
            err.print(f"[bold]{arm}[/]: {phase} {data.get('profile', '')} {data.get('error', '')}", highlight=False)

    try:
        res = run_bracket(args.control, args.candidate, bars, lanes, bench, notify, save)
    except KeyboardInterrupt:
        err.print(f"sparkfleet: bracket interrupted in {where['arm']} ({where['phase']} {where['profile']}): "
                  f"{where['profile']} may be serving; bring the control back with "
                  f"`sparkfleet up --profile {args.control}`", markup=False)
        raise
    finally:
        events.close()
    (out_dir / "bracket.json").write_text(json.dumps(res.as_dict(), indent=1) + "\n")
    if args.json:
        print_json({**res.as_dict(), "out": str(out_dir)})
    else:
        show_bracket(res)
        out.print(f"written: {out_dir}", markup=False)
    return EXIT_OK if res.passed and res.serving == res.control else EXIT_FAIL
