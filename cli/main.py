"""`hrl`: the command tree. Heavy modules (torch, transformers, aiohttp) are imported inside commands only,
so `hrl --help` and `hrl --version` stay fast."""

from __future__ import annotations

import os
import signal
import sys
from typing import Annotated, Any

import click
import typer

from hrl.cli import __version__
from hrl.cli.errors import EXIT_INTERRUPTED, report

__all__ = ["app", "main", "run"]


def _click_classes(name: str) -> tuple[type[BaseException], ...]:
    """`click.<name>` and, where typer ships its own copy of click (typer >= 0.26), that copy's class too: typer's
    BadParameter and Abort come from the copy, and catching only click's would turn usage errors into 'a bug'."""
    classes: list[type[BaseException]] = [vars(click.exceptions)[name]]
    try:
        from typer._click import exceptions as bundled  # type: ignore[import-not-found]
    except ImportError:
        return tuple(classes)
    if vars(bundled).get(name) not in (None, *classes):
        classes.append(vars(bundled)[name])
    return tuple(classes)


_EXIT, _CLICK_ERROR, _ABORT = _click_classes("Exit"), _click_classes("ClickException"), _click_classes("Abort")
_NO_ARGS = _click_classes("NoArgsIsHelpError") if hasattr(click.exceptions, "NoArgsIsHelpError") else ()


def command_path(ctx: Any) -> str:
    """`hrl <group> <command>` of a click context, whatever the program was called (`python -m hrl.cli`)."""
    names = []
    while ctx is not None and ctx.parent is not None:
        names.append(ctx.info_name)
        ctx = ctx.parent
    return " ".join(["hrl", *reversed(names)])


def usage_error(e: Any) -> int:
    """A click usage error (bad flag, missing argument, `typer.BadParameter`) as our `Error:` and `Hint:` lines."""
    if isinstance(e, _NO_ARGS):  # `hrl tasks` alone: the group's help is the answer
        e.show()
        return int(e.exit_code)
    from hrl.cli.errors import say_error

    message = e.format_message().removeprefix("Invalid value: ")
    say_error(message, f"`{command_path(vars(e).get('ctx'))} --help` shows its usage and examples")
    return int(e.exit_code)


app = typer.Typer(
    name="hrl",
    help="Harnessed agentic RL: train LLM agents through the harness they are deployed with.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    pretty_exceptions_show_locals=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"hrl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", "-V", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Harnessed agentic RL: train LLM agents through the harness they are deployed with."""


def _register() -> None:
    from hrl.cli import (
        agents,
        clientkeys,
        doctor,
        evaluation,
        export,
        inspect,
        models,
        recipes,
        regrade,
        report,
        rollout,
        sandbox,
        serve,
        tasks,
        top,
        train,
    )

    app.add_typer(models.app, name="models")
    app.add_typer(agents.app, name="agents")
    app.add_typer(tasks.app, name="tasks")
    app.add_typer(sandbox.app, name="sandbox")
    app.add_typer(recipes.app, name="recipes")
    app.add_typer(clientkeys.app, name="keys")
    app.command("serve", epilog=serve.EPILOG)(serve.serve)
    app.command("rollout", epilog=rollout.EPILOG)(rollout.rollout)
    app.command("train", epilog=train.EPILOG)(train.train)
    app.command("eval", epilog=evaluation.EPILOG)(evaluation.eval_)
    app.command("inspect", epilog=inspect.EPILOG)(inspect.inspect)
    app.command("report", epilog=report.EPILOG)(report.report)
    app.command("regrade", epilog=regrade.EPILOG)(regrade.regrade)
    app.command("export", epilog=export.EPILOG)(export.export)
    app.command("doctor", epilog=doctor.EPILOG)(doctor.doctor)
    app.command("top", epilog=top.EPILOG)(top.top)


_register()


def main() -> None:
    """Console entry point: `run`, then an exit with its code and nothing after it. The exit handlers run (Ray's
    shutdown, logging's flush) and the output is flushed, but not the interpreter's teardown: a native thread still
    inside torch at that point (an engine's last step) made a finished run exit 134 ('terminate called without an
    active exception') after its traces were written. A finished run exits with the code it chose."""
    code = run()
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`hrl … | head`): nothing more to say there
            pass
    os._exit(code)


def run() -> int:
    """Run the app (argv from sys.argv) and map every exception to one error line and an exit code, returned."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # our own progress goes to stderr via rich
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    # `kill PID` (a scheduler, `timeout`, a supervisor) stops a command the way Ctrl-C does: episodes end as
    # cancelled traces, sandboxes and engines are cleaned up, exit 130; without this, SIGTERM orphans agents.
    # A shell's `cmd &` starts hrl with SIGINT ignored, which would disable that path too: restore it.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: signal.raise_signal(signal.SIGINT))
    try:
        rc = app(standalone_mode=False)
    except _EXIT as e:
        rc = e.exit_code  # type: ignore[attr-defined]
    except _CLICK_ERROR as e:
        rc = usage_error(e)
    except (KeyboardInterrupt, *_ABORT):
        rc = EXIT_INTERRUPTED
    except Exception as e:
        rc = report(e)
    return rc if isinstance(rc, int) else 0
