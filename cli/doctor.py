"""`hrl doctor`: what hrl can use on this machine."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import typer

from hrl.cli.output import emit

__all__ = ["EPILOG", "doctor"]

PublishKinds = Literal["all", "lora", "full"]

EPILOG = """Examples:

  hrl doctor

  hrl doctor --model hrl:tiny                     # also probe the model: tool calls parsed? logprobs raw?

  hrl doctor --model Qwen/Qwen3-8B --engine vllm --no-probe

  hrl doctor --model ./my-model --engine vllm --publish-check   # does a publish reach every token served after it?

  hrl doctor --json | jq '.[] | select(.ok | not)'
"""


_Model = Annotated[
    str, typer.Option("--model", "-m", help="Also say which tool-call parser the proxy uses for this model.")
]
_ToolParser = Annotated[str, typer.Option(help="The proxy.tool_parser to check the model with (auto: detect it).")]
_ToolPrompt = Annotated[
    str,
    typer.Option(
        help="The proxy.tool_prompt to check the model with: what the proxy does with tools its chat template "
        "cannot show (auto or hermes: the hermes tool prompt; refuse: a 400)."
    ),
]
_Engine = Annotated[
    str, typer.Option(help="Engine the --model probe serves it on: embedded | vllm | URL (default: as hrl serve).")
]
_Probe = Annotated[
    bool,
    typer.Option(
        help="With --model: serve it and send tool-eliciting requests through the proxy: do its replies parse "
        "into tool calls, and are the logprobs it records raw (re-scored by the engine)?"
    ),
]
_PublishCheck = Annotated[
    bool,
    typer.Option(
        "--publish-check",
        help="With --model: warm the engine's prefix cache with a long prompt, publish a perturbed copy of the "
        "model (a LoRA adapter, then a full checkpoint), and check that a reply on the cached prefix carries the "
        "new version and the new weights' logprobs (max |Δlogp| against a fresh re-score).",
    ),
]
_PublishKind = Annotated[
    PublishKinds, typer.Option(help="Which publishes --publish-check tries: lora, full, or both (all).")
]
_Timeout = Annotated[
    float,
    typer.Option(
        min=0,
        help="Seconds each served check (the probe, each publish) may take; 0 = no limit. One that times out ends "
        "the run: the checks done so far are shown with it, and the exit code is 1.",
    ),
]


def doctor(
    as_json: Annotated[bool, typer.Option("--json", help="Print the checks as a JSON array.")] = False,
    model: _Model = "",
    tool_parser: _ToolParser = "auto",
    tool_prompt: _ToolPrompt = "auto",
    engine: _Engine = "",
    probe: _Probe = True,
    publish_check: _PublishCheck = False,
    publish_kind: _PublishKind = "all",
    timeout: _Timeout = 900,
) -> None:
    """Check the pieces hrl uses (torch, transformers, peft, Docker daemon, vLLM) and say what each enables; with
    --model, also which tool-call parser the proxy reads that model's tool calls with, whether its chat template
    shows tools (where it cannot: the proxy's hermes tool prompt shows them, or they are refused, as --tool-prompt
    says; refused is shown with `!`), and (unless --no-probe) what
    the served model does: tool calls its parser reads, raw logprobs. Exit 4 when a prerequisite is missing or the
    logprobs are not raw; a model that calls no tool is shown with `!`; exit 1 when a check timed out."""
    from hrl.runners.doctor.checks import run_checks, tool_parser_check, tool_prompt_check
    from hrl.runners.preflight import check_tool_prompt
    from hrl.runners.proxy.toolparsers import check_name

    check_name(tool_parser)  # an unknown name is a usage error (exit 2), not a failed check
    check_tool_prompt(tool_prompt)
    checks = run_checks()
    if model:
        from hrl.cli.config import materialize_model

        path = materialize_model(model)
        shown = tool_prompt_check(path, tool_prompt)  # can its template show tools? if not, what the proxy does
        checks += [shown, tool_parser_check(path, tool_parser, shown.figures.get("shows_tools", True))]
        kinds = ("lora", "full") if publish_kind == "all" else (publish_kind,)
        if probe or publish_check:
            from hrl.runners.doctor.probe import CheckTimeoutError, run_served_checks

            try:
                options = {"tool_parser": tool_parser, "tool_prompt": tool_prompt}
                checks += run_served_checks(path, engine, options, probe, kinds if publish_check else (), timeout)
            except CheckTimeoutError as e:  # the checks done so far, the timed-out one last; then the error
                _show([*checks, *e.checks], as_json)
                raise
    _show(checks, as_json)
    if not all(c.ok for c in checks if c.blocking):
        raise typer.Exit(4)


def _show(checks: list[Any], as_json: bool) -> None:
    from dataclasses import asdict

    mark = {True: "✓", False: "✗"}
    human = "\n".join(f"{mark[c.ok] if c.ok or c.blocking else '!'} {c.name:<13} {c.detail}  ({c.required_for})"
                      for c in checks)  # fmt: skip
    emit([asdict(c) for c in checks], as_json=as_json, human=human)
