"""Context attribution's metrics and ContextCite (:py:mod:`zennit_attn.workflows.evaluation.source_ablation`,
:py:mod:`zennit_attn.workflows.evaluation.context_cite`) on toys whose log-probability is linear in the kept sources,
and one real ablation of a tiny model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zennit_attn.workflows.evaluation.context_cite import context_cite
from zennit_attn.workflows.evaluation.prior_surrogate import prior_surrogate
from zennit_attn.workflows.evaluation.source_ablation import SourceAblation, ablation_masks, lds, spearman, top_k_drop
from zennit_attn.workflows.sources import SourceCiter, explain_sources

WEIGHTS = np.array([2.0, -1.0, 0.0, 0.5, 3.0])


class Linear:
    """A toy response: two tokens whose log-probabilities sum to ``-10 + masks @ weights``."""

    def __init__(self, weights):
        self.weights = np.asarray(weights, dtype=np.float64)
        self.calls = 0

    def __call__(self, masks, progress=False):
        self.calls += len(masks)
        total = -10.0 + np.asarray(masks, dtype=np.float64) @ self.weights
        return np.stack([total / 2, total / 2], axis=-1)


def test_top_k_drop_by_hand():
    toy = Linear([1.0, 4.0, -2.0])
    drops = top_k_drop(toy, [0.3, 0.1, 0.2], 3, ks=(1, 2, 3))
    # order 0, 2, 1: full -7; without 0: -8; without 0 and 2: -6; without all: -10
    assert drops == pytest.approx({1: 1.0, 2: -1.0, 3: 3.0})
    assert toy.calls == 4
    assert top_k_drop(toy, [0.3, 0.1, 0.2], 3, ks=(1,), full=-7.0) == pytest.approx({1: 1.0})
    with pytest.raises(ValueError, match='between 1'):
        top_k_drop(toy, [0.3, 0.1, 0.2], 3, ks=(4,))
    with pytest.raises(ValueError, match='one value per source'):
        top_k_drop(toy, [0.3, 0.1], 3)


def test_lds_of_a_perfect_linear_scorer_is_one():
    masks = ablation_masks(40, 5, seed=7)
    toy = Linear(WEIGHTS)
    assert lds(WEIGHTS, masks, toy(masks)) == pytest.approx(1.0)
    assert lds(-WEIGHTS, masks, toy(masks).sum(-1)) == pytest.approx(-1.0)
    assert spearman([1, 2, 2, 3], [1, 2, 2, 3]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)


def test_masks_as_context_cite_draws_them():
    masks = ablation_masks(3, 4, seed=5)
    expected = [np.random.RandomState(5 + i).choice([False, True], size=4, p=[0.5, 0.5]) for i in range(3)]
    assert masks.dtype == torch.bool
    assert (masks.numpy() == np.stack(expected)).all()


def test_context_cite_recovers_linear_weights():
    toy = Linear(WEIGHTS)
    result = context_cite(toy, 5, ablations=64, target='log_probability', progress=False)
    assert result.forward_passes == 64 == toy.calls
    assert result.scores.numpy() == pytest.approx(WEIGHTS, abs=0.05)
    assert result.bias == pytest.approx(-10.0, abs=0.1)


def test_source_ablation_equals_the_prompt_without_the_sources(llama, tokenizer):
    result = explain_sources(
        llama,
        tokenizer,
        'A bear. The ice bear lives. A penguin.',
        'where?',
        ' in the Arctic.',
        objective='log_probability',
    )
    ablation = SourceAblation(llama, result.prompt, result.response_ids)
    keep = [True, False, True]
    ids = torch.tensor([result.prompt.ids(keep) + result.response_ids])
    count = len(result.response_ids)
    log_p = llama(ids).logits[0, -count - 1 : -1].log_softmax(-1)
    expected = log_p.gather(-1, torch.tensor(result.response_ids)[:, None])[:, 0].detach()
    torch.testing.assert_close(ablation(np.array([keep])), expected[None].double(), rtol=0, atol=1e-12)
    torch.testing.assert_close(ablation(torch.tensor([keep])), ablation([keep]), rtol=0, atol=0)
    full = float(ablation(torch.ones(1, 3, dtype=torch.bool)).sum())
    assert full == pytest.approx(result.value, abs=1e-10)
    assert ablation.forward_passes == 4


def test_sources_and_their_metrics_are_one_array_type(llama, tokenizer):
    """The sources' scores, ContextCite's surrogate, the prior surrogate and the ablations are torch tensors on the
    CPU (float64; masks boolean), and the metrics take them as they take NumPy arrays and lists, with equal results."""
    result = explain_sources(llama, tokenizer, 'A bear. The ice bear lives. A penguin.', 'where?', ' in the Arctic.')
    ablation = SourceAblation(llama, result.prompt, result.response_ids)
    surrogate = context_cite(ablation, 3, ablations=6, target='log_probability', progress=False)
    prior = prior_surrogate(llama, result, ablations=4)
    tensors = {
        'explanation scores': (result.scores, torch.float64),
        'citer attributions': (
            SourceCiter(llama, tokenizer, 'A bear. A penguin.', 'where?', ' ice').get_attributions(),
            torch.float64,
        ),
        'lasso scores': (surrogate.scores, torch.float64),
        'lasso masks': (surrogate.masks, torch.bool),
        'lasso log-probabilities': (surrogate.log_probabilities, torch.float64),
        'prior scores': (prior.scores, torch.float64),
        'prior relevance': (prior.relevance, torch.float64),
        'prior masks': (prior.masks, torch.bool),
        'prior log-probabilities': (prior.log_probabilities, torch.float64),
    }
    for name, (tensor, dtype) in tensors.items():
        assert type(tensor) is torch.Tensor and tensor.dtype == dtype and tensor.device.type == 'cpu', name
    masks, outputs = surrogate.masks, surrogate.log_probabilities
    score = lds(prior.scores, masks, outputs)
    assert (
        score
        == lds(prior.scores.numpy(), masks.numpy(), outputs.numpy())
        == lds(prior.scores.tolist(), masks.tolist(), outputs.tolist())
    )
    drops = top_k_drop(ablation, prior.scores, 3, ks=(1, 2))
    assert drops == top_k_drop(ablation, prior.scores.numpy(), 3, ks=(1, 2))
