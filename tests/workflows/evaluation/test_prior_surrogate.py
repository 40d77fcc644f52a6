"""The surrogate with the relevance as prior (:py:mod:`zennit_attn.workflows.evaluation.prior_surrogate`): exact on
responses linear in the kept sources, the relevance scaled where the ablations cannot move it, and the response's
log-probability read from the explanation equal to a forward pass."""

from __future__ import annotations

import numpy as np
import pytest

from zennit_attn.workflows.evaluation.prior_surrogate import fit_prior_surrogate, prior_surrogate
from zennit_attn.workflows.evaluation.source_ablation import SourceAblation, ablation_masks
from zennit_attn.workflows.sources import explain_sources

RELEVANCE = np.array([1.0, 0.5, -0.25, 2.0, 0.0])
CORRECTIONS = np.array([0.3, -0.2, 0.1, 0.0, 0.4])


def test_least_squares_recovers_scaled_relevance_plus_corrections():
    """Without penalty and with more ablations than unknowns the fit is the linear response it was made of."""
    masks = ablation_masks(24, 5, seed=3)
    weights = 0.5 * RELEVANCE + CORRECTIONS
    outputs = -7.0 + masks.astype(np.float64) @ weights
    scores, bias, _ = fit_prior_surrogate(RELEVANCE, masks, outputs, -7.0 + weights.sum(), ridge=0.0)
    np.testing.assert_allclose(scores, weights, atol=1e-10)
    assert bias == pytest.approx(-7.0, abs=1e-10)


def test_a_response_proportional_to_the_relevance_keeps_it():
    """Where the ablations agree with the relevance up to a scale, the corrections stay 0 for any penalty: the scores
    are the relevance in the log-probability's units."""
    masks = ablation_masks(4, 5, seed=1)
    outputs = -3.0 + 2.5 * masks.astype(np.float64) @ RELEVANCE
    for ridge in (0.1, 1.0, 100.0):
        scores, bias, scale = fit_prior_surrogate(RELEVANCE, masks, outputs, -3.0 + 2.5 * RELEVANCE.sum(), ridge)
        np.testing.assert_allclose(scores, 2.5 * RELEVANCE, atol=1e-10)
        assert (bias, scale) == (pytest.approx(-3.0, abs=1e-10), pytest.approx(2.5, abs=1e-12))


def test_the_penalty_moves_the_scores_from_the_ablations_to_the_relevance():
    masks = ablation_masks(6, 5, seed=2)
    outputs = -5.0 + masks.astype(np.float64) @ (RELEVANCE + CORRECTIONS)
    full = -5.0 + (RELEVANCE + CORRECTIONS).sum()
    distance = []
    for ridge in (1e-3, 1.0, 1e6):
        scores, _, scale = fit_prior_surrogate(RELEVANCE, masks, outputs, full, ridge)
        distance.append(np.abs(scores - scale * RELEVANCE).max())
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
    full = ablation(np.ones((1, 4), dtype=bool)).sum()
    assert (result.masks == masks).all()
    np.testing.assert_allclose(result.log_probabilities, outputs, atol=1e-12)
    assert result.forward_passes == 5 + (objective == 'logit')
    assert result.full == pytest.approx(full, abs=1e-10)
    expected = fit_prior_surrogate(explanation.scores.numpy(), masks, outputs.sum(-1), full, 0.5)
    np.testing.assert_allclose(result.scores, expected[0], atol=1e-9)
    assert (result.bias, result.scale) == (pytest.approx(expected[1], abs=1e-9), pytest.approx(expected[2], abs=1e-9))
