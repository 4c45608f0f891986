"""Options several commands share, stated once so their flag and help read the same everywhere."""

from __future__ import annotations

from typing import Annotated

import typer

__all__ = [
    "ConfigOption",
    "DecodeModelOption",
    "EngineOption",
    "IncludeUncheckedOption",
    "LimitOption",
    "OtlpOption",
    "RecipeOption",
    "TimeBudgetOption",
]

OtlpOption = Annotated[
    str,
    typer.Option(
        "--otlp",
        metavar="URL",
        help="Also send each episode (and, in training, each step) as spans over OTLP/HTTP to this collector "
        "(http://host:4318; default: telemetry.otlp_endpoint, else $OTEL_EXPORTER_OTLP_ENDPOINT). docs/telemetry.md.",
    ),
]

DecodeModelOption = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        help="Decode the recorded token ids with this model's tokenizer (default: the run's model, else the one "
        "the traces name; read locally, never downloaded).",
    ),
]

ConfigOption = Annotated[list[str] | None, typer.Option("-c", "--config", help="key=value override or YAML.")]

RecipeOption = Annotated[
    str, typer.Option("--recipe", help="Recipe name or YAML path giving tasks, model and settings.")
]

EngineOption = Annotated[str, typer.Option("--engine", help="embedded | vllm | URL of a running vLLM server.")]

LimitOption = Annotated[int, typer.Option("--limit", min=0, help="Use only the first N tasks; 0 = all.")]

TimeBudgetOption = Annotated[
    float, typer.Option("--time-budget", min=0, help="Seconds per agent run; 0 = the recipe's.")
]

IncludeUncheckedOption = Annotated[
    bool, typer.Option("--include-unchecked", help="Also the tasks `hrl tasks check` found not ok.")
]
