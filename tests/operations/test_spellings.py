"""One relevance whatever the spelling: what a tensor is (a gate of CP-LRP, a softmax output, a value) is decided by
the marks the operations declare in the registry (:py:mod:`zennit_attn.operations.marks`), not by the autograd
nodes a spelling happens to produce; an activation written out (``x * sigmoid(x)``, GELU with ``erf``) is an
activation. Each case writes one function several ways; every composite (AttnLRP, CP-LRP,
RelP and the rules of relevance patching) gives each spelling the same relevance (float64, 1e-10), and CP-LRP
conserves it (no biases: the relevance 1 of every output element).

Before multiples by constant tensors were followed as multiples by numbers were, AttnLRP gave ``weight * x *
rsqrt(mean(x^2) + eps)`` (a normalisation whose weight is multiplied first) a relevance 31% of the largest apart from
the RMSNorm's (28% for a LayerNorm; the normaliser got the uniform rule instead of being held constant, Prop. 3.4),
and CP-LRP gave Swish with a weight, ``x * sigmoid(beta * x)``, a relevance 39% apart from ``silu(beta * x) / beta``
(the gate held constant instead of the identity rule of the activation); relevance patching's MLP rules doubled it.
Before a bound from 0 upwards was a rectifier, CP-LRP gave ReLU spelled ``x.clamp(min=0)`` times a value a relevance
79% of the largest apart from ``relu(x)`` times it (a value instead of a gate), and relevance patching's MLP rules
twice the relevance. Before the two outputs of one operation were told apart, CP-LRP took GLU by ``chunk`` (``a *
sigmoid(g)`` with ``a, g = h.chunk(2)``) for SiLU (``a`` times an activation of itself: a gate), 120% of the largest
relevance apart from GLU by indexing when multiplied by a value.

Before a tensor times an inverse of another (``a * reciprocal(v)``, ``a * rsqrt(v)``, ``a * v ** -1``) was a division
of it, AttnLRP shared that product by halves where ``a / v`` holds the divisor constant: a relevance 180% of the
largest apart (65% for ``a * rsqrt(v)`` against ``a / sqrt(v)``); before a factor offset by a number was distributed,
``a * (1 + v)`` got another relevance than ``a + a * v`` (the number absorbed a share like a bias); before a value
times itself was a square, CP-LRP gave ``(x * x) * v`` a relevance 39% of the largest apart from ``x ** 2 * v``;
before a product of products was one product of their factors, AttnLRP gave ``(a * b) * c`` a relevance 26% of the
largest apart from ``a * (b * c)`` and ``torch.stack([a, b, c]).prod(0)``.

Before issue 40, CP-LRP gave ``silu(h) @ W`` and ``(silu(h)[..., None] * W).sum(-2)`` followed by a gate relevances
90% apart (the product with a broadcast constant and the sum passed the gate, the matrix product did not), the
recurrent and the chunked gated delta rule 2.4% of the largest relevance apart, and half the other cases below
differed as well.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F
from transformers.models.esm import modeling_esm
from transformers.models.gpt_oss import modeling_gpt_oss
from transformers.models.qwen3_next import modeling_qwen3_next

from tests.by_hand import attributed, by_hand, identity
from zennit_attn import explain
from zennit_attn.composites import AttnLRPEpsilon, CPLRPEpsilon, MLPRules, RelPEpsilon
from zennit_attn.core.errors import UnsupportedModelError
from zennit_attn.workflows.architecture_check.check import built_model
from zennit_attn.workflows.architecture_check.configs import model_class, tiny_config

COMPOSITES = [AttnLRPEpsilon, CPLRPEpsilon, RelPEpsilon, MLPRules]
#: a constant matrix, a mask and mixing weights of the cases
W = torch.linspace(-1, 1, 16, dtype=torch.float64).reshape(4, 4) + torch.eye(4, dtype=torch.float64)
MASK = torch.tensor([[False, True, False], [False, False, True], [True, False, False]])
MIXING = torch.tensor([0.7, 0.3], dtype=torch.float64)
#: the weight of a normalisation or an activation (a constant: what a frozen weight of the model is in the context)
SCALE = torch.tensor([0.5, 1.5, 1.0, 2.0], dtype=torch.float64)


class Projected(torch.nn.Module):
    """``function(self, x)`` with three bias-free projections ``a``, ``b``, ``c`` of the ``[3, 4]`` input."""

    def __init__(self, function):
        super().__init__()
        self.function = function
        self.a, self.b, self.c = (torch.nn.Linear(4, 4, bias=False) for _ in range(3))
        self.norm = torch.nn.RMSNorm(4, eps=1e-6)
        self.act = torch.nn.SiLU(inplace=True)

    def forward(self, x):
        return self.function(self, x)


def gate(m, x):
    return torch.sigmoid(m.c(x))


def plus_in_place(y, residual):
    """``y += residual`` (a residual added to an activation's output in place: torchvision's FusedMBConv)."""
    y += residual
    return y


def probabilities(m, x, first=None, second=None):
    first, second = first or m.a, second or m.b
    return torch.softmax(first(x) @ second(x).T, -1)


def scores(m, x):
    return m.a(x) @ m.b(x).T


def written_softmax(m, x):
    """The textbook softmax: ``exp(z - max(z)) / sum``."""
    weights = torch.exp(scores(m, x) - scores(m, x).amax(-1, keepdim=True))
    return weights / weights.sum(-1, keepdim=True)


def written_softmax_in_place(m, x):
    """``e /= e.sum(...)`` after the maximum subtracted in place."""
    weights = scores(m, x)
    weights.sub_(weights.max(-1, keepdim=True).values)
    weights = weights.exp()
    weights /= weights.sum(-1).unsqueeze(-1)
    return weights


def in_place_scale(m, x):
    weights = torch.sigmoid(m.a(x)).clone()  # autograd keeps the output of sigmoid and softmax: models change copies
    weights.mul_(0.5)
    return weights * m.b(x)


def in_place_fill(m, x):
    weights = probabilities(m, x).clone()
    weights.masked_fill_(MASK, 0.0)
    return weights @ m.c(x)


def set_entries(m, x):
    weights = probabilities(m, x).clone()
    weights[MASK] = 0.0
    return weights @ m.c(x)


def set_entries_of_a_view(m, x):
    weights = probabilities(m, x).clone()
    weights.view(-1)[MASK.flatten()] = 0.0  # the view's base gets the written values
    return weights @ m.c(x)


def scale_a_view_in_place(m, x):
    weights = torch.sigmoid(m.a(x)).clone()
    weights[:, :2] *= 0.5
    return weights * m.b(x)


def rms_spelled(g):
    return g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + 1e-6)


def rms_weighted_first(a):
    """An RMSNorm whose weight multiplies the input before the normaliser does (GradiumPhononTTS's)."""
    return SCALE * a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + 1e-6)


def rms_weighted_in_place(a):
    """:py:func:`rms_weighted_first` with the weight multiplied in place."""
    return a.clone().mul_(SCALE) * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + 1e-6)


def layer_norm_weighted_first(a):
    """A LayerNorm whose weight multiplies the centred input before the normaliser does."""
    return SCALE * (a - a.mean(-1, keepdim=True)) * torch.rsqrt(a.var(-1, keepdim=True, unbiased=False) + 1e-5)


