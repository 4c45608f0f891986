"""`hrl export TRACES|RUN --format atif|otlp-json`: traces in the formats other tools read. ATIF (Harbor's Agent
Trajectory Interchange Format): one trajectory file per trace, decoded to text, sub-agents as embedded
sub-trajectories, each checked against the ATIF schema. OTLP/JSON: one ExportTraceServiceRequest file per trace
file, the spans the live OTLP exporter sends (`gen_ai.*`, `rl.*`, no token ids)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from hrl.cli.options import DecodeModelOption
from hrl.cli.output import emit, say

__all__ = ["EPILOG", "FORMATS", "export"]

FORMATS = ("atif", "otlp-json")

EPILOG = """Examples:

  hrl export traces.jsonl --format atif --out atif/          # one ATIF trajectory per trace: atif/<trace_id>.json

  hrl export runs/demo --format atif -m Qwen/Qwen3-8B         # every iteration of a run, decoded with that tokenizer

  hrl export traces.jsonl --format atif --token-ids           # + each call's token ids and logprobs

  hrl export runs/demo --format otlp-json --out otlp/         # OTLP/JSON spans, one file per trace file

  hrl export traces.jsonl --format otlp-json --json | jq '.files[]'
"""


def export(
    sources: Annotated[
        list[Path],
        typer.Argument(
            metavar="TRACES...|RUN_DIR", help="hrl.trace/1 JSONL files (or a folder of them), or a run directory."
        ),
    ],
    fmt: Annotated[str, typer.Option("--format", "-f", help="atif | otlp-json.")] = "atif",
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder to write into (created if missing).")] = Path(
        "export"
    ),
    model: DecodeModelOption = None,
    token_ids: Annotated[
        bool, typer.Option("--token-ids", help="atif: also each call's prompt and completion ids and logprobs.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON summary (format, out, files, traces).")] = False,
) -> None:
    """Write traces as ATIF trajectories or as OTLP/JSON spans. ATIF: each model call an agent step (reply text,
    reasoning, tool calls, token counts), tool results its observation, sub-agents embedded sub-trajectories, reward
    and success in the final metrics; every file is validated against the ATIF v1.8 schema. OTLP/JSON: an episode
    span per trace with a child per model call and tool event (gen_ai.* and rl.* attributes, never token ids), the
    same spans `--otlp` sends live."""
    from hrl.cli import __version__
    from hrl.cli.report import warn_cut_lines
    from hrl.runners.errors import UsageError
    from hrl.runners.report.export import export_run
    from hrl.runners.report.run import load_source

    if fmt not in FORMATS:
        raise UsageError(
            f"unknown --format {fmt!r}: one of {', '.join(FORMATS)}", hint="`hrl export TRACES --format atif`"
        )
    if (model or token_ids) and fmt != "atif":
        raise UsageError("--model and --token-ids apply to --format atif only", hint="drop them for --format otlp-json")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a folder", hint="give a folder for --out (created if missing)")
    run = load_source(sources)
    warn_cut_lines(run)
    summary = export_run(run, sources, fmt, out, model, token_ids, __version__, say)  # no trace: exit 1, nothing made
    emit(summary, as_json=as_json, human=_human(summary))


def _human(s: dict[str, Any]) -> str:
    what = "ATIF trajectories" if s["format"] == "atif" else "OTLP/JSON files"
    line = f"wrote {len(s['files'])} {what} ({s['traces']} traces) to {s['out']}"
    if s["format"] == "atif":
        line += f", each valid {s['schema_version']}" + ("" if s["schema_checked"] else " (rules only: no jsonschema)")
    return line
