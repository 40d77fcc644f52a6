"""What patching measures: a metric of the logits at the last position, or of the full logits, as an
:py:class:`~zennit_attn.inputs.objectives.Objective` (the objectives every method of the library explains).

- ``'logit_difference'``: ``y[answer] - y[wrong]`` (:py:class:`~zennit_attn.inputs.objectives.Contrast`), the IOI
  metric (Wang et al. 2023);
- ``'log_probability'``: ``log softmax(y)[answer]``
  (:py:class:`~zennit_attn.inputs.objectives.LogProbability`);
- ``'logit'``: ``y[answer]``;
- a callable ``f(logits [n, vocab]) -> [n]`` of the last position's logits, the same function for every row
  (:py:class:`~zennit_attn.inputs.objectives.OutputFunction`);
- :py:class:`FullLogits` ``(f)``: a callable ``f(logits [n, seq, vocab]) -> [n]`` of the logits at every position
  (a metric of a non-final position, of several positions, of a whole answer).

Each row ``n`` is one run of a prompt pair (a clean, a corrupted or a patched prompt); the function must return one
floating-point value per row and be differentiable for relevance patching.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...inputs.checks import as_integers
from ...inputs.objectives import Contrast, Logit, LogProbability, Objective, OutputFunction

__all__ = ['METRICS', 'FullLogits', 'LogitsFunction', 'Metric', 'make_metric', 'output_logits']

#: The named metrics.
METRICS = ('logit_difference', 'log_probability', 'logit')


def output_logits(output) -> torch.Tensor:
    """The ``[batch, seq, vocab]`` logits of a causal language model's output.

    Raises
    ------
    ValueError
        For an output without ``[batch, seq, vocab]`` logits.
    """
    logits = getattr(output, 'logits', None)
    if logits is None or logits.dim() != 3:
        raise ValueError(
            'patching measures a metric of the next-token logits: the model must return logits [batch, seq, vocab] '
            f'(a causal language model), got {type(output).__name__}'
        )
    return logits


class FullLogits:
    """The metric ``function(logits [n, seq, vocab]) -> [n]`` of the logits at every position (``metric=
    FullLogits(f)``); a plain callable receives the last position's ``[n, vocab]`` logits only.

    Parameters
    ----------
    function: callable
        Of the ``[n, seq, vocab]`` logits of ``n`` runs (clean, corrupted or patched prompts, in the order of their
        pairs where a run patches several), returning ``[n]`` floating-point values; differentiable for relevance
        patching.
    """

    def __init__(self, function: Callable[[torch.Tensor], torch.Tensor]):
        if not callable(function):
            raise TypeError(f'FullLogits needs a callable of the logits, got {type(function).__name__}')
        self.function = function


class LogitsFunction(OutputFunction):
    """The objective of a :py:class:`FullLogits` metric: :py:class:`~zennit_attn.inputs.objectives.OutputFunction`
    of ``[n, seq, vocab]`` logits."""

    #: the dimensions of the logits the function receives
    dims = 3


class Metric:
    """A metric of the logits of each prompt: ``objective`` with the ``targets`` ids (the answers; zeros for a
    callable metric), of the last position's logits or (``whole``) of the logits at every position.
    :py:meth:`logits` reads what it measures of a model's output, :py:meth:`resolve` fixes it on the clean logits;
    :py:meth:`of` reads it for rows of the batch (variants of the prompt ``rows``)."""

    def __init__(
        self,
        objective: Objective,
        targets: torch.Tensor,
        tokens: dict[str, torch.Tensor] | None = None,
        whole: bool = False,
    ):
        self.objective = objective
        self.targets = targets
        #: the token ids the metric reads, by argument name (``answers``, ``wrong``), checked against the logits
        self.tokens = tokens or {}
        #: whether the metric reads the logits at every position (:py:class:`FullLogits`)
        self.whole = whole

    def logits(self, output) -> torch.Tensor:
        """The logits the metric reads of a causal language model's ``output`` (:py:func:`output_logits`):
        ``[batch, vocab]`` at the last position, ``[batch, seq, vocab]`` for a :py:class:`FullLogits` metric."""
        logits = output_logits(output)
        return logits if self.whole else logits[:, -1]

    def resolve(self, logits: torch.Tensor) -> Metric:
        """The metric resolved on the clean run's logits (as :py:meth:`logits` reads them).

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
        return Metric(self.objective.resolve(logits, targets), targets, self.tokens, self.whole)

    def of(self, logits: torch.Tensor, rows: torch.Tensor | None = None, initial_relevance: bool = False):
        """``[n]`` metric of the logits (as :py:meth:`logits` reads them) of the prompts ``rows`` (None: all, in
        order); with ``initial_relevance`` as the start of an LRP backward pass (see
        :py:meth:`~zennit_attn.inputs.objectives.Objective.value`)."""
        targets = self.targets if rows is None else self.targets[rows.to(self.targets.device)]
        return self.objective.value(logits, targets, rows, initial_relevance=initial_relevance)


def make_metric(metric: str | Callable | FullLogits, answers, wrong, batch: int) -> Metric:
    """The :py:class:`Metric` of ``metric`` (a key of :py:data:`METRICS`, a callable of the last position's logits or
    a :py:class:`FullLogits`) for ``batch`` prompt pairs.

    Raises
    ------
    ValueError
        For an unknown metric, or answers missing or not one per prompt.
    """
    if callable(metric) or isinstance(metric, FullLogits):
        if answers is not None or wrong is not None:
            raise ValueError('a callable metric computes its value itself: pass no answers= or wrong=')
        whole = isinstance(metric, FullLogits)
        objective = LogitsFunction(metric.function) if whole else OutputFunction(metric)
        return Metric(objective, torch.zeros(batch, dtype=torch.long), whole=whole)
    if metric not in METRICS:
        raise ValueError(
            f'unknown metric {metric!r}; known: {", ".join(METRICS)}, a callable of the last logits or '
            'FullLogits(callable) of the logits at every position'
        )
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
