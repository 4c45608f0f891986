"""`hrl doctor`: what hrl can use on this machine."""

from __future__ import annotations

from typing import Annotated

import typer

from hrl.cli.output import emit

__all__ = ["EPILOG", "doctor"]

EPILOG = """Examples:

  hrl doctor

  hrl doctor --json | jq '.[] | select(.ok | not)'
"""


def doctor(as_json: Annotated[bool, typer.Option("--json", help="Print the checks as a JSON array.")] = False) -> None:
    """Check the pieces hrl uses (torch, transformers, peft, Docker daemon, vLLM) and say what each enables."""
    from dataclasses import asdict

    from hrl.runners.doctor import run_checks

    checks = run_checks()
    human = "\n".join(f"{'✓' if c.ok else '✗'} {c.name:<13} {c.detail}  ({c.required_for})" for c in checks)
    emit([asdict(c) for c in checks], as_json=as_json, human=human)
    if not all(c.ok for c in checks):
        raise typer.Exit(4)
