"""`hrl agents`: the agent CLIs hrl can run — list, install (pinned, cached), and check against a scripted engine."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

import typer

from hrl.cli.output import emit, err
from hrl.runners.scratch import scratch

__all__ = ["app"]

app = typer.Typer(help="Agent CLIs: list, install, check.", no_args_is_help=True)


@app.command("ls", epilog="Examples:\n\n  hrl agents ls\n\n  hrl agents ls --json")
def ls(as_json: Annotated[bool, typer.Option("--json", help="Print a JSON array.")] = False) -> None:
    """List supported agent CLIs with their pinned versions, wire dialect, and where they are installed."""
    from hrl.runners.doctor.agents import agents_table

    rows = agents_table()
    mark = {True: "✓", False: "·"}
    human = "\n".join(
        f"{r['name']:<15} {r['version']:<10} {r['dialect']:<10} docker {mark[bool(r['installed_docker'])]}  "
        f"local {mark[bool(r['installed_local'])]}  ({r['package']})"
        for r in rows
    )
    emit(rows, as_json=as_json, human=human)


app.command("list", hidden=True)(ls)


@app.command(
    "install",
    epilog="Examples:\n\n  hrl agents install mini-swe-agent\n\n  hrl agents install opencode codex --target local",
)
def install(
    names: Annotated[list[str], typer.Argument(help="Agent names (see `hrl agents ls`).")],
    target: Annotated[str, typer.Option(help="docker (mounted into sandboxes) | local.")] = "docker",
    as_json: Annotated[bool, typer.Option("--json", help="Print the installs as JSON.")] = False,
) -> None:
    """Install agent CLIs, pinned, into the cache (HRL_CACHE); a second install is a no-op."""
    from hrl.runners.agents.install import install as do_install
    from hrl.runners.preflight import check_agent, check_sandbox

    for name in names:
        check_agent(name)
    check_sandbox(target, "--target")
    done = []
    for name in names:
        err.print(f"installing {name} for {target} …", markup=False)
        inst = do_install(name, target, on_event=lambda msg: err.print(f"  {msg}", markup=False))  # type: ignore[arg-type]
        done.append({"name": inst.name, "version": inst.version, "target": inst.target, "dir": inst.host_dir})
    emit(done, as_json=as_json, human="\n".join(f"{d['name']} {d['version']} → {d['dir']}" for d in done))


@app.command(
    "doctor",
    epilog="Examples:\n\n  hrl agents doctor\n\n  hrl agents doctor opencode codex --sandbox local\n\n"
    "  hrl agents doctor --json\n\n"
    "  hrl agents doctor --images claude-code codex   # each shows the tiny vision model a PNG it read",
)
def doctor(
    names: Annotated[list[str] | None, typer.Argument(help="Agents to check (default: every installed one).")] = None,
    sandbox: Annotated[str, typer.Option(help="docker | local.")] = "docker",
    model: Annotated[
        str,
        typer.Option(help="Model dir whose template the scripted engine uses (default: tiny; --images: tiny vision)."),
    ] = "",
    images: Annotated[
        bool,
        typer.Option(
            "--images",
            help="Check images instead: each CLI with an image tool writes a PNG and shows it to a vision model; ✓ "
            "when the image reaches the engine as the file's bytes, token-exactly, and is kept for training "
            "(Docker sandboxes).",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the checks as JSON.")] = False,
) -> None:
    """Run each CLI once against a scripted engine through the real proxy: ✓ when it makes a tool call that changes
    a file, answers and exits, with a token-exact trace (--images: when the image it reads reaches the model)."""
    from hrl.runners.doctor.agents import check_names
    from hrl.runners.doctor.agents import doctor as run_doctor
    from hrl.runners.preflight import check_agent, check_model, check_sandbox
    from hrl.train.tiny.build import doctor_model

    for name in names or []:
        check_agent(name)
    check_sandbox(sandbox)
    check_names(names, sandbox, images)  # type: ignore[arg-type]
    if model:
        check_model(model)
    with scratch("doctor") as tmp:  # no --model: a tiny one, built for this check
        model = model or str(doctor_model(tmp, images))
        checks = run_doctor(names, model, sandbox, images=images)  # type: ignore[arg-type]
    human = "\n".join(f"{'✓' if c.ok else '✗'} {c.name:<15} {c.seconds:5.1f}s  {c.reason}" for c in checks)
    emit([asdict(c) for c in checks], as_json=as_json, human=human or "no agents installed: hrl agents install NAME")
    if not all(c.ok for c in checks):
        raise typer.Exit(1)
