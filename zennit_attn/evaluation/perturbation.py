"""Input perturbation curves (appendix B.2 of the paper; Samek et al. 2016, Bluecher et al. 2024).

The core is modality-agnostic: a sample is an input tensor whose first dimension indexes the *features* that
are perturbed together (tokens: ``[seq, hidden]`` word embeddings; image patches or pixels: ``[features, ...]``),
one relevance value per feature, and a ``forward`` function mapping a batch ``[batch, *input.shape]`` of
perturbed inputs to the explained score ``[batch]`` (a logit, no softmax). :py:func:`token_curves` wraps it for
language models and an :py:class:`~zennit_attn.explain.Explanation`.

Perturbation: ``steps`` equal chunks of the feature order (most-relevant-first, MoRF, or least-relevant-first,
LeRF) are set to the ``baseline`` (default 0) one chunk per step (``'flipping'``), or restored from an all-baseline
input (``'insertion'``); each curve has ``steps + 1`` points, from no change to all features changed, and its area
is the mean of its points. The faithfulness score is ``A_LeRF - A_MoRF`` for flipping and ``A_MoRF - A_LeRF`` for
insertion (larger is better). Ties in relevance keep feature order (stable sort).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import torch

MODES = ('flipping', 'insertion')


@dataclass
class Curves:
    """The perturbation curves of one sample.

    Attributes
    ----------
    morf, lerf: torch.Tensor
        ``[steps + 1]`` scores after each step in most-/least-relevant-first order (point 0: before the first step).
    fractions: torch.Tensor
        ``[steps + 1]`` fraction of the features perturbed (flipping) or inserted (insertion) at each point.
    mode: str
        ``'flipping'`` or ``'insertion'``.
    """
    morf: torch.Tensor
    lerf: torch.Tensor
    fractions: torch.Tensor
    mode: str

    @property
    def area_morf(self) -> float:
        return float(self.morf.mean())

    @property
    def area_lerf(self) -> float:
        return float(self.lerf.mean())

    @property
    def score(self) -> float:
        """``A_LeRF - A_MoRF`` (flipping) or ``A_MoRF - A_LeRF`` (insertion): larger is more faithful."""
        difference = self.area_lerf - self.area_morf
        return difference if self.mode == 'flipping' else -difference


def step_counts(features: int, steps: int) -> list[int]:
    """How many features are changed after each of ``steps`` steps (``steps + 1`` counts from 0 to ``features``);
    ``steps`` is capped at ``features``."""
    steps = max(1, min(steps, features))
    return [round(k * features / steps) for k in range(steps + 1)]


def perturbed_inputs(inputs: torch.Tensor, relevance: torch.Tensor, steps: int, mode: str = 'flipping',
                     baseline: float | torch.Tensor = 0.0, valid: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """All perturbed inputs of one sample: ``[2 * (steps + 1), *inputs.shape]``, the MoRF curve's inputs first,
    and the fractions ``[steps + 1]``. Features where ``valid`` is False (padding) are never changed."""
    if mode not in MODES:
        raise ValueError(f'mode must be one of {MODES}, got {mode!r}')
    relevance = relevance.detach().flatten().to(inputs.device)
    if relevance.numel() != inputs.shape[0]:
        raise ValueError(f'{relevance.numel()} relevance values for {inputs.shape[0]} features')
    if not bool(torch.isfinite(relevance).all()):
        raise ValueError('relevance has non-finite values')
    indices = torch.arange(inputs.shape[0], device=inputs.device)
    if valid is not None:
        indices = indices[valid.flatten().to(inputs.device).bool()]
    values = relevance[indices].double()
    morf_order = indices[torch.argsort(-values, stable=True)]
    lerf_order = indices[torch.argsort(values, stable=True)]
    counts = step_counts(len(indices), steps)
    baseline = torch.as_tensor(baseline, dtype=inputs.dtype, device=inputs.device).expand_as(inputs)
    batch = []
    for order in (morf_order, lerf_order):
        for count in counts:
            changed = torch.zeros(inputs.shape[0], dtype=torch.bool, device=inputs.device)
            changed[order[:count]] = True
            if mode == 'insertion':  # start from the baseline, restore the first `count` features of the order
                changed = ~changed
                if valid is not None:
                    changed &= valid.flatten().to(inputs.device).bool()
            shape = (-1,) + (1,) * (inputs.dim() - 1)
            batch.append(torch.where(changed.view(shape), baseline, inputs))
    fractions = torch.tensor(counts, dtype=torch.float64) / max(1, len(indices))
    return torch.stack(batch), fractions


def perturbation_curves(forward: Callable[[torch.Tensor], torch.Tensor], inputs: torch.Tensor,
                        relevance: torch.Tensor, steps: int = 16, mode: str = 'flipping',
                        baseline: float | torch.Tensor = 0.0, valid: torch.Tensor | None = None,
                        batch_size: int | None = None) -> Curves:
    """MoRF and LeRF curves of one sample.

    Parameters
    ----------
    forward: callable
        ``[batch, *inputs.shape] -> [batch]`` explained scores; called without gradients, ``batch_size`` inputs
        at a time (default: all ``2 (steps + 1)`` at once).
    inputs: torch.Tensor
        ``[features, ...]`` one sample; perturbation sets whole rows ``inputs[i]`` to the baseline.
    relevance: torch.Tensor
        ``[features]`` relevance per feature.
    steps, mode, baseline, valid
        Number of steps, ``'flipping'`` or ``'insertion'``, baseline value (broadcast to ``inputs``) and an
        optional ``[features]`` mask of the features that take part.
    """
    batch, fractions = perturbed_inputs(inputs, relevance, steps, mode, baseline, valid)
    size = batch.shape[0] if batch_size is None else batch_size
    with torch.no_grad():
        scores = torch.cat([forward(batch[start:start + size]).detach().flatten()
                            for start in range(0, batch.shape[0], size)]).double().cpu()
    points = len(fractions)
    return Curves(morf=scores[:points], lerf=scores[points:], fractions=fractions, mode=mode)


def mean_sem(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (``std / sqrt(n)``, ``ddof=1``) of the finite values."""
    data = torch.tensor([value for value in values if math.isfinite(value)], dtype=torch.float64)
    if data.numel() == 0:
        return math.nan, math.nan
    if data.numel() == 1:
        return float(data[0]), math.nan
    return float(data.mean()), float(data.std() / math.sqrt(data.numel()))


