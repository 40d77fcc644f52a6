"""The multimodal tasks (see :py:mod:`zennit_attn.inputs.vision_language`): :py:class:`VisionLanguageTask` and
:py:class:`SimilarityTask`, which read relevance at the text embeddings and at the pixels in one backward pass, and
:py:func:`image_layout`, the layout the pixel relevance is read in.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping

import torch

from ...core.errors import UnsupportedModelError
from ...core.modules import is_encoder_decoder
from ...results.explanation import ImageRelevance, MultimodalExplanation
from ..checks import split_encoding
from ..task import TokenTask
from .inputs import (
    check_processor,
    image_token_id,
    is_similarity_model,
    model_inputs,
    rope_index,
    text_length,
)

__all__ = ['LAYOUTS', 'STRIP_FIELDS', 'image_layout', 'VisionLanguageTask', 'SimilarityTask', 'make_multimodal_task']

#: The pixel layouts whose relevance is read per image.
LAYOUTS = ('images', 'patches')

#: Fields that come with ``pixel_values`` laid out as one strip of patches, the slices of every image side by side
#: (MiniCPM-V: ``[1, channels, patch, patches x patch]``, the patch grid of each slice in ``target_sizes``): four
#: dimensions like ``[images, channels, height, width]``, but one strip for all images (two images were read as one)
STRIP_FIELDS = ('target_sizes',)


def _vision_config(model: torch.nn.Module):
    config = getattr(model, 'config', None)
    return getattr(config, 'vision_config', None) or config


def image_layout(model: torch.nn.Module, pixels: torch.Tensor, fields: Mapping) -> str:
    """The layout of ``pixel_values`` (:py:data:`LAYOUTS`): ``'patches'`` with ``image_grid_thw``, ``'images'`` for
    ``[images, channels, height, width]``.

    Raises
    ------
    ValueError
        For any other layout, naming the shape and the model.
    """
    if 'image_grid_thw' in fields:
        if pixels.dim() != 2:
            raise ValueError(
                f'{type(model).__name__}: pixel_values with image_grid_thw must be flattened patches '
                f'[patches, features], got shape {tuple(pixels.shape)}'
            )
        return 'patches'
    strip = [field for field in STRIP_FIELDS if field in fields]
    if strip:
        raise ValueError(
            f'{type(model).__name__} takes pixel_values of shape {tuple(pixels.shape)} with {strip[0]}: the patches '
            'of every image slice side by side in one strip, which zennit-attn cannot split into images; it reads '
            'pixel relevance in the layouts [images, channels, height, width] (LLaVA, CLIP, PaliGemma) and flattened '
            'patches with image_grid_thw (Qwen2-VL, Qwen2.5-VL)'
        )
    if pixels.dim() == 4:
        return 'images'
    raise ValueError(
        f'{type(model).__name__} takes pixel_values of shape {tuple(pixels.shape)}: zennit-attn reads pixel relevance '
        'in the layouts [images, channels, height, width] (LLaVA, CLIP, PaliGemma) and flattened patches with '
        'image_grid_thw (Qwen2-VL, Qwen2.5-VL); this layout (e.g. Idefics3/SmolVLM [batch, images, channels, height, '
        'width], LLaVA-NeXT tiles) is not supported'
    )


def _patch_size(model: torch.nn.Module) -> int:
    size = getattr(_vision_config(model), 'patch_size', None)
    if isinstance(size, (list, tuple)):
        size = size[0]
    if not isinstance(size, int):
        raise TypeError(f'cannot tell the patch size of {type(model).__name__} (config.vision_config.patch_size)')
    return size


def _images(model, pixels, relevance, layout, fields, rows, mean, std) -> list[ImageRelevance]:
    """Every image of ``pixels`` with its relevance, in its own layout (see
    :py:class:`~zennit_attn.results.explanation.ImageRelevance`)."""
    patch = _patch_size(model)
    found = []
    if layout == 'images':
        for index in range(pixels.shape[0]):
            height, width = pixels.shape[2:]
            if height % patch or width % patch:
                raise ValueError(
                    f'image {index} is {height} x {width} pixels, not a whole number of {patch}-pixel patches'
                )
            per_pixel = relevance[index].sum(0)
            patches = per_pixel.reshape(height // patch, patch, width // patch, patch).sum((1, 3))
            found.append(ImageRelevance(rows[index], pixels[index], relevance[index], patches, mean, std))
        return found
    config = _vision_config(model)
    merge = int(getattr(config, 'spatial_merge_size', 1))
    temporal = int(getattr(config, 'temporal_patch_size', 1))
    channels = pixels.shape[1] // (temporal * patch * patch)
    if channels * temporal * patch * patch != pixels.shape[1]:
        raise ValueError(f'{pixels.shape[1]} features per patch are not channels x {temporal} x {patch} x {patch}')
    offset = 0
    for index, (frames, grid_h, grid_w) in enumerate(fields['image_grid_thw'].tolist()):
        count = frames * grid_h * grid_w
        shape = (frames, grid_h // merge, grid_w // merge, merge, merge, channels, temporal, patch, patch)
        size = (frames * temporal, channels, grid_h * patch, grid_w * patch)
        flat_pixels, flat_relevance = pixels[offset : offset + count], relevance[offset : offset + count]
        patches = flat_relevance.sum(1).reshape(shape[:5]).permute(0, 1, 3, 2, 4).reshape(frames, grid_h, grid_w)
        image_pixels, image_relevance = _unflatten(flat_pixels, shape, size), _unflatten(flat_relevance, shape, size)
        found.append(ImageRelevance(rows[index], image_pixels[0], image_relevance.sum(0), patches.sum(0), mean, std))
        offset += count
    if offset != pixels.shape[0]:
        raise ValueError(f'image_grid_thw covers {offset} patches, pixel_values has {pixels.shape[0]}')
    return found


def _unflatten(flat: torch.Tensor, shape: tuple, size: tuple) -> torch.Tensor:
    """The flattened patches ``flat`` of one image (``[patches, channels * temporal * patch * patch]`` in the order of
    the Qwen2-VL processor, ``shape`` their grid ``(frames, rows, columns, merge, merge, channels, temporal, patch,
    patch)``) as pixels ``size``: ``[frames * temporal, channels, height, width]``."""
    return flat.reshape(shape).permute(0, 6, 5, 1, 3, 7, 2, 4, 8).reshape(size)


def _refuse_other_pixels(model: torch.nn.Module, encoding: Mapping) -> None:
    """Refuse a floating-point input of the model besides ``pixel_values`` that is not a mask (DeepSeek-VL hybrid's
    ``high_res_pixel_values``: the image again, at the resolution of a second tower): its share of the relevance would
    be lost (text + pixel relevance would not be the explained logit), or the forward fail on its dtype."""
    others = [
        key
        for key, value in encoding.items()
        if isinstance(value, torch.Tensor) and value.is_floating_point() and 'mask' not in key
    ]
    if others:
        raise ValueError(
            f'{type(model).__name__} takes the image also as {", ".join(others)}: zennit-attn reads pixel relevance '
            'from pixel_values alone, and would lose the share of the other pixel inputs'
        )


class _PixelLeaf:
    """The second LRP leaf of the multimodal tasks: the pixels, passed as ``pixel_values``.

    Padding keeps its relevance: a model that ignores its padding (the attention mask) gives it none, and padding a
    model reads (:py:meth:`_check_padding`) is either an input of it (SigLIP's texts padded to the length it was
    trained with) or refused, never zeroed (that would lose relevance, silently)."""

    pixels: torch.Tensor

    def __init__(self, model: torch.nn.Module, encoding: Mapping, model_kwargs: dict | None = None, processor=None):
        encoding = model_inputs(model, encoding)
        pixels = encoding.pop('pixel_values', None)
        if pixels is None:
            raise ValueError('the encoding has no pixel_values: pass images to the processor')
        _refuse_other_pixels(model, encoding)
        super().__init__(model, encoding, None, model_kwargs)
        self.processor = processor
        self.pixels = self._check_pixels(pixels)
        _patch_size(model)  # read for the images' patches: refused here, before the passes, where it cannot be told

    def _check_pixels(self, pixels) -> torch.Tensor:
        if not isinstance(pixels, torch.Tensor) or not pixels.is_floating_point():
            raise ValueError(
                f'pixel_values must be a floating-point tensor, got {getattr(pixels, "dtype", type(pixels).__name__)}'
            )
        if not bool(torch.isfinite(pixels).all()):
            raise ValueError('pixel_values are NaN or infinite: a faulty image or normalisation')
        return pixels.detach().to(self.inputs.device, self.inputs.dtype)

    def base_kwargs(self) -> dict:
        kwargs = super().base_kwargs()
        kwargs['pixel_values'] = self.pixels
        return kwargs

    def lrp_leaves(self) -> tuple[list[torch.Tensor], dict]:
        leaves, extra = super().lrp_leaves()
        leaves.append(self.pixels.clone().requires_grad_(True))
        extra['pixel_values'] = leaves[-1]
        return leaves, extra

    def _package(self, relevance, logit, method, pixel_relevance, rows, image_tokens):
        if pixel_relevance is None:
            raise NotImplementedError(
                f'{method} gives no pixel relevance: explain text and images with the LRP methods (attnlrp, cplrp)'
            )
        mask = self.attention_mask
        self.attention_mask = None  # the text's relevance as it is (TokenTask.package zeroes padding)
        try:
            text = super().package(relevance, logit, method, None)
        finally:
            self.attention_mask = mask
        self._check_padding(text.relevance)
        if torch.finfo(pixel_relevance.dtype).bits < 32:
            pixel_relevance = pixel_relevance.float()
        processor = getattr(self, 'processor', None)
        image_processor = getattr(processor, 'image_processor', None)
        mean, std = (getattr(image_processor, name, None) for name in ('image_mean', 'image_std'))
        images = _images(
            self.model,
            self.pixels,
            pixel_relevance,
            self.layout,
            self.model_kwargs,
            rows,
            None if mean is None else tuple(mean),
            None if std is None else tuple(std),
        )
        fields = {name: getattr(text, name) for name in text.__dataclass_fields__}
        fields['attention_mask'] = mask
        return MultimodalExplanation(
            **fields, pixel_relevance=pixel_relevance, images=images, image_tokens=image_tokens
        )

    def padding_is_input(self) -> bool:
        """Whether the padding of the text is an input of the model, whose relevance is kept (SigLIP's padding to the
        length it was trained with); otherwise padding that gets relevance is refused."""
        return False

    def _check_padding(self, relevance: torch.Tensor) -> None:
        """Refuse a text whose padding the model reads (its pads get relevance: pooling or attention that ignores
        the attention mask), unless the padding is an input of the model (:py:meth:`padding_is_input`): such a row
        is not its text alone, and zeroing the pads' relevance would lose it."""
        if self.attention_mask is None:
            return
        pads = (self.attention_mask == 0).to(relevance.device)
        reached = (relevance.abs() * pads).amax(-1)
        rows = (reached != 0).nonzero()[:, 0].tolist()
        if not rows or self.padding_is_input():
            return
        row = rows[0]
        name = type(self.model).__name__
        length = text_length(self.model)
        if length is not None:
            hint = (
                f'{name} was trained on texts padded to {length} tokens: pass the texts with images= (explain() '
                f'pads them so) or pad them so yourself (processor(..., padding="max_length", '
                f'max_length={length}))'
            )
        else:
            hint = 'explain the texts one at a time, without padding'
        raise ValueError(
            f'{name} reads the padding of row {row}: its pads get relevance {float(reached[row]):.3g} '
            '(its pooling or attention does not ignore the attention mask), so the padded row is not '
            f'explained as its text alone; {hint}'
        )


