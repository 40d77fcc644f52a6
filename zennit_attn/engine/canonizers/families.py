"""The per-family table: which classes of a model family are what, for the general mechanism in ``base``.

A family entry lists

- ``structural``: classes whose forward only calls children, adds residuals, reshapes, applies rotary or
  position embeddings, masks or selects: operations that are linear in the relevance path and need no rule;
- ``operands``: classes that compute products inline, with the children producing the operands
  (attention: query, key, value; gated MLPs: gate, up);
- ``inline``: classes that call element-wise non-linearities as functions;
- ``inline_operands``: classes that compute operands with ``F.linear`` on their own parameters (experts);
- ``settings``: configuration values set for the time of the context (the experts implementation);
- ``config``: configuration attributes that must have the given value, or one of a tuple of values
  (features not yet covered);
- ``cross_attention``: classes whose attention reads the encoder's tokens in an encoder-decoder model (their keys
  and values come from the encoder output);
- ``attention_output``: the output projection of each attention class (the Linear after ``A V``, the paper's
  "LinearOutputProjection" of appendix B), ``class name -> child attribute``;
- ``mlp_output``: the down (output) projection of each feed-forward class, the Linear after the last
  non-linearity, whose inputs are the FFN "knowledge neurons" of the paper's section 3.5 (``act(gate) * up`` in
  gated MLPs, ``act(fc1)`` otherwise), ``class name -> child attribute``; empty for routed mixtures of experts,
  whose experts have no per-token neurons of fixed meaning (see :py:mod:`zennit_attn.latent`);
- ``blocks``: the classes of the repeated transformer block, for packages that do not mark their blocks
  (transformers marks them: every ``GradientCheckpointingLayer`` is a block); read by
  :py:func:`~zennit_attn.engine.canonizers.blocks.block_stacks`, not a class of the family by itself;
- ``package``: the module defining these classes (default ``transformers.models.<name>``).

Leaf modules (linear and convolution layers, embeddings, dropout, activations, norms) are recognised by type and
need no entry (see :py:mod:`zennit_attn.engine.kinds`).

Vision transformers (timm ``VisionTransformer`` incl. DeiT, Hugging Face ViT) need no rule for the patch embedding
(a convolution: linear), the class, distillation and register tokens and the position embedding (parameters
concatenated or added to the tokens: they absorb their share like a bias), ``LayerScale`` and the pooling (linear);
their attention gets the same operand taps as the language models' (timm's fused ``qkv`` in three equal sections).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from .base import OperandSpec, Tap, parse_taps


@dataclass(frozen=True)
class Family:
    """What zennit-attn knows about one model family."""

    name: str
    structural: tuple[str, ...]
    operands: Mapping[str, OperandSpec] = field(default_factory=dict)
    inline: Mapping[str, tuple] = field(default_factory=dict)
    inline_operands: Mapping[str, Mapping[str, object]] = field(default_factory=dict)
    settings: Mapping[str, object] = field(default_factory=dict)
    config: Mapping[str, object] = field(default_factory=dict)
    attention_output: Mapping[str, str] = field(default_factory=dict)
    mlp_output: Mapping[str, str] = field(default_factory=dict)
    cross_attention: tuple[str, ...] = ()
    blocks: tuple[str, ...] = ()
    #: the module (package) that defines the listed classes, by default ``transformers.models.<name>``; a class
    #: of the same name defined elsewhere is not trusted
    package: str | None = None

    @property
    def module_prefix(self) -> str:
        return (self.package or f'transformers.models.{self.name}') + '.'

    def owns(self, module: torch.nn.Module) -> bool:
        """Whether ``module``'s class is one this family lists."""
        cls = type(module)
        return cls.__name__ in self.classes and cls.__module__.startswith(self.module_prefix)

    def is_block(self, module: torch.nn.Module) -> bool:
        """Whether ``module``'s class is one of this family's :py:attr:`blocks`."""
        cls = type(module)
        return cls.__name__ in self.blocks and cls.__module__.startswith(self.module_prefix)

    @functools.cached_property
    def classes(self) -> frozenset[str]:
        return (
            frozenset(self.structural)
            | frozenset(self.operands)
            | frozenset(self.inline)
            | frozenset(self.inline_operands)
            | frozenset(self.attention_output)
            | frozenset(self.cross_attention)
        )

    def taps(self, module: torch.nn.Module) -> dict[str, Tap]:
        """``{child attribute: Tap}`` of the products ``module`` computes inline; empty for other classes."""
        spec = self.operands.get(type(module).__name__)
        return {} if spec is None or not self.owns(module) else parse_taps(spec, module)

    def config_problems(self, config) -> list[str]:
        """The configuration values of ``config`` (and its ``text_config``) that this family does not support."""
        problems = []
        for key, allowed in self.config.items():
            allowed = allowed if isinstance(allowed, tuple) else (allowed,)
            for conf in (config, getattr(config, 'text_config', None)):
                if conf is not None and hasattr(conf, key) and getattr(conf, key) not in allowed:
                    problems.append(f'config.{key}={getattr(conf, key)!r} (supported: {", ".join(map(repr, allowed))})')
        return problems


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


