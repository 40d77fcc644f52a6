"""Hand-written AttnLRP and CP-LRP references for T5's cross-attention layer and gated-GELU feed-forward layer,
compared in float64 to the library at block level, and CP-LRP conservation of ``explain()`` on a whole tiny T5.

The references read the layers' weights and propagate relevance with the rules of Achtibat et al. (ICML 2024,
Sec. 3) written out in *relevance form* (:py:mod:`tests.naive_rules`): plain torch, no autograd, nothing from
``zennit_attn``. All epsilons are 0.

``T5LayerCrossAttention`` (``model.decoder.block[i].layer[1]``), decoder hidden ``h``, encoder states ``e``::

    u  = h / rms(h)            (T5LayerNorm: no mean, no bias)   identity rule (Prop. 3.4)
    xn = w_ln * u                                                 epsilon rule on a diagonal map: R unchanged
    q = W_q xn, k = W_k e, v = W_v e                              epsilon rule (Eq. 8)
    S = q k^T                  (no 1/sqrt(d) scaling in T5)       Prop. 3.3
    z = S + c                  (c: position bias + additive mask, constants)   epsilon rule: S gets S/z R_z
    A = softmax(z)                                                Prop. 3.1
    O = A v                                                       Prop. 3.3
    y = h + W_o O                                                 epsilon rule on W_o and on the residual sum

Cross-attention has no relative position bias of its own in transformers 5.23 (``has_relative_attention_bias=False``:
a zero bias unless one is passed, as ``T5Stack`` passes the encoder mask through ``encoder_decoder_position_bias``);
the tests pass a random constant ``position_bias`` and an additive mask as well, to check that a constant added to
the scores is treated as a bias (it absorbs its share ``c / z`` of the scores' relevance).

``T5LayerFF`` with ``T5DenseGatedActDense`` (``feed_forward_proj='gated-gelu'``)::

    y = h + W_o (gelu_new(W_i0 xn) * W_i1 xn)       epsilon, uniform (Prop. 3.2), identity (Eq. 9) rules

CP-LRP (Ali et al. 2022): ``A`` and ``gelu_new(W_i0 xn)`` are constants, so ``A v`` is linear in ``v`` and the gated
product linear in ``W_i1 xn``; ``q``, ``k`` and ``W_i0`` receive nothing. T5 has no biases, so CP-LRP conserves.

Precision: ``T5LayerNorm`` computes its variance in float32 even in a float64 model; the reference reproduces that
forward step exactly (it only changes activations: the normalisation is not differentiated by either side).
"""

from __future__ import annotations

import math

import pytest
import torch
import transformers

from tests.naive_rules import (
    ATTNLRP,
    CPLRP,
    constant_matmul_rule,
    epsilon_rule,
    gated_mlp_rule,
    matmul_rule,
    relative_error,
    rms_norm_rule,
    softmax_rule,
    sum_rule,
)
from zennit_attn import explain
from zennit_attn.composites import AttnLRPEpsilon, CPLRPEpsilon

DTYPE = torch.float64
D_MODEL, D_KV, HEADS, D_FF, VOCAB = 16, 4, 4, 24, 32
DECODER_TOKENS, ENCODER_TOKENS = 3, 5
TOLERANCE = 1e-8
COMPOSITES = {ATTNLRP: AttnLRPEpsilon, CPLRP: CPLRPEpsilon}


# ----------------------------------------------------------------------------------------------------------------
# T5's activation and norm (the rules are those of tests.naive_rules)
# ----------------------------------------------------------------------------------------------------------------