class VisionLanguageTask(_PixelLeaf, TokenTask):
    """A generative vision-language model explained at its text embeddings and pixels.

    Parameters
    ----------
    model: torch.nn.Module
        E.g. ``LlavaForConditionalGeneration``, ``Qwen2VLForConditionalGeneration``, in eval mode.
    encoding: mapping
        The processor's output (:py:func:`~.encode_multimodal`) for one text: ``input_ids``, ``pixel_values`` and the
        model's further fields.
    model_kwargs: dict, optional
        Further keyword arguments of the model's forward.
    processor: optional
        The processor (its image normalisation is undone for the overlays).
    """

    def __init__(self, model: torch.nn.Module, encoding: Mapping, model_kwargs: dict | None = None, processor=None):
        super().__init__(model, encoding, model_kwargs, processor)
        if self.batch != 1:
            raise ValueError(f'a vision-language model explains one text at a time, got {self.batch} rows')
        self.layout = image_layout(model, self.pixels, self.model_kwargs)
        token = image_token_id(model)
        self.image_tokens = (self.input_ids == token) if token is not None else None
        self._rope_positions()

    def _rope_positions(self) -> None:
        """Multimodal rotary positions (Qwen2-VL): ``position_ids`` from the model's own ``get_rope_index`` (with the
        attention mask, which counts left-padded rows from their first token), unless the caller gave them."""
        function = rope_index(self.model)
        if function is None or ('position_ids' in self.model_kwargs and not self.padded_positions):
            return
        names = inspect.signature(function).parameters
        fields = {key: value for key, value in self.model_kwargs.items() if key in names and key != 'input_ids'}
        with torch.no_grad():
            self.model_kwargs['position_ids'] = function(self.input_ids, **fields)[0]

    def position_sequence(self, name: str) -> str:
        """:py:meth:`~zennit_attn.inputs.task.Task.position_sequence`: the text's (``'input'``) for an encoding inside
        the language model (``model.get_decoder()``), the vision tower's (``'vision'``, which PA-LRP does not read:
        :py:meth:`~zennit_attn.inputs.task.TokenTask.add_position_relevance` refuses it) for the others; before, a
        vision tower's table whose length happened to equal the text's was summed with the text's positions."""
        return 'input' if self.inside(name, self.model.get_decoder()) else 'vision'

    def package(self, relevance, logit, method, decoder_relevance):
        """``decoder_relevance`` is the second LRP leaf's: the pixels'."""
        return self._package(relevance, logit, method, decoder_relevance, [0] * self._image_count(), self.image_tokens)

    def _image_count(self) -> int:
        if self.layout == 'patches':
            return int(self.model_kwargs['image_grid_thw'].shape[0])
        return int(self.pixels.shape[0])


