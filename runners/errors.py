"""Domain errors of the rollout side. Each names the object that failed and, where known, the fix.

Library code raises these; only the CLI turns them into `Error: … / Hint: …` lines and exit codes.
"""

from __future__ import annotations

__all__ = [
    "ContextLengthError",
    "EngineError",
    "EngineStartError",
    "HrlError",
    "ModelNotFoundError",
    "PortInUseError",
    "PrerequisiteError",
    "UnknownNameError",
]


class HrlError(Exception):
    """Base class: `hint` is one line telling the user what to do about it."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


class UnknownNameError(HrlError, KeyError):
    """A registry lookup (engine, agent, sandbox, verifier, recipe) named something that does not exist."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class ModelNotFoundError(HrlError):
    """A model id or path could not be resolved to files on this machine."""


class PrerequisiteError(HrlError):
    """Something the command needs is not installed or not running (docker, vLLM, a GPU)."""


class EngineStartError(HrlError):
    """An inference engine failed to start or never became healthy."""


class PortInUseError(HrlError):
    """A TCP port asked for is already bound by another process."""


class EngineError(HrlError):
    """A running engine failed a request (died, answered with an error, timed out)."""


class ContextLengthError(EngineError):
    """A prompt (plus the tokens asked for) does not fit the model's context window."""
