"""AttnLRP conserves exactly once its softmax rule's bias term is handed back, on real architectures.

CP-LRP's conservation (the zoo walk, ``tests/test_zoo.py``) checks the rules that CP-LRP and AttnLRP share; it cannot
see the rules that only AttnLRP applies: the shares of gates in products (Prop. 3.2, 3.3), the identity rule through
the activations and softmax outputs that those shares reach (Eq. 9), and what an activation's spelling makes of them
(an inline GELU got a third of its relevance absorbed as a bias before the fix of commit 47927d4). AttnLRP does not
conserve by design: the softmax rule (Prop. 3.1) is the first-order Taylor expansion at zero, whose bias term
``sum_j y_j g_j - sum_i x_i (J^T g)_i`` per softmax row is lost. Everything else AttnLRP does on a bias-free model is
conservative (the uniform rule shares a homogeneous product's relevance exactly, Euler's theorem; the identity rule
passes it unchanged; a normaliser held constant leaves a linear map). So with that bias term handed back at every
softmax (:py:meth:`HandedBack.handed_back`: the softmax rule's gradient plus ``c x``, ``c`` chosen so that each
row conserves) the relevance at the inputs sums to the explained logit to rounding, on every model whose attention is a
softmax, and any other loss is a rule that absorbs relevance it must not.

The softmax is handed back through the composite's ``overrides`` (``softmax``, ``_softmax`` and
``scaled_dot_product_attention``, the last decomposed into its two products with AttnLRP's shares and the handed-back
softmax); every other operation takes the engine's own path, the fast path of unmarked operations included. Models
as the architecture check builds them (float64, biases and learned position tables zero), with every weight that is
zero throughout drawn at random (xLSTM's gates and Doge's ``A`` start at zero: the identity rule cannot pass
relevance to an input of zero, a loss of the random initialisation, not of the rules).

Architectures that do not conserve this way by design are left out (docs: Rules, where AttnLRP loses relevance):
constants the check does not zero (T5's relative position bias, ALiBi, attention sinks), and softmax spellings other
than a softmax call (a top-k softmax renormalised by a division, as Mixtral's router; the exponential of a
log-softmax; a softmax extended by a sink's logsumexp; the Sinkhorn iterations of DeepSeek-V4's hyper-connections):
each loses what its own first-order expansion leaves out (Prop. 3.1).
"""

from __future__ import annotations

import contextlib
import io
import math
import warnings

import pytest
import torch

from zennit_attn.composites import AttnLRPEpsilon, CPLRPEpsilon
from zennit_attn.rules.base import gradient_map, scaled_gradient
from zennit_attn.workflows.architecture_check.check import (
    check_inputs,
    input_relevances,
    randomize_zero_weights,
    zero_biases,
)
from zennit_attn.workflows.architecture_check.configs import model_class, tiny_config

#: Logits at or below this are masked (``finfo.min``, ``-inf``): their softmax is 0 and they carry no relevance.
MASKED = 1e4


