"""The diffusers video transformers the cache engine serves, one module per architecture, and
the registry that finds a transformer's one.

| class (tested: diffusers 0.42.1)  | module               | op types (forward order per block)                      | streams       | segment barriers |
|-----------------------------------|----------------------|---------------------------------------------------------|---------------|------------------|
| ``LatteTransformer3DModel``       | ``latte.py``         | spatial: spatial_attn, cross_attn, spatial_ffn; temporal: temporal_attn, temporal_ffn | video | layer 0's temporal position embedding (F > 1) |
| ``CogVideoXTransformer3DModel``   | ``cogvideox.py``     | attn, ffn (joint text+video)                            | video, text   | none |
| ``WanTransformer3DModel``         | ``wan.py``           | attn, cross_attn, ffn                                   | video         | none |
| ``HunyuanVideoTransformer3DModel``| ``hunyuan_video.py`` | dual: attn, ffn; single: single                         | video, text   | none |

Each module says which diffusers module computes each operator, its gate and how its residual
is added (:mod:`coda.host.cache.arch.base`: the interface; :mod:`coda.host.cache.arch.deferred`:
how a segment spans blocks inside the model's own forward). What each operator type is to
the cache policies: :data:`coda.host.cache.schedule.ARCH_OP_KINDS`, read through
:class:`~coda.host.cache.schedule.ModelOps` (usable without the model).
"""

from __future__ import annotations

import torch

from coda.host.cache.schedule import ModelOps

from .base import Architecture, UnsupportedModelError
from .cogvideox import CogVideoX
from .hunyuan_video import HunyuanVideo
from .latte import Latte
from .wan import Wan

__all__ = ["ARCHITECTURES", "Architecture", "UnsupportedModelError", "get_architecture",
           "model_ops", "supported_classes"]

#: diffusers class name -> its architecture
ARCHITECTURES: dict[str, Architecture] = {a.model_class: a for a in
                                          (Latte(), CogVideoX(), Wan(), HunyuanVideo())}


def supported_classes() -> list[str]:
    """The diffusers transformer classes the engine serves."""
    return list(ARCHITECTURES)


def get_architecture(transformer: torch.nn.Module) -> Architecture:
    """The architecture of ``transformer`` (an instance of a supported diffusers class or of a
    subclass of one).

    Raises:
        UnsupportedModelError (a TypeError): any other module, naming its class and the
            supported ones.
    """
    for arch in ARCHITECTURES.values():
        if isinstance(transformer, arch.model_type()):
            return arch
    hint = ("; a torch.compile(model) wrapper: compile the transformer in place instead "
            "(transformer.compile(...), transformer.compile_repeated_blocks(...)) or its "
            "blocks" if type(transformer).__name__ == "OptimizedModule" else "")
    raise UnsupportedModelError(
        f"{type(transformer).__name__}: the CODA cache engine attaches to "
        f"{', '.join(supported_classes())} only (and their subclasses){hint}")


def model_ops(transformer: torch.nn.Module) -> ModelOps:
    """The cacheable operators of ``transformer`` in forward order (works on the ``meta``
    device). Raises UnsupportedModelError as :func:`get_architecture`."""
    return get_architecture(transformer).model_ops(transformer)
