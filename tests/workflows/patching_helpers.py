"""Shared by the patching tests (test_patching.py, test_patching_edges.py, test_patching_names.py): the tolerance of
exact results, the answers of the three prompt pairs of ``conftest.pairs`` and their logit difference by hand."""

from __future__ import annotations

import torch

TIGHT = dict(rtol=1e-9, atol=1e-12)
#: The answer and the wrong answer of each of the three prompt pairs.
ANSWERS, WRONG = torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6])


def difference(logits: torch.Tensor, rows=slice(None)) -> torch.Tensor:
    """The metric by hand: the last position's logit of the answer minus that of the wrong answer, per row."""
    last = logits[:, -1]
    return last.gather(1, ANSWERS[rows, None])[:, 0] - last.gather(1, WRONG[rows, None])[:, 0]
