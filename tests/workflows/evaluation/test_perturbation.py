"""Perturbation curves: the bookkeeping, and on a model whose exact attribution is known the metric ranks the
exact attribution above random and random near zero."""

import math

import pytest
import torch

from zennit_attn.workflows.evaluation import (
    Sample,
    batched_curves,
    evaluate,
    mean_sem,
    perturbation_curves,
    perturbed_inputs,
    step_counts,
)


def test_step_counts_cover_all_features():
    assert step_counts(8, 4) == [0, 2, 4, 6, 8]
    assert step_counts(3, 16) == [0, 1, 2, 3]
    assert step_counts(10, 3)[-1] == 10
    assert step_counts(0, 4) == [0, 0]  # no feature: one step
    for steps in (0, -5, 2.5, True):  # ran as one step before: a flat curve and a score of 0
        with pytest.raises(ValueError, match='steps must be a positive integer'):
            step_counts(8, steps)


@pytest.mark.parametrize('mode', ['flipping', 'insertion'])
def test_perturbed_inputs_order_and_padding(mode):
    inputs = torch.arange(1.0, 5.0)[:, None].expand(4, 2)  # features 1..4, two channels each
    relevance = torch.tensor([0.1, 3.0, -1.0, 2.0])
    valid = torch.tensor([1, 1, 1, 0], dtype=torch.bool)  # the last feature is padding
    batch, fractions = perturbed_inputs(inputs, relevance, steps=3, mode=mode, baseline=0.0, valid=valid)
    assert batch.shape == (8, 4, 2) and fractions.tolist() == [0, 1 / 3, 2 / 3, 1]
    kept = (batch[..., 0] != 0).int().tolist()
    if mode == 'flipping':  # MoRF removes 1 (rel 3), then 0 (0.1), then 2; LeRF the reverse
        assert kept[:4] == [[1, 1, 1, 1], [1, 0, 1, 1], [0, 0, 1, 1], [0, 0, 0, 1]]
        assert kept[4:] == [[1, 1, 1, 1], [1, 1, 0, 1], [0, 1, 0, 1], [0, 0, 0, 1]]
    else:  # insertion starts from the baseline (padding untouched) and inserts in the same orders
        assert kept[:4] == [[0, 0, 0, 1], [0, 1, 0, 1], [1, 1, 0, 1], [1, 1, 1, 1]]
        assert kept[4:] == [[0, 0, 0, 1], [0, 0, 1, 1], [1, 0, 1, 1], [1, 1, 1, 1]]


def test_batches_give_the_same_curves():
    weights = torch.randn(6, generator=torch.Generator().manual_seed(0)).double()
    inputs = torch.randn(6, 3, generator=torch.Generator().manual_seed(1)).double()

    def forward(batch):
        return (batch.sum(-1) * weights).sum(-1)

    relevance = inputs.sum(-1) * weights
    whole = perturbation_curves(forward, inputs, relevance, steps=3)
    chunked = perturbation_curves(forward, inputs, relevance, steps=3, batch_size=3)
    assert torch.allclose(whole.morf, chunked.morf) and torch.allclose(whole.lerf, chunked.lerf)
    assert whole.morf[0] == whole.lerf[0] == pytest.approx(float(forward(inputs[None])[0]))


def test_both_modes_share_forward_passes_and_equal_single_modes():
    """Flipping's LeRF inputs are insertion's MoRF inputs (the same most relevant features kept) and vice versa:
    with distinct relevance and counts that split evenly, both modes need 2 * steps forward rows (one per distinct
    input) instead of 4 * (steps + 1), and give the curves of the single-mode calls exactly."""
    forward, inputs, relevance = bag_of_embeddings(3, features=8)
    rows = []

    def counting(batch, owners):
        rows.append(len(batch))
        return forward(batch)

    samples = [Sample(inputs, relevance), Sample(inputs * 2, -relevance)]
    both = batched_curves(counting, samples, steps=4, mode=('flipping', 'insertion'), progress=False)
    assert sum(rows) == 2 * (2 * 4)
    for mode in ('flipping', 'insertion'):
        rows.clear()
        single = batched_curves(counting, samples, steps=4, mode=mode, progress=False)
        assert sum(rows) == 2 * (2 * 4)  # the unperturbed and the fully perturbed input are shared by both orders
        for alone, shared in zip(single, both):
            assert torch.equal(alone.morf, shared[mode].morf) and torch.equal(alone.lerf, shared[mode].lerf)
            assert shared[mode].mode == mode
    flipping, insertion = both[0]['flipping'], both[0]['insertion']
    assert torch.equal(flipping.lerf, insertion.morf.flip(0)) and torch.equal(flipping.morf, insertion.lerf.flip(0))
    with pytest.raises(ValueError, match='mode'):
        batched_curves(counting, samples, mode=('flipping', 'flipping'), progress=False)
    with pytest.raises(ValueError, match='mode'):
        batched_curves(counting, samples, mode=(), progress=False)


