"""`gates`: answer checks against a lane's OpenAI-compatible endpoint (count, needle, image, tools, soak...)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from sparkfleet.cli.common import (
    EXIT_FAIL,
    EXIT_OK,
    add_inventory,
    add_json,
    add_root,
    err,
    fleet_inventory,
    out,
    print_json,
    spec,
)
from sparkfleet.schema.errors import SpecError, UserError

if TYPE_CHECKING:
    from sparkfleet.gates.env import GateOptions
    from sparkfleet.gates.result import GateResult
    from sparkfleet.opsdir import Spec
    from sparkfleet.placement import Rank
    from sparkfleet.schema.inventory import Node
    from sparkfleet.schema.load import Loaded

ORDER = 35
STYLE = {"pass": "green", "fail": "bold red", "skip": "dim"}


def register(sub: argparse._SubParsersAction) -> None:
    from sparkfleet.gates.run import GATES

    p = sub.add_parser(
        "gates", help="answer gates against a lane's endpoint: models, count100, needle, image, tools, soak...",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Check that a lane answers correctly, not just that it emits tokens. "
        "Each gate prints pass/fail, what was sent, what came back and why. Exit 0 when every gate passes, "
        "1 when one fails, 2 on bad input.",
        epilog="gates: " + ", ".join(GATES) + "\n\nexamples:\n  sparkfleet gates --profile dcp2\n"
        "  sparkfleet gates --profile dcp2 --only count100,needle --json\n"
        "  sparkfleet gates --profile boot10 --long --soak-minutes 20\n"
        "  sparkfleet gates --profile tf1017 --endpoint http://127.0.0.1:8000")
    add_root(p)
    add_inventory(p)
    add_json(p)
    p.add_argument("--profile", "-p", required=True, help="the lane whose endpoint to ask")
    p.add_argument("--only", metavar="GATE[,GATE]", help="run only these gates")
    p.add_argument("--endpoint", metavar="URL", help="API base URL (default: http://HEAD:PORT of the lane)")
    p.add_argument("--long", action="store_true",
                   help="needles at 128K and the seeds' exact lengths up to 500K tokens (default: 32K)")
    p.add_argument("--needle-tokens", metavar="N[,N]", help="needle sizes in prompt tokens (overrides --long)")
    p.add_argument("--needle-depth", type=float, default=0.5, metavar="F", help="needle depth, 0..1 (default 0.5)")
    p.add_argument("--soak-minutes", type=float, metavar="M", help="soak length (default: the profile's, else 2)")
    p.add_argument("--soak-streams", type=int, metavar="N", help="concurrent soak streams (default: the profile's, "
                   "else 8)")
    p.add_argument("--reasoning-effort", metavar="E", help="reasoning_effort for the reasoning gate (never medium)")
    p.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS", help="per request (default 600)")
    p.add_argument("--no-mem-sample", action="store_true",
                   help="do not sample MemAvailable on the lane's nodes during the soak (an endpoint whose nodes "
                   "this machine cannot reach)")
    p.set_defaults(func=run)


def _ranks(args: argparse.Namespace, sp: Spec, loaded: Loaded) -> list[Rank]:
    """The lane's ranks on the inventory (for the default endpoint and the memory sampler)."""
    from sparkfleet.placement import place

    inventory = fleet_inventory(sp, args.inventory)
    return place(loaded, inventory)


def endpoint_for(node: Node, port: int) -> str:
    """The lane's base URL (one rule for every command: sparkfleet.placement.endpoint)."""
    from sparkfleet.placement import endpoint

    return endpoint(node, port)


def lane_base(stack, head: Node, profile, quiet: bool = False) -> str:
    """The lane's base URL for `gates` and `bench` (fleet/connect.py api_base: through an SSH tunnel for a
    loopback-bound head), entered on `stack` so the tunnel closes when the caller's command ends."""
    from sparkfleet.fleet.connect import api_base

    if profile.port is None:
        raise UserError(f"profile {profile.name} has no port: pass --endpoint URL")

    def said(url: str) -> None:
        if not quiet:
            err.print(f"{head.name} serves on 127.0.0.1:{profile.port} only: reaching it through an SSH tunnel "
                      f"at {url}", markup=False, highlight=False)

    return stack.enter_context(api_base(head, profile.port, profile.host, on_tunnel=said))


