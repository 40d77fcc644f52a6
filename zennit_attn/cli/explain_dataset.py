"""``zennit-attn explain-dataset``: explain every text of a ``.jsonl`` file into a folder of safetensors shards
(resumable, several processes under torchrun)."""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from ..dataset import check_output_dir, explain_dataset, read_texts
from .checks import check_method, make_composite, parse_target
from .errors import UsageError, one_line
from .models import check_model_options, load
from .options import Formatter, add_debug, add_method_options, add_model_options, add_target_option
from .printing import method_label

__all__ = ['NAME', 'DESCRIPTION', 'EPILOG', 'add_parser', 'check', 'run']

NAME = 'explain-dataset'

DESCRIPTION = '''\
Explain every text of a dataset and write the explanations to a folder.

Reads FILE.jsonl (one JSON object per line with a "text" field), explains each text's prediction at its last token
with METHOD (default AttnLRP) for TARGET (default: the predicted next token), BATCH texts at a time, sorted by length
(little padding), and writes the results as safetensors shards with a JSON index as they are done. Running it again
on the same folder resumes: finished shards are skipped; a folder made with other settings is refused. Under
torchrun / accelerate launch the processes share the shards (gloo on CPU, nccl on GPUs). Read the results in Python
with zennit_attn.load_explanations(DIR).'''

EPILOG = '''\
examples:
  zennit-attn explain-dataset --input articles.jsonl --output explanations/
  zennit-attn explain-dataset --input articles.jsonl --output cplrp/ --method cplrp --batch-size 4
  torchrun --nproc-per-node 2 -m zennit_attn explain-dataset --input articles.jsonl --output explanations/

exit status: 0 done, 1 the run failed, 2 a bad argument (reported before the model is loaded).'''


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``explain-dataset`` command to ``subparsers``; returns its parser."""
    parser = subparsers.add_parser(
        NAME, help='explain every text of a .jsonl file (safetensors shards, resumable, multi-process)',
        description=DESCRIPTION, epilog=EPILOG, formatter_class=Formatter)
    group = parser.add_argument_group('input and output')
    group.add_argument('--input', metavar='FILE.jsonl', type=Path, required=True,
                       help='the texts: one JSON object per line with a "text" field')
    group.add_argument('--output', '-o', metavar='DIR', type=Path, required=True,
                       help='folder for the shards and the index (created; a re-run on it resumes)')
    group.add_argument('--batch-size', type=int, default=8, metavar='N',
                       help='texts per explain() call (default: %(default)s)')
    group.add_argument('--shard-size', type=int, default=256, metavar='N',
                       help='texts per shard file (default: %(default)s)')
    group.add_argument('--checkpointing', action='store_true',
                       help='recompute each transformer block in the backward pass (less memory for long texts)')
    group.add_argument('--quiet', '-q', action='store_true', help='no progress messages or bar on stderr')
    add_target_option(parser.add_argument_group('target'), ' in every text', 'the predicted token of each text')
    add_method_options(parser)
    add_model_options(parser)
    add_debug(parser)
    parser.set_defaults(run=run, check=check)
    return parser


def check(args: argparse.Namespace) -> None:
    """Check the arguments before anything is loaded (:py:class:`~zennit_attn.cli.errors.UsageError`): also that
    the texts read and that the output folder can be written (:py:func:`zennit_attn.dataset.check_output_dir`)."""
    for name in ('batch_size', 'shard_size'):
        if getattr(args, name) < 1:
            raise UsageError(f'--{name.replace("_", "-")} must be at least 1, got {getattr(args, name)}')
    if args.input.suffix != '.jsonl':
        raise UsageError(f'--input {str(args.input)!r} must be a .jsonl file (one JSON object with a "text" field '
                         'per line)')
    try:
        args.texts = read_texts(args.input)
    except (OSError, ValueError, UnicodeDecodeError) as error:
        raise UsageError(f'--input: {one_line(error)}') from None
    try:
        check_output_dir(args.output)
    except OSError as error:
        raise UsageError(f'--output: {one_line(error)}') from None
    args.target = parse_target(args.target)
    check_method(args)
    check_model_options(args)


def run(args: argparse.Namespace) -> int:
    """Run ``explain-dataset`` with checked arguments; returns the exit status."""
    model, tokenizer = load(args, need_tokenizer_first=args.target is not None)
    composite = {} if args.composite is None else {'composite': make_composite(args.composite)}
    start = time.perf_counter()
    folder = explain_dataset(model, tokenizer, args.texts, args.output, batch_size=args.batch_size,
                             method=args.method, target=args.target, shard_size=args.shard_size,
                             checkpointing=args.checkpointing, progress=not args.quiet, **composite, **args.params)
    if int(os.environ.get('RANK', '0')) == 0:  # one line for the run, also under torchrun
        print(f'Explained {len(args.texts)} texts with {method_label(args)} in {time.perf_counter() - start:.1f} s; '
              f'wrote {folder.resolve()}')
    return 0
