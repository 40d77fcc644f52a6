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
