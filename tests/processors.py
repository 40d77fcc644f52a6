"""Processors of the tiny vision-language and CLIP models of :py:mod:`tests.models`, built from their classes (an
image processor and the byte-level test tokenizer with the models' special tokens); nothing is downloaded.

- :py:func:`llava_processor`: ``LlavaProcessor``, ``<image>`` (id 100) expanded to 4 tokens per 16 x 16 image.
- :py:func:`qwen2_vl_processor`: ``Qwen2VLProcessor``: images resized to multiples of 8 pixels with at most 16 x 16
  pixels, flattened into patches with ``image_grid_thw``; ``<|image_pad|>`` (id 100) expanded to one token per 2 x 2
  patches.
- :py:func:`clip_processor`: ``CLIPProcessor`` (16 x 16 images, the tokenizer ends each text with ``</s>``, id 2).
- :py:func:`image`: a seeded random RGB image as a uint8 array.
"""
from __future__ import annotations

import numpy as np
import transformers
from tokenizers import processors

from tests.models import QWEN_MERGE, QWEN_PATCH, QWEN_TEMPORAL, VLM_IMAGE, VLM_PATCH
from tests.text_tokenizer import byte_level_tokenizer

QWEN_TOKENS = ['<|image_pad|>', '<|video_pad|>', '<|vision_start|>', '<|vision_end|>']


def image(height: int = 20, width: int = 24, seed: int = 0) -> np.ndarray:
    """``[height, width, 3]`` uint8 random image."""
    return (np.random.RandomState(seed).rand(height, width, 3) * 255).astype('uint8')


def llava_processor() -> transformers.LlavaProcessor:
    tokenizer = byte_level_tokenizer()
    tokenizer.add_special_tokens({'additional_special_tokens': ['<image>']})
    images = transformers.CLIPImageProcessor(size={'shortest_edge': VLM_IMAGE},
                                             crop_size={'height': VLM_IMAGE, 'width': VLM_IMAGE})
    return transformers.LlavaProcessor(image_processor=images, tokenizer=tokenizer, patch_size=VLM_PATCH,
                                       vision_feature_select_strategy='default', image_token='<image>',
                                       num_additional_image_tokens=1)


def qwen2_vl_processor() -> transformers.Qwen2VLProcessor:
    tokenizer = byte_level_tokenizer()
    tokenizer.add_special_tokens({'additional_special_tokens': QWEN_TOKENS})
    sizes = dict(min_pixels=8 * 8, max_pixels=16 * 16, patch_size=QWEN_PATCH, merge_size=QWEN_MERGE,
                 temporal_patch_size=QWEN_TEMPORAL)
    return transformers.Qwen2VLProcessor(image_processor=transformers.Qwen2VLImageProcessor(**sizes),
                                         tokenizer=tokenizer, video_processor=transformers.Qwen2VLVideoProcessor(**sizes))


def clip_processor() -> transformers.CLIPProcessor:
    tokenizer = byte_level_tokenizer()
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single='<s> $A </s>', special_tokens=[('<s>', 1), ('</s>', 2)])
    images = transformers.CLIPImageProcessor(size={'shortest_edge': VLM_IMAGE},
                                             crop_size={'height': VLM_IMAGE, 'width': VLM_IMAGE})
    return transformers.CLIPProcessor(image_processor=images, tokenizer=tokenizer)
