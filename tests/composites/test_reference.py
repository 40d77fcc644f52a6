"""An independent, explicit AttnLRP reference for Llama, compared to :py:func:`zennit_attn.explain`.

The reference below re-implements the forward pass of a Hugging Face ``LlamaForCausalLM`` from its weights and
propagates relevance backward with every rule of Achtibat et al. (ICML 2024, Sec. 3) written out by hand in
*relevance form* (explicit matrix formulas from :py:mod:`tests.naive_rules`, no autograd, nothing imported from
``zennit_attn``). The CP-LRP baseline (Ali et al. 2022: attention probabilities and the SiLU gate are constants) is
implemented the same way. All epsilons are 0.

Hugging Face computes RMSNorm, the softmax of the attention and the rotary cos/sin in float32 even in a float64
model; the reference does the same (and only there), so that its forward pass matches the model to 1e-10 and
both attributions see the same activations. The float32 softmax also puts its float32 *backward* on explain()'s
AttnLRP path (about 1e-7 relative error); the ``float64_softmax`` fixture switches it to float64 in the model and
the reference, and there explain() and the reference agree to rounding (asserted at 1e-10). The unmodified model
is compared at 1e-6.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tests.naive_rules import (
    ATTNLRP,
    CPLRP,
    constant_factor_rule,
    constant_matmul_rule_by_terms,
    epsilon_rule,
    identity_rule,
    matmul_rule_by_terms,
    relative_error,
    residual_rule,
    rms_norm_rule,
    rotary_rule,
    scale_rule,
    softmax_rule,
    uniform_rule,
)
from zennit_attn import explain
from zennit_attn.composites import AttnLRPEpsilon, CPLRPEpsilon

DTYPE = torch.float64
TOLERANCE = 1e-6
SEQ = 7


# ----------------------------------------------------------------------------------------------------------------
# The reference model
# ----------------------------------------------------------------------------------------------------------------


def rotary_matrices(length, head_dim, theta):
    """Rotary matrices ``J_t = diag(cos_t) + diag(sin_t) H`` with ``H x = rotate_half(x)``, ``[T, d, d]``.

    cos/sin come from ``inv_freq = 1 / theta^(arange(0, d, 2) / d)``, ``emb = cat(freqs, freqs)``, computed in
    float32 like Hugging Face's ``LlamaRotaryEmbedding``.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = torch.arange(length, dtype=torch.float32)[:, None] * inv_freq[None]
    emb = torch.cat([freqs, freqs], -1)
    cos, sin = emb.cos().to(DTYPE), emb.sin().to(DTYPE)
    half = head_dim // 2
    rotate_half = torch.zeros(head_dim, head_dim, dtype=DTYPE)
    rotate_half[:half, half:] = -torch.eye(half, dtype=DTYPE)
    rotate_half[half:, :half] = torch.eye(half, dtype=DTYPE)
    return torch.diag_embed(cos) + sin[:, :, None] * rotate_half[None]


def rms_normalize(x, eps):
    """``x / sqrt(mean(x^2) + eps)`` per row, in float32 as Hugging Face's ``LlamaRMSNorm``."""
    x32 = x.to(torch.float32)
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


@dataclass
class LayerCache:
    """Activations of one decoder layer (one sequence)."""

    x: torch.Tensor = None
    u1: torch.Tensor = None
    n1: torch.Tensor = None
    q: torch.Tensor = None
    k: torch.Tensor = None
    v: torch.Tensor = None
    q_rot: torch.Tensor = None
    k_rot: torch.Tensor = None
    scores: torch.Tensor = None
    scaled: torch.Tensor = None
    probs: torch.Tensor = None
    heads: torch.Tensor = None
    attn_out: torch.Tensor = None
    mid: torch.Tensor = None
    u2: torch.Tensor = None
    n2: torch.Tensor = None
    gate: torch.Tensor = None
    act: torch.Tensor = None
    up: torch.Tensor = None
    prod: torch.Tensor = None
    mlp_out: torch.Tensor = None


