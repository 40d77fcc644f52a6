"""Plausibility: top-1 hit and soft IoU against a token mask."""

import pytest
import torch

from zennit_attn.workflows.evaluation import plausibility


def test_exact_mask_scores_one():
    mask = torch.tensor([0, 1, 1, 0], dtype=torch.bool)
    result = plausibility(mask.double(), mask)
    assert result.top1 == 1.0 and result.iou == pytest.approx(1.0)


def test_soft_iou_and_miss():
    mask = torch.tensor([0, 1, 0, 0], dtype=torch.bool)
    result = plausibility(torch.tensor([2.0, 1.0, -5.0, 0.0]), mask)
    # scaled positive relevance [1, .5, 0, 0]: min-sum .5, max-sum 1 + 1 = 2
    assert result.top1 == 0.0 and result.iou == pytest.approx(0.25)


def test_valid_positions_are_ignored_and_empty_mask_refused():
    mask = torch.tensor([0, 1, 0], dtype=torch.bool)
    valid = torch.tensor([0, 1, 1], dtype=torch.bool)
    assert plausibility(torch.tensor([9.0, 1.0, 0.0]), mask, valid).top1 == 1.0
    with pytest.raises(ValueError):
        plausibility(torch.ones(3), torch.zeros(3, dtype=torch.bool))


@pytest.mark.parametrize('bad', [float('nan'), float('inf')])
def test_relevance_that_is_not_finite_is_refused(bad):
    """A NaN was taken as the maximum by argmax (top-1 0.0 although the largest finite relevance, 0.5, is in the
    mask) and the IoU was NaN; an infinite relevance made the IoU NaN. Positions left out by ``valid`` may hold
    anything."""
    relevance, mask = torch.tensor([0.1, bad, 0.5, 0.2]), torch.tensor([False, False, True, False])
    with pytest.raises(ValueError, match='not finite .* first 1'):
        plausibility(relevance, mask)
    valid = torch.tensor([True, False, True, True])
    score = plausibility(relevance, mask, valid)
    assert score.top1 == 1.0 and score.iou == pytest.approx(1.0 / (0.2 + 1.0 + 0.4), abs=1e-7)


def test_tied_largest_relevance_scores_the_share_in_the_mask():
    """With ties at the largest relevance argmax took the first tied token: an explanation of zeros everywhere
    (no information) scored a hit whenever the mask began at the first token, and a miss otherwise."""
    mask = torch.tensor([True, False, False, False])
    assert plausibility(torch.zeros(4), mask).top1 == 0.25
    assert plausibility(torch.zeros(4), mask.flip(0)).top1 == 0.25
    assert plausibility(torch.tensor([3.0, 3.0, 1.0, 3.0]), torch.tensor([False, True, False, True])).top1 == 2 / 3
    assert plausibility(torch.tensor([3.0, 2.0, 1.0, 3.0 - 1e-12], dtype=torch.float64), mask).top1 == 1.0
