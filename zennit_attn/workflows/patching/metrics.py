"""What patching measures: a metric of the logits at the last position, as an
:py:class:`~zennit_attn.inputs.objectives.Objective` (the objectives every method of the library explains).

- ``'logit_difference'``: ``y[answer] - y[wrong]`` (:py:class:`~zennit_attn.inputs.objectives.Contrast`), the IOI
  metric (Wang et al. 2023);
- ``'log_probability'``: ``log softmax(y)[answer]``
  (:py:class:`~zennit_attn.inputs.objectives.LogProbability`);
- ``'logit'``: ``y[answer]``;
- a callable ``f(logits [n, vocab]) -> [n]``, the same function for every row
  (:py:class:`~zennit_attn.inputs.objectives.OutputFunction`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...inputs.checks import as_integers
from ...inputs.objectives import Contrast, Logit, LogProbability, Objective, OutputFunction

__all__ = ['METRICS', 'Metric', 'make_metric']

#: The named metrics.
METRICS = ('logit_difference', 'log_probability', 'logit')


class Metric:
    """A metric of the last position's logits of each prompt: ``objective`` with the ``targets`` ids (the answers;
    zeros for a callable metric). :py:meth:`resolve` fixes it on the clean logits; :py:meth:`of` reads it for rows
    of the batch (variants of the prompt ``rows``)."""

    def __init__(self, objective: Objective, targets: torch.Tensor, tokens: dict[str, torch.Tensor] | None = None):
        self.objective = objective
        self.targets = targets
        #: the token ids the metric reads, by argument name (``answers``, ``wrong``), checked against the logits
        self.tokens = tokens or {}

    def resolve(self, logits: torch.Tensor) -> Metric:
        """The metric resolved on the clean run's ``[batch, vocab]`` last-position logits.

        Raises
        ------
        ValueError
            For a token id of ``answers=`` or ``wrong=`` outside the logits.
        """
        size = logits.shape[-1]
        for name, ids in self.tokens.items():
            outside = ids[ids >= size]
            if outside.numel():
                raise ValueError(
                    f"{name}= holds the token id {int(outside[0])}, outside the model's {size} logits "
                    f'(0 to {size - 1}): was it tokenized for another model?'
                )
        targets = self.targets.to(logits.device)
        return Metric(self.objective.resolve(logits, targets), targets, self.tokens)

    def of(self, logits: torch.Tensor, rows: torch.Tensor | None = None, initial_relevance: bool = False):
        """``[n]`` metric of ``[n, vocab]`` logits of the prompts ``rows`` (None: all, in order); with
        ``initial_relevance`` as the start of an LRP backward pass (see
        :py:meth:`~zennit_attn.inputs.objectives.Objective.value`)."""
        targets = self.targets if rows is None else self.targets[rows.to(self.targets.device)]
        return self.objective.value(logits, targets, rows, initial_relevance=initial_relevance)


def make_metric(metric: str | Callable, answers, wrong, batch: int) -> Metric:
    """The :py:class:`Metric` of ``metric`` (a key of :py:data:`METRICS` or a callable) for ``batch`` prompt pairs.

    Raises
    ------
    ValueError
        For an unknown metric, or answers missing or not one per prompt.
    """
    if callable(metric):
        if answers is not None or wrong is not None:
            raise ValueError('a callable metric computes its value itself: pass no answers= or wrong=')
        return Metric(OutputFunction(metric), torch.zeros(batch, dtype=torch.long))
    if metric not in METRICS:
        raise ValueError(f'unknown metric {metric!r}; known: {", ".join(METRICS)}, or a callable of the logits')
    targets = _per_prompt(answers, 'answers', batch, metric)
    if metric == 'logit_difference':
        others = _per_prompt(wrong, 'wrong', batch, metric)
        return Metric(Contrast(others), targets, {'answers': targets, 'wrong': others})
    if wrong is not None:
        raise ValueError(f'the metric {metric!r} reads no wrong answer: pass wrong= only with "logit_difference"')
    return Metric(LogProbability() if metric == 'log_probability' else Logit(), targets, {'answers': targets})


def _per_prompt(ids, name: str, batch: int, metric: str) -> torch.Tensor:
    if ids is None:
        raise ValueError(f'the metric {metric!r} needs {name}= (one token id per prompt pair)')
    ids = as_integers(ids, name).reshape(-1)
    if bool((ids < 0).any()):
        raise ValueError(f'{name}= holds the negative token id {int(ids.min())}: token ids are 0 or more')
    if ids.numel() == 1:
        ids = ids.expand(batch)
    if ids.numel() != batch:
        raise ValueError(f'{name}= needs one token id per prompt pair ({batch}), got {ids.numel()}')
    return ids.clone()
