"""Plausibility against a ground-truth token mask (the paper's SQuAD v2 protocol, section 4.2).

- top-1 accuracy: whether the most relevant token lies inside the mask (where several tokens share the largest
  relevance, the share of them inside the mask: the expected hit of a tie broken at random, not the first one's);
- IoU between the positive relevance and the mask, as a soft IoU: the positive relevance is scaled to a maximum
  of 1 and ``IoU = sum(min(r, m)) / sum(max(r, m))`` (the paper does not define how its continuous relevance is
  compared with the binary mask; the soft IoU needs no threshold and equals the plain IoU for binary relevance).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Plausibility:
    """Top-1 hit (1.0 or 0.0; for tied largest relevance the share of the tied tokens in the mask) and soft IoU of one
    sample."""

    top1: float
    iou: float


def plausibility(relevance: torch.Tensor, mask: torch.Tensor, valid: torch.Tensor | None = None) -> Plausibility:
    """Top-1 hit and soft IoU of ``relevance`` against the boolean ``mask`` (same shape); positions where ``valid``
    is False (padding, or tokens not to be scored) take no part.

    Raises
    ------
    ValueError
        If the shapes differ, the mask selects no (valid) token, or a scored relevance is not finite (NaN or
        infinite: the most relevant token and the scaling to a maximum of 1 are then undefined).
    """
    relevance = relevance.detach().flatten().double().cpu()
    mask = mask.flatten().bool().cpu()
    if relevance.shape != mask.shape:
        raise ValueError(f'relevance {tuple(relevance.shape)} and mask {tuple(mask.shape)} differ')
    if valid is not None:
        keep = valid.flatten().bool().cpu()
        relevance, mask = relevance[keep], mask[keep]
    if not bool(mask.any()):
        raise ValueError('the mask selects no token')
    bad = (~relevance.isfinite()).nonzero()[:, 0].tolist()
    if bad:
        raise ValueError(
            f'the relevance is not finite (NaN or infinite) at {len(bad)} scored position(s), first {bad[0]}: '
            'the most relevant token and the IoU are undefined; check the explanation (e.g. its conservation '
            'report) or leave those positions out with valid='
        )
    top1 = float(mask[relevance == relevance.max()].double().mean())  # ties: not the first one's hit
    positive = relevance.clamp(min=0)
    peak = float(positive.max())
    scaled = positive / peak if peak > 0 else positive
    truth = mask.double()
    iou = float(torch.minimum(scaled, truth).sum() / torch.maximum(scaled, truth).sum())
    return Plausibility(top1=top1, iou=iou)
