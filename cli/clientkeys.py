"""`hrl keys`: client keys of an online run (`hrl train --serve`, docs/online.md). A client key opens sessions and
ends and rewards its own; it never publishes, pauses, lists or ends another's. (Config override keys are
`hrl.runners.recipe_keys`.)"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hrl.cli.output import emit, say
from hrl.runners.errors import UsageError

__all__ = ["app"]

app = typer.Typer(help="Client keys of an online run (hrl train --serve).", no_args_is_help=True)

_RunDir = Annotated[Path | None, typer.Option("--run-dir", help="The run the key is for (its client_keys.json).")]
_KeysFile = Annotated[
    Path | None, typer.Option("--keys-file", help="A keys file instead (give it to the run: -c online.keys_file=F).")
]


@app.command(
    "add",
    epilog="Examples:\n\n  hrl keys add fleet-a --run-dir runs/online      # prints the key once; the run reads it at once\n\n"
    "  hrl keys add ci --keys-file ./client_keys.json   # a keys file of its own: -c online.keys_file=./client_keys.json"
    "\n\n  hrl keys add bot --run-dir runs/online --json",
)
def add(
    name: Annotated[str, typer.Argument(help="The key's name (traces say metadata.online.client = NAME).")],
    run_dir: _RunDir = None,
    keys_file: _KeysFile = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print {name, key, file, tinker_api_key} as JSON.")] = False,
) -> None:
    """Add a client key and print it (once: the file keeps only its digest)."""
    from hrl.runners.online.keys import add_key, keys_path

    path = keys_path(run_dir, keys_file)
    key = add_key(path, name)
    say(f"client key {name} added to {path}: send it as Authorization: Bearer <key>")
    say(f"for the tinker SDK (hrl serve --tinker): api_key='tml-{key}' (the SDK wants the tml- prefix)")
    emit({"name": name, "key": key, "file": str(path), "tinker_api_key": f"tml-{key}"}, as_json=as_json, human=key)


@app.command(
    "ls", epilog="Examples:\n\n  hrl keys ls --run-dir runs/online\n\n  hrl keys ls --run-dir runs/online --json"
)
def ls(
    run_dir: _RunDir = None,
    keys_file: _KeysFile = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON array of names.")] = False,
) -> None:
    """List the client keys' names (the keys themselves are not kept)."""
    from hrl.runners.online.keys import ClientKeys, keys_path

    path = keys_path(run_dir, keys_file)
    if not path.is_file():
        raise UsageError(f"no client keys yet: {path} does not exist", hint="add one: hrl keys add NAME (same flags)")
    names = ClientKeys(path).names()
    emit(names, as_json=as_json, human="\n".join(names))
