"""Pixel inputs for the zoo walk (:py:mod:`zennit_attn.zoo`): what a vision tower of a tiny configuration takes.

:py:func:`pixel_inputs` completes the walk's text inputs of a model with a vision tower by pixels in a layout that the
model's forward runs, and by as many image placeholder tokens as the model's ``get_image_features`` gives for them
(or its error message names): ``[1, C, H, W]`` from ``vision_config.image_size`` / ``num_channels`` (LLaVA,
PaliGemma), flattened patches with ``image_grid_thw`` (Qwen2-VL), ``[1, 1, C, H, W]`` with ``pixel_attention_mask``
(Idefics), LLaVA-NeXT tiles with ``image_sizes``, patches with ``spatial_shapes`` (SigLIP2). Special token ids that lie
outside the shrunk vocabulary (the image placeholder) are moved into it. Where no layout runs, the text alone is
walked and the note says why.
"""

from __future__ import annotations

import contextlib
import inspect
import re

import torch
import transformers

__all__ = ['pixel_inputs']


#: Configuration fields that name a special token (image placeholder, vision start and end, ...).
_TOKEN_FIELD = re.compile(r'_token_(id|index)$')


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
        if _TOKEN_FIELD.search(key) and type(value) is int
    ]
    used = {value for _, _, value in fields if 0 <= value < vocab}
    moved, free, undo = {}, (index for index in range(vocab - 1, 3, -1) if index not in used), []
    for owner, key, value in fields:
        if value >= vocab:
            moved.setdefault(value, next(free))
            with contextlib.suppress(Exception):
                setattr(owner, key, moved[value])
                undo.append((owner, key, value))
    image = None
    for name in ('image_token_id', 'image_token_index'):
        for owner in [model.config, getattr(model.config, 'text_config', None)]:
            value = getattr(owner, name, None)
            if image is None and type(value) is int:
                image = value
    return image, used | set(moved.values()), undo


def _vision_field(vision, *names, default=None):
    for name in names:
        value = getattr(vision, name, None)
        if isinstance(value, dict):
            value = value.get('height', value.get('shortest_edge'))
        if isinstance(value, (list, tuple)) and value:
            value = value[0]
        if type(value) is int and value > 0:
            return value
    return default


