"""Run a set of gates against an endpoint, and the `gates` step of `up`.

The default set follows the profile: image only with vision, tools only with tools, auth only with
an API key; the others always. Gates left out for that reason are reported as skipped with why.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from sparkfleet.gates import auth, count, determinism, image, models, needle, reasoning, soak, streaming, tools
from sparkfleet.gates.client import ApiClient, RequestFailed
from sparkfleet.gates.env import NEEDLE_LONG, GateEnv, GateOptions
from sparkfleet.gates.result import Check, GateResult
from sparkfleet.redact import redact
from sparkfleet.schema.profile import Profile

# In the order they run: cheap and decisive first, the soak last.
GATES: dict[str, Callable[[GateEnv], GateResult]] = {
    "models": models.run,
    "count100": count.run,
    "needle": needle.run,
    "image": image.run,
    "tools": tools.run,
    "reasoning": reasoning.run,
    "streaming": streaming.run,
    "auth": auth.run,
    "determinism": determinism.run,
    "soak": soak.run,
}


class GateSetupError(ValueError):
    """The gates cannot run as asked (unknown gate, missing API key): a user error, not a gate failure."""


def left_out(profile: Profile) -> dict[str, str]:
    """Gates the profile's default set leaves out, with why."""
    out = {}
    if not profile.vision:
        out["image"] = "the profile has vision off (text-only lane)"
    if not profile.tools:
        out["tools"] = "the profile has tools off (no tool parser)"
    if not profile.api_key_env:
        out["auth"] = "the profile sets no API key (api_key_env)"
    return out


def default_gates(profile: Profile) -> list[str]:
    """The profile's gate set: image only with vision, tools only with tools, auth only with an API key."""
    skip = left_out(profile)
    return [n for n in GATES if n not in skip]


def parse_only(text: str | list[str] | None) -> list[str] | None:
    """'count100,needle' or a list -> gate names in run order; unknown names are refused."""
    if text is None:
        return None
    names = [s.strip() for s in (text.split(",") if isinstance(text, str) else text) if str(s).strip()]
    unknown = [n for n in names if n not in GATES]
    if unknown or not names:
        raise GateSetupError(f"unknown gate(s) {', '.join(unknown) or '(none given)'}; gates: {', '.join(GATES)}")
    return [n for n in GATES if n in names]


def api_key_for(profile: Profile) -> str | None:
    """The key from the env var the profile names; refused when the profile names one that is unset."""
    if not profile.api_key_env:
        return None
    key = os.environ.get(profile.api_key_env)
    if not key:
        raise GateSetupError(f"profile {profile.name} serves with an API key from ${profile.api_key_env}, "
                             "which is not set here; export it and run again")
    return key


def _scrub(result: GateResult, secret: str | None) -> GateResult:
    """The key never leaves in evidence, even when an endpoint echoes it back."""
    if not secret:
        return result
    secrets_ = {secret}
    result.summary = redact(result.summary, secrets_)
    for c in result.checks:
        c.sent, c.got, c.why = (redact(x, secrets_) for x in (c.sent, c.got, c.why))
    result.data = redact(result.data, secrets_)
    return result


def run_gates(base_url: str, profile: Profile, only: list[str] | None = None, options: GateOptions | None = None,
              *, on_result: Callable[[GateResult], None] | None = None, on_start: Callable[[str], None] | None = None,
              client: ApiClient | None = None) -> list[GateResult]:
    """Run the gates (in GATES order) and return one result each; `on_result` sees each as it finishes."""
    options = options or GateOptions()
    if profile.api_key_env and options.api_key is None:
        options = replace(options, api_key=api_key_for(profile))
    names = only if only is not None else list(GATES)
    skip = {} if only is not None else left_out(profile)
    own = client is None
    client = client or ApiClient(base_url, options.api_key, timeout_s=options.timeout_s)
    results: list[GateResult] = []
    try:
        model = profile.served_names[0] if profile.served_names else _first_model(client)
        env = GateEnv(client, model, list(profile.served_names), profile.vision, profile.tools, profile.api_key_env,
                      options)
        for name in names:
            if on_start and name not in skip:
                on_start(name)
            t0 = time.monotonic()
            if name in skip:
                result = GateResult(name, "skip", skip[name])
            elif model is None:
                result = GateResult(name, "fail", "no model to ask: the profile has no served_names and "
                                    "/v1/models lists none", [Check("model", False, sent="GET /v1/models",
                                                                    why="no model id")])
            else:
                try:
                    result = GATES[name](env)
                except RequestFailed as exc:  # outside a check: e.g. the endpoint went away between checks
                    result = GateResult(name, "fail", str(exc), [Check(name, False, why=str(exc))])
                except Exception as exc:  # a gate bug must not hide the other gates' verdicts or the run record
                    why = f"the gate itself crashed (a sparkfleet bug): {type(exc).__name__}: {exc}"
                    result = GateResult(name, "fail", why, [Check(name, False, why=why)])
            result.elapsed_s = result.elapsed_s or time.monotonic() - t0
            result = _scrub(result, options.api_key)
            results.append(result)
            if on_result:
                on_result(result)
    finally:
        if own:
            client.close()
    return results


def _first_model(client: ApiClient) -> str | None:
    try:
        listed = client.models()
    except RequestFailed:
        return None
    return str(listed[0].get("id")) if listed else None


def summary(results: list[GateResult]) -> str:
    counts = {s: sum(1 for r in results if r.status == s) for s in ("pass", "fail", "skip")}
    text = f"{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped"
    failed = [r.name for r in results if r.status == "fail"]
    return text + (f" ({', '.join(failed)})" if failed else "")


# -- gate options from a playbook step's args -------------------------------------------------------------------------

STEP_ARGS = {"only", "soak_minutes", "soak_streams", "needle_tokens", "long", "determinism_prompts"}


def profile_args(profile: Profile) -> dict[str, Any]:
    """The profile's own gate set as step args (a playbook's or the command line's args override them)."""
    return profile.gates.model_dump(exclude_none=True)


def options_from_args(args: dict[str, Any]) -> tuple[list[str] | None, GateOptions]:
    """A playbook step's args (only, soak_minutes, soak_streams, needle_tokens, long) as gate options."""
    unknown = sorted(set(args) - STEP_ARGS)
    if unknown:
        raise GateSetupError(f"unknown gates argument(s) {', '.join(unknown)} (known: {', '.join(sorted(STEP_ARGS))})")
    opts = GateOptions()
    try:
        if "soak_minutes" in args:
            opts.soak_seconds = float(args["soak_minutes"]) * 60
        if "soak_streams" in args:
            opts.soak_streams = int(args["soak_streams"])
        if "determinism_prompts" in args:
            opts.determinism_prompts = int(args["determinism_prompts"])
        if args.get("long"):
            opts.needle_tokens = NEEDLE_LONG
        if "needle_tokens" in args:
            value = args["needle_tokens"]
            opts.needle_tokens = tuple(int(v) for v in (value if isinstance(value, list) else [value]))
        opts.__post_init__()
    except (TypeError, ValueError) as exc:
        raise GateSetupError(f"gates arguments: {exc}") from None
    return parse_only(args.get("only")), opts


__all__ = ["GATES", "GateSetupError", "default_gates", "left_out", "options_from_args", "parse_only",
           "run_gates", "summary"]
