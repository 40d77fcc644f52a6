"""The LRP methods ``'attnlrp'`` and ``'cplrp'``: LRP (:py:func:`~zennit_attn.methods.lrp.attribute`) with the
composite a user passes, or by default the one of the paper for the task's modality."""

from __future__ import annotations

from zennit.core import Composite

from ..engine.composites import AttnLRPEpsilon, AttnLRPGamma, CPLRPEpsilon, CPLRPGamma
from ..inputs.task import ImageTask, Task
from .lrp import attribute

__all__ = ['attnlrp', 'cplrp']


def attnlrp(task: Task, position=-1, target=None, composite: Composite | None = None):
    """AttnLRP (the paper's method): LRP with ``composite``, by default
    :py:class:`~zennit_attn.engine.composites.AttnLRPEpsilon` for language models and
    :py:class:`~zennit_attn.engine.composites.AttnLRPGamma` (the paper's ViT composite) for vision transformers.
    Cost: one forward and one backward pass."""
    if composite is None:
        composite = AttnLRPGamma() if isinstance(task, ImageTask) else AttnLRPEpsilon()
    return attribute(task, position, target, composite, 'attnlrp')


def cplrp(task: Task, position=-1, target=None, composite: Composite | None = None):
    """CP-LRP (Ali et al. 2022): LRP with the attention probabilities and gates constant, by default
    :py:class:`~zennit_attn.engine.composites.CPLRPEpsilon` (language models) or
    :py:class:`~zennit_attn.engine.composites.CPLRPGamma` (vision transformers). Cost: one forward and one backward
    pass."""
    if composite is None:
        composite = CPLRPGamma() if isinstance(task, ImageTask) else CPLRPEpsilon()
    return attribute(task, position, target, composite, 'cplrp')