def _pixel_layouts(model, config, params, generator, undo: list) -> list[tuple[str, dict, dict]]:
    """Pixel inputs consistent with the vision configuration, in the layouts the forward may take, each as
    ``(name, forward inputs, get_image_features inputs)``: flattened patches with ``image_grid_thw`` (Qwen2-VL),
    ``[1, C, H, W]`` (with ``image_sizes``, ``pixel_mask`` where the forward takes them; tiles of LLaVA-NeXT: one),
    ``[1, 1, C, H, W]`` (with ``pixel_attention_mask``: Idefics), patches with ``spatial_shapes`` (SigLIP2). A change to
    the configuration (LLaVA-NeXT's tile grid) is recorded in ``undo`` as ``(owner, field, old value)``."""
    vision = getattr(config, 'vision_config', None) or getattr(config, 'encoder', None) or config
    channels = _vision_field(vision, 'num_channels', 'in_channels', 'in_chans', default=3)
    patch = _vision_field(vision, 'patch_size', default=8)
    side = _vision_field(vision, 'image_size', default=4 * patch)
    merge = _vision_field(vision, 'spatial_merge_size', 'merge_size', default=1)

    def noise(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    layouts = []
    if 'image_grid_thw' in params:
        grid = 2 * merge
        frames = _vision_field(vision, 'temporal_patch_size', 'patch_temporal', default=1)
        for temporal in dict.fromkeys((frames, 2, 1)):
            pixels = {
                'pixel_values': noise(grid * grid, channels * temporal * patch * patch),
                'image_grid_thw': torch.tensor([[1, grid, grid]]),
            }
            if 'image_merge_sizes' in params:
                pixels['image_merge_sizes'] = torch.tensor([merge])
            layouts.append((f'patches x {temporal} frames', pixels, pixels))
    first = noise(1, channels, side, side)
    image = {'pixel_values': first}
    for name in params:  # further images at their own resolution (DeepSeek-VL hybrid: high_res_pixel_values)
        if name.endswith('_pixel_values'):
            other = getattr(config, name[: -len('pixel_values')] + 'vision_config', None)
            size = _vision_field(other, 'image_size', default=side)
            image[name] = noise(1, channels, size, size)
    layouts.append(('image', image, image))
    extras = {}
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
    nested = {'pixel_values': first[None]}
    if 'pixel_attention_mask' in params:
        nested['pixel_attention_mask'] = torch.ones(1, 1, side, side, dtype=torch.bool)
    layouts.append(('images', nested, {'pixel_values': first}))
    if 'spatial_shapes' in params:
        count = (side // patch) ** 2
        flat = {
            'pixel_values': noise(1, count, channels * patch * patch),
            'spatial_shapes': torch.tensor([[side // patch, side // patch]]),
            'pixel_attention_mask': torch.ones(1, count, dtype=torch.bool),
        }
        layouts.append(('patches with spatial_shapes', flat, flat))
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
    """Put pixels and ``n`` image placeholder tokens into ``inputs`` (in place) where a layout of
    :py:func:`_pixel_layouts` runs the model's plain forward; ``n`` is what the model's ``get_image_features`` gives
    (or what its error message names). The text only where none runs, saying why; where nothing runs on the
    embeddings and the text alone not even on ``input_ids`` (BLIP: pixels required), the pixels that run on
    ``input_ids`` (the model takes no ``inputs_embeds``: the walk refuses it by name).

    Parameters
    ----------
    model, config
        The tiny model (float64) and its configuration.
    inputs: dict
        The text inputs (``input_ids`` ...), completed in place.
    params
        The names of the forward's parameters (:py:func:`~zennit_attn.engine.modules.forward_parameters`).
    generator: torch.Generator
        Draws the text ids and the pixels.
    fails: callable
        ``fails(inputs, embeddings=True)``: the exception of the plain forward on ``inputs`` (on the embeddings as the
        walk explains, or on the ids), None where it runs.

    Returns
    -------
    str
        ``'text + image'`` or ``'text only: <why>'``.
    """
    if 'pixel_values' not in params:
        return 'text only: the forward takes no pixel_values'
    embeddings = model.get_input_embeddings()
    if embeddings is None or not hasattr(embeddings, 'weight'):
        return 'text only: no input embeddings'
    vocab, width = embeddings.weight.shape
    image, special, undo = _special_tokens(model, vocab)
    pool = torch.tensor([index for index in range(4, min(vocab, 90)) if index not in special])
    text = pool[torch.randint(len(pool), (6,), generator=generator)][None]
    errors, trials, rows = [], [], {}
    for layout, pixels, features in _pixel_layouts(model, config, params, generator, undo):
        key = tuple((name, id(value)) for name, value in features.items())  # layouts share the image: ask once
        if key not in rows:
            rows[key] = (0, None) if image is None else _feature_rows(model, features, width)
        count, error = rows[key]
        for _ in range(2):
            ids = text if not count else torch.cat([text[:, :2], torch.full((1, count), image), text[:, 2:]], 1)
            trial = {**inputs, 'input_ids': ids, **pixels}
            # the forward computes what get_image_features raised for these very pixels: no need to run it
            error = error if error is not None and features is pixels else fails(trial)
            if error is None:
                inputs.update(trial)
                return 'text + image'
            errors.append(f'{layout}: {type(error).__name__}: {_short(error)[:160]}')
            trials.append(trial)
            found = re.search(r'features\D{0,4}(\d+)', str(error))
            if image is None or not found or int(found.group(1)) == count:
                break
            count, error = int(found.group(1)), None
    changed = [(owner, key, getattr(owner, key)) for owner, key, _ in undo]
    for owner, key, value in undo:  # the text alone, as without a vision tower
        setattr(owner, key, value)
    note = 'text only: no pixel layout runs (' + '; '.join(dict.fromkeys(errors[:3])) + ')'
    if fails(inputs) is None or fails(inputs, embeddings=False) is None:
        return note  # the text alone runs (on the embeddings, or on the ids only: refused by name)
    for owner, key, value in changed:  # nothing runs without pixels: pixels on the ids, refused by name
        setattr(owner, key, value)
    for trial in trials:
        if fails(trial, embeddings=False) is None:
            inputs.update(trial)
            return 'text + image'
    for owner, key, value in undo:
        setattr(owner, key, value)
    return note


def _short(error: BaseException) -> str:
    return ' '.join(str(error).split())[:400]