@dataclass
class Cache:
    """Activations of the whole model (one sequence)."""

    embeddings: torch.Tensor = None
    layers: list = field(default_factory=list)
    final: torch.Tensor = None
    final_u: torch.Tensor = None
    final_n: torch.Tensor = None
    logits: torch.Tensor = None


class ReferenceLlama:
    """Explicit Llama forward pass and AttnLRP / CP-LRP backward pass from a ``LlamaForCausalLM``'s weights.

    Parameters
    ----------
    model : LlamaForCausalLM
        The model whose weights are read.
    softmax_dtype : torch.dtype
        dtype of the attention softmax: float32 as Hugging Face computes it, or float64 to match a model whose
        softmax has been switched to float64 (see the ``float64_softmax`` fixture).
    """

    def __init__(self, model, softmax_dtype=torch.float32):
        config = model.config
        self.softmax_dtype = softmax_dtype
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = config.hidden_size // self.heads
        self.groups = self.heads // self.kv_heads
        self.eps = config.rms_norm_eps
        self.theta = config.rope_parameters['rope_theta']
        self.scaling = self.head_dim**-0.5
        get = lambda tensor: tensor.detach().to(DTYPE).clone()
        self.embed = get(model.model.embed_tokens.weight)
        self.layers = [
            {
                'in_norm': get(layer.input_layernorm.weight),
                'post_norm': get(layer.post_attention_layernorm.weight),
                'q': get(layer.self_attn.q_proj.weight),
                'k': get(layer.self_attn.k_proj.weight),
                'v': get(layer.self_attn.v_proj.weight),
                'o': get(layer.self_attn.o_proj.weight),
                'gate': get(layer.mlp.gate_proj.weight),
                'up': get(layer.mlp.up_proj.weight),
                'down': get(layer.mlp.down_proj.weight),
            }
            for layer in model.model.layers
        ]
        self.final_norm = get(model.model.norm.weight)
        self.lm_head = get(model.lm_head.weight)

    def forward(self, ids):
        """Forward pass of one sequence ``ids [T]``; returns the :py:class:`Cache` (logits ``[T, vocab]``)."""
        length = len(ids)
        rotation = rotary_matrices(length, self.head_dim, self.theta)
        mask = torch.ones(length, length, dtype=torch.bool).tril()
        cache = Cache(embeddings=self.embed[ids])
        hidden = cache.embeddings
        for weights in self.layers:
            c = LayerCache(x=hidden)
            c.u1 = rms_normalize(hidden, self.eps)
            c.n1 = weights['in_norm'] * c.u1
            c.q, c.k, c.v = (c.n1 @ weights[name].T for name in 'qkv')
            q = c.q.view(length, self.heads, self.head_dim).transpose(0, 1)
            k = c.k.view(length, self.kv_heads, self.head_dim).transpose(0, 1)
            v = c.v.view(length, self.kv_heads, self.head_dim).transpose(0, 1)
            c.q_rot = torch.einsum('tij,htj->hti', rotation, q)
            c.k_rot = torch.einsum('tij,htj->hti', rotation, k)
            kv_of = [head // self.groups for head in range(self.heads)]
            c.scores = torch.stack([c.q_rot[h] @ c.k_rot[kv_of[h]].T for h in range(self.heads)])
            c.scaled = c.scores * self.scaling
            masked = torch.where(mask, c.scaled, torch.tensor(-torch.inf, dtype=DTYPE))
            c.probs = torch.softmax(masked.to(self.softmax_dtype), -1).to(DTYPE)
            c.heads = torch.stack([c.probs[h] @ v[kv_of[h]] for h in range(self.heads)])
            concat = c.heads.transpose(0, 1).reshape(length, -1)
            c.attn_out = concat @ weights['o'].T
            c.mid = hidden + c.attn_out
            c.u2 = rms_normalize(c.mid, self.eps)
            c.n2 = weights['post_norm'] * c.u2
            c.gate = c.n2 @ weights['gate'].T
            c.act = torch.nn.functional.silu(c.gate)
            c.up = c.n2 @ weights['up'].T
            c.prod = c.act * c.up
            c.mlp_out = c.prod @ weights['down'].T
            hidden = c.mid + c.mlp_out
            cache.layers.append(c)
        cache.final = hidden
        cache.final_u = rms_normalize(hidden, self.eps)
        cache.final_n = self.final_norm * cache.final_u
        cache.logits = cache.final_n @ self.lm_head.T
        return cache

    def attention_rule(self, c, weights, relevance, variant):
        """Relevance of the attention block's input ``n1`` from the relevance of its output ``attn_out``.

        o_proj: Eq. 8; ``A V``: Prop. 3.3 (CP-LRP: Eq. 8 with ``A`` constant); softmax: Prop. 3.1; scaling: Eq. 8;
        ``Q K^T``: Prop. 3.3; GQA: sums over the copies of a kv head; rotary: Eq. 8; q/k/v_proj: Eq. 8.
        """
        length = c.x.shape[0]
        rotation = rotary_matrices(length, self.head_dim, self.theta)
        mask = torch.ones(length, length, dtype=torch.bool).tril()
        concat = c.heads.transpose(0, 1).reshape(length, -1)
        r_heads = epsilon_rule(concat, weights['o'], c.attn_out, relevance)
        r_heads = r_heads.view(length, self.heads, self.head_dim).transpose(0, 1)
        v = c.v.view(length, self.kv_heads, self.head_dim).transpose(0, 1)
        r_q_rot = torch.zeros_like(c.q_rot)
        r_k_rot = torch.zeros_like(c.k_rot)
        r_v = torch.zeros_like(v)
        for h in range(self.heads):
            g = h // self.groups
            if variant == ATTNLRP:
                r_probs, r_value = matmul_rule_by_terms(c.probs[h], v[g], r_heads[h])
                r_scaled = softmax_rule(c.scaled[h], c.probs[h], r_probs, mask)
                r_scores = scale_rule(c.scores[h], self.scaling, c.scaled[h], r_scaled)
                r_query, r_key_t = matmul_rule_by_terms(c.q_rot[h], c.k_rot[g].T, r_scores)
                r_q_rot[h] = r_query
                r_k_rot[g] += r_key_t.T
            else:
                r_value = constant_matmul_rule_by_terms(c.probs[h], v[g], r_heads[h])
            r_v[g] += r_value
        q = c.q.view(length, self.heads, self.head_dim).transpose(0, 1)
        k = c.k.view(length, self.kv_heads, self.head_dim).transpose(0, 1)
        r_q = torch.stack([rotary_rule(q[h], rotation, c.q_rot[h], r_q_rot[h]) for h in range(self.heads)])
        r_k = torch.stack([rotary_rule(k[g], rotation, c.k_rot[g], r_k_rot[g]) for g in range(self.kv_heads)])
        flat = lambda tensor: tensor.transpose(0, 1).reshape(length, -1)
        return (
            epsilon_rule(c.n1, weights['q'], c.q, flat(r_q))
            + epsilon_rule(c.n1, weights['k'], c.k, flat(r_k))
            + epsilon_rule(c.n1, weights['v'], c.v, flat(r_v))
        )

    def mlp_rule(self, c, weights, relevance, variant):
        """Relevance of the MLP's input ``n2``: down_proj Eq. 8; ``silu(gate) * up`` Prop. 3.2 (CP-LRP: Eq. 8
        with the gate constant); SiLU Eq. 9; gate_proj/up_proj Eq. 8."""
        r_prod = epsilon_rule(c.prod, weights['down'], c.mlp_out, relevance)
        if variant == ATTNLRP:
            r_act, r_up = uniform_rule(r_prod), uniform_rule(r_prod)
        else:
            r_act, r_up = torch.zeros_like(r_prod), constant_factor_rule(c.act, c.up, r_prod)
        r_gate = identity_rule(r_act)
        return epsilon_rule(c.n2, weights['gate'], c.gate, r_gate) + epsilon_rule(c.n2, weights['up'], c.up, r_up)

    def relevance(self, ids, position, target, variant=ATTNLRP):
        """AttnLRP (or CP-LRP) of logit ``[position, target]`` of one sequence.

        Returns
        -------
        tuple
            ``(embedding relevance [T, hidden], logit)``; token relevance is the sum over hidden.
        """
        cache = self.forward(ids)
        logit = cache.logits[position, target]
        r_logits = torch.zeros_like(cache.logits)
        r_logits[position, target] = logit
        r_final_n = epsilon_rule(cache.final_n, self.lm_head, cache.logits, r_logits)
        relevance = rms_norm_rule(cache.final_u, self.final_norm, r_final_n)
        for c, weights in zip(reversed(cache.layers), reversed(self.layers)):
            r_mid, r_mlp_out = residual_rule(c.mid, c.mlp_out, relevance)
            r_n2 = self.mlp_rule(c, weights, r_mlp_out, variant)
            r_mid = r_mid + rms_norm_rule(c.u2, weights['post_norm'], r_n2)
            r_x, r_attn_out = residual_rule(c.x, c.attn_out, r_mid)
            r_n1 = self.attention_rule(c, weights, r_attn_out, variant)
            relevance = r_x + rms_norm_rule(c.u1, weights['in_norm'], r_n1)
        return relevance, logit


# ----------------------------------------------------------------------------------------------------------------
# Fixtures and helpers
# ----------------------------------------------------------------------------------------------------------------

MODELS = {  # name: (layers, kv heads)
    '1layer-gqa': (1, 2),
    '2layer-gqa': (2, 2),
    '1layer-mha': (1, 4),
    '2layer-mha': (2, 4),
}


def make_model(layers, kv_heads, seed=0):
    """A tiny random float64 Llama, with weights large enough for peaked attention and non-trivial norms."""
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        attn_implementation='eager',
        rms_norm_eps=1e-6,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(DTYPE).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith('norm.weight'):
                parameter.copy_(0.5 + torch.rand(parameter.shape, generator=generator, dtype=DTYPE))
            elif 'embed_tokens' in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator, dtype=DTYPE))
            else:
                gain = 2.0 if ('q_proj' in name or 'k_proj' in name) else 1.0
                std = gain / parameter.shape[1] ** 0.5
                parameter.copy_(std * torch.randn(parameter.shape, generator=generator, dtype=DTYPE))
    return model


