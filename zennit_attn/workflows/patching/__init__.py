"""From heatmaps to circuits: relevance patching (attribution patching with the plain gradient or AttnLRP's modified
gradient, RelP) and activation patching of the components of a transformer for prompt pairs, edge patching between
them, the prompt-pair tasks (IOI, subject-verb agreement) and the circuit view."""

from .components import COMPONENTS, DEFAULT_COMPONENTS, Component, component_points
from .edges import RECEIVERS, EdgeScores, Node, RankedEdge, edge_patching
from .metrics import METRICS, FullLogits, Metric, make_metric
from .scores import (
    DEFAULT_DIRECTION,
    DEFAULT_METHOD,
    DEFAULT_SPAN,
    DEFAULT_STEPS,
    DIRECTIONS,
    PATCHING_METHODS,
    PatchingScores,
    activation_patching,
    correlation,
    patching_composite,
    path_weights,
    relevance_patching,
)
from .tasks import PromptPair, agreement_pairs, ioi_pairs, load_pairs, pair_ids, save_pairs

__all__ = [
    'COMPONENTS',
    'DEFAULT_COMPONENTS',
    'Component',
    'component_points',
    'RECEIVERS',
    'EdgeScores',
    'Node',
    'RankedEdge',
    'edge_patching',
    'METRICS',
    'FullLogits',
    'Metric',
    'make_metric',
    'DEFAULT_DIRECTION',
    'DEFAULT_METHOD',
    'DEFAULT_SPAN',
    'DEFAULT_STEPS',
    'DIRECTIONS',
    'PATCHING_METHODS',
    'PatchingScores',
    'activation_patching',
    'correlation',
    'patching_composite',
    'path_weights',
    'relevance_patching',
    'PromptPair',
    'agreement_pairs',
    'ioi_pairs',
    'load_pairs',
    'pair_ids',
    'save_pairs',
]
