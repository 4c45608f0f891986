"""Training side: tiny models, samples, advantages, losses, trainer step, weight publishing. torch lives here."""

__all__: list[str] = []
