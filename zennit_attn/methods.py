"""Baseline attribution methods behind ``explain(..., method=NAME)``, all explaining the same logit as AttnLRP.

Each method is a function ``(task, position, target, **params) -> Explanation`` registered in
:py:data:`METHODS`; ``task`` is a :py:class:`~zennit_attn.explain.Task`.
"""
from __future__ import annotations

from typing import Callable

import torch

from .explain import Explanation, Task


def input_x_gradient(task: Task, position=-1, target=None) -> Explanation:
    """Gradient x input (Eq. 11 of the paper's appendix) at the word embeddings. Cost: one forward and one
    backward pass."""
    with torch.enable_grad():
        embeddings = task.embeddings.clone().requires_grad_(True)
        logit = task.resolve(task.forward(embeddings), position, target)
        (grad,) = torch.autograd.grad(logit.sum(), embeddings)
    return task.explanation(embeddings.detach() * grad, logit)


#: Registered baseline methods by name.
METHODS: dict[str, Callable[..., Explanation]] = {
    'input_x_gradient': input_x_gradient,
}
