"""tinker-cookbook's `sl_basic` recipe, run against `hrl serve --tinker` on a local model (docs/tinker.md).

The recipe's own settings (learning rate 2e-4, linear decay, one epoch, evaluation every 8 steps, loss on every
assistant message, its supervised `train.main`), with the two swaps the recipe's source itself names for a model or a
dataset it does not know: the renderer by name (its registry knows hub names, not a local folder), and the
conversations file the cookbook ships (`example_data/conversations.jsonl`, 128 chats) in place of
HuggingFaceH4/no_robots, a download. Any `key=value` after the three arguments overrides the recipe's config (chz).

    export TINKER_API_KEY=tml-<key>     # hrl keys add NAME --run-dir runs/tinker
    python examples/tinker/sl_basic.py MODEL_DIR http://127.0.0.1:8100 runs/sl-basic [renderer_name=…] [learning_rate=…]
"""

import asyncio
import sys
from importlib.resources import files

import chz
from tinker_cookbook.renderers import TrainOnWhat
from tinker_cookbook.supervised import train
from tinker_cookbook.supervised.data import FromConversationFileBuilder
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

RENDERER = "qwen3_instruct"  # ChatML without thinking: hrl's tiny models and Qwen/SmolLM2-style templates


def main(model: str, base_url: str, log_path: str, overrides: list[str]) -> None:
    renderer = next((a.split("=", 1)[1] for a in overrides if a.startswith("renderer_name=")), RENDERER)
    common = ChatDatasetBuilderCommonConfig(
        model_name_for_tokenizer=model,
        renderer_name=renderer,
        max_length=512,
        batch_size=16,
        train_on_what=TrainOnWhat.ALL_ASSISTANT_MESSAGES,
    )
    data = FromConversationFileBuilder(
        common_config=common,
        test_size=16,
        file_path=str(files("tinker_cookbook") / "example_data" / "conversations.jsonl"),
    )
    blueprint = chz.Blueprint(train.Config).apply({
        "log_path": log_path, "model_name": model, "recipe_name": "recipe_sl_basic", "renderer_name": renderer,
        "dataset_builder": data, "learning_rate": 2e-4, "lr_schedule": "linear", "num_epochs": 1, "eval_every": 8,
        "lora_rank": 8, "base_url": base_url,
    })  # fmt: skip
    asyncio.run(train.main(blueprint.make_from_argv(overrides)))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
