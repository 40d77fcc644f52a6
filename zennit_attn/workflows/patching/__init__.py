"""From heatmaps to circuits: relevance patching (RelP: AttnLRP's modified gradient in attribution patching) and
activation patching of the components of a transformer for prompt pairs, the prompt-pair tasks (IOI, subject-verb
agreement) and the circuit view."""

from .components import COMPONENTS, DEFAULT_COMPONENTS, Component, component_points
from .metrics import METRICS, Metric, make_metric
from .scores import (
    DEFAULT_METHOD,
    PATCHING_METHODS,
    PatchingScores,
    activation_patching,
    correlation,
    patching_composite,
    relevance_patching,
)
from .tasks import PromptPair, agreement_pairs, ioi_pairs, load_pairs, pair_ids, save_pairs

__all__ = [
    'COMPONENTS',
    'DEFAULT_COMPONENTS',
    'Component',
    'component_points',
    'METRICS',
    'Metric',
    'make_metric',
    'DEFAULT_METHOD',
    'PATCHING_METHODS',
    'PatchingScores',
    'activation_patching',
    'correlation',
    'patching_composite',
    'relevance_patching',
    'PromptPair',
    'agreement_pairs',
    'ioi_pairs',
    'load_pairs',
    'pair_ids',
    'save_pairs',
]
