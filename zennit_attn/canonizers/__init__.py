"""Canonizers: zennit canonizers that change a model instance for the time of an explanation and restore it exactly.

:py:class:`~zennit_attn.canonizers.operations.OperationCanonizer` (applied by every composite of
:py:mod:`zennit_attn.composites`) runs the model's forward in the classifying mode of
:py:mod:`zennit_attn.operations`, which applies the composite's rules at every torch operation on relevance-carrying
tensors; :py:func:`~zennit_attn.canonizers.checkpointing.checkpointed` recomputes each transformer block in the
backward pass instead of saving its activations (``explain(checkpointing=True)``).
"""

from __future__ import annotations

from .checkpointing import checkpointed, recomputing
from .operations import OperationCanonizer

__all__ = ['OperationCanonizer', 'checkpointed', 'recomputing']
