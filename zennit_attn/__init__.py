"""zennit-attn: AttnLRP (Achtibat et al., ICML 2024) for transformers, as a plugin for zennit.

The public names (:py:data:`__all__`) are imported on first use (PEP 562): ``import zennit_attn`` loads neither torch
nor transformers, so that the command line's manual (``zennit-attn --help``) is quick; ``from zennit_attn import
explain`` and ``zennit_attn.explain`` import what ``explain`` needs. A submodule is imported on first use as well
(``zennit_attn.methods.registry`` after ``import zennit_attn``).
"""

import importlib
import importlib.util
import sys
import types
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the names as static tools see them; at run time __getattr__ imports them
    from .explain import explain
    from .results.explanation import Explanation, ImageExplanation
    from .results.similarity import SimilarityExplanation
    from .workflows.bilrp import explain_similarity
    from .workflows.dataset import explain_dataset, load_explanations
    from .workflows.diagnostics import ConservationReport, conservation
    from .workflows.generation import GenerationExplanation, explain_generation
    from .workflows.sources import SourceCiter, SourceExplanation, explain_sources

__version__ = '0.1.0'

#: public name -> the submodule that defines it
_NAMES = {
    'explain': 'explain',
    'explain_dataset': 'workflows.dataset',
    'load_explanations': 'workflows.dataset',
    'explain_generation': 'workflows.generation',
    'Explanation': 'results.explanation',
    'ImageExplanation': 'results.explanation',
    'GenerationExplanation': 'workflows.generation',
    'explain_similarity': 'workflows.bilrp',
    'SimilarityExplanation': 'results.similarity',
    'explain_sources': 'workflows.sources',
    'SourceExplanation': 'workflows.sources',
    'SourceCiter': 'workflows.sources',
    'conservation': 'workflows.diagnostics',
    'ConservationReport': 'workflows.diagnostics',
}
__all__ = [
    'explain',
    'explain_dataset',
    'load_explanations',
    'explain_generation',
    'Explanation',
    'ImageExplanation',
    'GenerationExplanation',
    'explain_similarity',
    'SimilarityExplanation',
    'explain_sources',
    'SourceExplanation',
    'SourceCiter',
    'conservation',
    'ConservationReport',
    '__version__',
]


def __getattr__(name: str):
    """A public name, imported from its submodule on first use (then kept here), or a submodule not imported yet."""
    if name in _NAMES:
        value = getattr(importlib.import_module(f'{__name__}.{_NAMES[name]}'), name)
        globals()[name] = value
        return value
    if not name.startswith('_') and importlib.util.find_spec(f'{__name__}.{name}') is not None:
        return importlib.import_module(f'{__name__}.{name}')
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(types.ModuleType):
    """The type of this package's module: importing a submodule binds it to its name in the package (Python does
    so for every submodule), which would make ``zennit_attn.explain`` the module :py:mod:`zennit_attn.explain`
    once anything imported it; a public name that is also a submodule's name (``explain``) stays the public
    object."""

    def __setattr__(self, name, value):
        if _NAMES.get(name) == name and isinstance(value, types.ModuleType) and value.__name__ == f'{__name__}.{name}':
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
