"""Options several commands share, stated once so their flag and help read the same everywhere."""

from __future__ import annotations

from typing import Annotated

import typer

__all__ = ["DecodeModelOption", "OtlpOption"]

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
