"""Tiny random configurations of transformers' architectures: the config class's defaults (or a model's own
configuration) with every size shrunk, so that a model of the architecture builds and runs in float64 in a fraction of
a second (:py:func:`tiny_config`, :py:func:`shrink`), and the model class of an architecture in one of transformers'
auto mappings (:py:data:`MAPPINGS`, :py:func:`model_class`, :py:func:`model_class_for`).

Only integer size fields that exist and are larger are set (:py:data:`SIZES`); token ids are kept inside the shrunk
vocabulary (:py:data:`IDS`), per-layer lists cut to the kept layers, sizes that were equal stay equal (:py:data:`TIED`)
and the few fields that no general rule derives are set per ``model_type`` (:py:data:`OVERRIDES`, each with its
reason).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import itertools
import warnings
from collections.abc import Iterator

import transformers
from transformers.models.auto import modeling_auto
from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

try:  # timm builds the vision towers of some architectures (Gemma 3n); without it they are not built
    from timm.models._efficientnet_builder import decode_arch_def
except ImportError:
    decode_arch_def = None

__all__ = [
    'MAPPINGS',
    'SIZES',
    'IDS',
    'TIED',
    'INIT',
    'OVERRIDES',
    'shrink',
    'tiny_config',
    'tiny_copy',
    'tiny_mobilenet',
    'model_class',
    'model_class_for',
    'mappings_of',
]

#: The auto mappings of the check: name -> transformers attribute of ``MODEL_FOR_*_MAPPING_NAMES``.
MAPPINGS = {
    'causal-lm': 'MODEL_FOR_CAUSAL_LM_MAPPING_NAMES',
    'image-text-to-text': 'MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES',
    'masked-lm': 'MODEL_FOR_MASKED_LM_MAPPING_NAMES',
    'seq2seq-lm': 'MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES',
}

#: Integer configuration fields and their tiny values (only fields that exist are set).
SIZES = {
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
IDS = (
    'pad_token_id',
    'bos_token_id',
    'eos_token_id',
    'decoder_start_token_id',
    'sep_token_id',
    'cls_token_id',
    'mask_token_id',
    'unk_token_id',
)
#: Size fields kept equal to a reference field after shrinking where they were equal before.
TIED = (
    ('num_key_value_heads', 'num_attention_heads'),
    ('head_dim', 'qk_head_dim'),
    ('cross_attention_hidden_size', 'hidden_size'),
    ('attention_hidden_size', 'hidden_size'),
    ('lru_width', 'hidden_size'),
    ('linear_num_value_heads', 'linear_num_key_heads'),
)
#: Constructor arguments per mapping and architecture (``functools.partial`` of the config class).
INIT = {
    ('causal-lm', 'reformer'): {'is_decoder': True},  # its language-model head asserts a decoder
    # no vision tower by default (None): the class's default vision configuration
    ('image-text-to-text', 'gemma4'): {'vision_config': {}},
    ('image-text-to-text', 'gemma4_unified'): {'vision_config': {}},
}
#: Fields that no general rule of :py:func:`shrink` derives, per ``model_type`` (``'sub_config.field'``: set after
#: the sub-configuration's own shrinking); each with the reason.
OVERRIDES = {
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
        'qformer_config.encoder_hidden_size': 32,  # the tiny vision width
    },
    # a timm tower whose embed_dim the projector reads (a tiny perception-encoder ViT, not resnet50 without one)
    'perception_lm': {
        'vision_config.architecture': 'vit_pe_core_tiny_patch16_384',
        'vision_config.model_args': {'embed_dim': 32, 'depth': 2, 'num_heads': 4, 'img_size': 32, 'patch_size': 8},
    },
    # no image placeholder id by default (None): the model then never merges the image features into the text
    'minicpmv4_6': {'image_token_id': 95},
    'minicpmv4_7': {'image_token_id': 95},
    'minicpm_ocr': {'image_token_id': 95},
    # and RADIO's patch widths, set from the default patch of 16 (3 channels x 16 x 16, 2 frames a tubelet), and the
    # tiny vision width that the projector takes
    'nemotron_h_omni': {
        'image_token_id': 95,
        'vision_hidden_size': 32,
        'vision_config.patch_dim': 3 * 8 * 8,
        'vision_config.video_patch_dim': 2 * 3 * 8 * 8,
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
    # Gemma 3's image tokens pool the patch grid of the vision tower (4 x 4 patches of the tiny one: 2 x 2 tokens)
    'gemma3': {'mm_tokens_per_image': 4},
    'shieldgemma2': {'mm_tokens_per_image': 4},
    't5gemma2_encoder': {'mm_tokens_per_image': 4},
    # widths of the vision-language projectors: the tiny vision width (32) times the patches merged into one token
    'dots3_note': {'vision_config.adapter_in_dim': 32, 'vision_config.adapter_out_dim': 32},
    'muse_glimmer': {'out_hidden_size': 128},
    'muse_spark': {'out_hidden_size': 128},
    'minimax_m3_vl': {'merged_hidden_size': 128},
    # feature layers among the tiny tower's 3 hidden states (the defaults index a 24-layer tower)
    'vipllava': {'vision_feature_layers': [-2, -1]},
    # the SAM tower's last channels meet the query encoder's width (the tiny 32)
    'deepseek_ocr2_sam_vision_model': {'downsample_channels': [16, 32]},
    'unlimited_ocr_sam_vision_model': {'downsample_channels': [16, 32]},
    # Aria's image processor takes 490 or 980 pixels only: 7 x 7 patches of 70 pixels, pooled to 4 queries
    'aria': {'vision_config.image_size': 490, 'vision_config.patch_size': 70, 'projector_patch_to_query_dict': {49: 4}},
    'deepseek_vl_hybrid': {'high_res_vision_config.global_attn_indexes': [0]},  # its features after the first layer
    'kimi_k25': {'projection_hidden_size': 32},  # the tiny vision width
    'inkling_mm_model': {'vision_config.text_hidden_size': 32},  # the tiny text width
    # Molmo 2: a 32-pixel tower of 4 x 4 patches, its features from the 2 layers, projected to the tiny text width
    'molmo2_vision': {'image_size': [32, 32], 'num_position_embeddings': 16},
    'molmo2_adapter': {'vision_feature_layer': [-1, -2], 'text_hidden_size': 32},
    'mllama_text_model': {'cross_attention_layers': [1]},  # the defaults (3, 8, ...) lie beyond the 2 layers
    'mllama_vision_model': {'intermediate_layers_indices': [0, 1], 'vision_output_dim': 96, 'num_global_layers': 2},
    'paddleocr_vl_text': {'ignore_keys_at_rope_validation': {'mrope_section'}},  # mrope, undeclared by the config
    # large image towers: a 300M-parameter timm tower (:py:func:`tiny_mobilenet`; its output width stays 2048), a
    # 125M one (its family's smallest, 11M), VQ-VAEs of 240M and 27M (32 channels: group norms of 32)
    'gemma3n_vision': {'model_args': lambda: tiny_mobilenet(), 'hidden_size': 2048},
    'gemma3n': {'vision_soft_tokens_per_image': 4},
    # its width; FastViT in inference mode has no skip connections nor norms: transformers' initialisation (std
    # 0.02) shrinks the pixels to 1e-40 over its convolutions (a pixel share of 0), std 0.5 keeps them in scale
    'fast_vlm': {
        'vision_config.architecture': 'fastvit_mci0',
        'vision_config.hidden_size': 1024,
        'vision_config.initializer_range': 0.5,
    },
    'emu3_vqgan': {'base_channels': 32, 'hidden_size': 128, 'num_res_blocks': 1, 'codebook_size': 32},
    'chameleon_vqgan': {'base_channels': 32, 'num_res_blocks': 1, 'num_embeddings': 32},
    # defaults that fail the class's own validation (an assistant's text model has no per-layer inputs): set when
    # constructing (:py:func:`tiny_config`); the model still needs its target model's key-value states to run
    'gemma4_assistant': {'text_config.hidden_size_per_layer_input': 0, 'text_config.vocab_size_per_layer_input': 0},
}


def shrink(config, depth: int = 0) -> None:
    """Shrink ``config`` in place: the sizes of :py:data:`SIZES`, token ids into the vocabulary, per-layer lists
    (and a heterogeneous configuration's per-layer overrides) to the kept layers, :py:data:`OVERRIDES`, the sizes
    that depend on each other (:py:func:`_derive`); then its sub-configurations the same way (three levels deep), and
    last the overrides of a sub-configuration's field (``'sub_config.field'``).

    A field that refuses its tiny value (a property, a validated field) keeps its own: shrinking is best effort, and
    a configuration that does not build after it is reported as not built by the check."""
    spec = config.__dict__.get('_heterogeneity_spec')  # per-layer overrides (transformers' heterogeneous configs)
    if spec is not None:
        config.per_layer_config = None
    before = {key: getattr(config, key, None) for key in {'num_hidden_layers', *itertools.chain(*TIED)}}
    _shrink_sizes(config)
    _ids_into_vocabulary(config)
    layers = getattr(config, 'num_hidden_layers', None)
    if isinstance(layers, int):
        _cut_per_layer_lists(config, layers, before['num_hidden_layers'])
    overrides = OVERRIDES.get(getattr(config, 'model_type', None), {})
    _set_own_overrides(config, overrides)
    _derive(config, before)
    if spec is not None and isinstance(layers, int):
        _keep_layer_overrides(config, spec, layers)
    if depth < 3:
        for sub in _sub_configs(config):
            shrink(sub, depth + 1)
    _set_nested_overrides(config, overrides)


def _shrink_sizes(config) -> None:
    """Set every integer field of :py:data:`SIZES` that is larger than its tiny value to that value."""
    for key, value in SIZES.items():
        current = getattr(config, key, None)
        if isinstance(current, int) and not isinstance(current, bool) and current > value:
            with contextlib.suppress(Exception):
                setattr(config, key, value)


def _ids_into_vocabulary(config) -> None:
    """Move the token ids of :py:data:`IDS` that lie outside the (shrunk) vocabulary into it (1, 2, ... by their
    order in :py:data:`IDS`, at most the last id)."""
    vocab = getattr(config, 'vocab_size', None)
    if not isinstance(vocab, int):
        return
    for key in IDS:
        value = getattr(config, key, None)
        if isinstance(value, int) and value >= vocab:
            with contextlib.suppress(Exception):
                setattr(config, key, min(IDS.index(key) + 1, vocab - 1))


def _cut_per_layer_lists(config, layers: int, layers_before) -> None:
    """Cut the layer types to the kept ``layers``, then the other per-layer lists (those as long as the layers
    were, ``layers_before``: sizes, sparsity, ...) to the kept layers' entries, each shrunk as its field."""
    for key in ('layer_types', 'mlp_layer_types', 'block_types'):
        value = getattr(config, key, None)
        if isinstance(value, (list, tuple)) and len(value) > layers:
            with contextlib.suppress(Exception):
                setattr(config, key, list(value[:layers]))
    for key, value in list(vars(config).items()):
        if isinstance(value, (list, tuple)) and len(value) == layers_before > layers:
            with contextlib.suppress(Exception):
                setattr(config, key, [_tiny(key, item) for item in value[:layers]])


def _set_own_overrides(config, overrides: dict) -> None:
    """Set the overrides of ``config``'s own fields (a callable value is called for it)."""
    for key, value in overrides.items():
        with contextlib.suppress(Exception):
            if '.' not in key:
                setattr(config, key, value() if callable(value) else value)


def _set_nested_overrides(config, overrides: dict) -> None:
    """Set the overrides of a sub-configuration's field (``'sub_config.field'``), after its own shrinking."""
    for key, value in overrides.items():
        owner, _, name = key.rpartition('.')
        with contextlib.suppress(Exception):
            if owner:
                setattr(getattr(config, owner), name, value)


def _keep_layer_overrides(config, spec, layers: int) -> None:
    """The per-layer overrides of a heterogeneous configuration's kept ``layers``, shrunk as their fields."""
    kept = {
        index: {key: _tiny(key, value) for key, value in layer.items()}
        for index, layer in spec.per_layer_overrides.items()
        if index < layers
    }
    with contextlib.suppress(Exception):
        config.per_layer_config = kept or None


def _sub_configs(config) -> list:
    """The sub-configurations of ``config`` (text, vision, ...) that are set."""
    subs = []
    for key in getattr(config, 'sub_configs', {}) or {}:
        sub = getattr(config, key, None)
        if sub is not None and hasattr(sub, 'to_dict'):
            subs.append(sub)
    return subs


def tiny_mobilenet() -> dict:
    """timm arguments for a 3-stage MobileNetV5 encoder (0.3M parameters, not 300M; float64's depthwise convolutions
    are slow) with a 2 x 2 output grid (4 image tokens): Gemma 3n's vision tower.

    Raises
    ------
    ImportError
        Without timm (its vision tower is a timm model: the architecture is then not built).
    """
    if decode_arch_def is None:
        raise ImportError("Gemma 3n's vision tower is a timm model: pip install timm")
    stages = [['er_r1_k3_s2_e4_c16'], ['uir_r1_a3_k5_s2_e2_c32'], ['uir_r1_a3_k0_s2_e2_c32']]
    return {'block_args': decode_arch_def(stages), 'stem_size': 8, 'msfa_output_resolution': 2}


def _tiny(key: str, value):
    """``value`` of the field ``key`` shrunk as :py:data:`SIZES` says (an integer at most the tiny value)."""
    return min(value, SIZES[key]) if key in SIZES and type(value) is int else value


def _derive(config, before: dict) -> None:
    """Make the sizes that depend on each other consistent after shrinking: the fields of :py:data:`TIED` (equal
    before, equal after: multi-head and multi-head latent attention stay so), the key-value heads (at most the heads),
    a missing head size, state-space heads (spanning the expanded hidden size), the multimodal rotary sections
    (``mrope_section``: three summing to half the rotary part of a head)."""
    for key, reference in TIED:
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
    that depend on each other kept consistent, and the few per-architecture fields of :py:data:`OVERRIDES` set (see
    :py:func:`shrink`)."""
    with _quiet():
        try:
            config = config_class()
        except Exception:  # defaults that fail the class's own validation: its sub-configurations' overrides at once
            nested: dict = {}
            for key, value in OVERRIDES.get(getattr(config_class, 'model_type', None), {}).items():
                owner, _, name = key.partition('.')
                if name:
                    nested.setdefault(owner, {})[name] = value
            if not nested:
                raise
            config = config_class(**nested)
        shrink(config)
    return config


def tiny_copy(config):
    """A copy of a model's own configuration ``config`` (read from its ``config.json``) with every size shrunk as
    :py:func:`tiny_config` shrinks the defaults; ``config`` itself is left as it is."""
    with _quiet():
        config = copy.deepcopy(config)
        shrink(config)
    return config


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence the warnings and the messages on stderr of configuration classes for the time of the block."""
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter('ignore')
        yield


def model_class(mapping: str, architecture: str):
    """The model class of ``architecture`` in ``mapping`` and the configuration class to build it from (the part's
    own class where the model is one part of a composite configuration; with :py:data:`INIT`'s constructor
    arguments)."""
    names = getattr(modeling_auto, MAPPINGS[mapping])
    model, config_class = (
        getattr(transformers, names[architecture]),
        getattr(transformers, CONFIG_MAPPING_NAMES[architecture]),
    )
    own = getattr(model, 'config_class', None)
    if own in (getattr(config_class, 'sub_configs', None) or {}).values():
        config_class = own  # a model of one part (the text decoder): ``AutoModel.from_config`` gives it that part
    if (mapping, architecture) in INIT:
        config_class = functools.partial(config_class, **INIT[mapping, architecture])
    return model, config_class


def mappings_of(model_type: str) -> list[str]:
    """The mappings of :py:data:`MAPPINGS` that hold ``model_type``, in their order."""
    return [mapping for mapping, names in MAPPINGS.items() if model_type in getattr(modeling_auto, names)]


def model_class_for(config) -> tuple[str, type, object]:
    """``(mapping, model class, configuration)`` to build a model of a model's own configuration ``config``: the
    class that its ``architectures`` field names where a mapping of :py:data:`MAPPINGS` holds it, else the class of
    the first mapping that holds its ``model_type``; the configuration is ``config``, or its part (text decoder, ...)
    where the class is built from one, with :py:data:`INIT`'s arguments set.

    Raises
    ------
    ValueError
        If no mapping holds the configuration's ``model_type``.
    """
    model_type = getattr(config, 'model_type', None)
    mappings = mappings_of(model_type)
    if not mappings:
        raise ValueError(
            f'no model class for model_type {model_type!r} in the mappings zennit-attn checks ({", ".join(MAPPINGS)})'
        )
    named = set(getattr(config, 'architectures', None) or ())
    classes = {mapping: getattr(modeling_auto, MAPPINGS[mapping])[model_type] for mapping in mappings}
    mapping = next((mapping for mapping in mappings if classes[mapping] in named), mappings[0])
    model = getattr(transformers, classes[mapping])
    config = _own_part(config, getattr(model, 'config_class', None))
    for key, value in INIT.get((mapping, model_type), {}).items():
        setattr(config, key, value)
    return mapping, model, config


def _own_part(config, own):
    """``config``, or its sub-configuration of the class ``own`` where ``config`` is not one (a model of one part)."""
    if own is None or isinstance(config, own):
        return config
    for key, part in (getattr(config, 'sub_configs', None) or {}).items():
        if part is own and getattr(config, key, None) is not None:
            return getattr(config, key)
    return config