def evaluate(samples: Iterable[tuple[Callable, torch.Tensor, torch.Tensor]], steps: int = 16,
             mode: str = 'flipping', baseline: float | torch.Tensor = 0.0, batch_size: int | None = None,
             progress: bool = True, total: int | None = None) -> list[Curves]:
    """:py:func:`perturbation_curves` for each ``(forward, inputs, relevance)`` (or
    ``(forward, inputs, relevance, valid)``) of ``samples``, with a tqdm progress bar over the samples."""
    from tqdm.auto import tqdm

    results = []
    for sample in tqdm(samples, total=total, disable=not progress, desc=f'perturbation ({mode})'):
        forward, inputs, relevance, *rest = sample
        results.append(perturbation_curves(forward, inputs, relevance, steps, mode, baseline,
                                           rest[0] if rest else None, batch_size))
    return results


# ------------------------------------------------------------------------------------------------- language models
def token_forward(model: torch.nn.Module, explanation, row: int = 0, model_kwargs: dict | None = None
                  ) -> Callable[[torch.Tensor], torch.Tensor]:
    """``[batch, seq, hidden]`` perturbed word embeddings of ``explanation``'s row ``row`` -> its explained logit
    (same position and target). Where the explained position is the last one and the model takes
    ``logits_to_keep``, only the last position's logits are computed."""
    import inspect

    from ..explain import Task

    mask = None if explanation.attention_mask is None else explanation.attention_mask[row:row + 1]
    task = Task(model, explanation.input_ids[row:row + 1], mask, model_kwargs)
    task.targets = explanation.target[row:row + 1].to(task.embeddings.device)
    task.positions = None if explanation.position is None else explanation.position[row:row + 1].to(
        task.embeddings.device)
    seq = task.input_ids.shape[1]
    last_only = (task.positions is not None and int(task.positions[0]) == seq - 1
                 and 'logits_to_keep' in inspect.signature(model.forward).parameters)

    def forward(embeddings: torch.Tensor) -> torch.Tensor:
        rows = torch.zeros(embeddings.shape[0], dtype=torch.long, device=embeddings.device)
        if last_only:
            scores = task.forward(embeddings, rows, logits_to_keep=1)[:, -1]
            return scores.gather(1, task.targets[rows][:, None].to(scores.device))[:, 0]
        return task.select(task.forward(embeddings, rows), rows)

    from ..explain import _is_causal

    forward.embeddings = task.embeddings[0]
    valid = None if mask is None else (mask[0] != 0).to(task.embeddings.device)
    if task.positions is not None and _is_causal(model):  # later tokens cannot change the explained logit
        before = torch.arange(seq, device=task.embeddings.device) <= task.positions[0]
        valid = before if valid is None else valid & before
    forward.valid = valid
    return forward


def token_curves(model: torch.nn.Module, explanation, steps: int = 16, mode: str = 'flipping',
                 row: int = 0, batch_size: int | None = None, model_kwargs: dict | None = None) -> Curves:
    """Perturbation curves of row ``row`` of an :py:class:`~zennit_attn.explain.Explanation` of a language model:
    whole word-embedding vectors set to 0 (padding never, nor tokens after the explained position of a causal
    model), the explained logit after each step."""
    forward = token_forward(model, explanation, row, model_kwargs)
    return perturbation_curves(forward, forward.embeddings, explanation.relevance[row], steps, mode, 0.0,
                               forward.valid, batch_size)
