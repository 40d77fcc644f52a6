"""Text and images in one request: vision-language models (LLaVA, Qwen2-VL) and image-text similarity models (CLIP).

A Hugging Face processor (``ProcessorMixin``) turns text and images into ``input_ids``, ``attention_mask``,
``pixel_values`` and the model's further fields (``image_grid_thw``, ``image_sizes``, ``mm_token_type_ids``, ...),
which are all passed on to the model (:py:func:`encode_multimodal`). The tasks extend
:py:class:`~zennit_attn.task.TokenTask` by a second LRP leaf, the pixels: relevance flows to the word embeddings of
the text (``inputs_embeds``) and to ``pixel_values`` in one backward pass, and the result is a
:py:class:`~zennit_attn.explanation.MultimodalExplanation`.

- :py:class:`VisionLanguageTask`: a generative VLM explained at the next-token logit, as a language model. The image
  placeholder tokens stay in ``input_ids``; the model finds them in ``inputs_embeds`` (it compares each embedding with
  the image token's) and scatters the image features there. Models with multimodal rotary positions (Qwen2-VL,
  Qwen2.5-VL) get the position ids their own ``get_rope_index`` computes from the ids, as their forward on
  ``input_ids`` would.
- :py:class:`SimilarityTask`: CLIP-like models, one row per (text, image) pair explained at
  ``logits_per_text[row, row]``; a single image is paired with every text.

For a generated answer (:py:func:`~zennit_attn.explain_generation` with images), :py:func:`extend_encoding` makes the
prompt's encoding that of a prefix of prompt and answer, and :py:func:`placeholder_tokens` names the tokens that are
not to be generated.

Pixel layouts (:py:func:`image_layout`): ``'images'``, ``[images, channels, height, width]`` (LLaVA, CLIP, PaliGemma)
and ``'patches'``, flattened patches ``[patches, channels * temporal * patch * patch]`` with ``image_grid_thw``
(Qwen2-VL, Qwen2.5-VL); other layouts (Idefics3/SmolVLM ``[batch, images, channels, height, width]``, LLaVA-NeXT tiles)
are refused by name.
"""
from __future__ import annotations

import inspect
from collections.abc import Mapping

import torch

from .checks import split_encoding
from .explanation import ImageRelevance, MultimodalExplanation
from .task import TokenTask

__all__ = ['LAYOUTS', 'image_layout', 'is_similarity_model', 'is_processor', 'has_pixels', 'encode_multimodal',
           'placeholder_tokens',
           'extend_encoding', 'VisionLanguageTask', 'SimilarityTask', 'make_multimodal_task']

#: The pixel layouts whose relevance is read per image.
LAYOUTS = ('images', 'patches')


def is_similarity_model(model: torch.nn.Module) -> bool:
    """Whether ``model`` scores image-text pairs (``logits_per_image`` / ``logits_per_text``: CLIP, SigLIP) rather
    than generating text."""
    return hasattr(model, 'get_text_features') and hasattr(model, 'get_image_features') and not hasattr(
        model, 'lm_head') and not hasattr(model, 'language_model')


def is_processor(value) -> bool:
    """Whether ``value`` is a Hugging Face processor with an image processor and a tokenizer."""
    return getattr(value, 'image_processor', None) is not None and getattr(value, 'tokenizer', None) is not None


def has_pixels(value) -> bool:
    """Whether ``value`` is a processor's output with images: a mapping holding ``pixel_values``."""
    return isinstance(value, Mapping) and 'pixel_values' in value


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
            raise ValueError(f'{type(model).__name__}: pixel_values with image_grid_thw must be flattened patches '
                             f'[patches, features], got shape {tuple(pixels.shape)}')
        return 'patches'
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
    """Every image of ``pixels`` with its relevance, in its own layout (see :py:class:`ImageRelevance`)."""
    patch = _patch_size(model)
    found = []
    if layout == 'images':
        for index in range(pixels.shape[0]):
            height, width = pixels.shape[2:]
            if height % patch or width % patch:
                raise ValueError(f'image {index} is {height} x {width} pixels, not a whole number of {patch}-pixel '
                                 'patches')
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

        def image(flat):  # -> [frames * temporal, channels, height, width]
            return flat.reshape(shape).permute(0, 6, 5, 1, 3, 7, 2, 4, 8).reshape(
                frames * temporal, channels, grid_h * patch, grid_w * patch)
        flat_pixels, flat_relevance = pixels[offset:offset + count], relevance[offset:offset + count]
        patches = flat_relevance.sum(1).reshape(shape[:5]).permute(0, 1, 3, 2, 4).reshape(frames, grid_h, grid_w)
        found.append(ImageRelevance(rows[index], image(flat_pixels)[0], image(flat_relevance).sum(0), patches.sum(0),
                                    mean, std))
        offset += count
    if offset != pixels.shape[0]:
        raise ValueError(f'image_grid_thw covers {offset} patches, pixel_values has {pixels.shape[0]}')
    return found