def llama_like(prefix: str, name: str, extra: tuple[str, ...] = (), **fields) -> Family:
    """Decoder families built like Llama: RMSNorm, rotary attention with q/k/v projections, gated MLP."""
    suffixes = (
        'ForCausalLM',
        'Model',
        'DecoderLayer',
        'RotaryEmbedding',
        'ForSequenceClassification',
        'ForTokenClassification',
    )
    return Family(
        name=name,
        structural=tuple(prefix + suffix for suffix in suffixes) + extra,
        operands={
            f'{prefix}Attention': separate_qkv('q_proj', 'k_proj', 'v_proj'),
            f'{prefix}MLP': gated('gate_proj', 'up_proj'),
            **fields.pop('operands', {}),
        },
        attention_output={f'{prefix}Attention': 'o_proj'},
        **{'mlp_output': {f'{prefix}MLP': 'down_proj'}, **fields},
    )


def moe(prefix: str, name: str, shared_expert: bool = False) -> Family:
    """Mixture-of-experts decoders (Mixtral, Qwen-MoE, OLMoE): the routing weights (softmax over the top-k
    router logits, whose plain gradient is Prop. 3.1) multiply the experts' outputs (Prop. 3.2).

    The experts run as the plain loop (``config._experts_implementation = 'eager'`` during the context) so
    that their fused gate/up projections are ``F.linear`` calls that can be tapped; every implementation a
    user loads is thereby explained the same way. Qwen2-MoE's shared expert is gated by
    ``sigmoid(shared_expert_gate(x))``: a gate (identity rule on the sigmoid, uniform rule on the product).
    """
    block = {'gate': Tap('routing', index=1), 'experts': 'routed'}
    inline = {}
    if shared_expert:
        block.update({'shared_expert_gate': 'gate', 'shared_expert': 'up'})
        inline[f'{prefix}SparseMoeBlock'] = ('sigmoid',)
    return llama_like(
        prefix,
        name,
        extra=(f'{prefix}TopKRouter',),
        operands={f'{prefix}SparseMoeBlock': lambda module: block},
        inline=inline,
        inline_operands={f'{prefix}Experts': {'gate_up_proj': ('gate', 'up')}},
        settings={'_experts_implementation': 'eager'},
        mlp_output={},
    )


def bert_like(prefix: str, name: str, extra: tuple[str, ...] = (), inline: Mapping[str, tuple] = None):
    """Encoder families built like BERT: post-LayerNorm, separate q/k/v projections, GELU MLP."""
    suffixes = (
        'Model',
        'Embeddings',
        'Encoder',
        'Layer',
        'Attention',
        'SelfOutput',
        'Intermediate',
        'Output',
        'Pooler',
        'ForSequenceClassification',
        'ForMaskedLM',
        'ForTokenClassification',
    )
    return Family(
        name=name,
        structural=tuple(prefix + suffix for suffix in suffixes) + extra,
        operands={
            f'{prefix}SelfAttention': separate_qkv('query', 'key', 'value'),
            f'{prefix}CrossAttention': separate_qkv('query', 'key', 'value'),
        },
        attention_output={f'{prefix}SelfOutput': 'dense'},
        mlp_output={f'{prefix}Output': 'dense'},
        inline=inline or {},
    )