def layer_norm_weighted_centre(a):
    """A LayerNorm that centres the weighted input (the weight times the input, minus the weight times its mean)."""
    centred = SCALE * a - SCALE * a.mean(-1, keepdim=True)
    return centred * torch.rsqrt(a.var(-1, keepdim=True, unbiased=False) + 1e-5)


def routing(m, x, spelling: str):
    """Top-2 routing weights of a softmax placed in a dense ``[3, 4]`` matrix, times an expert ``b(x)``."""
    weights, index = torch.softmax(m.a(x), -1).topk(2, -1)
    if spelling == 'index_add':
        flat = (index + 4 * torch.arange(3)[:, None]).flatten()
        return torch.zeros(12, dtype=x.dtype).index_add(0, flat, weights.flatten()).view(3, 4) * m.b(x)
    if spelling == 'scatter_reduce sum':
        dense = torch.zeros(3, 4, dtype=x.dtype).scatter_reduce(1, index, weights, 'sum')
    elif spelling == 'index_put_':
        dense = torch.zeros(3, 4, dtype=x.dtype)
        dense.index_put_((torch.arange(3)[:, None], index), weights)
    elif spelling == 'masked_scatter':
        chosen = torch.zeros(3, 4, dtype=torch.bool).scatter(1, index, True)
        ordered = weights.gather(1, index.argsort(1))  # masked_scatter fills in row-major order
        dense = torch.zeros(3, 4, dtype=x.dtype).masked_scatter(chosen, ordered)
    else:  # one_hot
        dense = (F.one_hot(index, 4).to(x.dtype) * weights[..., None]).sum(-2)
    return dense * m.b(x)


def swish(a):
    """SiLU written out (the activation of a value times the value)."""
    return a * torch.sigmoid(a)


def gelu_erf(a):
    """GELU written out with ``erf``, as ESM writes it: a number added to an activation output."""
    return 0.5 * a * (1.0 + torch.erf(a / math.sqrt(2.0)))


def gelu_erf_in_place(a):
    """:py:func:`gelu_erf` with the number added in place."""
    return 0.5 * a * torch.erf(a / math.sqrt(2.0)).add_(1.0)


def gelu_tanh(a):
    """GELU's tanh approximation written out (GPT-2's ``gelu_new``)."""
    return 0.5 * a * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (a + 0.044715 * torch.pow(a, 3.0))))


def gpt_oss_gate(a):
    """GPT-OSS's gate: its input clamped, times the sigmoid of a multiple of it."""
    gate = a.clamp(max=7.0)
    return gate * torch.sigmoid(gate * 1.702)


