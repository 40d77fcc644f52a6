"""Pixel inputs for the architecture check (:py:mod:`~zennit_attn.workflows.architecture_check.check`): what a
vision tower of a tiny configuration takes.

:py:func:`pixel_inputs` completes the check's text inputs of a model with a vision tower by the outputs of the
architecture's own processor (:py:mod:`~zennit_attn.workflows.architecture_check.processors`: tiling, aspect-ratio
ids, cross-attention masks, patches and crops as the processor lays them out; noted :py:data:`VIA_PROCESSOR`) where
the model's forward runs on them. Otherwise, it tries pixels in a layout guessed from the configuration, with as many
image placeholder tokens as the model's ``get_image_features`` gives for them (or its error message names), noted
:py:data:`VIA_LAYOUT` with why the processor was not used: ``[1, C, H, W]`` from ``vision_config.image_size`` /
``num_channels`` (LLaVA, PaliGemma), flattened patches with ``image_grid_thw`` (Qwen2-VL), ``[1, 1, C, H, W]`` with
``pixel_attention_mask`` (Idefics), LLaVA-NeXT tiles with ``image_sizes``, patches with ``spatial_shapes`` (SigLIP2).
Special token ids that lie outside the shrunk vocabulary (the image placeholder; also lists of ids) are moved into it.
Where nothing runs, the text alone is checked and the note says why. The check verifies the pixels either way: they
must carry relevance, and text plus pixel relevance must be the explained logit.
"""

from __future__ import annotations

import contextlib
import inspect
import re
from collections.abc import Callable

import torch
import transformers

from .processors import processor_inputs, vision_field

__all__ = ['pixel_inputs', 'short_message', 'VIA_PROCESSOR', 'VIA_LAYOUT', 'PIXEL_INPUTS']

#: The names under which a forward takes an image's pixels (not Kosmos-2.5's and Pix2Struct's ``flattened_patches``:
#: their columns of row and column ids are read as integers, which the engine refuses on relevance-carrying tensors).
PIXEL_INPUTS = ('pixel_values',)

#: What the check notes for pixels made by the architecture's processor, and for pixels in a layout it guesses.
VIA_PROCESSOR = 'text + image (pixels via processor)'
VIA_LAYOUT = 'text + image (pixels via layout'

#: A layout of pixel inputs: ``(name, forward inputs, get_image_features inputs)``.
Layout = tuple[str, dict, dict]


def short_message(error: BaseException) -> str:
    """The message of ``error`` on one line, at most 400 characters."""
    return ' '.join(str(error).split())[:400]


#: Configuration fields that name a special token (image placeholder, vision start and end, ...).
_TOKEN_FIELD = re.compile(r'_token_(id|index|ids)$')


def _token_aliases(owner) -> set[str]:
    """The fields that a configuration's ``attribute_map`` names as token ids (Molmo 2's ``image_patch_id``, read as
    ``image_token_id``)."""
    aliases = getattr(type(owner), 'attribute_map', None) or {}
    return {field for name, field in aliases.items() if _TOKEN_FIELD.search(name)}


def _ids(value) -> tuple[int, ...]:
    """The token ids of a configuration field's value (an id, or a list or tuple of ids; none for anything else)."""
    if type(value) is int:
        return (value,)
    if isinstance(value, (list, tuple)) and value and all(type(item) is int for item in value):
        return tuple(value)
    return ()


def _moved(value, vocab: int, moved: dict, free):
    """``value`` (an id, or a list or tuple of ids) with each id outside the vocabulary of ``vocab`` ids replaced by
    its new id (``moved``: the moves so far, extended from the free ids ``free``)."""
    for index in _ids(value):
        if index >= vocab:
            moved.setdefault(index, next(free))
    if type(value) is int:
        return moved.get(value, value)
    return type(value)(moved.get(index, index) for index in value)