def phi3_attention(module: torch.nn.Module) -> Mapping[str, object]:
    """Phi-3's fused ``qkv_proj``: query heads, then key and value heads (grouped-query sizes)."""
    query = module.config.num_attention_heads * module.head_dim
    key_value = module.num_key_value_heads * module.head_dim
    return {'qkv_proj': Tap(('query', 'key', 'value'), (query, key_value, key_value))}


def neox_attention(module: torch.nn.Module) -> Mapping[str, object]:
    """GPT-NeoX's ``query_key_value``: per head, query, key and value of ``head_size`` each, interleaved."""
    heads = module.config.num_attention_heads
    return {'query_key_value': Tap(('query', 'key', 'value') * heads, (module.head_size,) * 3 * heads)}


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


#: Soft-capping puts a tanh on the attention scores and the logits (Gemma 2); where a family has no entry for
#: it, it must be off.
_NO_SOFTCAP = {'attn_logit_softcapping': None, 'final_logit_softcapping': None}
#: Attention implementations in which the soft-capping tanh is a torch call the canonizer can route.
_SOFTCAP_ATTENTION = {'_attn_implementation': ('eager', 'sdpa')}

FAMILIES: tuple[Family, ...] = (
    llama_like('Llama', 'llama'),
    llama_like('Mistral', 'mistral'),
    llama_like('Qwen2', 'qwen2'),
    llama_like('Qwen3', 'qwen3'),
    llama_like('Olmo2', 'olmo2'),
    llama_like('Granite', 'granite'),
    llama_like(
        'Gemma3',
        'gemma3',
        config=_NO_SOFTCAP,
        extra=('Gemma3TextModel', 'Gemma3TextScaledWordEmbedding', 'Gemma3TextForSequenceClassification'),
    ),
    llama_like(
        'Gemma2',
        'gemma2',
        config=_SOFTCAP_ATTENTION,
        inline={'Gemma2Attention': ('tanh',), 'Gemma2ForCausalLM': (('tanh',), 'lm_head')},
    ),
    llama_like(
        'Phi3',
        'phi3',
        operands={'Phi3Attention': phi3_attention, 'Phi3MLP': lambda module: {'gate_up_proj': ('gate', 'up')}},
    ),
    Family(
        name='phi',
        structural=(
            'PhiForCausalLM',
            'PhiModel',
            'PhiDecoderLayer',
            'PhiRotaryEmbedding',
            'PhiMLP',
            'PhiForSequenceClassification',
            'PhiForTokenClassification',
        ),
        operands={'PhiAttention': separate_qkv('q_proj', 'k_proj', 'v_proj')},
        attention_output={'PhiAttention': 'dense'},
        mlp_output={'PhiMLP': 'fc2'},
    ),
    Family(
        name='gpt_neox',
        structural=(
            'GPTNeoXForCausalLM',
            'GPTNeoXModel',
            'GPTNeoXLayer',
            'GPTNeoXMLP',
            'GPTNeoXRotaryEmbedding',
            'GPTNeoXForSequenceClassification',
            'GPTNeoXForTokenClassification',
        ),
        operands={'GPTNeoXAttention': neox_attention},
        attention_output={'GPTNeoXAttention': 'dense'},
        mlp_output={'GPTNeoXMLP': 'dense_4h_to_h'},
    ),
    moe('Mixtral', 'mixtral'),
    moe('Qwen2Moe', 'qwen2_moe', shared_expert=True),
    moe('Qwen3Moe', 'qwen3_moe'),
    moe('Olmoe', 'olmoe'),
    Family(
        name='gpt2',
        structural=(
            'GPT2LMHeadModel',
            'GPT2Model',
            'GPT2Block',
            'GPT2MLP',
            'GPT2ForSequenceClassification',
            'GPT2ForTokenClassification',
        ),
        operands={'GPT2Attention': gpt2_attention},
        attention_output={'GPT2Attention': 'c_proj'},
        mlp_output={'GPT2MLP': 'c_proj'},
    ),
    bert_like('Bert', 'bert', extra=('BertOnlyMLMHead', 'BertLMPredictionHead', 'BertPredictionHeadTransform')),
    bert_like(
        'Roberta',
        'roberta',
        extra=('RobertaClassificationHead', 'RobertaLMHead'),
        inline={'RobertaClassificationHead': ('tanh',), 'RobertaLMHead': ('gelu',)},
    ),
    Family(
        name='distilbert',
        structural=(
            'DistilBertModel',
            'Embeddings',
            'Transformer',
            'TransformerBlock',
            'FFN',
            'DistilBertForSequenceClassification',
            'DistilBertForMaskedLM',
            'DistilBertForTokenClassification',
        ),
        operands={'DistilBertSelfAttention': separate_qkv('q_lin', 'k_lin', 'v_lin')},
        attention_output={'DistilBertSelfAttention': 'out_lin'},
        mlp_output={'FFN': 'lin2'},
    ),
    Family(
        name='t5',
        structural=(
            'T5ForConditionalGeneration',
            'T5Model',
            'T5EncoderModel',
            'T5Stack',
            'T5Block',
            'T5LayerSelfAttention',
            'T5LayerCrossAttention',
            'T5LayerFF',
            'T5DenseActDense',
        ),
        operands={'T5Attention': separate_qkv('q', 'k', 'v'), 'T5DenseGatedActDense': gated('wi_0', 'wi_1')},
        attention_output={'T5Attention': 'o'},
        mlp_output={'T5DenseActDense': 'wo', 'T5DenseGatedActDense': 'wo'},
        cross_attention=('T5LayerCrossAttention',),
    ),
    Family(
        name='timm-vit',
        structural=(
            'VisionTransformer',
            'VisionTransformerDistilled',
            'Block',
            'PatchEmbed',
            'Mlp',
            'LayerScale',
            'DropPath',
        ),
        operands={'Attention': timm_attention},
        attention_output={'Attention': 'proj'},
        mlp_output={'Mlp': 'fc2'},
        blocks=('Block',),
        package='timm',
    ),
    Family(
        name='vit',
        structural=(
            'ViTForImageClassification',
            'ViTModel',
            'ViTEmbeddings',
            'ViTPatchEmbeddings',
            'ViTEncoder',
            'ViTLayer',
            'ViTMLP',
            'ViTPooler',
            'ViTIntermediate',
            'ViTOutput',
        ),
        operands={'ViTAttention': hf_vit_attention, 'ViTSelfAttention': hf_vit_attention},
        # transformers 5: ViTAttention.o_proj; earlier versions: ViTSelfOutput.dense beside ViTSelfAttention
        attention_output={'ViTAttention': 'o_proj', 'ViTSelfOutput': 'dense'},
        mlp_output={'ViTMLP': 'fc2', 'ViTOutput': 'dense'},
    ),
)

#: Output projection of each attention class of the table: ``class name -> child attribute``.
ATTENTION_OUTPUTS: dict[str, str] = {
    name: child for family in FAMILIES for name, child in family.attention_output.items()
}


def family_of(module: torch.nn.Module) -> Family | None:
    """The family of the table that lists ``module``'s class, or None."""
    return next((family for family in FAMILIES if family.owns(module)), None)


def operand_taps(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, Tap]]:
    """Every tap of the family table in ``model``: ``(module, child attribute, Tap)`` for each child whose output
    is an operand of a product the module computes inline."""
    found = []
    for module in model.modules():
        family = family_of(module)
        if family is not None:
            found.extend((module, child, tap) for child, tap in family.taps(module).items())
    return found