def _count(value) -> int:
    return len(value) if isinstance(value, (list, tuple)) else 1


def encode_multimodal(processor, text, images, similarity: bool = False) -> Mapping:
    """What ``processor(text=..., images=..., return_tensors='pt')`` returns, after checking the request.

    Parameters
    ----------
    processor
        A Hugging Face processor (``ProcessorMixin``: an image processor and a tokenizer), e.g. ``LlavaProcessor``,
        ``Qwen2VLProcessor``, ``CLIPProcessor``.
    text: str or list of str
        For a vision-language model one text, holding the processor's image token (``processor.image_token``) once
        where each image goes; for a similarity model one text or several (padded).
    images
        An image (PIL image, array or tensor, as the processor takes them) or a list of images: one per image token
        of the text; for a similarity model one image (paired with every text) or one per text.
    similarity: bool
        The model is a similarity model (CLIP).

    Raises
    ------
    TypeError
        For no processor, or a processor that takes no images.
    ValueError
        For no images, several texts for a vision-language model, or a number of images that does not match.
    """
    if processor is None:
        raise TypeError('images= needs processor=: the model\'s Hugging Face processor (e.g. '
                        'AutoProcessor.from_pretrained(model_path)), which turns text and images into model inputs')
    if not (callable(processor) and is_processor(processor)):
        raise TypeError(f'processor must be a Hugging Face processor with an image processor and a tokenizer '
                        f'(ProcessorMixin), got {type(processor).__name__}')
    if images is None or (isinstance(images, (list, tuple)) and not images):
        raise ValueError('no images given: pass images=[...] with the processor, or explain the text with '
                         'tokenizer= alone')
    if not (isinstance(text, str) or (isinstance(text, (list, tuple)) and text
                                      and all(isinstance(item, str) for item in text))):
        raise TypeError(f'with images, the text must be a str (or a list of str for a similarity model), got '
                        f'{type(text).__name__}')
    count = _count(images)
    if similarity:
        texts = _count(text)
        if count not in (1, texts):
            raise ValueError(f'{count} images for {texts} texts: give one image (paired with every text) or one '
                             'image per text')
        return processor(text=text, images=images, return_tensors='pt', padding=True)
    if not isinstance(text, str):
        raise ValueError('a vision-language model explains one text at a time (with all its images): pass a str')
    token = getattr(processor, 'image_token', None)
    if isinstance(token, str):
        placed = text.count(token)
        if placed != count:
            raise ValueError(f'the text holds the image token {token!r} {placed} times for {count} images: put it '
                             'once where each image goes (or apply the processor\'s chat template)')
    return processor(text=text, images=images, return_tensors='pt')


def placeholder_tokens(model: torch.nn.Module) -> list[int]:
    """The ids of the image and video placeholder tokens of a vision-language model (its config's
    ``image_token_id``/``image_token_index`` and ``video_token_id``/``video_token_index``): the tokens whose
    embeddings the model replaces by image features."""
    config = getattr(model, 'config', None)
    found = (getattr(config, name, None) for name in ('image_token_id', 'image_token_index', 'video_token_id',
                                                      'video_token_index'))
    return sorted({int(token) for token in found if isinstance(token, int) and not isinstance(token, bool)})


