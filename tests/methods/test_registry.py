"""The baseline methods of ``explain(method=...)``: shapes, finiteness, determinism, padded rows equal to the rows
alone, one behaviour each, and reference computations (rollouts by hand, AtMan by a plain loop, KernelSHAP against
exact Shapley values)."""

import itertools
import math

import pytest
import torch
import transformers
from transformers import AttentionInterface

from tests.models import tiny_model, token_ids
from tests.numbers import assert_close, relative_error
from zennit_attn import explain, explain_generation, explain_sources
from zennit_attn.composites import (
    AttnLRPEpsilon,
    AttnLRPGamma,
    AttnLRPLateEpsilon,
    CPLRPEpsilon,
    CPLRPGamma,
    RelPEpsilon,
)
from zennit_attn.inputs.task import TokenTask as Task
from zennit_attn.latent import Neuron
from zennit_attn.methods.attention import attention_maps
from zennit_attn.methods.lrp import attribute
from zennit_attn.methods.propagation import lrp_method
from zennit_attn.methods.registry import METHODS, check_params
from zennit_attn.rules import ConstantGates, Uniform

FAST = {'kernelshap': dict(samples=32), 'integrated_gradients': dict(steps=2), 'smoothgrad': dict(samples=2)}


@pytest.fixture(scope='module')
def ids():
    return token_ids('llama', 6, 1, seed=3)


def test_registry_lists_every_method():
    assert list(METHODS) == [
        'attnlrp',
        'cplrp',
        'palrp',
        'attnlrp_late',
        'input_x_gradient',
        'integrated_gradients',
        'smoothgrad',
        'attention_rollout',
        'grad_attention_rollout',
        'gradcam',
        'atman',
        'kernelshap',
        'random',
    ]
    assert all(entry.name == name for name, entry in METHODS.items())
    with pytest.raises(ValueError, match='Unknown method'):
        explain(tiny_model('llama'), token_ids('llama', 4), method='lime')
    with pytest.raises(ValueError, match='Unknown method'):
        check_params('lime', {})


