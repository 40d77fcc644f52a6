"""Loading the model a command explains, in its run step (this module imports torch and transformers; the options
were checked by :py:mod:`zennit_attn.cli.models` without them): the tokenizer (:py:func:`load_tokenizer`), the model
(:py:func:`load_model`, :py:func:`load`), a vision-language or image-text model with its processor
(:py:func:`load_multimodal`) and the images (:py:func:`read_images`); ``--target`` and ``--contrast`` checked against
the tokenizer before the model is loaded (:py:func:`resolve_target`), the composite of ``--composite``
(:py:func:`make_composite`) and quiet loaders (:py:func:`quiet_loading`)."""

from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
from collections.abc import Iterator

import torch
from PIL import Image
from transformers import (
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    AutoModelForSeq2SeqLM,
    AutoProcessor,
    AutoTokenizer,
)
from transformers.utils import logging as hf_logging

from .. import pretrained
from ..composites import AttnLRPEpsilon, CPLRPEpsilon
from ..inputs.checks import token_id
from .errors import CommandError, UsageError, one_line
from .library import RUNNER_UP
from .models import BUILTIN, ModelSpec
from .progress import status

try:  # the GGUF converter's module (its progress bars are hidden while loading)
    from transformers import modeling_gguf_pytorch_utils as gguf_loading
except ImportError:  # other transformers versions: the bars just stay
    gguf_loading = None

__all__ = [
    'COMPOSITES',
    'load_tokenizer',
    'load_model',
    'load',
    'resolve_target',
    'load_multimodal',
    'read_images',
    'make_composite',
    'quiet_loading',
]

#: ``--composite`` name -> the composite class
COMPOSITES = {'attnlrp': AttnLRPEpsilon, 'cplrp': CPLRPEpsilon}


def load_tokenizer(spec: ModelSpec):
    """The tokenizer of the model ``spec`` names (:py:class:`CommandError` if it does not load)."""
    try:
        if spec.kind == BUILTIN:
            return AutoTokenizer.from_pretrained(pretrained.smollm2_path(), gguf_file=pretrained.SMOLLM2_FILE)
        if spec.kind == 'gguf':
            return AutoTokenizer.from_pretrained(spec.folder, gguf_file=spec.gguf_file)
        return AutoTokenizer.from_pretrained(spec.folder)
    except (ImportError, OSError, ValueError, TypeError, KeyError, RuntimeError) as error:
        raise CommandError(
            f'cannot load the tokenizer of {spec.label}: {one_line(error) or type(error).__name__}'
        ) from error


def load_model(spec: ModelSpec, dtype: str = 'float32', device='cpu', tokenizer=None):
    """``(model, tokenizer)`` for ``spec``: in eval mode, in ``dtype``, on ``device``; ``tokenizer`` if given
    (else loaded). :py:class:`CommandError` if the model does not load."""
    torch_dtype = getattr(torch, dtype)
    if spec.kind == BUILTIN:
        model, builtin_tokenizer = pretrained.load_smollm2(dtype=torch_dtype)
        tokenizer = tokenizer if tokenizer is not None else builtin_tokenizer
    else:
        if tokenizer is None:
            tokenizer = load_tokenizer(spec)
        auto = AutoModelForSeq2SeqLM if spec.encoder_decoder else AutoModelForCausalLM
        kwargs = {'gguf_file': spec.gguf_file} if spec.kind == 'gguf' else {}
        try:
            model = auto.from_pretrained(spec.folder, dtype=torch_dtype, **kwargs)
        except (ImportError, OSError, ValueError, TypeError, KeyError, RuntimeError) as error:
            kind = 'sequence-to-sequence' if spec.encoder_decoder else 'causal language'
            raise CommandError(
                f'cannot load {spec.label} as a {kind} model: {one_line(error) or type(error).__name__}'
            ) from error
    return model.to(device).eval(), tokenizer