def _special_tokens(model, vocab: int) -> tuple[int | None, set[int], list]:
    """The image placeholder id and every special token id of the model's configurations, after moving the ids that
    lie outside the shrunk vocabulary into it (the top free ids, on the configurations and on the modules that copied
    them: the model reads them at forward time), and ``(owner, field, old value)`` of each move, to undo it."""
    configs = {}
    for module in model.modules():
        config = getattr(module, 'config', None)
        for item in (config, getattr(config, 'text_config', None)):
            if isinstance(item, transformers.PretrainedConfig):
                configs[id(item)] = item
    fields = [
        (owner, key, value)
        for owner in [*configs.values(), *model.modules()]
        for key, value in list(vars(owner).items())
        if (_TOKEN_FIELD.search(key) or key in _token_aliases(owner)) and _ids(value)
    ]
    used = {index for _, _, value in fields for index in _ids(value) if 0 <= index < vocab}
    moved, free, undo = {}, (index for index in range(vocab - 1, 3, -1) if index not in used), []
    for owner, key, value in fields:
        if any(index >= vocab for index in _ids(value)):
            with contextlib.suppress(Exception):
                setattr(owner, key, _moved(value, vocab, moved, free))
                undo.append((owner, key, value))
    image = None
    for name in ('image_token_id', 'image_token_index'):
        for owner in [model.config, getattr(model.config, 'text_config', None)]:
            value = getattr(owner, name, None)
            if image is None and type(value) is int:
                image = value
    return image, used | set(moved.values()), undo


