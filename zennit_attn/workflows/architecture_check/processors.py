"""Pixels through each architecture's own processor, for the architecture check
(:py:mod:`~zennit_attn.workflows.architecture_check.pixels`).

:py:func:`processor_inputs` builds the processor of an architecture from transformers' classes
(``PROCESSOR_MAPPING_NAMES``, ``IMAGE_PROCESSOR_MAPPING_NAMES``) without downloading anything: its image processor with
the sizes fitted to the tiny vision configuration (:py:data:`IMAGE_SIZES` per image-processor class, from the
configuration's sizes :py:class:`Vision`; :py:data:`PROCESSOR_ARGS` per architecture), and a word-level tokenizer made
in memory (:py:func:`offline_tokenizer`) whose special tokens (every ``tokenizer.<name>_token`` the processor's module
reads, every ``*_token`` default of its constructor, :py:data:`TOKENS`) have the ids of the model's configuration. It
calls the processor on a small image and a text with the image placeholder, so that tiling, aspect-ratio ids,
cross-attention masks, patch inputs and pan-and-scan crops come from the processor, and returns what the model's
forward takes of its outputs.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable

import numpy as np
import torch
import transformers
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers
from transformers.models.auto.feature_extraction_auto import FEATURE_EXTRACTOR_MAPPING_NAMES
from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES
from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES
from transformers.models.auto.video_processing_auto import VIDEO_PROCESSOR_MAPPING_NAMES

__all__ = [
    'Vision',
    'IMAGE_SIZES',
    'PROCESSOR_ARGS',
    'TOKENS',
    'PROMPTS',
    'CALLS',
    'PARTS',
    'PREFIXED',
    'PREFIX',
    'vision_field',
    'vision_sizes',
    'offline_tokenizer',
    'build_processor',
    'processor_inputs',
]


def vision_field(vision, *names, default=None):
    """The first positive integer among the fields ``names`` of the vision configuration ``vision`` (a size given as
    a dict or a list: its height, shortest edge or first entry), else ``default``."""
    for name in names:
        value = getattr(vision, name, None)
        if isinstance(value, dict):
            value = value.get('height', value.get('shortest_edge'))
        if isinstance(value, (list, tuple)) and value:
            value = value[0]
        if type(value) is int and value > 0:
            return value
    return default


@dataclasses.dataclass(frozen=True)
class Vision:
    """The sizes of a tiny vision configuration that an image processor is fitted to.

    Attributes
    ----------
    side: int
        The image side (``image_size``).
    patch: int
        The patch side (``patch_size``).
    merge: int
        Patches merged per side (``spatial_merge_size``, ``merge_size``; 1 without).
    temporal: int
        Frames per temporal patch (``temporal_patch_size``; 1 without).
    tiles: int
        The most tiles of an image (``max_num_tiles``; 2 without).
    high: int
        The image side of a high-resolution tower (``high_res_vision_config.image_size``; 0 without).
    """

    side: int
    patch: int
    merge: int
    temporal: int
    tiles: int = 2
    high: int = 0

    @property
    def grid(self) -> int:
        """The side of an image of two merged patches a side (what flattened-patch processors resize to)."""
        return 2 * self.patch * self.merge


def vision_sizes(config) -> Vision:
    """The :py:class:`Vision` sizes of ``config``'s vision configuration (``vision_config``, ``encoder``, or the
    configuration itself)."""
    vision = getattr(config, 'vision_config', None) or getattr(config, 'encoder', None) or config
    patch = vision_field(vision, 'patch_size', default=8)
    return Vision(
        side=vision_field(vision, 'image_size', default=4 * patch),
        patch=patch,
        merge=vision_field(vision, 'spatial_merge_size', 'merge_size', 'merge_kernel_size', default=1),
        temporal=vision_field(vision, 'temporal_patch_size', 'patch_temporal', default=1),
        tiles=vision_field(vision, 'max_num_tiles', default=2),
        high=vision_field(getattr(config, 'high_res_vision_config', None), 'image_size', default=0),
    )


def _square(side: int) -> dict:
    """A square size of ``side`` pixels, as image processors take it."""
    return {'height': side, 'width': side}


def _flat_patches(vision: Vision) -> dict:
    """Qwen2-VL's image processor: ``2 * merge`` patches a side (``size`` holds pixel counts)."""
    pixels = vision.grid**2
    return {
        'patch_size': vision.patch,
        'merge_size': vision.merge,
        'temporal_patch_size': vision.temporal,
        'size': {'shortest_edge': pixels, 'longest_edge': pixels},
    }