def load(args: argparse.Namespace, need_tokenizer_first: bool):
    """``(model, tokenizer)`` of the checked ``args`` (``model_spec``, ``dtype``, ``device``), with progress on
    stderr unless ``args.quiet``. With ``need_tokenizer_first``, the tokenizer is loaded first and ``args.target``
    (and ``args.contrast`` where the command has it) resolved with it (:py:func:`resolve_target`), so that a bad
    target, or a contrast that is the target itself, is refused before the model is loaded."""
    progress = not args.quiet
    tokenizer = None
    if need_tokenizer_first:
        with status('loading the tokenizer', progress):
            tokenizer = load_tokenizer(args.model_spec)
        if hasattr(args, 'target'):  # generate has none
            args.target = resolve_target(args.target, tokenizer)
        if getattr(args, 'contrast', None) != RUNNER_UP:
            args.contrast = resolve_target(getattr(args, 'contrast', None), tokenizer, '--contrast')
        if args.contrast is not None and args.contrast == getattr(args, 'target', None):
            raise UsageError(
                f'--contrast is the --target itself (token id {args.target}): nothing to contrast; give another token'
            )
    with status(f'loading {args.model_spec.label} in {args.dtype} on {args.device}', progress), quiet_loading():
        return load_model(args.model_spec, args.dtype, args.device, tokenizer)


def resolve_target(target: int | str | None, tokenizer, option: str = '--target') -> int | None:
    """The token id of ``--target`` (or ``option``): an id within the vocabulary, or a string that is exactly one
    token (:py:func:`zennit_attn.inputs.checks.token_id`; :py:class:`UsageError` otherwise); None stays None."""
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
    ``dtype``, on ``device``, without the loaders' progress bars.

    :py:class:`CommandError` if either does not load, if the folder has no image processor (that of a text-only
    model: ``AutoProcessor`` then finds only its tokenizer; the model is not loaded) or if the model takes no images
    (no ``pixel_values`` input)."""
    if spec.kind != 'folder':
        raise CommandError(f'--image needs a Hugging Face model folder with its processor; {spec.label} is not one')
    try:
        processor = AutoProcessor.from_pretrained(spec.folder)
    except (ImportError, OSError, ValueError, TypeError, KeyError) as error:
        raise CommandError(
            f'cannot load the processor of {spec.label} (AutoProcessor): {one_line(error) or type(error).__name__}'
        ) from error
    hint = (
        '--image needs a vision-language model (LLaVA, Qwen2-VL) or an image-text model (CLIP) saved with its '
        'processor (processor.save_pretrained(folder))'
    )
    if getattr(processor, 'image_processor', None) is None or getattr(processor, 'tokenizer', None) is None:
        found = type(processor).__name__
        raise CommandError(
            f'{spec.label} has no image processor (AutoProcessor finds only {found}), so the model '
            f'takes no images; {hint}'
        )
    errors = []
    with quiet_loading():
        for auto in (AutoModelForImageTextToText, AutoModel):
            try:
                model = auto.from_pretrained(spec.folder, dtype=getattr(torch, dtype))
                break
            except (ImportError, OSError, ValueError, TypeError, KeyError, RuntimeError) as error:
                errors.append(one_line(error) or type(error).__name__)
        else:
            raise CommandError(f'cannot load {spec.label} as a vision-language or image-text model: {errors[-1]}')
    if 'pixel_values' not in inspect.signature(model.forward).parameters:
        raise CommandError(
            f'{spec.label} takes no images ({type(model).__name__} has no pixel_values input), '
            f'although it has an image processor; {hint}'
        )
    return model.to(device).eval(), processor


def read_images(paths) -> list:
    """The images of ``--image`` as RGB PIL images (:py:class:`CommandError` for one that cannot be read)."""
    images = []
    for path in paths:
        try:
            with Image.open(path) as picture:
                images.append(picture.convert('RGB'))
        except OSError as error:
            raise CommandError(f'cannot read the image {path!r}: {error}') from error
    return images


def make_composite(name: str | None):
    """The composite ``--composite`` names (a new one), or None for the method's own."""
    return None if name is None else COMPOSITES[name]()


@contextlib.contextmanager
def quiet_loading() -> Iterator[None]:
    """Hide the progress bars of GGUF dequantisation and weight loading while the block runs.

    The weight loader uses the progress bar switch of ``transformers.utils.logging``; the GGUF converter uses a
    plain ``tqdm`` imported into its module, which is swapped for a disabled one. Both are restored on exit.
    """
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    gguf_tqdm = getattr(gguf_loading, 'tqdm', None)
    if gguf_tqdm is not None:
        gguf_loading.tqdm = functools.partial(gguf_tqdm, disable=True)
    try:
        yield
    finally:
        if gguf_tqdm is not None:
            gguf_loading.tqdm = gguf_tqdm
        if was_enabled:
            hf_logging.enable_progress_bar()
