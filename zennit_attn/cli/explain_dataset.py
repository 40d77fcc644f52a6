"""``zennit-attn explain-dataset``: explain every text of a ``.jsonl`` file into a folder of safetensors shards
(resumable, several processes under torchrun). The manual, the parser and the checks; the run step is
:py:mod:`zennit_attn.cli.runs.explain_dataset`."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..methods.declarations import DECLARATIONS
from .checks import check_method, check_method_for_model, check_param_values, parse_target
from .errors import UsageError, one_line
from .library import heavy
from .models import check_installed, check_model_options
from .options import Formatter, add_debug, add_method_options, add_model_options, add_target_option

__all__ = ['NAME', 'DESCRIPTION', 'EPILOG', 'add_parser', 'check', 'run']

NAME = 'explain-dataset'

DESCRIPTION = """\
Explain every text of a dataset and write the explanations to a folder.

Reads FILE.jsonl (one JSON object per line with a "text" field), explains each text's prediction at its last token
with METHOD (default AttnLRP) for TARGET (default: the predicted next token), BATCH texts at a time, sorted by length
(little padding), and writes the results as safetensors shards with a JSON index as they are done. Running it again
on the same folder resumes: finished shards are skipped; a folder made with other settings is refused. Under
torchrun / accelerate launch the processes share the shards (gloo on CPU, nccl on GPUs). Read the results in Python
with zennit_attn.load_explanations(DIR)."""

EPILOG = """\
examples:
  zennit-attn explain-dataset --input articles.jsonl --output explanations/
  zennit-attn explain-dataset --input articles.jsonl --output cplrp/ --method cplrp --batch-size 4
  torchrun --nproc-per-node 2 -m zennit_attn explain-dataset --input articles.jsonl --output explanations/

exit status: 0 done, 1 the run failed, 2 a bad argument (reported before the model is loaded)."""


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``explain-dataset`` command to ``subparsers``; returns its parser."""
    parser = subparsers.add_parser(
        NAME,
        help='explain every text of a .jsonl file (safetensors shards, resumable, multi-process)',
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=Formatter,
    )
    group = parser.add_argument_group('input and output')
    group.add_argument(
        '--input',
        metavar='FILE.jsonl',
        type=Path,
        required=True,
        help='the texts: one JSON object per line with a "text" field',
    )
    group.add_argument(
        '--output',
        '-o',
        metavar='DIR',
        type=Path,
        required=True,
        help='folder for the shards and the index (created; a re-run on it resumes)',
    )
    group.add_argument(
        '--batch-size', type=int, default=8, metavar='N', help='texts per explain() call (default: %(default)s)'
    )
    group.add_argument(
        '--shard-size', type=int, default=256, metavar='N', help='texts per shard file (default: %(default)s)'
    )
    group.add_argument(
        '--checkpointing',
        action='store_true',
        help='recompute each transformer block in the backward pass (less memory for long texts; '
        'methods with a backward pass)',
    )
    group.add_argument('--quiet', '-q', action='store_true', help='no progress messages or bar on stderr')
    add_target_option(parser.add_argument_group('target'), ' in every text', 'the predicted token of each text')
    add_method_options(parser)
    add_model_options(parser)
    add_debug(parser)
    parser.set_defaults(run=run, check=check)
    return parser


def check(args: argparse.Namespace) -> None:
    """Check the arguments before anything is loaded (:py:class:`~zennit_attn.cli.errors.UsageError`): also that
    the texts read and that the output folder can be written (:py:func:`zennit_attn.workflows.dataset.read_texts` and
    :py:func:`zennit_attn.workflows.dataset.check_output_dir`, imported for it after the other checks)."""
    for name in ('batch_size', 'shard_size'):
        if getattr(args, name) < 1:
            raise UsageError(f'--{name.replace("_", "-")} must be at least 1, got {getattr(args, name)}')
    if args.input.suffix != '.jsonl':
        raise UsageError(
            f'--input {str(args.input)!r} must be a .jsonl file (one JSON object with a "text" field per line)'
        )
    if not args.input.is_file():
        raise UsageError(
            f'--input {str(args.input)!r} does not exist'
            if not args.input.exists()
            else f'--input {str(args.input)!r} is not a file'
        )
    args.target = parse_target(args.target)
    check_method(args)
    if args.checkpointing and not DECLARATIONS[args.method].backward:
        backward = [name for name, method in DECLARATIONS.items() if method.backward]
        raise UsageError(
            f'--checkpointing saves memory of a backward pass, which --method {args.method} does not '
            f'do; it applies to {", ".join(backward)}'
        )
    check_model_options(args)
    check_method_for_model(args)
    args.params = check_param_values(args.method, args.params)
    dataset = heavy('.workflows.dataset')
    try:
        args.texts = dataset.read_texts(args.input)
    except (OSError, ValueError, UnicodeDecodeError) as error:
        raise UsageError(f'--input: {one_line(error)}') from None
    try:
        dataset.check_output_dir(args.output)
    except OSError as error:
        raise UsageError(f'--output: {one_line(error)}') from None
    check_installed(args.model_spec)


def run(args: argparse.Namespace) -> int:
    """Run ``explain-dataset`` with checked arguments (:py:func:`zennit_attn.cli.runs.explain_dataset.run`); returns
    the exit status."""
    return heavy('.cli.runs.explain_dataset').run(args)
