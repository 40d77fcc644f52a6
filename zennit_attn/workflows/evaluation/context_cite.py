"""ContextCite (Cohen-Wang, Shah, Georgiev, Madry, NeurIPS 2024) as a baseline of context attribution: its published
algorithm (``context-cite`` 0.0.4, whose sentence splitting needs downloads of spacy and nltk models), written with
scikit-learn's Lasso (the ``baselines`` extra).

The context's sources are removed at random (each kept with probability 0.5, 64 ablations by default, the masks drawn
as the package draws them: :py:func:`~zennit_attn.workflows.evaluation.source_ablation.ablation_masks`); the response's
log-probability is computed for each, turned into its logit ``log p - log(1 - p)`` and divided by the number of
response tokens; a Lasso (alpha 0.01, standardised masks, with intercept) fitted to it gives one weight per source,
rescaled to the masks and multiplied back by the number of tokens. The result, a :py:class:`LassoSurrogate`, is named
for what it holds (formerly ``ContextCite``); its arrays are torch tensors, as the sources' scores of an explanation
are (scikit-learn's Lasso is fitted on NumPy copies).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..statistics import as_values
from .source_ablation import Ablation, ablated, ablation_masks, as_masks

try:
    from sklearn.linear_model import Lasso
    from sklearn.preprocessing import StandardScaler
except ImportError as error:  # an optional extra: named, not skipped
    raise ImportError(
        'ContextCite fits a Lasso with scikit-learn: pip install "zennit-attn[baselines]" (or scikit-learn)'
    ) from error

__all__ = ['LassoSurrogate', 'context_cite', 'fit_lasso', 'response_target', 'TARGETS']

#: What the Lasso is fitted to: the logit of the response's probability (ContextCite's default) or its log-probability.
TARGETS = ('logit_probability', 'log_probability')


@dataclass
class LassoSurrogate:
    """ContextCite's surrogate of one response: what :py:func:`context_cite` returns.

    Attributes
    ----------
    scores: torch.Tensor
        ``[sources]`` float64: the Lasso's weight of each source (ContextCite's attribution scores).
    bias: float
        Its intercept.
    masks: torch.Tensor
        ``[ablations, sources]`` booleans: the ablations it was fitted on (True: kept).
    log_probabilities: torch.Tensor
        ``[ablations, tokens]`` float64: the response tokens' log-probabilities under each.
    forward_passes: int
        The forward passes it took (one per ablation).
    """

    scores: torch.Tensor
    bias: float
    masks: torch.Tensor
    log_probabilities: torch.Tensor
    forward_passes: int


def response_target(log_probabilities, target: str = 'logit_probability') -> torch.Tensor:
    """``[n]`` float64: the response's log-probability (the sum over its tokens of ``[n, tokens]``), or its logit
    ``log p - log(1 - p)``."""
    if target not in TARGETS:
        raise ValueError(f'target must be one of {", ".join(map(repr, TARGETS))}, got {target!r}')
    total = as_values(log_probabilities, 'log_probabilities').sum(-1)
    if target == 'log_probability':
        return total
    return total - torch.log1p(-torch.exp(total.clamp(max=-1e-12)))


def fit_lasso(masks, outputs, tokens: int, alpha: float = 0.01) -> tuple[torch.Tensor, float]:
    """``(weights, bias)`` of ContextCite's solver: a Lasso on the standardised masks, fitted to ``outputs / tokens``,
    its weights rescaled to the masks' scale and multiplied by ``tokens``; the weights ``[sources]`` float64."""
    masks = as_masks(masks).numpy().astype(np.float64)
    scaler = StandardScaler()
    standard = scaler.fit_transform(masks)
    lasso = Lasso(alpha=alpha, random_state=0, fit_intercept=True)
    lasso.fit(standard, as_values(outputs, 'outputs').numpy() / tokens)
    weights = lasso.coef_ / scaler.scale_
    bias = lasso.intercept_ - (scaler.mean_ / scaler.scale_) @ lasso.coef_
    return torch.from_numpy(weights * tokens), float(bias * tokens)


def context_cite(
    ablation: Ablation,
    sources: int,
    ablations: int = 64,
    keep: float = 0.5,
    alpha: float = 0.01,
    seed: int = 0,
    target: str = 'logit_probability',
    progress: bool = True,
) -> LassoSurrogate:
    """ContextCite's scores of the sources: ``ablations`` random ablations, a Lasso fitted to the response's
    (logit-)probability.

    Parameters
    ----------
    ablation: SourceAblation or callable
        ``(masks, progress) -> [n, tokens]`` the response tokens' log-probabilities
        (:py:class:`~zennit_attn.workflows.evaluation.source_ablation.SourceAblation`).
    sources: int
        The number of sources.
    ablations: int
        How many random ablations (ContextCite: 64; the paper also reports 32 to 256).
    keep: float
        The probability that a source is kept in an ablation.
    alpha: float
        The Lasso's regularisation.
    seed: int
        The first ablation's seed (ablation ``i`` uses ``seed + i``).
    target: str
        ``'logit_probability'`` (ContextCite's) or ``'log_probability'``.
    progress: bool
        Show a progress bar over the ablations.

    Returns
    -------
    LassoSurrogate
    """
    if target not in TARGETS:
        raise ValueError(f'target must be one of {", ".join(map(repr, TARGETS))}, got {target!r}')
    masks = ablation_masks(ablations, sources, keep, seed)
    log_probabilities = ablated(ablation, masks, progress)
    weights, bias = fit_lasso(masks, response_target(log_probabilities, target), log_probabilities.shape[-1], alpha)
    return LassoSurrogate(weights, bias, masks, log_probabilities, forward_passes=ablations)
