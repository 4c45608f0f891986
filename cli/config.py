"""`--model hrl:NAME` made real: hrl's own models built, or pretrained ones fetched, with their progress shown. The
resolution of recipe, `-c` and flags is `hrl.runners.recipe_config`'s."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hrl.runners.errors import UsageError

if TYPE_CHECKING:
    from hrl.config import RunConfig

__all__ = ["materialize_checked", "materialize_model"]


def materialize_model(name: str) -> str:
    """`hrl:tiny` / `hrl:tiny-agent` name hrl's own local models: built once (deterministically) into the cache; the
    demo recipe ships its tiny-agent build, which is copied instead. `hrl:NAME` of a pretrained model in `hrl models
    ls` (`hrl:smollm2-135m`) is fetched and converted into the cache on first use (`hrl models get NAME`).
    Anything else is returned as given (an HF id or a path)."""
    if not name.startswith("hrl:"):
        return name
    from hrl.cli.output import say
    from hrl.train.pretrained import CATALOGUE, cache_root
    from hrl.train.tiny.build import tiny_once

    kind = name.removeprefix("hrl:")
    if kind in CATALOGUE:  # a build of any dtype in the default folder will do
        from hrl.cli.pretrained import get_showing_progress

        return str(get_showing_progress(kind, dtype=None)["path"])
    out = cache_root() / "models" / kind
    if kind == "tiny-agent":  # a no-op when `out` holds this exact build; rebuilt when the recipe's data changed
        from hrl.cli.models import build_tiny_agent_showing_progress

        return str(build_tiny_agent_showing_progress(out))
    if kind != "tiny" and not (out / "config.json").is_file():
        valid = ", ".join(f"hrl:{n}" for n in ["tiny", "tiny-agent", *CATALOGUE])
        raise UsageError(f"unknown hrl model {name!r}; valid: {valid}", hint="`hrl models ls` lists them")
    return str(tiny_once(out, name, say))


def materialize_checked(cfg: RunConfig) -> str:
    """The run's model made real (`materialize_model`, into `cfg.model`) and checked, then a warning for each of its
    harnesses whose fixed prompt cannot fit the model's context; the model's path."""
    from hrl.cli.output import say
    from hrl.runners.preflight import check_model, harnesses, say_context

    cfg.model = materialize_model(cfg.model)
    check_model(cfg.model)
    for agent in harnesses(cfg):
        say_context(agent, cfg.model, cfg, say)
    return cfg.model
