"""Shared builders and fixtures: tiny, seeded, randomly initialised Hugging Face models of every supported family.

Use the plain functions (``from tests.conftest import tiny_model``; pytest imports this file as ``tests.conftest``) or the fixtures of the same name.

- :py:func:`tiny_model` ``(family, head, dtype, attn_implementation, zero_bias, seed)``: hidden 32, 2 layers,
  4 heads (2 key/value heads where the family has GQA), intermediate 64, vocabulary 100, in eval mode.
- :py:data:`FAMILY_HEADS`: every supported ``(family, head)`` pair.
- :py:func:`token_ids` ``(family, length, batch, seed)``: ids that avoid the family's special tokens.
"""
from __future__ import annotations

import contextlib
import copy

import pytest
import torch
import transformers

VOCAB = 100
HIDDEN = 32
LAYERS = 2
HEADS = 4
KV_HEADS = 2
INTERMEDIATE = 64
POSITIONS = 64

#: Decoder families (causal language models).
DECODERS = ('llama', 'mistral', 'qwen2', 'qwen3', 'gemma3', 'gpt2')
#: Encoder families.
ENCODERS = ('bert', 'roberta')
FAMILIES = DECODERS + ENCODERS

#: Heads per family: ``causal_lm`` (``...ForCausalLM`` / ``GPT2LMHeadModel``), ``seq_cls``
#: (``...ForSequenceClassification``), ``masked_lm`` (``...ForMaskedLM``), ``base`` (the bare model).
HEAD_NAMES = ('causal_lm', 'seq_cls', 'masked_lm', 'base')
FAMILY_HEADS = tuple((family, 'causal_lm') for family in DECODERS) + tuple(
    (family, head) for family in ENCODERS for head in ('seq_cls', 'masked_lm'))

_LLAMA_LIKE = dict(
    vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_hidden_layers=LAYERS,
    num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=POSITIONS,
    bos_token_id=1, eos_token_id=2, pad_token_id=None, tie_word_embeddings=False,
)
_BERT_LIKE = dict(
    vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
    intermediate_size=INTERMEDIATE, max_position_embeddings=POSITIONS, num_labels=3,
    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
)


def tiny_config(family: str, **overrides) -> transformers.PreTrainedConfig:
    """The configuration of a tiny model of ``family``; ``overrides`` replace or add configuration values."""
    if family == 'llama':
        config = transformers.LlamaConfig(**_LLAMA_LIKE)
    elif family == 'mistral':
        config = transformers.MistralConfig(**_LLAMA_LIKE, sliding_window=None)
    elif family == 'qwen2':
        config = transformers.Qwen2Config(**_LLAMA_LIKE)
    elif family == 'qwen3':
        config = transformers.Qwen3Config(**_LLAMA_LIKE, head_dim=HIDDEN // HEADS)
    elif family == 'gemma3':
        # one sliding-window layer with a window shorter than the test sequences, one global layer
        config = transformers.Gemma3TextConfig(
            **{**_LLAMA_LIKE, 'pad_token_id': 0}, head_dim=HIDDEN // HEADS, query_pre_attn_scalar=HIDDEN // HEADS,
            sliding_window=4, layer_types=['sliding_attention', 'full_attention'],
        )
    elif family == 'gpt2':
        config = transformers.GPT2Config(
            vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_inner=INTERMEDIATE,
            n_positions=POSITIONS, bos_token_id=1, eos_token_id=2, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0, num_labels=3,
        )
    elif family == 'bert':
        config = transformers.BertConfig(**_BERT_LIKE, pad_token_id=0)
    elif family == 'roberta':
        config = transformers.RobertaConfig(**_BERT_LIKE, pad_token_id=1, bos_token_id=0, eos_token_id=2)
    else:
        raise ValueError(f'unknown family {family!r}; known: {FAMILIES}')
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


_CLASSES = {
    ('llama', 'causal_lm'): 'LlamaForCausalLM', ('llama', 'seq_cls'): 'LlamaForSequenceClassification',
    ('llama', 'base'): 'LlamaModel',
    ('mistral', 'causal_lm'): 'MistralForCausalLM', ('mistral', 'base'): 'MistralModel',
    ('qwen2', 'causal_lm'): 'Qwen2ForCausalLM', ('qwen2', 'base'): 'Qwen2Model',
    ('qwen3', 'causal_lm'): 'Qwen3ForCausalLM', ('qwen3', 'base'): 'Qwen3Model',
    ('gemma3', 'causal_lm'): 'Gemma3ForCausalLM', ('gemma3', 'base'): 'Gemma3TextModel',
    ('gpt2', 'causal_lm'): 'GPT2LMHeadModel', ('gpt2', 'seq_cls'): 'GPT2ForSequenceClassification',
    ('gpt2', 'base'): 'GPT2Model',
    ('bert', 'seq_cls'): 'BertForSequenceClassification', ('bert', 'masked_lm'): 'BertForMaskedLM',
    ('bert', 'base'): 'BertModel',
    ('roberta', 'seq_cls'): 'RobertaForSequenceClassification', ('roberta', 'masked_lm'): 'RobertaForMaskedLM',
    ('roberta', 'base'): 'RobertaModel',
}


def zero_biases(model: torch.nn.Module) -> torch.nn.Module:
    """Set every parameter named ``...bias`` (Linear, Conv1D, LayerNorm, LM-head biases) to 0, in place."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.rsplit('.', 1)[-1] == 'bias':
                parameter.zero_()
    return model


def tiny_model(family: str, head: str = None, dtype: torch.dtype = torch.float64,
               attn_implementation: str = 'eager', zero_bias: bool = False, seed: int = 0,
               **config_overrides) -> torch.nn.Module:
    """A new tiny random model of ``family`` with ``head`` (default: causal_lm for decoders, seq_cls for encoders),
    cast to ``dtype``, in eval mode. The random weights depend only on ``family``, ``head``, ``seed`` and the
    configuration overrides (models with the same ones are copies of one float32 model, built once). Leaves the
    global torch generator seeded with ``seed``."""
    if head is None:
        head = 'causal_lm' if family in DECODERS else 'seq_cls'
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
    model.config._attn_implementation = attn_implementation
    model = model.to(dtype).eval()
    if zero_bias:
        zero_biases(model)
    torch.manual_seed(seed)  # the global generator's state afterwards does not depend on the cache
    return model


_BUILT: dict = {}


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


@contextlib.contextmanager
def _quiet():
    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers.logging.set_verbosity(level)


@pytest.fixture(name='tiny_model')
def tiny_model_fixture():
    """The :py:func:`tiny_model` builder."""
    return tiny_model


@pytest.fixture(name='token_ids')
def token_ids_fixture():
    """The :py:func:`token_ids` builder."""
    return token_ids