#: Constructor arguments of image-processor classes fitted to the tiny vision sizes (:py:class:`Vision`); a class
#: that is not listed gets :py:func:`_default_sizes`.
IMAGE_SIZES: dict[str, Callable[[Vision], dict]] = {
    'Qwen2VLImageProcessor': _flat_patches,
    'MiniMaxM3VLImageProcessor': _flat_patches,
    'PaddleOCRVLImageProcessor': _flat_patches,
    'MuseGlimmerImageProcessor': lambda v: {
        'patch_size': v.patch,
        'merge_size': v.merge,
        'temporal_patch_size': v.temporal,
        'max_image_tokens': 4,
    },
    'Apertus1p5ImageProcessor': lambda v: {'size': {'min_pixels': v.grid**2, 'max_pixels': v.grid**2}},
    'Emu3ImageProcessor': lambda v: {'min_pixels': v.side**2, 'max_pixels': v.side**2},
    'FuyuImageProcessor': lambda v: {'size': _square(v.side), 'patch_size': _square(v.patch)},
    'Gemma4ImageProcessor': lambda v: {'patch_size': v.patch, 'max_soft_tokens': 70},
    'Kimi_K25ImageProcessor': lambda v: {
        'patch_size': v.patch,
        'merge_size': v.merge,
        'size': {'max_height': v.grid, 'max_width': v.grid},
    },
    'MllamaImageProcessor': lambda v: {'size': _square(v.side), 'max_image_tiles': v.tiles},
    'Llama4ImageProcessor': lambda v: {'size': _square(v.side), 'max_patches': 2},
    'Molmo2ImageProcessor': lambda v: {
        'size': _square(v.side),
        'patch_size': v.patch,
        'max_crops': 2,
        'overlap_margins': [1, 1],  # patches of overlap between crops (4 + 4 of the default exceed a tiny crop)
    },
    'LlavaNextImageProcessor': lambda v: {
        'size': {'shortest_edge': v.side},
        'crop_size': _square(v.side),
        'image_grid_pinpoints': [[v.side, v.side]],
    },
    'InklingImageProcessor': lambda v: {'size': _square(v.patch)},  # its size is the patch of the vision tower
    'AriaImageProcessor': lambda v: {'max_image_size': v.side, 'min_image_size': v.side},
    'DeepseekVLHybridImageProcessor': lambda v: {'size': _square(v.side), 'high_res_size': _square(v.high)},
}


def _default_sizes(processor: type, vision: Vision) -> dict:
    """Square ``size`` and ``crop_size`` of the image side, in the form of the class's defaults, and its patch size."""
    defaults = processor().to_dict()
    kwargs: dict = {}
    size = defaults.get('size')
    if isinstance(size, dict):
        kwargs['size'] = {key: vision.side for key in size}
    if isinstance(defaults.get('crop_size'), dict):
        kwargs['crop_size'] = _square(vision.side)
    if type(defaults.get('patch_size')) is int:
        kwargs['patch_size'] = vision.patch
    for key in ('tile_size', 'min_size', 'image_size'):
        if type(defaults.get(key)) is int:
            kwargs[key] = vision.side
    return kwargs


