"""Tiny, seeded, randomly initialised models of every supported family, and their inputs (plain functions).

Import them from here (``from tests.models import tiny_model``); ``tests/conftest.py`` offers the common ones as
fixtures (``llama``, ``tokenizer``, ``smollm2``, ...).

Text models (Hugging Face):

- :py:func:`tiny_model` ``(family, head, dtype, attn_implementation, zero_bias, seed, experts_implementation)``:
  hidden 32, 2 layers, 4 heads (2 key/value heads where the family has GQA), intermediate 64, vocabulary 100, in
  eval mode; mixtures of experts: 4 experts, 2 per token, expert intermediate 32.
- :py:func:`tiny_config` ``(family, **overrides)``: that model's configuration, from the table ``_CONFIGS``
  (family -> transformers configuration class and keyword arguments).
- :py:data:`FAMILY_HEADS`: every supported ``(family, head)`` pair.
- :py:func:`token_ids` ``(family, length, batch, seed)``: ids that avoid the family's special tokens;
  :py:func:`decoder_ids` ``(family, length, batch, seed)``: decoder input ids of encoder-decoder models (the
  decoder start token, then random ids).

Family names are those of the former family table (:py:mod:`tests.family_table`), except ``t5_relu``: T5 as
originally published (``feed_forward_proj='relu'``, decoder output scaled by ``d_model ** -0.5`` before the LM
head), where ``t5`` is the Flan-T5 / T5 v1.1 layout (``'gated-gelu'``, ``tie_word_embeddings=False``, which in
transformers 5 only turns that scaling off: the LM head shares the embedding weight in both).
:py:data:`TABLE_FAMILY` maps each name here to the family of the table.

Vision transformers (8 x 8 x 3 images, patch 4, width 16, 2 blocks, 2 heads, 3 classes): :py:func:`tiny_timm_vit`,
:py:func:`tiny_deit` (timm, imported when called), :py:func:`tiny_hf_vit` (Hugging Face), :py:data:`VISION_BUILDERS`,
and :py:func:`pixels`; :py:func:`tiny_hf_vision` any of transformers' vision classes (classifiers, segmentation) from
its own configuration, without the constants that absorb relevance.
"""

from __future__ import annotations

import contextlib
import copy

import torch
import transformers
from transformers.modeling_outputs import CausalLMOutput

from zennit_attn.workflows.architecture_check.check import built_model
from zennit_attn.workflows.architecture_check.check import zero_biases as zero_parameters_that_absorb
from zennit_attn.workflows.architecture_check.configs import model_class as zoo_class
from zennit_attn.workflows.architecture_check.configs import tiny_config as hf_tiny_config

VOCAB = 100
HIDDEN = 32
LAYERS = 2
HEADS = 4
KV_HEADS = 2
INTERMEDIATE = 64
POSITIONS = 64
#: Gemma 2 soft-capping in the tiny models (the scores and logits of the random models are of this order)
GEMMA2_ATTN_SOFTCAP = 0.05
GEMMA2_FINAL_SOFTCAP = 0.3

EXPERTS = 4
EXPERTS_PER_TOKEN = 2
EXPERT_INTERMEDIATE = 32

#: Mixture-of-experts decoders.
MOE = ('mixtral', 'qwen2_moe', 'qwen3_moe', 'olmoe')
#: Decoder families (causal language models).
DECODERS = (
    'llama',
    'mistral',
    'qwen2',
    'qwen3',
    'gemma3',
    'gpt2',
    'olmo2',
    'granite',
    'gemma2',
    'phi3',
    'phi',
    'gpt_neox',
) + MOE
#: Encoder families.
ENCODERS = ('bert', 'roberta', 'distilbert')
#: Encoder-decoder families (``t5``: gated GELU as in Flan-T5; ``t5_relu``: the original T5, see above).
ENCODER_DECODERS = ('t5', 't5_relu')
FAMILIES = DECODERS + ENCODERS + ENCODER_DECODERS
#: family name here -> family of the former table (:py:mod:`tests.family_table`; the same but for ``t5_relu``)
TABLE_FAMILY = {family: 't5' if family == 't5_relu' else family for family in FAMILIES}
#: Families whose attention has no SDPA implementation in transformers (Gemma 2: soft-capping).
EAGER_ONLY = ('gemma2',)