def extend_encoding(encoding: Mapping, input_ids: torch.Tensor) -> dict:
    """The processor's output ``encoding`` of a prompt, made the encoding of ``input_ids``: the prompt followed by
    generated text tokens (``[1, prompt + generated]``; its first tokens must be the prompt's).

    The fields of one value per prompt token are extended for the generated tokens as ``model.generate`` extends
    them: ``attention_mask`` (any field named ``...attention_mask``) with ones, ``token_type_ids`` with its last
    value, every other ``...type_ids`` field (``mm_token_type_ids``, ...) with 0, the value of text. The other
    fields (``pixel_values``, ``image_grid_thw``, ...) are kept as they are.

    Parameters
    ----------
    encoding: mapping
        ``input_ids`` ``[1, prompt]`` and the processor's further fields.
    input_ids: torch.Tensor
        ``[1, prompt + generated]``.

    Returns
    -------
    dict
    """
    prompt = encoding['input_ids']
    length = prompt.shape[-1]
    if input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] < length or not torch.equal(
            input_ids[0, :length].to(prompt.device), prompt.reshape(-1)):
        raise ValueError(f'input_ids of shape {tuple(input_ids.shape)} do not continue the encoded prompt '
                         f'({length} tokens)')
    extra = input_ids.shape[1] - length
    extended = {}
    for key, value in encoding.items():
        if key == 'input_ids':
            value = input_ids
        elif isinstance(value, torch.Tensor) and value.dim() == 2 and tuple(value.shape) == (1, length) and (
                key.endswith('attention_mask') or key.endswith('type_ids')):
            if key.endswith('attention_mask'):
                tail = value.new_ones(1, extra)
            elif key == 'token_type_ids':
                tail = value[:, -1:].expand(1, extra)
            else:
                tail = value.new_zeros(1, extra)
            value = torch.cat([value, tail], 1)
        extended[key] = value
    return extended


class _PixelLeaf:
    """The second LRP leaf of the multimodal tasks: the pixels, passed as ``pixel_values``."""
    pixels: torch.Tensor

    def __init__(self, model: torch.nn.Module, encoding: Mapping, model_kwargs: dict | None = None, processor=None):
        encoding = dict(encoding)
        pixels = encoding.pop('pixel_values', None)
        if pixels is None:
            raise ValueError('the encoding has no pixel_values: pass images to the processor')
        super().__init__(model, encoding, None, model_kwargs)
        self.processor = processor
        self.pixels = self._check_pixels(pixels)

    def _check_pixels(self, pixels) -> torch.Tensor:
        if not isinstance(pixels, torch.Tensor) or not pixels.is_floating_point():
            raise ValueError(f'pixel_values must be a floating-point tensor, got '
                             f'{getattr(pixels, "dtype", type(pixels).__name__)}')
        if not bool(torch.isfinite(pixels).all()):
            raise ValueError('pixel_values are NaN or infinite: a faulty image or normalisation')
        return pixels.detach().to(self.inputs.dtype)

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
            raise NotImplementedError(f'{method} gives no pixel relevance: explain text and images with the LRP '
                                      'methods (attnlrp, cplrp)')
        text = super().package(relevance, logit, method, None)
        if torch.finfo(pixel_relevance.dtype).bits < 32:
            pixel_relevance = pixel_relevance.float()
        processor = getattr(self, 'processor', None)
        image_processor = getattr(processor, 'image_processor', None)
        mean, std = (getattr(image_processor, name, None) for name in ('image_mean', 'image_std'))
        images = _images(self.model, self.pixels, pixel_relevance, self.layout, self.model_kwargs, rows,
                         None if mean is None else tuple(mean), None if std is None else tuple(std))
        fields = {name: getattr(text, name) for name in text.__dataclass_fields__}
        return MultimodalExplanation(**fields, pixel_relevance=pixel_relevance, images=images,
                                     image_tokens=image_tokens)


class VisionLanguageTask(_PixelLeaf, TokenTask):
    """A generative vision-language model explained at its text embeddings and pixels.

    Parameters
    ----------
    model: torch.nn.Module
        E.g. ``LlavaForConditionalGeneration``, ``Qwen2VLForConditionalGeneration``, in eval mode.
    encoding: mapping
        The processor's output (:py:func:`encode_multimodal`) for one text: ``input_ids``, ``pixel_values`` and the
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
        config = model.config
        token = getattr(config, 'image_token_id', None)
        token = getattr(config, 'image_token_index', None) if token is None else token
        self.image_tokens = (self.input_ids == token) if isinstance(token, int) else None
        self._rope_positions()

    def _rope_positions(self) -> None:
        """Multimodal rotary positions (Qwen2-VL): ``position_ids`` from the model's own ``get_rope_index``."""
        inner = getattr(self.model, 'model', self.model)
        rope_index = getattr(inner, 'get_rope_index', None)
        if rope_index is None or 'position_ids' in self.model_kwargs:
            return
        names = inspect.signature(rope_index).parameters
        fields = {key: value for key, value in self.model_kwargs.items() if key in names and key != 'input_ids'}
        with torch.no_grad():
            self.model_kwargs['position_ids'] = rope_index(self.input_ids, **fields)[0]

    def package(self, relevance, logit, method, decoder_relevance):
        """``decoder_relevance`` is the second LRP leaf's: the pixels'."""
        return self._package(relevance, logit, method, decoder_relevance, [0] * self._image_count(),
                             self.image_tokens)

    def _image_count(self) -> int:
        if self.layout == 'patches':
            return int(self.model_kwargs['image_grid_thw'].shape[0])
        return int(self.pixels.shape[0])


