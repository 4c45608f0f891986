"""hrl: harnessed agentic RL. The subpackages are the repository's top-level folders (`hrl.cli`, `hrl.runners`,
…); this module is the facade white-box agents import: `async with hrl.session(...) as s`, `hrl.current_session()`.
"""

from pathlib import Path as _Path

# In a source checkout (an editable install, the development shim, pytest from the repository root) the
# subpackages are this folder's siblings: find them there, so `hrl.cli` is always this checkout's.
_root = _Path(__file__).resolve().parent.parent
if (_root / "pyproject.toml").is_file() and (_root / "runners" / "whitebox").is_dir():
    __path__.append(str(_root))

from hrl.runners.whitebox import (  # noqa: E402
    NoSessionError,
    SessionAPIError,
    WhiteboxSession,
    current_session,
    session,
)

__all__ = ["NoSessionError", "SessionAPIError", "WhiteboxSession", "current_session", "session"]
