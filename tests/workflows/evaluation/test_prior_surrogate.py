"""The surrogate with the relevance as prior (:py:mod:`zennit_attn.workflows.evaluation.prior_surrogate`): exact on
responses linear in the kept sources, the relevance scaled where the ablations cannot move it, and the response's
log-probability read from the explanation equal to a forward pass."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zennit_attn.workflows.evaluation.prior_surrogate import fit_prior_surrogate, prior_surrogate
from zennit_attn.workflows.evaluation.source_ablation import SourceAblation, ablation_masks
from zennit_attn.workflows.sources import explain_sources

RELEVANCE = torch.tensor([1.0, 0.5, -0.25, 2.0, 0.0], dtype=torch.float64)
CORRECTIONS = torch.tensor([0.3, -0.2, 0.1, 0.0, 0.4], dtype=torch.float64)


def test_least_squares_recovers_scaled_relevance_plus_corrections():
    """Without penalty and with more ablations than unknowns the fit is the linear response it was made of."""
    masks = ablation_masks(24, 5, seed=3)
    weights = 0.5 * RELEVANCE + CORRECTIONS
    outputs = -7.0 + masks.double() @ weights
    scores, bias, _ = fit_prior_surrogate(RELEVANCE, masks, outputs, -7.0 + weights.sum(), ridge=0.0)
    torch.testing.assert_close(scores, weights, rtol=0, atol=1e-10)
    assert bias == pytest.approx(-7.0, abs=1e-10)


@pytest.mark.parametrize(('count', 'ridge'), [(3, 0.0), (3, 0.5), (12, 0.0)])
def test_the_fit_is_numpys_least_squares(count, ridge):
    """Two implementations of one fit: the normal equations solved by NumPy's ``lstsq`` (the solution of smallest norm
    where they are singular: 3 ablations and no penalty leave 7 unknowns for 4 equations) give the same scores."""
    masks = ablation_masks(count, 5, seed=4)
    outputs = -2.0 + masks.double() @ (RELEVANCE - CORRECTIONS) + 0.1 * torch.arange(count, dtype=torch.float64)
    full = -1.5
    scores, bias, scale = fit_prior_surrogate(RELEVANCE, masks, outputs, full, ridge)
    kept = np.vstack([np.ones(5), masks.numpy()]).astype(np.float64)
    values = np.concatenate([[full], outputs.numpy()])
    design = np.hstack([(kept @ RELEVANCE.numpy())[:, None], np.ones((len(kept), 1)), kept])
    penalty = np.diag([0.0, 0.0] + [ridge] * 5)
    solution = np.linalg.lstsq(design.T @ design + penalty, design.T @ values, rcond=None)[0]
    np.testing.assert_allclose(scores.numpy(), solution[0] * RELEVANCE.numpy() + solution[2:], atol=1e-9)
    assert (bias, scale) == (pytest.approx(solution[1], abs=1e-9), pytest.approx(solution[0], abs=1e-9))


def test_a_response_proportional_to_the_relevance_keeps_it():
    """Where the ablations agree with the relevance up to a scale, the corrections stay 0 for any penalty: the scores
    are the relevance in the log-probability's units."""
    masks = ablation_masks(4, 5, seed=1)
    outputs = -3.0 + 2.5 * masks.double() @ RELEVANCE
    for ridge in (0.1, 1.0, 100.0):
        scores, bias, scale = fit_prior_surrogate(RELEVANCE, masks, outputs, -3.0 + 2.5 * RELEVANCE.sum(), ridge)
        torch.testing.assert_close(scores, 2.5 * RELEVANCE, rtol=0, atol=1e-10)
        assert (bias, scale) == (pytest.approx(-3.0, abs=1e-10), pytest.approx(2.5, abs=1e-12))


def test_the_penalty_moves_the_scores_from_the_ablations_to_the_relevance():
    masks = ablation_masks(6, 5, seed=2)
    outputs = -5.0 + masks.double() @ (RELEVANCE + CORRECTIONS)
    full = -5.0 + (RELEVANCE + CORRECTIONS).sum()
    distance = []
    for ridge in (1e-3, 1.0, 1e6):
        scores, _, scale = fit_prior_surrogate(RELEVANCE, masks, outputs, full, ridge)
        distance.append(float((scores - scale * RELEVANCE).abs().max()))
    assert distance[0] > distance[1] > distance[2]
    assert distance[2] < 1e-5
    with pytest.raises(ValueError, match='ridge'):
        fit_prior_surrogate(RELEVANCE, masks, outputs, full, ridge=-1.0)
    with pytest.raises(ValueError, match=r'masks must be \[ablations, 5\]'):
        fit_prior_surrogate(RELEVANCE, masks[:, :4], outputs, full)


@pytest.mark.parametrize('objective', ['log_odds', 'log_probability', 'logit'])
def test_prior_surrogate_of_an_explanation(llama, tokenizer, objective):
    """On a tiny model: the ablations are those of SourceAblation with ContextCite's seeds, the full context's
    log-probability comes from the explanation (log-odds, log-probability) or one more forward pass (logits), and the
    scores are the fit of those numbers."""
    context, query, response = 'A bear. The ice bear lives. A penguin. It swims.', 'where?', ' in the Arctic.'
    explanation = explain_sources(llama, tokenizer, context, query, response, objective=objective)
    result = prior_surrogate(llama, explanation, ablations=5, ridge=0.5, seed=11)
    ablation = SourceAblation(llama, explanation.prompt, explanation.response_ids)
    masks = ablation_masks(5, 4, seed=11)
    outputs = ablation(masks)
    full = float(ablation(torch.ones(1, 4, dtype=torch.bool)).sum())
    assert torch.equal(result.masks, masks)
    torch.testing.assert_close(result.log_probabilities, outputs, rtol=0, atol=1e-12)
    assert result.forward_passes == 5 + (objective == 'logit')
    assert result.full == pytest.approx(full, abs=1e-10)
    expected = fit_prior_surrogate(explanation.scores, masks, outputs.sum(-1), full, 0.5)
    torch.testing.assert_close(result.scores, expected[0], rtol=0, atol=1e-9)
    assert (result.bias, result.scale) == (pytest.approx(expected[1], abs=1e-9), pytest.approx(expected[2], abs=1e-9))
