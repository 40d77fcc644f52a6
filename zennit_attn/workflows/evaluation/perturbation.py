"""Input perturbation curves (appendix B.2 of the paper; Samek et al. 2016, Bluecher et al. 2024).

The core is modality-agnostic: a sample is an input tensor whose first dimension indexes the *features* that
are perturbed together (tokens: ``[seq, hidden]`` word embeddings; image patches or pixels: ``[features, ...]``),
one relevance value per feature, and a ``forward`` function mapping a batch ``[batch, *input.shape]`` of
perturbed inputs to the explained score ``[batch]`` (a logit, no softmax). :py:func:`batched_curves` is the one
engine: it batches the perturbed inputs of consecutive samples into shared forward passes.
:py:mod:`zennit_attn.workflows.evaluation.faithfulness` applies it to explanations of language models (tokens) and image
classifiers (pixels or patches, :py:mod:`zennit_attn.workflows.evaluation.pixels`).

Perturbation: ``steps`` equal chunks of the feature order (most-relevant-first, MoRF, or least-relevant-first,
LeRF) are set to the ``baseline`` (default 0) one chunk per step (``'flipping'``), or restored from an all-baseline
input (``'insertion'``); each curve has ``steps + 1`` points, from no change to all features changed, and its area
is the mean of its points. The faithfulness score is ``A_LeRF - A_MoRF`` for flipping and ``A_MoRF - A_LeRF`` for
insertion (larger is better). Ties in relevance keep feature order (stable sort). Equal perturbed inputs are
evaluated once, also across modes: flipping and insertion together cost about one mode's forward passes.

With one baseline, insertion's MoRF inputs (the ``k`` most relevant features restored) are flipping's LeRF inputs
(all but the ``k`` most relevant removed) in reverse order, and insertion's LeRF inputs are flipping's MoRF inputs:
where the step counts are symmetric (``features`` divisible by ``steps``) and the relevance has no ties, both modes
give the same curves reversed, hence the same areas swapped and the same score. They differ only through ties and
uneven steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from ...methods.declarations import positive

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
    ``steps`` is capped at ``features`` (one step where there are none).

    Raises
    ------
    ValueError
        For ``steps`` that is not a positive integer (0 or fewer steps ran as one: a flat curve, a score of 0).
    """
    steps = max(1, min(positive(steps, 'steps'), features))
    return [round(k * features / steps) for k in range(steps + 1)]