SPELLINGS = {
    # a residual added to an activation's output, out of place or in place (the identity rule computes the output
    # again in the backward pass: a kept output changed in place made torch refuse the backward pass)
    'an activation, then a residual added': [
        lambda m, x: F.silu(m.a(x)) + m.b(x),
        lambda m, x: plus_in_place(F.silu(m.a(x)), m.b(x)),
        lambda m, x: F.silu(m.a(x)).add_(m.b(x)),
        lambda m, x: plus_in_place(m.act(m.a(x)), m.b(x)),
        lambda m, x: plus_in_place(torch.nn.functional.silu(m.a(x), inplace=False), m.b(x)),
    ],
    'a normalisation, then a residual added': [
        lambda m, x: F.rms_norm(m.a(x), (4,), eps=1e-6) + m.b(x),
        lambda m, x: plus_in_place(F.rms_norm(m.a(x), (4,), eps=1e-6), m.b(x)),
        lambda m, x: plus_in_place(m.norm(m.a(x)), m.b(x)),
    ],
    'a unit vector, then a residual added': [
        lambda m, x: F.normalize(m.a(x), dim=-1) + m.b(x),
        lambda m, x: plus_in_place(F.normalize(m.a(x), dim=-1), m.b(x)),
    ],
    # the pair: a linear map of a gate (an MLP's output), then times a gate; also as a layer, an einsum, a
    # tensordot, addmm with a zero input, and the gate expanded before the product with the matrix
    'silu(h) @ W, then times a gate': [
        lambda m, x: (F.silu(m.a(x)) @ W) * gate(m, x),
        lambda m, x: (F.silu(m.a(x))[..., None] * W).sum(-2) * gate(m, x),
        lambda m, x: (F.silu(m.a(x)).unsqueeze(-1).expand(3, 4, 4) * W).sum(-2) * gate(m, x),
        lambda m, x: torch.einsum('ni,ij->nj', F.silu(m.a(x)), W) * gate(m, x),
        lambda m, x: F.linear(F.silu(m.a(x)), W.T) * gate(m, x),
        lambda m, x: torch.tensordot(F.silu(m.a(x)), W, 1) * gate(m, x),
        lambda m, x: torch.addmm(torch.zeros(4, dtype=torch.float64), F.silu(m.a(x)), W) * gate(m, x),
    ],
    'a sum of activations, times a value': [
        lambda m, x: F.silu(m.a(x)).sum(-1, keepdim=True) * m.b(x),
        lambda m, x: (F.silu(m.a(x)) @ torch.ones(4, 1, dtype=torch.float64)) * m.b(x),
        lambda m, x: torch.einsum('ni->n', F.silu(m.a(x)))[:, None] * m.b(x),
        lambda m, x: 4 * F.silu(m.a(x)).mean(-1, keepdim=True) * m.b(x),
    ],
    'attention: matmul, einsum, bmm, sdpa': [
        lambda m, x: probabilities(m, x) @ m.c(x),
        lambda m, x: torch.softmax(torch.einsum('id,jd->ij', m.a(x), m.b(x)), -1) @ m.c(x),
        lambda m, x: torch.einsum('ij,jd->id', probabilities(m, x), m.c(x)),
        lambda m, x: torch.bmm(probabilities(m, x)[None], m.c(x)[None])[0],
        lambda m, x: F.scaled_dot_product_attention(m.a(x)[None], m.b(x)[None], m.c(x)[None], scale=1.0)[0],
    ],
    # the softmax written out: exp(z) over its sum, the same z exponentiated once or twice, shifted by its maximum or
    # not, the sum kept or unsqueezed, divided or multiplied by its reciprocal, in place or not (refused before)
    'attention: a softmax written out': [
        lambda m, x: probabilities(m, x) @ m.c(x),
        lambda m, x: written_softmax(m, x) @ m.c(x),
        lambda m, x: (lambda z: z.exp() / z.exp().sum(dim=-1, keepdim=True))(scores(m, x)) @ m.c(x),
        lambda m, x: (lambda e: e * e.sum(-1)[..., None].reciprocal())(scores(m, x).exp()) @ m.c(x),
        lambda m, x: (lambda e: e * (1 / e.sum(-1, keepdim=True)))(torch.exp(scores(m, x))) @ m.c(x),
        lambda m, x: (lambda e: e * torch.sum(e, -1, True) ** -1)(scores(m, x).exp()) @ m.c(x),
        lambda m, x: written_softmax_in_place(m, x) @ m.c(x),
    ],
    'transposed attention weights (a property, a function, a method)': [
        lambda m, x: probabilities(m, x).T @ m.c(x),
        lambda m, x: probabilities(m, x).mT @ m.c(x),
        lambda m, x: torch.t(probabilities(m, x)) @ m.c(x),
        lambda m, x: probabilities(m, x).transpose(0, 1) @ m.c(x),
        lambda m, x: probabilities(m, x).permute(1, 0) @ m.c(x),
    ],
    'combined attention weights': [
        lambda m, x: (0.7 * probabilities(m, x) + 0.3 * probabilities(m, x, m.b, m.a)) @ m.c(x),
        lambda m, x: torch.lerp(probabilities(m, x), probabilities(m, x, m.b, m.a), 0.3) @ m.c(x),
        lambda m, x: (
            torch.einsum('t,tij->ij', MIXING, torch.stack([probabilities(m, x), probabilities(m, x, m.b, m.a)]))
            @ m.c(x)
        ),
        lambda m, x: (
            (torch.stack([probabilities(m, x), probabilities(m, x, m.b, m.a)]) * MIXING[:, None, None]).sum(0) @ m.c(x)
        ),
        lambda m, x: 0.7 * (probabilities(m, x) @ m.c(x)) + 0.3 * (probabilities(m, x, m.b, m.a) @ m.c(x)),
    ],
    'routing weights in a dense matrix': [
        lambda m, x, spelling=spelling: routing(m, x, spelling)
        for spelling in ('index_add', 'scatter_reduce sum', 'index_put_', 'masked_scatter', 'one_hot')
    ],
    'masked attention weights, in place or not': [
        lambda m, x: probabilities(m, x).masked_fill(MASK, 0.0) @ m.c(x),
        lambda m, x: torch.where(MASK, 0.0, probabilities(m, x)) @ m.c(x),
        in_place_fill,
        set_entries,
        set_entries_of_a_view,
    ],
    'a rescaled gate, in place or not': [
        lambda m, x: (torch.sigmoid(m.a(x)) * 0.5) * m.b(x),
        in_place_scale,
        lambda m, x: torch.sigmoid(m.a(x)) * torch.full((3, 4), 0.5, dtype=torch.float64) * m.b(x),
    ],
    'a partly rescaled gate, in place or not': [
        lambda m, x: torch.sigmoid(m.a(x)) * torch.tensor([0.5, 0.5, 1.0, 1.0], dtype=torch.float64) * m.b(x),
        scale_a_view_in_place,
    ],
    'aliases of a gated product': [
        lambda m, x: torch.sigmoid(m.a(x)) * m.b(x),
        lambda m, x: torch.multiply(torch.special.expit(m.a(x)), m.b(x)),
        lambda m, x: torch.mul(m.b(x), F.sigmoid(m.a(x))),
        lambda m, x: m.b(x).__rmul__(torch.sigmoid(m.a(x))),
        lambda m, x: torch.sigmoid(m.a(x)).mul(m.b(x)),
    ],
    'powers of a gate': [
        lambda m, x: torch.sigmoid(m.a(x)) ** 2 * m.b(x),
        lambda m, x: torch.square(torch.sigmoid(m.a(x))) * m.b(x),
        lambda m, x: torch.sigmoid(m.a(x)).pow(2) * m.b(x),
        lambda m, x: torch.float_power(torch.sigmoid(m.a(x)), 2) * m.b(x),
        lambda m, x: torch.sigmoid(m.a(x)) * torch.sigmoid(m.a(x)) * m.b(x),
    ],
    # an activation written out is an activation: its output a gate (x times an activation of x), a number added to
    # an activation's output part of it (not a bias that absorbs relevance)
    'SiLU written out, times a value': [
        lambda m, x: F.silu(m.a(x)) * m.b(x),
        lambda m, x: swish(m.a(x)) * m.b(x),
        lambda m, x: (lambda a: torch.sigmoid(a) * a)(m.a(x)) * m.b(x),
        lambda m, x: (lambda a: a * torch.sigmoid(a / 1.0))(m.a(x)) * m.b(x),
        lambda m, x: (lambda a: a * torch.sigmoid(torch.ones(4, dtype=torch.float64) * a))(m.a(x)) * m.b(x),
    ],
    # the two halves of one chunk are two tensors (one autograd node, two outputs): GLU is a value times a gate
    'GLU (halves by indexing, by chunk, by the function), times a value': [
        lambda m, x: (lambda a: a[:, :2] * torch.sigmoid(a[:, 2:]))(m.a(x)) * m.b(x)[:, :2],
        lambda m, x: (lambda a, g: a * torch.sigmoid(g))(*m.a(x).chunk(2, -1)) * m.b(x)[:, :2],
        lambda m, x: (lambda a, g: a * torch.sigmoid(g))(*m.a(x).split(2, -1)) * m.b(x)[:, :2],
        lambda m, x: F.glu(m.a(x), -1) * m.b(x)[:, :2],
    ],
    'Swish with a weight beta written out, times a value': [
        lambda m, x: (lambda a: F.silu(SCALE * a) / SCALE)(m.a(x)) * m.b(x),
        lambda m, x: (lambda a: a * torch.sigmoid(SCALE * a))(m.a(x)) * m.b(x),
        lambda m, x: (lambda a: torch.sigmoid(a * SCALE) * a)(m.a(x)) * m.b(x),
    ],
    # a bound from 0 upwards is ReLU; a bound elsewhere (GPT-OSS's ``clamp(max=7)``) is a value
    'ReLU spelled as a bound, times a value': [
        lambda m, x: F.relu(m.a(x)) * m.b(x),
        lambda m, x: m.a(x).clamp(min=0) * m.b(x),
        lambda m, x: m.a(x).clamp(0) * m.b(x),
        lambda m, x: torch.clamp(m.a(x), min=0.0) * m.b(x),
        lambda m, x: torch.clamp_min(m.a(x), 0) * m.b(x),
        lambda m, x: m.a(x).clone().clamp_(min=0) * m.b(x),
    ],
    # leaky ReLU as the maximum of a value and a multiple of it (CP-LRP held it for a value, 39% of the largest
    # relevance apart, and the MLP rules 100%)
    'leaky ReLU spelled as a maximum, times a value': [
        lambda m, x: F.leaky_relu(m.a(x), 0.1) * m.b(x),
        lambda m, x: (lambda a: torch.maximum(a, 0.1 * a))(m.a(x)) * m.b(x),
        lambda m, x: (lambda a: torch.fmax(a * 0.1, a))(m.a(x)) * m.b(x),
        lambda m, x: (lambda a: a.maximum(a / 10))(m.a(x)) * m.b(x),
    ],
    'the absolute value as a maximum, times a value': [
        lambda m, x: m.a(x).abs() * m.b(x),
        lambda m, x: (lambda a: torch.maximum(a, -a))(m.a(x)) * m.b(x),
        lambda m, x: (lambda a: torch.maximum(-a, a))(m.a(x)) * m.b(x),
        lambda m, x: (lambda a: torch.fmax(a, torch.neg(a)))(m.a(x)) * m.b(x),
    ],
    # ReLU and leaky ReLU selected by the sign of their input (values before: CP-LRP 79% and 39% of the largest
    # relevance apart, the MLP rules 100%)
    'ReLU selected by the sign, times a value': [
        lambda m, x: F.relu(m.a(x)) * m.b(x),
        lambda m, x: (lambda a: torch.where(a > 0, a, 0.0))(m.a(x)) * m.b(x),
        lambda m, x: (lambda a: torch.where(a <= 0, 0.0, a))(m.a(x)) * m.b(x),
        lambda m, x: (lambda a: a.masked_fill(a < 0, 0.0))(m.a(x)) * m.b(x),
        lambda m, x: (lambda a: a * (a > 0))(m.a(x)) * m.b(x),
        lambda m, x: (lambda a: (0 < a) * a)(m.a(x)) * m.b(x),
        lambda m, x: (lambda a: a * (a > 0).to(a.dtype))(m.a(x)) * m.b(x),
        lambda m, x: (lambda a: (a >= 0).double() * a)(m.a(x)) * m.b(x),
    ],
    'leaky ReLU selected by the sign, times a value': [
        lambda m, x: F.leaky_relu(m.a(x), 0.1) * m.b(x),
        lambda m, x: (lambda a: torch.where(a > 0, a, 0.1 * a))(m.a(x)) * m.b(x),
        lambda m, x: (lambda a: torch.where(a.ge(0), a, a / 10))(m.a(x)) * m.b(x),
    ],
    # softsign written out, a value over an activation of it (CP-LRP held it for a value, 39% of the largest relevance
    # apart, the MLP rules 100%)
    'softsign written out, times a value': [
        lambda m, x: F.softsign(m.a(x)) * m.b(x),
        lambda m, x: (lambda a: a / (1 + a.abs()))(m.a(x)) * m.b(x),
        lambda m, x: (lambda a: a / (a.abs() + 1))(m.a(x)) * m.b(x),
    ],
    # ReLU6 as a bound from 0 to 6 (CP-LRP held ``clamp(x, 0, 6)`` for a value, 79% of the largest relevance apart)
    'ReLU6 spelled as a bound, times a value': [
        lambda m, x: F.relu6(m.a(x)) * m.b(x),
        lambda m, x: m.a(x).clamp(0, 6) * m.b(x),
        lambda m, x: torch.clamp(m.a(x), min=0.0, max=6.0) * m.b(x),
        lambda m, x: F.hardtanh(m.a(x), 0.0, 6.0) * m.b(x),
        lambda m, x: m.a(x).clamp_min(0).clamp_max(6) * m.b(x),
    ],
    'GELU written out with erf, times a value': [
        lambda m, x: F.gelu(m.a(x)) * m.b(x),
        lambda m, x: gelu_erf(m.a(x)) * m.b(x),
        lambda m, x: (lambda a: a * (0.5 + 0.5 * torch.erf(a * (1 / math.sqrt(2.0)))))(m.a(x)) * m.b(x),
    ],
    "GPT-OSS's gate, times a value": [
        lambda m, x: (lambda g: F.silu(g * 1.702) / 1.702)(m.a(x).clamp(max=7.0)) * m.b(x),
        lambda m, x: gpt_oss_gate(m.a(x)) * m.b(x),
    ],
    'GELU written out, plus a value': [
        lambda m, x: F.gelu(m.a(x)) + m.b(x),
        lambda m, x: gelu_erf(m.a(x)) + m.b(x),
    ],
    'the tanh approximation of GELU written out, plus a value': [
        lambda m, x: F.gelu(m.a(x), approximate='tanh') + m.b(x),
        lambda m, x: gelu_tanh(m.a(x)) + m.b(x),
    ],
    # the tanh approximation of GELU written out (transformers' ``NewGELUActivation``, nanoGPT's ``new_gelu``): its
    # gate ``1 + tanh(c (x + 0.044715 x^3))`` is a function of a sum of functions of ``x``; before, neither composite
    # took ``0.5 x (1 + tanh(.))`` for an activation (AttnLRP 22% of the largest relevance apart, CP-LRP 39%)
    'the tanh approximation of GELU written out, times a value': [
        lambda m, x: F.gelu(m.a(x), approximate='tanh') * m.b(x),
        lambda m, x: gelu_tanh(m.a(x)) * m.b(x),
    ],
    # GELU with the complementary error function or the normal distribution function
    'GELU written out with erfc or ndtr, times a value': [
        lambda m, x: F.gelu(m.a(x)) * m.b(x),
        lambda m, x: (lambda a: 0.5 * a * torch.erfc(-a / math.sqrt(2.0)))(m.a(x)) * m.b(x),
        lambda m, x: (lambda a: a * torch.special.ndtr(a))(m.a(x)) * m.b(x),
    ],
    # hard swish written out (MobileNetV3's ``x * relu6(x + 3) / 6``, timm's ``x * relu6(x + 3).div_(6)``): the number
    # 3 inside the gate is part of the activation; before, AttnLRP let it absorb a share (9% of the largest relevance
    # apart, 34% with the bound) and CP-LRP held ``x * relu6(x + 3)`` for a value (39%)
    'hard swish written out, times a value': [
        lambda m, x: F.hardswish(m.a(x)) * m.b(x),
        lambda m, x: (lambda a: a * F.hardsigmoid(a))(m.a(x)) * m.b(x),
        lambda m, x: (lambda a: a * F.relu6(a + 3) / 6)(m.a(x)) * m.b(x),
        lambda m, x: (lambda a: a * F.relu6(a + 3.0).div_(6.0))(m.a(x)) * m.b(x),
        lambda m, x: (lambda a: a * (a + 3).clamp(0, 6).div(6))(m.a(x)) * m.b(x),
        lambda m, x: (lambda a: a * F.hardtanh(a + 3, 0.0, 6.0) / 6)(m.a(x)) * m.b(x),
    ],
    'one minus a sigmoid, times a value': [
        lambda m, x: torch.sigmoid(-m.a(x)) * m.b(x),
        lambda m, x: (1 - torch.sigmoid(m.a(x))) * m.b(x),
        lambda m, x: torch.rsub(torch.sigmoid(m.a(x)), 1.0) * m.b(x),
        lambda m, x: (-torch.sigmoid(m.a(x))).add(1.0) * m.b(x),
    ],
    'a normalised gate': [
        lambda m, x: F.rms_norm(torch.sigmoid(m.a(x)), (4,), eps=1e-6) * m.b(x),
        lambda m, x: rms_spelled(torch.sigmoid(m.a(x))) * m.b(x),
        lambda m, x: m.norm(torch.sigmoid(m.a(x))) * m.b(x),
    ],
    # a normaliser times a multiple of what it normalises (by a number or a constant tensor, also cast or changed in
    # place) is a normalisation, held constant (Prop. 3.4), wherever the weight is multiplied
    'an RMSNorm, its weight multiplied after or before the normaliser': [
        lambda m, x: F.rms_norm(m.a(x), (4,), SCALE, eps=1e-6),
        lambda m, x: rms_spelled(m.a(x)) * SCALE,
        lambda m, x: rms_weighted_first(m.a(x)),
        lambda m, x: (lambda a: a * (SCALE * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + 1e-6)))(m.a(x)),
        lambda m, x: (lambda a: (2 * a) * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + 1e-6) * (SCALE / 2))(m.a(x)),
        lambda m, x: (lambda a: (SCALE * a).to(a.dtype) * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + 1e-6))(m.a(x)),
        lambda m, x: rms_weighted_in_place(m.a(x)),
        lambda m, x: (lambda a: SCALE * a * torch.rsqrt(torch.einsum('nd,nd->n', a, a)[:, None] / 4 + 1e-6))(m.a(x)),
    ],
    # a matrix product by a constant is no multiple, whatever its shape: a gate of one, times another, is a value
    'a gate of a square matrix product times another, then times a value': [
        lambda m, x: (lambda h: torch.sigmoid(F.linear(h, W.T, None)) * F.linear(h, W, None))(m.a(x)) * m.c(x),
        lambda m, x: (lambda h: torch.sigmoid(h @ W) * (h @ W.T))(m.a(x)) * m.c(x),
        lambda m, x: (lambda h: torch.sigmoid(torch.einsum('nd,de->ne', h, W)) * torch.mm(h, W.T))(m.a(x)) * m.c(x),
    ],
    # a product with a factor offset by a number is the sum of the products (distributivity): the number's part of it
    # goes to the other factor whole, not absorbed like a bias; through views and casts of the offset factor
    'a value times one plus a value, or distributed': [
        lambda m, x: m.a(x) * (1 + m.b(x)),
        lambda m, x: m.a(x) + m.a(x) * m.b(x),
        lambda m, x: torch.addcmul(m.a(x), m.a(x), m.b(x)),
        lambda m, x: (m.b(x) + 1) * m.a(x),
        lambda m, x: m.a(x) * (m.b(x) - (-1)),
        lambda m, x: m.a(x) * torch.add(m.b(x), 0.5, alpha=2),
        lambda m, x: m.a(x) * (1 - (-m.b(x))),
        lambda m, x: m.a(x) * torch.rsub(-m.b(x), 1),
        lambda m, x: m.a(x) * m.b(x).clone().add_(1),
        lambda m, x: m.a(x) * (m.b(x) + torch.tensor(1.0, dtype=torch.float64)),
        lambda m, x: m.a(x) * (m.b(x) + 1).view(3, 4, 1).permute(2, 0, 1).squeeze(0).to(torch.float64),
    ],
    'a value times two minus a value, or distributed': [
        lambda m, x: m.a(x) * (2 - m.b(x)),
        lambda m, x: 2 * m.a(x) - m.a(x) * m.b(x),
    ],
    "GPT-OSS's product of one plus a value and a gate, or distributed": [
        lambda m, x: (m.b(x) + 1) * F.silu(m.a(x)),
        lambda m, x: F.silu(m.a(x)) + m.b(x) * F.silu(m.a(x)),
    ],
    'a value times one plus a broadcast value, or distributed': [
        lambda m, x: m.a(x) * (1 + m.b(x)[:, :1]),
        lambda m, x: m.a(x) + m.a(x) * m.b(x)[:, :1],
    ],
    # a product of products is one product of all their factors (Prop. 3.2 for N factors), however it is grouped
    'a product of three values, chained or at once': [
        lambda m, x: m.a(x) * m.b(x) * m.c(x),
        lambda m, x: m.a(x) * (m.b(x) * m.c(x)),
        lambda m, x: torch.stack([m.a(x), m.b(x), m.c(x)]).prod(0),
        lambda m, x: torch.einsum('ij,ij,ij->ij', m.a(x), m.b(x), m.c(x)),
    ],
    'a gate times two values, chained': [
        lambda m, x: torch.sigmoid(m.a(x)) * m.b(x) * m.c(x),
        lambda m, x: torch.sigmoid(m.a(x)) * (m.b(x) * m.c(x)),
        lambda m, x: (m.c(x) * torch.sigmoid(m.a(x))) * m.b(x),
    ],
    # a value times itself is a square, an activation's output (a gate of CP-LRP), as ``x ** 2`` is
    'a square written as a product, times a value': [
        lambda m, x: m.a(x) ** 2 * m.b(x),
        lambda m, x: (lambda a: a * a)(m.a(x)) * m.b(x),
        lambda m, x: (lambda a: a.mul(a))(m.a(x)) * m.b(x),
        lambda m, x: (lambda a: a * (2 * a))(m.a(x)) * m.b(x) / 2,
        lambda m, x: (lambda a: a * a.clone())(m.a(x)) * m.b(x),
        lambda m, x: (lambda a: a.clone().mul_(a))(m.a(x)) * m.b(x),
    ],
    # a copy or a view that keeps every element at its place (clone, view to the same shape, reshape) is the tensor:
    # ``x.clone() * sigmoid(x)`` is SiLU; before, AttnLRP gave it a relevance 22% of the largest apart from
    # ``silu(x)``'s, CP-LRP 39% (a value times a gate); ``sigmoid(x).mul(x)`` computes the output again in the
    # backward pass as ``x * sigmoid(x)`` does (the model may change it in place: torch refused the pass before)
    'SiLU written out through a copy or a view, times a value': [
        lambda m, x: F.silu(m.a(x)) * m.b(x),
        lambda m, x: (lambda a: a.clone() * torch.sigmoid(a))(m.a(x)) * m.b(x),
        lambda m, x: (lambda a: a * torch.sigmoid(a.clone()))(m.a(x)) * m.b(x),
        lambda m, x: (lambda a: a.view(3, 4) * torch.sigmoid(a))(m.a(x)) * m.b(x),
        lambda m, x: (lambda a: a.reshape(3, 4) * torch.sigmoid(a).contiguous())(m.a(x)) * m.b(x),
        lambda m, x: (lambda a: a.sigmoid().mul(a).mul_(m.b(x)))(m.a(x)),
        lambda m, x: (lambda a: a[None] * torch.sigmoid(a[None]))(m.a(x))[0] * m.b(x),
        lambda m, x: (lambda a: a.flatten().view(3, 4) * torch.sigmoid(a))(m.a(x)) * m.b(x),
        lambda m, x: (lambda a: a.unsqueeze(1) * torch.sigmoid(a).view(3, 1, 4))(m.a(x)).squeeze(1) * m.b(x),
    ],
    # an in-place product of relevance-carrying tensors is the out-of-place product written into the tensor (refused
    # before): a gated product, a product of products, a square, ``addcmul_``, a product of an expanded tensor
    'a gated product in place': [
        lambda m, x: F.silu(m.a(x)) * m.b(x),
        lambda m, x: F.silu(m.a(x)).mul_(m.b(x)),
        lambda m, x: plus_in_place(torch.zeros(3, 4, dtype=torch.float64), m.b(x)).__imul__(F.silu(m.a(x))),
        lambda m, x: (lambda a: (a * torch.sigmoid(a)).mul_(m.b(x)))(m.a(x)),
        lambda m, x: torch.zeros(3, 4, dtype=torch.float64).addcmul_(F.silu(m.a(x)), m.b(x)),
    ],
    'a product of three values in place, or of a copy': [
        lambda m, x: m.a(x) * m.b(x) * m.c(x),
        lambda m, x: (m.a(x) * m.b(x)).mul_(m.c(x)),
        lambda m, x: (m.a(x) * m.b(x)).clone() * m.c(x),
        lambda m, x: (2 * (m.a(x) * m.b(x))) * m.c(x) / 2,
    ],
    'a value times an expanded value, in place or not': [
        lambda m, x: m.a(x)[:, :1] * m.b(x),
        lambda m, x: m.a(x)[:, :1].expand(3, 4).clone().mul_(m.b(x)),
        lambda m, x: m.a(x)[:, :1].expand_as(m.b(x)).mul(m.b(x)),
    ],
    # a decomposed function computed in place writes its result into the changed tensor, used after it (before, the
    # tensor kept its old values: the model's output changed; ``a.hypot_(b)`` failed in torch's backward pass)
    'an interpolation, in place or not, times a gate': [
        lambda m, x: torch.lerp(m.a(x), m.b(x), 0.3) * gate(m, x),
        lambda m, x: (lambda a: (a.lerp_(m.b(x), 0.3), a)[1])(m.a(x)) * gate(m, x),
    ],
    'a division added, in place or not': [
        lambda m, x: m.c(x) + 0.5 * m.a(x) / (2 + m.b(x).abs()),
        lambda m, x: (lambda c: (c.addcdiv_(m.a(x), 2 + m.b(x).abs(), value=0.5), c)[1])(m.c(x)),
    ],
    'a hypotenuse, in place or not, times a gate': [
        lambda m, x: torch.hypot(m.a(x), m.b(x)) * gate(m, x),
        lambda m, x: (lambda a: (a.hypot_(m.b(x)), a)[1])(m.a(x)) * gate(m, x),
    ],
    'a product scattered, in place or not': [
        lambda m, x: m.a(x).scatter_reduce(1, torch.tensor([[0, 0, 1, 2]] * 3), m.b(x), 'prod'),
        lambda m, x: m.a(x).clone().scatter_reduce_(1, torch.tensor([[0, 0, 1, 2]] * 3), m.b(x), 'prod'),
    ],
    # a tensor times an inverse of another (a reciprocal, an inverse square root, a negative power; rescaled or cast)
    # is divided by it: the divisor held constant, as in ``a / v``
    'a value divided by a function of another, or times its inverse': [
        lambda m, x: m.a(x) / (3 + m.b(x).abs()),
        lambda m, x: m.a(x) * torch.reciprocal(3 + m.b(x).abs()),
        lambda m, x: m.a(x) * (3 + m.b(x).abs()) ** -1,
        lambda m, x: m.a(x) * (1 / (3 + m.b(x).abs())),
        lambda m, x: m.a(x) * (0.5 * torch.reciprocal(1.5 + 0.5 * m.b(x).abs())),
        lambda m, x: torch.reciprocal(3 + m.b(x).abs()).to(torch.float64).unsqueeze(0).squeeze(0) * m.a(x),
    ],
    'a value divided by a square root of another, or times its inverse': [
        lambda m, x: m.a(x) / torch.sqrt(1 + m.b(x) ** 2),
        lambda m, x: m.a(x) * torch.rsqrt(1 + m.b(x) ** 2),
        lambda m, x: m.a(x) * (1 + m.b(x) ** 2) ** -0.5,
    ],
    'a LayerNorm, its weight multiplied after or before the normaliser': [
        lambda m, x: F.layer_norm(m.a(x), (4,), SCALE, None, 1e-5),
        lambda m, x: layer_norm_weighted_first(m.a(x)),
        lambda m, x: layer_norm_weighted_centre(m.a(x)),
    ],
}