class SimilarityTask(_PixelLeaf, TokenTask):
    """An image-text similarity model (CLIP) explained at the text embeddings and pixels of each (text, image) pair.

    Row ``r`` is text ``r`` with image ``r`` (a single image is paired with every text); its explained value is the
    similarity score ``logits_per_text[r, r]``, the logit scale included. The rows are independent: each row's text
    and pixel relevance sum to its own score (minus what biases absorb), and equal those of the pair explained alone.

    Padding: CLIP-like models pool a token before the padding and mask the pads, which get no relevance. SigLIP
    (:py:data:`~.LAST_POSITION_POOLING`) pools the last position, a pad in a padded text: its texts are padded to the
    length it was trained with (:py:func:`~.text_length`, done by :py:func:`~.encode_multimodal`), alone as in a
    batch, and the pads are inputs that keep their relevance (the last pad's, the pooled position's own, is in
    ``relevance`` and :py:meth:`~zennit_attn.results.explanation.MultimodalExplanation.total`; the heatmaps leave
    padding out). A batch whose padding the model reads otherwise is refused.

    Parameters
    ----------
    model: torch.nn.Module
        E.g. ``CLIPModel``, in eval mode.
    encoding: mapping
        The processor's output (:py:func:`~.encode_multimodal`): ``input_ids`` ``[texts, seq]``, ``pixel_values``
        ``[1 or texts, channels, height, width]``.
    model_kwargs: dict, optional
    processor: optional
    """

    def __init__(self, model: torch.nn.Module, encoding: Mapping, model_kwargs: dict | None = None, processor=None):
        super().__init__(model, encoding, model_kwargs, processor)
        pixels = self.pixels
        self.layout = image_layout(model, pixels, self.model_kwargs)
        if pixels.shape[0] not in (1, self.batch):
            raise ValueError(
                f'pixel_values of shape {tuple(pixels.shape)} for {self.batch} texts: give one image or one per text'
            )
        self.pixels = pixels.expand(self.batch, *pixels.shape[1:]).clone()

    @staticmethod
    def word_embeddings(model: torch.nn.Module) -> torch.nn.Module | None:
        text_model = getattr(model, 'text_model', None)
        return text_model.get_input_embeddings() if text_model is not None else TokenTask.word_embeddings(model)

    def lrp_forward(self, inputs, model, **extra):
        """The pair scores (``logits_per_text``); the text embeddings' relevance is read as in
        :py:meth:`~zennit_attn.inputs.task.TokenTask.lrp_forward` (CLIP's forward takes ``input_ids`` only)."""
        if self.lookups is not None:
            self.lookups.record()
        return self.forward(inputs, None, model, **extra)

    def _set_model_kwargs(self) -> None:
        """The attention mask; texts padded on the left are refused (except where the padding is an input,
        :py:meth:`padding_is_input`): a left-padded text would be another input than the text alone, its tokens at
        later positions (CLIP's learned positions: the score 4.53 where the text alone scores 0.50) or its pooled
        first token a pad (BLIP, Chinese-CLIP), which the padding check cannot see where a pad's embedding is 0."""
        if self.attention_mask is None:
            return
        self.model_kwargs['attention_mask'] = self.attention_mask
        if bool((self.attention_mask[:, 0] == 0).any()) and not self.padding_is_input():
            raise ValueError(
                f'{type(self.model).__name__}: the texts are padded on the left, so a padded text is not the text '
                'alone (its tokens at later positions, or a pad where the model pools its first token); pad them on '
                "the right (tokenizer.padding_side = 'right', the processors' default)"
            )

    def forward(self, inputs, rows=None, model=None, **extra):
        output = self.run(inputs, rows, model, **extra)
        return output.logits_per_text

    def resolve(self, scores, position=-1, target=None, initial_relevance: bool = False):
        if target is not None:
            raise ValueError(
                f'{type(self.model).__name__} scores (text, image) pairs: each row explains its own pair; '
                'leave out target='
            )
        return super().resolve(scores, None, torch.arange(self.batch, device=scores.device), initial_relevance)

    def keep_logits(self, position=-1, target=None) -> dict:
        return {}

    def padding_is_input(self) -> bool:
        """SigLIP's texts padded to the length it was trained with (:py:func:`~.text_length`)."""
        length = text_length(self.model)
        return length is not None and self.input_ids.shape[1] == length

    def package(self, relevance, logit, method, decoder_relevance):
        """``decoder_relevance`` is the second LRP leaf's: the pixels'."""
        return self._package(relevance, logit, method, decoder_relevance, list(range(self.batch)), None)


def make_multimodal_task(
    model: torch.nn.Module, encoding: Mapping, model_kwargs: dict | None = None, processor=None
) -> TokenTask:
    """The :py:class:`SimilarityTask` (CLIP-like models) or :py:class:`VisionLanguageTask` for ``model``, after
    :py:func:`~.check_processor`.

    Raises
    ------
    UnsupportedModelError
        For an encoder-decoder model (T5Gemma 2, UDOP): with images zennit-attn explains decoder-only models, whose
        text is the whole input, and similarity models.
    """
    _, _, fields = split_encoding(encoding)
    if 'pixel_values' not in fields:
        raise ValueError('the processor returned no pixel_values')
    if is_encoder_decoder(model):
        raise UnsupportedModelError(
            f'{type(model).__name__} is an encoder-decoder model: with images, zennit-attn explains decoder-only '
            'vision-language models (whose text is the whole input) and image-text similarity models; explain its '
            'text alone (tokenizer=), without images'
        )
    check_processor(model, encoding, processor, model_kwargs)
    task = SimilarityTask if is_similarity_model(model) else VisionLanguageTask
    return task(model, encoding, model_kwargs, processor)
