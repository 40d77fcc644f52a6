"""The LRP attribution: one forward and one backward pass through a model inside a composite's context."""
from __future__ import annotations

from typing import Callable

import torch
from zennit.core import Composite

from .rules import RelevanceBoundary
from .task import Task, TargetLike

__all__ = ['attribute']


def attribute(task: Task, position=-1, target: TargetLike = None, composite: Composite | None = None,
              method: str = 'attnlrp', observe: Callable[[torch.nn.Module, list], list] | None = None):
    """LRP of the task's explained logit with ``composite`` (default: the task's composite for ``method``,
    :py:class:`~zennit_attn.composites.AttnLRPEpsilon` / :py:class:`~zennit_attn.composites.CPLRPEpsilon` for
    language models, :py:class:`~zennit_attn.composites.AttnLRPGamma` / :py:class:`~zennit_attn.composites.CPLRPGamma`
    for vision transformers) in one forward and one backward pass; the logit is the initial relevance.

    ``observe(model, watched)`` is a hook for diagnostics: it is called inside the composite's context before
    the forward pass and returns handles (with ``remove()``) that are removed after the backward pass; tensors
    it appends to ``watched`` during the forward pass are added to the backward pass's inputs, so that their
    gradient hooks run even where they do not lead to the input.
    """
    composite = task.composites[method]() if composite is None else composite
    if not isinstance(composite, Composite):
        raise TypeError(f'composite must be a zennit Composite (e.g. zennit_attn.composites.AttnLRPEpsilon()), got '
                        f'{type(composite).__name__}')
    with torch.enable_grad():
        leaves, extra = task.lrp_leaves()
        extra.update(task.keep_logits(position, target))
        with composite.context(task.model) as modified:
            if not any(isinstance(hook, RelevanceBoundary) for hook in getattr(composite, 'hook_refs', ())):
                raise TypeError(
                    f'{type(composite).__name__} registered no RelevanceBoundary on the model: explain() reads '
                    'relevance at the input, which needs the boundary of the zennit-attn composites '
                    '(or a composite that maps the root module to zennit_attn.rules.RelevanceBoundary)'
                )
            watched = []
            handles = observe(modified, watched) if observe is not None else []
            try:
                logit = task.resolve(task.forward(leaves[0], model=modified, **extra), position, target)
                relevance = torch.autograd.grad(
                    logit, [*leaves, *watched], grad_outputs=logit.detach(), allow_unused=True
                )[:len(leaves)]
            finally:
                for handle in handles:
                    handle.remove()
    relevance = [torch.zeros_like(leaf) if value is None else value for leaf, value in zip(leaves, relevance)]
    return task.finish(relevance[0], logit, method, *relevance[1:])
