"""Pixel faithfulness of image explanations: the perturbation metric of :py:mod:`.perturbation` for images.

The features that are perturbed together are single pixels (all channels of a pixel, ``patch_size=1``) or
non-overlapping ``p x p`` patches; a feature's relevance is the sum of its pixels' relevance (over channels).
MoRF / LeRF curves of the explained logit, their areas and the score (``A_LeRF - A_MoRF`` for flipping,
``A_MoRF - A_LeRF`` for insertion; larger is better) are those of
:py:func:`~zennit_attn.evaluation.perturbation.perturbation_curves`; here the perturbed images of several samples
are batched into one forward pass, with a tqdm progress bar over the samples.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .perturbation import Curves, mean_sem, perturbed_inputs

__all__ = ['image_features', 'features_to_images', 'image_curves', 'image_faithfulness', 'Faithfulness']


def image_features(pixels: torch.Tensor, relevance: torch.Tensor, patch_size: int = 1
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Split one image into features: ``([features, C, p, p], [features])`` (row-major patches) and their
    relevance (summed over the patch and the channels).

    Parameters
    ----------
    pixels: torch.Tensor
        ``[C, H, W]``.
    relevance: torch.Tensor
        ``[H, W]`` or ``[C, H, W]``.
    patch_size: int
        Side of the square features; must divide ``H`` and ``W``.
    """
    channels, height, width = pixels.shape
    p = int(patch_size)
    if p < 1 or height % p or width % p:
        raise ValueError(f'patch_size {patch_size} must divide the image size {height} x {width}')
    relevance = relevance.detach().to(pixels.device)
    if relevance.dim() == 3:
        relevance = relevance.sum(0)
    if relevance.shape != (height, width):
        raise ValueError(f'relevance {tuple(relevance.shape)} does not match the image {height} x {width}')
    features = pixels.reshape(channels, height // p, p, width // p, p).permute(1, 3, 0, 2, 4).reshape(-1, channels, p, p)
    values = relevance.double().reshape(height // p, p, width // p, p).sum((1, 3)).flatten()
    return features, values


def features_to_images(features: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Inverse of :py:func:`image_features` for a batch: ``[m, features, C, p, p] -> [m, C, H, W]``."""
    m, _, channels, p, _ = features.shape
    return features.reshape(m, height // p, width // p, channels, p, p).permute(0, 3, 1, 4, 2, 5).reshape(
        m, channels, height, width)


def image_curves(model: torch.nn.Module, pixels: torch.Tensor, relevance: torch.Tensor, target: torch.Tensor,
                 steps: int = 16, mode: str = 'flipping', patch_size: int = 1, baseline: float = 0.0,
                 batch_size: int = 256, progress: bool = True) -> list[Curves]:
    """MoRF and LeRF curves of each image.

    Parameters
    ----------
    model: torch.nn.Module
        The classifier in eval mode (returns logits or an output with ``logits``).
    pixels: torch.Tensor
        ``[batch, C, H, W]`` the explained images.
    relevance: torch.Tensor
        ``[batch, H, W]`` or ``[batch, C, H, W]``.
    target: torch.Tensor
        ``[batch]`` the explained class of each image (its logit is the curve's score).
    steps, mode, baseline
        As for :py:func:`~zennit_attn.evaluation.perturbation.perturbation_curves`.
    patch_size: int
        1 perturbs single pixels, ``p`` perturbs ``p x p`` patches.
    batch_size: int
        Perturbed images per forward pass (the ``2 (steps + 1)`` images of several samples are batched).
    progress: bool
        Show a tqdm progress bar over the samples.
    """
    from tqdm.auto import tqdm

    from ..images import image_logits

    if pixels.dim() != 4:
        raise ValueError(f'pixels must be [batch, C, H, W], got {tuple(pixels.shape)}')
    batch, _, height, width = pixels.shape
    target = torch.as_tensor(target, device=pixels.device).long().flatten().expand(batch)
    per_sample = 2 * (min(steps, (height // patch_size) * (width // patch_size)) + 1)
    chunk = max(1, batch_size // per_sample)
    results: list[Curves] = []
    with tqdm(total=batch, disable=not progress, desc=f'pixel perturbation ({mode})') as bar:
        for start in range(0, batch, chunk):
            images, fractions = [], []
            rows = range(start, min(start + chunk, batch))
            for row in rows:
                features, values = image_features(pixels[row], relevance[row], patch_size)
                variants, fraction = perturbed_inputs(features, values, steps, mode, baseline)
                images.append(features_to_images(variants, height, width))
                fractions.append(fraction)
            images = torch.cat(images)
            labels = torch.cat([target[row].expand(len(fraction) * 2) for row, fraction in zip(rows, fractions)])
            with torch.no_grad():
                scores = torch.cat([
                    image_logits(model(images[i:i + batch_size])).gather(
                        1, labels[i:i + batch_size, None].to(pixels.device))[:, 0]
                    for i in range(0, images.shape[0], batch_size)
                ]).double().cpu()
            offset = 0
            for fraction in fractions:
                points = len(fraction)
                results.append(Curves(morf=scores[offset:offset + points], lerf=scores[offset + points:offset + 2 * points],
                                      fractions=fraction, mode=mode))
                offset += 2 * points
            bar.update(len(rows))
    return results


@dataclass
class Faithfulness:
    """Summary of the curves of many images: mean (and standard error) of the score and the two areas."""
    score: float
    sem: float
    area_morf: float
    area_lerf: float
    count: int
    curves: list[Curves]

    @classmethod
    def of(cls, curves: Sequence[Curves]) -> 'Faithfulness':
        score, sem = mean_sem([curve.score for curve in curves])
        return cls(score=score, sem=sem, area_morf=mean_sem([c.area_morf for c in curves])[0],
                   area_lerf=mean_sem([c.area_lerf for c in curves])[0], count=len(curves), curves=list(curves))


def image_faithfulness(model: torch.nn.Module, explanation, steps: int = 16, mode: str = 'flipping',
                       patch_size: int = 1, baseline: float = 0.0, batch_size: int = 256,
                       progress: bool = True) -> Faithfulness:
    """:py:func:`image_curves` of an :py:class:`~zennit_attn.images.ImageExplanation` (its pixels, relevance and
    targets), summarised."""
    curves = image_curves(model, explanation.pixels, explanation.relevance, explanation.target, steps, mode,
                          patch_size, baseline, batch_size, progress)
    return Faithfulness.of(curves)
