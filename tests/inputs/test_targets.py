"""Contrastive and custom targets (:py:mod:`zennit_attn.inputs.objectives`): ``explain(..., contrast=...)`` and
``explain(..., target=callable)``, for every method, with exact numbers in float64."""

from __future__ import annotations

import pytest
import torch

from tests.models import tiny_model, token_ids
from tests.text_tokenizer import byte_level_tokenizer
from zennit_attn import explain
from zennit_attn.latent import Neuron
from zennit_attn.methods.registry import METHODS

TARGET, CONTRAST = 5, 7
#: fast settings of the methods that take many passes
FAST = {'integrated_gradients': {'steps': 4}, 'smoothgrad': {'samples': 4}, 'kernelshap': {'samples': 40}}
#: methods whose relevance is linear in the initial relevance (one backward pass of a linear rule)
LINEAR = ('attnlrp', 'cplrp', 'input_x_gradient')


@pytest.fixture(scope='module')
def gpt2():
    return tiny_model('gpt2')


@pytest.fixture(scope='module')
def tokenizer():
    return byte_level_tokenizer()


def relative(actual, expected) -> float:
    return float((actual - expected).abs().max()) / float(expected.abs().max())


@pytest.mark.parametrize('method', LINEAR)
def test_contrast_is_the_difference_of_two_explanations(gpt2, method):
    """LRP and Input x Gradient are linear in the initial relevance: the contrast's relevance is the target's minus
    the contrast's, in float64 to rounding (GPT-2: every operation in float64)."""
    ids = token_ids('gpt2', 8, batch=2)
    target = explain(gpt2, ids, target=TARGET, method=method)
    contrast = explain(gpt2, ids, target=CONTRAST, method=method)
    both = explain(gpt2, ids, target=TARGET, contrast=CONTRAST, method=method)
    assert relative(both.relevance, target.relevance - contrast.relevance) < 1e-12
    assert relative(both.embedding_relevance, target.embedding_relevance - contrast.embedding_relevance) < 1e-12
    assert torch.equal(both.logit, target.logit - contrast.logit)
    logits = gpt2(ids).logits[:, -1].detach()  # the model's own forward (LRP's runs canonized: equal to rounding)
    assert torch.allclose(both.logit, logits[:, TARGET] - logits[:, CONTRAST], rtol=1e-12, atol=0)
    assert torch.equal(both.target, torch.tensor([TARGET] * 2))
    assert torch.equal(both.contrast, torch.tensor([CONTRAST] * 2))


@pytest.mark.parametrize('method', LINEAR)
def test_contrast_on_llama(llama, method):
    """The same on the tiny Llama, whose RMSNorm transformers computes in float32 (so ~1e-7, not 1e-15, for the
    gradient path)."""
    ids = token_ids('llama', 8, batch=2)
    target = explain(llama, ids, target=TARGET, method=method)
    contrast = explain(llama, ids, target=CONTRAST, method=method)
    both = explain(llama, ids, target=TARGET, contrast=CONTRAST, method=method)
    assert relative(both.relevance, target.relevance - contrast.relevance) < 1e-5
    assert torch.equal(both.logit, target.logit - contrast.logit)


@pytest.mark.parametrize('method', list(METHODS))
def test_every_method_explains_the_logit_difference(gpt2, method):
    ids = token_ids('gpt2', 6, batch=2)
    both = explain(gpt2, ids, target=[TARGET, 9], contrast=[CONTRAST, 11], method=method, **FAST.get(method, {}))
    logits = gpt2(ids).logits[:, -1].detach()
    expected = torch.stack([logits[0, TARGET] - logits[0, CONTRAST], logits[1, 9] - logits[1, 11]])
    assert torch.allclose(both.logit, expected, rtol=1e-12, atol=0)
    assert torch.equal(both.contrast, torch.tensor([CONTRAST, 11]))
    if method in ('integrated_gradients', 'smoothgrad', 'kernelshap', 'atman', 'gradcam'):
        # gradient and perturbation methods of a difference: still the difference where they are linear in the value
        single = [
            explain(gpt2, ids, target=[t, c], method=method, **FAST.get(method, {}))
            for t, c in ((TARGET, 9), (CONTRAST, 11))
        ]
        if method in ('integrated_gradients', 'smoothgrad', 'atman'):
            assert relative(both.relevance, single[0].relevance - single[1].relevance) < 1e-9


