"""The operation machinery: how the rules of a composite are applied at the torch operations a model performs.

The operation registry (:py:mod:`~zennit_attn.operations.registry`) declares, for every torch function by name, its
rule, its handler and how the marks of its inputs pass to its outputs; the classifying mode
(:py:mod:`~zennit_attn.operations.classifier`) binds each call once (:py:mod:`~zennit_attn.operations.calls`), routes it
by the marks of its operands (:py:mod:`~zennit_attn.operations.marks`: what a tensor is, a softmax gate, an activation,
a log-softmax, a term of a recurrence, ...) and applies the declared rule; the handlers live in
:py:mod:`~zennit_attn.operations.products`, :py:mod:`~zennit_attn.operations.elementwise`,
:py:mod:`~zennit_attn.operations.softmax` and :py:mod:`~zennit_attn.operations.recurrences`; the state of one forward
is a :py:class:`~zennit_attn.operations.tracking.State`; torch functions that combine several operations run as the
plain operations they are (:py:mod:`~zennit_attn.operations.decompositions`). The canonizer that enters the mode is
:py:class:`zennit_attn.canonizers.OperationCanonizer`.
"""

from __future__ import annotations

from .registry import OPERATIONS, Operation, check_overrides
from .tracking import RuleRow, RuleTable

__all__ = ['OPERATIONS', 'Operation', 'check_overrides', 'RuleTable', 'RuleRow']
