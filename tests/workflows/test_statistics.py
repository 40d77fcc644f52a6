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


@pytest.mark.parametrize('length', [3, 6, 7])
def test_constant_values_whose_mean_rounds_give_nan_not_zero(length):
    """``[0.1] * 3`` has the mean ``0.10000000000000002``: the deviations ``-1.4e-17`` are not 0, and the correlation
    of a constant was reported as 0.0 (or any value of a rounding sign) instead of NaN, which scipy gives."""
    constant, other = [0.1] * length, [float(value) for value in range(length)]
    assert math.isnan(pearson(constant, other)) and math.isnan(pearson(other, constant))
    assert math.isnan(spearman(constant, other))
    assert math.isnan(pearson([], []))


def test_nan_values_give_nan_as_scipy():
    """A NaN was ranked as the largest value, so Spearman's correlation of ``[1, 2, nan, 4]`` and ``[1, 3, 2, 4]``
    was 0.4 where scipy gives NaN."""
    a, b = [1.0, 2.0, float('nan'), 4.0], [1.0, 3.0, 2.0, 4.0]
    assert math.isnan(stats.spearmanr(a, b).statistic)
    assert math.isnan(spearman(a, b)) and math.isnan(spearman(b, a)) and math.isnan(pearson(a, b))
    assert ranks(a).isnan().all()


def test_values_laid_out_differently_are_refused():
    """A ``[2, 3]`` matrix and its transpose were flattened and correlated (pairing entry ``(0, 1)`` with ``(0, 1)``
    of the transpose, i.e. ``(1, 0)`` of the matrix): a number for pairs that do not belong together."""
    a = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    b = a.square()
    with pytest.raises(ValueError, match=r'shapes \(2, 3\) and \(3, 2\)'):
        pearson(a, b.T)
    with pytest.raises(ValueError, match='laid out differently'):
        spearman(a.T, b)
    assert pearson(a, b) == pytest.approx(stats.pearsonr(a.flatten(), b.flatten()).statistic, abs=1e-12)
    assert pearson(a.flatten()[:, None], b.flatten()) == pearson(a, b)