#: Constructor arguments of processors per ``model_type`` (from the tiny configuration and its vision sizes).
PROCESSOR_ARGS: dict[str, Callable[[object, Vision], dict]] = {
    'llama4': lambda config, v: {'patch_size': v.patch},
    'vipllava': lambda config, v: {'vision_feature_select_strategy': 'default'},  # its projector drops the class token
}
#: Token strings that a processor's code writes literally, per ``model_type``, and the configuration field whose id
#: they have.
TOKENS: dict[str, dict[str, str]] = {
    'fuyu': {'|SPEAKER|': 'image_token_id', '|NEWLINE|': 'image_newline_token_id'},
    'ovis2': {'<IMG_ATOM>': 'image_token_id'},
    'idefics': {'<image>': 'image_token_id', '<fake_token_around_image>': 'fake_image_token_id'},
    'molmo2': {
        '<im_patch>': 'image_patch_id',
        '<im_start>': 'image_start_token_id',
        '<low_res_im_start>': 'low_res_image_start_token_id',
        '<im_end>': 'image_end_token_id',
        '<frame_start>': 'frame_start_token_id',
        '<frame_end>': 'frame_end_token_id',
        '<im_col>': 'image_col_token_id',
        '<im_low>': 'image_low_token_id',
    },
}
#: The text of the processor's call per ``model_type`` where it is not ``'{first} {image} {second}'`` (two words of the
#: tokenizer, the processor's image placeholder, two more words; Fuyu's processor puts the image ahead itself).
PROMPTS: dict[str, str] = {'fuyu': '{first} {second}'}
#: Arguments of the processor's call per ``model_type`` (Fuyu's gives ``image_patches`` by default, not the
#: ``pixel_values`` its model takes).
CALLS: dict[str, dict] = {'fuyu': {'return_legacy_image_output': False}}
#: Parts of a processor (``feature_extractor``, ``video_processor``: the class name) per ``model_type`` where
#: transformers' mappings name none but the processor requires one (Nemotron-H Omni's audio: Parakeet's features).
PARTS: dict[str, dict[str, str]] = {'nemotron_h_omni': {'feature_extractor': 'ParakeetFeatureExtractor'}}

#: Vision towers (``vision_config.model_type``) that put a class token ahead of the patch tokens.
CLASS_TOKEN_TOWERS = ('clip_vision_model',)
#: Named tokens every offline tokenizer has (processors check for them when they take audio or video).
STANDARD_TOKENS = ('image_token', 'video_token', 'audio_token')
#: Architectures whose processor drops the first token of each encoded image placeholder (Fuyu's, made for a
#: tokenizer that starts every text with a word of its own): the offline tokenizer starts each text with
#: :py:data:`PREFIX`.
PREFIXED = ('fuyu',)
#: The word that the offline tokenizer puts ahead of every text of a :py:data:`PREFIXED` architecture.
PREFIX = '\u2581'
#: ``tokenizer.<name>`` (or ``getattr(tokenizer, '<name>'``) read in a processor's module: the token names it needs
#: of the tokenizer.
_READ_TOKEN = re.compile(r'tokenizer(?:\.|, [\'"])(\w+_token)\b')
#: Constructor parameters whose value is the number of placeholder tokens per image.
_SEQUENCE_LENGTH = ('image_seq_length', 'image_seq_len', 'num_image_tokens')


def _classes(model_type: str) -> tuple[type, type]:
    """The processor class and the image-processor class (torchvision's where there is one) of ``model_type`` in
    transformers' mappings."""
    processor = PROCESSOR_MAPPING_NAMES.get(model_type)
    if processor is None or model_type not in IMAGE_PROCESSOR_MAPPING_NAMES:
        raise LookupError(f'transformers maps no processor and image processor to {model_type!r}')
    images = IMAGE_PROCESSOR_MAPPING_NAMES[model_type]
    name = images.get('torchvision') or images.get('pil') if isinstance(images, dict) else images
    return getattr(transformers, processor), getattr(transformers, name)


