"""Which architectures of the installed transformers zennit-attn explains: the zoo walk.

:py:func:`walk` builds every architecture of some of transformers' auto mappings (causal LM, image-text-to-text,
masked LM, sequence-to-sequence LM) from a tiny random configuration (:py:func:`tiny_config`: the config class's
defaults with every size shrunk), in float64, with every bias and learned position embedding set to zero, and
checks each one:

- ``explained``: CP-LRP's relevance at the inputs (every modality: text embeddings and pixels) sums to the explained
  logit within ``1e-6`` (exact conservation, which a missed non-linearity breaks), and AttnLRP runs to finite
  relevance;
- ``refused``: the composite raised :py:class:`~zennit_attn.engine.kinds.UnsupportedModelError` (the reason is
  recorded);
- ``not built``: the tiny configuration does not build or run a plain forward pass (a limit of the walk, not of
  the library);
- ``failed``: anything else (a conservation error, another exception): a defect.

``python -m zennit_attn.zoo docs/supported-models.md`` writes the page of the documentation from it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib
import io
import itertools
import math
import re
import sys
import time
import warnings
from collections.abc import Iterable

import torch
import transformers
from tqdm.auto import tqdm

from .engine.composites import AttnLRPEpsilon, CPLRPEpsilon
from .engine.errors import UnsupportedModelError
from .engine.modules import forward_parameters
from .inputs.checks import check_word_embeddings
from .inputs.lookups import TokenLookups, needs_ids
from .zoo_inputs import pixel_inputs

#: The auto mappings walked: name -> transformers attribute of ``MODEL_FOR_*_MAPPING_NAMES``.
MAPPINGS = {
    'causal-lm': 'MODEL_FOR_CAUSAL_LM_MAPPING_NAMES',
    'image-text-to-text': 'MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES',
    'masked-lm': 'MODEL_FOR_MASKED_LM_MAPPING_NAMES',
    'seq2seq-lm': 'MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES',
}
STATUSES = ('explained', 'refused', 'not built', 'failed')

#: Integer configuration fields and their tiny values (only fields that exist are set).
_SIZES = {
    'hidden_size': 32,
    'd_model': 32,
    'n_embd': 32,
    'n_embed': 32,
    'dim': 32,
    'embed_dim': 32,
    'model_dim': 32,
    'intermediate_size': 48,
    'ffn_hidden_size': 48,
    'ffn_dim': 48,
    'd_ff': 48,
    'n_inner': 48,
    'hidden_dim': 48,
    'encoder_ffn_dim': 48,
    'decoder_ffn_dim': 48,
    'moe_intermediate_size': 16,
    'shared_expert_intermediate_size': 16,
    'expert_intermediate_size': 16,
    'num_hidden_layers': 2,
    'n_layer': 2,
    'n_layers': 2,
    'num_layers': 2,
    'encoder_layers': 2,
    'decoder_layers': 2,
    'num_decoder_layers': 2,
    'depth': 2,
    'num_attention_heads': 4,
    'n_head': 4,
    'n_heads': 4,
    'encoder_attention_heads': 4,
    'decoder_attention_heads': 4,
    'num_heads': 4,
    'num_key_value_heads': 2,
    'n_kv_heads': 2,
    'num_kv_heads': 2,
    'head_dim': 8,
    'd_kv': 8,
    'vocab_size': 96,
    'num_experts': 4,
    'num_local_experts': 4,
    'n_routed_experts': 4,
    'num_experts_per_tok': 2,
    'moe_num_experts': 4,
    'num_shared_experts': 1,
    'n_shared_experts': 1,
    'image_size': 32,
    'patch_size': 8,
    'num_channels': 3,
    'projection_dim': 32,
    'projector_hidden_size': 32,
    'q_lora_rank': 16,
    'kv_lora_rank': 16,
    'qk_rope_head_dim': 8,
    'qk_nope_head_dim': 8,
    'v_head_dim': 8,
    'qk_head_dim': 16,
    'sliding_window': 16,
    'max_window_layers': 2,
    'first_k_dense_replace': 1,
    'rotary_dim': 8,
    'num_global_heads': 4,
    'n_group': 1,
    'topk_group': 1,
    'embedding_size': 32,
    'embedding_dim': 32,
    'num_blocks': 2,
    'num_kv_shared_layers': 1,
    'vocab_size_per_layer_input': 96,
    'hidden_size_per_layer_input': 8,
    'linear_key_head_dim': 8,
    'linear_value_head_dim': 8,
    'linear_head_dim': 8,
    'linear_num_key_heads': 2,
    'linear_num_value_heads': 4,
    'linear_num_heads': 4,
    'ssm_state_size': 16,
    'mamba_num_heads': 4,
    'mamba_dt_rank': 8,
    'dff': 48,
    'dim_ff': 48,
    'd_inner': 48,
    'intermediate_size_mlp': 48,
    'dense_intermediate_size': 48,
    'shared_intermediate_size': 16,
    'shared_experts_intermediate_size': 16,
    'moe_shared_expert_intermediate_size': 16,
    'entity_vocab_size': 96,
    'entity_emb_size': 32,
    'num_latents': 8,
    'd_latents': 32,
    'num_self_attends_per_block': 2,
    'o_lora_rank': 16,
    'swa_head_dim': 8,
    'index_head_dim': 16,
    'projection_intermediate_size': 48,
    'mamba_n_heads': 4,
    'mamba_d_ssm': 64,
    'mamba_d_state': 16,
    'state_size': 16,
    'n_groups': 1,
    'time_step_rank': 8,
}
#: Token id fields kept inside the shrunk vocabulary.
_IDS = (
    'pad_token_id',
    'bos_token_id',
    'eos_token_id',
    'decoder_start_token_id',
    'sep_token_id',
    'cls_token_id',
    'mask_token_id',
    'unk_token_id',
)
_SIZE_NAMES = tuple(_SIZES)
#: Size fields kept equal to a reference field after shrinking where they were equal before.
_TIED = (
    ('num_key_value_heads', 'num_attention_heads'),
    ('head_dim', 'qk_head_dim'),
    ('cross_attention_hidden_size', 'hidden_size'),
    ('attention_hidden_size', 'hidden_size'),
    ('lru_width', 'hidden_size'),
    ('linear_num_value_heads', 'linear_num_key_heads'),
)
#: Constructor arguments per mapping and architecture (``functools.partial`` of the config class).
_INIT = {('causal-lm', 'reformer'): {'is_decoder': True}}  # its language-model head asserts a decoder
#: Fields that no general rule of :py:func:`_shrink` derives, per ``model_type`` (``'sub_config.field'``: set after
#: the sub-configuration's own shrinking); each with the reason.
_OVERRIDES = {
    # defaults of None (or missing) that the model reads
    'lfm2_moe': {'layer_types': ['conv', 'full_attention']},
    'dots1': {'n_routed_experts': 4, 'num_experts_per_tok': 2, 'n_shared_experts': 1},
    'deepseek_v2': {'num_experts_per_tok': 2},
    'deepseek_ocr2_text': {'mlp_layer_types': ['dense', 'sparse'], 'num_experts_per_tok': 2},
    'diffusion_gemma_text': {'num_experts': 4, 'top_k_experts': 2, 'moe_intermediate_size': 16},
    'cohere_compass_text': {'rope_parameters': {'full_attention': {'rope_type': 'default', 'rope_theta': 1e4}}},
    'dbrx': {'attn_config.rope_theta': 1e4, 'attn_config.clip_qkv': 8.0},  # clip_qkv: DBRX's value
    'esm': {'vocab_size': 96, 'pad_token_id': 1, 'mask_token_id': 2},
    'chameleon': {'vocabulary_map': {}},
    'emu3': {'vocabulary_map': {}},
    'xmod': {'default_language': 'en_XX'},  # the language of its adapters
    'step3p5': {'sliding_window': 16},  # Step3p7's forward always builds a sliding-window mask
    # no default (vision layer, language layer) pairs nor downsampling; the spatial groups' layers within 2 layers
    'granite4_vision': {
        'deepstack_layer_map': [(-2, 0)],
        'spatial_target_layers': [0, 0, 1, 1],
        'downsample_rate': '1/2',
    },
    # a timm tower whose embed_dim the projector reads (a tiny perception-encoder ViT, not resnet50 without one)
    'perception_lm': {
        'vision_config.architecture': 'vit_pe_core_tiny_patch16_384',
        'vision_config.model_args': {'embed_dim': 32, 'depth': 2, 'num_heads': 4, 'img_size': 32, 'patch_size': 8},
    },
    # sizes that depend on each other
    # a 686M-parameter audio tokenizer (2048 channels at its last stage): one block per stage, 4 base filters
    'vibevoice_acoustic_tokenizer_encoder': {'depths': [1] * 7, 'num_filters': 4},
    'musicgen_decoder': {'num_codebooks': 1},
    'musicgen_melody_decoder': {'num_codebooks': 1},  # one id sequence
    # axial position embeddings must sum to the hidden size and cover the sequence padded to the chunk length
    'reformer': {
        'axial_pos_embds_dim': (16, 16),
        'axial_pos_shape': (4, 4),
        'attention_head_size': 8,
        'local_attn_chunk_length': 4,
        'lsh_attn_chunk_length': 4,
    },
    # the global transformer takes the local encoder's states times cross_attn_k (2); a small hash vocabulary
    'blt': {'encoder_hash_byte_group_vocab': 96},
    'blt_global_transformer': {'hidden_size': 64, 'head_dim': 16},
    'blt_local_encoder': {'hidden_size_global': 64},
    'blt_local_decoder': {'hidden_size_global': 64},
    # the model needs a full-attention layer, and 2D rotary pairs in the rotary quarter of a head
    'neomme': {'layer_types': ['sliding_attention', 'full_attention'], 'head_dim': 16},
    'paddleocr_vl_text': {'ignore_keys_at_rope_validation': {'mrope_section'}},  # mrope, undeclared by the config
    # large image towers: a 300M-parameter timm tower (:py:func:`_tiny_mobilenet`; its output width stays 2048), a
    # 125M one (its family's smallest, 11M), VQ-VAEs of 240M and 27M (32 channels: group norms of 32)
    'gemma3n_vision': {'model_args': lambda: _tiny_mobilenet(), 'hidden_size': 2048},
    'gemma3n': {'vision_soft_tokens_per_image': 4},
    'fast_vlm': {'vision_config.architecture': 'fastvit_mci0'},
    'emu3_vqgan': {'base_channels': 32, 'hidden_size': 128, 'num_res_blocks': 1, 'codebook_size': 32},
    'chameleon_vqgan': {'base_channels': 32, 'num_res_blocks': 1, 'num_embeddings': 32},
    # defaults that fail the class's own validation (an assistant's text model has no per-layer inputs): set when
    # constructing (:py:func:`tiny_config`); the model still needs its target model's key-value states to run
    'gemma4_assistant': {'text_config.hidden_size_per_layer_input': 0, 'text_config.vocab_size_per_layer_input': 0},
}


#: Names of biases, and of learned or fixed position and token-type embeddings (added to the tokens: biases too).
_BIAS = re.compile(r'bias')
_POSITIONS = re.compile(
    r'(^|\.)(wpe|positions_embed|pos_encoding|pos_embed|position_embeddings?|embed_positions|positional_embedding|'
    r'token_type_embeddings|pos_emb(edding)?|embed_pos|position_embedding|abs_pos|'
    r'type_embeddings|segment_embeddings?|language_embeddings|lang_embeddings|[xyhw]_position_embeddings|'
    r'token_type_embeddings_\d+|class_embedding)(\.|$)'
)


@dataclasses.dataclass
class Result:
    """One architecture of the walk."""

    mapping: str
    architecture: str
    status: str
    reason: str = ''
    ratio: float = math.nan
    seconds: float = 0.0
    #: What was fed, for a model with a vision tower: ``'text + image'`` or ``'text only: <why>'`` ('' without one),
    #: and ``'run with float64 as torch's default dtype'`` for a model that runs in float64 only so.
    inputs: str = ''


def _shrink(config, depth: int = 0) -> None:
    """Shrink ``config`` in place: the sizes of :py:data:`_SIZES`, token ids into the vocabulary, per-layer lists
    (and a heterogeneous configuration's per-layer overrides) to the kept layers, :py:data:`_OVERRIDES`, the sizes
    that depend on each other (:py:func:`_derive`); then its sub-configurations the same way."""
    spec = config.__dict__.get('_heterogeneity_spec')  # per-layer overrides (transformers' heterogeneous configs)
    if spec is not None:
        config.per_layer_config = None
    before = {key: getattr(config, key, None) for key in {'num_hidden_layers', *itertools.chain(*_TIED)}}
    for key, value in _SIZES.items():
        current = getattr(config, key, None)
        if isinstance(current, int) and not isinstance(current, bool) and current > value:
            with contextlib.suppress(Exception):
                setattr(config, key, value)
    vocab = getattr(config, 'vocab_size', None)
    if isinstance(vocab, int):
        for key in _IDS:
            value = getattr(config, key, None)
            if isinstance(value, int) and value >= vocab:
                with contextlib.suppress(Exception):
                    setattr(config, key, min(_IDS.index(key) + 1, vocab - 1))
    layers = getattr(config, 'num_hidden_layers', None)
    for key in ('layer_types', 'mlp_layer_types', 'block_types'):
        value = getattr(config, key, None)
        if isinstance(value, (list, tuple)) and isinstance(layers, int) and len(value) > layers:
            with contextlib.suppress(Exception):
                setattr(config, key, list(value[:layers]))
    for key, value in list(vars(config).items()):  # other per-layer lists (sizes, sparsity, ...): the kept layers'
        if (
            isinstance(value, (list, tuple))
            and isinstance(layers, int)
            and len(value) == before['num_hidden_layers'] > layers
        ):
            with contextlib.suppress(Exception):
                setattr(config, key, [_tiny(key, item) for item in value[:layers]])
    overrides = _OVERRIDES.get(getattr(config, 'model_type', None), {})
    for key, value in overrides.items():
        with contextlib.suppress(Exception):
            if '.' not in key:
                setattr(config, key, value() if callable(value) else value)
    _derive(config, before)
    if spec is not None and isinstance(layers, int):
        kept = {
            index: {key: _tiny(key, value) for key, value in layer.items()}
            for index, layer in spec.per_layer_overrides.items()
            if index < layers
        }
        with contextlib.suppress(Exception):
            config.per_layer_config = kept or None
    if depth < 3:
        for key in getattr(config, 'sub_configs', {}) or {}:
            sub = getattr(config, key, None)
            if sub is not None and hasattr(sub, 'to_dict'):
                _shrink(sub, depth + 1)
    for key, value in overrides.items():  # 'sub_config.field': after the sub-configuration's own shrinking
        owner, _, name = key.rpartition('.')
        with contextlib.suppress(Exception):
            if owner:
                setattr(getattr(config, owner), name, value)


def _tiny_mobilenet() -> dict:
    """timm arguments for a 3-stage MobileNetV5 encoder (0.3M parameters, not 300M; float64's depthwise convolutions
    are slow) with a 2 x 2 output grid (4 image tokens)."""
    from timm.models._efficientnet_builder import decode_arch_def

    stages = [['er_r1_k3_s2_e4_c16'], ['uir_r1_a3_k5_s2_e2_c32'], ['uir_r1_a3_k0_s2_e2_c32']]
    return {'block_args': decode_arch_def(stages), 'stem_size': 8, 'msfa_output_resolution': 2}


def _tiny(key: str, value):
    return min(value, _SIZES[key]) if key in _SIZES and type(value) is int else value


def _derive(config, before: dict) -> None:
    """Make the sizes that depend on each other consistent after shrinking: the fields of :py:data:`_TIED` (equal
    before, equal after: multi-head and multi-head latent attention stay so), the key-value heads (at most the heads),
    a missing head size, state-space heads (spanning the expanded hidden size), the multimodal rotary sections
    (``mrope_section``: three summing to half the rotary part of a head)."""
    for key, reference in _TIED:
        with contextlib.suppress(Exception):
            if before[key] == before[reference] is not None and isinstance(getattr(config, reference), int):
                setattr(config, key, getattr(config, reference))
    heads, kv, hidden = (
        getattr(config, key, None) for key in ('num_attention_heads', 'num_key_value_heads', 'hidden_size')
    )
    with contextlib.suppress(Exception):
        if isinstance(heads, int) and 'num_key_value_heads' in vars(config) and kv is None:
            config.num_key_value_heads = heads
        elif isinstance(heads, int) and isinstance(kv, int):
            config.num_key_value_heads = min(kv, heads)
    with contextlib.suppress(Exception):
        if 'head_dim' in vars(config) and config.head_dim is None and isinstance(hidden, int) and heads:
            config.head_dim = hidden // heads
    for heads_key, size_key, expand_key in (
        ('mamba_n_heads', 'mamba_d_head', 'mamba_expand'),
        ('num_heads', 'head_dim', 'expand'),
        ('n_mamba_heads', 'mamba_headdim', 'mamba_expand'),
        ('mamba_num_heads', 'mamba_head_dim', 'expand'),
    ):
        expand = getattr(config, expand_key, None)  # state-space heads span the expanded hidden size
        with contextlib.suppress(Exception):
            if isinstance(getattr(config, size_key, None), int) and isinstance(expand, (int, float)) and hidden:
                inner = getattr(config, 'mamba_d_ssm', None) or int(expand * hidden)
                setattr(config, size_key, inner // getattr(config, heads_key))
    rope = getattr(config, 'rope_parameters', None)
    if 'mrope_section' in (getattr(config, 'ignore_keys_at_rope_validation', None) or ()) and isinstance(rope, dict):
        nested = {key: value for key, value in rope.items() if isinstance(value, dict)}  # per layer type
        head = getattr(config, 'head_dim', None) or (hidden // heads if isinstance(hidden, int) and heads else 0)
        partial = [*nested.values(), rope][0].get(
            'partial_rotary_factor', getattr(config, 'partial_rotary_factor', None) or 1
        )
        while 0 < int(head * partial) // 2 < 3 and isinstance(getattr(config, 'head_dim', None), int):
            config.head_dim = head = 2 * head
        half = int(head * partial) // 2
        sections = [half // 3, half // 3, half - 2 * (half // 3)]  # the first two equal (Ernie's height, width)
        config.rope_parameters = (
            {**rope, **{key: {**value, 'mrope_section': sections} for key, value in nested.items()}}
            if nested
            else {**rope, 'mrope_section': sections}
        )


def tiny_config(config_class):
    """The config class's defaults with every size shrunk (also in nested text and vision configurations), the sizes
    that depend on each other kept consistent, and the few per-architecture fields of ``_OVERRIDES`` set (see
    :py:func:`_shrink`)."""
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter('ignore')
        try:
            config = config_class()
        except Exception:  # defaults that fail the class's own validation: its sub-configurations' overrides at once
            nested: dict = {}
            for key, value in _OVERRIDES.get(getattr(config_class, 'model_type', None), {}).items():
                owner, _, name = key.partition('.')
                if name:
                    nested.setdefault(owner, {})[name] = value
            if not nested:
                raise
            config = config_class(**nested)
        _shrink(config)
    return config


def _model_class(mapping: str, architecture: str):
    """The model class of ``architecture`` in ``mapping`` and the configuration class to build it from (the part's
    own class where the model is one part of a composite configuration; with ``_INIT``'s constructor arguments)."""
    config_name = importlib.import_module('transformers.models.auto.configuration_auto').CONFIG_MAPPING_NAMES
    names = getattr(importlib.import_module('transformers.models.auto.modeling_auto'), MAPPINGS[mapping])
    model_class, config_class = (
        getattr(transformers, names[architecture]),
        getattr(transformers, config_name[architecture]),
    )
    own = getattr(model_class, 'config_class', None)
    if own in (getattr(config_class, 'sub_configs', None) or {}).values():
        config_class = own  # a model of one part (the text decoder): ``AutoModel.from_config`` gives it that part
    if (mapping, architecture) in _INIT:
        config_class = functools.partial(config_class, **_INIT[mapping, architecture])
    return model_class, config_class


def zero_biases(model: torch.nn.Module) -> None:
    """Set every bias and every learned position embedding to zero (exact conservation needs no biases)."""
    with torch.no_grad():
        for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
            if tensor.is_floating_point() and (_BIAS.search(name.rsplit('.', 1)[-1]) or _POSITIONS.search(name)):
                tensor.zero_()


def _inputs(model, config, mapping: str, generator: torch.Generator) -> tuple[dict, str]:
    """Token ids (and pixels for vision-language models) for a plain forward pass, and what was fed.

    A model with a vision tower (every image-text-to-text architecture, any model whose forward takes
    ``pixel_values``) gets pixels (:py:func:`~zennit_attn.zoo_inputs.pixel_inputs`); what was fed is
    ``'text + image'``, ``'text only: <why>'``, or ``''`` for a model without a vision tower (:py:attr:`Result.inputs`).
    """
    text = getattr(config, 'text_config', None) or config
    vocab = getattr(text, 'vocab_size', None) or getattr(config, 'vocab_size', 96)
    ids = torch.randint(4, min(int(vocab), 90), (1, 6), generator=generator)
    inputs = {'input_ids': ids, 'use_cache': False}
    if mapping == 'seq2seq-lm' or getattr(config, 'is_encoder_decoder', False):
        inputs['decoder_input_ids'] = torch.randint(4, min(int(vocab), 90), (1, 4), generator=generator)
    params = forward_parameters(model)
    if mapping == 'image-text-to-text' or 'pixel_values' in params:
        return inputs, pixel_inputs(model, config, inputs, params, generator, functools.partial(_fails, model))
    return inputs, ''


def _fails(model, inputs: dict, embeddings: bool = True) -> Exception | None:
    """The exception of the plain forward (on the embeddings, as :py:func:`_explain` runs it, or on the ids), with
    the model's warnings and printed messages silenced."""
    try:
        with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter('ignore')
            _explain(model, inputs, None) if embeddings else model(**inputs)
    except Exception as error:
        return error
    return None


def _explain(model, inputs: dict, composite) -> float:
    """The sum of the input relevance under ``composite`` for the relevance 1 at the explained logit."""
    return float(sum(_relevances(model, inputs, composite)[0].values()))


def _relevances(model, inputs: dict, composite) -> tuple[dict[str, float], float]:
    """The input relevance under ``composite`` summed per input (``inputs_embeds``, ``pixel_values``, ...) for the
    relevance 1 at the explained logit (the largest at the last position), and that logit; nothing for no composite.
    """
    embeddings = model.get_input_embeddings()
    check_word_embeddings(model, embeddings)
    ids = inputs['input_ids']
    leaves = {'inputs_embeds': embeddings(ids).detach().requires_grad_(True)}
    kwargs = {key: value for key, value in inputs.items() if key != 'input_ids'}
    for key, value in list(kwargs.items()):  # pixels (every floating-point input but masks): relevance leaves too
        if isinstance(value, torch.Tensor) and value.is_floating_point() and 'mask' not in key:
            leaves[key] = kwargs.pop(key).detach().clone().requires_grad_(True)
    if 'decoder_input_ids' in kwargs:
        decoder = model.get_decoder().get_input_embeddings() if hasattr(model, 'get_decoder') else embeddings
        leaves['decoder_inputs_embeds'] = decoder(kwargs.pop('decoder_input_ids')).detach().requires_grad_(True)
    # a model that needs its ids (zennit_attn.inputs.lookups) is run on them, with its lookups as leaves, as explain() does
    lookups = TokenLookups(model, embeddings) if needs_ids(model, embeddings) else None
    with contextlib.nullcontext(model) if composite is None else composite.context(model) as modified:
        if lookups is None:
            output = modified(**leaves, **kwargs)
        else:
            if composite is not None:
                lookups.record()
            others = {key: leaf for key, leaf in leaves.items() if key != 'inputs_embeds'}
            with lookups.substituting(ids, leaves['inputs_embeds']):
                output = modified(input_ids=ids, **others, **kwargs)
        if composite is None:
            return {}, math.nan
        logits = output.logits if hasattr(output, 'logits') else output[0]
        last = logits[0, -1]
        target = last[last.argmax()]
        target.backward()
    if lookups is not None:
        leaves.update({f'token table {index}': leaf for index, leaf in enumerate(lookups.recorded())})
        leaves.update({'own tokens': leaf for leaf in lookups.own})
    sums = {key: float(leaf.grad.sum()) for key, leaf in leaves.items() if leaf.grad is not None}
    return sums, float(target.detach())


def check(mapping: str, architecture: str, seed: int = 0) -> Result:
    """Build one architecture from a tiny configuration and check it (see the module's description)."""
    start = time.perf_counter()
    fed = ''  # what was fed (Result.inputs), known once the inputs are built

    def result(status: str, reason: str = '', ratio: float = math.nan) -> Result:
        return Result(mapping, architecture, status, reason, ratio, time.perf_counter() - start, fed)

    generator = torch.Generator().manual_seed(seed)
    try:
        model_class, config_class = _model_class(mapping, architecture)
        config = tiny_config(config_class)
        with contextlib.suppress(Exception):
            config._experts_implementation = 'eager'
        torch.manual_seed(seed)
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter('ignore')
            model = model_class(config).to(torch.float64).eval()
            zero_biases(model)
            inputs, fed = _inputs(model, config, mapping, generator)
    except Exception as error:  # a limit of the walk's tiny configurations
        return result('not built', _short(error))
    error = _fails(model, inputs)  # the plain forward on embeddings, as explain() runs it
    dtype = torch.get_default_dtype()
    if error is not None:
        with _default_dtype(torch.float64):  # code that makes default-dtype tensors of float64 values (XGLM's mask)
            if _fails(model, inputs) is None:
                error, dtype, fed = None, torch.float64, ', '.join(filter(None, [fed, _FLOAT64_DEFAULT]))
    if isinstance(error, UnsupportedModelError):
        return result('refused', _short(error))
    if error is not None:
        if _fails(model, inputs, embeddings=False) is not None:  # a limit of the walk's tiny configurations
            return result('not built', _short(error))
        return result(
            'refused',
            f'takes no inputs_embeds ({type(error).__name__}: {_short(error)[:120]}): token '
            'relevance needs the embeddings as input',
        )
    composite = CPLRPEpsilon()
    try:
        with _default_dtype(dtype):
            ratio = _explain(model, inputs, composite)
            attnlrp = _explain(model, inputs, AttnLRPEpsilon())
    except UnsupportedModelError as error:
        return result('refused', _short(error))
    except Exception as error:
        return result('failed', f'{type(error).__name__}: {_short(error)}')
    exact = abs(ratio - 1) <= 1e-6 and math.isfinite(attnlrp)
    reason = '' if exact else f'CP-LRP relevance / logit = {ratio:.6g}, AttnLRP sum {attnlrp:.4g}'
    constants = composite.operation_canonizer.constants  # the constants the model added while it ran
    path, value = max(constants, key=lambda item: abs(float(item[1])), default=('', 0.0))
    if not exact and abs(float(value)) >= 1e-4 and math.isfinite(attnlrp):
        # a constant in the model's code is a bias that cannot be zeroed: conservation cannot be exact (a numerical
        # epsilon below 1e-4 cannot explain a visible loss: that stays a failure)
        return result(
            'explained',
            f'not exactly conservative by design: the model adds the constant {value:g} at {path!r} ({reason})',
            ratio,
        )
    return result('explained' if exact else 'failed', reason, ratio)


#: What :py:func:`check` notes (in :py:attr:`Result.inputs`) for a model that runs in float64 only with torch's default
#: dtype float64: its code makes tensors of the default dtype from float64 values (an overflow in float32).
_FLOAT64_DEFAULT = "run with float64 as torch's default dtype"


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    """torch's default dtype ``dtype`` for the time of the context (put back also when it raises)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _short(error: BaseException) -> str:
    return ' '.join(str(error).split())[:400]


def architectures(mapping: str) -> list[str]:
    """The architectures (model types) of one mapping of the installed transformers, sorted."""
    names = getattr(importlib.import_module('transformers.models.auto.modeling_auto'), MAPPINGS[mapping])
    return sorted(names)


def walk(mappings: Iterable[str] = tuple(MAPPINGS), progress: bool = True) -> list[Result]:
    """Check every architecture of ``mappings`` (see :py:func:`check`)."""
    jobs = [(mapping, name) for mapping in mappings for name in architectures(mapping)]
    return [check(mapping, name) for mapping, name in tqdm(jobs, disable=not progress, desc='zoo')]


def counts(results: Iterable[Result]) -> dict[str, dict[str, int]]:
    """``{mapping: {status: count}}``."""
    table: dict[str, dict[str, int]] = {}
    for result in results:
        table.setdefault(result.mapping, dict.fromkeys(STATUSES, 0))[result.status] += 1
    return table


def page(results: list[Result]) -> str:
    """The supported-models page (Markdown): counts per mapping, then one table row per architecture."""
    version = transformers.__version__
    lines = [
        '# Supported models',
        '',
        f'Generated by `python -m zennit_attn.zoo docs/supported-models.md` with transformers {version}: every',
        'architecture of four auto mappings built from a tiny random configuration and checked in float64 with every',
        "bias and learned position embedding set to zero (see {py:mod}`zennit_attn.zoo`). *explained*: CP-LRP's",
        'relevance at the inputs sums to the explained logit within 1e-6 and AttnLRP runs; *refused*: zennit-attn',
        'raises `UnsupportedModelError` with the reason shown; *not built*: the tiny configuration did not build or',
        'run a plain forward pass (a limit of the walk, not of the library); *failed*: a defect, to be fixed. For a',
        'model with a vision tower the note says what was fed: *text + image* (pixels in the layout the tiny',
        'configuration implies, relevance summed over text and pixels) or *text only* and why.',
        '',
        '| mapping | explained | refused | not built | failed | explained of built |',
        '|---|---|---|---|---|---|',
    ]
    for mapping, row in counts(results).items():
        built = row['explained'] + row['refused'] + row['failed']
        share = f'{100 * row["explained"] / built:.0f}%' if built else '-'
        lines.append(
            f'| {mapping} | {row["explained"]} | {row["refused"]} | {row["not built"]} | {row["failed"]} | {share} |'
        )
    for mapping in dict.fromkeys(result.mapping for result in results):
        lines += ['', f'## {mapping}', '', '| architecture | status | note |', '|---|---|---|']
        for result in results:
            if result.mapping == mapping:
                note = '; '.join(part for part in (result.inputs, result.reason) if part).replace('|', '\\|')
                lines.append(f'| `{result.architecture}` | {result.status} | {note} |')
    return '\n'.join(lines) + '\n'


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog='python -m zennit_attn.zoo', description=__doc__.split('\n\n')[0])
    parser.add_argument('output', nargs='?', help='write the supported-models page (Markdown) here')
    parser.add_argument('--mapping', action='append', choices=sorted(MAPPINGS), help='walk only these mappings')
    args = parser.parse_args(argv)
    results = walk(args.mapping or tuple(MAPPINGS))
    for mapping, row in counts(results).items():
        print(mapping, row)
    for result in results:
        if result.status == 'failed':
            print(f'FAILED {result.mapping} {result.architecture}: {result.reason}', file=sys.stderr)
    if args.output:
        with open(args.output, 'w', encoding='utf-8') as file:
            file.write(page(results))
        print(f'wrote {args.output}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