#: Heads per family: ``causal_lm`` (``...ForCausalLM`` / ``GPT2LMHeadModel``), ``seq_cls``
#: (``...ForSequenceClassification``), ``masked_lm`` (``...ForMaskedLM``), ``seq2seq``
#: (``...ForConditionalGeneration``), ``base`` (the bare model).
HEAD_NAMES = ('causal_lm', 'seq_cls', 'masked_lm', 'seq2seq', 'base')
FAMILY_HEADS = (
    tuple((family, 'causal_lm') for family in DECODERS)
    + tuple((family, head) for family in ENCODERS for head in ('seq_cls', 'masked_lm'))
    + tuple((family, 'seq2seq') for family in ENCODER_DECODERS)
)

_LLAMA_LIKE = dict(
    vocab_size=VOCAB,
    hidden_size=HIDDEN,
    intermediate_size=INTERMEDIATE,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    num_key_value_heads=KV_HEADS,
    max_position_embeddings=POSITIONS,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=None,
    tie_word_embeddings=False,
)
_MOE = dict(num_experts_per_tok=EXPERTS_PER_TOKEN, output_router_logits=False)
_QWEN_MOE = dict(
    **_MOE, num_experts=EXPERTS, moe_intermediate_size=EXPERT_INTERMEDIATE, decoder_sparse_step=1, mlp_only_layers=[]
)
_BERT_LIKE = dict(
    vocab_size=VOCAB,
    hidden_size=HIDDEN,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    intermediate_size=INTERMEDIATE,
    max_position_embeddings=POSITIONS,
    num_labels=3,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)

#: The hook dictionaries of a module: empty again after a composite's context.
HOOK_ATTRIBUTES = (
    '_forward_hooks',
    '_forward_pre_hooks',
    '_backward_hooks',
    '_backward_pre_hooks',
    '_forward_hooks_with_kwargs',
    '_forward_pre_hooks_with_kwargs',
    '_forward_hooks_always_called',
)


_GEMMA_LIKE = dict(  # one sliding-window layer with a window shorter than the test sequences, one global layer
    _LLAMA_LIKE,
    pad_token_id=0,
    head_dim=HIDDEN // HEADS,
    query_pre_attn_scalar=HIDDEN // HEADS,
    sliding_window=4,
    layer_types=['sliding_attention', 'full_attention'],
)
_T5_LIKE = dict(
    vocab_size=VOCAB,
    d_model=HIDDEN,
    d_kv=HIDDEN // HEADS,
    num_heads=HEADS,
    d_ff=INTERMEDIATE,
    num_layers=LAYERS,
    num_decoder_layers=LAYERS,
    dropout_rate=0.0,
    relative_attention_num_buckets=8,
    relative_attention_max_distance=16,
    decoder_start_token_id=0,
    pad_token_id=0,
    eos_token_id=1,
)

