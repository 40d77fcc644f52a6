"""Evaluation of attributions: faithfulness by input perturbation and plausibility against a token mask."""
from .perturbation import (
    Curves, MODES, evaluate, mean_sem, perturbation_curves, perturbed_inputs, step_counts, token_curves,
    token_forward,
)
from .plausibility import Plausibility, plausibility

__all__ = [
    'Curves', 'MODES', 'evaluate', 'mean_sem', 'perturbation_curves', 'perturbed_inputs', 'step_counts',
    'token_curves', 'token_forward', 'Plausibility', 'plausibility',
]
