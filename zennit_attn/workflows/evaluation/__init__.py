"""Evaluation of attributions: faithfulness by input perturbation, agreement with leave-one-out, implementation
invariance, and plausibility against a token mask."""

from .faithfulness import (
    explained_task,
    explanation_curves,
    faithfulness,
    image_curves,
    image_faithfulness,
    token_curves,
)
from .invariance import INVARIANCE_METHODS, REWRITES, Invariance, implementation_invariance
from .leave_one_out import LOO_MODES, Agreement, LeaveOneOutAgreement, TokenDrops, leave_one_out, token_drops
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
    'explained_task',
    'LOO_MODES',
    'REWRITES',
    'INVARIANCE_METHODS',
    'Invariance',
    'implementation_invariance',
    'Agreement',
    'LeaveOneOutAgreement',
    'TokenDrops',
    'leave_one_out',
    'token_drops',
    'Plausibility',
    'plausibility',
]
