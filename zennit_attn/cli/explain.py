"""``zennit-attn explain``: explain a language model's next-token prediction (terminal heatmap, top tokens, a
heatmap file). The manual, the parser and the checks; the run step is :py:mod:`zennit_attn.cli.runs.explain`."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..methods.declarations import DECLARATIONS, lrp_methods
from .checks import check_common, check_with_library, parse_contrast, parse_target
from .errors import UsageError
from .library import RUNNER_UP, heavy
from .options import (
    Formatter,
    add_contrast_option,
    add_debug,
    add_image_option,
    add_method_options,
    add_model_options,
    add_output_options,
    add_prompt_options,
    add_target_option,
    methods_manual,
)

__all__ = ['NAME', 'DESCRIPTION', 'EPILOG', 'add_parser', 'check', 'check_contrast', 'check_images', 'run']

NAME = 'explain'

DESCRIPTION = """\
Explain a language model's next-token prediction: which input tokens it relied on.

Loads the model, runs the attribution METHOD (default AttnLRP, Achtibat et al., ICML 2024: one forward and one
backward pass) for the logit of TARGET (default: the predicted next token) at the end of the text, and prints the
prediction (token, id, logit), the explained token, a heatmap of the input tokens (red: for, blue: against) and the
most relevant tokens. With --output it also writes the heatmap as a file."""

EPILOG = """\
methods and their --param hyperparameters (with defaults):
{methods}

examples:
  zennit-attn explain --prompt "The Eiffel Tower is located in the city of" --output paris.html
  zennit-attn explain --input article.txt --target " London" --method cplrp
  zennit-attn explain --prompt "The Eiffel Tower is located in the city of" --target " Paris" --contrast " London"
  zennit-attn explain --prompt "2 + 2 =" --target id:220 --model ./my-llama --output why.pdf
  zennit-attn explain --prompt "Hello" --method integrated_gradients --param steps=50
  zennit-attn explain --model ./llava --prompt "<image>A photo of" --image cat.png --output cat.html
  zennit-attn explain --model ./clip --prompt "a photo of a cat" --image cat.png --method cplrp

exit status: 0 done, 1 the run failed, 2 a bad argument (reported before the model is loaded)."""


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``explain`` command to ``subparsers``; returns its parser."""
    parser = subparsers.add_parser(
        NAME,
        help="explain a model's next-token prediction (terminal heatmap, HTML/PNG/SVG/PDF/LaTeX file)",
        description=DESCRIPTION,
        epilog=EPILOG.format(methods=methods_manual()),
        formatter_class=Formatter,
    )
    add_prompt_options(parser, 'whose next token is explained')
    group = parser.add_argument_group('target')
    add_target_option(group)
    add_contrast_option(group)
    group.add_argument(
        '--top',
        type=int,
        default=5,
        metavar='K',
        help='list the K most relevant input tokens; 0: none (default: %(default)s)',
    )
    add_image_option(parser, " or an image-text model (CLIP: the prompt's similarity to the image is explained)")
    add_method_options(parser)
    add_model_options(parser)
    add_output_options(parser, None)
    add_debug(parser)
    parser.set_defaults(run=run, check=check)
    return parser


def check(args: argparse.Namespace) -> None:
    """Check the arguments before anything is loaded (:py:class:`~zennit_attn.cli.errors.UsageError`)."""
    if args.top < 0:
        raise UsageError(f'--top must be 0 or more, got {args.top}')
    args.target = parse_target(args.target)
    args.contrast = parse_contrast(args.contrast)
    check_contrast(args)
    check_common(args)
    check_images(args)
    check_with_library(args)


def check_contrast(args: argparse.Namespace) -> None:
    """Refuse a ``--contrast`` that is the ``--target`` itself, written the same way (the same token string or id;
    a string and an id of the same token are refused once the tokenizer is loaded, before the model is)."""
    if args.contrast is not None and args.contrast != RUNNER_UP and args.contrast == args.target:
        written = f'id:{args.target}' if isinstance(args.target, int) else repr(args.target)
        raise UsageError(f'--contrast is the --target itself ({written}): nothing to contrast; give another token')


def check_images(args: argparse.Namespace) -> None:
    """Check ``--image`` (:py:func:`~zennit_attn.cli.options.add_image_option`), after the method and the model
    options: files, a model folder, an LRP method, no ``--contrast``."""
    if not args.images:
        return
    for path in args.images:
        if not Path(path).is_file():
            raise UsageError(f'--image {path!r} is not a file')
    if args.model_spec.kind != 'folder':
        raise UsageError(
            f'--image needs --model FOLDER (a vision-language or CLIP model with its processor); '
            f'{args.model_spec.label} takes text only'
        )
    if args.contrast is not None:
        raise UsageError('--contrast does not apply with --image')
    if not DECLARATIONS[args.method].lrp:
        raise UsageError(
            f'--image explains with the LRP methods ({", ".join(lrp_methods())}), which give text and '
            f'pixel relevance in one backward pass; --method {args.method} is not one'
        )


def run(args: argparse.Namespace) -> int:
    """Run ``explain`` with checked arguments (:py:func:`zennit_attn.cli.runs.explain.run`); returns the exit
    status."""
    return heavy('.cli.runs.explain').run(args)