@pytest.fixture(scope='module', params=list(MODELS))
def setup(request):
    """``(model, input_ids [2, SEQ])`` for each model of :py:data:`MODELS`."""
    layers, kv_heads = MODELS[request.param]
    model = make_model(layers, kv_heads)
    ids = torch.randint(0, 64, (2, SEQ), generator=torch.Generator().manual_seed(7))
    return model, ids


@pytest.fixture
def float64_softmax(monkeypatch):
    """Make Hugging Face's eager attention compute its softmax in float64 (it asks for float32) during a test.

    With it, the model has no float32 step on the relevance path (its float32 RMSNorm and rotary cos/sin only
    change activations, which the reference reproduces), so explain() and the reference agree to rounding.
    """
    original = torch.nn.functional.softmax

    def softmax(input, dim=None, _stacklevel=3, dtype=None):
        if input.dtype == torch.float64 and dtype == torch.float32:
            dtype = None
        return original(input, dim=dim, _stacklevel=_stacklevel, dtype=dtype)

    monkeypatch.setattr(torch.nn.functional, 'softmax', softmax)
    return torch.float64


COMPOSITES = {ATTNLRP: AttnLRPEpsilon, CPLRP: CPLRPEpsilon}

#: (target, position) as passed to explain(): argmax at the end, explicit targets at the end, at a middle
#: position, and at one position per row.
QUERIES = [
    (None, -1),
    ([5, 17], -1),
    ([3, 60], 3),
    ([11, 42], [2, 5]),
]


