"""Context attribution evaluated by ablating sources (ContextCite's metrics): the top-k log-probability drop and the
linear datamodeling score (LDS), for any scores of the sources.

A :py:class:`SourceAblation` computes the response's log-probability with some sources of the prompt removed
(:py:class:`~zennit_attn.workflows.sources.SourcePrompt`); anything with its call (``masks -> [n, tokens]`` per-token
log-probabilities) can stand in for it (a toy in the tests). :py:func:`top_k_drop` removes the ``k`` highest-scored
sources and measures how much the response's log-probability falls; :py:func:`lds` is the Spearman rank correlation of
a scorer's linear prediction (the sum of the kept sources' scores) with the log-probabilities under random ablations
(:py:func:`ablation_masks`, held out from what a surrogate was fitted on).

Every array here is a torch tensor on the CPU, as the sources' scores are
(:py:attr:`~zennit_attn.workflows.sources.SourceExplanation.scores`): masks are boolean ``[ablations, sources]``,
scores and log-probabilities float64; the functions take any array-like (tensors, NumPy arrays, lists).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from ...core.devices import input_device
from ..sources import SourcePrompt
from ..statistics import as_values, spearman

__all__ = [
    'SourceAblation',
    'ablation_masks',
    'ablated',
    'as_masks',
    'check_masks',
    'top_k_drop',
    'lds',
    'spearman',
    'TOP_K',
]

#: The ``k`` of the top-k log-probability drop (ContextCite's).
TOP_K = (1, 3, 5)

#: ``(masks, progress) -> [n, tokens]`` the response tokens' log-probabilities under each row of the masks
Ablation = Callable[..., torch.Tensor]


class SourceAblation:
    """The response's per-token log-probabilities with some sources of the prompt left out, one forward pass per
    ablation (counted in :py:attr:`forward_passes`).

    Parameters
    ----------
    model: torch.nn.Module
        A decoder-only language model in eval mode.
    prompt: SourcePrompt
    response_ids: sequence of int
        The response's ids after the prompt (``SourcePrompt.response_ids``).
    """

    def __init__(self, model: torch.nn.Module, prompt: SourcePrompt, response_ids: Sequence[int]):
        self.model = model
        self.prompt = prompt
        self.response_ids = [int(token) for token in response_ids]
        if not self.response_ids:
            raise ValueError('the response has no tokens: nothing to ablate for')
        self.forward_passes = 0
        self._keep = 'logits_to_keep' in inspect.signature(model.forward).parameters

    @property
    def sources(self) -> int:
        """The number of sources."""
        return len(self.prompt.spans)

    def log_probabilities(self, keep: Sequence[bool]) -> torch.Tensor:
        """``[tokens]`` float64: each response token's log-probability with the sources where ``keep`` is True."""
        ids = self.prompt.ids([bool(kept) for kept in keep]) + self.response_ids
        count = len(self.response_ids)
        kwargs = {'logits_to_keep': count + 1} if self._keep else {}
        with torch.no_grad():
            logits = self.model(torch.tensor([ids], device=input_device(self.model)), **kwargs).logits[0]
        self.forward_passes += 1
        logits = logits[-count - 1 : -1].to(torch.float64).log_softmax(-1)
        return logits.gather(-1, torch.tensor(self.response_ids, device=logits.device)[:, None])[:, 0].cpu()

    def __call__(self, masks, progress: bool = False) -> torch.Tensor:
        """``[n, tokens]`` float64: the per-token log-probabilities for every row of the ``[n, sources]`` boolean
        ``masks`` (True: kept); ``progress`` shows a progress bar."""
        masks = check_masks(masks, self.sources)
        rows = tqdm(masks.tolist(), desc='ablations', disable=not progress, leave=False)
        return torch.stack([self.log_probabilities(row) for row in rows])


def as_masks(masks) -> torch.Tensor:
    """``masks`` (a tensor, a NumPy array or nested sequences) as a boolean tensor on the CPU (True: kept)."""
    if isinstance(masks, torch.Tensor):
        return masks.detach().to('cpu', torch.bool)
    return torch.as_tensor(np.asarray(masks, dtype=bool))