#: Spellings a composite explains otherwise by design, with why: ``(case, composite) -> spellings compared``.
DESIGNED = {
    # relevance patching's MLP rules give normalisation modules no rule (their plain gradient through the module)
    ('a normalised gate', MLPRules): 2,
    ('a normalisation, then a residual added', MLPRules): 2,
    # relevance patching's MLP rules give a product that is not gated its plain gradient: ``x * x`` twice the relevance
    # of ``x ** 2`` (the activation rule)
    ('a square written as a product, times a value', MLPRules): 1,
    # ... and a product with a gate that is not gated by it alone (``(b * c) * gate``) its plain gradient too
    ('a gate times two values, chained', MLPRules): 1,
}


@pytest.mark.parametrize('composite', [CPLRPEpsilon, AttnLRPEpsilon], ids=lambda composite: composite.__name__)
def test_a_number_added_in_place_to_an_activation_output(composite):
    """GELU written out with the number added in place gets the relevance of ``gelu``. AttnLRP's identity rule
    computes the activation's output again in the backward pass instead of keeping it (the change in place overwrote
    a kept output: torch refused the backward pass)."""
    x = _inputs()
    expected = attributed(_model(lambda m, x: F.gelu(m.a(x)) * m.b(x)), composite(), x)
    found = attributed(_model(lambda m, x: gelu_erf_in_place(m.a(x)) * m.b(x)), composite(), x)
    torch.testing.assert_close(found, expected, rtol=1e-10, atol=1e-12)


