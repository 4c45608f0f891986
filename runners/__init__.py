"""Rollout side: trace schema, recording proxy, engine clients, agent runners, verifiers. No torch here."""

__all__: list[str] = []
