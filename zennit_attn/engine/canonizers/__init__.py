"""The engine that applies a composite's rules at the operations a model performs, and what it knows of a model's
structure.

:py:class:`~zennit_attn.engine.canonizers.operations.OperationCanonizer` (applied by every composite of
:py:mod:`zennit_attn.engine.composites`) classifies each torch operation on relevance-carrying tensors with the
operation registry (:py:mod:`~zennit_attn.engine.canonizers.registry`) and applies the composite's rules to it;
:py:func:`block_stacks` finds the transformer blocks (:py:mod:`~zennit_attn.engine.canonizers.blocks`).
"""

from __future__ import annotations

from ..errors import UnsupportedModelError
from .blocks import NoBlocksError, attention_linears, block_stacks, transformer_blocks, vision_towers
from .operations import OperationCanonizer
from .registry import OPERATIONS, Operation, check_overrides
from .tracking import RuleRow, RuleTable

__all__ = [
    'OperationCanonizer',
    'OPERATIONS',
    'Operation',
    'check_overrides',
    'RuleTable',
    'RuleRow',
    'UnsupportedModelError',
    'block_stacks',
    'transformer_blocks',
    'NoBlocksError',
    'attention_linears',
    'vision_towers',
]
