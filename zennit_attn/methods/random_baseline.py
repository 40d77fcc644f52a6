"""The random baseline of the paper: standard normal relevance per input entry (per token for language models),
seeded by the input's content."""

from __future__ import annotations

import torch

from ..inputs.task import Task
from .selection import row_randomness

__all__ = ['random']


def random(task: Task, position=-1, target=None, seed: int | None = 0):
    """Standard normal relevance per input entry (the paper's random baseline; per token for language models).

    With an integer ``seed`` each row's values come from a generator seeded with ``seed`` and the row's content (its
    token ids without padding, or its pixels): reproducible, the same for a text alone or padded in a batch, and
    independent between different inputs, so that over a dataset the random orders are independent (one generator
    seeded alike for every input would give every text of one length the same order, and the faithfulness of
    "random" would measure that one order). None: the global random state. Cost: one plain forward pass (for the
    logit)."""
    logit = task.resolve_plain(position, target)
    shape = task.inputs.shape[:2] if task.inputs.dim() == 3 else task.inputs.shape
    if seed is None:
        relevance = torch.randn(shape, dtype=torch.float64)
    else:
        relevance = torch.zeros(shape, dtype=torch.float64)
        for row, (valid, generator) in enumerate(row_randomness(task, seed)):
            if valid is None:
                relevance[row] = torch.randn(shape[1:], generator=generator, dtype=torch.float64)
            else:
                relevance[row, valid] = torch.randn(int(valid.sum()), generator=generator, dtype=torch.float64)
    return task.finish(relevance.to(device=task.inputs.device, dtype=task.inputs.dtype), logit, 'random')
