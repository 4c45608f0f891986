"""The recording proxy: agent dialects in, token ids to the engine, traces out."""

__all__: list[str] = []
