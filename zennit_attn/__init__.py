"""zennit-attn: AttnLRP (Achtibat et al., ICML 2024) for transformers, as a plugin for zennit."""
from .diagnostics import ConservationReport, conservation
from .dataset import explain_dataset, load_explanations
from .explain import explain
from .generation import GenerationExplanation, explain_generation
from .explanation import Explanation, ImageExplanation

__version__ = '0.1.0'
__all__ = ['explain', 'explain_dataset', 'load_explanations', 'explain_generation', 'Explanation', 'ImageExplanation',
           'GenerationExplanation', 'conservation', 'ConservationReport', '__version__']
