"""What the attributors of zennit and captum need of a task: the explained logit as a module on the task's inputs
(:py:class:`Selected`), a random state forked and seeded for the time of a method's sampling
(:py:func:`forked_random_state`), and random numbers of each row from the row alone (:py:func:`row_randomness`)."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from typing import NamedTuple

import torch

from ..inputs.task import Task

__all__ = ['Selected', 'forked_random_state', 'RowRandomness', 'row_randomness']


def _rows(task: Task, count: int, row: int | None = None) -> torch.Tensor:
    """``rows`` for a batch of ``count`` elements: all variants of ``row``, or ``i % batch`` (row-major copies)."""
    device = task.inputs.device
    if row is not None:
        return torch.full((count,), row, dtype=torch.long, device=device)
    return torch.arange(count, device=device) % task.batch


class Selected(torch.nn.Module):
    """The explained logit of a resolved task as a module on its inputs (for zennit's and captum's attributors); a
    batch of ``k`` times the task's batch holds ``k`` stacked copies of the input rows, or, with ``row``, variants
    of that one row."""

    def __init__(self, task: Task, row: int | None = None):
        super().__init__()
        self.task, self.row = task, row

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        rows = _rows(self.task, inputs.shape[0], self.row)
        return self.task.select(self.task.forward(inputs, rows), rows)


@contextlib.contextmanager
def forked_random_state(seed: int | None, device: torch.device) -> Iterator[None]:
    """Fork the global random state (CPU and ``device``) and seed it with ``seed`` for the time of the block, so that
    a method's samples are reproducible and the caller's random state is left as it was; nothing when ``seed`` is
    None (the global random state is used and advanced)."""
    if seed is None:
        yield
        return
    devices = [device] if device.type == 'cuda' else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


class RowRandomness(NamedTuple):
    """The random source of one input row (:py:func:`row_randomness`)."""

    #: ``[seq]`` True at the row's tokens (None: every entry of the row, as for pixels)
    valid: torch.Tensor | None
    #: a CPU generator seeded with the seed and the row's content (None: the global random state)
    generator: torch.Generator | None


def row_randomness(task: Task, seed: int | None) -> list[RowRandomness]:
    """The random source of every row of ``task``: with an integer ``seed`` a generator seeded with ``seed`` and the
    row's content (its token ids without padding, or its pixels), so that a row's random numbers are reproducible,
    the same for a text alone or padded in a batch, and independent between different inputs (one generator seeded
    alike for every input would give every text of one length the same numbers); None: the global random state. The
    row's tokens (padding left out) are where a method draws its numbers."""
    shape = task.inputs.shape[:2] if task.inputs.dim() == 3 else task.inputs.shape
    ids = getattr(task, 'input_ids', None)
    mask = getattr(task, 'attention_mask', None)
    sources = []
    for row in range(shape[0]):
        if ids is not None and ids.shape == shape:
            valid = torch.ones(shape[1], dtype=torch.bool) if mask is None else (mask[row] != 0).cpu()
            content = ids[row].cpu()[valid]
        else:
            valid, content = None, task.inputs[row]
        generator = None if seed is None else torch.Generator().manual_seed(_content_seed(seed, content))
        sources.append(RowRandomness(valid, generator))
    return sources


def _content_seed(seed: int, values: torch.Tensor) -> int:
    """A seed from ``seed`` and the bytes of ``values``: the same for the same input, another for another input."""
    digest = hashlib.sha256(str(seed).encode())
    digest.update(values.detach().cpu().contiguous().numpy().tobytes())
    return int.from_bytes(digest.digest()[:8], 'little') & (2**63 - 1)