def run_both(setup, target, position, variant, softmax_dtype=torch.float32):
    """explain() and the reference (row by row) on the same query.

    Returns
    -------
    tuple
        ``(explanation, reference embedding relevance [2, SEQ, hidden], reference logits [2], positions [2])``.
    """
    model, ids = setup
    reference = ReferenceLlama(model, softmax_dtype)
    exp = explain(model, ids, target=target, position=position, method=variant, composite=COMPOSITES[variant]())
    positions = torch.as_tensor(SEQ - 1 if position == -1 else position).expand(len(ids)) % SEQ
    if target is None:
        targets = torch.stack([reference.forward(row).logits[p].argmax() for row, p in zip(ids, positions)])
        assert torch.equal(exp.target, targets)
    else:
        targets = torch.as_tensor(target)
    results = [reference.relevance(row, int(p), int(t), variant) for row, p, t in zip(ids, positions, targets)]
    assert torch.equal(exp.position, positions)
    return exp, torch.stack([r for r, _ in results]), torch.stack([logit for _, logit in results]), positions


# ----------------------------------------------------------------------------------------------------------------
# Tests
# ----------------------------------------------------------------------------------------------------------------


def test_reference_forward_matches_hf(setup):
    """The explicit forward pass reproduces the Hugging Face logits."""
    model, ids = setup
    with torch.no_grad():
        expected = model(ids).logits
    actual = torch.stack([ReferenceLlama(model).forward(row).logits for row in ids])
    assert relative_error(actual, expected) <= 1e-10


