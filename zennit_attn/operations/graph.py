"""What the engine reads from the autograd graph that the classifying mode builds while the model runs: by node
identity only, never by the names of autograd nodes (what a tensor *is* comes from the marks the mode sets,
:py:mod:`~zennit_attn.operations.marks`).

- :py:func:`normalises`: whether a normaliser ``g`` is computed from a tensor ``x`` (or from what ``x`` is a view, cast
  or centring of), so that ``x * g`` is a normalisation ``x / g'(x)`` (Prop. 3.4);
- :py:func:`is_outer_product`: whether an element-wise product broadcasts to an outer product;
- :py:class:`SoftmaxInput`: the input of a softmax, whose fully masked rows pass no gradient.
"""

from __future__ import annotations

import torch

__all__ = ['normalises', 'is_outer_product', 'SoftmaxInput']


def normalises(normaliser: torch.Tensor, sources: set, budget: int = 64) -> bool:
    """Whether ``normaliser`` (a function ``g`` of relevance-carrying tensors) is computed from one of the autograd
    nodes ``sources`` (those of a tensor ``x`` and of what ``x`` is a view, cast or centring of:
    :py:meth:`~zennit_attn.operations.marks.Marks.sources`): one of them is among the first ``budget`` nodes
    ``normaliser`` was computed from. Then ``x * g`` is a normalisation ``x / g'(x)`` (Prop. 3.4)."""
    queue, seen = [normaliser.grad_fn], set()
    while queue and len(seen) < budget:
        node = queue.pop(0)
        if node is None or node in seen:
            continue
        if node in sources:
            return True
        seen.add(node)
        queue.extend(next_node for next_node, _ in node.next_functions if next_node is not None)
    return False


def is_outer_product(first: torch.Tensor, second: torch.Tensor) -> bool:
    """Whether the element-wise product of ``first`` and ``second`` has more elements than either (a broadcast outer
    product ``k[..., :, None] * v[..., None, :]``, not an element-wise product or a broadcast scale)."""
    rank = max(first.dim(), second.dim())
    size = 1
    for one, other in zip(
        (1,) * (rank - first.dim()) + tuple(first.shape), (1,) * (rank - second.dim()) + tuple(second.shape)
    ):
        size *= other if one == 1 else one  # the product ran: the shapes broadcast (torch.broadcast_shapes is slow)
    return size > max(first.numel(), second.numel())


class SoftmaxInput(torch.autograd.Function):
    """The input of a softmax, unchanged; backward: the gradient, zero in the rows where the softmax's output is NaN
    (rows of ``-inf`` logits, which models replace by a constant: no relevance flows through them). The node's
    ``nan_rows`` (set after the softmax ran: a boolean mask that broadcasts along the softmax's dimension) says
    which."""

    @staticmethod
    def forward(ctx, input):
        """``input`` unchanged; the mask of NaN rows is set on the node afterwards."""
        ctx.nan_rows = None
        return input.view_as(input)

    @staticmethod
    def backward(ctx, grad_output):
        """The gradient, zero in the rows where the softmax's output is NaN."""
        if ctx.nan_rows is None:
            return grad_output
        return torch.where(ctx.nan_rows, 0.0, grad_output)
