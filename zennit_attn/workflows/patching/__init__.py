"""From heatmaps to circuits: relevance patching (attribution patching with the plain gradient or AttnLRP's modified
gradient, RelP) and activation patching of the components of a transformer for prompt pairs, edge patching between
them, the prompt-pair tasks (IOI, subject-verb agreement) and the circuit view."""

from .components import COMPONENTS, DEFAULT_COMPONENTS, Component, component_points
from .edges import RECEIVERS, EdgeScores, Node, RankedEdge, edge_patching
from .metrics import METRICS, FullLogits, Metric, make_metric
from .paths import DEFAULT_PATH, DEFAULT_SPAN, DEFAULT_STEPS, PATHS, path_weights
from .scores import (
    DEFAULT_DIRECTION,
    DEFAULT_METHOD,
    DIRECTIONS,
    PATCHING_METHODS,
    PatchingScores,
    activation_patching,
    correlation,
    patching_composite,
    relevance_patching,
)
from .tasks import (
    TASKS,
    PromptPair,
    agreement_pairs,
    by_template,
    ioi_pairs,
    load_pairs,
    pair_ids,
    save_pairs,
    task_pairs,
)

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
    'DEFAULT_PATH',
    'PATHS',
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
    'by_template',
    'ioi_pairs',
    'load_pairs',
    'pair_ids',
    'save_pairs',
    'TASKS',
    'task_pairs',
]
