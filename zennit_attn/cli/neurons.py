"""``zennit-attn neurons``: rank the units inside the model (FFN neurons, heads, projection features) that a
next-token prediction relied on (latent relevance). The manual, the parser and the checks; the run step is
:py:mod:`zennit_attn.cli.runs.neurons`."""

from __future__ import annotations

import argparse

from ..methods.declarations import DECLARATIONS
from .checks import check_common, check_with_library, parse_target
from .errors import UsageError
from .library import heavy
from .options import Formatter, add_debug, add_method_options, add_model_options, add_prompt_options, add_target_option

__all__ = ['NAME', 'DESCRIPTION', 'EPILOG', 'SITES', 'add_parser', 'parse_layers', 'check', 'run']

NAME = 'neurons'
#: ``--site`` values: the sites with units to rank (the residual stream is recorded summed over hidden)
SITES = ('mlp', 'attention', 'query', 'key', 'value')

DESCRIPTION = """\
Find the neurons inside the model that its next-token prediction relied on (latent relevance, paper section 3.5).

Runs one forward and backward pass of METHOD (AttnLRP by default; cplrp or input_x_gradient) for the logit of TARGET
(default: the predicted next token) at the end of the text, records the relevance at SITE in every transformer
block (mlp: the FFN neurons at the input of the down projection; attention: the heads; query, key, value: the
projection features), and prints the relevance per layer and the K most relevant units, summed over positions.
For FFN neurons it also prints the tokens each one's output weights promote (vocabulary projection)."""

EPILOG = """\
examples:
  zennit-attn neurons --prompt "The ice bear lives in the"
  zennit-attn neurons --prompt "The ice bear lives in the" --layers 3-26 --top 20 --vocabulary 8
  zennit-attn neurons --prompt "The ice bear lives in the" --site attention --method cplrp

In Python, zennit_attn.latent has the rest of the workflow: reference samples, steering, conditional heatmaps.

exit status: 0 done, 1 the run failed, 2 a bad argument (reported before the model is loaded)."""


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``neurons`` command to ``subparsers``; returns its parser."""
    parser = subparsers.add_parser(
        NAME,
        help='rank the neurons (FFN neurons, heads, ...) a prediction relied on, per layer and overall',
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=Formatter,
    )
    add_prompt_options(parser, 'whose next token is explained')
    group = parser.add_argument_group('neurons')
    add_target_option(group)
    group.add_argument(
        '--site',
        choices=SITES,
        default='mlp',
        help='where the units are: mlp (FFN neurons), attention (heads), query, key or value '
        '(projection features) (default: %(default)s)',
    )
    group.add_argument(
        '--top', type=int, default=10, metavar='K', help='list the K most relevant units (default: %(default)s)'
    )
    group.add_argument(
        '--layers',
        metavar='A-B|A,B,...',
        help='rank only the units of these layers, e.g. 3-26 or 10,12; a layer named twice counts once (default: all)',
    )
    group.add_argument(
        '--absolute', action='store_true', help='rank by absolute relevance (evidence against the prediction too)'
    )
    group.add_argument(
        '--vocabulary',
        type=int,
        default=5,
        metavar='N',
        help='for mlp neurons, show the N tokens each one promotes most; 0: none (default: %(default)s)',
    )
    add_method_options(parser)
    add_model_options(parser)
    group = parser.add_argument_group('output')
    group.add_argument('--quiet', '-q', action='store_true', help='no progress messages on stderr')
    add_debug(parser)
    parser.set_defaults(run=run, check=check)
    return parser


def parse_layers(value: str | None) -> list[int] | None:
    """``--layers``: None (all), a range ``A-B`` (both included) or a comma-separated list of layer indices; the
    layers in ascending order, each once."""
    if value is None:
        return None
    try:
        if '-' in value.strip()[1:]:
            first, last = (int(part) for part in value.split('-', 1))
            layers = list(range(first, last + 1))
        else:
            layers = [int(part) for part in value.split(',')]
    except ValueError:
        raise UsageError(f'--layers {value!r}: give a range such as 3-26 or a list such as 10,12') from None
    if not layers or min(layers) < 0:
        raise UsageError(f'--layers {value!r}: give layer indices >= 0, a non-empty range or list')
    return sorted(set(layers))


def check(args: argparse.Namespace) -> None:
    """Check the arguments before anything is loaded (:py:class:`~zennit_attn.cli.errors.UsageError`)."""
    if args.top < 1:
        raise UsageError(f'--top must be at least 1, got {args.top}')
    if args.vocabulary < 0:
        raise UsageError(f'--vocabulary must be 0 or more, got {args.vocabulary}')
    args.layers = parse_layers(args.layers)
    args.target = parse_target(args.target)
    check_common(args)
    if not DECLARATIONS[args.method].latent:
        recording = [name for name, method in DECLARATIONS.items() if method.latent]
        raise UsageError(f'--method {args.method} does not record latent relevance; use one of {", ".join(recording)}')
    if args.model_spec.encoder_decoder:
        raise UsageError(
            f'{args.model_spec.label} is an encoder-decoder model (its config.json says '
            'is_encoder_decoder): latent sites are defined for decoder-only and encoder-only '
            'transformers (encoder and decoder blocks see different sequences)'
        )
    check_with_library(args)


def run(args: argparse.Namespace) -> int:
    """Run ``neurons`` with checked arguments (:py:func:`zennit_attn.cli.runs.neurons.run`); returns the exit
    status."""
    return heavy('.cli.runs.neurons').run(args)
