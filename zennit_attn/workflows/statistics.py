"""Correlations of scores, in one place for every workflow: Pearson's, and Spearman's rank correlation (Pearson's of
the ranks, ties ranked by their mean rank), as :py:func:`scipy.stats.spearmanr` defines it.

Patching compares relevance patching with activation patching by both
(:py:func:`~zennit_attn.workflows.patching.correlation`); context attribution's linear datamodeling score is the
rank correlation of predicted and actual log-probabilities
(:py:func:`~zennit_attn.workflows.evaluation.source_ablation.lds`).
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ['as_values', 'ranks', 'pearson', 'spearman']


def as_values(values, what: str = 'values') -> torch.Tensor:
    """``values`` (a tensor, a NumPy array or a sequence of numbers) as a float64 tensor on the CPU (``what``: their
    name in the error for anything else)."""
    if isinstance(values, torch.Tensor):
        return values.detach().to('cpu', torch.float64)
    try:
        return torch.as_tensor(np.asarray(values, dtype=np.float64))
    except (TypeError, ValueError) as error:
        raise TypeError(
            f'{what} must be numbers (a tensor, an array or a sequence), got {type(values).__name__}'
        ) from error


def _values(values) -> torch.Tensor:
    """``values`` as a flat float64 tensor on the CPU (:py:func:`as_values`)."""
    return as_values(values).reshape(-1)


def ranks(values) -> torch.Tensor:
    """``[n]`` float64 ranks (0 for the smallest) of ``values``; tied values get the mean of their ranks. Values with
    a NaN have no order: all ranks are NaN (as :py:func:`scipy.stats.rankdata` gives them)."""
    values = _values(values)
    if bool(values.isnan().any()):
        return torch.full_like(values, float('nan'))
    order = values.argsort(stable=True)
    result = torch.empty_like(values)
    result[order] = torch.arange(len(values), dtype=torch.float64)
    _, inverse, counts = values.unique(return_inverse=True, return_counts=True)
    sums = torch.zeros(len(counts), dtype=torch.float64).index_add_(0, inverse, result)
    return sums[inverse] / counts[inverse]


def _paired(a, b) -> tuple[torch.Tensor, torch.Tensor]:
    """``a`` and ``b`` as flat float64 tensors of the same length, paired by place; refused: different lengths, or
    the same number of values laid out differently (dimensions of size 1 aside)."""
    a, b = as_values(a, 'a'), as_values(b, 'b')
    shapes = [[size for size in values.shape if size != 1] for values in (a, b)]
    if shapes[0] != shapes[1] and a.numel() == b.numel():
        raise ValueError(
            f'a correlation pairs values by place, got shapes {tuple(a.shape)} and {tuple(b.shape)}: the same number '
            'of values laid out differently (a matrix and its transpose?); flatten both in the same order'
        )
    a, b = a.reshape(-1), b.reshape(-1)
    if a.shape != b.shape:
        raise ValueError(f'a correlation needs values of the same length, got {len(a)} and {len(b)}')
    return a, b


def pearson(a, b) -> float:
    """Pearson's correlation of ``a`` and ``b`` (same length; values of more than one dimension paired by place,
    refused where they are laid out differently); NaN where one is constant (all values equal: tested on
    the values, as their deviations from a rounded mean need not be 0) or holds a NaN."""
    a, b = _paired(a, b)
    if any(len(values) == 0 or bool((values == values[0]).all()) for values in (a, b)):
        return float('nan')
    a, b = a - a.mean(), b - b.mean()
    denominator = float(a.norm() * b.norm())
    return float((a * b).sum() / denominator) if denominator > 0 else float('nan')


def spearman(a, b) -> float:
    """Spearman's rank correlation of ``a`` and ``b``: :py:func:`pearson` of their :py:func:`ranks`; NaN where one is
    constant or holds a NaN (as :py:func:`scipy.stats.spearmanr`)."""
    a, b = _paired(a, b)
    return pearson(ranks(a), ranks(b))
