"""Text and images in one request: vision-language models (LLaVA, Qwen2-VL, PaliGemma) and image-text similarity
models (CLIP, SigLIP).

A Hugging Face processor (``ProcessorMixin``) turns text and images into ``input_ids``, ``attention_mask``,
``pixel_values`` and the model's further fields (``image_grid_thw``, ``image_sizes``, ``mm_token_type_ids``,
PaliGemma's ``token_type_ids``, ...), which are passed on to the model (:py:func:`~.encode_multimodal`), except what
is not an input of the explained forward pass (:py:func:`~.model_inputs`: the targets of a training loss, such as
the ``labels`` PaliGemma's processor returns, and fields the model's forward does not take). A processor that is not
the model's is refused before the model runs, naming both (:py:func:`~.check_processor`). The tasks extend
:py:class:`~zennit_attn.inputs.task.TokenTask` by a second LRP leaf, the pixels: relevance flows to the word
embeddings of the text (``inputs_embeds``) and to ``pixel_values`` in one backward pass, and the result is a
:py:class:`~zennit_attn.results.explanation.MultimodalExplanation`.

- :py:class:`~.VisionLanguageTask`: a generative VLM explained at the next-token logit, as a language model. The
  image placeholder tokens stay in ``input_ids``; the model finds them in ``inputs_embeds`` (it compares each
  embedding with the image token's) and scatters the image features there. Models with multimodal rotary positions
  (Qwen2-VL, Qwen2.5-VL) get the position ids their own ``get_rope_index`` computes from the ids, as their forward
  on ``input_ids`` would.
- :py:class:`~.SimilarityTask`: CLIP-like models, one row per (text, image) pair explained at
  ``logits_per_text[row, row]``; a single image is paired with every text. Each row of a batch is explained exactly
  as its pair alone: CLIP pools its end-of-text token (before any padding, under a causal mask), so padding gets no
  relevance; SigLIP pools the last position, a pad in a padded text, so its texts are padded to the fixed length
  SigLIP was trained with (:py:func:`~.text_length`) and the pads keep their relevance (they are inputs there). A
  padded batch whose padding the model reads otherwise is refused.

For a generated answer (:py:func:`~zennit_attn.explain_generation` with images), :py:func:`~.extend_encoding` makes
the prompt's encoding that of a prefix of prompt and answer, and :py:func:`~.placeholder_tokens` names the tokens
that are not to be generated.

Pixel layouts (:py:func:`~.image_layout`): ``'images'``, ``[images, channels, height, width]`` (LLaVA, CLIP,
PaliGemma) and ``'patches'``, flattened patches ``[patches, channels * temporal * patch * patch]`` with
``image_grid_thw`` (Qwen2-VL, Qwen2.5-VL); other layouts (Idefics3/SmolVLM ``[batch, images, channels, height,
width]``, LLaVA-NeXT tiles, MiniCPM-V's strip of slices: :py:data:`~.STRIP_FIELDS`) are refused by name. Left-padded
rows of models with multimodal rotary positions get them from ``get_rope_index`` with the attention mask, as their
forward on ``input_ids`` computes them. Encoder-decoder models with images (T5Gemma 2) are refused by name.

The processor's side is :py:mod:`zennit_attn.inputs.vision_language.inputs`, the tasks are
:py:mod:`zennit_attn.inputs.vision_language.tasks`; their public names are imported here.
"""

from .inputs import (
    LAST_POSITION_POOLING,
    LAYOUT_FIELDS,
    LOSS_FIELDS,
    check_processor,
    encode_multimodal,
    extend_encoding,
    has_pixels,
    is_processor,
    is_similarity_model,
    model_inputs,
    placeholder_tokens,
    text_length,
)
from .tasks import LAYOUTS, STRIP_FIELDS, SimilarityTask, VisionLanguageTask, image_layout, make_multimodal_task

__all__ = [
    'LAYOUTS',
    'LAST_POSITION_POOLING',
    'LOSS_FIELDS',
    'LAYOUT_FIELDS',
    'STRIP_FIELDS',
    'image_layout',
    'is_similarity_model',
    'is_processor',
    'has_pixels',
    'text_length',
    'encode_multimodal',
    'placeholder_tokens',
    'check_processor',
    'model_inputs',
    'extend_encoding',
    'VisionLanguageTask',
    'SimilarityTask',
    'make_multimodal_task',
]
