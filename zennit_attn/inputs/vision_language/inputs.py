"""What a processor makes of text and images, and what of it a model takes (see
:py:mod:`zennit_attn.inputs.vision_language`).

:py:func:`encode_multimodal` runs the processor (SigLIP's texts padded to the length it was trained with,
:py:func:`text_length`), :py:func:`check_processor` refuses a processor that is not the model's, naming both,
:py:func:`model_inputs` leaves out what is not an input of the explained forward pass (a loss's ``labels``), and
:py:func:`extend_encoding` makes a prompt's encoding that of a prefix of prompt and generated answer.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping

import torch

from ...core.modules import forward_parameters

__all__ = [
    'LAST_POSITION_POOLING',
    'LOSS_FIELDS',
    'LAYOUT_FIELDS',
    'is_similarity_model',
    'is_processor',
    'has_pixels',
    'text_length',
    'encode_multimodal',
    'placeholder_tokens',
    'image_token_id',
    'rope_index',
    'check_processor',
    'model_inputs',
    'extend_encoding',
]

#: Model types of similarity models whose text tower pools the last position whatever the attention mask says
#: (``last_hidden_state[:, -1]``: SigLIP, SigLIP 2), which is a pad in a padded text. Their texts are padded to the
#: fixed length they were trained with (:py:func:`text_length`), as transformers' zero-shot image classification
#: pipeline pads them (``padding='max_length'``), so that a text is the same input alone and in a batch.
LAST_POSITION_POOLING = ('siglip', 'siglip2')

#: Fields of a processor's output that are the targets of a training loss, not inputs of the explained forward pass
#: (PaliGemma's processor returns ``labels`` with every encoding; given to the model they make it compute a loss).
LOSS_FIELDS = ('labels',)

#: Fields of processors that describe the layout of ``pixel_values`` (Qwen2-VL's patch grids, LLaVA-NeXT's image
#: sizes, Idefics' and SigLIP 2's masks and shapes): a model whose forward does not take one cannot read pixels laid
#: out so (:py:func:`check_processor`).
LAYOUT_FIELDS = (
    'image_grid_thw',
    'video_grid_thw',
    'image_sizes',
    'pixel_attention_mask',
    'pixel_mask',
    'spatial_shapes',
)


def is_similarity_model(model: torch.nn.Module) -> bool:
    """Whether ``model`` scores image-text pairs (``logits_per_image`` / ``logits_per_text``: CLIP, SigLIP) rather
    than generating text."""
    return (
        hasattr(model, 'get_text_features')
        and hasattr(model, 'get_image_features')
        and not hasattr(model, 'lm_head')
        and not hasattr(model, 'language_model')
    )


def is_processor(value) -> bool:
    """Whether ``value`` is a Hugging Face processor with an image processor and a tokenizer."""
    return getattr(value, 'image_processor', None) is not None and getattr(value, 'tokenizer', None) is not None


def has_pixels(value) -> bool:
    """Whether ``value`` is a processor's output with images: a mapping holding ``pixel_values``."""
    return isinstance(value, Mapping) and 'pixel_values' in value


def text_length(model: torch.nn.Module) -> int | None:
    """The length every text of a similarity model is padded to, or None where texts are padded to the longest.

    A model of :py:data:`LAST_POSITION_POOLING` (SigLIP) pools the last position of its text, so padding is an input
    of it: it was trained on texts padded to its text model's ``max_position_embeddings`` (64), and a text padded to
    another length gets another score. Every text is padded to that length, alone or in a batch (as transformers'
    zero-shot image classification pipeline does)."""
    config = getattr(model, 'config', None)
    if getattr(config, 'model_type', None) not in LAST_POSITION_POOLING:
        return None
    length = getattr(getattr(config, 'text_config', None), 'max_position_embeddings', None)
    if not isinstance(length, int) or isinstance(length, bool) or length <= 0:
        raise ValueError(
            f'{type(model).__name__} pools the last position of its text, so its texts are padded to the '
            'length it was trained with, config.text_config.max_position_embeddings, which is '
            f'{length!r}'
        )
    return length


def _count(value) -> int:
    return len(value) if isinstance(value, (list, tuple)) else 1


