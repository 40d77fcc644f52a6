"""``zennit-attn patching``: find the components (residual stream, attention and MLP outputs, heads) that carry a
behaviour, by relevance patching of prompt pairs (IOI, subject-verb agreement or a file of pairs), optionally checked
against activation patching. The manual, the parser and the checks; the run step is
:py:mod:`zennit_attn.cli.runs.patching`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .checks import check_output_option
from .errors import UsageError
from .library import heavy
from .models import check_installed, check_model_options
from .options import Formatter, add_debug, add_model_options

__all__ = [
    'NAME',
    'DESCRIPTION',
    'EPILOG',
    'TASKS',
    'METHODS',
    'COMPONENTS',
    'DIRECTIONS',
    'DEFAULT_DIRECTION',
    'PAIR_FIELDS',
    'add_parser',
    'check',
    'read_pairs_file',
    'run',
]

NAME = 'patching'
#: ``--task`` values: the tasks of :py:mod:`zennit_attn.workflows.patching.tasks`
TASKS = ('ioi', 'ioi_abc', 'agreement', 'agreement_both')
#: ``--method`` values: :py:data:`zennit_attn.workflows.patching.PATCHING_METHODS`
METHODS = ('atp', 'attnlrp', 'relp', 'mlp_rules', 'cplrp')
#: ``--method``, ``--steps``, ``--span`` and ``--path`` defaults:
#: :py:data:`zennit_attn.workflows.patching.DEFAULT_METHOD`, ``DEFAULT_STEPS``, ``DEFAULT_SPAN`` and ``DEFAULT_PATH``
#: (the CLI does not import the library before its arguments are checked)
DEFAULT_METHOD, DEFAULT_STEPS, DEFAULT_SPAN, DEFAULT_PATH = 'atp', 4, 1.0, 'causal'
#: ``--path`` values: :py:data:`zennit_attn.workflows.patching.PATHS`
PATHS = ('causal', 'straight')
#: ``--components`` values: :py:data:`zennit_attn.workflows.patching.COMPONENTS` and TransformerLens's site names
#: that name their layers (:py:data:`zennit_attn.workflows.patching.components.ALIASES`)
COMPONENTS = (
    'residual',
    'resid_mid',
    'attention',
    'heads',
    'attn_out',
    'mlp',
    'neurons',
    'mlp_out',
    'resid_pre',
    'resid_post',
    'z',
    'mlp_post',
)
#: ``--direction`` values and default: :py:data:`zennit_attn.workflows.patching.DIRECTIONS`, ``DEFAULT_DIRECTION``
DIRECTIONS, DEFAULT_DIRECTION = ('noising', 'denoising'), 'noising'
#: the texts of a pair in a ``--pairs-file``: the fields of :py:class:`zennit_attn.workflows.patching.PromptPair` (its
#: ``task`` optional)
PAIR_FIELDS = ('clean', 'corrupted', 'answer', 'wrong')

DESCRIPTION = """\
Find the components of the model that carry a behaviour (a circuit), by relevance patching of prompt pairs.