def check_masks(masks, sources: int) -> torch.Tensor:
    """``masks`` as an ``[n, sources]`` boolean tensor (:py:func:`as_masks`), refused for another shape."""
    masks = as_masks(masks)
    if masks.ndim != 2 or masks.shape[1] != sources:
        raise ValueError(
            f'masks must be [ablations, {sources}] (one column per source), got shape {tuple(masks.shape)}'
        )
    return masks


def ablation_masks(count: int, sources: int, keep: float = 0.5, seed: int = 0) -> torch.Tensor:
    """``[count, sources]`` boolean random masks as ContextCite draws them: row ``i`` from
    ``numpy.random.RandomState(seed + i)``, each source kept with probability ``keep``."""
    if not 0 < keep < 1:
        raise ValueError(f'keep must be a probability in (0, 1), got {keep}')
    if count < 1 or sources < 1:
        raise ValueError(f'need at least one ablation and one source, got {count} and {sources}')
    rows = [
        np.random.RandomState(seed + index).choice([False, True], size=sources, p=[1 - keep, keep])
        for index in range(count)
    ]
    return torch.from_numpy(np.stack(rows))


def ablated(ablation: Ablation, masks: torch.Tensor, progress: bool = False) -> torch.Tensor:
    """``[n, tokens]`` float64: what ``ablation`` gives for ``masks`` (a tensor, or what a callable of the user's
    returns: an array or nested sequences); ``progress`` is passed only where True (a callable of the user's may not
    take it)."""
    found = ablation(masks, progress=progress) if progress else ablation(masks)
    return as_values(found, 'the log-probabilities of an ablation')


def _scores(scores, sources: int) -> torch.Tensor:
    values = as_values(scores.scores if hasattr(scores, 'scores') else scores, 'scores')
    if values.shape != (sources,):
        raise ValueError(f'scores must hold one value per source ({sources}), got shape {tuple(values.shape)}')
    return values


def top_k_drop(
    ablation: Ablation, scores, sources: int, ks: Sequence[int] = TOP_K, full: float | None = None
) -> dict[int, float]:
    """How much the response's log-probability falls when the ``k`` highest-scored sources are removed.

    Parameters
    ----------
    ablation: SourceAblation or callable
        ``masks -> [n, tokens]`` per-token log-probabilities.
    scores: tensor, array-like or SourceExplanation
        ``[sources]`` one score per source (ties: the earlier source first).
    sources: int
        The number of sources.
    ks: sequence of int
        The ``k`` (at most the number of sources).
    full: float, optional
        The response's log-probability with every source (computed when None: one more forward pass).

    Returns
    -------
    dict
        ``{k: log p(full) - log p(without the top k)}``.
    """
    values = _scores(scores, sources)
    ks = [int(k) for k in ks]
    if any(k < 1 or k > sources for k in ks):
        raise ValueError(f'every k must be between 1 and the number of sources ({sources}), got {ks}')
    order = torch.argsort(-values, stable=True)
    masks = torch.ones((len(ks) + (full is None), sources), dtype=torch.bool)
    for row, k in enumerate(ks):
        masks[row, order[:k]] = False
    totals = ablated(ablation, masks).sum(-1)
    full = float(totals[-1]) if full is None else float(full)
    return {k: full - float(total) for k, total in zip(ks, totals)}


def lds(scores, masks, log_probabilities) -> float:
    """The linear datamodeling score: the Spearman rank correlation between the scorer's linear prediction for each
    ablation (the sum of the kept sources' scores) and the response's actual log-probability under it.

    Parameters
    ----------
    scores: tensor, array-like or SourceExplanation
        ``[sources]``.
    masks: tensor or array-like
        ``[n, sources]`` held-out ablations (True: kept), e.g. :py:func:`ablation_masks` with another seed.
    log_probabilities: tensor or array-like
        ``[n]`` the response's log-probability under each, or ``[n, tokens]`` per token (summed).
    """
    masks = as_masks(masks)
    if masks.ndim != 2:
        raise ValueError(f'masks must be [ablations, sources], got shape {tuple(masks.shape)}')
    values = _scores(scores, masks.shape[1])
    actual = as_values(log_probabilities, 'log_probabilities')
    actual = actual.sum(-1) if actual.ndim == 2 else actual
    if actual.shape != (masks.shape[0],):
        raise ValueError(f'need one log-probability per ablation ({masks.shape[0]}), got shape {tuple(actual.shape)}')
    return spearman(masks.to(torch.float64) @ values, actual)
