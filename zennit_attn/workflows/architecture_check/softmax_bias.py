"""AttnLRP with the softmax rule's bias term handed back: the conservation check of AttnLRP's own rules.

CP-LRP conserves exactly on a model without biases, which is how the architecture check checks the rules CP-LRP and
AttnLRP share. It cannot see the rules only AttnLRP applies: the shares of gates in products (Props. 3.2, 3.3) and the
identity rule through the activations and softmax outputs that those shares reach (Eq. 9). AttnLRP does not conserve
by design, but in one place only: the softmax rule (Prop. 3.1) is the first-order Taylor expansion at zero, and its
bias term, per softmax row

.. math::

    \\sum_j y_j g_j - \\sum_i x_i (J^\\top g)_i,

is left out. Everything else AttnLRP does on a bias-free model conserves (the uniform rule shares a homogeneous
product's relevance exactly, by Euler's theorem; the identity rule passes it unchanged; a normaliser held constant
leaves a linear map). :py:class:`SoftmaxBias` hands that term back at every softmax (the rule's gradient plus ``c x``,
``c`` chosen so that each row conserves), through the composite's ``overrides`` of ``softmax``, ``_softmax`` and
``scaled_dot_product_attention`` (written out: ``softmax(q k^T scale + mask) V``, each of its products shared half and
half, its value checked against the fused call's); every other operation takes the engine's own path. With it the
relevance at the inputs sums to the logit to rounding, and any other loss is either a constant of the model, another
spelling of a softmax (each loses its own term by Prop. 3.1), an input of zero that the identity rule cannot pass
relevance to, or a rule that absorbs relevance it must not: a defect.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ...composites import AttnLRPEpsilon, CPLRPEpsilon
from ...rules import gradient_map, scaled_gradient

__all__ = ['SoftmaxBias', 'MASKED']

#: Logits at or below ``-MASKED`` (``finfo.min``, ``-inf``) are masked: their softmax is 0 and they carry no relevance.
MASKED = 1e4
#: The arguments of ``scaled_dot_product_attention``, in their order.
ATTENTION_ARGUMENTS = ('query', 'key', 'value', 'attn_mask', 'dropout_p', 'is_causal', 'scale', 'enable_gqa')


class SoftmaxBias:
    """The softmaxes of explanations with their bias terms handed back (see the module's description); one instance
    per explanation.

    Attributes
    ----------
    softmaxes: int
        The softmaxes met (a model without any, xLSTM, conserves under AttnLRP itself).
    stranded: float
        The bias terms that could not be handed back: a row whose logits are all zero (or masked) has no ``c x`` to
        carry it (a random model with a zero rotary table, whose queries and keys are zero).
    """

    def __init__(self):
        self.softmaxes = 0
        self.stranded = 0.0

    def composite(self) -> AttnLRPEpsilon:
        """AttnLRP with the softmax's bias term handed back."""
        attention = {'scaled_dot_product_attention': self.attention}
        return AttnLRPEpsilon(overrides={'softmax': self.softmax, '_softmax': self.softmax, **attention})

    def cplrp_composite(self) -> CPLRPEpsilon:
        """CP-LRP with the softmax's bias term handed back. Attention probabilities are constants of CP-LRP's products
        (no relevance reaches their logits, no term to hand back); a softmax whose output is a value (the soft visual
        tokens of Ovis's visual tokenizer, weights of an embedding table) gets the softmax rule (Prop. 3.1) under CP-LRP
        too and loses its term: only ``softmax`` is overridden."""
        return CPLRPEpsilon(overrides={'softmax': self.softmax, '_softmax': self.softmax})

    def softmax(self, func, args: tuple, kwargs: dict) -> torch.Tensor:
        """The override of ``softmax`` and ``_softmax``: ``func`` run on the logits with the bias term handed back."""
        dim = kwargs['dim'] if 'dim' in kwargs else args[1]
        return self.handed_back(lambda logits: func(logits, *args[1:], **kwargs), args[0], dim)

    def handed_back(self, softmax: Callable, logits: torch.Tensor, dim: int) -> torch.Tensor:
        """``softmax(logits)`` (along ``dim``) whose logits' gradient is the softmax rule's (the plain gradient,
        Prop. 3.1) plus ``c x`` per row, with ``c`` such that ``sum_i x_i g_i`` equals the output's
        ``sum_j y_j g_j``."""
        self.softmaxes += 1
        seen = {}

        def record(grad: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
            seen['relevance'] = (value * grad).sum(dim, keepdim=True)
            return grad

        def returned(grad: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
            # as the engine's softmax rule: zero for a row the softmax turns into NaN (every logit masked; the model
            # replaces its output by a constant), whose bias term is zero too
            grad = grad.nan_to_num(0.0, 0.0, 0.0)
            kept = torch.where(value.abs() < MASKED, value, torch.zeros_like(value))
            lost = (seen['relevance'] - (kept * grad).sum(dim, keepdim=True)).nan_to_num(0.0, 0.0, 0.0)
            norm = (kept * kept).sum(dim, keepdim=True)
            self.stranded += float(torch.where(norm > 0, torch.zeros_like(lost), lost).abs().sum())
            return grad + torch.where(norm > 0, lost / norm.clamp_min(1e-300), torch.zeros_like(norm)) * kept

        output = softmax(gradient_map(logits, returned, with_value=True))
        return gradient_map(output, record, with_value=True)

    def attention(self, func, args: tuple, kwargs: dict) -> torch.Tensor:
        """The override of ``scaled_dot_product_attention``: ``softmax(q k^T scale + mask) V`` written out, each of its
        products sharing its relevance half and half (AttnLRP's uniform rule, Prop. 3.3) and the softmax's bias term
        handed back; raises ``AssertionError`` where its value differs from ``func``'s."""
        bound = {**dict(zip(ATTENTION_ARGUMENTS, args)), **kwargs}
        query, key, value = bound['query'], bound['key'], bound['value']
        if bound.get('enable_gqa') and key.shape[-3] != query.shape[-3]:
            groups = query.shape[-3] // key.shape[-3]
            key, value = key.repeat_interleave(groups, -3), value.repeat_interleave(groups, -3)
        scale = bound.get('scale') or 1 / math.sqrt(query.shape[-1])
        scores = (_half(query) @ _half(key).transpose(-2, -1)) * scale
        if bound.get('is_causal'):
            length, keys = query.shape[-2], key.shape[-2]
            keep = torch.ones(length, keys, dtype=torch.bool, device=scores.device).tril(keys - length)
            scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
        mask = bound.get('attn_mask')
        if mask is not None and mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        elif mask is not None:
            scores = scores + mask
        weights = self.handed_back(lambda logits: torch.softmax(logits, -1), scores, -1)
        output = _half(weights) @ _half(value)
        with torch.no_grad():
            expected = func(*args, **kwargs)
        if not torch.allclose(output, expected, rtol=1e-6, atol=1e-10):
            raise AssertionError(
                'scaled_dot_product_attention written out differs from the fused call by '
                f'{float((output - expected).abs().max()):.3g}'
            )
        return output


def _half(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` with half its gradient where it carries relevance."""
    return scaled_gradient(tensor, 0.5) if tensor.requires_grad else tensor
