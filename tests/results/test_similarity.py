"""The greedy removal order of :py:class:`~zennit_attn.results.similarity.SimilarityExplanation` against the drop of
the score computed from the submatrix that remains."""

from __future__ import annotations

import itertools

import pytest
import torch

from zennit_attn.results.similarity import SimilarityExplanation


def remaining(relevance: torch.Tensor, rows: set, columns: set) -> float:
    """The sum of the relevance left when ``rows`` of the first input and ``columns`` of the second are removed."""
    keep_rows = [i for i in range(relevance.shape[0]) if i not in rows]
    keep_columns = [j for j in range(relevance.shape[1]) if j not in columns]
    return float(relevance[keep_rows][:, keep_columns].sum())


def greedy_by_submatrices(relevance: torch.Tensor, count: int, skip_a: set, skip_b: set) -> list:
    """The same order written from its definition: at each step the pair after whose removal the least remains."""
    rows, columns, pairs = set(), set(), []
    for _ in range(count):
        before = remaining(relevance, rows, columns)
        candidates = [
            (before - remaining(relevance, rows | {i}, columns | {j}), i, j)
            for i, j in itertools.product(range(relevance.shape[0]), range(relevance.shape[1]))
            if i not in rows | skip_a and j not in columns | skip_b
        ]
        if not candidates:
            break
        drop, i, j = max(candidates)
        pairs.append((i, j, drop))
        rows.add(i)
        columns.add(j)
    return pairs


def explanation(relevance: torch.Tensor) -> SimilarityExplanation:
    return SimilarityExplanation(
        relevance,
        float(relevance.sum()),
        [f'a{i}' for i in range(relevance.shape[0])],
        [f'b{j}' for j in range(relevance.shape[1])],
    )


def test_removal_pairs_follow_the_drop_of_the_remaining_submatrix():
    relevance = torch.randn(7, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    found = explanation(relevance).removal_pairs(count=6, skip_a={0}, skip_b={4})
    expected = greedy_by_submatrices(relevance, 6, {0}, {4})
    assert [(i, j) for i, j, _ in found] == [(i, j) for i, j, _ in expected]
    assert len(found) == 4  # five columns, one skipped: four pairs
    torch.testing.assert_close(
        torch.tensor([drop for *_, drop in found]), torch.tensor([drop for *_, drop in expected]), rtol=0, atol=1e-12
    )
    # the predicted drops add up to the relevance removed with all the pairs
    rows, columns = {i for i, _, _ in found}, {j for _, j, _ in found}
    removed = float(relevance.sum()) - remaining(relevance, rows, columns)
    assert sum(drop for *_, drop in found) == pytest.approx(removed, abs=1e-12)


def test_removal_pairs_are_not_the_largest_entries():
    """Removing a pair removes both tokens' rows and columns: the largest entry, alone in its row and column, goes
    after a pair of two tokens that share relevance with others."""
    relevance = torch.tensor([[3.0, 0.0, 0.0], [0.0, 2.0, 2.0], [0.0, 2.0, 0.0]], dtype=torch.float64)
    found = explanation(relevance)
    # row 0 (3) + column 1 (4) - entry (0) = 7, against 3 + 3 - 3 = 3 for the largest entry (0, 0)
    assert found.removal_pairs(count=1) == [(0, 1, 7.0)]
    assert found.top_pairs(1)[0][:2] == ('a0', 'b0')


def test_bad_counts_positions_and_relevance_are_refused():
    """``removal_pairs(count=-1)`` returned no pairs and ``top_pairs(-1)`` failed inside ``topk``; a NaN was ranked
    as the largest pair relevance (listed first by ``top_pairs``, chosen first by ``removal_pairs``); a skipped
    position outside the input failed with a bare IndexError."""
    relevance = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    found = explanation(relevance)
    for count in (-1, 1.5, True):
        with pytest.raises(ValueError, match='count must be a non-negative integer'):
            found.removal_pairs(count=count)
        with pytest.raises(ValueError, match='count must be a non-negative integer'):
            found.top_pairs(count)
    with pytest.raises(ValueError, match=r'skip_b has position\(s\) \[4\] outside the input of 4 tokens'):
        found.removal_pairs(skip_b=[4])
    assert found.removal_pairs(count=1, skip_a=[-1]) == found.removal_pairs(count=1, skip_a=[2])
    assert found.top_pairs(0) == [] and found.removal_pairs(count=0) == []
    broken = relevance.clone()
    broken[0, 0] = float('nan')
    for method in (lambda: explanation(broken).top_pairs(2), lambda: explanation(broken).removal_pairs(2)):
        with pytest.raises(ValueError, match='not finite'):
            method()
