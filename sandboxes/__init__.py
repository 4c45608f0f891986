"""Sandbox backends (docker, local). Knows nothing of agents, traces or rewards."""

__all__: list[str] = []
