"""Evaluation of attributions: faithfulness by input perturbation and plausibility against a token mask."""

from .faithfulness import explanation_curves, faithfulness, image_curves, image_faithfulness, token_curves
from .perturbation import (
    MODES,
    Curves,
    Faithfulness,
    Sample,
    batched_curves,
    evaluate,
    mean_sem,
    perturbation_curves,
    perturbation_masks,
    perturbed_inputs,
    step_counts,
)
from .pixels import features_to_images, image_features
from .plausibility import Plausibility, plausibility

__all__ = [
    'Curves',
    'MODES',
    'Sample',
    'batched_curves',
    'evaluate',
    'mean_sem',
    'perturbation_curves',
    'perturbation_masks',
    'perturbed_inputs',
    'step_counts',
    'Faithfulness',
    'explanation_curves',
    'faithfulness',
    'token_curves',
    'image_curves',
    'image_faithfulness',
    'image_features',
    'features_to_images',
    'Plausibility',
    'plausibility',
]