def encode_multimodal(processor, text, images, similarity: bool = False, length: int | None = None) -> Mapping:
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
        The model is a similarity model (CLIP): several texts are padded to the longest.
    length: int, optional
        For a similarity model: pad every text to this many tokens instead (``padding='max_length'``), e.g.
        :py:func:`text_length` for SigLIP. A longer text is not cut.

    Raises
    ------
    TypeError
        For no processor, or a processor that takes no images.
    ValueError
        For no images, several texts for a vision-language model, or a number of images that does not match.
    """
    _check_request(processor, text, images)
    count = _count(images)
    if similarity:
        return _encode_pairs(processor, text, images, count, length)
    if not isinstance(text, str):
        raise ValueError('a vision-language model explains one text at a time (with all its images): pass a str')
    token = getattr(processor, 'image_token', None)
    if isinstance(token, str):
        placed = text.count(token)
        if placed != count:
            raise ValueError(
                f'the text holds the image token {token!r} {placed} times for {count} images: put it '
                "once where each image goes (or apply the processor's chat template)"
            )
    return processor(text=text, images=images, return_tensors='pt')


def _check_request(processor, text, images) -> None:
    """Refuse what no processor can encode for :py:func:`encode_multimodal`: no processor or one without an image
    processor, no images, a text that is neither a str nor a list of str."""
    if processor is None:
        raise TypeError(
            "images= needs processor=: the model's Hugging Face processor (e.g. "
            'AutoProcessor.from_pretrained(model_path)), which turns text and images into model inputs'
        )
    if not (callable(processor) and is_processor(processor)):
        raise TypeError(
            f'processor must be a Hugging Face processor with an image processor and a tokenizer '
            f'(ProcessorMixin), got {type(processor).__name__}'
        )
    if images is None or (isinstance(images, (list, tuple)) and not images):
        raise ValueError(
            'no images given: pass images=[...] with the processor, or explain the text with tokenizer= alone'
        )
    if not (
        isinstance(text, str)
        or (isinstance(text, (list, tuple)) and text and all(isinstance(item, str) for item in text))
    ):
        raise TypeError(
            f'with images, the text must be a str (or a list of str for a similarity model), got {type(text).__name__}'
        )


def _encode_pairs(processor, text, images, count: int, length: int | None) -> Mapping:
    """The processor's output for a similarity model: one image for every text or one per text (``count`` images),
    the texts padded to the longest, or to ``length`` tokens."""
    texts = _count(text)
    if count not in (1, texts):
        raise ValueError(
            f'{count} images for {texts} texts: give one image (paired with every text) or one image per text'
        )
    if length is not None:
        return processor(text=text, images=images, return_tensors='pt', padding='max_length', max_length=length)
    return processor(text=text, images=images, return_tensors='pt', padding=True)


def placeholder_tokens(model: torch.nn.Module) -> list[int]:
    """The ids of the image and video placeholder tokens of a vision-language model (its config's
    ``image_token_id``/``image_token_index`` and ``video_token_id``/``video_token_index``): the tokens whose
    embeddings the model replaces by image features."""
    config = getattr(model, 'config', None)
    found = (
        getattr(config, name, None)
        for name in ('image_token_id', 'image_token_index', 'video_token_id', 'video_token_index')
    )
    return sorted({int(token) for token in found if isinstance(token, int) and not isinstance(token, bool)})


def image_token_id(model: torch.nn.Module) -> int | None:
    """The id of the model's image placeholder token (``config.image_token_id`` or ``image_token_index``)."""
    config = getattr(model, 'config', None)
    for name in ('image_token_id', 'image_token_index'):
        token = getattr(config, name, None)
        if isinstance(token, int) and not isinstance(token, bool):
            return token
    return None


def _processor_image_token(processor) -> tuple[str | None, int | None]:
    """``(text, id)`` of the image placeholder token a processor puts into the text, ``(None, None)`` for none."""
    text = getattr(processor, 'image_token', None)
    token = getattr(processor, 'image_token_id', None)
    if not isinstance(token, int) or isinstance(token, bool):
        tokenizer = getattr(processor, 'tokenizer', None)
        token = None
        if isinstance(text, str) and tokenizer is not None and text in tokenizer.get_vocab():
            token = int(tokenizer.convert_tokens_to_ids(text))
    return (text if isinstance(text, str) else None), token


