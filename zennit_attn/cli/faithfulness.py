"""``zennit-attn faithfulness``: score the explanations that ``explain-dataset`` wrote by input perturbation
(flipping, insertion). The manual, the parser and the checks; the run step is
:py:mod:`zennit_attn.cli.runs.faithfulness`."""

from __future__ import annotations

import argparse
from pathlib import Path

from .checks import check_output_option
from .errors import UsageError
from .library import INDEX_FILE, heavy
from .models import check_installed, check_model_options
from .options import Formatter, add_debug, add_model_options

__all__ = ['NAME', 'DESCRIPTION', 'EPILOG', 'MODES', 'add_parser', 'check', 'run']

NAME = 'faithfulness'
#: ``--mode`` values
MODES = ('flipping', 'insertion')

DESCRIPTION = """\
Measure how faithful the explanations of a dataset are (the paper's input perturbation metric, appendix B.2).

Reads the explanations that explain-dataset wrote to DIR and, for each text, sets the word embeddings of its tokens
to 0 in STEPS steps, most relevant first (MoRF) and least relevant first (LeRF), recording the explained logit
(flipping); or restores them from 0 in both orders (insertion). Prints per mode the score (flipping: A_LeRF - A_MoRF,
insertion: A_MoRF - A_LeRF; larger is more faithful) as mean +- standard error over the texts, and the mean areas.
Both modes come from shared forward passes. The model must be the one the explanations were made with (checked)."""

EPILOG = """\
examples:
  zennit-attn explain-dataset --input articles.jsonl --output attnlrp/
  zennit-attn faithfulness --explanations attnlrp/
  zennit-attn faithfulness --explanations attnlrp/ --mode flipping --steps 32 --csv attnlrp.csv

exit status: 0 done, 1 the run failed, 2 a bad argument (reported before the model is loaded)."""


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``faithfulness`` command to ``subparsers``; returns its parser."""
    parser = subparsers.add_parser(
        NAME,
        help='score the explanations of explain-dataset by input perturbation (flipping, insertion)',
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=Formatter,
    )
    group = parser.add_argument_group('input and output')
    group.add_argument(
        '--explanations', metavar='DIR', type=Path, required=True, help='a finished explain-dataset output folder'
    )
    group.add_argument(
        '--csv',
        metavar='FILE.csv',
        type=Path,
        default=None,
        help='also write one row per text and mode (score, areas, both curves) to FILE.csv; missing '
        'folders are created',
    )
    group.add_argument('--quiet', '-q', action='store_true', help='no progress messages or bar on stderr')
    group = parser.add_argument_group('metric')
    group.add_argument(
        '--steps', type=int, default=16, metavar='N', help='perturbation steps per curve (default: %(default)s)'
    )
    group.add_argument(
        '--mode', nargs='+', choices=MODES, default=list(MODES), help='flipping, insertion or both (default: both)'
    )
    group.add_argument(
        '--batch-size',
        type=int,
        default=None,
        metavar='N',
        help='perturbed inputs per forward pass (default: those of one text, 2 x (steps + 1))',
    )
    add_model_options(parser)
    add_debug(parser)
    parser.set_defaults(run=run, check=check)
    return parser


def check(args: argparse.Namespace) -> None:
    """Check the arguments before anything is loaded (:py:class:`~zennit_attn.cli.errors.UsageError`), ``--csv``
    included, so that a table that cannot be written is refused before the scoring."""
    if not (args.explanations / INDEX_FILE).is_file():
        raise UsageError(
            f'--explanations {str(args.explanations)!r} is not a finished explain-dataset output (no '
            f'{INDEX_FILE}; run explain-dataset on it again to finish it)'
        )
    if args.steps < 1:
        raise UsageError(f'--steps must be at least 1, got {args.steps}')
    if args.batch_size is not None and args.batch_size < 1:
        raise UsageError(f'--batch-size must be at least 1, got {args.batch_size}')
    if len(set(args.mode)) != len(args.mode):
        raise UsageError(f'--mode names a mode twice: {" ".join(args.mode)}')
    check_model_options(args)
    args.csv = check_output_option(args.csv, '--csv', ('.csv',))
    check_installed(args.model_spec)


def run(args: argparse.Namespace) -> int:
    """Run ``faithfulness`` with checked arguments (:py:func:`zennit_attn.cli.runs.faithfulness.run`); returns the
    exit status."""
    return heavy('.cli.runs.faithfulness').run(args)
