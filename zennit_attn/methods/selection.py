"""What the attributors of zennit and captum need of a task: the explained logit as a module on the task's inputs
(:py:class:`Selected`), and a random state forked and seeded for the time of a method's sampling
(:py:func:`forked_random_state`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from ..inputs.task import Task

__all__ = ['Selected', 'forked_random_state']


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
