"""One relevance whatever the spelling: what a tensor is (a gate of CP-LRP, a softmax output, a value) is decided by
the marks the operations declare in the registry (:py:mod:`zennit_attn.operations.marks`), not by the autograd
nodes a spelling happens to produce. Each case writes one function several ways; every composite (AttnLRP, CP-LRP,
RelP and the rules of relevance patching) gives each spelling the same relevance (float64, 1e-10), and CP-LRP
conserves it (no biases: the relevance 1 of every output element).

Before issue 40, CP-LRP gave ``silu(h) @ W`` and ``(silu(h)[..., None] * W).sum(-2)`` followed by a gate relevances
90% apart (the product with a broadcast constant and the sum passed the gate, the matrix product did not), the
recurrent and the chunked gated delta rule 2.4% of the largest relevance apart, and half the other cases below
differed as well.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.models.qwen3_next import modeling_qwen3_next

from tests.by_hand import attributed, by_hand, identity
from zennit_attn.composites import AttnLRPEpsilon, CPLRPEpsilon, MLPRules, RelPEpsilon
from zennit_attn.workflows.architecture_check.check import _built
from zennit_attn.workflows.architecture_check.configs import model_class, tiny_config

COMPOSITES = [AttnLRPEpsilon, CPLRPEpsilon, RelPEpsilon, MLPRules]
#: a constant matrix, a mask and mixing weights of the cases
W = torch.linspace(-1, 1, 16, dtype=torch.float64).reshape(4, 4) + torch.eye(4, dtype=torch.float64)
MASK = torch.tensor([[False, True, False], [False, False, True], [True, False, False]])
MIXING = torch.tensor([0.7, 0.3], dtype=torch.float64)


class Projected(torch.nn.Module):
    """``function(self, x)`` with three bias-free projections ``a``, ``b``, ``c`` of the ``[3, 4]`` input."""

    def __init__(self, function):
        super().__init__()
        self.function = function
        self.a, self.b, self.c = (torch.nn.Linear(4, 4, bias=False) for _ in range(3))
        self.norm = torch.nn.RMSNorm(4, eps=1e-6)

    def forward(self, x):
        return self.function(self, x)


def gate(m, x):
    return torch.sigmoid(m.c(x))


def probabilities(m, x, first=None, second=None):
    first, second = first or m.a, second or m.b
    return torch.softmax(first(x) @ second(x).T, -1)


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


SPELLINGS = {
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
    'a normalised gate': [
        lambda m, x: F.rms_norm(torch.sigmoid(m.a(x)), (4,), eps=1e-6) * m.b(x),
        lambda m, x: rms_spelled(torch.sigmoid(m.a(x))) * m.b(x),
        lambda m, x: m.norm(torch.sigmoid(m.a(x))) * m.b(x),
    ],
}


#: Spellings a composite explains otherwise by design, with why: ``(case, composite) -> spellings compared``.
DESIGNED = {
    # relevance patching's MLP rules give normalisation modules no rule (their plain gradient through the module)
    ('a normalised gate', MLPRules): 2,
}


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


def test_a_linear_map_of_a_gate_is_a_value_under_cp_lrp():
    """``silu(h) @ W`` is an MLP's output, not a gate: times a gate, CP-LRP gives it all the relevance and the gate
    none (by hand), whichever way the map is written."""
    x = _inputs()
    for spelling in SPELLINGS['silu(h) @ W, then times a gate'][:2]:
        model = _model(spelling)
        expected = by_hand(lambda xx, m=model: (identity(m.a(xx), F.silu(m.a(xx))) @ W) * gate(m, xx).detach(), x)
        torch.testing.assert_close(attributed(model, CPLRPEpsilon(), x), expected, rtol=1e-10, atol=1e-12)


def _qwen3_next() -> torch.nn.Module:
    model, _, _ = _built(
        'causal-lm',
        lambda: (model_class('causal-lm', 'qwen3_next')[0], tiny_config(model_class('causal-lm', 'qwen3_next')[1])),
        0,
        torch.Generator().manual_seed(0),
    )
    return model


def _token_relevance(model, composite) -> torch.Tensor:
    ids = torch.tensor([[5, 17, 9, 30, 2, 11]])
    leaf = model.get_input_embeddings()(ids).detach().requires_grad_(True)
    with composite.context(model) as modified:
        logits = modified(inputs_embeds=leaf, use_cache=False).logits[0, -1]
        logits[logits.argmax()].backward()
    return leaf.grad.sum(-1)


@pytest.mark.parametrize('composite', [AttnLRPEpsilon, CPLRPEpsilon], ids=lambda composite: composite.__name__)
def test_qwen3_next_chunked_and_recurrent_delta_rules_agree(composite, monkeypatch):
    """Qwen3-Next (a tiny random model) with transformers' recurrent gated delta rule in place of the chunked one:
    the same relevance, to the rounding of transformers' float32 arithmetic inside the recurrence (before: CP-LRP
    2.2% of the largest relevance apart, the recurrent spelling's output a gate of its gated norm)."""
    model = _qwen3_next()
    chunked = _token_relevance(model, composite())
    monkeypatch.setattr(
        modeling_qwen3_next, 'torch_chunk_gated_delta_rule', modeling_qwen3_next.torch_recurrent_gated_delta_rule
    )
    recurrent = _token_relevance(model, composite())
    scale = float(chunked.abs().max())
    torch.testing.assert_close(recurrent, chunked, rtol=0, atol=1e-7 * scale)
