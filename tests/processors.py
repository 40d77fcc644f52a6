"""Processors of the tiny vision-language and CLIP models of :py:mod:`tests.models`, built from their classes (an
image processor and the byte-level test tokenizer with the models' special tokens); nothing is downloaded.

- :py:func:`llava_processor`: ``LlavaProcessor``, ``<image>`` (id 100) expanded to 4 tokens per 16 x 16 image.
- :py:func:`qwen2_vl_processor`: ``Qwen2VLProcessor``: images resized to multiples of 8 pixels with at most 16 x 16
  pixels, flattened into patches with ``image_grid_thw``; ``<|image_pad|>`` (id 100) expanded to one token per 2 x 2
  patches.
- :py:func:`clip_processor`: ``CLIPProcessor`` (16 x 16 images, the tokenizer ends each text with ``</s>``, id 2).
- :py:func:`siglip_processor`: ``SiglipProcessor`` (16 x 16 images normalised by 0.5 and 0.5; as SigLIP's, the
  tokenizer ends each text with ``</s>``, id 2, and pads with it).
- :py:func:`paligemma_processor`: ``PaliGemmaProcessor`` (16 x 16 images, ``<image>`` id 100 repeated 4 times, then
  ``<s>``, the text and a line break; it adds its 1,152 location and segmentation tokens after id 100, and returns
  ``token_type_ids`` and ``labels`` with every encoding), and the model it is for, :py:func:`tiny_paligemma` (the
  tiny models of :py:mod:`tests.models` have no PaliGemma).
- :py:func:`image`: a seeded random RGB image as a uint8 array.
"""

from __future__ import annotations

import numpy as np
import torch
import transformers
from tokenizers import processors

from tests.models import (
    HEADS,
    HIDDEN,
    INTERMEDIATE,
    KV_HEADS,
    LAYERS,
    POSITIONS,
    QWEN_MERGE,
    QWEN_PATCH,
    QWEN_TEMPORAL,
    VLM_IMAGE,
    VLM_PATCH,
    VLM_VOCAB,
    VOCAB,
    zero_multimodal,
)
from tests.text_tokenizer import byte_level_tokenizer

QWEN_TOKENS = ['<|image_pad|>', '<|video_pad|>', '<|vision_start|>', '<|vision_end|>']


def image(height: int = 20, width: int = 24, seed: int = 0) -> np.ndarray:
    """``[height, width, 3]`` uint8 random image."""
    return (np.random.RandomState(seed).rand(height, width, 3) * 255).astype('uint8')


def llava_processor() -> transformers.LlavaProcessor:
    tokenizer = byte_level_tokenizer()
    tokenizer.add_special_tokens({'additional_special_tokens': ['<image>']})
    images = transformers.CLIPImageProcessor(
        size={'shortest_edge': VLM_IMAGE}, crop_size={'height': VLM_IMAGE, 'width': VLM_IMAGE}
    )
    return transformers.LlavaProcessor(
        image_processor=images,
        tokenizer=tokenizer,
        patch_size=VLM_PATCH,
        vision_feature_select_strategy='default',
        image_token='<image>',
        num_additional_image_tokens=1,
    )


def qwen2_vl_processor() -> transformers.Qwen2VLProcessor:
    tokenizer = byte_level_tokenizer()
    tokenizer.add_special_tokens({'additional_special_tokens': QWEN_TOKENS})
    sizes = dict(
        min_pixels=8 * 8,
        max_pixels=16 * 16,
        patch_size=QWEN_PATCH,
        merge_size=QWEN_MERGE,
        temporal_patch_size=QWEN_TEMPORAL,
    )
    return transformers.Qwen2VLProcessor(
        image_processor=transformers.Qwen2VLImageProcessor(**sizes),
        tokenizer=tokenizer,
        video_processor=transformers.Qwen2VLVideoProcessor(**sizes),
    )


def clip_processor() -> transformers.CLIPProcessor:
    tokenizer = byte_level_tokenizer()
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single='<s> $A </s>', special_tokens=[('<s>', 1), ('</s>', 2)]
    )
    images = transformers.CLIPImageProcessor(
        size={'shortest_edge': VLM_IMAGE}, crop_size={'height': VLM_IMAGE, 'width': VLM_IMAGE}
    )
    return transformers.CLIPProcessor(image_processor=images, tokenizer=tokenizer)


def siglip_processor() -> transformers.SiglipProcessor:
    tokenizer = byte_level_tokenizer()
    tokenizer.pad_token = '</s>'
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single='$A </s>', special_tokens=[('</s>', 2)]
    )
    images = transformers.SiglipImageProcessor(size={'height': VLM_IMAGE, 'width': VLM_IMAGE})
    return transformers.SiglipProcessor(image_processor=images, tokenizer=tokenizer)


def paligemma_processor() -> transformers.PaliGemmaProcessor:
    images = transformers.SiglipImageProcessor(size={'height': VLM_IMAGE, 'width': VLM_IMAGE})
    images.image_seq_length = (VLM_IMAGE // VLM_PATCH) ** 2
    return transformers.PaliGemmaProcessor(image_processor=images, tokenizer=byte_level_tokenizer())


def tiny_paligemma() -> transformers.PaliGemmaForConditionalGeneration:
    """PaliGemma: a SigLIP vision tower (16 x 16 images, patch 8: 4 image tokens, id 100) and a Gemma text model of
    the tiny sizes, float64, biases zeroed (:py:func:`tests.models.zero_multimodal`)."""
    text = dict(
        model_type='gemma',
        vocab_size=VLM_VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HIDDEN // HEADS,
        max_position_embeddings=POSITIONS,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    vision = dict(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=VLM_IMAGE,
        patch_size=VLM_PATCH,
        projection_dim=HIDDEN,
    )
    config = transformers.PaliGemmaConfig(
        vision_config=vision, text_config=text, image_token_id=VOCAB, projection_dim=HIDDEN
    )
    config._attn_implementation = 'eager'
    torch.manual_seed(0)
    return zero_multimodal(transformers.PaliGemmaForConditionalGeneration(config).double().eval())