def perturbation_masks(
    relevance: torch.Tensor, steps: int, mode: str = 'flipping', valid: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which features are at the baseline in each perturbed input of one sample: ``[2 * (steps + 1), features]``
    booleans, the MoRF curve's inputs first, and the fractions ``[steps + 1]``. Features where ``valid`` is False
    (padding) are never changed."""
    if mode not in MODES:
        raise ValueError(f'mode must be one of {MODES}, got {mode!r}')
    relevance = relevance.detach().flatten()
    if not bool(torch.isfinite(relevance).all()):
        raise ValueError('relevance has non-finite values')
    features = relevance.numel()
    indices = torch.arange(features, device=relevance.device)
    if valid is not None:
        valid = valid.flatten().to(relevance.device).bool()
        if valid.numel() != features:
            raise ValueError(f'{valid.numel()} valid flags for {features} features')
        indices = indices[valid]
    values = relevance[indices].double()
    counts = step_counts(len(indices), steps)
    masks = []
    for order in (indices[torch.argsort(-values, stable=True)], indices[torch.argsort(values, stable=True)]):
        for count in counts:
            changed = torch.zeros(features, dtype=torch.bool, device=relevance.device)
            changed[order[:count]] = True
            if mode == 'insertion':  # start from the baseline, restore the first `count` features of the order
                changed = ~changed if valid is None else ~changed & valid
            masks.append(changed)
    return torch.stack(masks), torch.tensor(counts, dtype=torch.float64) / max(1, len(indices))


def _apply(inputs: torch.Tensor, masks: torch.Tensor, baseline: float | torch.Tensor) -> torch.Tensor:
    """``[len(masks), *inputs.shape]``: ``inputs`` with the features of each mask set to ``baseline``."""
    baseline = torch.as_tensor(baseline, dtype=inputs.dtype, device=inputs.device).expand_as(inputs)
    shape = (masks.shape[0], -1) + (1,) * (inputs.dim() - 1)
    return torch.where(masks.to(inputs.device).view(shape), baseline, inputs)


def perturbed_inputs(
    inputs: torch.Tensor,
    relevance: torch.Tensor,
    steps: int,
    mode: str = 'flipping',
    baseline: float | torch.Tensor = 0.0,
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """All perturbed inputs of one sample: ``[2 * (steps + 1), *inputs.shape]``, the MoRF curve's inputs first,
    and the fractions ``[steps + 1]`` (:py:func:`perturbation_masks` applied to ``inputs``)."""
    if relevance.numel() != inputs.shape[0]:
        raise ValueError(f'{relevance.numel()} relevance values for {inputs.shape[0]} features')
    masks, fractions = perturbation_masks(relevance.to(inputs.device), steps, mode, valid)
    return _apply(inputs, masks, baseline), fractions


@dataclass
class Sample:
    """One sample of :py:func:`batched_curves`: ``inputs`` ``[features, ...]``, ``relevance`` ``[features]`` and an
    optional ``[features]`` mask ``valid`` of the features that take part (others are never changed)."""

    inputs: torch.Tensor
    relevance: torch.Tensor
    valid: torch.Tensor | None = None


def _modes(mode: str | Sequence[str]) -> tuple[str, ...]:
    modes = (mode,) if isinstance(mode, str) else tuple(mode)
    bad = [item for item in modes if item not in MODES]
    if bad or not modes or len(set(modes)) != len(modes):
        raise ValueError(f'mode must be one of {MODES} or a sequence of distinct ones, got {mode!r}')
    return modes


def batched_curves(
    forward: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    samples: Iterable[Sample],
    steps: int = 16,
    mode: str | Sequence[str] = 'flipping',
    baseline: float | torch.Tensor = 0.0,
    batch_size: int | None = None,
    progress: bool = True,
    total: int | None = None,
    desc: str = 'perturbation',
) -> list[Curves] | list[dict[str, Curves]]:
    """MoRF and LeRF curves of every sample, the perturbed inputs of consecutive samples of equal shape batched
    into shared forward passes. Perturbed inputs that are equal (the unperturbed and the fully perturbed input of
    both orders; with several modes, e.g. flipping's LeRF inputs and insertion's MoRF inputs, which keep the same
    most relevant features) are evaluated once: both modes cost about as much as one.

    Parameters
    ----------
    forward: callable
        ``(perturbed [n, *inputs.shape], owners [n]) -> [n]`` explained scores, called without gradients;
        ``owners[i]`` is the index of the sample that perturbed input ``i`` belongs to.
    samples: iterable of Sample
        The samples, in order.
    steps, baseline
        Number of steps and the baseline value (broadcast to the inputs).
    mode: str or sequence of str
        ``'flipping'`` or ``'insertion'``: a list of :py:class:`Curves`; a sequence of modes, e.g.
        ``('flipping', 'insertion')``: a list of ``{mode: Curves}``, from shared forward passes.
    batch_size: int, optional
        Perturbed inputs per forward pass (default: those of one sample).
    progress: bool
        A tqdm progress bar over the samples.
    total, desc
        The bar's length (for iterators) and label.
    """
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f'batch_size must be a positive integer, got {batch_size!r}')
    modes = _modes(mode)
    results: list[dict[str, Curves]] = []
    # per pending sample: (index, unique perturbed inputs, inverse [modes * 2 (steps + 1)], fractions per mode)
    pending: list[tuple[int, torch.Tensor, torch.Tensor, list[torch.Tensor]]] = []

    def flush():
        if not pending:
            return
        batch = torch.cat([variants for _, variants, _, _ in pending])
        owners = torch.cat(
            [torch.full((len(variants),), index, dtype=torch.long) for index, variants, _, _ in pending]
        ).to(batch.device)
        size = batch.shape[0] if batch_size is None else batch_size
        with torch.no_grad():
            scores = (
                torch.cat(
                    [
                        forward(batch[start : start + size], owners[start : start + size]).detach().flatten()
                        for start in range(0, batch.shape[0], size)
                    ]
                )
                .double()
                .cpu()
            )
        offset = 0
        for _, variants, inverse, fractions in pending:
            full = scores[offset : offset + len(variants)][inverse]
            curves, start = {}, 0
            for name, points in zip(modes, fractions):
                count = len(points)
                curves[name] = Curves(
                    morf=full[start : start + count],
                    lerf=full[start + count : start + 2 * count],
                    fractions=points,
                    mode=name,
                )
                start += 2 * count
            results.append(curves)
            offset += len(variants)
        pending.clear()

    with tqdm(total=total, disable=not progress, desc=f'{desc} ({", ".join(modes)})') as bar:
        for index, sample in enumerate(samples):
            if sample.relevance.numel() != sample.inputs.shape[0]:
                raise ValueError(f'{sample.relevance.numel()} relevance values for {sample.inputs.shape[0]} features')
            relevance = sample.relevance.to(sample.inputs.device)
            masks, fractions = zip(*(perturbation_masks(relevance, steps, name, sample.valid) for name in modes))
            unique, inverse = torch.unique(torch.cat(masks), dim=0, return_inverse=True)
            variants = _apply(sample.inputs, unique, baseline)
            if pending and (
                pending[0][1].shape[1:] != variants.shape[1:]
                or batch_size is None
                or sum(len(item[1]) for item in pending) >= batch_size
            ):
                flush()
            pending.append((index, variants, inverse.cpu(), list(fractions)))
            bar.update(1)
        flush()
    return [curves[modes[0]] for curves in results] if isinstance(mode, str) else results


def perturbation_curves(
    forward: Callable[[torch.Tensor], torch.Tensor],
    inputs: torch.Tensor,
    relevance: torch.Tensor,
    steps: int = 16,
    mode: str = 'flipping',
    baseline: float | torch.Tensor = 0.0,
    valid: torch.Tensor | None = None,
    batch_size: int | None = None,
) -> Curves:
    """MoRF and LeRF curves of one sample (:py:func:`batched_curves` of one :py:class:`Sample`).

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
    return batched_curves(
        lambda batch, owners: forward(batch),
        [Sample(inputs, relevance, valid)],
        steps,
        mode,
        baseline,
        batch_size,
        progress=False,
    )[0]


def mean_sem(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (``std / sqrt(n)``, ``ddof=1``) of the finite values."""
    data = torch.tensor([value for value in values if math.isfinite(value)], dtype=torch.float64)
    if data.numel() == 0:
        return math.nan, math.nan
    if data.numel() == 1:
        return float(data[0]), math.nan
    return float(data.mean()), float(data.std() / math.sqrt(data.numel()))


def evaluate(
    samples: Iterable[tuple[Callable, torch.Tensor, torch.Tensor]],
    steps: int = 16,
    mode: str = 'flipping',
    baseline: float | torch.Tensor = 0.0,
    batch_size: int | None = None,
    progress: bool = True,
    total: int | None = None,
) -> list[Curves]:
    """:py:func:`perturbation_curves` for each ``(forward, inputs, relevance)`` (or
    ``(forward, inputs, relevance, valid)``) of ``samples``, each with its own forward function, with a tqdm
    progress bar over the samples."""
    return [
        perturbation_curves(forward, inputs, relevance, steps, mode, baseline, rest[0] if rest else None, batch_size)
        for forward, inputs, relevance, *rest in tqdm(
            samples, total=total, disable=not progress, desc=f'perturbation ({mode})'
        )
    ]


@dataclass
class Faithfulness:
    """Summary of the curves of many samples: mean (and standard error) of the score and of the two areas."""

    score: float
    sem: float
    area_morf: float
    area_lerf: float
    count: int
    curves: list[Curves] = field(repr=False)

    @classmethod
    def of(cls, curves: Sequence[Curves]) -> Faithfulness:
        score, sem = mean_sem([curve.score for curve in curves])
        return cls(
            score=score,
            sem=sem,
            area_morf=mean_sem([c.area_morf for c in curves])[0],
            area_lerf=mean_sem([c.area_lerf for c in curves])[0],
            count=len(curves),
            curves=list(curves),
        )
