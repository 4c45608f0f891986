"""Domain errors of the rollout side. Each names the object that failed and, where known, the fix.

Library code raises these; only the CLI turns them into `Error: … / Hint: …` lines and exit codes. `HrlError`
(the base) and `UnknownNameError` (any registry lookup) are defined in `hrl.errors`, the lowest layer,
so that sandboxes raise them too; they are re-exported here as the same classes.
"""

from __future__ import annotations

from hrl.errors import HrlError, UnknownNameError, UsageError

__all__ = [
    "BatchFailedError",
    "ChecksumError",
    "ClientError",
    "ContextLengthError",
    "EngineError",
    "EngineStartError",
    "HrlError",
    "ModelNotFoundError",
    "PortInUseError",
    "PrerequisiteError",
    "UnknownNameError",
    "UsageError",
]


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


class BatchFailedError(HrlError):
    """Every episode of a training batch failed in the machinery (no agent reached the model, every sandbox
    failed): there is nothing to train on, and a run that stepped on nothing would only look as if it worked."""


class ClientError(HrlError):
    """An online run's client request refused (`runners.online`): `status` is the HTTP answer the proxy gives."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ChecksumError(HrlError):
    """A downloaded or cached file does not match the sha256 hrl pins for it (a tampered or corrupt file, or another
    release than the pinned one): nothing is built from it."""
