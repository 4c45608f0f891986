"""Training side: samples, advantages, losses, trainer step, weight publishing; torch lives here. `tiny/`: the
demo-model wing (tiny models, the CPU demo's agent model), which the rest of this layer never imports."""

__all__: list[str] = []