class _EmbeddedTokens(torch.nn.Module):
    """Embedded tokens (20, width 4), two bias-free projections ``a`` and ``b`` and a head of 2 outputs."""

    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(20, 4)
        self.a, self.b, self.head = (torch.nn.Linear(4, width, bias=False) for width in (4, 4, 2))

    def get_input_embeddings(self):
        return self.embedding


class ScaledInPlace(_EmbeddedTokens):
    """One attention head over embedded tokens whose probabilities are scaled in place (``p *= 0.5``)."""

    def __init__(self, in_place: bool):
        super().__init__()
        self.in_place = in_place

    def forward(self, input_ids=None, inputs_embeds=None):
        x = self.embedding(input_ids) if inputs_embeds is None else inputs_embeds
        p = torch.softmax(self.a(x) @ self.b(x).transpose(-1, -2), -1)
        if self.in_place:
            p *= 0.5
        else:
            p = p * 0.5
        return self.head(p @ x)[:, -1]


def test_a_kept_tensor_changed_in_place_is_refused_by_name():
    """Attention probabilities scaled in place: AttnLRP's softmax rule keeps them for the backward pass (as the plain
    softmax does), and torch refused the pass in its own words; the refusal names the model and what to do. Out of
    place, the same model conserves under CP-LRP."""
    torch.manual_seed(0)
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(UnsupportedModelError, match=r'ScaledInPlace changes in place a tensor that a rule .*out of'):
        explain(ScaledInPlace(True).double().eval(), ids)
    explanation = explain(ScaledInPlace(False).double().eval(), ids, method='cplrp')
    torch.testing.assert_close(explanation.relevance.sum(), explanation.logit.sum(), rtol=1e-12, atol=0)


