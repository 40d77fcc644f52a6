"""The random baseline of the paper: standard normal relevance per input entry (per token for language models),
seeded by the input's content."""

from __future__ import annotations

import hashlib

import torch

from ..inputs.task import Task

__all__ = ['random']


def _content_seed(seed: int, values: torch.Tensor) -> int:
    """A seed from ``seed`` and the bytes of ``values``: the same for the same input, another for another input."""
    digest = hashlib.sha256(str(seed).encode())
    digest.update(values.detach().cpu().contiguous().numpy().tobytes())
    return int.from_bytes(digest.digest()[:8], 'little') & (2**63 - 1)


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
        ids = getattr(task, 'input_ids', None)
        mask = getattr(task, 'attention_mask', None)
        for row in range(shape[0]):
            if ids is not None and ids.shape == shape:
                valid = torch.ones(shape[1], dtype=torch.bool) if mask is None else (mask[row] != 0).cpu()
                content = ids[row].cpu()[valid]
            else:
                valid, content = None, task.inputs[row]
            generator = torch.Generator().manual_seed(_content_seed(seed, content))
            if valid is None:
                relevance[row] = torch.randn(shape[1:], generator=generator, dtype=torch.float64)
            else:
                relevance[row, valid] = torch.randn(int(valid.sum()), generator=generator, dtype=torch.float64)
    return task.finish(relevance.to(device=task.inputs.device, dtype=task.inputs.dtype), logit, 'random')