def test_runner_up_and_text_tokens(gpt2, tokenizer):
    ids = token_ids('gpt2', 6, batch=2)
    logits = gpt2(ids).logits[:, -1].detach()
    top2 = logits.topk(2).indices
    explanation = explain(gpt2, ids, contrast='runner-up')
    assert torch.equal(explanation.target, top2[:, 0]) and torch.equal(explanation.contrast, top2[:, 1])
    # against a fixed target: the best other token
    explanation = explain(gpt2, ids, target=top2[0, 1].item(), contrast='runner-up')
    assert torch.equal(explanation.contrast[:1], top2[:1, 0])
    # token texts with the tokenizer
    bear, lives = tokenizer.encode(' bear')[0], tokenizer.encode(' lives')[0]
    text = explain(gpt2, ids, target=' bear', contrast=' lives', tokenizer=tokenizer)
    assert torch.allclose(text.logit, logits[:, bear] - logits[:, lives], rtol=1e-12, atol=0)
    # (position, token) pairs with one contrast per pair: the sum of the differences
    pairs = explain(gpt2, ids[:1], target=[(3, TARGET), (5, 9)], contrast=[CONTRAST, 11])
    full = gpt2(ids[:1]).logits[0].detach()
    expected = torch.stack([full[3, TARGET] - full[3, CONTRAST], full[5, 9] - full[5, 11]])[None]
    assert torch.allclose(pairs.logit, expected, rtol=0, atol=1e-15)


def test_callable_target(gpt2):
    ids = token_ids('gpt2', 6, batch=2)
    contrast = explain(gpt2, ids, target=TARGET, contrast=CONTRAST)
    function = explain(gpt2, ids, target=lambda logits: logits[:, TARGET] - logits[:, CONTRAST])
    assert relative(function.relevance, contrast.relevance) < 1e-13
    assert torch.equal(function.logit, contrast.logit)
    logits = gpt2(ids).logits[:, -1].detach()
    assert torch.equal(function.target, logits.argmax(-1))  # the prediction, for reference
    # a log-probability at temperature 2: the explained value is torch's log_softmax
    for method in ('attnlrp', 'input_x_gradient', 'kernelshap'):
        explanation = explain(
            gpt2,
            ids,
            target=lambda scores: (scores / 2).log_softmax(-1)[:, TARGET],
            method=method,
            **FAST.get(method, {}),
        )
        assert torch.allclose(explanation.logit, (logits / 2).log_softmax(-1)[:, TARGET], rtol=1e-14, atol=0)

    # LRP of a log-probability: the logits receive y_i d f / d y_i, which sums to (y_t - sum_i p_i y_i) / T
    def log_probability(scores):
        return (scores / 2).log_softmax(-1)[:, TARGET]

    lrp = explain(gpt2, ids, target=log_probability, method='input_x_gradient')
    x = gpt2.get_input_embeddings()(ids).detach().requires_grad_(True)
    value = log_probability(gpt2(inputs_embeds=x).logits[:, -1])
    (gradient,) = torch.autograd.grad(value.sum(), x)
    assert relative(lrp.embedding_relevance, x.detach() * gradient) < 1e-13


