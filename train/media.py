"""Images in training: the pixel inputs of a sample whose prompt held images, made as the engine made them.

A sample carries its images as the trace recorded them (`Sample.media`: sha256 and placeholder range, in prompt
order), where their bytes are (`Sample.media_dir`: `media/` beside the trace file) and the settings of the image
processor the engine used (`Sample.image_processor`, recorded per call). `Pixels` rebuilds the model's processor
with those settings, reads each image's bytes, checks that the processor expands each image into exactly the run of
ids the trace holds at its placeholder range (whole, inside the sample: an image is never cut in half), and makes
the pixel inputs of one batch row from all of the sample's images, as the engine did for the call.

`unusable_images` says why a trace's images cannot be trained on (a model without a vision tower, bytes missing
from `media/`); the step leaves such a trace out and counts it (`train/image_traces`).
"""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hrl.runners.engines.images import image_run, load_processor, pixel_inputs
from hrl.runners.errors import HrlError

if TYPE_CHECKING:
    import torch

    from hrl.train.samples import Sample

__all__ = ["MediaError", "Pixels", "unusable_images"]


class MediaError(HrlError):
    """A sample's images cannot be made into the pixels the engine ran: the message names the image and why."""


def unusable_images(trace: dict[str, Any], takes_images: bool, media_dir: str | Path | None) -> str | None:
    """Why the images of `trace` cannot be trained on (None: they can, or it has none): the trainer's model has no
    vision tower, or an image's bytes are not in `media_dir`."""
    shas = {m["sha256"] for c in trace.get("calls") or [] for m in c.get("media") or []}
    if not shas:
        return None
    if not takes_images:
        return "the trainer's model has no vision tower"
    if media_dir is None:
        return "no media directory to read the images' bytes from"
    missing = sorted(s for s in shas if not (Path(media_dir) / s).is_file())
    if missing:
        return f"{Path(media_dir) / missing[0]} is missing ({len(missing)} of {len(shas)} images)"
    return None


class Pixels:
    """Pixel inputs of samples for one model: its processor, rebuilt per recorded image processor settings."""

    def __init__(self, model_path: str) -> None:
        self.path = model_path
        self._base: Any = None
        self._processors: dict[str, Any] = {}

    def processor(self, settings: dict[str, Any] | None) -> Any:
        """The model's processor, its image processor built from `settings` (None: the model's own settings)."""
        if self._base is None:
            self._base = load_processor(self.path)[0]
        key = json.dumps(settings, sort_keys=True)
        if key not in self._processors:
            proc = copy.copy(self._base)
            if settings is not None:
                proc.image_processor = type(self._base.image_processor).from_dict(settings)
            self._processors[key] = proc
        return self._processors[key]

    def of(self, sample: Sample) -> dict[str, torch.Tensor]:
        """One batch row's pixel inputs (e.g. `pixel_values`, `pixel_attention_mask`) for the sample's images."""
        from PIL import Image

        proc = self.processor(sample.image_processor)
        images = []
        for m in sample.media:
            offset, length = m["placeholder"]
            if offset < 0 or offset + length > len(sample.input_ids):
                raise MediaError(f"image {m['sha256'][:12]} at tokens {offset}+{length} is not whole inside the "
                                 f"sample's {len(sample.input_ids)} tokens (an image is never cut)")  # fmt: skip
            path = Path(sample.media_dir or "") / m["sha256"]
            try:
                image = Image.open(io.BytesIO(path.read_bytes())).convert("RGB")
            except OSError as e:
                raise MediaError(f"image {m['sha256'][:12]} of trace {sample.trace_id}: {e}") from None
            run = image_run(proc, image)
            if run != sample.input_ids[offset : offset + length]:
                raise MediaError(
                    f"image {m['sha256'][:12]} of trace {sample.trace_id}: the processor expands it into {len(run)} "
                    f"tokens that are not the {length} the engine ran at {offset} (another processor or settings)"
                )
            images.append(image)
        pixels, grids = pixel_inputs(proc, images, len(sample.input_ids), [m["placeholder"] for m in sample.media])
        for m, grid in zip(sample.media, grids or [], strict=False):  # mRoPE: the grid places the image's tokens
            if "grid" in m and grid != list(m["grid"]):
                raise MediaError(f"image {m['sha256'][:12]} of trace {sample.trace_id}: the processor makes a patch grid "
                                 f"{grid} where the engine recorded {m['grid']} (its positions would differ)")  # fmt: skip
        return pixels