def _token_names(processor: type) -> dict[str, str]:
    """``{name: token string}`` of the tokens the processor reads: ``tokenizer.<name>`` in its module (named
    ``<name>``) and its constructor's ``*_token`` defaults."""
    module = inspect.getmodule(processor)
    names = dict.fromkeys([*STANDARD_TOKENS, *(_READ_TOKEN.findall(inspect.getsource(module)) if module else ())])
    tokens = {name: f'<{name}>' for name in names if name not in ('bos_token', 'eos_token', 'pad_token', 'unk_token')}
    for name, parameter in inspect.signature(processor.__init__).parameters.items():
        if name.endswith('_token') and isinstance(parameter.default, str):
            tokens[name] = parameter.default
    return tokens


def _config_id(model, name: str):
    """The id of the token ``name`` (``image_token``, ``boi_token`` ...) in the model's configurations
    (``<name>_id``, ``<name>_index``; ``image_token`` also as ``image_token_id``); None where none holds it."""
    stem = name[: -len('_token')]
    fields = (f'{name}_id', f'{name}_index', f'{stem}_token_id', f'{stem}_id', f'{stem}_index')
    for owner in (model.config, getattr(model.config, 'text_config', None)):
        for field in fields:
            value = getattr(owner, field, None)
            if type(value) is int:
                return value
    return None


def offline_tokenizer(
    vocab: int, tokens: dict[str, int], special: set[int], named: dict[str, str], prefix: bool = False
) -> transformers.PreTrainedTokenizerFast:
    """A word-level tokenizer of ``vocab`` ids made in memory: the words ``w4`` ... for the ids that no special token
    takes, the strings of ``tokens`` (``{string: id}``) split off wherever they stand (special tokens), ``<s>``,
    ``</s>``, ``<pad>``, ``<unk>`` at the free ids from 0 (``special``: the ids the model's configuration reserves);
    ``named``: the model-specific named tokens (``{'image_token': '<image>'}``: ``tokenizer.image_token``,
    ``image_token_id``). With ``prefix``, every text starts with the word :py:data:`PREFIX` (the tokens of ``tokens``
    are then split by the pre-tokenizer only, after it: not as special tokens, which would come first)."""
    taken = set(tokens.values()) | special
    free = [index for index in range(vocab) if index not in taken]
    table = dict(tokens)
    table.update(zip(('<pad>', '<s>', '</s>', '<unk>', PREFIX), free[:5], strict=True))
    used = set(table.values())
    table.update({f'w{index}': index for index in range(vocab) if index not in used})
    backend = Tokenizer(models.WordLevel(vocab=table, unk_token='<unk>'))
    pattern = '|'.join(re.escape(string) for string in sorted(tokens, key=len, reverse=True))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(pattern), 'isolated'), pre_tokenizers.WhitespaceSplit()]
        if pattern
        else [pre_tokenizers.WhitespaceSplit()]
    )
    if prefix:
        backend.normalizer = normalizers.Prepend(f'{PREFIX} ')
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token='<s>',
        eos_token='</s>',
        pad_token='<pad>',
        unk_token='<unk>',
        extra_special_tokens=[] if prefix else list(tokens),
        model_specific_special_tokens={} if prefix else named,
    )


