"""The ranks this run started: following them (state and new log lines, one poll), deciding whether the
launch has failed and which rank failed it, and stopping them."""

from __future__ import annotations

from sparkfleet.engines.logs import LogFacts, feed
from sparkfleet.engines.registry import engine_for
from sparkfleet.fleet import ops
from sparkfleet.runner import slurm_launch
from sparkfleet.runner.context import RunContext, Started
from sparkfleet.runner.ops import NodeCommands, StepGen

LOG_TAIL = ops.LOG_TAIL  # lines of each rank's log kept in the record when a launch fails


def _by_node(ranks: list[Started]) -> dict[str, list[Started]]:
    by_node: dict[str, list[Started]] = {}
    for s in ranks:
        by_node.setdefault(s.node, []).append(s)
    return by_node


def follow(ctx: RunContext) -> StepGen:
    """One poll of every rank this run started: its state and its new log lines.

    Returns ({rank: (node, ContainerState)}, [(rank, node, NodeError)]): a node whose docker could not
    answer is an error of its own (never an "unknown" state or log lines). For ranks only shown (--dry-run,
    ctx.would_start) both reads are shown, with their ids as placeholders, and it returns None."""
    shown = not ctx.started
    by_node = _by_node(ctx.started or ctx.would_start)
    inspect = {n: ops.Inspect(tuple((s.id, s.container) for s in ss)) for n, ss in by_node.items()}
    results = yield _named(ops.on("inspect the ranks", inspect, 30), shown)
    if results is None:
        yield _named(ops.on("read the ranks' new log lines", {n: ops.Logs(ss[0].id) for n, ss in by_node.items()},
                            30), shown)
        return None
    states, errors = {}, []
    for n, ss in by_node.items():
        parsed = inspect[n].parse(results[n])
        for s in ss:
            if isinstance(parsed, ops.NodeError):
                errors.append((s.rank, n, parsed))
            else:
                states[s.rank] = (n, parsed[s.id])
    wanted = [s for s in ctx.started if s.rank in states and states[s.rank][1].status != "missing"]
    reads, rank_of = {}, {}
    for s in wanted:  # one log command per node (one rank per node in every lane sparkfleet runs)
        seen = ctx.log_facts.setdefault(s.rank, LogFacts()).lines_seen
        reads[s.node] = ops.Logs(s.id, seen)
        rank_of[s.node] = s.rank
    logs = yield ops.on("read the ranks' new log lines", reads, 30)
    for n, res in logs.items():
        rank = rank_of[n]
        lines = reads[n].parse(res)
        if isinstance(lines, ops.NodeError):
            if lines.kind == "no-such-container":  # gone between the two commands
                states[rank] = (n, ops.ContainerState("missing"))
            else:
                errors.append((rank, n, lines))
            continue
        tail = ctx.logs_tail.setdefault(rank, [])
        tail.extend(lines)
        del tail[:-LOG_TAIL]
        vocab = engine_for(ctx.profile.engine).log_for(ctx.profile)  # the image's version, the profile's lines
        feed(ctx.log_facts[rank], lines, ctx.profile.fatal_signatures, vocab)
    return states, errors


def _named(op: NodeCommands, placeholders: bool) -> NodeCommands:
    """`op`, marked when it names placeholder ids (never run under --dry-run, not even =facts)."""
    op.placeholders = placeholders
    return op


LAST_WORD_CHARS = 300  # of a gone rank's last log line, in the failure it is named in


def launch_failure(ctx: RunContext, states: dict) -> tuple[int, str, str] | None:
    """(rank, node, why) when the launch has failed, naming the rank that failed (not a peer that noticed
    later): ranks that are gone (vanished, exited, dead) first, with their own fatal line when they logged one."""
    gone = sorted(r for r, (_, s) in states.items() if s.status in ("exited", "dead", "missing"))
    fatal = sorted(r for r, lf in ctx.log_facts.items() if lf.fatal)
    for rank in gone + [r for r in fatal if r not in gone]:
        node = states[rank][0] if rank in states else next(s.node for s in ctx.started if s.rank == rank)
        lf = ctx.log_facts.get(rank)
        if lf and lf.fatal:
            detail = f" ... {lf.fatal_detail}" if lf.fatal_detail else ""
            return rank, node, f"rank {rank} logged a fatal line: {lf.fatal}{detail} (on {node})"
        s = states[rank][1]
        if s.status == "missing":
            return rank, node, f"rank {rank} on {node} vanished (docker no longer knows its container)"
        code = f" with code {s.exit_code}" if s.exit_code is not None else ""
        # the rank's own last word, where it logged one: an engine refusing its arguments says why only there
        # (vLLM's usage error: "vllm serve: error: unrecognized arguments: ...", exit 2, no fatal signature)
        last = next((line.strip() for line in reversed(ctx.logs_tail.get(rank, [])) if line.strip()), "")
        said = f": {last[-LAST_WORD_CHARS:]}" if last else ""
        return rank, node, f"rank {rank} on {node} {s.status}{code}{said}"
    return None


def stop_launch_commands(ctx: RunContext) -> NodeCommands:
    """Stop every rank this run started (they stay, stopped, for inspection)."""
    return ops.on("stop every rank of this launch",
                  {n: ops.Stop(tuple(s.id for s in ss), remove=False) for n, ss in _by_node(ctx.started).items()}, 120)


def stop_run(ctx: RunContext) -> StepGen:
    """Stop every container of this run on every node of the lane, found by the run's label (not only what
    ctx.started recorded: a Ctrl-C inside a launch wave comes back after each node's `docker run` ended, but
    before the wave's ranks were recorded). Returns the nodes that could not be asked, with why."""
    if ctx.inventory.launcher == "slurm":  # the run's job (maybe still pending): its traps remove the ranks
        return (yield from slurm_launch.cancel_run(ctx))
    mine = ops.LaneContainers(ctx.profile.name, running_only=False, run_id=ctx.record.run_id)
    listed = yield ops.on("list this run's containers", {n.name: mine for n in ctx.nodes}, 30)
    found, lost = {}, {}
    for n, res in (listed or {}).items():
        ids = mine.parse(res)
        if isinstance(ids, ops.NodeError):
            lost[n] = ids.message
            ids = []
        ids = list(dict.fromkeys([*ids, *(s.id for s in _by_node(ctx.started).get(n, []) if n not in lost)]))
        if ids:
            found[n] = ids
    if found:
        stopped = yield ops.on("stop every rank of this run", {
            n: ops.Stop(tuple(ids), remove=False) for n, ids in found.items()}, 120)
        for e in ops.failures(stopped or {}):
            lost[e.node or "?"] = e.message
    return lost


def stopped_every_rank(lost: dict[str, str]) -> str:
    """What a failed or interrupted run's reason ends with once stop_run is done: the nodes that could not be
    asked named, as a rank of the run may still run there."""
    said = "; every rank of this launch was stopped"
    if lost:
        said += (" but on " + ", ".join(f"{n} ({why})" for n, why in lost.items())
                 + ", which could not be asked: a rank of this run may still run there")
    return said


def stop_launch(ctx: RunContext) -> dict[str, str]:
    """stop_run now (a failed gate, Ctrl-C): the nodes that could not be asked, with why."""
    return ctx.executor.drive(stop_run(ctx))