class HandedBack:
    """The softmaxes of one explanation with their bias terms handed back (:py:meth:`handed_back`): a row whose logits
    are all zero (or masked) cannot take its bias term back (``c x`` is zero); its loss is recorded in
    :py:attr:`stranded`."""

    def __init__(self):
        self.stranded = 0.0
        #: the softmaxes met (a model without any, xLSTM, conserves under AttnLRP itself)
        self.softmaxes = 0

    def softmax(self, func, args, kwargs):
        """The override of ``softmax`` and ``_softmax``: ``func`` run on the logits with the bias term handed back."""
        dim = kwargs['dim'] if 'dim' in kwargs else args[1]
        return self.handed_back(lambda logits: func(logits, *args[1:], **kwargs), args[0], dim)

    def handed_back(self, softmax, logits: torch.Tensor, dim: int) -> torch.Tensor:
        """``softmax(logits)`` (along ``dim``) whose logits' gradient is the softmax rule's plus ``c x`` per row, with
        ``c`` such that ``sum_i x_i g_i`` equals the output's ``sum_j y_j g_j``."""
        self.softmaxes += 1
        seen = {}

        def record(grad: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
            seen['output'] = (value * grad).sum(dim, keepdim=True)
            return grad

        def returned(grad: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
            kept = torch.where(value.abs() < MASKED, value, torch.zeros_like(value))
            lost = seen['output'] - (kept * grad).sum(dim, keepdim=True)
            norm = (kept * kept).sum(dim, keepdim=True)
            self.stranded += float(torch.where(norm > 0, torch.zeros_like(lost), lost).abs().sum())
            return grad + torch.where(norm > 0, lost / norm.clamp_min(1e-300), torch.zeros_like(norm)) * kept

        output = softmax(gradient_map(logits, returned, with_value=True))
        return gradient_map(output, record, with_value=True)

    def attention(self, func, args, kwargs):
        """The override of ``scaled_dot_product_attention``: ``softmax(q k^T scale + mask) V`` written out, each of its
        products sharing its relevance half and half (AttnLRP's uniform rule, Prop. 3.3) and the softmax's bias term
        handed back; its value checked against ``func``'s."""
        names = ('query', 'key', 'value', 'attn_mask', 'dropout_p', 'is_causal', 'scale', 'enable_gqa')
        bound = {**dict(zip(names, args)), **kwargs}
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
            assert torch.allclose(output, func(*args, **kwargs), atol=1e-10), 'the written-out attention differs'
        return output

    def composite(self) -> AttnLRPEpsilon:
        """AttnLRP with the softmax's bias term handed back."""
        attention = {'scaled_dot_product_attention': self.attention}
        return AttnLRPEpsilon(overrides={'softmax': self.softmax, '_softmax': self.softmax, **attention})


def _half(tensor: torch.Tensor) -> torch.Tensor:
    return scaled_gradient(tensor, 0.5) if tensor.requires_grad else tensor


def built(mapping: str, architecture: str) -> tuple[torch.nn.Module, dict]:
    """The model of ``architecture`` as the architecture check builds it (float64, zero biases), every weight that is
    zero throughout drawn at random, and its inputs."""
    architecture_class, config_class = model_class(mapping, architecture)
    config = tiny_config(config_class)
    with contextlib.suppress(Exception):
        config._experts_implementation = 'eager'
    torch.manual_seed(0)
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter('ignore')
        model = architecture_class(config).to(torch.float64).eval()
        randomize_zero_weights(model, torch.Generator().manual_seed(0))
        zero_biases(model)
        inputs, _ = check_inputs(model, config, mapping, torch.Generator().manual_seed(0))
    return model, inputs


def explained(model: torch.nn.Module, inputs: dict, composite) -> float:
    """The sum of the input relevance for the relevance 1 at the explained logit."""
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter('ignore')
        sums, _ = input_relevances(model, inputs, composite)
    return sum(sums.values())


#: ``(mapping, architecture)``: dense and mixture-of-experts decoders (rotary, learned and no positions; LayerNorm and
#: RMSNorm; Gemma's soft-capping; parallel attention and MLP), state-space and hybrid models (recurrences whose gates
#: take the uniform rule), encoders (ESM's inline GELU), an encoder-decoder and a vision-language model (pixels).
ARCHITECTURES = [
    ('causal-lm', 'llama'),
    ('causal-lm', 'gpt2'),
    ('causal-lm', 'gemma2'),
    ('causal-lm', 'qwen3_moe'),
    ('causal-lm', 'phi3'),
    ('causal-lm', 'falcon'),
    ('causal-lm', 'gpt_neox'),
    ('causal-lm', 'opt'),
    ('causal-lm', 'doge'),
    ('causal-lm', 'xlstm'),
    ('causal-lm', 'falcon_h1'),
    ('causal-lm', 'jamba'),
    ('masked-lm', 'esm'),
    ('masked-lm', 'modernbert'),
    ('masked-lm', 'deberta-v2'),
    ('seq2seq-lm', 'bart'),
    ('causal-lm', 'gemma3_text'),
    ('causal-lm', 'mamba'),
    ('causal-lm', 'whisper'),
    ('image-text-to-text', 'qwen2_vl'),
    ('image-text-to-text', 'llava'),
    ('image-text-to-text', 'idefics3'),
]


@pytest.mark.parametrize('mapping, architecture', ARCHITECTURES)
def test_attnlrp_conserves_with_the_softmax_bias_handed_back(mapping, architecture):
    """The relevance sums to the logit within 1e-6 (the zoo walk's tolerance for CP-LRP, which meets it on the same
    model: float64 rounding where relevances of opposite signs cancel, and the epsilon of a normaliser) while AttnLRP's
    own sum is further off wherever the model has a softmax (the softmax's bias term is what the check hands back),
    and as close where it has none."""
    model, inputs = built(mapping, architecture)
    handed = HandedBack()
    assert explained(model, inputs, CPLRPEpsilon()) == pytest.approx(1, abs=1e-6)
    assert explained(model, inputs, handed.composite()) == pytest.approx(1, abs=1e-6)
    assert handed.stranded <= 1e-12
    assert (abs(explained(model, inputs, AttnLRPEpsilon()) - 1) > 1e-5) == (handed.softmaxes > 0)


def test_the_handed_back_softmax_conserves_and_keeps_its_value():
    """On one softmax: the value is the softmax's, the input relevance sums to the output's per row, and the gradient
    is the softmax rule's (the plain gradient, Prop. 3.1) plus a multiple of the logits."""
    torch.manual_seed(0)
    logits = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(3, 5, dtype=torch.float64)
    handed = HandedBack()
    output = handed.softmax(torch.softmax, (logits, -1), {})
    (grad,) = torch.autograd.grad((output * weight).sum(), logits)
    plain = torch.softmax(logits, -1)
    (rule,) = torch.autograd.grad((plain * weight).sum(), logits)
    torch.testing.assert_close(output, plain, rtol=0, atol=0)
    torch.testing.assert_close((logits * grad).sum(-1), (plain * weight).sum(-1).detach())
    ratio = (grad - rule) / logits.detach()
    torch.testing.assert_close(ratio, ratio[:, :1].expand_as(ratio))
    assert not torch.allclose((logits * rule).sum(-1), (plain * weight).sum(-1))