def build_processor(model, config, vocab: int, special: set[int]):
    """The processor of the model's architecture from transformers' classes, fitted to the tiny configuration ``config``
    (see the module's description); ``special``: the ids the configuration reserves.

    Raises
    ------
    LookupError
        Where transformers maps no processor to the architecture.
    """
    model_type = model.config.model_type
    processor_class, image_class = _classes(model_type)
    vision = vision_sizes(config)
    sizes = IMAGE_SIZES.get(image_class.__name__)
    images = image_class(**(sizes(vision) if sizes else _default_sizes(image_class, vision)))
    kwargs = {**_other_parts(model_type, vision), **_processor_kwargs(model, config, processor_class, images, vision)}
    named = _token_names(processor_class)
    literal = dict(TOKENS.get(model_type, {}))
    # a literal token is the named token of its field (Fuyu's '|SPEAKER|' is its image_token): one string per id
    named.update({field.removesuffix('_id'): string for string, field in literal.items()})
    processor = None
    for _ in range(2):  # again with the tokens the processor names in its own attributes (a literal in its code)
        ids = _token_ids(model, vocab, special, named, literal)
        tokenizer = offline_tokenizer(vocab, ids, special, named, prefix=model_type in PREFIXED)
        processor = processor_class(image_processor=images, tokenizer=tokenizer, **kwargs)
        own = {
            key: value
            for key, value in vars(processor).items()
            if key.endswith('_token') and isinstance(value, str) and value not in tokenizer.get_vocab()
        }
        if not own:
            break
        # a token of the processor's own of a field that a literal token has already is a placeholder the processor
        # expands into that token (Ovis2's '<image>' into '<IMG_ATOM>'): named only, with a free id (_token_ids)
        fields = set(literal.values())
        literal.update({value: key + '_id' for key, value in own.items() if key + '_id' not in fields})
        named.update({key: value for key, value in own.items() if key in named})  # one string per id
    return processor


def _token_ids(model, vocab: int, special: set[int], named: dict, literal: dict) -> dict[str, int]:
    """``{token string: id}``: the configuration's id of each named token (``named``: ``{name: string}``) and of each
    literal token (``literal``: ``{string: configuration field}``), a free id where the configuration has none, and
    for a named token that has a literal token's id: a placeholder its processor expands into that token."""
    ids = {string: _config_id(model, name) for name, string in named.items()}
    for string, field in literal.items():
        ids[string] = _config_id(model, field.removesuffix('_id'))
    # one string per id: a named token with the id of a literal token takes a free one (Ovis2's '<image>' and Molmo 2's
    # '<|image|>', which their processors expand into '<IMG_ATOM>' and '<im_patch>' tokens of the configuration's
    # image_token_id; with both at that id, which one the tokenizer kept depended on the hash seed)
    written = {ids[string] for string in literal if ids[string] is not None}
    ids = {string: None if string not in literal and index in written else index for string, index in ids.items()}
    taken = special | {index for index in ids.values() if index is not None}
    free = iter(index for index in range(vocab - 1, 3, -1) if index not in taken)
    return {string: next(free) if index is None or index >= vocab else index for string, index in ids.items()}


def _other_parts(model_type: str, vision: Vision) -> dict:
    """The video processor (sized as the image processor where it takes the sizes) and the feature extractor that
    the processor of ``model_type`` also takes (transformers' mappings, else :py:data:`PARTS`), with their classes'
    defaults otherwise."""
    parts = {}
    for key, mapping in (
        ('video_processor', VIDEO_PROCESSOR_MAPPING_NAMES),
        ('feature_extractor', FEATURE_EXTRACTOR_MAPPING_NAMES),
    ):
        name = mapping.get(model_type) or PARTS.get(model_type, {}).get(key)
        if name is None:
            continue
        name = name.get('torchvision') or name.get('pil') if isinstance(name, dict) else name
        part = getattr(transformers, name)
        sizes = IMAGE_SIZES.get(name)
        try:
            parts[key] = part(**(sizes(vision) if sizes else {}))
        except (TypeError, ValueError):
            parts[key] = part()
    return parts


