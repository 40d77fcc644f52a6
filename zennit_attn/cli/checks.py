"""The checks of the options several commands share, run before anything is loaded: each returns the checked
value or raises :py:class:`~zennit_attn.cli.errors.UsageError` with one line naming the option and what to give.

Most need nothing but the arguments (and the file system); the methods, their hyperparameters and the checks of their
values come from the methods' declarations (:py:data:`zennit_attn.methods.declarations.DECLARATIONS`, which import no
torch). The few that need the library itself, which imports torch (an ``--output`` path), end a command's checks
(:py:func:`check_with_library`), so that every other bad argument is reported without waiting for it.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from ..methods.declarations import DECLARATIONS, lrp_methods
from .errors import UsageError, one_line
from .library import RUNNER_UP, SUFFIXES, heavy
from .models import check_installed, check_model_options
from .options import COMPOSITES, DEFAULT_METHOD

__all__ = [
    'read_prompt',
    'check_output_option',
    'parse_target',
    'parse_contrast',
    'parse_params',
    'check_param_values',
    'method_and_composite',
    'check_method',
    'check_method_for_model',
    'check_common',
    'check_with_library',
]


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


def check_output_option(path: Path | None, option: str = '--output', suffixes: Sequence[str] = SUFFIXES) -> Path | None:
    """``path`` if a file in a format of ``suffixes`` can be written there
    (:py:func:`zennit_attn.results.render.views.check_output`, imported for it), else :py:class:`UsageError` naming
    ``option``; None stays None."""
    if path is None:
        return None
    try:
        return heavy('.results.render.views').check_output(path, suffixes)
    except (OSError, ValueError) as error:
        raise UsageError(f'{option}: {one_line(error)}') from None


def parse_target(value: str | None) -> int | str | None:
    """``--target``: None, a token id (``id:N``) or a token string (checked against the tokenizer later, by
    :py:func:`zennit_attn.cli.models.resolve_target`)."""
    if value is None:
        return None
    if value.startswith('id:'):
        number = value[3:].strip()
        if not number.isdigit():
            raise UsageError(
                f'--target {value!r}: id: must be followed by a token id (a whole number >= 0), e.g. id:7042'
            )
        return int(number)
    if value == '':
        raise UsageError('--target is empty; give a token, e.g. --target " Paris", or id:N')
    return value


def parse_contrast(value: str | None) -> int | str | None:
    """``--contrast``: None, ``runner-up``, a token id (``id:N``) or a token string (checked against the tokenizer
    later, as ``--target``)."""
    if value is not None and value.strip() == RUNNER_UP:
        return RUNNER_UP
    try:
        return parse_target(value)
    except UsageError as error:
        raise UsageError(str(error).replace('--target', '--contrast')) from None


def parse_params(items: Sequence[str], method: str) -> dict[str, object]:
    """``--param NAME=VALUE`` items of ``method``: names it takes (its declaration in
    :py:data:`~zennit_attn.methods.declarations.DECLARATIONS`), values as Python literals (else strings). The values
    are checked by :py:func:`check_param_values`."""
    accepted = DECLARATIONS[method].params
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


def check_param_values(method: str, params: dict[str, object]) -> dict[str, object]:
    """``params`` of ``method`` checked by its declaration
    (:py:meth:`zennit_attn.methods.declarations.Declaration.check`, the checks :py:func:`zennit_attn.explain` runs; no
    torch), a value the method would refuse a :py:class:`UsageError`; returns the normalised values."""
    try:
        return DECLARATIONS[method].check(params)
    except (TypeError, ValueError) as error:
        raise UsageError(f'--param for method {method}: {one_line(error)}') from None


def method_and_composite(args: argparse.Namespace) -> tuple[str, str | None]:
    """The method (``--method``, else ``--composite``, else :py:data:`DEFAULT_METHOD`) and the composite, refusing a
    composite for a method that takes none or one that contradicts the method's name."""
    method = args.method or args.composite or DEFAULT_METHOD
    if args.composite is not None:
        if method not in lrp_methods():
            raise UsageError(
                f'--composite applies to the LRP methods ({", ".join(lrp_methods())}), not to --method {method}'
            )
        if method in COMPOSITES and method != args.composite:
            raise UsageError(
                f'--composite {args.composite} contradicts --method {method}; '
                f'use --method {args.composite} (the composite follows the method)'
            )
    return method, args.composite


def check_method(args: argparse.Namespace) -> None:
    """Check ``--method``, ``--composite`` and the names of ``--param``; sets ``args.method``, ``args.composite``
    and ``args.params`` (their values are checked by :py:func:`check_with_library`)."""
    args.method, args.composite = method_and_composite(args)
    args.params = parse_params(args.param, args.method)


#: Why a method cannot explain an encoder-decoder model, by the flag of its declaration that says so.
ENCODER_DECODER_REFUSALS = {
    'attention_maps': 'reads attention maps, which are not implemented for encoder-decoder models',
}


def check_method_for_model(args: argparse.Namespace) -> None:
    """Refuse a method that cannot explain an encoder-decoder model (its ``config.json`` says ``is_encoder_decoder``):
    one that reads attention maps (:py:func:`zennit_attn.methods.attention.attention_maps` refuses it once loaded);
    after :py:func:`check_method` and :py:func:`~zennit_attn.cli.models.check_model_options`."""
    if not args.model_spec.encoder_decoder:
        return
    declaration = DECLARATIONS[args.method]
    reasons = [reason for flag, reason in ENCODER_DECODER_REFUSALS.items() if getattr(declaration, flag)]
    if reasons:
        others = ', '.join(
            name
            for name, method in DECLARATIONS.items()
            if not any(getattr(method, flag) for flag in ENCODER_DECODER_REFUSALS)
        )
        raise UsageError(
            f'--method {args.method} {" and ".join(reasons)} such as {args.model_spec.label} (its config.json says '
            f'is_encoder_decoder); use one of {others}'
        )


def check_common(args: argparse.Namespace) -> None:
    """The checks of a command on one text that need no library: the prompt (``args.text``), the method, the model
    options and the method for the model. The command's checks end with :py:func:`check_with_library`."""
    args.text = read_prompt(args.prompt, args.input)
    check_method(args)
    check_model_options(args)
    check_method_for_model(args)


def check_with_library(args: argparse.Namespace) -> None:
    """The last checks of a command, after every other: the values of ``--param`` (``args.params``), ``--output``
    where the command has it (which imports the library, torch), then whether the built-in model is installed
    (:py:func:`~zennit_attn.cli.models.check_installed`, exit status 1)."""
    args.params = check_param_values(args.method, args.params)
    args.output = check_output_option(getattr(args, 'output', None))
    check_installed(args.model_spec)