class GateChangedLater(_EmbeddedTokens):
    """SiLU written out, ``a * g`` with ``g = sigmoid(a)``, then ``g`` changed in place (and used)."""

    def forward(self, input_ids=None, inputs_embeds=None):
        x = self.embedding(input_ids) if inputs_embeds is None else inputs_embeds
        a = self.a(x)
        g = torch.sigmoid(a)
        y = a * g
        g.mul_(3.0)  # the plain pass refuses it: sigmoid keeps its output
        return self.head(y * self.b(x) + g)[:, -1]


def test_a_gate_changed_after_an_activation_written_out_is_refused_by_name():
    """The identity rule of ``a * sigmoid(a)`` computes the output again in the backward pass; ``sigmoid(a)`` changed
    in place after it (as the plain pass refuses) is refused by name. Before, the output was computed from the changed
    gate: AttnLRP's relevance of ``y = a * g; g.mul_(3)`` was that of ``a * 3 g``, silently."""
    torch.manual_seed(0)
    with pytest.raises(UnsupportedModelError, match=r'GateChangedLater changes in place a tensor that a rule'):
        explain(GateChangedLater().double().eval(), torch.tensor([[1, 2, 3]]))


@pytest.mark.parametrize('composite', [AttnLRPEpsilon, CPLRPEpsilon], ids=lambda composite: composite.__name__)
def test_a_transposed_square_is_not_a_copy(composite):
    """``h.T * sigmoid(h)`` of a square ``h`` is a value times a gate, not SiLU: a view of ``h``'s shape with other
    strides holds its elements elsewhere (:py:func:`~zennit_attn.operations.marks.same_elements`); the relevance of
    the transpose written as a selection (``h.T.flip(0).flip(0)``, which the engine does not follow)."""
    x = _inputs()

    def spelled(transposed):
        return lambda m, x: (lambda h: transposed(h) * torch.sigmoid(h))(m.a(x)[:, :3]) * m.b(x)[:, :3]

    expected = attributed(_model(spelled(lambda h: h.T.flip(0).flip(0))), composite(), x)
    found = attributed(_model(spelled(lambda h: h.T)), composite(), x)
    torch.testing.assert_close(found, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize('composite', [AttnLRPEpsilon, CPLRPEpsilon], ids=lambda composite: composite.__name__)
def test_an_extremum_of_broadcast_views_is_not_a_rectifier(composite):
    """``torch.maximum(a[:, None], 0.1 * a[None])`` pairs every element of ``a`` with every other (an outer maximum):
    no leaky ReLU of ``a``, though ``a[:, None]`` and ``a[None]`` both hold ``a``'s elements in their order; the
    relevance of the second view written as a selection the engine does not follow (``a.flip(0).flip(0)``)."""
    x = _inputs()

    def spelled(view):
        return lambda m, x: (lambda a: torch.maximum(a[:, None], 0.1 * view(a)[None]))(m.a(x)) * m.b(x)

    expected = attributed(_model(spelled(lambda a: a.flip(0).flip(0))), composite(), x)
    found = attributed(_model(spelled(lambda a: a)), composite(), x)
    torch.testing.assert_close(found, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    'case', ['an interpolation, in place or not, times a gate', 'a division added, in place or not']
)
def test_a_decomposed_function_in_place_keeps_the_output(case):
    """Inside the composite's context the model computes what it computes without it (1e-15): ``a.lerp_(b, w)`` and
    ``c.addcdiv_(a, b)`` change ``a`` and ``c`` (before, the decomposition's result was returned and the tensor kept
    its old values, so that a model using it after the call computed another output)."""
    x = _inputs()
    model = _model(SPELLINGS[case][1])
    with torch.no_grad():
        plain = model(x)
    with AttnLRPEpsilon().context(model) as modified:
        explained = modified(x.clone().requires_grad_(True))
    torch.testing.assert_close(explained.detach(), plain, rtol=0, atol=1e-15)


def test_a_bias_before_an_activation_keeps_its_share():
    """A number added to a value (the bias of a linear map, here before a GELU) is not part of the activation: it
    absorbs its share (Eq. 8), as a linear layer's bias does; added to the activation's output it is part of it and
    absorbs nothing (CP-LRP conserves the relevance of every output)."""
    x = _inputs()
    biased = attributed(_model(lambda m, x: F.gelu(m.a(x) + 0.5)), CPLRPEpsilon(), x)
    shifted = attributed(_model(lambda m, x: F.gelu(m.a(x)) + 0.5), CPLRPEpsilon(), x)
    assert abs(float(biased.sum()) - 12.0) > 0.1
    torch.testing.assert_close(shifted.sum(), torch.tensor(12.0, dtype=torch.float64), rtol=1e-10, atol=1e-10)


def _tiny(mapping: str, architecture: str) -> torch.nn.Module:
    """The architecture check's tiny random model of ``architecture`` (float64, biases zeroed)."""
    model, _, _ = built_model(
        mapping,
        lambda: (model_class(mapping, architecture)[0], tiny_config(model_class(mapping, architecture)[1])),
        0,
        torch.Generator().manual_seed(0),
    )
    return model


def _esm_relevance(composite) -> torch.Tensor:
    model = _tiny('masked-lm', 'esm')
    ids = torch.tensor([[0, 7, 12, 5, 20, 9, 14, 2]])
    leaf = model.get_input_embeddings()(ids).detach().requires_grad_(True)
    with composite.context(model) as modified:
        logits = modified(inputs_embeds=leaf, attention_mask=torch.ones_like(ids)).logits[0, 3]
        logits[logits.argmax()].backward()
    return leaf.grad.sum(-1)


@pytest.mark.parametrize('composite', [AttnLRPEpsilon, CPLRPEpsilon], ids=lambda composite: composite.__name__)
def test_esm_gelu_written_out_gets_the_rule_of_gelu(composite, monkeypatch):
    """ESM computes its FFN's GELU as ``x * 0.5 * (1 + erf(x / sqrt(2)))`` inline: the same relevance as with
    ``F.gelu`` (1e-12). Before the number added to ``erf`` was part of the activation, AttnLRP's relevance of a tiny
    ESM summed to a third of the explained logit against ``F.gelu``'s whole."""
    written = _esm_relevance(composite())
    monkeypatch.setattr(modeling_esm, 'gelu', F.gelu)
    torch.testing.assert_close(written, _esm_relevance(composite()), rtol=0, atol=1e-12)


def _silu_gate(self, gate_up: torch.Tensor) -> torch.Tensor:
    """GPT-OSS's gated activation with its gate spelled ``silu(alpha g) / alpha`` (the same function)."""
    gate, up = gate_up[..., ::2], gate_up[..., 1::2]
    gate, up = gate.clamp(min=None, max=self.limit), up.clamp(min=-self.limit, max=self.limit)
    return (up + 1) * (F.silu(gate * self.alpha) / self.alpha)


@pytest.mark.parametrize('composite', [AttnLRPEpsilon, CPLRPEpsilon], ids=lambda composite: composite.__name__)
def test_gpt_oss_gate_is_an_activation(composite, monkeypatch):
    """GPT-OSS writes its gate as ``g * sigmoid(alpha g)``: the relevance of ``silu(alpha g) / alpha`` (1e-12); CP-LRP
    holds it constant (before, it gave the gate half of the gated product's relevance: 4% of the largest token
    relevance of a tiny GPT-OSS apart)."""
    written = _token_relevance(_tiny('causal-lm', 'gpt_oss'), composite())
    monkeypatch.setattr(modeling_gpt_oss.GptOssExperts, '_apply_gate', _silu_gate)
    torch.testing.assert_close(
        written, _token_relevance(_tiny('causal-lm', 'gpt_oss'), composite()), rtol=0, atol=1e-12
    )


def _model(function) -> Projected:
    torch.manual_seed(0)
    return Projected(function).double()


def _inputs() -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(3, 4, dtype=torch.float64)


@pytest.mark.parametrize('composite', COMPOSITES, ids=lambda composite: composite.__name__)
@pytest.mark.parametrize('case', SPELLINGS)
def test_spellings_get_one_relevance(case, composite):
    """Every spelling of a case gets the relevance of the first (1e-10); CP-LRP conserves it."""
    x = _inputs()
    first, *others = SPELLINGS[case][: DESIGNED.get((case, composite))]
    expected = attributed(_model(first), composite(), x)
    for index, spelling in enumerate(others, 1):
        found = attributed(_model(spelling), composite(), x)
        torch.testing.assert_close(
            found, expected, rtol=1e-10, atol=1e-10 * float(expected.abs().max()), msg=f'spelling {index} of {case}'
        )
    if composite is CPLRPEpsilon:
        with torch.no_grad():
            outputs = (_model(first)(x) != 0).sum()
        torch.testing.assert_close(expected.sum(), outputs.double(), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(
    'spelling',
    [
        lambda e: e / (e.sum(-1, keepdim=True) + 1e-9),  # a shifted sum: not a softmax
        lambda e: e / (2 * e.sum(-1, keepdim=True)),
        lambda e: e / e.sum(-1).unsqueeze(0),  # the sum broadcast along the other dimension
        lambda e: e / e.sum(-1, keepdim=True).flip(0),
        lambda e: e / e.sum(-1, keepdim=True) + e.sum(-1, keepdim=True).log(),
        lambda e: e.masked_fill(MASK, 0.0) / e.masked_fill(MASK, 0.0).sum(-1, keepdim=True),
        lambda e: e / (2 * e).exp().sum(-1, keepdim=True),  # another exponential's sum
    ],
    ids=['shifted', 'doubled', 'broadcast', 'flipped', 'sum used', 'masked', 'other logits'],
)
def test_what_is_not_a_softmax_written_out_is_refused(spelling):
    """Divisions of exponentials that are not ``softmax(z)``, or a sum of exponentials used otherwise, are refused by
    name (neither the softmax rule nor any other AttnLRP rule applies to them)."""
    model = _model(lambda m, x: spelling(scores(m, x).exp()) @ m.c(x))
    with pytest.raises(UnsupportedModelError, match='exp|sum of exponentials'):
        attributed(model, AttnLRPEpsilon(), _inputs())


def test_a_softmax_of_logits_changed_after_their_exponential_is_refused():
    """``z`` changed in place after ``exp(z)``: the division is not ``softmax`` of what ``z`` holds now."""

    def changed(m, x):
        logits = scores(m, x)
        weights = logits.exp()
        logits.add_(1.0)
        return (weights / weights.sum(-1, keepdim=True)) @ m.c(x)

    with pytest.raises(UnsupportedModelError, match='exp'):
        attributed(_model(changed), AttnLRPEpsilon(), _inputs())


@pytest.mark.parametrize(
    'spelling, function',
    [
        (lambda h: h / (1 + torch.exp(-h)), 'F.silu'),
        (lambda h: torch.log1p(torch.exp(h)), 'F.softplus'),
        (lambda h: torch.logaddexp(h, torch.zeros_like(h)), 'F.softplus'),
        (lambda h: torch.where(h > 0, h, torch.expm1(h)), 'F.elu'),
    ],
    ids=['silu', 'softplus log1p', 'softplus logaddexp', 'elu'],
)
def test_an_activation_written_with_exp_is_refused_naming_its_function(spelling, function):
    """An activation written with ``exp`` or its relatives has no rule of its own (only an exponential of attention
    logits has one); the refusal names the torch function that has it."""
    model = _model(lambda m, x: (lambda h: spelling(h) * m.b(x))(m.a(x)))
    with pytest.raises(UnsupportedModelError, match=re.escape(function)):
        attributed(model, AttnLRPEpsilon(), _inputs())


def test_a_linear_map_of_a_gate_is_a_value_under_cp_lrp():
    """``silu(h) @ W`` is an MLP's output, not a gate: times a gate, CP-LRP gives it all the relevance and the gate
    none (by hand), whichever way the map is written."""
    x = _inputs()
    for spelling in SPELLINGS['silu(h) @ W, then times a gate'][:2]:
        model = _model(spelling)
        expected = by_hand(lambda xx, m=model: (identity(m.a(xx), F.silu(m.a(xx))) @ W) * gate(m, xx).detach(), x)
        torch.testing.assert_close(attributed(model, CPLRPEpsilon(), x), expected, rtol=1e-10, atol=1e-12)


def _token_relevance(model, composite) -> torch.Tensor:
    ids = torch.tensor([[5, 17, 9, 30, 2, 11]])
    leaf = model.get_input_embeddings()(ids).detach().requires_grad_(True)
    with composite.context(model) as modified:
        logits = modified(inputs_embeds=leaf, use_cache=False).logits[0, -1]
        logits[logits.argmax()].backward()
    return leaf.grad.sum(-1)


def _distributed_gate(self, gate_up: torch.Tensor) -> torch.Tensor:
    """GPT-OSS's gated activation with its product distributed: ``glu + up * glu`` for ``(up + 1) * glu``."""
    gate, up = gate_up[..., ::2], gate_up[..., 1::2]
    gate, up = gate.clamp(min=None, max=self.limit), up.clamp(min=-self.limit, max=self.limit)
    glu = gate * torch.sigmoid(gate * self.alpha)
    return glu + up * glu


@pytest.mark.parametrize('composite', [AttnLRPEpsilon, CPLRPEpsilon], ids=lambda composite: composite.__name__)
def test_gpt_oss_offset_product_is_distributed(composite, monkeypatch):
    """GPT-OSS's ``(up + 1) * glu`` gets the relevance of ``glu + up * glu`` (1e-12), and CP-LRP conserves the relevance
    1 of the logit of a tiny GPT-OSS (before, the 1 absorbed a share like a bias: CP-LRP relevance / logit 0.908)."""
    model = _tiny('causal-lm', 'gpt_oss')
    written = _token_relevance(model, composite())
    if composite is CPLRPEpsilon:
        torch.testing.assert_close(written.sum(), torch.tensor(1.0, dtype=torch.float64), rtol=1e-9, atol=0)
    monkeypatch.setattr(modeling_gpt_oss.GptOssExperts, '_apply_gate', _distributed_gate)
    torch.testing.assert_close(_token_relevance(model, composite()), written, rtol=0, atol=1e-12)


def test_gemma3n_altup_correction_conserves():
    """Gemma 3n's AltUp correction ``innovation * (coefs + 1)`` (the offset factor permuted and unsqueezed before the
    product): CP-LRP's relevance of a tiny Gemma 3n sums to the logit's relevance 1 (1e-9; before, 0.455: the 1
    absorbed half of each correction's relevance like a bias)."""
    model = _tiny('causal-lm', 'gemma3n_text')
    relevance = _token_relevance(model, CPLRPEpsilon())
    torch.testing.assert_close(relevance.sum(), torch.tensor(1.0, dtype=torch.float64), rtol=1e-9, atol=0)


@pytest.mark.parametrize('composite', [AttnLRPEpsilon, CPLRPEpsilon], ids=lambda composite: composite.__name__)
def test_qwen3_next_chunked_and_recurrent_delta_rules_agree(composite, monkeypatch):
    """Qwen3-Next (a tiny random model) with transformers' recurrent gated delta rule in place of the chunked one:
    the same relevance, to the rounding of transformers' float32 arithmetic inside the recurrence (before: CP-LRP
    2.2% of the largest relevance apart, the recurrent spelling's output a gate of its gated norm)."""
    model = _tiny('causal-lm', 'qwen3_next')
    chunked = _token_relevance(model, composite())
    monkeypatch.setattr(
        modeling_qwen3_next, 'torch_chunk_gated_delta_rule', modeling_qwen3_next.torch_recurrent_gated_delta_rule
    )
    recurrent = _token_relevance(model, composite())
    scale = float(chunked.abs().max())
    torch.testing.assert_close(recurrent, chunked, rtol=0, atol=1e-7 * scale)
