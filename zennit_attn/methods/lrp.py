"""The LRP attribution: one forward and one backward pass through a model inside a composite's context."""

from __future__ import annotations

from collections.abc import Callable

import torch
from zennit.core import Composite

from ..composites import AttnLRPComposite
from ..core.errors import UnsupportedModelError
from ..inputs.task import Task
from ..results.explanation import TargetLike
from ..rules.boundary import gradient_outputs

__all__ = ['attribute']


def attribute(
    task: Task,
    position,
    target: TargetLike,
    composite: Composite,
    method: str = 'attnlrp',
    observe: Callable[[torch.nn.Module, list], list] | None = None,
):
    """LRP of the task's explained value with ``composite`` in one forward and one backward pass; the explained
    value is the initial relevance. The LRP methods of :py:mod:`zennit_attn.methods.registry` choose the default
    composite.

    ``observe(model, watched)`` is a hook for diagnostics: it is called inside the composite's context before
    the forward pass and returns handles (with ``remove()``) that are removed after the backward pass; tensors
    it appends to ``watched`` during the forward pass are added to the backward pass's inputs, so that their
    gradient hooks run even where they do not lead to the input.

    Raises
    ------
    TypeError
        If ``composite`` is not a zennit composite, or registers no
        :py:class:`~zennit_attn.rules.RelevanceBoundary` on the model.
    """
    if not isinstance(composite, Composite):
        raise TypeError(
            f'composite must be a zennit Composite (e.g. zennit_attn.composites.AttnLRPEpsilon()), got '
            f'{type(composite).__name__}'
        )
    if getattr(composite, 'positions', False):
        task.check_token_layout("PA-LRP's relevance of the positions (method='palrp', a composite with positions=True)")
    with torch.enable_grad():
        leaves, extra = task.lrp_leaves()
        extra.update(task.keep_logits(position, target))
        walked = isinstance(composite, AttnLRPComposite)  # registers on the task's walk of the model
        with composite.context(task.model, task.modules) if walked else composite.context(task.model) as modified:
            gradient_outputs(composite)  # the explained value converts its initial relevance itself
            watched = []
            handles = observe(modified, watched) if observe is not None else []
            try:
                logit = task.resolve(
                    task.lrp_forward(leaves[0], modified, **extra), position, target, initial_relevance=True
                )
                inner = task.lookup_leaves()  # made during the forward (token tables of a model run on its ids)
                positions = _position_leaves(composite)
                inputs = [*leaves, *inner, *positions]
                relevance = _backward(task, logit, [*inputs, *watched])[: len(inputs)]
            finally:
                for handle in handles:
                    handle.remove()
    relevance = [torch.zeros_like(leaf) if value is None else value for leaf, value in zip(inputs, relevance)]
    if positions:
        found = composite.position_inputs
        sequences = found.per_position(relevance[-len(positions) :], task.position_sequence)
        task.add_position_relevance(sequences, found.kinds())
    if inner:
        task.add_lookup_relevance(relevance[len(leaves) : len(leaves) + len(inner)])
    relevance = relevance[: len(leaves)]
    return task.finish(relevance[0], logit, method, *relevance[1:])


def _backward(task: Task, logit: torch.Tensor, inputs: list[torch.Tensor]) -> tuple:
    """The backward pass from ``logit`` (its value the initial relevance) to ``inputs``.

    Raises
    ------
    zennit_attn.core.errors.UnsupportedModelError
        Where the model changed in place, after an operation, a tensor that the operation's rule keeps for the
        backward pass (torch refuses the pass: ``... modified by an inplace operation``): named, with what to do.
    """
    try:
        return torch.autograd.grad(logit, inputs, grad_outputs=logit.detach(), allow_unused=True)
    except RuntimeError as error:
        if 'modified by an inplace operation' not in str(error):
            raise
        raise UnsupportedModelError(
            f'{type(task.model).__name__} changes in place a tensor that a rule of the explanation keeps for the '
            f'backward pass (torch: {str(error).split(". Hint")[0]}); compute that step of the model out of place '
            '(y = y * s, not y *= s), or report the model'
        ) from error


def _position_leaves(composite: Composite) -> list[torch.Tensor]:
    """The position inputs of the last forward pass of a composite with PA-LRP's positions
    (:py:meth:`~zennit_attn.rules.positions.PositionInputs.leaves`: refused where none ran), none otherwise."""
    position_inputs = getattr(composite, 'position_inputs', None) if getattr(composite, 'positions', False) else None
    return [] if position_inputs is None else position_inputs.leaves()