def gelu_new(x):
    """transformers' ``NewGELUActivation`` (tanh approximation)."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def t5_norm(norm, h):
    """``T5LayerNorm`` as transformers computes it (variance in float32): returns ``(u = h / rms(h), w * u)``."""
    variance = h.to(torch.float32).pow(2).mean(-1, keepdim=True)
    u = h * torch.rsqrt(variance + norm.variance_epsilon)
    return u, norm.weight.detach() * u


# ----------------------------------------------------------------------------------------------------------------
# The references
# ----------------------------------------------------------------------------------------------------------------


def cross_attention_reference(layer, h, e, constant, relevance, variant=ATTNLRP):
    """``T5LayerCrossAttention`` by hand: returns ``(y, R_h, R_e)`` for ``h`` ``[Tq, D]``, ``e`` ``[Tk, D]``, the
    constant ``[H, Tq, Tk]`` added to the scores and ``relevance`` ``[Tq, D]`` at the output."""
    attention = layer.EncDecAttention
    heads, head_dim = attention.n_heads, attention.key_value_proj_dim
    w_q, w_k, w_v, w_o = (getattr(attention, name).weight.detach() for name in 'qkvo')
    split = lambda t: t.view(t.shape[0], heads, head_dim).transpose(0, 1)  # [T, H d] -> [H, T, d]
    merge = lambda t: t.transpose(0, 1).reshape(t.shape[1], heads * head_dim)

    # forward
    u, xn = t5_norm(layer.layer_norm, h)
    q, k, v = xn @ w_q.T, e @ w_k.T, e @ w_v.T
    qh, kh, vh = split(q), split(k), split(v)
    key_t = kh.transpose(-1, -2)
    scores = qh @ key_t  # T5: no 1 / sqrt(d) scaling
    z = scores + constant
    probs = torch.softmax(z, dim=-1)
    context = probs @ vh
    o = merge(context)
    a = o @ w_o.T
    y = h + a

    # backward
    r_h = sum_rule(h, y, relevance)
    r_a = sum_rule(a, y, relevance)
    r_context = split(epsilon_rule(o, w_o, a, r_a))
    zero = torch.zeros_like(qh)
    if variant == ATTNLRP:
        r_probs, r_vh = matmul_rule(probs, vh, context, r_context)
        r_z = softmax_rule(z, probs, r_probs)
        r_scores = sum_rule(scores, z, r_z)
        r_qh, r_key_t = matmul_rule(qh, key_t, scores, r_scores)
        r_kh = r_key_t.transpose(-1, -2)
    else:  # CP-LRP: the attention probabilities are constants
        r_vh = constant_matmul_rule(probs, vh, context, r_context)
        r_qh, r_kh = zero, torch.zeros_like(kh)
    r_xn = epsilon_rule(xn, w_q, q, merge(r_qh))
    r_e = epsilon_rule(e, w_k, k, merge(r_kh)) + epsilon_rule(e, w_v, v, merge(r_vh))
    r_h = r_h + rms_norm_rule(u, layer.layer_norm.weight.detach(), r_xn)
    return y, r_h, r_e


def feed_forward_reference(layer, h, relevance, variant=ATTNLRP):
    """``T5LayerFF`` with ``T5DenseGatedActDense`` by hand: returns ``(y, R_h)`` for ``h`` ``[T, D]``."""
    dense = layer.DenseReluDense
    weights = [getattr(dense, name).weight.detach() for name in ('wi_0', 'wi_1', 'wo')]  # gate, up, out

    # forward
    u, xn = t5_norm(layer.layer_norm, h)
    f, _ = gated_mlp_rule(xn, *weights, torch.ones_like(h), variant, activation=gelu_new)
    y = h + f

    # backward
    r_h = sum_rule(h, y, relevance)
    _, r_xn = gated_mlp_rule(xn, *weights, sum_rule(f, y, relevance), variant, activation=gelu_new)
    return y, r_h + rms_norm_rule(u, layer.layer_norm.weight.detach(), r_xn)


# ----------------------------------------------------------------------------------------------------------------
# Model and the library side
# ----------------------------------------------------------------------------------------------------------------


def make_model(attn_implementation, seed=0):
    """A tiny bias-free T5 (gated GELU, one encoder and one decoder block) with unit-scale random weights."""
    config = transformers.T5Config(
        vocab_size=VOCAB,
        d_model=D_MODEL,
        d_kv=D_KV,
        num_heads=HEADS,
        d_ff=D_FF,
        feed_forward_proj='gated-gelu',
        num_layers=1,
        num_decoder_layers=1,
        dropout_rate=0.0,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
    )
    torch.manual_seed(seed)
    model = transformers.T5ForConditionalGeneration(config).to(DTYPE).eval()
    model.set_attn_implementation(attn_implementation)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if 'layer_norm' in name:
                parameter.copy_(1 + 0.1 * torch.randn(parameter.shape, generator=generator, dtype=DTYPE))
            elif 'shared' in name or 'relative_attention_bias' in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator, dtype=DTYPE))
            else:
                std = 1 / math.sqrt(parameter.shape[-1])
                parameter.copy_(std * torch.randn(parameter.shape, generator=generator, dtype=DTYPE))
    return model


def library_relevance(model, layer, variant, inputs, relevance, **kwargs):
    """Relevance at the float64 ``inputs`` (``{name: tensor}``, keyword arguments of the layer) for ``relevance`` at
    the layer's first output, by the library's composite registered on the layer (canonizers of the model)."""
    composite = COMPOSITES[variant]()
    with composite.context(layer) as modified:
        leaves = {name: tensor.clone().requires_grad_() for name, tensor in inputs.items()}
        output = modified(**leaves, **kwargs)
        output = output[0] if isinstance(output, tuple) else output
        result = torch.autograd.grad(output, list(leaves.values()), grad_outputs=relevance)
    return output.detach(), dict(zip(leaves, result))


@pytest.fixture(scope='module', params=['eager', 'sdpa'])
def model(request):
    return make_model(request.param)


@pytest.fixture(scope='module')
def data():
    """Decoder hidden ``[1, Tq, D]``, encoder states ``[1, Tk, D]``, output relevances and constants."""
    generator = torch.Generator().manual_seed(1)
    randn = lambda *shape: torch.randn(*shape, generator=generator, dtype=DTYPE)
    mask = torch.zeros(1, 1, DECODER_TOKENS, ENCODER_TOKENS, dtype=DTYPE)
    mask[..., 2] = torch.finfo(DTYPE).min
    return dict(
        hidden=randn(1, DECODER_TOKENS, D_MODEL),
        encoder=randn(1, ENCODER_TOKENS, D_MODEL),
        relevance=randn(1, DECODER_TOKENS, D_MODEL),
        encoder_relevance=randn(1, ENCODER_TOKENS, D_MODEL),
        position_bias=randn(1, HEADS, DECODER_TOKENS, ENCODER_TOKENS),
        mask=mask,
    )


#: constants added to the cross-attention scores: none (zero bias), a position bias, a position bias and a mask
CONSTANTS = ('none', 'position_bias', 'masked')


def cross_attention_case(data, constants):
    """Keyword arguments for the layer and the constant ``[H, Tq, Tk]`` that the reference adds to the scores."""
    kwargs, constant = {}, torch.zeros(HEADS, DECODER_TOKENS, ENCODER_TOKENS, dtype=DTYPE)
    if constants in ('position_bias', 'masked'):
        kwargs['position_bias'] = data['position_bias']
        constant = constant + data['position_bias'][0]
    if constants == 'masked':
        kwargs['attention_mask'] = data['mask']
        constant = constant + data['mask'][0]
    return kwargs, constant


# ----------------------------------------------------------------------------------------------------------------
# Tests
# ----------------------------------------------------------------------------------------------------------------


def test_cross_attention_has_no_position_bias_of_its_own(model):
    layer = model.decoder.block[0].layer[1]
    assert type(layer).__name__ == 'T5LayerCrossAttention'
    assert not layer.EncDecAttention.has_relative_attention_bias
    assert layer.EncDecAttention.scaling == 1.0


@pytest.mark.parametrize('constants', CONSTANTS)
def test_cross_attention_forward_matches_hf(model, data, constants):
    layer = model.decoder.block[0].layer[1]
    kwargs, constant = cross_attention_case(data, constants)
    with torch.no_grad():
        expected = layer(data['hidden'], key_value_states=data['encoder'], **kwargs)[0]
    y, _, _ = cross_attention_reference(layer, data['hidden'][0], data['encoder'][0], constant, data['relevance'][0])
    assert relative_error(y, expected[0]) < 1e-13


@pytest.mark.parametrize('variant', [ATTNLRP, CPLRP])
@pytest.mark.parametrize('constants', CONSTANTS)
def test_cross_attention_matches_reference(model, data, constants, variant):
    """Relevance at the decoder hidden states and at the encoder states (``key_value_states=``)."""
    layer = model.decoder.block[0].layer[1]
    kwargs, constant = cross_attention_case(data, constants)
    inputs = dict(hidden_states=data['hidden'], key_value_states=data['encoder'])
    _, actual = library_relevance(model, layer, variant, inputs, data['relevance'], **kwargs)
    _, r_hidden, r_encoder = cross_attention_reference(
        layer, data['hidden'][0], data['encoder'][0], constant, data['relevance'][0], variant
    )
    errors = (
        relative_error(actual['hidden_states'][0], r_hidden),
        relative_error(actual['key_value_states'][0], r_encoder),
    )
    assert max(errors) <= TOLERANCE, f'{variant} {constants}: relative errors (hidden, encoder) {errors}'
    if constants == 'masked':  # the masked key receives nothing through k and v
        assert actual['key_value_states'][0, 2].abs().max() == 0
    if variant == CPLRP:  # no biases, the softmax is constant: the layer conserves
        total = float(data['relevance'].sum())
        found = float(actual['hidden_states'].sum() + actual['key_value_states'].sum())
        assert abs(found - total) <= 1e-10 * abs(total)
        assert abs(float(r_hidden.sum() + r_encoder.sum()) - total) <= 1e-10 * abs(total)


def test_cross_attention_variants_differ(model, data):
    layer = model.decoder.block[0].layer[1]
    _, constant = cross_attention_case(data, 'none')
    _, r_attnlrp, _ = cross_attention_reference(
        layer, data['hidden'][0], data['encoder'][0], constant, data['relevance'][0], ATTNLRP
    )
    _, r_cplrp, _ = cross_attention_reference(
        layer, data['hidden'][0], data['encoder'][0], constant, data['relevance'][0], CPLRP
    )
    assert relative_error(r_attnlrp, r_cplrp) > 1e-2


@pytest.mark.parametrize('variant', [ATTNLRP, CPLRP])
def test_feed_forward_matches_reference(model, data, variant):
    """``T5LayerFF`` (gated GELU) of the encoder on the encoder states."""
    layer = model.encoder.block[0].layer[1]
    assert type(layer.DenseReluDense).__name__ == 'T5DenseGatedActDense'
    hidden, relevance = data['encoder'], data['encoder_relevance']
    output, actual = library_relevance(model, layer, variant, dict(hidden_states=hidden), relevance)
    y, expected = feed_forward_reference(layer, hidden[0], relevance[0], variant)
    assert relative_error(y, output[0]) < 1e-13
    error = relative_error(actual['hidden_states'][0], expected)
    assert error <= TOLERANCE, f'{variant}: relative error {error:.2e}'
    if variant == CPLRP:
        total = float(relevance.sum())
        assert abs(float(actual['hidden_states'].sum()) - total) <= 1e-10 * abs(total)
    else:
        _, cplrp = feed_forward_reference(layer, hidden[0], relevance[0], CPLRP)
        assert relative_error(expected, cplrp) > 1e-2


def test_explain_cplrp_conserves(model):
    """End to end on the bias-free T5: CP-LRP's encoder and decoder token relevances sum to the explained logit."""
    generator = torch.Generator().manual_seed(2)
    input_ids = torch.randint(2, VOCAB, (1, ENCODER_TOKENS), generator=generator)
    decoder_input_ids = torch.cat(
        [torch.zeros(1, 1, dtype=torch.long), torch.randint(2, VOCAB, (1, DECODER_TOKENS - 1), generator=generator)], 1
    )
    result = explain(model, input_ids, decoder_input_ids=decoder_input_ids, method='cplrp', composite=CPLRPEpsilon())
    logit = float(result.logit.sum())
    total = float(result.relevance.sum() + result.decoder_relevance.sum())
    assert result.relevance.shape == (1, ENCODER_TOKENS) and result.decoder_relevance.shape == (1, DECODER_TOKENS)
    assert abs(total - logit) <= 1e-8 * abs(logit), (total, logit)
    assert float(result.relevance.abs().sum()) > 0 and float(result.decoder_relevance.abs().sum()) > 0
