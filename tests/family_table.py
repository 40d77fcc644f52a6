"""What the family table (``zennit_attn/canonizers/families.py``, deleted with issue 30) said about the tiny
models of its families, kept as data: the structure the package now finds from what a model computes
(:py:mod:`zennit_attn.structure`, :py:func:`~zennit_attn.core.blocks.attention_linears`) must
equal it.

Recorded from the table on these models (``tests.models.tiny_model`` with the heads of :py:data:`HEADS`,
``tiny_timm_vit``, ``tiny_hf_vit``) before it was deleted:

- ``mlp``: the children ``Family.mlp_output`` named (the FFN down projections); none in the mixtures of experts;
- ``attention``: the children ``Family.attention_output`` named (the attention output projections), each with
  ``heads`` heads (``latent.sites`` read them from the configuration);
- ``query``, ``key``, ``value``: the children the operand taps gave these roles (``Family.operands``), with the role
  of each output feature of a fused projection in :py:data:`FUSED`;
- ``key_sites``: where AtMan scaled the keys (``methods.attention.key_sites``: the key tap, or the attention
  module's ``k_norm`` after it; in T5 those of the encoder and the cross-attention);
- the ViT gamma composite's attention projections (``composites.gamma.attention_projections``) were the query, key
  and value children (input projections) and the ``attention`` children (output projections).

Paths hold ``{}`` for the block's index (every model has :py:data:`tests.models.LAYERS` blocks).
"""

from __future__ import annotations

import torch

from tests.models import LAYERS

#: The head of the tiny model of each family whose default head the table's answers were not recorded with.
HEADS = {'bert': 'seq_cls', 'roberta': 'masked_lm', 'distilbert': 'seq_cls', 't5': 'seq2seq', 't5_relu': 'seq2seq'}


def _llama_like(key_site: str = 'k_proj', mlp: bool = True, query='q_proj', key='k_proj', value='v_proj') -> dict:
    path = 'model.layers.{}.self_attn.'
    return {
        'mlp': ['model.layers.{}.mlp.down_proj'] if mlp else [],
        'attention': [path + 'o_proj'],
        'heads': 4,
        'query': [path + query],
        'key': [path + key],
        'value': [path + value],
        'key_sites': [path + key_site],
    }


def _bert_like(prefix: str) -> dict:
    path = prefix + '.encoder.layer.{}.'
    return {
        'mlp': [path + 'output.dense'],
        'attention': [path + 'attention.output.dense'],
        'heads': 4,
        'query': [path + 'attention.self.query'],
        'key': [path + 'attention.self.key'],
        'value': [path + 'attention.self.value'],
        'key_sites': [path + 'attention.self.key'],
    }


def _t5() -> dict:
    encoder, self_attention, cross = (
        'encoder.block.{}.layer.0.SelfAttention.',
        'decoder.block.{}.layer.0.SelfAttention.',
        'decoder.block.{}.layer.1.EncDecAttention.',
    )
    return {
        'mlp': ['encoder.block.{}.layer.1.DenseReluDense.wo', 'decoder.block.{}.layer.2.DenseReluDense.wo'],
        'attention': [encoder + 'o', self_attention + 'o', cross + 'o'],
        'heads': 4,
        'query': [encoder + 'q', self_attention + 'q', cross + 'q'],
        'key': [encoder + 'k', self_attention + 'k', cross + 'k'],
        'value': [encoder + 'v', self_attention + 'v', cross + 'v'],
        'key_sites': [encoder + 'k', cross + 'k'],
    }


def _one_projection(mlp: str, attention: str, projection: str, heads: int = 4) -> dict:
    return {
        'mlp': [mlp],
        'attention': [attention],
        'heads': heads,
        'query': [projection],
        'key': [projection],
        'value': [projection],
        'key_sites': [projection],
    }


