"""The relevance boundary at the root module: relevance in at the output, relevance out at the inputs."""

from __future__ import annotations

import torch
from zennit.core import Composite, Hook, RemovableHandle, RemovableHandleList

from ..core.audit import INPUTS
from .base import gradient_map


class _InputRelevance(torch.autograd.Function):
    """A copy of the input ``x`` whose backward turns the gradient ``g`` into the relevance ``x * g``. A copy, not a
    view, so that a model may change its input in place (CTRL scales ``inputs_embeds`` with ``*=``)."""

    @staticmethod
    def forward(ctx, input):
        ctx.save_for_backward(input)  # the input itself (alive as the caller's leaf): nothing allocated
        return input.clone()

    @staticmethod
    def backward(ctx, grad):
        (input,) = ctx.saved_tensors
        return grad * input


INPUTS.add(_InputRelevance)


def input_relevance(tensor):
    """Input side of the boundary: the gradient reaching ``x`` becomes the relevance ``x * g``. The result is an
    explained input of the engine's audit wherever the model meets it (:py:data:`~zennit_attn.core.audit.INPUTS`:
    a token table's lookup replaced inside the forward, :py:mod:`zennit_attn.inputs.lookups`)."""
    if not (isinstance(tensor, torch.Tensor) and tensor.is_floating_point() and tensor.requires_grad):
        return tensor
    return _InputRelevance.apply(tensor)


def output_gradient(tensor):
    """Output side of the boundary: the relevance ``R`` given at output ``y`` becomes the gradient ``R / y``."""
    if not (isinstance(tensor, torch.Tensor) and tensor.is_floating_point() and tensor.requires_grad):
        return tensor
    # one output-sized allocation (a division by 0 gives inf or nan, set to 0): logits can be large
    return gradient_map(
        tensor, lambda relevance, output: torch.div(relevance, output).nan_to_num_(0.0, 0.0, 0.0), with_value=True
    )


#: Fields of Hugging Face model outputs that the boundary treats as outputs to be explained.
OUTPUT_FIELDS = (
    'logits',
    'last_hidden_state',
    'pooler_output',
    'start_logits',
    'end_logits',
    'logits_per_image',
    'logits_per_text',
)


class RelevanceBoundary(Hook):
    """Keep zennit's outward contract at the root module: relevance in, relevance out.

    zennit's :py:class:`~zennit.attribution.Gradient` passes the output relevance as ``grad_outputs`` and
    reads relevance at the input. Inside, the AttnLRP rules pass the modified gradient ``g = R / x``. This hook
    converts the relevance given at the model output ``y`` to ``R / y`` (0 where ``y == 0``: relevance at a
    zero activation cannot be propagated), and the gradient reaching every floating-point input ``x`` (as
    positional or keyword argument, e.g. ``pixel_values`` or ``inputs_embeds``) to ``x * g``. Outputs are
    tensors, tuples (their first element) or Hugging Face model outputs (the fields in
    :py:data:`OUTPUT_FIELDS`).

    Parameters
    ----------
    outputs: bool
        Whether the outputs take relevance (zennit's contract, the default). False: they take the gradient itself, and
        nothing of them is kept for the backward pass (the division needs the outputs); :py:func:`gradient_outputs`
        sets it where the caller starts the backward pass from a value whose gradient is known (explain()).
    """

    def __init__(self, outputs: bool = True):
        super().__init__()
        self.outputs = outputs

    def register(self, module: torch.nn.Module) -> RemovableHandleList:
        return RemovableHandleList(
            [
                RemovableHandle(self),
                # outermost: before the pre-hooks of the canonizers (the engine's classifying mode)
                module.register_forward_pre_hook(self._pre_forward, with_kwargs=True, prepend=True),
                module.register_forward_hook(self._post_forward),
            ]
        )

    def _pre_forward(self, module, args, kwargs):
        if not self.active:
            return None
        return tuple(input_relevance(arg) for arg in args), {key: input_relevance(val) for key, val in kwargs.items()}

    def _post_forward(self, module, input, output):
        if not (self.active and self.outputs):
            return None
        if isinstance(output, torch.Tensor):
            return output_gradient(output)
        if isinstance(output, tuple) and not hasattr(output, 'keys'):
            return (output_gradient(output[0]),) + tuple(output[1:]) if output else output
        if hasattr(output, 'keys'):
            for field in OUTPUT_FIELDS:
                if output.get(field) is not None:
                    output[field] = output_gradient(output[field])
            return output
        raise TypeError(f'{type(module).__name__} returned {type(output).__name__}, which has no tensor to explain')

    def copy(self):
        return type(self)(self.outputs)


def gradient_outputs(composite: Composite) -> RelevanceBoundary:
    """Switch the :py:class:`RelevanceBoundary` that ``composite`` registered (inside its context) to take the gradient
    at the model's outputs, and return it: for a backward pass that starts from a value whose gradient is its own
    conversion of the initial relevance (:py:class:`~zennit_attn.inputs.objectives.RelevanceToGradient`: ``f`` becomes
    ``f / f``), which keeps no row of the outputs alive for the division ``R / y`` that would undo a multiplication
    ``y * df/dy``.

    Raises
    ------
    TypeError
        If ``composite`` registered no :py:class:`RelevanceBoundary`.
    """
    for hook in getattr(composite, 'hook_refs', ()):
        if isinstance(hook, RelevanceBoundary):
            hook.outputs = False
            return hook
    raise TypeError(
        f'{type(composite).__name__} registered no RelevanceBoundary on the model: explanations read relevance at '
        'the input, which needs the boundary of the zennit-attn composites (or a composite that maps the root module '
        'to zennit_attn.rules.RelevanceBoundary)'
    )