def _pixel_layouts(model, config, params, generator, undo: list) -> list[Layout]:
    """Pixel inputs consistent with the vision configuration, in the layouts the forward may take, each as
    ``(name, forward inputs, get_image_features inputs)``: flattened patches with ``image_grid_thw`` (Qwen2-VL),
    ``[1, C, H, W]`` (with ``image_sizes``, ``pixel_mask`` where the forward takes them; tiles of LLaVA-NeXT: one),
    ``[1, 1, C, H, W]`` (with ``pixel_attention_mask``: Idefics), patches with ``spatial_shapes`` (SigLIP2). A change to
    the configuration (LLaVA-NeXT's tile grid) is recorded in ``undo`` as ``(owner, field, old value)``. The pixels are
    drawn from ``generator`` in the order of the layouts."""
    vision = getattr(config, 'vision_config', None) or getattr(config, 'encoder', None) or config
    channels = vision_field(vision, 'num_channels', 'in_channels', 'in_chans', default=3)
    patch = vision_field(vision, 'patch_size', default=8)
    side = vision_field(vision, 'image_size', default=4 * patch)
    merge = vision_field(vision, 'spatial_merge_size', 'merge_size', default=1)

    def noise(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    layouts = _grid_layouts(vision, params, channels * patch * patch, merge, noise)
    image = _image(config, params, channels, side, noise)
    layouts.append(('image', image, image))
    layouts += _sized_layouts(model, params, image, (channels, side), noise, undo)
    nested = {'pixel_values': image['pixel_values'][None]}
    if 'pixel_attention_mask' in params:
        nested['pixel_attention_mask'] = torch.ones(1, 1, side, side, dtype=torch.bool)
    layouts.append(('images', nested, {'pixel_values': image['pixel_values']}))
    if 'spatial_shapes' in params:
        count = (side // patch) ** 2
        flat = {
            'pixel_values': noise(1, count, channels * patch * patch),
            'spatial_shapes': torch.tensor([[side // patch, side // patch]]),
            'pixel_attention_mask': torch.ones(1, count, dtype=torch.bool),
        }
        layouts.append(('patches with spatial_shapes', flat, flat))
    return layouts


def _grid_layouts(vision, params, patch_values: int, merge: int, noise: Callable) -> list[Layout]:
    """Flattened patches with ``image_grid_thw`` (Qwen2-VL; ``image_merge_sizes`` where the forward takes it), a grid
    of ``2 * merge`` patches a side, ``patch_values`` values per patch and frame, for each number of frames a temporal
    patch may have; none where the forward takes no ``image_grid_thw``."""
    layouts = []
    if 'image_grid_thw' not in params:
        return layouts
    grid = 2 * merge
    frames = vision_field(vision, 'temporal_patch_size', 'patch_temporal', default=1)
    for temporal in dict.fromkeys((frames, 2, 1)):
        pixels = {
            'pixel_values': noise(grid * grid, temporal * patch_values),
            'image_grid_thw': torch.tensor([[1, grid, grid]]),
        }
        if 'image_merge_sizes' in params:
            pixels['image_merge_sizes'] = torch.tensor([merge])
        layouts.append((f'patches x {temporal} frames', pixels, pixels))
    return layouts


def _image(config, params, channels: int, side: int, noise: Callable) -> dict:
    """One ``[1, C, H, W]`` image, and the same at the resolution of each further image input of the forward
    (DeepSeek-VL hybrid: ``high_res_pixel_values`` at its ``high_res_vision_config``'s size)."""
    image = {'pixel_values': noise(1, channels, side, side)}
    for name in params:
        if name.endswith('_pixel_values'):
            other = getattr(config, name[: -len('pixel_values')] + 'vision_config', None)
            size = vision_field(other, 'image_size', default=side)
            image[name] = noise(1, channels, size, size)
    return image


def _sized_layouts(model, params, image: dict, shape: tuple[int, int], noise: Callable, undo: list) -> list[Layout]:
    """The image with ``image_sizes`` and ``pixel_mask`` where the forward takes them, and LLaVA-NeXT's tiles (one
    tile: its grid pinpoints set to the image's size, recorded in ``undo``); ``shape`` is ``(channels, side)``."""
    channels, side = shape
    layouts, extras = [], {}
    if 'image_sizes' in params:
        extras['image_sizes'] = torch.tensor([[side, side]])
        if isinstance(getattr(model.config, 'image_grid_pinpoints', None), list):
            undo.append((model.config, 'image_grid_pinpoints', model.config.image_grid_pinpoints))
            model.config.image_grid_pinpoints = [[side, side]]  # one tile (the default pinpoints make hundreds)
            tiles = {'pixel_values': noise(1, 2, channels, side, side), **extras}
            layouts.append(('tiles', tiles, tiles))
    if 'pixel_mask' in params:
        extras['pixel_mask'] = torch.ones(1, side, side, dtype=torch.long)
    if extras:
        layouts.append(('image', {**image, **extras}, {**image, **extras}))
    return layouts


def _feature_rows(model, pixels: dict, width: int) -> tuple[int | None, Exception | None]:
    """How many text positions the image takes: the rows of the model's ``get_image_features`` (``None`` where it
    does not tell), and the exception it raised."""
    error = None
    for owner in (model, getattr(model, 'model', None)):
        features = getattr(owner, 'get_image_features', None)
        if features is None:
            continue
        try:
            names = inspect.signature(features).parameters
            with torch.no_grad():
                output = features(**{key: value for key, value in pixels.items() if key in names})
        except Exception as raised:
            error = raised
            continue
        pooled = getattr(output, 'pooler_output', None)
        output = pooled if pooled is not None else output
        if not isinstance(output, torch.Tensor):
            output = output[0] if isinstance(output, dict) else output
        tensors = (
            [output]
            if isinstance(output, torch.Tensor)
            else [item for item in output if isinstance(item, torch.Tensor)]
        )
        total = sum(tensor.numel() for tensor in tensors)
        return (total // width if tensors and total % width == 0 else None), None
    return None, error


def pixel_inputs(model, config, inputs: dict, params, generator: torch.Generator, fails) -> str:
    """Put the processor's ids and pixels into ``inputs`` (in place) where the model's plain forward runs on them;
    else pixels and ``n`` image placeholder tokens where a layout of :py:func:`_pixel_layouts` runs it; ``n`` is what
    the model's ``get_image_features`` gives (or what its error message names). The text only where none runs, saying
    why; where nothing runs on the embeddings and the text alone not even on ``input_ids`` (BLIP: pixels required),
    the pixels that run on ``input_ids`` (the model takes no ``inputs_embeds``: the check refuses it by name).

    Parameters
    ----------
    model, config
        The tiny model (float64) and its configuration.
    inputs: dict
        The text inputs (``input_ids`` ...), completed in place.
    params
        The names of the forward's parameters.
    generator: torch.Generator
        Draws the text ids and the pixels.
    fails: callable
        ``fails(inputs, embeddings=True)``: the exception of the plain forward on ``inputs`` (on the embeddings as the
        check explains, or on the ids), None where it runs.

    Returns
    -------
    str
        :py:data:`VIA_PROCESSOR`, ``VIA_LAYOUT + '; the processor: <why not>)'`` or ``'text only: <why>'``.
    """
    if not set(PIXEL_INPUTS) & set(params):
        return 'text only: the forward takes no pixel_values'
    embeddings = model.get_input_embeddings()
    if embeddings is None or not hasattr(embeddings, 'weight'):
        return 'text only: no input embeddings'
    vocab, width = embeddings.weight.shape
    image, special, undo = _special_tokens(model, vocab)
    processed = _via_processor(model, config, inputs, (vocab, special, params), fails)
    if processed is None:
        return VIA_PROCESSOR
    pool = torch.tensor([index for index in range(4, min(vocab, 90)) if index not in special])
    text = pool[torch.randint(len(pool), (6,), generator=generator)][None]
    trials = _Trials(model, inputs, text, image, width, fails)
    for layout in _pixel_layouts(model, config, params, generator, undo):
        if trials.run(*layout):
            return f'{VIA_LAYOUT}; the processor: {processed})'
    return _without_a_layout(inputs, trials, undo, fails, processed)


def _via_processor(model, config, inputs: dict, tokens: tuple, fails) -> str | None:
    """Put the pixels and ids of the architecture's own processor
    (:py:func:`~zennit_attn.workflows.architecture_check.processors.processor_inputs`) into ``inputs`` where the
    model's plain forward runs on them; None then, else why not (``'<error type>: <message>'``). ``tokens``:
    ``(vocabulary size, the reserved special ids, the forward's parameter names)``."""
    vocab, special, params = tokens
    try:
        trial = {**inputs, **processor_inputs(model, config, vocab, special, params)}
    except Exception as error:  # no processor, or one that the tiny configuration does not fit
        return f'{type(error).__name__}: {short_message(error)[:160]}'
    error = fails(trial)
    if error is not None:
        return f'the forward on its outputs: {type(error).__name__}: {short_message(error)[:160]}'
    inputs.update(trial)
    return None


class _Trials:
    """The plain forward on the text with the pixels of each layout, and what failed.

    Attributes
    ----------
    errors: list of str
        ``'layout: error'`` of each failed trial.
    tried: list of dict
        The inputs of each failed trial.
    """

    def __init__(self, model, inputs: dict, text: torch.Tensor, image: int | None, width: int, fails):
        self.model, self.inputs, self.text, self.image, self.width, self.fails = (
            model,
            inputs,
            text,
            image,
            width,
            fails,
        )
        self.errors: list[str] = []
        self.tried: list[dict] = []
        self.rows: dict = {}

    def run(self, layout: str, pixels: dict, features: dict) -> bool:
        """Whether the forward runs on the text with ``pixels`` and as many image placeholders as the model's
        ``get_image_features`` gives for ``features`` (at most twice: again with the count that an error message
        names); where it runs, the trial is put into the inputs."""
        key = tuple((name, id(value)) for name, value in features.items())  # layouts share the image: ask once
        if key not in self.rows:
            self.rows[key] = (0, None) if self.image is None else _feature_rows(self.model, features, self.width)
        count, error = self.rows[key]
        for _ in range(2):
            ids = (
                self.text
                if not count
                else torch.cat([self.text[:, :2], torch.full((1, count), self.image), self.text[:, 2:]], 1)
            )
            trial = {**self.inputs, 'input_ids': ids, **pixels}
            # the forward computes what get_image_features raised for these very pixels: no need to run it
            error = error if error is not None and features is pixels else self.fails(trial)
            if error is None:
                self.inputs.update(trial)
                return True
            self.errors.append(f'{layout}: {type(error).__name__}: {short_message(error)[:160]}')
            self.tried.append(trial)
            found = re.search(r'features\D{0,4}(\d+)', str(error))
            if self.image is None or not found or int(found.group(1)) == count:
                return False
            count, error = int(found.group(1)), None
        return False


def _without_a_layout(inputs: dict, trials: _Trials, undo: list, fails, processed: str) -> str:
    """Where no layout runs: the text alone (the configuration's changes undone), saying why; where the text alone
    does not run at all, the pixels of a trial that runs on the ids (``'text + image'``: the model takes no
    ``inputs_embeds``, which the check refuses by name); ``processed``: why the processor's pixels did not run."""
    changed = [(owner, key, getattr(owner, key)) for owner, key, _ in undo]
    for owner, key, value in undo:  # the text alone, as without a vision tower
        setattr(owner, key, value)
    note = (
        f'text only: the processor: {processed}; no pixel layout runs ('
        + '; '.join(dict.fromkeys(trials.errors[:2]))
        + ')'
    )
    if fails(inputs) is None or fails(inputs, embeddings=False) is None:
        return note  # the text alone runs (on the embeddings, or on the ids only: refused by name)
    for owner, key, value in changed:  # nothing runs without pixels: pixels on the ids, refused by name
        setattr(owner, key, value)
    for trial in trials.tried:
        if fails(trial, embeddings=False) is None:
            inputs.update(trial)
            return f'{VIA_LAYOUT}; the processor: {processed})'
    for owner, key, value in undo:
        setattr(owner, key, value)
    return note