def test_reference_forward_matches_hf_float64_softmax(setup, float64_softmax):
    """Also with the softmax in float64; and the float32 softmax does make a difference (> 1e-12)."""
    model, ids = setup
    with torch.no_grad():
        expected = model(ids).logits
    actual = torch.stack([ReferenceLlama(model, float64_softmax).forward(row).logits for row in ids])
    assert relative_error(actual, expected) <= 1e-13
    float32 = torch.stack([ReferenceLlama(model).forward(row).logits for row in ids])
    assert relative_error(float32, expected) >= 1e-12


def check_against_reference(exp, r_embedding, logits, positions, tolerance, sum_tolerance):
    """Per row: logit, token relevance, embedding relevance, causality and relevance sums."""
    assert relative_error(exp.logit, logits) <= 1e-10
    r_tokens = r_embedding.sum(-1)
    for row in range(len(positions)):
        assert relative_error(exp.relevance[row], r_tokens[row]) <= tolerance
        assert relative_error(exp.embedding_relevance[row], r_embedding[row]) <= tolerance
        # causality: nothing after the explained position
        assert float(r_tokens[row, positions[row] + 1 :].abs().sum()) == 0.0
        assert float(exp.relevance[row, positions[row] + 1 :].abs().sum()) == 0.0
        assert r_tokens[row, : positions[row] + 1].abs().min() > 0
        total = float(r_tokens[row].sum())
        assert abs(float(exp.relevance[row].sum()) - total) <= sum_tolerance * float(r_tokens[row].abs().sum())


@pytest.mark.parametrize('variant', [ATTNLRP, CPLRP])
@pytest.mark.parametrize('target,position', QUERIES)
def test_explain_matches_reference_float64(setup, target, position, variant, float64_softmax):
    """With the whole model in float64, explain() equals the reference to rounding (1e-10, well below 1e-6)."""
    exp, r_embedding, logits, positions = run_both(setup, target, position, variant, float64_softmax)
    check_against_reference(exp, r_embedding, logits, positions, 1e-10, 1e-10)


@pytest.mark.parametrize('variant', [ATTNLRP, CPLRP])
@pytest.mark.parametrize('target,position', QUERIES)
def test_explain_matches_reference_hf_softmax(setup, target, position, variant):
    """On the unmodified model (float32 softmax inside a float64 model), explain() equals the reference to 1e-6.

    CP-LRP does not backpropagate through the softmax and stays at rounding level; AttnLRP's softmax rule runs
    through Hugging Face's float32 softmax backward in explain(), which costs about 1e-7.
    """
    exp, r_embedding, logits, positions = run_both(setup, target, position, variant)
    tolerance = TOLERANCE if variant == ATTNLRP else 1e-10
    check_against_reference(exp, r_embedding, logits, positions, tolerance, tolerance)