def _options(args: argparse.Namespace, profile) -> GateOptions:
    from sparkfleet.gates.env import NEEDLE_DEFAULT, NEEDLE_LONG, GateOptions

    own = profile.gates
    sizes = NEEDLE_LONG if args.long else (tuple(own.needle_tokens) if own.needle_tokens else NEEDLE_DEFAULT)
    if args.soak_minutes is None:
        args.soak_minutes = own.soak_minutes or 2.0
    if args.soak_streams is None:
        args.soak_streams = own.soak_streams or 8
    if args.needle_tokens:
        try:
            sizes = tuple(int(s.replace("_", "")) for s in args.needle_tokens.split(",") if s.strip())
        except ValueError:
            raise UserError(f"--needle-tokens {args.needle_tokens!r}: expected numbers like 32768,131072") from None
    if args.soak_minutes <= 0:
        raise UserError("--soak-minutes must be more than 0")
    effort = args.reasoning_effort
    if effort is not None and effort.isdigit():
        effort = int(effort)
    try:
        return GateOptions(needle_tokens=sizes, needle_depth=args.needle_depth, soak_seconds=args.soak_minutes * 60,
                           soak_streams=args.soak_streams, reasoning_effort=effort, timeout_s=args.timeout)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    from sparkfleet.gates.run import GateSetupError, api_key_for, parse_only, run_gates, summary
    from sparkfleet.gates.soak import fleet_sampler

    sp = spec(args)
    loaded = sp.profile(args.profile)
    profile = loaded.profile
    if profile.abstract:
        raise UserError(f"{args.profile} is a base for other lanes (abstract: true), not a lane")
    try:
        only = parse_only(args.only if args.only is not None else profile.gates.only)
        key = api_key_for(profile)
    except GateSetupError as exc:
        raise UserError(str(exc)) from None
    options = _options(args, profile)
    options.api_key = key
    sample = not args.no_mem_sample and (only is None or "soak" in only)  # the soak samples the lane's nodes
    ranks = None
    # The inventory gives the lane's head (the default endpoint) and the nodes to sample. An explicit endpoint
    # with nothing to sample reaches no node, so it needs no inventory (nor the example one refused).
    if sample or not args.endpoint:
        try:
            ranks = _ranks(args, sp, loaded)
        except SpecError:
            if not args.endpoint:
                raise  # no endpoint without the lane's head: a spec error, exit 2
    from contextlib import ExitStack

    tunnel = ExitStack()  # an SSH local forward to a loopback-bound head, closed when the gates end
    base = args.endpoint.rstrip("/") if args.endpoint else lane_base(tunnel, ranks[0].node, profile, args.json)
    if ranks is not None and sample:
        from sparkfleet.fleet.op import executor_for

        ex = executor_for([r.node for r in ranks])
        transport = ex.transport
        options.mem_sampler = fleet_sampler(ex, [(r.node, r.role if r.role == "head" else "workers") for r in ranks],
                                            profile.expect.mem_available_floor_gb)
    else:
        transport = None

    def started(name: str) -> None:
        if not args.json:
            err.print(f"[dim]  .. {name}[/]", highlight=False)

    def finished(r: GateResult) -> None:
        if not args.json:
            show(r)

    if not args.json:
        out.print(f"gates for {profile.name} at {base}", markup=False)
    try:
        results = run_gates(base, profile, only, options, on_result=finished, on_start=started)
    finally:
        tunnel.close()
        if transport is not None:
            transport.close()
    passed = not any(r.status == "fail" for r in results)
    if args.json:
        print_json({"profile": profile.name, "endpoint": base, "passed": passed, "summary": summary(results),
                    "gates": [r.as_dict() for r in results]})
    else:
        out.print(("[green]PASS[/] " if passed else "[bold red]FAIL[/] ") + summary(results), highlight=False)
    return EXIT_OK if passed else EXIT_FAIL


def show(r: GateResult) -> None:
    """One line per gate; failed checks with what was sent, what came back and why."""
    out.print(f"[{STYLE[r.status]}]{r.status.upper():<4}[/] {r.name:<12} ({r.elapsed_s:.1f} s) ", end="",
              highlight=False)
    out.print(r.summary, markup=False, highlight=False)
    for c in r.checks:
        if c.ok is False:
            out.print(f"     x {c.name}: {c.why}", markup=False, highlight=False)
            if c.sent:
                out.print(f"       sent: {c.sent}", markup=False, highlight=False)
            if c.got:
                out.print(f"       got:  {c.got}", markup=False, highlight=False)
