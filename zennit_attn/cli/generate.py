"""``zennit-attn generate``: generate an answer and explain it (terminal heatmap, interactive HTML page). The
manual, the parser and the checks; the run step is :py:mod:`zennit_attn.cli.runs.generate`."""

from __future__ import annotations

import argparse

from .checks import check_common, check_with_library, parse_contrast
from .errors import UsageError
from .explain import check_images
from .library import heavy
from .options import (
    Formatter,
    add_contrast_option,
    add_debug,
    add_image_option,
    add_method_options,
    add_model_options,
    add_output_options,
    add_prompt_options,
)

__all__ = ['NAME', 'DESCRIPTION', 'EPILOG', 'add_parser', 'check', 'run']

NAME = 'generate'

DESCRIPTION = """\
Generate an answer and explain it: which tokens each generated token, and the whole answer, relied on.

Loads the model, generates up to N tokens greedily after the prompt, explains every generated token over the prefix
it was generated from (one explanation each) and the whole answer, the sum of the generated tokens' logits, in one
more backward pass. Prints the answer and the heatmap of the whole answer over prompt and answer. With --output
it writes an interactive HTML page (click or hover a generated token to see its own heatmap), or the heatmap of
the whole answer as .png, .svg, .pdf or .tex. With --image a vision-language model answers the prompt about the
images, and the pixels are explained too (the overlay of each image is drawn beside the answer)."""

EPILOG = """\
examples:
  zennit-attn generate --prompt "The capital of France is" --max-new-tokens 5 --output answer.html
  zennit-attn generate --input question.txt --max-new-tokens 40 --composite cplrp --output answer.html
  zennit-attn generate --prompt "2 + 2 =" --max-new-tokens 3 --words --output answer.pdf
  zennit-attn generate --prompt "The capital of France is" --max-new-tokens 5 --contrast runner-up
  zennit-attn generate --model ./llava --prompt "<image>What is this? It is" --image bear.png --output bear.html

exit status: 0 done, 1 the run failed, 2 a bad argument (reported before the model is loaded)."""


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``generate`` command to ``subparsers``; returns its parser."""
    parser = subparsers.add_parser(
        NAME,
        help='generate an answer and explain it (terminal heatmap, HTML file)',
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=Formatter,
    )
    add_prompt_options(parser, 'to answer')
    group = parser.add_argument_group('generation')
    group.add_argument(
        '--max-new-tokens',
        type=int,
        default=20,
        metavar='N',
        help='generate at most N tokens; generation stops earlier at the end-of-sequence token (default: %(default)s)',
    )
    add_contrast_option(group, 'each generated token')
    add_image_option(parser)
    add_method_options(parser)
    add_model_options(parser)
    add_output_options(parser, None)
    add_debug(parser)
    parser.set_defaults(run=run, check=check)
    return parser


def check(args: argparse.Namespace) -> None:
    """Check the arguments before anything is loaded (:py:class:`~zennit_attn.cli.errors.UsageError`)."""
    if args.max_new_tokens < 1:
        raise UsageError(f'--max-new-tokens must be at least 1, got {args.max_new_tokens}')
    args.contrast = parse_contrast(args.contrast)
    check_common(args)
    check_images(args)
    check_with_library(args)


def run(args: argparse.Namespace) -> int:
    """Run ``generate`` with checked arguments (:py:func:`zennit_attn.cli.runs.generate.run`); returns the exit
    status."""
    return heavy('.cli.runs.generate').run(args)