def _required(function) -> list[str]:
    """The parameters of ``function`` without a default (not ``*args``/``**kwargs``)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return []
    return [
        parameter.name
        for parameter in parameters
        if parameter.default is inspect.Parameter.empty
        and parameter.kind
        in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]


def rope_index(model: torch.nn.Module):
    """The model's own ``get_rope_index`` (Qwen2-VL's multimodal rotary positions), None for other models."""
    return getattr(getattr(model, 'model', model), 'get_rope_index', None)


def check_processor(
    model: torch.nn.Module, encoding: Mapping, processor=None, model_kwargs: Mapping | None = None
) -> None:
    """Refuse a processor, or a processor's output, that is not the model's, naming both, before the model runs.

    The evidence is in the data, not in the class names (checkpoints pair models with processors of other classes,
    e.g. Pixtral's ``LlavaForConditionalGeneration`` with ``PixtralProcessor``):

    - a vision-language model with an image placeholder token (``config.image_token_id`` / ``image_token_index``)
      gets ``pixel_values`` and a text without that token (the processor put its own image token there, of another
      id: ``processor.image_token_id`` itself is not compared, Gemma 3's is the start-of-image token);
    - a similarity model (CLIP) is given a processor with an image placeholder token (``processor.image_token``);
    - the input describes its pixels with a field the model's forward does not take (:py:data:`LAYOUT_FIELDS`:
      ``image_grid_thw``, ``image_sizes``, ...: pixels laid out for another model);
    - the model computes its rotary positions from fields the input lacks (Qwen2-VL's ``get_rope_index`` and its
      ``mm_token_type_ids``).

    Parameters
    ----------
    model: torch.nn.Module
    encoding: mapping
        The processor's output (``input_ids``, ``pixel_values``, ...).
    processor: optional
        The processor that made it, if known.
    model_kwargs: mapping, optional
        Further keyword arguments of the model's forward (they may supply a field the encoding lacks).

    Raises
    ------
    ValueError
        Naming the evidence, the processor's class and the model's class and ``model_type``.
    """
    config = getattr(model, 'config', None)
    owner = f'{type(model).__name__} (model_type {getattr(config, "model_type", None)!r})'
    made = (
        f'the processor ({type(processor).__name__}) is not the processor of {owner}'
        if processor is not None
        else f'the input was not made by the processor of {owner}'
    )
    advice = (
        "load the processor from the model's checkpoint (AutoProcessor.from_pretrained(path) with the path of "
        'the model)'
    )

    def refuse(evidence: str):
        raise ValueError(f'{evidence}: {made}; {advice}')

    similarity = is_similarity_model(model)
    model_token = image_token_id(model)
    text, token = _processor_image_token(processor) if processor is not None else (None, None)
    if similarity and text is not None:
        refuse(
            f'the processor puts the image placeholder token {text!r} into the text, which '
            f'{type(model).__name__} does not take (it scores (text, image) pairs)'
        )
    fields = dict(encoding)
    fields.update(model_kwargs or {})
    ids = fields.get('input_ids')
    if (
        not similarity
        and model_token is not None
        and isinstance(ids, torch.Tensor)
        and fields.get('pixel_values') is not None
        and not bool((ids == model_token).any())
    ):
        own = '' if text is None else f" (the processor's image token {text!r} is id {token})"
        refuse(f'the text holds no image token of {type(model).__name__} (id {model_token}) for its pixel_values{own}')
    parameters = forward_parameters(model)
    if 'pixel_values' in parameters:  # a forward whose inputs are named
        foreign = [key for key in encoding if key in LAYOUT_FIELDS and key not in parameters]
        if foreign:
            refuse(
                f'the input describes its pixel_values with {", ".join(foreign)}, which the forward of '
                f'{type(model).__name__} does not take (pixels laid out for another model)'
            )
    function = rope_index(model)
    if function is not None and 'position_ids' not in fields:
        missing = [name for name in _required(function) if name not in fields]
        if missing:
            refuse(
                f'{type(model).__name__} computes its rotary positions (get_rope_index) from '
                f'{", ".join(missing)}, which the input lacks'
            )


def model_inputs(model: torch.nn.Module, encoding: Mapping) -> dict:
    """The fields of a processor's output that are inputs of the explained forward pass of ``model``.

    Left out: the targets of a training loss (:py:data:`LOSS_FIELDS`: ``labels``, which PaliGemma's processor
    returns with every encoding and which would make the model compute a loss), and, where the model's forward names
    its inputs (it takes ``pixel_values`` by name), the fields it does not take (e.g. ``num_crops``), which are not
    inputs of it (as the ``Trainer`` of transformers drops columns that are not arguments of the forward). Every
    other field is passed on, also those the forward uses to build its attention mask (PaliGemma's
    ``token_type_ids``: the image and the prompt attend to each other both ways, the answer causally).

    Parameters
    ----------
    model: torch.nn.Module
    encoding: mapping

    Returns
    -------
    dict
    """
    parameters = forward_parameters(model)
    named = 'pixel_values' in parameters
    return {
        key: value for key, value in encoding.items() if key not in LOSS_FIELDS and (not named or key in parameters)
    }


def _output_types(encoding: Mapping) -> bool:
    """Whether ``token_type_ids`` marks the output a model is trained to generate (1) after its prompt (0): the
    processor put ``labels`` exactly where ``token_type_ids`` is 1 (-100 elsewhere), as PaliGemma's does."""
    types, labels = encoding.get('token_type_ids'), encoding.get('labels')
    if not (isinstance(types, torch.Tensor) and isinstance(labels, torch.Tensor) and types.shape == labels.shape):
        return False
    return bool(((labels != -100) == (types != 0)).all()) and bool(((types == 0) | (types == 1)).all())


def extend_encoding(encoding: Mapping, input_ids: torch.Tensor) -> dict:
    """The processor's output ``encoding`` of a prompt, made the encoding of ``input_ids``: the prompt followed by
    generated text tokens (``[1, prompt + generated]``; its first tokens must be the prompt's).

    The fields of one value per prompt token are extended for the generated tokens as ``model.generate`` extends
    them: ``attention_mask`` (any field named ``...attention_mask``) with ones, ``token_type_ids`` with its last
    value (transformers' default), every other ``...type_ids`` field (``mm_token_type_ids``, ...) with 0, the value
    of text. An encoding whose ``labels`` mark its ``token_type_ids`` as the prompt (0) and the trained output (1:
    labels exactly there, -100 elsewhere, as PaliGemma's processor makes them) gets ``token_type_ids`` 1 for the
    generated tokens, as PaliGemma's ``generate`` extends them: the generated answer is that output, attended
    causally, where the prompt (0) is attended both ways. The other fields (``pixel_values``, ``image_grid_thw``,
    ...) are kept as they are (``labels`` too: it is not a model input, :py:func:`model_inputs`).

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
    if (
        input_ids.dim() != 2
        or input_ids.shape[0] != 1
        or input_ids.shape[1] < length
        or not torch.equal(input_ids[0, :length].to(prompt.device), prompt.reshape(-1))
    ):
        raise ValueError(
            f'input_ids of shape {tuple(input_ids.shape)} do not continue the encoded prompt ({length} tokens)'
        )
    extra = input_ids.shape[1] - length
    extended = {}
    for key, value in encoding.items():
        if key == 'input_ids':
            value = input_ids
        elif (
            isinstance(value, torch.Tensor)
            and value.dim() == 2
            and tuple(value.shape) == (1, length)
            and (key.endswith('attention_mask') or key.endswith('type_ids'))
        ):
            if key.endswith('attention_mask'):
                tail = value.new_ones(1, extra)
            elif key == 'token_type_ids':
                tail = value.new_ones(1, extra) if _output_types(encoding) else value[:, -1:].expand(1, extra)
            else:
                tail = value.new_zeros(1, extra)
            value = torch.cat([value, tail], 1)
        extended[key] = value
    return extended