def test_log_odds_objective_is_the_function_by_hand(gpt2):
    """objective='log_odds' explains log(p / (1 - p)) of the target, with the relevance of the same function given as a
    target function (two implementations: a scatter of -inf and log p - log1p(-p))."""
    ids = token_ids('gpt2', 5)

    def log_odds(scores):
        log_p = scores.log_softmax(-1)[:, TARGET]
        return log_p - torch.log1p(-log_p.exp())

    for method in ('attnlrp', 'input_x_gradient'):
        named = explain(gpt2, ids, target=TARGET, objective='log_odds', method=method)
        by_hand = explain(gpt2, ids, target=log_odds, method=method)
        assert torch.allclose(named.logit, by_hand.logit, rtol=1e-12, atol=0)
        assert relative(named.relevance, by_hand.relevance) < 1e-10
    with pytest.raises(ValueError, match="objective='log_odds'.*contrast"):
        explain(gpt2, ids, target=TARGET, contrast=3, objective='log_odds')
    with pytest.raises(ValueError, match="'logit', 'log_probability', 'log_odds'"):
        explain(gpt2, ids, objective='odds')


def test_atman_with_a_target_function_needs_logits(gpt2):
    ids = token_ids('gpt2', 5)
    with pytest.raises(ValueError, match="atman with a target function.*score='logit'"):
        explain(gpt2, ids, target=lambda scores: scores[:, 1], method='atman')
    explanation = explain(gpt2, ids, target=lambda scores: scores[:, 1] - scores[:, 2], method='atman', score='logit')
    reference = explain(gpt2, ids, target=1, contrast=2, method='atman')  # log-softmax differences: the same
    assert relative(explanation.relevance, reference.relevance) < 1e-10


def test_bad_contrasts_and_functions(gpt2, tokenizer):
    ids = token_ids('gpt2', 5)
    with pytest.raises(
        ValueError,
        match=r"contrast ' bears' is 2 tokens: ' bear' \(id:\d+\), 's' \(id:\d+\); "
        'give exactly one token',
    ):
        explain(gpt2, ids, target=TARGET, contrast=' bears', tokenizer=tokenizer)
    # a text outside the vocabulary encodes to the unknown token, whose logit is every unknown text's
    with pytest.raises(ValueError, match=r"target '~' is not in the vocabulary of the tokenizer: .* '<unk>' \(id:3\)"):
        explain(gpt2, ids, target='~', tokenizer=tokenizer)
    assert int(explain(gpt2, ids, target='<unk>', tokenizer=tokenizer).target) == tokenizer.unk_token_id
    with pytest.raises(ValueError, match=r"contrast ' bear' is text: pass tokenizer="):
        explain(gpt2, ids, target=TARGET, contrast=' bear')
    with pytest.raises(ValueError, match=r'the contrast token is the target itself in row\(s\) \[0\]'):
        explain(gpt2, ids, target=TARGET, contrast=TARGET)
    with pytest.raises(ValueError, match='a Neuron target explains an activation'):
        explain(gpt2, ids, target=Neuron('mlp', 0, 1), contrast=CONTRAST)
    with pytest.raises(ValueError, match='contrast is out of range|contrast .* is out of range'):
        explain(gpt2, ids, target=TARGET, contrast=1000)
    with pytest.raises(ValueError, match=r'contrast needs one token for all rows or one per entry \(1 rows\)'):
        explain(gpt2, ids, target=TARGET, contrast=[1, 2])
    with pytest.raises(ValueError, match='with a target function the function itself is explained'):
        explain(gpt2, ids, target=lambda scores: scores[:, 0], contrast=CONTRAST)
    with pytest.raises(ValueError, match=r'must return one value per row, shape \(1,\), got shape \(1, 100\)'):
        explain(gpt2, ids, target=lambda scores: scores)
    with pytest.raises(ValueError, match=r'returned non-finite values \(NaN or infinite\) in row\(s\) \[0\]'):
        explain(gpt2, ids, target=lambda scores: scores[:, 0] * float('inf'))
    with pytest.raises(ValueError, match='returned a value without gradient'):
        explain(gpt2, ids, target=lambda scores: scores[:, 0].detach(), method='input_x_gradient')
    with pytest.raises(TypeError, match='must return a tensor of one value per row, got float'):
        explain(gpt2, ids, target=lambda scores: 1.0)
