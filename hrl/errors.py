"""The base of every hrl domain error, and the one error of a registry lookup.

They live beside the `hrl` facade, below every layer, so that every layer can raise them (`hrl.registry`, the
one registry lookup, sits here too); `hrl.runners.errors` re-exports them, so `HrlError` and `UnknownNameError` are one class each wherever they are
imported from, and the CLI maps them in one table.
"""

from __future__ import annotations

__all__ = ["HrlError", "UnknownNameError", "UsageError"]


class HrlError(Exception):
    """Base class: `hint` is one line telling the user what to do about it."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


class UsageError(HrlError):
    """An argument the user gave is wrong: a name, a path, a config key or value. The CLI exits 2 for it."""


class UnknownNameError(UsageError, KeyError):
    """A registry lookup (sandbox, engine, agent, verifier, dialect) named something that does not exist; the
    message lists the valid names. A KeyError too, so a caller that looks names up like a dict still catches it."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])
