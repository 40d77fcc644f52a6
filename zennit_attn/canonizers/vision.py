"""Family entries for vision transformers: timm ``VisionTransformer`` (incl. DeiT) and Hugging Face ViT.

What needs a rule and what does not (gradient convention, see :py:mod:`zennit_attn.rules`):

- patch embedding: a ``torch.nn.Conv2d`` with kernel = stride = patch size, then flatten/transpose: linear
  (the composites give the convolution its own rule, e.g. gamma);
- class token, DeiT's distillation token and the position embedding: parameters concatenated to / added to the
  patch tokens, so they absorb their share of the relevance like a bias and need no rule;
- pre-norm blocks with residual additions, ``LayerScale`` (``x * gamma``), pooling of the class token or the mean
  of the tokens, DeiT's mean of the two heads: linear, no rule;
- LayerNorm (timm's ``LayerNorm`` subclasses ``torch.nn.LayerNorm``) and GELU modules: found by type;
- attention: timm computes ``q, k, v`` with one fused ``qkv`` Linear, split into equal sections of its output;
  Hugging Face ViT has separate projections. Operand taps on their outputs carry the AttnLRP (or CP-LRP) rule,
  so that timm's fused ``scaled_dot_product_attention`` path, its explicit ``softmax`` path and every Hugging Face
  attention implementation work alike.

The entries are instance-level like all others: the canonizers add children and hooks to the model instance and
remove exactly those on exit. :py:data:`ATTENTION_OUTPUTS` names the output projection of each attention class (the
"LinearOutputProjection" of the paper's appendix B), used by the gamma composites.
"""
from __future__ import annotations

from typing import Mapping

import torch

from .families import Family, separate_qkv


def timm_attention(module: torch.nn.Module) -> Mapping[str, object]:
    """timm's ``Attention``: the fused ``qkv`` Linear gives query, key and value in three equal sections."""
    if getattr(module, 'gate', None) is not None:
        raise TypeError(
            'timm Attention with gated=True multiplies the attention output by an inline sigmoid gate, which '
            'zennit-attn does not cover yet'
        )
    return {'qkv': ('query', 'key', 'value')}


def hf_vit_attention(module: torch.nn.Module) -> Mapping[str, object]:
    """Hugging Face ViT attention: ``q_proj``/``k_proj``/``v_proj`` (transformers 5), or ``query``/``key``/``value``
    (``ViTSelfAttention`` of earlier versions)."""
    if hasattr(module, 'q_proj'):
        return separate_qkv('q_proj', 'k_proj', 'v_proj')(module)
    return separate_qkv('query', 'key', 'value')(module)


#: Output projection of each attention class: ``class name -> child attribute`` (Linear after ``A V``).
ATTENTION_OUTPUTS: dict[str, str] = {
    'Attention': 'proj',  # timm
    'ViTAttention': 'o_proj',  # transformers 5
    'ViTSelfOutput': 'dense',  # transformers 4 (sibling of ViTSelfAttention)
    'GPT2Attention': 'c_proj',
    'BertSelfOutput': 'dense',
    'RobertaSelfOutput': 'dense',
    'LlamaAttention': 'o_proj', 'MistralAttention': 'o_proj', 'Qwen2Attention': 'o_proj',
    'Qwen3Attention': 'o_proj', 'Gemma3Attention': 'o_proj',
}

VISION_FAMILIES: tuple[Family, ...] = (
    Family(
        name='timm-vit',
        structural=('VisionTransformer', 'VisionTransformerDistilled', 'Block', 'PatchEmbed', 'Mlp', 'LayerScale',
                    'DropPath'),
        operands={'Attention': timm_attention},
        package='timm',
    ),
    Family(
        name='vit',
        structural=('ViTForImageClassification', 'ViTModel', 'ViTEmbeddings', 'ViTPatchEmbeddings', 'ViTEncoder',
                    'ViTLayer', 'ViTMLP', 'ViTPooler', 'ViTSelfOutput', 'ViTIntermediate', 'ViTOutput'),
        operands={'ViTAttention': hf_vit_attention, 'ViTSelfAttention': hf_vit_attention},
    ),
    # patch embeddings: a convolution is linear; without a rule it gets the epsilon rule's limit (the gradient)
    Family(name='conv', structural=('Conv1d', 'Conv2d', 'Conv3d'), package='torch'),
    # zennit_attn.images.Logits: returns the wrapped classifier's logits (for zennit's attributors)
    Family(name='logits-wrapper', structural=('Logits',), package='zennit_attn'),
)
