"""Hand-written AttnLRP and CP-LRP references for the sparse mixture-of-experts blocks, compared in float64 to the
library at block level (``model.model.layers[0].mlp``).

The reference reads the block's weights and propagates relevance with every rule of Achtibat et al. (ICML 2024,
Sec. 3, appendix B.5 Eq. ap:routing) written out in *relevance form* (:py:mod:`tests.naive_rules` and the routing
rule below): plain torch, no autograd, nothing from ``zennit_attn``. All epsilons are 0.

The block computes, for every token ``x`` (shared expert only in Qwen2-MoE)::

    l = W_g x                                   router logits            epsilon rule (Eq. 8)
    p = softmax(l), top = top-k indices of p
    w_k = p_k / sum_{j in top} p_j   (renormalised: Mixtral, norm_topk_prob=True)
    w_k = p_k                        (not renormalised: norm_topk_prob=False)
    E_k(x) = W_down,k (silu(W_gate,k x) * W_up,k x)                       epsilon / identity / uniform rules
    y = sum_{k in top} w_k E_k(x)  [+ sigmoid(W_sg x) * S(x)]             epsilon rule on the sums,
                                                                          uniform rule (Prop. 3.2) on the products

The gate and up projections of an expert are the two halves of ``gate_up_proj[k]`` (``[2 I, H]``): transformers'
``*Experts`` compute ``F.linear(x, gate_up_proj[k]).chunk(2, dim=-1)``, i.e. the concatenated layout
``[gate; up]`` (``use_experts_implementation(is_concatenated=True)``).

Which softmax are the routing weights? (Prop. 3.1 needs a softmax and its inputs.)

- Renormalised: ``w_k = e^{l_k} / sum_{j in top} e^{l_j}`` exactly, i.e. the softmax over the *top-k logits*
  (Eq. ap:routing, ``Softmax(TopK(W_g x))``). It does not depend on the other logits, so Prop. 3.1 over the top-k
  logits gives ``R_{l_i} = l_i (R_{w_i} - w_i sum_{j in top} R_{w_j})`` for ``i`` in top and 0 for the others.
- Not renormalised: ``w_k = softmax(l)_k`` over *all* experts, of which only the top-k outputs are used (the others
  carry no relevance). Prop. 3.1 on that softmax gives ``R_{l_i} = l_i (R_{p_i} - p_i sum_j R_{p_j})`` for *every*
  expert ``i``, with ``R_p = R_w`` on the top-k and 0 elsewhere: the experts that were not selected receive
  ``-l_i p_i sum R_w``. (Treating ``w`` as a softmax over the top-k logits would be wrong: ``w`` is not that
  function.)

In both cases this is exactly the plain gradient of Hugging Face's computation (softmax over all experts, top-k,
optional renormalisation) times the logits, which is what the library relies on (the uniform product rule: routing
weights keep their gradient); :py:func:`test_unnormalised_routing_is_softmax_over_all_experts` checks that the
library agrees with the all-experts reading and not with the top-k one.

Top-1 routing renormalised (``top_k = 1``, Mixtral's renormalisation or ``norm_topk_prob=True``): the one weight is
``w = p / p = 1``, the softmax over one logit, a constant function of ``x``; ``w E`` is linear in ``E``, which gets all
relevance (the block is the selected expert's dense MLP), and the router none.

Products: ``w_k E_k`` gives ``R/2`` to each factor (Prop. 3.2); ``silu(a) * b`` likewise, with the identity rule
(Eq. 9) from ``silu(a)`` to ``a``; the shared expert's ``sigmoid(s) * S`` likewise, identity rule through the sigmoid.
CP-LRP (Ali et al. 2022, as extended in appendix B.5): the routing weights, the SiLU gates and the sigmoid gate are
constants; the products become linear in the experts' outputs, in ``up`` and in ``S``, which receive all relevance,
and the router, the gate projections and the shared-expert gate receive none. Without biases CP-LRP conserves.

Precision: Hugging Face's routers compute the softmax in float32 even in a float64 model (``.float()`` in Mixtral,
``softmax(..., dtype=torch.float)`` in the others). The forward is reproduced exactly by the reference, but the
float32 softmax is also on the library's *backward* path (the routing weights' gradient), which limits AttnLRP to
float32 precision there (measured 2e-9 to 4e-8 relative). The strict comparisons therefore run with
:py:func:`float64_router`, a forward hook on the router that recomputes the same routing weights in float64 from the
(float64) logits; the unmodified router is compared at 1e-6 for AttnLRP (and at 1e-8 for CP-LRP, which does not
differentiate the router).

The composites are registered on the block alone; the engine keeps transformers' grouped and batched experts (it sees
their products), and :py:func:`test_block_registration_uses_eager_experts` checks that the block's relevance is the
eager loop's.
"""