class SimilarityTask(_PixelLeaf, TokenTask):
    """An image-text similarity model (CLIP) explained at the text embeddings and pixels of each (text, image) pair.

    Row ``r`` is text ``r`` with image ``r`` (a single image is paired with every text); its explained value is the
    similarity score ``logits_per_text[r, r]``, the logit scale included. The rows are independent: each row's text
    and pixel relevance sum to its own score (minus what biases absorb).

    Parameters
    ----------
    model: torch.nn.Module
        E.g. ``CLIPModel``, in eval mode.
    encoding: mapping
        The processor's output (:py:func:`encode_multimodal`): ``input_ids`` ``[texts, seq]``, ``pixel_values``
        ``[1 or texts, channels, height, width]``.
    model_kwargs: dict, optional
    processor: optional
    """
    def __init__(self, model: torch.nn.Module, encoding: Mapping, model_kwargs: dict | None = None, processor=None):
        super().__init__(model, encoding, model_kwargs, processor)
        pixels = self.pixels
        if pixels.dim() != 4 or pixels.shape[0] not in (1, self.batch):
            raise ValueError(f'pixel_values of shape {tuple(pixels.shape)} for {self.batch} texts: give one image or '
                             'one per text')
        self.pixels = pixels.expand(self.batch, *pixels.shape[1:]).clone()
        self.layout = image_layout(model, self.pixels, {})

    @staticmethod
    def word_embeddings(model: torch.nn.Module) -> torch.nn.Module | None:
        text_model = getattr(model, 'text_model', None)
        return text_model.get_input_embeddings() if text_model is not None else TokenTask.word_embeddings(model)

    def lrp_forward(self, inputs, model, **extra):
        """The pair scores (``logits_per_text``); the text embeddings' relevance is read as in
        :py:meth:`TokenTask.lrp_forward` (CLIP's forward takes ``input_ids`` only)."""
        if self.lookups is not None:
            self.lookups.record()
        return self.forward(inputs, None, model, **extra)

    def _set_model_kwargs(self) -> None:
        if self.attention_mask is not None:
            self.model_kwargs['attention_mask'] = self.attention_mask

    def forward(self, inputs, rows=None, model=None, **extra):
        output = self.run(inputs, rows, model, **extra)
        return output.logits_per_text

    def resolve(self, scores, position=-1, target=None, seeded: bool = False):
        if target is not None:
            raise ValueError(f'{type(self.model).__name__} scores (text, image) pairs: each row explains its own pair; '
                             'leave out target=')
        return super().resolve(scores, None, torch.arange(self.batch, device=scores.device), seeded)

    def keep_logits(self, position=-1, target=None) -> dict:
        return {}

    def package(self, relevance, logit, method, decoder_relevance):
        """``decoder_relevance`` is the second LRP leaf's: the pixels'."""
        return self._package(relevance, logit, method, decoder_relevance, list(range(self.batch)), None)


def make_multimodal_task(model: torch.nn.Module, encoding: Mapping, model_kwargs: dict | None = None,
                         processor=None) -> TokenTask:
    """The :py:class:`SimilarityTask` (CLIP-like models) or :py:class:`VisionLanguageTask` for ``model``."""
    _, _, fields = split_encoding(encoding)
    if 'pixel_values' not in fields:
        raise ValueError('the processor returned no pixel_values')
    task = SimilarityTask if is_similarity_model(model) else VisionLanguageTask
    return task(model, encoding, model_kwargs, processor)
