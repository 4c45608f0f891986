"""`hrl doctor`: what hrl can use on this machine."""

from __future__ import annotations

from typing import Annotated

import typer

from hrl.cli.output import emit

__all__ = ["EPILOG", "doctor"]

EPILOG = """Examples:

  hrl doctor

  hrl doctor --model hrl:tiny

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
) -> None:
    """Check the pieces hrl uses (torch, transformers, peft, Docker daemon, vLLM) and say what each enables; with
    --model, also which tool-call parser the proxy would read that model's tool calls with."""
    from dataclasses import asdict

    from hrl.runners.doctor import run_checks, tool_parser_check
    from hrl.runners.proxy.toolparsers import check_name

    check_name(tool_parser)  # an unknown name is a usage error (exit 2), not a failed check
    checks = run_checks()
    if model:
        from hrl.cli.config import materialize_model

        checks.append(tool_parser_check(materialize_model(model), tool_parser))
    human = "\n".join(f"{'✓' if c.ok else '✗'} {c.name:<13} {c.detail}  ({c.required_for})" for c in checks)
    emit([asdict(c) for c in checks], as_json=as_json, human=human)
    if not all(c.ok for c in checks):
        raise typer.Exit(4)