For each pair of a clean and a corrupted prompt (IOI: "When Mary and John went to the store, John gave a drink to"
-> " Mary", corrupted with a third name; agreement: "The key near the tables" -> " is", corrupted with the plural
subject) it estimates, for every residual stream, attention output, MLP output and head, how much the logit
difference of the right and the wrong answer changes when that component takes its corrupted value: (a' - a) . g,
with g a gradient (atp: the plain gradient; attnlrp: AttnLRP's modified gradient; relp: RelP's rules, constant
attention weights; mlp_rules: AttnLRP's rules in the MLP, the plain gradient elsewhere; cplrp) averaged over --steps
points between the clean and the corrupted prompt, one forward and backward pass each (--steps 1: the clean run
alone, AtP and RelP); --span 0.5 stops the points halfway (closer to activation patching for heads, further for
residual streams and MLP outputs); --path causal (default) takes a component's points on the path that moves the
tokens up to its position only (one path per changed position).
Prints the top components; --reference also runs activation patching (one forward pass per component and position:
slow) and prints the correlation per component type. ioi_abc: IOI with all three names replaced in the corrupted
prompt; agreement_both: the subject's and the attractor's number flipped."""

EPILOG = """\
examples:
  zennit-attn patching --task ioi --pairs 16 --output ioi.html
  zennit-attn patching --task agreement --pairs 8 --reference --output agreement.png
  zennit-attn patching --pairs-file pairs.json --method attnlrp --steps 1
  zennit-attn patching --task ioi --pairs 8 --edges 20 --output ioi.png

A pairs file is a JSON list of {"clean", "corrupted", "answer", "wrong"} (answers one token each, each corrupted
prompt as long as its clean one in tokens). In Python: zennit_attn.workflows.patching.

exit status: 0 done, 1 the run failed, 2 a bad argument (reported before the model is loaded)."""


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``patching`` command to ``subparsers``; returns its parser."""
    parser = subparsers.add_parser(
        NAME,
        help='find the components (heads, MLPs, residual streams) of a behaviour by relevance patching',
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=Formatter,
    )
    group = parser.add_argument_group('prompt pairs')
    group.add_argument('--task', choices=TASKS, default='ioi', help='the task of the pairs (default: %(default)s)')
    group.add_argument(
        '--pairs', type=int, default=16, metavar='N', help='the first N pairs of the task (default: %(default)s)'
    )
    group.add_argument('--seed', type=int, default=0, help='the seed of the task generator (default: %(default)s)')
    group.add_argument(
        '--pairs-file', type=Path, default=None, metavar='FILE.json', help='read the pairs from FILE.json instead'
    )
    group = parser.add_argument_group('patching')
    group.add_argument(
        '--method', choices=METHODS, default=DEFAULT_METHOD, help='the gradient of the estimate (default: %(default)s)'
    )
    group.add_argument(
        '--steps',
        type=int,
        default=DEFAULT_STEPS,
        metavar='N',
        help='points of the path from the clean to the corrupted prompt (default: %(default)s)',
    )
    group.add_argument(
        '--span',
        type=float,
        default=DEFAULT_SPAN,
        metavar='S',
        help='how far the points go towards the corrupted prompt, in (0, 1] (default: %(default)s)',
    )
    group.add_argument(
        '--path',
        choices=PATHS,
        default=DEFAULT_PATH,
        help='causal: one path per changed position, the tokens up to it moving; straight: every changed token moving '
        'at once (default: %(default)s)',
    )
    group.add_argument(
        '--components',
        nargs='+',
        choices=COMPONENTS,
        default=['residual', 'attention', 'heads', 'mlp'],
        help="the components scored (default: residual attention heads mlp); TransformerLens's names: resid_pre, "
        'resid_mid, resid_post, attn_out, z (per head), mlp_out, mlp_post',
    )
    group.add_argument(
        '--direction',
        choices=DIRECTIONS,
        default=DEFAULT_DIRECTION,
        help='noising: the corrupted activations into the clean run; denoising: the clean activations into the '
        'corrupted run (default: %(default)s)',
    )
    group.add_argument('--top', type=int, default=10, metavar='K', help='list the K top components (default: 10)')
    group.add_argument(
        '--edges',
        type=int,
        default=0,
        metavar='K',
        help="also score the edges between heads, MLPs and the heads' queries, keys and values and list the K top "
        'ones (with --output: their graph in FILE-edges.html or .png)',
    )
    group.add_argument(
        '--reference', action='store_true', help='also run activation patching and print the correlations'
    )
    group = parser.add_argument_group('output')
    group.add_argument(
        '--output', type=Path, default=None, metavar='FILE', help='write the circuit view to FILE (.html or .png)'
    )
    group.add_argument('--quiet', '-q', action='store_true', help='no progress messages on stderr')
    add_model_options(parser)
    add_debug(parser)
    parser.set_defaults(run=run, check=check)
    return parser


def check(args: argparse.Namespace) -> None:
    """Check the arguments before anything is loaded (:py:class:`~zennit_attn.cli.errors.UsageError`)."""
    if args.pairs < 1:
        raise UsageError(f'--pairs must be at least 1, got {args.pairs}')
    if args.top < 1:
        raise UsageError(f'--top must be at least 1, got {args.top}')
    if args.edges < 0:
        raise UsageError(f'--edges must be at least 0, got {args.edges}')
    if args.steps < 1:
        raise UsageError(f'--steps must be at least 1, got {args.steps}')
    if not 0 < args.span <= 1:
        raise UsageError(f'--span must be in (0, 1], got {args.span}')
    args.pair_entries = None if args.pairs_file is None else read_pairs_file(args.pairs_file)
    if len(set(args.components)) != len(args.components):
        raise UsageError(f'--components names a component twice: {" ".join(args.components)}')
    check_model_options(args)
    args.output = check_output_option(args.output, '--output', ('.html', '.png'))
    check_installed(args.model_spec)


def read_pairs_file(path: Path) -> list[dict]:
    """The pairs of a ``--pairs-file``: a JSON list of objects with the texts :py:data:`PAIR_FIELDS` (and optionally
    a ``task`` name), checked before the model is loaded (:py:class:`~zennit_attn.cli.errors.UsageError`, exit 2)."""
    if not path.is_file():
        raise UsageError(f'--pairs-file {str(path)!r} is not a file')
    try:
        entries = json.loads(path.read_text(encoding='utf-8'))
    except (OSError, ValueError) as error:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise UsageError(f'--pairs-file {str(path)!r} is not JSON ({error})') from None
    expected = f'a JSON list of {{{", ".join(map(repr, PAIR_FIELDS))}}} objects (texts)'
    if not isinstance(entries, list) or not entries:
        raise UsageError(f'--pairs-file {str(path)!r} holds {type(entries).__name__} {entries!r:.60}, not {expected}')
    for index, entry in enumerate(entries):
        texts = isinstance(entry, dict) and all(isinstance(entry.get(key), str) for key in PAIR_FIELDS)
        if not texts or not isinstance(entry.get('task', ''), str):
            raise UsageError(f'--pairs-file {str(path)!r}: pair {index} ({entry!r:.60}) is not one of {expected}')
    return entries


def run(args: argparse.Namespace) -> int:
    """Run ``patching`` with checked arguments (:py:func:`zennit_attn.cli.runs.patching.run`); returns the exit
    status."""
    return heavy('.cli.runs.patching').run(args)