def _backward_passes(model):
    """Count the backward passes that reach the output of the last block (a tensor hook per forward pass)."""
    count = [0]

    def forward_hook(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        if hidden.requires_grad:
            hidden.register_hook(lambda grad: count.__setitem__(0, count[0] + 1))

    return count, model.model.layers[-1].register_forward_hook(forward_hook)


@pytest.mark.parametrize('name', METHODS)
def test_metadata_says_what_the_method_does(llama, ids, name):
    """Each flag of the registry against the method's behaviour: a backward pass reaches the model exactly for the
    ``backward`` methods; ``latent`` methods record latent relevance whose residual stream at the first block is the
    input relevance (one backward pass of relevance), the others are refused; ``neuron`` methods explain a
    neuron's activation (the logit is that activation), the others are refused; ``lrp`` methods take a composite
    (CP-LRP's composite makes attnlrp give cplrp's relevance), the others refuse it; the defaults pass the checks."""
    entry = METHODS[name]
    params = FAST.get(name, {})
    assert check_params(name, entry.params) == dict(entry.params)
    count, handle = _backward_passes(llama)
    try:
        explanation = explain(llama, ids, method=name, **params)
    finally:
        handle.remove()
    assert (count[0] > 0) == entry.backward, count
    if entry.latent:
        recorded = explain(llama, ids, method=name, latent='residual', **params)
        torch.testing.assert_close(recorded.latent['residual'][:, 0], explanation.relevance)
        assert torch.equal(recorded.relevance, explanation.relevance)
    else:
        with pytest.raises(ValueError, match='latent= and condition= read the relevance of one backward pass'):
            explain(llama, ids, method=name, latent='residual', **params)
    neuron = Neuron('mlp', 0, 1)
    if entry.neuron:
        activation = []
        handle = llama.model.layers[0].mlp.down_proj.register_forward_hook(
            lambda module, args, output: activation.append(args[0][:, -1, 1].detach())
        )
        try:
            result = explain(llama, ids, method=name, target=neuron, **params)
        finally:
            handle.remove()
        torch.testing.assert_close(result.logit, activation[0])
    else:
        with pytest.raises(ValueError, match='cannot explain a Neuron target'):
            explain(llama, ids, method=name, target=neuron, **params)
    if entry.lrp:  # a composite of the method's own product rule replaces the default
        composite = {
            'cplrp': CPLRPEpsilon(epsilon=0.5),
            'attnlrp_late': AttnLRPLateEpsilon(start=0.25, epsilon=0.5),
        }.get(name, AttnLRPEpsilon(epsilon=0.5, positions=name == 'palrp'))
        torch.testing.assert_close(
            explain(llama, ids, method=name, composite=composite).relevance,
            attribute(Task(llama, ids), -1, None, composite, name).relevance,
        )
    else:
        with pytest.raises(ValueError, match='composite= applies to the LRP methods'):
            explain(llama, ids, method=name, composite=CPLRPEpsilon(), **params)


@pytest.mark.parametrize(
    'method, composite, rule',
    [
        ('cplrp', AttnLRPEpsilon(), 'Uniform'),
        ('attnlrp', CPLRPEpsilon(), 'ConstantGates'),
        ('attnlrp', AttnLRPEpsilon(product_rule=ConstantGates()), 'ConstantGates'),
        ('cplrp', CPLRPGamma(product=Uniform()), 'Uniform'),
        ('attnlrp', AttnLRPGamma(product=ConstantGates()), 'ConstantGates'),
    ],
)
def test_a_composite_of_the_other_methods_rule_is_refused(llama, ids, method, composite, rule):
    """Before, ``explain(method='cplrp', composite=AttnLRPEpsilon())`` returned AttnLRP's relevance labelled 'cplrp'."""
    name = type(composite).__name__
    with pytest.raises(
        ValueError,
        match=rf"method='{method}' and composite={name}\(\) conflict: the composite applies "
        rf"{rule}, the product rule of '{lrp_method(composite)}'.* pass method=",
    ):
        explain(llama, ids, method=method, composite=composite)


def test_composites_of_the_methods_rule_or_of_other_rules_are_taken(llama, ids):
    """The CP-LRP composites under 'cplrp' give CP-LRP's relevance, labelled so; RelP's rules are neither method's
    and are taken under either name (the composite a user passes)."""
    for method, composite in (('cplrp', CPLRPEpsilon()), ('attnlrp', AttnLRPEpsilon())):
        given = explain(llama, ids, method=method, composite=composite)
        assert given.method == method
        assert torch.equal(given.relevance, explain(llama, ids, method=method).relevance)
    assert [lrp_method(composite) for composite in (CPLRPGamma(), AttnLRPGamma(), RelPEpsilon())] == [
        'cplrp',
        'attnlrp',
        'attnlrp',
    ]
    relp = explain(llama, ids, method='cplrp', composite=RelPEpsilon())
    torch.testing.assert_close(relp.relevance, explain(llama, ids, composite=RelPEpsilon()).relevance)


@pytest.mark.parametrize(
    'name, params, error, match',
    [
        ('integrated_gradients', dict(steps=0), ValueError, 'steps must be a positive integer'),
        ('integrated_gradients', dict(steps='abc'), ValueError, "steps must be a positive integer, got 'abc'"),
        ('integrated_gradients', dict(steps=2.0), ValueError, 'steps must be a positive integer'),
        ('integrated_gradients', dict(baseline=float('nan')), ValueError, 'baseline must be a finite number'),
        ('integrated_gradients', dict(baseline=float('inf')), ValueError, 'baseline must be a finite number, got inf'),
        ('smoothgrad', dict(sigma=-1), ValueError, r'sigma must be a finite number >= 0.0, got -1'),
        ('smoothgrad', dict(sigma=float('inf')), ValueError, 'sigma must be a finite number >= 0.0, got inf'),
        ('smoothgrad', dict(samples=0), ValueError, 'samples must be a positive integer'),
        ('smoothgrad', dict(multiply_input='no'), ValueError, 'multiply_input must be True or False'),
        ('atman', dict(score='bogus'), ValueError, "score must be one of 'log_softmax', 'logit', got 'bogus'"),
        ('atman', dict(p=1.5), ValueError, r'p must be a finite number in \[0.0, 1.0\]'),
        ('atman', dict(p=-0.1), ValueError, 'p must be a finite number in'),
        ('atman', dict(perturbation_batch=0), ValueError, 'perturbation_batch must be a positive integer'),
        ('atman', dict(batch_size=4), TypeError, r"atman takes no parameter\(s\) \['batch_size'\]"),
        ('kernelshap', dict(samples=0), ValueError, 'samples must be a positive integer'),
        ('kernelshap', dict(seed=0.5), ValueError, 'seed must be an integer or None'),
        ('gradcam', dict(layer='last'), ValueError, 'layer must be an integer'),
        ('attention_rollout', dict(dt=2), ValueError, 'dt must be a finite number in'),
        ('attnlrp', dict(steps=3), TypeError, 'configure LRP through composite='),
        ('attnlrp', dict(composite='AttnLRPEpsilon'), TypeError, 'composite must be a zennit Composite'),
        ('random', dict(composite=CPLRPEpsilon()), ValueError, 'composite= applies to the LRP methods'),
    ],
)
def test_check_params_without_a_model(name, params, error, match):
    with pytest.raises(error, match=match):
        check_params(name, params)


def test_check_params_normalises_and_adds_no_defaults():
    checked = check_params('atman', {'p': 1, 'perturbation_batch': torch.tensor(3).item()})
    assert checked == {'p': 1.0, 'perturbation_batch': 3} and type(checked['p']) is float
    assert check_params('kernelshap', {}) == {}
    composite = CPLRPEpsilon()
    assert check_params('attnlrp', {'composite': composite}) == {'composite': composite}


@pytest.mark.parametrize('method', METHODS)
def test_shape_finite_deterministic(llama, ids, method):
    params = FAST.get(method, {})
    first = explain(llama, ids, method=method, **params)
    second = explain(llama, ids, method=method, **params)
    assert first.relevance.shape == ids.shape
    assert bool(torch.isfinite(first.relevance).all())
    assert torch.equal(first.relevance, second.relevance)
    logits = llama(ids).logits[:, -1]
    assert torch.equal(first.target, logits.argmax(-1))
    assert torch.allclose(first.logit, logits.max(-1).values.detach())


# ------------------------------------------------------------------------------------------------ padding invariance
#: The id of the pads: an ordinary token of the tiny vocabulary, so that a method that looked at the pads (ran the model
#: without the attention mask, explained the last position instead of the last real token, drew values or coalitions
#: for them) would find relevance there and change the real tokens' values.
PAD = 7
#: Real tokens per row of the padded batch; each row has this many pads too.
REAL = 4
#: The methods that read attention probabilities: transformers' eager attention (which they switch to) turns a fully
#: masked float64 query row (a left pad) into NaN, so they are explained in float32.
ATTENTION_MAPS = ('attention_rollout', 'grad_attention_rollout', 'gradcam')
#: Relative tolerance of a padded row against the row alone: float64 rounding, float32 rounding for the attention maps.
PADDING_TOLERANCE = {name: 1e-6 for name in ATTENTION_MAPS}
#: Methods whose padded rows are not yet the rows alone, and why. The test checks that they still differ (so that an
#: entry is removed once its method is fixed) and reports them as xfail; everything else is asserted for them too.
NOT_PADDING_INVARIANT: dict[str, str] = {}
PADDING_CASES = [
    *(pytest.param(name, FAST.get(name, {}), None, id=name) for name in METHODS if name not in NOT_PADDING_INVARIANT),
    # SmoothGrad without noise (input x gradient through SmoothGrad's own path) is invariant
    pytest.param('smoothgrad', dict(samples=2, sigma=0.0), None, id='smoothgrad-sigma0'),
    *(pytest.param(name, FAST[name], reason, id=name) for name, reason in NOT_PADDING_INVARIANT.items()),
]


def padded_rows(family):
    """Two rows of ``REAL`` tokens, and the batch of both with ``REAL`` pads each (the first row left-padded, the
    second right-padded) with its attention mask."""
    rows = token_ids(family, REAL, 2, seed=6)  # Grad-CAM (clamped at 0) gives each of these rows some relevance
    pads = torch.full((REAL,), PAD)
    ones, zeros = torch.ones(REAL, dtype=torch.long), torch.zeros(REAL, dtype=torch.long)
    batch = torch.stack([torch.cat([pads, rows[0]]), torch.cat([rows[1], pads])])
    mask = torch.stack([torch.cat([zeros, ones]), torch.cat([ones, zeros])])
    return rows, batch, mask


@pytest.mark.parametrize('family', ['llama', 'gpt2'])
@pytest.mark.parametrize('method, params, defect', PADDING_CASES)
def test_padded_rows_are_the_rows_alone(family, method, params, defect):
    """Every method explains each row of a left- and right-padded batch as it explains the row alone: the same
    target and logit, the same relevance of the real tokens (float64 to 1e-12; see ``PADDING_TOLERANCE``), and
    exactly 0 at the pads. The batch is one where a method that looked at the pads would find relevance there:
    explained without the attention mask, the pads get relevance and the real tokens other values (Llama's rotary
    positions are relative, GPT-2's learned positions absolute: its left-padded row needs shifted position ids)."""
    dtype = torch.float32 if method in ATTENTION_MAPS else torch.float64
    model = tiny_model(family, dtype=dtype, attn_implementation='sdpa')
    tolerance = PADDING_TOLERANCE.get(method, 1e-12)
    rows, batch, mask = padded_rows(family)
    real = mask.bool()
    padded = explain(model, batch, attention_mask=mask, method=method, **params)
    alone = [explain(model, rows[row : row + 1], method=method, **params) for row in range(2)]
    together = torch.cat([single.relevance for single in alone])
    assert torch.equal(padded.target, torch.cat([single.target for single in alone]))
    torch.testing.assert_close(padded.logit, torch.cat([single.logit for single in alone]), rtol=tolerance, atol=0)
    assert bool((padded.relevance[~real] == 0).all()) and bool(torch.isfinite(padded.relevance).all())
    unmasked = explain(model, batch, method=method, **params)
    assert float(unmasked.relevance[~real].abs().max()) > 0
    assert relative_error(unmasked.relevance[real].view(2, REAL), together) > tolerance
    if defect is not None:
        error = relative_error(padded.relevance[real].view(2, REAL), together)
        assert error > tolerance, f'{method} is padding invariant now: remove it from NOT_PADDING_INVARIANT'
        pytest.xfail(defect)
    for row in range(2):
        assert_close(padded.relevance[row, real[row]], together[row], tol=tolerance)


def test_input_x_gradient_is_exact_for_a_linear_readout(llama, ids):
    explanation = explain(llama, ids, method='input_x_gradient')
    task = Task(llama, ids)
    embeddings = task.embeddings.clone().requires_grad_(True)
    logit = task.resolve(task.forward(embeddings))
    (grad,) = torch.autograd.grad(logit.sum(), embeddings)
    assert torch.allclose(explanation.relevance, (grad * task.embeddings).sum(-1))


def test_integrated_gradients_is_the_right_riemann_sum_of_the_paper(llama, ids):
    steps = 3
    explanation = explain(llama, ids, method='integrated_gradients', steps=steps)
    task = Task(llama, ids)
    task.resolve_plain()
    total = torch.zeros_like(task.embeddings)
    for k in range(1, steps + 1):  # IG = x * 1/m sum_k grad f(k/m x), zero baseline
        point = (k / steps * task.embeddings).requires_grad_(True)
        (grad,) = torch.autograd.grad(task.select(task.forward(point)).sum(), point)
        total += grad / steps
    assert torch.allclose(explanation.relevance, (total * task.embeddings).sum(-1))


def test_smoothgrad_one_sample_is_input_x_gradient_and_seed_matters(llama, ids):
    one = explain(llama, ids, method='smoothgrad', samples=1)
    assert torch.allclose(one.relevance, explain(llama, ids, method='input_x_gradient').relevance)
    a = explain(llama, ids, method='smoothgrad', samples=2, seed=1).relevance
    b = explain(llama, ids, method='smoothgrad', samples=2, seed=2).relevance
    assert not torch.equal(a, b)


def _maps(model, tokens):
    task = Task(model, tokens)
    embeddings = task.embeddings.clone().requires_grad_(True)
    with attention_maps(task, embeddings) as (scores, attentions):
        logit = scores[:, -1].max(-1).values
        grads = torch.autograd.grad(logit.sum(), attentions)
    return [a.detach()[0] for a in attentions], [g[0] for g in grads]


def test_attention_rollout_by_hand(llama, ids):
    attentions, _ = _maps(llama, ids)
    eye = torch.eye(ids.shape[1], dtype=torch.float64)
    product = eye
    for attention in attentions:  # first layer first: R_k = 0.5 (I + mean_h A_k) R_{k-1}
        product = (0.5 * (eye + attention.mean(0))) @ product
    explanation = explain(llama, ids, method='attention_rollout')
    assert torch.allclose(explanation.relevance[0], product[-1])
    assert float(explanation.relevance.sum()) == pytest.approx(1.0)  # rows of the normalised rollout sum to 1
    # it does not depend on the target
    assert torch.equal(explain(llama, ids, method='attention_rollout', target=7).relevance, explanation.relevance)
    assert llama.config._attn_implementation == 'eager'


def test_grad_attention_rollout_by_hand(llama, ids):
    attentions, grads = _maps(llama, ids)
    eye = torch.eye(ids.shape[1], dtype=torch.float64)
    product = eye
    for attention, grad in zip(attentions, grads):  # Chefer et al.: R += mean_h (grad * A)^+ @ R
        product = product + (grad * attention).clamp(min=0).mean(0) @ product
    explanation = explain(llama, ids, method='grad_attention_rollout')
    assert torch.allclose(explanation.relevance[0], product[-1])
    assert bool((explanation.relevance >= 0).all()) and float(explanation.relevance[0, -1]) >= 1.0


def test_rollout_discard_threshold_and_sdpa_restored():
    model = tiny_model('llama', attn_implementation='sdpa')
    tokens = token_ids('llama', 6, 1, seed=3)
    full = explain(model, tokens, method='attention_rollout', dt=1.0).relevance
    cut = explain(model, tokens, method='attention_rollout', dt=0.5).relevance
    assert not torch.allclose(full, cut)
    assert model.config._attn_implementation == 'sdpa'
    assert torch.allclose(full, explain(tiny_model('llama'), tokens, method='attention_rollout').relevance)


def test_gradcam_by_hand(llama, ids):
    attentions, grads = _maps(llama, ids)
    row, grad_row = attentions[-1][:, -1], grads[-1][:, -1]  # [heads, seq], all keys allowed at the last position
    expected = (grad_row.mean(-1, keepdim=True) * row).mean(0).clamp(min=0)
    explanation = explain(llama, ids, method='gradcam')
    assert torch.allclose(explanation.relevance[0], expected)
    early = explain(llama, ids, method='gradcam', position=2)
    assert bool((early.relevance[0, 3:] == 0).all()) and bool((early.relevance >= 0).all())


def _reference_attention(factor_of):
    """Eager attention that multiplies the pre-softmax scores of the suppressed key column by (1 - p)."""

    def attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        groups = query.shape[1] // key.shape[1]
        key = key.repeat_interleave(groups, 1)
        value = value.repeat_interleave(groups, 1)
        scores = (query @ key.transpose(2, 3)) * scaling
        scores = scores * factor_of()[:, None, None, :]
        seq = query.shape[2]
        causal = torch.ones(seq, seq, dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, -math.inf)
        weights = scores.softmax(-1, dtype=torch.float32).to(query.dtype)  # as transformers' eager
        return (weights @ value).transpose(1, 2).contiguous(), weights

    return attention


@pytest.mark.parametrize('family', ['llama', 'qwen3', 'gpt2'])
def test_atman_against_a_plain_loop(family):
    model = tiny_model(family)
    tokens = token_ids(family, 5, 1, seed=4)
    p = 0.7
    explanation = explain(model, tokens, method='atman', p=p, score='log_softmax', perturbation_batch=2)
    target = int(explanation.target[0])
    current = [torch.ones(1, 5, dtype=torch.float64)]
    AttentionInterface.register('atman_reference_test', _reference_attention(lambda: current[0]))
    model.config._attn_implementation = 'atman_reference_test'
    try:
        with torch.no_grad():
            reference = model(tokens).logits[0, -1].log_softmax(-1)[target]
            expected = []
            for token in range(5):
                current[0] = torch.ones(1, 5, dtype=torch.float64)
                current[0][0, token] = 1 - p
                expected.append(reference - model(tokens).logits[0, -1].log_softmax(-1)[target])
    finally:
        model.config._attn_implementation = 'eager'
    assert torch.allclose(explanation.relevance[0], torch.stack(expected), rtol=1e-5, atol=1e-9)


def test_atman_behaviour(llama, ids):
    assert bool((explain(llama, ids, method='atman', p=0.0).relevance == 0).all())
    early = explain(llama, ids, method='atman', position=2)
    assert bool((early.relevance[0, 3:] == 0).all()) and bool((early.relevance[0, :3] != 0).any())
    logit = explain(llama, ids, method='atman', score='logit')
    assert not torch.allclose(logit.relevance, explain(llama, ids, method='atman').relevance)


def test_kernelshap_close_to_exact_shapley_values():
    model = tiny_model('llama')
    tokens = token_ids('llama', 4, 1, seed=7)
    task = Task(model, tokens)
    task.resolve_plain()
    n = 4
    coalitions = list(itertools.product([0, 1], repeat=n))
    with torch.no_grad():
        batch = torch.stack([task.embeddings[0] * torch.tensor(c, dtype=torch.float64)[:, None] for c in coalitions])
        rows = torch.zeros(len(coalitions), dtype=torch.long)
        values = dict(zip(coalitions, task.select(task.forward(batch, rows), rows).tolist()))
    exact = torch.zeros(n, dtype=torch.float64)
    for i in range(n):
        for coalition in coalitions:
            if coalition[i]:
                continue
            size = sum(coalition)
            weight = math.factorial(size) * math.factorial(n - size - 1) / math.factorial(n)
            with_i = tuple(1 if j == i else c for j, c in enumerate(coalition))
            exact[i] += weight * (values[with_i] - values[coalition])
    explanation = explain(model, tokens, method='kernelshap', samples=400, perturbation_batch=100)
    assert torch.allclose(explanation.relevance[0], exact, atol=0.05 * float(exact.abs().max()))


def test_kernelshap_of_one_token_is_its_exact_shapley_value():
    """With one feature the Shapley value is exactly f(x) - f(baseline) (captum's sampling has no coalition to
    draw and failed with NaN probabilities)."""
    model = tiny_model('llama')
    tokens = token_ids('llama', 1, 2, seed=7)
    explanation = explain(model, tokens, method='kernelshap')
    task = Task(model, tokens)
    logit = task.resolve_plain()
    with torch.no_grad():
        absent = task.select(task.forward(torch.zeros_like(task.embeddings)))
    assert explanation.relevance.shape == (2, 1)
    torch.testing.assert_close(explanation.relevance[:, 0], logit - absent, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(explanation.logit, logit)


def test_kernelshap_plays_only_the_tokens_that_can_change_the_value():
    """Tokens after the explained position of a causal model cannot change its logit: their exact Shapley value is 0,
    and KernelSHAP samples coalitions of the others only, as for the input cut after the position (captum sampled
    them all: noise on the later tokens, other values on the earlier ones)."""
    model = tiny_model('llama')
    tokens = token_ids('llama', 8, 1, seed=7)
    early = explain(model, tokens, method='kernelshap', position=3, samples=64)
    cut = explain(model, tokens[:, :4], method='kernelshap', samples=64)
    assert bool((early.relevance[0, 4:] == 0).all())
    torch.testing.assert_close(early.relevance[:, :4], cut.relevance, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize('method', ['gradcam', 'grad_attention_rollout'])
def test_attention_methods_with_checkpointing_on_sdpa(method):
    """The backward pass runs while eager attention is still on, so that the recomputed blocks compute what the
    forward pass did (with SDPA restored before it, torch refused the recomputation's different tensors)."""
    model = tiny_model('llama', attn_implementation='sdpa')
    tokens = token_ids('llama', 6, 2, seed=3)
    plain = explain(model, tokens, method=method)
    checkpointed = explain(model, tokens, method=method, checkpointing=True)
    assert torch.equal(checkpointed.relevance, plain.relevance)
    assert model.config._attn_implementation == 'sdpa'


def test_random_is_seeded(llama, ids):
    a = explain(llama, ids, method='random', seed=1).relevance
    assert torch.equal(a, explain(llama, ids, method='random', seed=1).relevance)
    assert not torch.equal(a, explain(llama, ids, method='random', seed=2).relevance)


def test_lrp_refuses_parameters(llama, ids):
    with pytest.raises(TypeError):
        explain(llama, ids, method='attnlrp', p=0.5)


def test_random_is_independent_between_inputs():
    """Each input gets its own draw (seeded by its content): over texts explained one at a time, as a dataset is,
    the most relevant position is spread over all positions instead of being the same for every text of one
    length; padding in a batch does not change a text's values."""
    llama = tiny_model('llama', dtype=torch.float32, attn_implementation='sdpa')  # padding: no fully masked rows
    generator = torch.Generator().manual_seed(0)
    rows = torch.randint(3, llama.config.vocab_size, (60, 6), generator=generator)
    tops = [int(explain(llama, row[None], method='random').relevance[0].argmax()) for row in rows]
    counts = torch.bincount(torch.tensor(tops), minlength=6)
    assert int(counts.max()) <= 25 and int((counts > 0).sum()) == 6, counts
    alone = explain(llama, rows[:1, 2:], method='random').relevance[0]
    padded = torch.cat([torch.zeros(1, 2, dtype=rows.dtype), rows[:1, 2:]], 1)
    batch = torch.cat([padded, rows[1:2]])
    mask = torch.ones_like(batch)
    mask[0, :2] = 0
    together = explain(llama, batch, attention_mask=mask, method='random').relevance
    assert torch.equal(together[0, 2:], alone)


@pytest.mark.parametrize('samples', [1, 2, 5])
def test_kernelshap_refuses_too_few_samples_for_its_features(llama, samples):
    """With no more coalitions than features the regression is underdetermined (samples=1 gave all zeros, 2 one
    value on every token): refused, naming the minimum; one more than the features is accepted."""
    ids = token_ids('llama', 5)
    with pytest.raises(ValueError, match='samples > 5'):
        explain(llama, ids, method='kernelshap', samples=samples)
    assert torch.isfinite(explain(llama, ids, method='kernelshap', samples=6).relevance).all()


# ------------------------------------------------------------------------- a model that scales its input in place
@pytest.fixture(scope='module')
def ctrl():
    """A tiny CTRL: its forward scales ``inputs_embeds`` in place (``inputs_embeds *= sqrt(d_model)``)."""
    config = transformers.CTRLConfig(
        vocab_size=100, n_embd=32, dff=64, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0
    )
    config._attn_implementation = 'eager'  # its own output_attentions for the references
    torch.manual_seed(0)
    return transformers.CTRLLMHeadModel(config).double().eval()


def _ctrl_plain(model, tokens, target):
    """The logit of ``target`` at the last position, its gradient at the word embeddings and at every attention map,
    computed by the model alone (on a copy of the embeddings, which it scales in place)."""
    embeddings = model.get_input_embeddings()(tokens).detach().requires_grad_(True)
    output = model(inputs_embeds=embeddings.clone(), output_attentions=True)
    logit = output.logits[0, -1, target]
    grads = torch.autograd.grad(logit, [embeddings, *output.attentions])
    return (
        embeddings.detach(),
        logit.detach(),
        grads[0],
        [attention.detach()[0] for attention in output.attentions],
        [grad[0] for grad in grads[1:]],
    )


@pytest.mark.parametrize(
    'method',
    [
        'input_x_gradient',
        'integrated_gradients',
        'smoothgrad',
        'kernelshap',
        'attention_rollout',
        'grad_attention_rollout',
        'gradcam',
    ],
)
def test_methods_on_a_model_that_scales_its_input_in_place(ctrl, method):
    """Each method against its value computed from the model's own outputs (CTRL scales ``inputs_embeds`` in
    place: the gradient methods died on their leaf, and the methods without gradients scaled the task's input
    itself, so that KernelSHAP's coalitions saw it scaled twice)."""
    tokens = token_ids('llama', 5, 1, seed=3)
    target = 11
    embeddings, logit, grad, attentions, attention_grads = _ctrl_plain(ctrl, tokens, target)
    params = {
        'integrated_gradients': dict(steps=3),
        'smoothgrad': dict(sigma=0.0, samples=2),
        'kernelshap': dict(samples=2),
    }.get(method, {})
    if method == 'kernelshap':  # one token: its Shapley value is exactly f(x) - f(0)
        tokens, embeddings = tokens[:, :1], embeddings[:, :1]
        with torch.no_grad():
            logit = ctrl(inputs_embeds=embeddings.clone()).logits[0, -1, target]
            expected = logit - ctrl(inputs_embeds=torch.zeros_like(embeddings)).logits[0, -1, target]
        expected = expected[None]
    elif method in ('input_x_gradient', 'smoothgrad'):  # SmoothGrad without noise: input x gradient
        expected = (embeddings * grad).sum(-1)[0]
    elif method == 'integrated_gradients':  # x * 1/m sum_k grad f(k/m x)
        total = torch.zeros_like(embeddings)
        for k in range(1, 4):
            point = (k / 3 * embeddings).requires_grad_(True)
            total += torch.autograd.grad(ctrl(inputs_embeds=point.clone()).logits[0, -1, target], point)[0] / 3
        expected = (embeddings * total).sum(-1)[0]
    else:
        eye = torch.eye(tokens.shape[1], dtype=torch.float64)
        product = eye
        for attention, attention_grad in zip(attentions, attention_grads):
            if method == 'attention_rollout':
                product = (0.5 * (eye + attention.mean(0))) @ product
            else:
                product = product + (attention_grad * attention).clamp(min=0).mean(0) @ product
        expected = product[-1]
        if method == 'gradcam':
            row, grad_row = attentions[-1][:, -1], attention_grads[-1][:, -1]
            expected = (grad_row.mean(-1, keepdim=True) * row).mean(0).clamp(min=0)
            assert float(expected.abs().sum()) > 0  # a test that can fail
    explanation = explain(ctrl, tokens, target=target, method=method, **params)
    torch.testing.assert_close(explanation.logit[0], logit, rtol=1e-12, atol=0)
    # Integrated Gradients: zennit interpolates the path points in another order of operations
    tolerance = 1e-8 if method == 'integrated_gradients' else 1e-10
    torch.testing.assert_close(explanation.relevance[0], expected, rtol=tolerance, atol=1e-12)


def test_runs_leave_the_input_as_it_was(ctrl):
    """Runs without gradients on the task's own input leave it unchanged, so that every run sees the same input."""
    task = Task(ctrl, token_ids('llama', 5, 1, seed=3))
    before = task.inputs.clone()
    with torch.no_grad():
        first = task.forward(task.inputs)
        second = task.forward(task.inputs)
    assert torch.equal(task.inputs, before) and torch.equal(first, second)


@pytest.mark.parametrize(
    'composite, method',
    [(CPLRPEpsilon(), 'cplrp'), (AttnLRPEpsilon(), 'attnlrp'), (AttnLRPEpsilon(product_rule=ConstantGates()), 'cplrp')],
)
def test_without_a_method_the_composite_decides(llama, ids, tokenizer, composite, method):
    """``explain(model, ids, composite=CPLRPEpsilon())`` (zennit's idiom: the composite says the rules) runs CP-LRP
    and labels it so, with the relevance of ``method='cplrp'``; so do the workflows that take a composite."""
    given = explain(llama, ids, composite=composite)
    assert given.method == method
    assert torch.equal(given.relevance, explain(llama, ids, method=method, composite=composite).relevance)
    generated = explain_generation(llama, tokenizer, 'the bear', max_new_tokens=2, composite=composite)
    assert generated.method == method
    sources = explain_sources(llama, tokenizer, 'A bear. A cat.', 'which?', ' a bear', composite=composite)
    assert sources.method == method
