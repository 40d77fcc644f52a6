"""Pixel faithfulness: features of images, batched curves equal the per-sample core, and known answers."""

from __future__ import annotations

import pytest
import torch

from zennit_attn import ImageExplanation
from zennit_attn.workflows.evaluation import (
    Faithfulness,
    features_to_images,
    image_curves,
    image_faithfulness,
    image_features,
)
from zennit_attn.workflows.evaluation.perturbation import perturbation_curves


class LinearClassifier(torch.nn.Module):
    """logit_c = sum_i W_ci x_i: gradient x input is the exact decomposition."""

    def __init__(self, channels=2, size=4, classes=3):
        super().__init__()
        self.linear = torch.nn.Linear(channels * size * size, classes, bias=False).double()

    def forward(self, x):
        return self.linear(x.flatten(1))


@pytest.mark.parametrize('patch', [1, 2])
def test_features_round_trip(patch):
    generator = torch.Generator().manual_seed(patch)
    pixels = torch.randn(2, 4, 6, generator=generator)
    relevance = torch.randn(4, 6, generator=generator)
    features, values = image_features(pixels, relevance, patch)
    assert features.shape == (24 // patch**2, 2, patch, patch)
    assert torch.equal(features_to_images(features[None], 4, 6)[0], pixels)
    # sums of 24 float32 values of order 1 in different orders: rounding of order 24 * 2 ** -24 * |sum of |x||
    tolerance = 1e-5 * float(relevance.abs().sum())
    torch.testing.assert_close(values.sum(), relevance.double().sum(), rtol=0, atol=tolerance)
    if patch == 2:
        assert float(values[1]) == pytest.approx(float(relevance[:2, 2:4].double().sum()), rel=0, abs=tolerance)
    with pytest.raises(ValueError):
        image_features(pixels, relevance, 4)


@pytest.mark.parametrize('mode', ['flipping', 'insertion'])
@pytest.mark.parametrize('patch', [1, 2])
def test_batched_curves_equal_the_core(mode, patch):
    torch.manual_seed(0)
    model = LinearClassifier().eval()
    pixels = torch.rand(5, 2, 4, 4, dtype=torch.float64)
    relevance = torch.randn(5, 4, 4, dtype=torch.float64)
    targets = torch.tensor([0, 1, 2, 0, 1])
    curves = image_curves(
        model, pixels, relevance, targets, steps=5, mode=mode, patch_size=patch, batch_size=7, progress=False
    )
    assert len(curves) == 5
    for row in range(5):
        features, values = image_features(pixels[row], relevance[row], patch)
        target = int(targets[row])
        expected = perturbation_curves(
            lambda batch, target=target: model(features_to_images(batch, 4, 4))[:, target], features, values, 5, mode
        )
        torch.testing.assert_close(curves[row].morf, expected.morf)
        torch.testing.assert_close(curves[row].lerf, expected.lerf)
        assert curves[row].score == pytest.approx(expected.score)


def test_exact_relevance_beats_random_and_its_negation():
    torch.manual_seed(0)
    model = LinearClassifier().eval()
    pixels = torch.rand(6, 2, 4, 4, dtype=torch.float64)
    targets = torch.zeros(6, dtype=torch.long)
    exact = (model.linear.weight[0].view(2, 4, 4) * pixels).sum(1)

    def explanation(relevance):
        return ImageExplanation(
            relevance=relevance,
            pixel_relevance=relevance[:, None],
            target=targets,
            logit=model(pixels)[:, 0].detach(),
            pixels=pixels,
        )

    good = image_faithfulness(model, explanation(exact), steps=8, progress=False)
    bad = image_faithfulness(model, explanation(-exact), steps=8, progress=False)
    noise = image_faithfulness(model, explanation(torch.randn(6, 4, 4, dtype=torch.float64)), steps=8, progress=False)
    assert isinstance(good, Faithfulness) and good.count == 6
    assert good.score > noise.score > bad.score
    assert good.score == pytest.approx(-bad.score)
    # flipping everything reaches the baseline output 0 (no bias); the first point is the logit
    assert all(float(curve.morf[-1]) == pytest.approx(0.0, abs=1e-12) for curve in good.curves)
    torch.testing.assert_close(torch.stack([curve.morf[0] for curve in good.curves]), model(pixels)[:, 0].detach())


def test_a_baseline_is_what_the_features_are_set_to():
    """With ``baseline=b`` the flipped pixels are ``b``: for the bias-free linear model the MoRF curve of the exact
    relevance (one pixel per step, ordered by ``w_i x_i``) is ``sum over unflipped w_i x_i + b * sum over flipped
    w_i`` (at b = 0 this is not the same curve)."""
    torch.manual_seed(0)
    model = LinearClassifier(channels=1, size=2).eval()
    pixels = torch.rand(2, 1, 2, 2, dtype=torch.float64)
    targets = torch.tensor([0, 2])
    weights = model.linear.weight.detach()[targets].view(2, 2, 2)
    exact = weights * pixels[:, 0]
    explanation = ImageExplanation(
        relevance=exact,
        pixel_relevance=exact[:, None],
        target=targets,
        logit=model(pixels).detach()[torch.arange(2), targets],
        pixels=pixels,
    )
    baseline = 0.75
    for curves in (
        image_faithfulness(model, explanation, steps=4, baseline=baseline, progress=False).curves,
        image_curves(model, pixels, exact, targets, steps=4, baseline=baseline, progress=False),
    ):
        for row, curve in enumerate(curves):
            order = exact[row].flatten().argsort(descending=True)
            contributions, flat_weights = exact[row].flatten()[order], weights[row].flatten()[order]
            expected = torch.stack([contributions[k:].sum() + baseline * flat_weights[:k].sum() for k in range(5)])
            torch.testing.assert_close(curve.morf, expected, rtol=1e-12, atol=1e-12)
    at_zero = image_faithfulness(model, explanation, steps=4, progress=False).curves[0].morf
    assert float((at_zero - curves[0].morf).abs().max()) > 1e-3


def test_curves_of_a_contrast_score_the_contrast(llama):
    """The unperturbed point of the curves of a contrastive explanation is the explained logit difference, not the
    target's logit (the curves score what was explained)."""
    from zennit_attn import explain
    from zennit_attn.workflows.evaluation import explanation_curves

    ids = torch.tensor([[3, 17, 5, 42, 9, 11]])
    plain = explain(llama, ids, method='input_x_gradient')
    contrast = explain(llama, ids, method='input_x_gradient', contrast=int(plain.target[0]) + 1)
    curves = explanation_curves(llama, contrast, steps=3)[0]
    torch.testing.assert_close(curves.morf[0], contrast.logit[0])
    assert abs(float(curves.morf[0] - plain.logit[0])) > 1e-3