def _processor_kwargs(model, config, processor_class: type, images, vision: Vision) -> dict:
    """The processor's constructor arguments that depend on the tiny model: the patch size, the vision feature
    strategy, the number of placeholders per image (what the model's image features give for the image processor's
    pixels), and :py:data:`PROCESSOR_ARGS`."""
    params = inspect.signature(processor_class.__init__).parameters
    kwargs = dict(PROCESSOR_ARGS.get(model.config.model_type, lambda *_: {})(config, vision))
    if 'num_additional_image_tokens' in params:  # a class token ahead of the patches (CLIP's)
        kwargs['num_additional_image_tokens'] = int(
            getattr(getattr(config, 'vision_config', None), 'model_type', '') in CLASS_TOKEN_TOWERS
        )
    if 'patch_size' in params and 'patch_size' not in kwargs:
        kwargs['patch_size'] = vision.patch
    strategy = getattr(model.config, 'vision_feature_select_strategy', None)
    if 'vision_feature_select_strategy' in params and strategy is not None:
        kwargs['vision_feature_select_strategy'] = strategy
    lengths = [name for name in _SEQUENCE_LENGTH if name in params]
    if lengths:
        kwargs[lengths[0]] = _features_per_image(model, images(images=[small_image()], return_tensors='pt'))
    return kwargs


def _features_per_image(model, pixels) -> int:
    """The rows of the model's image features for one image's ``pixels`` (the image processor's outputs)."""
    for owner in (model, getattr(model, 'model', None)):
        features = getattr(owner, 'get_image_features', None)
        if features is None:
            continue
        names = inspect.signature(features).parameters
        with torch.no_grad():
            output = features(**{key: _double(value) for key, value in pixels.items() if key in names})
        output = (
            getattr(output, 'pooler_output', None) if not isinstance(output, (torch.Tensor, list, tuple)) else output
        )
        tensors = [output] if isinstance(output, torch.Tensor) else [item for item in output]
        rows = sum(tensor.reshape(-1, tensor.shape[-1]).shape[0] for tensor in tensors)
        values = pixels.get('pixel_values')
        crops = values.shape[1] if values is not None and values.ndim == 5 else 1
        return rows // crops  # the count per crop where the processor tiles (Idefics 3)
    raise LookupError(f'{type(model).__name__} has no get_image_features to count its image tokens')


def _double(value):
    """A floating-point tensor in float64, anything else as it is."""
    return value.double() if isinstance(value, torch.Tensor) and value.is_floating_point() else value


def small_image(height: int = 40, width: int = 48) -> np.ndarray:
    """A fixed ``[height, width, 3]`` uint8 image (a colour ramp: neither constant nor random)."""
    rows, cols = np.meshgrid(np.arange(height), np.arange(width), indexing='ij')
    return np.stack([rows * 5 % 256, cols * 5 % 256, (rows + cols) * 3 % 256], -1).astype('uint8')


def processor_inputs(model, config, vocab: int, special: set[int], params) -> dict:
    """The forward inputs of the processor's outputs for :py:func:`small_image` and a text of four words of the
    tokenizer with the image placeholder in the middle (:py:data:`PROMPTS`), with the processor of
    :py:func:`build_processor`: what the forward takes of them (``params``), floating-point tensors in float64.

    Raises
    ------
    Exception
        Whatever building or calling the processor raises (the check then tries the layouts it guesses).
    """
    processor = build_processor(model, config, vocab, special)
    placeholder = getattr(processor, 'image_token', None) or ''
    words = sorted((index, word) for word, index in processor.tokenizer.get_vocab().items() if word.startswith('w'))
    first, second = ' '.join(word for _, word in words[:2]), ' '.join(word for _, word in words[2:4])
    text = PROMPTS.get(model.config.model_type, '{first} {image} {second}').format(
        first=first, second=second, image=placeholder
    )
    outputs = processor(
        images=[small_image()], text=[text], return_tensors='pt', **CALLS.get(model.config.model_type, {})
    )
    inputs = {key: _double(value) for key, value in outputs.items() if key in params}
    if 'pixel_values' not in inputs:
        raise ValueError(f'{type(processor).__name__} gave no pixel_values (it gave {", ".join(outputs)})')
    return inputs
