"""hrl command-line interface: the composition root (parses, renders, maps errors to exit codes)."""

__all__ = ["__version__"]

try:
    from importlib.metadata import version as _version

    __version__ = _version("hrl")
except Exception:  # running from a source tree that is not installed
    __version__ = "0+unknown"
