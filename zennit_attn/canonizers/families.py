"""The per-family table: which classes of a model family are what, for the general mechanism in ``base``.

A family entry lists
- ``structural``: classes whose forward only calls children, adds residuals, reshapes, applies rotary or
  position embeddings, masks or selects: operations that are linear in the relevance path and need no rule;
- ``operands``: classes that compute products inline, with the children producing the operands
  (attention: query, key, value; gated MLPs: gate, up);
- ``inline``: classes that call element-wise non-linearities as functions;
- ``config``: configuration attributes that must have the given value (features not yet covered);
- ``package``: the package defining these classes.

Leaf modules (linear layers, embeddings, dropout, activations, norms) are recognised by type and need no
entry (see :py:mod:`zennit_attn.types`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import torch

from .base import OperandSpec


@dataclass(frozen=True)
class Family:
    """What zennit-attn knows about one model family."""
    name: str
    structural: tuple[str, ...]
    operands: Mapping[str, OperandSpec] = field(default_factory=dict)
    inline: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    config: Mapping[str, object] = field(default_factory=dict)
    #: the package that defines the listed classes (a class of the same name from elsewhere is not trusted)
    package: str = 'transformers'

    @property
    def classes(self) -> frozenset[str]:
        return frozenset(self.structural) | frozenset(self.operands) | frozenset(self.inline)


def separate_qkv(query: str, key: str, value: str) -> OperandSpec:
    """Attention with one projection module each for query, key and value."""
    return lambda module: {query: 'query', key: 'key', value: 'value'}


def gated(gate: str, up: str) -> OperandSpec:
    """Gated MLP ``down(act(gate(x)) * up(x))``."""
    return lambda module: {gate: 'gate', up: 'up'}


def gpt2_attention(module: torch.nn.Module) -> Mapping[str, object]:
    """GPT-2's fused ``c_attn`` (query, key, value), or ``q_attn`` + ``c_attn`` (key, value) in cross-attention."""
    if getattr(module, 'is_cross_attention', False):
        return {'q_attn': 'query', 'c_attn': ('key', 'value')}
    return {'c_attn': ('query', 'key', 'value')}


def llama_like(prefix: str, name: str, extra: tuple[str, ...] = (), config: Mapping[str, object] | None = None):
    """Decoder families built like Llama: RMSNorm, rotary attention with q/k/v projections, gated MLP."""
    suffixes = ('ForCausalLM', 'Model', 'DecoderLayer', 'RotaryEmbedding', 'ForSequenceClassification',
                'ForTokenClassification')
    return Family(
        name=name,
        structural=tuple(prefix + suffix for suffix in suffixes) + extra,
        operands={
            f'{prefix}Attention': separate_qkv('q_proj', 'k_proj', 'v_proj'),
            f'{prefix}MLP': gated('gate_proj', 'up_proj'),
        },
        config=config or {},
    )


def bert_like(prefix: str, name: str, extra: tuple[str, ...] = (), inline: Mapping[str, tuple[str, ...]] = None):
    """Encoder families built like BERT: post-LayerNorm, separate q/k/v projections, GELU MLP."""
    suffixes = ('Model', 'Embeddings', 'Encoder', 'Layer', 'Attention', 'SelfOutput', 'Intermediate', 'Output',
                'Pooler', 'ForSequenceClassification', 'ForMaskedLM', 'ForTokenClassification')
    return Family(
        name=name,
        structural=tuple(prefix + suffix for suffix in suffixes) + extra,
        operands={
            f'{prefix}SelfAttention': separate_qkv('query', 'key', 'value'),
            f'{prefix}CrossAttention': separate_qkv('query', 'key', 'value'),
        },
        inline=inline or {},
    )


#: Gemma 2 style soft-capping puts a tanh on the attention scores and the logits; not covered yet.
_NO_SOFTCAP = {'attn_logit_softcapping': None, 'final_logit_softcapping': None}

FAMILIES: tuple[Family, ...] = (
    llama_like('Llama', 'llama'),
    llama_like('Mistral', 'mistral'),
    llama_like('Qwen2', 'qwen2'),
    llama_like('Qwen3', 'qwen3'),
    llama_like(
        'Gemma3', 'gemma3',
        extra=('Gemma3TextModel', 'Gemma3TextScaledWordEmbedding', 'Gemma3TextForSequenceClassification'),
        config=_NO_SOFTCAP,
    ),
    Family(
        name='gpt2',
        structural=('GPT2LMHeadModel', 'GPT2Model', 'GPT2Block', 'GPT2MLP', 'GPT2ForSequenceClassification',
                    'GPT2ForTokenClassification'),
        operands={'GPT2Attention': gpt2_attention},
    ),
    bert_like('Bert', 'bert', extra=('BertOnlyMLMHead', 'BertLMPredictionHead', 'BertPredictionHeadTransform')),
    bert_like('Roberta', 'roberta', extra=('RobertaClassificationHead', 'RobertaLMHead'),
              inline={'RobertaClassificationHead': ('tanh',), 'RobertaLMHead': ('gelu',)}),
)