#: family -> (name of the transformers configuration class, its keyword arguments)
_CONFIGS = {
    'llama': ('LlamaConfig', _LLAMA_LIKE),
    'mistral': ('MistralConfig', dict(_LLAMA_LIKE, sliding_window=None)),
    'qwen2': ('Qwen2Config', _LLAMA_LIKE),
    'qwen3': ('Qwen3Config', dict(_LLAMA_LIKE, head_dim=HIDDEN // HEADS)),
    'gemma3': ('Gemma3TextConfig', _GEMMA_LIKE),
    'gpt2': (
        'GPT2Config',
        dict(
            vocab_size=VOCAB,
            n_embd=HIDDEN,
            n_layer=LAYERS,
            n_head=HEADS,
            n_inner=INTERMEDIATE,
            n_positions=POSITIONS,
            bos_token_id=1,
            eos_token_id=2,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            num_labels=3,
        ),
    ),
    'olmo2': ('Olmo2Config', _LLAMA_LIKE),
    # every multiplier away from 1, so that each scaling is on the relevance path
    'granite': (
        'GraniteConfig',
        dict(
            _LLAMA_LIKE, embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.5, logits_scaling=4.0
        ),
    ),
    # soft-capping of the scores and of the logits at about their magnitude in these tiny models, so that the tanh
    # is not close to the identity; a sliding-window layer as in Gemma 3
    'gemma2': (
        'Gemma2Config',
        dict(_GEMMA_LIKE, attn_logit_softcapping=GEMMA2_ATTN_SOFTCAP, final_logit_softcapping=GEMMA2_FINAL_SOFTCAP),
    ),
    'phi3': ('Phi3Config', dict(_LLAMA_LIKE, original_max_position_embeddings=POSITIONS)),
    'phi': ('PhiConfig', dict(_LLAMA_LIKE, num_key_value_heads=HEADS)),
    'gpt_neox': (
        'GPTNeoXConfig',
        dict(
            vocab_size=VOCAB,
            hidden_size=HIDDEN,
            num_hidden_layers=LAYERS,
            num_attention_heads=HEADS,
            intermediate_size=INTERMEDIATE,
            max_position_embeddings=POSITIONS,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=None,
            tie_word_embeddings=False,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            classifier_dropout=0.0,
        ),
    ),
    'mixtral': (
        'MixtralConfig',
        dict(_LLAMA_LIKE, intermediate_size=EXPERT_INTERMEDIATE, **_MOE, num_local_experts=EXPERTS),
    ),
    # not renormalised routing weights, a shared expert with its sigmoid gate, query/key/value biases
    'qwen2_moe': (
        'Qwen2MoeConfig',
        dict(_LLAMA_LIKE, **_QWEN_MOE, norm_topk_prob=False, shared_expert_intermediate_size=INTERMEDIATE),
    ),
    'qwen3_moe': ('Qwen3MoeConfig', dict(_LLAMA_LIKE, **_QWEN_MOE, norm_topk_prob=True, head_dim=HIDDEN // HEADS)),
    'olmoe': (
        'OlmoeConfig',
        dict(_LLAMA_LIKE, intermediate_size=EXPERT_INTERMEDIATE, **_MOE, num_experts=EXPERTS, norm_topk_prob=False),
    ),
    'bert': ('BertConfig', dict(_BERT_LIKE, pad_token_id=0)),
    'roberta': ('RobertaConfig', dict(_BERT_LIKE, pad_token_id=1, bos_token_id=0, eos_token_id=2)),
    'distilbert': (
        'DistilBertConfig',
        dict(
            vocab_size=VOCAB,
            dim=HIDDEN,
            n_layers=LAYERS,
            n_heads=HEADS,
            hidden_dim=INTERMEDIATE,
            max_position_embeddings=POSITIONS,
            num_labels=3,
            pad_token_id=0,
            dropout=0.0,
            attention_dropout=0.0,
            seq_classif_dropout=0.0,
        ),
    ),
    't5': ('T5Config', dict(_T5_LIKE, feed_forward_proj='gated-gelu', tie_word_embeddings=False)),
    't5_relu': ('T5Config', dict(_T5_LIKE, feed_forward_proj='relu', tie_word_embeddings=True)),
}


def tiny_config(family: str, **overrides) -> transformers.PreTrainedConfig:
    """The configuration of a tiny model of ``family``; ``overrides`` replace or add configuration values."""
    if family not in _CONFIGS:
        raise ValueError(f'unknown family {family!r}; known: {FAMILIES}')
    name, kwargs = _CONFIGS[family]
    config = getattr(transformers, name)(**copy.deepcopy(kwargs))  # a list of the table must not become shared
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


#: (family, head) -> name of the transformers model class
_CLASSES = {
    ('llama', 'causal_lm'): 'LlamaForCausalLM',
    ('llama', 'seq_cls'): 'LlamaForSequenceClassification',
    ('llama', 'base'): 'LlamaModel',
    ('mistral', 'causal_lm'): 'MistralForCausalLM',
    ('mistral', 'base'): 'MistralModel',
    ('qwen2', 'causal_lm'): 'Qwen2ForCausalLM',
    ('qwen2', 'base'): 'Qwen2Model',
    ('qwen3', 'causal_lm'): 'Qwen3ForCausalLM',
    ('qwen3', 'base'): 'Qwen3Model',
    ('gemma3', 'causal_lm'): 'Gemma3ForCausalLM',
    ('gemma3', 'base'): 'Gemma3TextModel',
    ('gpt2', 'causal_lm'): 'GPT2LMHeadModel',
    ('gpt2', 'seq_cls'): 'GPT2ForSequenceClassification',
    ('gpt2', 'base'): 'GPT2Model',
    ('olmo2', 'causal_lm'): 'Olmo2ForCausalLM',
    ('granite', 'causal_lm'): 'GraniteForCausalLM',
    ('gemma2', 'causal_lm'): 'Gemma2ForCausalLM',
    ('phi3', 'causal_lm'): 'Phi3ForCausalLM',
    ('phi', 'causal_lm'): 'PhiForCausalLM',
    ('gpt_neox', 'causal_lm'): 'GPTNeoXForCausalLM',
    ('mixtral', 'causal_lm'): 'MixtralForCausalLM',
    ('qwen2_moe', 'causal_lm'): 'Qwen2MoeForCausalLM',
    ('qwen3_moe', 'causal_lm'): 'Qwen3MoeForCausalLM',
    ('olmoe', 'causal_lm'): 'OlmoeForCausalLM',
    ('bert', 'seq_cls'): 'BertForSequenceClassification',
    ('bert', 'masked_lm'): 'BertForMaskedLM',
    ('bert', 'base'): 'BertModel',
    ('roberta', 'seq_cls'): 'RobertaForSequenceClassification',
    ('roberta', 'masked_lm'): 'RobertaForMaskedLM',
    ('roberta', 'base'): 'RobertaModel',
    ('distilbert', 'seq_cls'): 'DistilBertForSequenceClassification',
    ('distilbert', 'masked_lm'): 'DistilBertForMaskedLM',
    ('distilbert', 'base'): 'DistilBertModel',
    ('t5', 'seq2seq'): 'T5ForConditionalGeneration',
    ('t5', 'base'): 'T5Model',
    ('t5_relu', 'seq2seq'): 'T5ForConditionalGeneration',
    ('t5_relu', 'base'): 'T5Model',
}


def zero_biases(model: torch.nn.Module) -> torch.nn.Module:
    """Set every parameter named ``...bias`` (Linear, Conv1D, LayerNorm, LM-head biases) to 0, in place."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.rsplit('.', 1)[-1] == 'bias':
                parameter.zero_()
    return model


def tiny_model(
    family: str,
    head: str = None,
    dtype: torch.dtype = torch.float64,
    attn_implementation: str = 'eager',
    zero_bias: bool = False,
    seed: int = 0,
    experts_implementation: str | None = None,
    **config_overrides,
) -> torch.nn.Module:
    """A new tiny random model of ``family`` with ``head`` (default: causal_lm for decoders, seq_cls for encoders,
    seq2seq for encoder-decoders), cast to ``dtype``, in eval mode. The random weights depend only on ``family``,
    ``head``, ``seed`` and the configuration overrides (models with the same ones are copies of one float32 model,
    built once). Leaves the global torch generator seeded with ``seed``.

    ``experts_implementation`` (mixtures of experts): ``config._experts_implementation``; by default ``'eager'``
    for float64 (transformers' default ``'grouped_mm'`` refuses float64) and transformers' default otherwise."""
    if head is None:
        head = 'causal_lm' if family in DECODERS else 'seq2seq' if family in ENCODER_DECODERS else 'seq_cls'
    if (family, head) not in _CLASSES:
        raise ValueError(f'no tiny {head!r} model for family {family!r}')
    try:
        key = (family, head, seed, tuple(sorted(config_overrides.items())))
        hash(key)
    except TypeError:
        key = None
    model = _BUILT.get(key) if key is not None else None
    if model is None:
        model = _build(family, head, seed, config_overrides)
        if key is not None:
            _BUILT[key] = model
    model = copy.deepcopy(model)
    _configure(model, '_attn_implementation', attn_implementation)
    if family in MOE and (experts_implementation is not None or dtype == torch.float64):
        _configure(model, '_experts_implementation', experts_implementation or 'eager')
    model = model.to(dtype).eval()
    if zero_bias:
        zero_biases(model)
    torch.manual_seed(seed)  # the global generator's state afterwards does not depend on the cache
    return model


_BUILT: dict = {}


def _configure(model: torch.nn.Module, key: str, value) -> None:
    """Set ``key`` on every configuration object of ``model`` (T5's encoder and decoder hold copies of it)."""
    configs = {
        id(config): config
        for config in (getattr(module, 'config', None) for module in model.modules())
        if config is not None
    }
    for config in configs.values():
        setattr(config, key, value)


def _build(family, head, seed, config_overrides):
    config = tiny_config(family, **config_overrides)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)  # the weights must not depend on what a test left as default
    try:
        with _quiet():
            torch.manual_seed(seed)
            return getattr(transformers, _CLASSES[(family, head)])(config).eval()
    finally:
        torch.set_default_dtype(default)


def token_ids(family: str, length: int = 10, batch: int = 1, seed: int = 0) -> torch.Tensor:
    """``[batch, length]`` random token ids in ``[3, VOCAB)``, avoiding the pad/bos/eos ids of every family."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, length), generator=generator)


def decoder_ids(family: str, length: int = 4, batch: int = 1, seed: int = 1) -> torch.Tensor:
    """``[batch, length]`` decoder input ids of an encoder-decoder ``family``: the decoder start token, then ids
    in ``[3, VOCAB)``."""
    if family not in ENCODER_DECODERS:
        raise ValueError(f'{family!r} is not an encoder-decoder family')
    start = torch.full((batch, 1), tiny_config(family).decoder_start_token_id)
    return torch.cat([start, token_ids(family, length - 1, batch, seed)], 1)


@contextlib.contextmanager
def _quiet():
    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers.logging.set_verbosity(level)


# ------------------------------------------------------------------------------------------------ vision transformers
IMAGE, PATCH, CHANNELS, CLASSES = 8, 4, 3, 3


def _zero(model, names=('bias', 'cls_token', 'dist_token', 'pos_embed', 'position_embeddings')):
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.rsplit('.', 1)[-1] in names:
                parameter.zero_()
    return model


def tiny_timm_vit(
    dtype: torch.dtype = torch.float64, zero_bias: bool = False, seed: int = 0, **overrides
) -> torch.nn.Module:
    """timm ``VisionTransformer``: 8 x 8 x 3 input, patch 4 (4 patches + class token), width 16, 2 blocks, 2 heads,
    3 classes; ``overrides`` replace its keyword arguments. ``zero_bias``: biases, tokens and position embeddings
    set to 0."""
    from timm.models.vision_transformer import VisionTransformer  # timm is optional (the vision extra)

    torch.manual_seed(seed)
    kwargs = dict(
        img_size=IMAGE,
        patch_size=PATCH,
        in_chans=CHANNELS,
        num_classes=CLASSES,
        embed_dim=16,
        depth=2,
        num_heads=2,
        mlp_ratio=2.0,
        qkv_bias=True,
    )
    kwargs.update(overrides)
    model = VisionTransformer(**kwargs).to(dtype).eval()
    with torch.no_grad():  # timm initialises tokens and position embeddings tiny; make them matter
        for name, parameter in model.named_parameters():
            if name in ('cls_token', 'pos_embed', 'reg_token'):
                parameter.normal_(0, 0.5)
    return _zero(model) if zero_bias else model


def tiny_torchvision_vit(dtype: torch.dtype = torch.float64, seed: int = 0) -> torch.nn.Module:
    """torchvision's ``VisionTransformer`` (its attention a ``torch.nn.MultiheadAttention``) of the shape of
    :py:func:`tiny_timm_vit`, every parameter drawn from N(0, 0.3) (torchvision zeroes the head)."""
    from torchvision.models.vision_transformer import VisionTransformer  # timm's dependency (the vision extra)

    torch.manual_seed(seed)
    model = VisionTransformer(
        image_size=IMAGE, patch_size=PATCH, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32, num_classes=CLASSES
    )
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.3)
    return model.to(dtype).eval()


def timm_twin(torchvision_vit: torch.nn.Module) -> torch.nn.Module:
    """The timm ``VisionTransformer`` that computes the same function as ``torchvision_vit``
    (:py:func:`tiny_torchvision_vit`): its weights copied (the packed ``in_proj`` as timm's fused ``qkv``)."""
    source = torchvision_vit
    twin = tiny_timm_vit(next(source.parameters()).dtype, mlp_ratio=2.0)
    state = {
        'patch_embed.proj.weight': source.conv_proj.weight,
        'patch_embed.proj.bias': source.conv_proj.bias,
        'cls_token': source.class_token,
        'pos_embed': source.encoder.pos_embedding,
        'norm.weight': source.encoder.ln.weight,
        'norm.bias': source.encoder.ln.bias,
        'head.weight': source.heads.head.weight,
        'head.bias': source.heads.head.bias,
    }
    for index, layer in enumerate(source.encoder.layers):
        attention, block = layer.self_attention, f'blocks.{index}.'
        pairs = {
            'norm1': layer.ln_1,
            'attn.proj': attention.out_proj,
            'norm2': layer.ln_2,
            'mlp.fc1': layer.mlp[0],
            'mlp.fc2': layer.mlp[3],
        }
        for name, module in pairs.items():
            state[f'{block}{name}.weight'], state[f'{block}{name}.bias'] = module.weight, module.bias
        state[f'{block}attn.qkv.weight'] = attention.in_proj_weight
        state[f'{block}attn.qkv.bias'] = attention.in_proj_bias
    twin.load_state_dict({name: tensor.detach().clone() for name, tensor in state.items()}, strict=True)
    return twin


def tiny_deit(dtype: torch.dtype = torch.float64, zero_bias: bool = False, seed: int = 0) -> torch.nn.Module:
    """timm DeiT (``VisionTransformerDistilled``: distillation token, LayerScale), otherwise as
    :py:func:`tiny_timm_vit`."""
    from timm.models.deit import VisionTransformerDistilled

    torch.manual_seed(seed)
    model = (
        VisionTransformerDistilled(
            img_size=IMAGE,
            patch_size=PATCH,
            in_chans=CHANNELS,
            num_classes=CLASSES,
            embed_dim=16,
            depth=2,
            num_heads=2,
            mlp_ratio=2.0,
            qkv_bias=True,
            init_values=0.5,
        )
        .to(dtype)
        .eval()
    )
    with torch.no_grad():
        for name in ('cls_token', 'dist_token', 'pos_embed'):
            getattr(model, name).normal_(0, 0.5)
    return _zero(model) if zero_bias else model


def tiny_hf_vit(
    dtype: torch.dtype = torch.float64, zero_bias: bool = False, seed: int = 0, attn_implementation: str = 'eager'
) -> transformers.ViTForImageClassification:
    """Hugging Face ``ViTForImageClassification`` with the sizes of :py:func:`tiny_timm_vit`."""
    config = transformers.ViTConfig(
        image_size=IMAGE,
        patch_size=PATCH,
        num_channels=CHANNELS,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=CLASSES,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    with _quiet():
        model = transformers.ViTForImageClassification(config).to(dtype).eval()
    return _zero(model) if zero_bias else model


def pixels(batch: int = 2, dtype: torch.dtype = torch.float64, seed: int = 0) -> torch.Tensor:
    """``[batch, 3, 8, 8]`` uniform random images for the tiny vision transformers."""
    return torch.rand(batch, CHANNELS, IMAGE, IMAGE, generator=torch.Generator().manual_seed(seed), dtype=dtype)


#: kind -> builder of the tiny vision transformers
VISION_BUILDERS = {'timm': tiny_timm_vit, 'deit': tiny_deit, 'hf': tiny_hf_vit}


# ----------------------------------------------------------------------------- transformers' other vision models
#: Names of the vision models' constants (biases aside) that :py:func:`tiny_hf_vision` sets to zero: they absorb
#: relevance by design.
VISION_CONSTANTS = (
    'position',
    'cls_token',
    'mask_token',
    'relative_position_bias_table',
    'register_tokens',
    'pos_embed',
    'detection_tokens',
    'time_embeddings',
)


def tiny_hf_vision(name: str, labels: int = 3, **values) -> tuple[torch.nn.Module, torch.Tensor]:
    """The tiny float64 model of transformers' vision class ``name`` (its configuration from
    :py:func:`~zennit_attn.workflows.architecture_check.configs.tiny_config`, with ``values`` and ``labels`` classes)
    without constants (biases, running means, :py:data:`VISION_CONSTANTS`; zero-initialised heads and layer scales
    drawn at random), so that CP-LRP conserves exactly, and a batch of two images."""
    model_class = getattr(transformers, name)
    config = hf_tiny_config(model_class.config_class)
    for key, value in values.items():
        setattr(config, key, value)
    config.num_labels = labels
    torch.manual_seed(0)
    model = model_class(config).double().eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter_name, parameter in model.named_parameters():
            if parameter_name.endswith('bias') or any(key in parameter_name for key in VISION_CONSTANTS):
                parameter.zero_()
            elif not parameter.any():  # zero-initialised heads and layer scales
                parameter.normal_(0, 0.1, generator=generator)
        for module in model.modules():
            if getattr(module, 'running_mean', None) is not None:
                module.running_mean.zero_()
                module.running_var.fill_(1.0)
    size = getattr(config, 'image_size', 32)  # SegFormer's configuration has none: any size
    side = size if isinstance(size, int) else size[0]
    channels = getattr(config, 'num_channels', 3)
    return model, torch.randn(2, channels, side, side, dtype=torch.float64, generator=generator)


# ----------------------------------------------------------------------------------- vision-language and CLIP models
#: Text vocabulary of the tiny vision-language models: the 100 ids of the test tokenizers and 4 special tokens
#: (``<image>`` 100 for LLaVA; ``<|image_pad|>`` 100, ``<|video_pad|>`` 101, ``<|vision_start|>`` 102,
#: ``<|vision_end|>`` 103 for Qwen2-VL).
VLM_VOCAB = VOCAB + 4
#: Image side and patch size of the tiny LLaVA and CLIP vision towers (4 patches per image).
VLM_IMAGE, VLM_PATCH = 16, 8
_VLM_TEXT = dict(
    vocab_size=VLM_VOCAB,
    hidden_size=HIDDEN,
    intermediate_size=INTERMEDIATE,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    num_key_value_heads=KV_HEADS,
    max_position_embeddings=POSITIONS,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
_TOWER = dict(
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    image_size=VLM_IMAGE,
    patch_size=VLM_PATCH,
)


def zero_multimodal(model: torch.nn.Module) -> torch.nn.Module:
    """:py:func:`~zennit_attn.workflows.architecture_check.check.zero_biases` (biases, position embeddings) plus the
    class embeddings of vision towers (a constant token that would absorb relevance): exact conservation for CP-LRP."""
    zero_parameters_that_absorb(model)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.rsplit('.', 1)[-1] in ('class_embedding', 'logit_bias'):
                parameter.zero_()
    return model


def _vlm(name: str, config, dtype: torch.dtype, zero_bias: bool, seed: int, attn_implementation: str):
    config._attn_implementation = attn_implementation
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        with _quiet():
            torch.manual_seed(seed)
            model = getattr(transformers, name)(config).to(dtype).eval()
    finally:
        torch.set_default_dtype(default)
    _configure(model, '_attn_implementation', attn_implementation)
    return zero_multimodal(model) if zero_bias else model


def tiny_llava(
    dtype: torch.dtype = torch.float64, zero_bias: bool = False, seed: int = 0, attn_implementation: str = 'eager'
) -> transformers.LlavaForConditionalGeneration:
    """LLaVA: a CLIP vision tower (16 x 16 images, patch 8: 4 image tokens), a Llama text model of the tiny sizes
    with vocabulary :py:data:`VLM_VOCAB`, image token 100."""
    config = transformers.LlavaConfig(
        vision_config=transformers.CLIPVisionConfig(**_TOWER),
        text_config=transformers.LlamaConfig(**_VLM_TEXT),
        image_token_id=VOCAB,
        vision_feature_layer=-1,
        vision_feature_select_strategy='default',
        projector_hidden_act='gelu',
        image_seq_length=(VLM_IMAGE // VLM_PATCH) ** 2,
        tie_word_embeddings=False,
    )
    return _vlm('LlavaForConditionalGeneration', config, dtype, zero_bias, seed, attn_implementation)


#: Qwen2-VL's tiny vision tower: patch 4, 2 x 2 patches merged into one token, 2 frames per temporal patch.
QWEN_PATCH, QWEN_MERGE, QWEN_TEMPORAL = 4, 2, 2


def tiny_qwen2_vl(
    dtype: torch.dtype = torch.float64, zero_bias: bool = False, seed: int = 0, attn_implementation: str = 'eager'
) -> transformers.Qwen2VLForConditionalGeneration:
    """Qwen2-VL (flattened patches with ``image_grid_thw``, multimodal rotary positions): vision tower of width 16,
    patch :py:data:`QWEN_PATCH`, text model of the tiny sizes with vocabulary :py:data:`VLM_VOCAB`."""
    vision = dict(
        depth=2,
        embed_dim=16,
        hidden_size=HIDDEN,
        num_heads=2,
        patch_size=QWEN_PATCH,
        spatial_merge_size=QWEN_MERGE,
        temporal_patch_size=QWEN_TEMPORAL,
        mlp_ratio=2,
    )
    text = dict(_VLM_TEXT, rope_parameters={'rope_type': 'default', 'mrope_section': [1, 1, 2], 'rope_theta': 1e4})
    config = transformers.Qwen2VLConfig(
        vision_config=vision,
        text_config=text,
        image_token_id=VOCAB,
        video_token_id=VOCAB + 1,
        vision_start_token_id=VOCAB + 2,
        vision_end_token_id=VOCAB + 3,
        tie_word_embeddings=False,
    )
    return _vlm('Qwen2VLForConditionalGeneration', config, dtype, zero_bias, seed, attn_implementation)


def tiny_clip(
    dtype: torch.dtype = torch.float64,
    zero_bias: bool = False,
    seed: int = 0,
    attn_implementation: str = 'eager',
    family: str = 'clip',
) -> torch.nn.Module:
    """``CLIPModel`` (``family='siglip'``: ``SiglipModel``): text and vision towers of width 16, 2 layers, 16 x 16
    images with patch 8, vocabulary :py:data:`VOCAB` (the test tokenizers'; the end-of-text token is id 2)."""
    text = dict(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=POSITIONS,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    if family == 'clip':
        config = transformers.CLIPConfig(
            text_config=dict(text, projection_dim=16), vision_config=_TOWER, projection_dim=16
        )
        return _vlm('CLIPModel', config, dtype, zero_bias, seed, attn_implementation)
    config = transformers.SiglipConfig(text_config=dict(text, projection_size=16), vision_config=_TOWER)
    return _vlm('SiglipModel', config, dtype, zero_bias, seed, attn_implementation)


class TwoTables(torch.nn.Module):
    """``logit = w . relu-free sum over tokens of (E[id] + P[id]) * s``: linear in the rows of two token tables, so
    every token's CP-LRP relevance is its rows' share ``w . (E[id] + P[id]) * s`` of the logit. The second table
    needs the ids (the forward refuses ``inputs_embeds`` without them, like Gemma 4's per-layer embeddings)."""

    def __init__(self, vocab=20, hidden=6, classes=3):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.per_token = torch.nn.Embedding(vocab, hidden)
        self.head = torch.nn.Linear(hidden, classes, bias=False)
        self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, hidden))

    def get_input_embeddings(self):
        return self.embed

    def forward(self, input_ids=None, inputs_embeds=None, attention_mask=None):
        if input_ids is None:
            raise ValueError('input_ids are needed for the per-token table')
        hidden = (self.embed(input_ids) + self.per_token(input_ids)) * self.scale
        return CausalLMOutput(logits=self.head(hidden.cumsum(1)))


def two_tables():
    torch.manual_seed(0)
    return TwoTables().double().eval()


# ----------------------------------------------------------------------------- the architecture check's tiny models
def zoo_model(mapping: str, architecture: str) -> tuple[torch.nn.Module, dict]:
    """The architecture check's tiny random model of ``architecture`` in ``mapping`` (``'masked-lm'``, ...) as the check
    builds it (float64, seeded, its constants set to 0) and the check's inputs."""
    model_type, config_type = zoo_class(mapping, architecture)
    model, inputs, _ = built_model(
        mapping, lambda: (model_type, hf_tiny_config(config_type)), 0, torch.Generator().manual_seed(0)
    )
    return model, inputs


def seq2seq_with_positions(architecture: str) -> torch.nn.Module:
    """The architecture check's tiny ``architecture`` (BART, Marian, ...: a ``seq2seq-lm``) in float64 without biases,
    with random values in its encoder's and decoder's position tables (``model.model.{encoder,decoder}
    .embed_positions``)."""
    model_type, config_type = zoo_class('seq2seq-lm', architecture)
    torch.manual_seed(0)
    model = model_type(hf_tiny_config(config_type)).double().eval()
    zero_parameters_that_absorb(model)
    with torch.no_grad():
        for table in (model.model.encoder.embed_positions, model.model.decoder.embed_positions):
            table.weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(2))
    return model
