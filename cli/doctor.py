"""`hrl doctor`: what hrl can use on this machine."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from hrl.cli.output import emit
from hrl.runners.errors import HrlError

if TYPE_CHECKING:
    from hrl.runners.doctor.probe import CheckTimeoutError

__all__ = ["EPILOG", "doctor"]

PublishKinds = Literal["all", "lora", "full"]

EPILOG = """Examples:

  hrl doctor

  hrl doctor --model hrl:tiny                     # also probe the model: tool calls parsed? logprobs raw?

  hrl doctor --model Qwen/Qwen3-8B --engine vllm --no-probe

  hrl doctor --model ./my-model --engine vllm --publish-check   # does a publish reach every token served after it?

  hrl doctor --json | jq '.[] | select(.ok | not)'
"""


def doctor(
    as_json: Annotated[bool, typer.Option("--json", help="Print the checks as a JSON array.")] = False,
    model: Annotated[
        str, typer.Option("--model", "-m", help="Also say which tool-call parser the proxy uses for this model.")
    ] = "",
    tool_parser: Annotated[
        str, typer.Option(help="The proxy.tool_parser to check the model with (auto: detect it).")
    ] = "auto",
    tool_prompt: Annotated[
        str,
        typer.Option(
            help="The proxy.tool_prompt to check the model with: what the proxy does with tools its chat template "
            "cannot show (auto or hermes: the hermes tool prompt; refuse: a 400)."
        ),
    ] = "auto",
    engine: Annotated[
        str, typer.Option(help="Engine the --model probe serves it on: embedded | vllm | URL (default: as hrl serve).")
    ] = "",
    probe: Annotated[
        bool,
        typer.Option(
            help="With --model: serve it and send tool-eliciting requests through the proxy: do its replies parse "
            "into tool calls, and are the logprobs it records raw (re-scored by the engine)?"
        ),
    ] = True,
    publish_check: Annotated[
        bool,
        typer.Option(
            "--publish-check",
            help="With --model: warm the engine's prefix cache with a long prompt, publish a perturbed copy of the "
            "model (a LoRA adapter, then a full checkpoint), and check that a reply on the cached prefix carries the "
            "new version and the new weights' logprobs (max |Δlogp| against a fresh re-score).",
        ),
    ] = False,
    publish_kind: Annotated[
        PublishKinds, typer.Option(help="Which publishes --publish-check tries: lora, full, or both (all).")
    ] = "all",
    timeout: Annotated[
        float,
        typer.Option(
            min=0,
            help="Seconds each served check (the probe, each publish) may take; 0 = no limit. One that times out ends "
            "the run: the checks done so far are shown with it, and the exit code is 1.",
        ),
    ] = 900,
) -> None:
    """Check the pieces hrl uses (torch, transformers, peft, Docker daemon, vLLM) and say what each enables; with
    --model, also which tool-call parser the proxy reads that model's tool calls with, whether its chat template
    shows tools (where it cannot: the proxy's hermes tool prompt shows them, or they are refused, as --tool-prompt
    says; refused is shown with `!`), and (unless --no-probe) what
    the served model does: tool calls its parser reads, raw logprobs. Exit 4 when a prerequisite is missing or the
    logprobs are not raw; a model that calls no tool is shown with `!`; exit 1 when a check timed out."""
    from hrl.runners.doctor.checks import run_checks, tool_parser_check, tool_prompt_check
    from hrl.runners.proxy.toolparsers import check_name

    check_name(tool_parser)  # an unknown name is a usage error (exit 2), not a failed check
    from hrl.runners.proxy.toolprompt import TOOL_PROMPTS

    if tool_prompt not in TOOL_PROMPTS:
        from hrl.runners.errors import UsageError

        raise UsageError(f"unknown --tool-prompt {tool_prompt!r}", hint="use --tool-prompt auto, hermes or refuse")
    checks = run_checks()
    if model:
        from hrl.cli.config import materialize_model

        path = materialize_model(model)
        shown = tool_prompt_check(path, tool_prompt)  # can its template show tools? if not, what the proxy does
        checks += [shown, tool_parser_check(path, tool_parser, shown.figures.get("shows_tools", True))]
        kinds = ("lora", "full") if publish_kind == "all" else (publish_kind,)
        if probe or publish_check:
            from hrl.runners.doctor.probe import CheckTimeoutError

            try:
                options = {"tool_parser": tool_parser, "tool_prompt": tool_prompt}
                checks += _served(path, engine, options, probe, kinds if publish_check else (), timeout)
            except CheckTimeoutError as e:  # the checks done so far, the timed-out one last; then the error
                _show([*checks, *e.checks], as_json)
                raise _timed_out(e) from e
    _show(checks, as_json)
    if not all(c.ok for c in checks if c.blocking):
        raise typer.Exit(4)


def _show(checks: list[Any], as_json: bool) -> None:
    from dataclasses import asdict

    mark = {True: "✓", False: "✗"}
    human = "\n".join(f"{mark[c.ok] if c.ok or c.blocking else '!'} {c.name:<13} {c.detail}  ({c.required_for})"
                      for c in checks)  # fmt: skip
    emit([asdict(c) for c in checks], as_json=as_json, human=human)


def _timed_out(e: CheckTimeoutError) -> HrlError:
    """The error of a check that timed out (exit 1): which, after how long, and what to try."""
    if e.expired:
        hint = f"a loaded machine is slower: re-run with --timeout {2 * e.limit_s:g}, or when the machine is idle"
    else:
        hint = "a loaded machine is slower: re-run when it is idle; HRL_DEBUG=1 shows the call that timed out"
    return HrlError(str(e), hint=hint)


def _served(
    model: str, engine: str, options: dict[str, Any], probe: bool, publish: tuple[str, ...], limit_s: float
) -> list[Any]:
    """The served-model probe and publish checks (runners/doctor/), on `engine` (checked first: a bad name is a
    usage error); each within `limit_s` seconds (CheckTimeoutError)."""
    import asyncio

    from hrl.cli.checks import check_engine, check_model
    from hrl.cli.serve import default_engine
    from hrl.runners.doctor.probe import served_checks

    engine = engine or default_engine()
    check_engine(engine)
    check_model(model)
    return asyncio.run(
        served_checks(model, engine, probe=probe, publish=publish, proxy_options=options, limit_s=limit_s)
    )
