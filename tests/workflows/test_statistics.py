"""The correlations of the workflows (:py:mod:`zennit_attn.workflows.statistics`), against scipy's."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from zennit_attn.workflows.evaluation.source_ablation import spearman as lds_spearman
from zennit_attn.workflows.patching.scores import spearman as patching_spearman
from zennit_attn.workflows.statistics import pearson, ranks, spearman

stats = pytest.importorskip('scipy.stats')  # scikit-learn's dependency; the package itself needs only torch


@pytest.mark.parametrize('seed', range(4))
def test_correlations_equal_scipys_also_with_ties(seed):
    generator = np.random.default_rng(seed)
    a = generator.integers(0, 5, 40).astype(np.float64)  # many ties
    b = a + generator.normal(size=40)
    assert spearman(a, b) == pytest.approx(stats.spearmanr(a, b).statistic, abs=1e-12)
    assert pearson(a, b) == pytest.approx(stats.pearsonr(a, b).statistic, abs=1e-12)
    expected = stats.rankdata(a) - 1
    assert torch.equal(ranks(torch.as_tensor(a)), torch.as_tensor(expected))
    assert spearman(torch.as_tensor(a), b.tolist()) == spearman(a, b)


def test_one_implementation_and_constants():
    assert lds_spearman is spearman and patching_spearman is spearman
    assert math.isnan(spearman([1.0, 1.0, 1.0], [1.0, 2.0, 3.0])) and math.isnan(pearson([2, 2], [1, 3]))
    with pytest.raises(ValueError, match='same length, got 3 and 2'):
        pearson([1, 2, 3], [1, 2])
