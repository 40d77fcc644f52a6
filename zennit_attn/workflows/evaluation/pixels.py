"""The pixel adapter of the perturbation metric: an image as the features that are perturbed together.

The features are single pixels (all channels of a pixel, ``patch_size=1``) or non-overlapping ``p x p`` patches; a
feature's relevance is the sum of its pixels' relevance (over channels). The curves themselves come from the one
engine, :py:func:`~zennit_attn.workflows.evaluation.perturbation.batched_curves`, through
:py:func:`~zennit_attn.workflows.evaluation.faithfulness.explanation_curves`.
"""

from __future__ import annotations

import torch

__all__ = ['image_features', 'features_to_images']


def image_features(
    pixels: torch.Tensor, relevance: torch.Tensor, patch_size: int = 1
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
    features = (
        pixels.reshape(channels, height // p, p, width // p, p).permute(1, 3, 0, 2, 4).reshape(-1, channels, p, p)
    )
    values = relevance.double().reshape(height // p, p, width // p, p).sum((1, 3)).flatten()
    return features, values


def features_to_images(features: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Inverse of :py:func:`image_features` for a batch: ``[m, features, C, p, p] -> [m, C, H, W]``."""
    m, _, channels, p, _ = features.shape
    return (
        features.reshape(m, height // p, width // p, channels, p, p)
        .permute(0, 3, 1, 4, 2, 5)
        .reshape(m, channels, height, width)
    )