from __future__ import annotations

import math

import pytest
import torch
import transformers

from tests.naive_rules import (
    ATTNLRP,
    CPLRP,
    epsilon_rule,
    gated_mlp_rule,
    identity_rule,
    relative_error,
    softmax_rule,
    sum_rule,
    uniform_rule,
)
from zennit_attn.composites import AttnLRPEpsilon, CPLRPEpsilon

DTYPE = torch.float64
HIDDEN, INTERMEDIATE, SHARED_INTERMEDIATE, EXPERTS, TOP_K, TOKENS = 16, 24, 20, 4, 2, 5
TOLERANCE = 1e-8
FLOAT32_ROUTER_TOLERANCE = 1e-6
COMPOSITES = {ATTNLRP: AttnLRPEpsilon, CPLRP: CPLRPEpsilon}

_COMMON = dict(
    vocab_size=32,
    hidden_size=HIDDEN,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_experts_per_tok=TOP_K,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=None,
    tie_word_embeddings=False,
)

#: name -> (model class, configuration)
MODELS = {
    'mixtral': lambda: transformers.MixtralForCausalLM(
        transformers.MixtralConfig(**_COMMON, intermediate_size=INTERMEDIATE, num_local_experts=EXPERTS)
    ),
    'qwen2_moe': lambda: transformers.Qwen2MoeForCausalLM(
        transformers.Qwen2MoeConfig(
            **_COMMON,
            num_experts=EXPERTS,
            moe_intermediate_size=INTERMEDIATE,
            intermediate_size=INTERMEDIATE,
            shared_expert_intermediate_size=SHARED_INTERMEDIATE,
            norm_topk_prob=False,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
    ),
    'qwen2_moe_norm': lambda: transformers.Qwen2MoeForCausalLM(
        transformers.Qwen2MoeConfig(
            **_COMMON,
            num_experts=EXPERTS,
            moe_intermediate_size=INTERMEDIATE,
            intermediate_size=INTERMEDIATE,
            shared_expert_intermediate_size=SHARED_INTERMEDIATE,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
    ),
    'qwen3_moe': lambda: transformers.Qwen3MoeForCausalLM(
        transformers.Qwen3MoeConfig(
            **_COMMON,
            num_experts=EXPERTS,
            moe_intermediate_size=INTERMEDIATE,
            intermediate_size=INTERMEDIATE,
            head_dim=HIDDEN // 4,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
    ),
    'olmoe': lambda: transformers.OlmoeForCausalLM(
        transformers.OlmoeConfig(**_COMMON, num_experts=EXPERTS, intermediate_size=INTERMEDIATE, norm_topk_prob=False)
    ),
}


# ----------------------------------------------------------------------------------------------------------------
# The routing rule (relevance form, epsilon = 0; the other rules are those of tests.naive_rules)
# ----------------------------------------------------------------------------------------------------------------


def routing_weights(logits, top_k, renormalise, softmax_dtype):
    """The routing weights as Hugging Face computes them (softmax over all experts in ``softmax_dtype``, top-k,
    optional renormalisation), returned in the logits' dtype with the full softmax and the indices."""
    probs = torch.softmax(logits.to(softmax_dtype), dim=-1)
    top, index = torch.topk(probs, top_k, dim=-1)
    if renormalise:
        top = top / top.sum(-1, keepdim=True)
    return top.to(logits.dtype), probs.to(logits.dtype), index


def routing_rule(logits, weights, probs, index, relevance, renormalise, top_k_reading=False):
    """Prop. 3.1 on the routing softmax (see the module docstring for which softmax).

    ``relevance`` is ``[T, k]`` at the routing weights; returns ``[T, E]`` at the logits. ``top_k_reading`` forces
    the (wrong, for ``renormalise=False``) reading as a softmax over the top-k logits, for the contrast test.
    """
    if renormalise or top_k_reading:
        top_logits = logits.gather(-1, index)
        result = torch.zeros_like(logits)
        return result.scatter(-1, index, softmax_rule(top_logits, weights, relevance))
    relevance_p = torch.zeros_like(logits).scatter(-1, index, relevance)
    return softmax_rule(logits, probs, relevance_p)


def block_weights(block):
    """The block's weights as plain tensors."""
    weights = dict(
        router=block.gate.weight.detach(),
        gate_up=block.experts.gate_up_proj.detach(),
        down=block.experts.down_proj.detach(),
        renormalise=getattr(block.gate, 'norm_topk_prob', True),  # Mixtral always renormalises
        top_k=block.gate.top_k,
    )
    if hasattr(block, 'shared_expert'):
        weights.update(
            shared_gate=block.shared_expert.gate_proj.weight.detach(),
            shared_up=block.shared_expert.up_proj.weight.detach(),
            shared_down=block.shared_expert.down_proj.weight.detach(),
            shared_expert_gate=block.shared_expert_gate.weight.detach(),
        )
    return weights


def moe_reference(block, x, relevance, variant=ATTNLRP, softmax_dtype=DTYPE, top_k_reading=False):
    """Output and relevance at ``x`` ([B, T, H]) of the block for ``relevance`` at its output, by hand.

    ``softmax_dtype`` is the precision of the router's softmax (float32 reproduces Hugging Face, float64 goes with
    :py:func:`float64_router`).
    """
    p = block_weights(block)
    shape = x.shape
    x, relevance = x.reshape(-1, shape[-1]), relevance.reshape(-1, shape[-1])
    intermediate = p['gate_up'].shape[1] // 2

    # forward
    logits = x @ p['router'].T
    weights, probs, index = routing_weights(logits, p['top_k'], p['renormalise'], softmax_dtype)
    experts = []  # [T][k] expert outputs
    for t in range(x.shape[0]):
        row = []
        for slot in range(p['top_k']):
            k = int(index[t, slot])
            w_gate, w_up = p['gate_up'][k, :intermediate], p['gate_up'][k, intermediate:]
            row.append(
                gated_mlp_rule(
                    x[t : t + 1], w_gate, w_up, p['down'][k], torch.ones(1, shape[-1], dtype=x.dtype), variant
                )[0][0]
            )
        experts.append(torch.stack(row))
    experts = torch.stack(experts)  # [T, k, H]
    terms = weights[..., None] * experts  # w_k E_k
    routed = terms.sum(1)
    output = routed
    if 'shared_gate' in p:
        gate_logit = x @ p['shared_expert_gate'].T  # [T, 1]
        sigma = torch.sigmoid(gate_logit)
        shared, _ = gated_mlp_rule(x, p['shared_gate'], p['shared_up'], p['shared_down'], relevance, variant)
        shared_term = sigma * shared
        output = routed + shared_term

    # backward
    r_x = torch.zeros_like(x)
    r_routed = sum_rule(routed, output, relevance)
    r_terms = sum_rule(terms, routed[:, None], r_routed[:, None])  # [T, k, H]
    if variant == ATTNLRP and p['top_k'] == 1 and p['renormalise']:
        # one renormalised routing weight is the constant 1 (a softmax over one logit): w E is linear in E
        r_experts = r_terms
    elif variant == ATTNLRP:
        r_weights, r_experts = uniform_rule(r_terms).sum(-1), uniform_rule(r_terms)
        r_logits = routing_rule(logits, weights, probs, index, r_weights, p['renormalise'], top_k_reading)
        r_x += epsilon_rule(x, p['router'], logits, r_logits)
    else:  # CP-LRP: routing weights are constants, w_k E_k is linear in E_k
        r_experts = r_terms
    for t in range(x.shape[0]):
        for slot in range(p['top_k']):
            k = int(index[t, slot])
            w_gate, w_up = p['gate_up'][k, :intermediate], p['gate_up'][k, intermediate:]
            r_x[t] += gated_mlp_rule(x[t : t + 1], w_gate, w_up, p['down'][k], r_experts[t : t + 1, slot], variant)[1][
                0
            ]
    if 'shared_gate' in p:
        r_shared_term = sum_rule(shared_term, output, relevance)
        if variant == ATTNLRP:
            r_sigma, r_shared = uniform_rule(r_shared_term).sum(-1, keepdim=True), uniform_rule(r_shared_term)
            r_x += epsilon_rule(x, p['shared_expert_gate'], gate_logit, identity_rule(r_sigma))
        else:  # CP-LRP: the sigmoid gate is a constant
            r_shared = r_shared_term
        r_x += gated_mlp_rule(x, p['shared_gate'], p['shared_up'], p['shared_down'], r_shared, variant)[1]
    return output.reshape(shape), r_x.reshape(shape)


# ----------------------------------------------------------------------------------------------------------------
# Models and the library side
# ----------------------------------------------------------------------------------------------------------------


def make_model(name, dtype=DTYPE, seed=0):
    """A tiny model of ``name`` with random weights of unit-scale activations, eager experts, in eval mode."""
    torch.manual_seed(seed)
    model = MODELS[name]().to(dtype).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter_name, parameter in model.named_parameters():
            if 'norm' in parameter_name:
                parameter.copy_(1 + 0.1 * torch.randn(parameter.shape, generator=generator, dtype=dtype))
            else:
                gain = 2.0 if parameter_name.endswith('mlp.gate.weight') else 1.0
                std = gain / math.sqrt(parameter.shape[-1])
                parameter.copy_(std * torch.randn(parameter.shape, generator=generator, dtype=dtype))
    model.config._experts_implementation = 'eager'
    return model


def float64_router(block):
    """Forward hook on the router: recompute Hugging Face's routing weights in float64 from the float64 logits
    (same top-k indices). Returns the handle."""
    renormalise = getattr(block.gate, 'norm_topk_prob', True)

    def hook(module, args, output):
        logits, _, index = output
        weights = torch.softmax(logits, dim=-1).gather(-1, index)
        if renormalise:
            weights = weights / weights.sum(-1, keepdim=True)
        return logits, weights, index

    return block.gate.register_forward_hook(hook)


def library_relevance(model, block, x, relevance, variant):
    """Relevance at the block's input by the library's composite registered on the block (canonizers of the model)."""
    composite = COMPOSITES[variant]()
    with composite.context(block) as modified:
        leaf = x.clone().requires_grad_()
        output = modified(leaf)
        (result,) = torch.autograd.grad(output, leaf, grad_outputs=relevance)
    return output.detach(), result


@pytest.fixture(scope='module', params=list(MODELS))
def setup(request):
    """``(name, model, block, x [1, T, H], relevance [1, T, H])``."""
    model = make_model(request.param)
    block = model.model.layers[0].mlp
    assert type(block).__name__.endswith('SparseMoeBlock')
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(1, TOKENS, HIDDEN, generator=generator, dtype=DTYPE)
    relevance = torch.randn(1, TOKENS, HIDDEN, generator=generator, dtype=DTYPE)
    return request.param, model, block, x, relevance


@pytest.fixture
def router64(setup):
    """The float64 router for the duration of a test."""
    handle = float64_router(setup[2])
    yield
    handle.remove()


# ----------------------------------------------------------------------------------------------------------------
# Tests
# ----------------------------------------------------------------------------------------------------------------


def test_reference_forward_matches_hf(setup):
    _, _, block, x, _ = setup
    with torch.no_grad():
        expected = block(x)
    output, _ = moe_reference(block, x, torch.ones_like(x), softmax_dtype=torch.float32)
    assert relative_error(output, expected) < 1e-13
    handle = float64_router(block)
    try:
        with torch.no_grad():
            expected = block(x)
    finally:
        handle.remove()
    output, _ = moe_reference(block, x, torch.ones_like(x), softmax_dtype=DTYPE)
    assert relative_error(output, expected) < 1e-13


def test_every_expert_is_used(setup):
    """The test input reaches every expert (so every expert's weights are checked)."""
    _, _, block, x, _ = setup
    logits = x.reshape(-1, HIDDEN) @ block.gate.weight.detach().T
    assert set(torch.topk(logits, TOP_K, dim=-1).indices.flatten().tolist()) == set(range(EXPERTS))


@pytest.mark.parametrize('variant', [ATTNLRP, CPLRP])
def test_library_matches_reference(setup, router64, variant):
    """Float64 router: the library agrees with the reference to rounding."""
    name, model, block, x, relevance = setup
    output, actual = library_relevance(model, block, x, relevance, variant)
    expected_output, expected = moe_reference(block, x, relevance, variant, softmax_dtype=DTYPE)
    assert relative_error(output, expected_output) < 1e-13
    error = relative_error(actual, expected)
    assert error <= TOLERANCE, f'{name} {variant}: relative error {error:.2e}'


@pytest.mark.parametrize('variant, tolerance', [(ATTNLRP, FLOAT32_ROUTER_TOLERANCE), (CPLRP, TOLERANCE)])
def test_library_matches_reference_hf_router(setup, variant, tolerance):
    """Unmodified router (float32 softmax): AttnLRP differentiates it, so float32 precision; CP-LRP does not."""
    name, model, block, x, relevance = setup
    _, actual = library_relevance(model, block, x, relevance, variant)
    _, expected = moe_reference(block, x, relevance, variant, softmax_dtype=torch.float32)
    error = relative_error(actual, expected)
    assert error <= tolerance, f'{name} {variant}: relative error {error:.2e}'


def test_cplrp_conserves(setup):
    """No biases: CP-LRP passes all relevance from the block's output to its input."""
    name, model, block, x, relevance = setup
    _, actual = library_relevance(model, block, x, relevance, CPLRP)
    _, expected = moe_reference(block, x, relevance, CPLRP, softmax_dtype=torch.float32)
    total = float(relevance.sum())
    assert abs(float(actual.sum()) - total) <= 1e-10 * abs(total)
    assert abs(float(expected.sum()) - total) <= 1e-10 * abs(total)


def test_attnlrp_routing_and_products_matter(setup, router64):
    """AttnLRP differs from CP-LRP (the routing weights and gates receive relevance)."""
    _, model, block, x, relevance = setup
    _, attnlrp = library_relevance(model, block, x, relevance, ATTNLRP)
    _, cplrp = library_relevance(model, block, x, relevance, CPLRP)
    assert relative_error(attnlrp, cplrp) > 1e-2


def test_unnormalised_routing_is_softmax_over_all_experts(setup, router64):
    """Without renormalisation the routing weights are the softmax over all experts (restricted to the top-k): the
    library agrees with Prop. 3.1 on that softmax, not with a softmax over the top-k logits."""
    name, model, block, x, relevance = setup
    if block_weights(block)['renormalise']:
        pytest.skip('renormalised routing weights are the softmax over the top-k logits')
    _, actual = library_relevance(model, block, x, relevance, ATTNLRP)
    _, top_k_reading = moe_reference(block, x, relevance, ATTNLRP, softmax_dtype=DTYPE, top_k_reading=True)
    assert relative_error(actual, top_k_reading) > 1e-3


def test_block_registration_uses_eager_experts():
    """Registered on the block alone, with the model's default experts implementation (float32): the relevance must
    be that of the eager loop (or the registration must refuse), not a silently different one."""
    model = make_model('mixtral', dtype=torch.float32)
    model.config._experts_implementation = 'grouped_mm'  # transformers' default experts implementation
    block = model.model.layers[0].mlp
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(1, TOKENS, HIDDEN, generator=generator)
    relevance = torch.randn(1, TOKENS, HIDDEN, generator=generator)
    try:
        _, actual = library_relevance(model, block, x, relevance, ATTNLRP)
    except (RuntimeError, TypeError, ValueError):
        return  # refusing is acceptable
    model.config._experts_implementation = 'eager'
    _, expected = library_relevance(model, block, x, relevance, ATTNLRP)
    assert relative_error(actual, expected) < 1e-4


@pytest.mark.parametrize('name', ['mixtral', 'qwen2_moe_norm', 'qwen3_moe'])
@pytest.mark.parametrize('variant', [ATTNLRP, CPLRP])
def test_top_1_renormalised_routing_weight_is_the_constant_1(name, variant):
    """Top-1 routing renormalised: the weight is ``p / p = 1``, so the block is the selected expert's dense MLP (plus
    Qwen2-MoE's shared expert) and AttnLRP gives its relevance as on that MLP (by hand, :py:func:`moe_reference`);
    without a shared expert it conserves, as AttnLRP does on a gated MLP without biases. Before, the uniform rule gave
    the constant weight half of the relevance and its zero gradient lost it: the block passed 0.5 of its relevance."""
    model = make_model(name)
    block = model.model.layers[0].mlp
    block.gate.top_k = 1
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(1, TOKENS, HIDDEN, generator=generator, dtype=DTYPE)
    relevance = torch.randn(1, TOKENS, HIDDEN, generator=generator, dtype=DTYPE)
    handle = float64_router(block)
    try:
        _, actual = library_relevance(model, block, x, relevance, variant)
        _, expected = moe_reference(block, x, relevance, variant, softmax_dtype=DTYPE)
    finally:
        handle.remove()
    error = relative_error(actual, expected)
    assert error <= TOLERANCE, f'{name} {variant}: relative error {error:.2e}'
    if not hasattr(block, 'shared_expert'):
        total = float(relevance.sum())
        assert abs(float(actual.sum()) - total) <= 1e-10 * abs(total)