def test_ties_across_modes_are_evaluated_not_assumed():
    """Equal relevance breaks ties by feature order in both orders, so flipping's LeRF inputs are not insertion's
    MoRF inputs: the shared call must evaluate them and still equal the single-mode calls."""
    forward, inputs, _ = bag_of_embeddings(4, features=6)
    relevance = torch.zeros(6, dtype=torch.float64)
    both = batched_curves(
        lambda batch, owners: forward(batch),
        [Sample(inputs, relevance)],
        steps=3,
        mode=('flipping', 'insertion'),
        progress=False,
    )[0]
    for mode in ('flipping', 'insertion'):
        alone = perturbation_curves(forward, inputs, relevance, steps=3, mode=mode)
        assert torch.equal(alone.morf, both[mode].morf) and torch.equal(alone.lerf, both[mode].lerf)
    assert not torch.equal(both['flipping'].lerf, both['insertion'].morf.flip(0))


def bag_of_embeddings(seed, features=12, hidden=4):
    """A linear bag-of-embeddings model: its exact attribution is w . x_i per feature."""
    generator = torch.Generator().manual_seed(seed)
    weights = torch.randn(hidden, generator=generator).double()
    inputs = torch.randn(features, hidden, generator=generator).double()
    return (lambda batch: (batch @ weights).sum(-1)), inputs, inputs @ weights


@pytest.mark.parametrize('mode', ['flipping', 'insertion'])
def test_exact_attribution_beats_random_and_random_is_near_zero(mode):
    exact, random_scores = [], []
    for seed in range(40):
        forward, inputs, relevance = bag_of_embeddings(seed)
        exact.append(perturbation_curves(forward, inputs, relevance, steps=12, mode=mode).score)
        noise = torch.randn(relevance.shape, generator=torch.Generator().manual_seed(1000 + seed)).double()
        random_scores.append(perturbation_curves(forward, inputs, noise, steps=12, mode=mode).score)
        # the exact attribution is the optimal order: no other order scores higher on this sample
        assert exact[-1] >= random_scores[-1] - 1e-12
        negated = perturbation_curves(forward, inputs, -relevance, steps=12, mode=mode).score
        assert negated == pytest.approx(-exact[-1])
    exact_mean, _ = mean_sem(exact)
    random_mean, random_sem = mean_sem(random_scores)
    assert exact_mean > 0 and exact_mean > 5 * abs(random_mean)
    assert abs(random_mean) < 3 * random_sem + 0.1 * exact_mean


def test_evaluate_loops_and_mean_sem():
    samples = [bag_of_embeddings(seed) for seed in range(3)]
    results = evaluate(samples, steps=4, progress=False)
    assert len(results) == 3 and all(len(r.morf) == 5 for r in results)
    mean, sem = mean_sem([1.0, 2.0, 3.0, math.nan])
    assert mean == pytest.approx(2.0) and sem == pytest.approx(1 / math.sqrt(3))


def test_bad_input_is_refused():
    forward, inputs, relevance = bag_of_embeddings(0)
    with pytest.raises(ValueError):
        perturbation_curves(forward, inputs, relevance[:-1])
    with pytest.raises(ValueError):
        perturbation_curves(forward, inputs, relevance, mode='deletion')
    with pytest.raises(ValueError):
        perturbation_curves(forward, inputs, relevance * math.nan)


def test_token_curves_of_a_language_model():
    from tests.models import tiny_model, token_ids
    from zennit_attn import explain
    from zennit_attn.workflows.evaluation import token_curves

    model = tiny_model('llama')
    tokens = token_ids('llama', 8, 1, seed=2)
    explanation = explain(model, tokens, method='input_x_gradient')
    curves = token_curves(model, explanation, steps=4)
    embeddings = model.get_input_embeddings()(tokens)[0].detach()
    order = torch.argsort(-explanation.relevance[0], stable=True)
    target = int(explanation.target[0])
    with torch.no_grad():
        for k, count in enumerate([0, 2, 4, 6, 8]):
            flipped = embeddings.clone()
            flipped[order[:count]] = 0
            expected = model(inputs_embeds=flipped[None]).logits[0, -1, target]
            assert float(curves.morf[k]) == pytest.approx(float(expected), abs=1e-10)
    assert float(curves.morf[0]) == pytest.approx(float(explanation.logit[0]))
    # an earlier explained position goes through Task.select; tokens after it cannot matter
    early = explain(model, tokens, method='input_x_gradient', position=3)
    early_curves = token_curves(model, early, steps=4)  # only the 4 tokens up to position 3 take part
    assert len(early_curves.morf) == 5 and float(early_curves.morf[-1]) == float(early_curves.lerf[-1])
