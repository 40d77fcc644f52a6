"""What zennit-attn knows of models and tensors below its rules: its errors (:py:mod:`~zennit_attn.core.errors`), the
kinds of leaf modules (:py:mod:`~zennit_attn.core.kinds`), the transformer blocks, attention projections and vision
towers of a module tree (:py:mod:`~zennit_attn.core.blocks`), quantized layers
(:py:mod:`~zennit_attn.core.quantization`), devices (:py:mod:`~zennit_attn.core.devices`), a model's scores for
zennit's attributors (:py:mod:`~zennit_attn.core.modules`) and the audit of a forward
(:py:mod:`~zennit_attn.core.audit`: nothing the engine did not see is explained). It knows models and tensors, not
tokens or texts."""

from __future__ import annotations

from .blocks import NoBlocksError, attention_linears, block_stacks, transformer_blocks, vision_towers
from .errors import CompiledModelError, UnsupportedModelError, ZennitAttnError

__all__ = [
    'ZennitAttnError',
    'UnsupportedModelError',
    'CompiledModelError',
    'NoBlocksError',
    'block_stacks',
    'transformer_blocks',
    'attention_linears',
    'vision_towers',
]
