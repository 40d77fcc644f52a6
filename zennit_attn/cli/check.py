"""``zennit-attn check``: will my model work? Checks whether zennit-attn explains a model's architecture, from its
configuration alone (no weights). The manual, the parser and the checks; the run step is
:py:mod:`zennit_attn.cli.runs.check`, the check itself :py:mod:`zennit_attn.workflows.architecture_check`."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import UsageError
from .library import heavy
from .models import read_config
from .options import Formatter, add_debug

__all__ = [
    'NAME',
    'DESCRIPTION',
    'EPILOG',
    'RULE_METHODS',
    'Architecture',
    'add_parser',
    'resolve_architecture',
    'check',
    'run',
]

NAME = 'check'

DESCRIPTION = """\
Will my model work? Checks whether zennit-attn explains a model's architecture, from its configuration alone.

Builds a tiny random model of the architecture of --model (its configuration with every size shrunk: two layers, a
small vocabulary; its weights are not read) in float64, with every bias and learned position embedding set to zero,
explains its prediction and checks that CP-LRP's relevance at the inputs sums to the explained logit (exact
conservation, which a missed non-linearity breaks) and that AttnLRP runs. Prints the verdict: explained, refused
(naming the operation or the module zennit-attn has no rule for), not built (the tiny model could not be built or run,
and why: a limit of the check, not necessarily of zennit-attn) or failed (a defect of zennit-attn). For an explained
model a last line checks AttnLRP's own rules: with the softmax rule's bias term handed back, its relevance must sum to
the logit too, unless the model adds a constant, spells a softmax otherwise, or feeds an input of zero to the identity
rule in the tiny random model (docs: Rules, where AttnLRP loses relevance).

With --rules, also prints which rule each operation of the tiny model gets, and why (a dry run of one forward pass, no
backward pass): module by module (the layers of a stack merged), the operation, the rule the operation registry
declares for it and what the engine does there (a product's shares of its factors, a normaliser held constant, ...),
and what an explanation would refuse."""

EPILOG = """\
examples:
  zennit-attn check --model ./my-llama
  zennit-attn check --model ./my-llama/config.json
  zennit-attn check --model qwen3_moe
  zennit-attn check --model mamba
  zennit-attn check --model qwen3_next --rules cplrp

docs/supported-models.md lists the verdict for every architecture of the installed transformers.

exit status: 0 explained, 1 refused, not built or failed (or the configuration does not load), 2 a bad argument."""

#: The methods whose rules ``--rules`` prints (their default composites for language models).
RULE_METHODS = ('attnlrp', 'cplrp')
#: A transformers ``model_type`` as ``--model`` may name it (checked against transformers when the command runs).
MODEL_TYPE = re.compile(r'[A-Za-z0-9][A-Za-z0-9_\-]*')


@dataclass(frozen=True)
class Architecture:
    """What ``--model`` of ``check`` names: a Hugging Face model folder (its ``config.json``) or a ``model_type``."""

    folder: Path | None = None
    model_type: str | None = None

    @property
    def label(self) -> str:
        """The model as the printout names it."""
        return str(self.folder) if self.folder is not None else self.model_type


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``check`` command to ``subparsers``; returns its parser."""
    parser = subparsers.add_parser(
        NAME,
        help='will my model work? build a tiny random model of its architecture and check that it is explained',
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=Formatter,
    )
    group = parser.add_argument_group('model')
    group.add_argument(
        '--model',
        required=True,
        metavar='FOLDER_OR_MODEL_TYPE',
        help='a local Hugging Face model folder with config.json (or that file; only the configuration is read), '
        'or a transformers model_type such as llama, qwen3_moe, llava',
    )
    group = parser.add_argument_group('output')
    group.add_argument(
        '--rules',
        nargs='?',
        const='attnlrp',
        choices=RULE_METHODS,
        metavar='METHOD',
        help='also print which rule each operation of the tiny model gets under METHOD '
        f'({", ".join(RULE_METHODS)}; default attnlrp), and why: a dry run, no backward pass',
    )
    group.add_argument('--quiet', '-q', action='store_true', help='no progress messages on stderr')
    add_debug(parser)
    parser.set_defaults(run=run, check=check)
    return parser


def resolve_architecture(value: str) -> Architecture:
    """The architecture ``--model`` names, checked without importing transformers: a folder with ``config.json``
    (or that file; its settings a JSON object), or a name that can be a ``model_type`` and is no file or folder here
    (whether transformers knows it is checked when the command runs).

    Raises
    ------
    UsageError
        For an empty value, a folder without ``config.json``, a file that is not one, an unreadable ``config.json`` or
        a path that does not exist.
    """
    if not value.strip():
        raise UsageError('--model is empty; give a model folder with config.json or a model_type, e.g. llama')
    path = Path(value).expanduser()
    if path.is_file() and path.name == 'config.json':
        path = path.parent
    if path.is_dir():
        if not (path / 'config.json').is_file():
            raise UsageError(f'--model {value!r} is a folder without config.json; give a Hugging Face model folder')
        read_config(path / 'config.json', value)
        return Architecture(folder=path)
    if path.exists():
        raise UsageError(f'--model {value!r} is neither a model folder nor its config.json')
    if MODEL_TYPE.fullmatch(value):
        return Architecture(model_type=value)
    raise UsageError(
        f'--model {value!r}: no such file or folder, and not a model_type (nothing is downloaded); give a model '
        'folder with config.json or a model_type, e.g. llama'
    )


def check(args: argparse.Namespace) -> None:
    """Check the arguments before anything is loaded (:py:class:`~zennit_attn.cli.errors.UsageError`); sets
    ``args.architecture``."""
    args.architecture = resolve_architecture(args.model)


def run(args: argparse.Namespace) -> int:
    """Run ``check`` with checked arguments (:py:func:`zennit_attn.cli.runs.check.run`); returns the exit status."""
    return heavy('.cli.runs.check').run(args)