TABLE = {
    'llama': _llama_like(),
    'mistral': _llama_like(),
    'qwen2': _llama_like(),
    'qwen3': _llama_like('k_norm'),
    'gemma3': _llama_like('k_norm'),
    'gpt2': _one_projection(
        'transformer.h.{}.mlp.c_proj', 'transformer.h.{}.attn.c_proj', 'transformer.h.{}.attn.c_attn'
    ),
    'olmo2': _llama_like('k_norm'),
    'granite': _llama_like(),
    'gemma2': _llama_like(),
    'phi3': _llama_like('qkv_proj', query='qkv_proj', key='qkv_proj', value='qkv_proj'),
    'phi': {**_llama_like(), 'mlp': ['model.layers.{}.mlp.fc2'], 'attention': ['model.layers.{}.self_attn.dense']},
    'gpt_neox': _one_projection(
        'gpt_neox.layers.{}.mlp.dense_4h_to_h',
        'gpt_neox.layers.{}.attention.dense',
        'gpt_neox.layers.{}.attention.query_key_value',
    ),
    'mixtral': _llama_like(mlp=False),
    'qwen2_moe': _llama_like(mlp=False),
    'qwen3_moe': _llama_like('k_norm', mlp=False),
    'olmoe': _llama_like('k_norm', mlp=False),
    'bert': _bert_like('bert'),
    'roberta': _bert_like('roberta'),
    'distilbert': {
        'mlp': ['distilbert.transformer.layer.{}.ffn.lin2'],
        'attention': ['distilbert.transformer.layer.{}.attention.out_lin'],
        'heads': 4,
        'query': ['distilbert.transformer.layer.{}.attention.q_lin'],
        'key': ['distilbert.transformer.layer.{}.attention.k_lin'],
        'value': ['distilbert.transformer.layer.{}.attention.v_lin'],
        'key_sites': ['distilbert.transformer.layer.{}.attention.k_lin'],
    },
    't5': _t5(),
    't5_relu': _t5(),
    'timm-vit': _one_projection('blocks.{}.mlp.fc2', 'blocks.{}.attn.proj', 'blocks.{}.attn.qkv', heads=2),
    'vit': {
        'mlp': ['vit.layers.{}.mlp.fc2'],
        'attention': ['vit.layers.{}.attention.o_proj'],
        'heads': 2,
        'query': ['vit.layers.{}.attention.q_proj'],
        'key': ['vit.layers.{}.attention.k_proj'],
        'value': ['vit.layers.{}.attention.v_proj'],
        'key_sites': ['vit.layers.{}.attention.k_proj'],
    },
}

#: The role (query, key, value) of each output feature of the fused projections of the table (``Tap`` sections):
#: GPT-2's ``c_attn`` and timm's ``qkv`` in three equal sections, Phi-3's ``qkv_proj`` with grouped-query sizes (4
#: query heads, 2 key/value heads of 8), GPT-NeoX's ``query_key_value`` per head (4 heads of 8).
FUSED = {
    'transformer.h.{}.attn.c_attn': 'q' * 32 + 'k' * 32 + 'v' * 32,
    'model.layers.{}.self_attn.qkv_proj': 'q' * 32 + 'k' * 16 + 'v' * 16,
    'gpt_neox.layers.{}.attention.query_key_value': ('q' * 8 + 'k' * 8 + 'v' * 8) * 4,
    'blocks.{}.attn.qkv': 'q' * 16 + 'k' * 16 + 'v' * 16,
}


def expand(patterns: list[str]) -> list[str]:
    """Every path of ``patterns``, each pattern for every block in turn."""
    return [pattern.format(layer) for pattern in patterns for layer in range(LAYERS)]


def role_mask(roles: str, role: str) -> torch.Tensor:
    """``[features]`` boolean mask of the features of ``role`` (``'query'``, ``'key'``, ``'value'``) in ``roles``."""
    return torch.tensor([letter == role[0] for letter in roles])