@pytest.mark.parametrize('target,position', QUERIES)
def test_reference_conservation(setup, target, position, float64_softmax):
    """CP-LRP conserves the logit; AttnLRP does not (the softmax rule's bias absorbs relevance, Prop. 3.1), and
    the reference's sums equal explain()'s sums."""
    cp_exp, cp_embedding, logits, _ = run_both(setup, target, position, CPLRP, float64_softmax)
    cp_sums = cp_embedding.sum((-1, -2))
    assert float(((cp_sums - logits).abs() / logits.abs()).max()) <= 1e-8
    assert float(((cp_exp.relevance.sum(-1) - cp_sums).abs() / cp_sums.abs()).max()) <= 1e-10
    exp, attn_embedding, _, _ = run_both(setup, target, position, ATTNLRP, float64_softmax)
    attn_sums = attn_embedding.sum((-1, -2))
    assert float(((attn_sums - logits).abs() / logits.abs()).min()) >= 1e-3
    assert float(((exp.relevance.sum(-1) - attn_sums).abs() / attn_sums.abs()).max()) <= 1e-10


def test_variants_differ(setup, float64_softmax):
    """AttnLRP and CP-LRP give clearly different token relevances (the comparison can tell them apart)."""
    _, attn_embedding, _, _ = run_both(setup, [5, 17], -1, ATTNLRP, float64_softmax)
    _, cp_embedding, _, _ = run_both(setup, [5, 17], -1, CPLRP, float64_softmax)
    assert relative_error(attn_embedding.sum(-1), cp_embedding.sum(-1)) >= 1e-2


# --- the rule helpers themselves -------------------------------------------------------------------------------


def test_softmax_rule_is_taylor_at_x():
    """Prop. 3.1 equals the first-order Taylor term ``x_i sum_j J_ji R_j / s_j`` with J the softmax Jacobian."""
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(5, dtype=DTYPE, generator=generator)
    relevance = torch.randn(5, dtype=DTYPE, generator=generator)
    s = torch.softmax(x, -1)
    jacobian = torch.diag(s) - s[:, None] * s[None, :]
    expected = x * (jacobian.T @ (relevance / s))
    actual = softmax_rule(x[None], s[None], relevance[None], torch.ones(1, 5, dtype=torch.bool))[0]
    assert torch.allclose(actual, expected, rtol=1e-12, atol=1e-14)


def test_matmul_rule_conserves_and_splits_evenly():
    """Prop. 3.3: ``R_a`` and ``R_b`` each carry half of ``sum R_O`` (no bias)."""
    generator = torch.Generator().manual_seed(4)
    a = torch.randn(4, 3, dtype=DTYPE, generator=generator)
    b = torch.randn(3, 5, dtype=DTYPE, generator=generator)
    relevance = torch.randn(4, 5, dtype=DTYPE, generator=generator)
    r_a, r_b = matmul_rule_by_terms(a, b, relevance)
    assert abs(float(r_a.sum() - relevance.sum() / 2)) <= 1e-12
    assert abs(float(r_b.sum() - relevance.sum() / 2)) <= 1e-12
    assert abs(float(constant_matmul_rule_by_terms(a, b, relevance).sum() - relevance.sum())) <= 1e-12


def test_rotary_matrices_match_hf():
    """``J_t x`` equals Hugging Face's ``x * cos + rotate_half(x) * sin``."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    config = LlamaConfig(hidden_size=32, num_attention_heads=4)
    rope = LlamaRotaryEmbedding(config)
    x = torch.randn(1, 1, SEQ, 8, dtype=DTYPE, generator=torch.Generator().manual_seed(5))
    cos, sin = rope(x, torch.arange(SEQ)[None])
    expected, _ = apply_rotary_pos_emb(x, x, cos, sin)
    actual = torch.einsum('tij,tj->ti', rotary_matrices(SEQ, 8, config.rope_parameters['rope_theta']), x[0, 0])
    assert torch.allclose(actual, expected[0, 0], rtol=0, atol=1e-14)
