"""Tiny random models of architectures the former family table did not list, built as the architecture check builds
them (:py:func:`~zennit_attn.workflows.architecture_check.configs.tiny_config`: the configuration class's defaults with
every size shrunk), for the tests of
the model structure (:py:mod:`zennit_attn.structure`) and of the latent workflow beyond the table.

- :py:data:`ARCHITECTURES`: the sample (``model_type`` names of transformers' causal language models);
- :py:func:`tiny_architecture` ``(architecture, layers, seed)``: the model in float64, eval mode, every bias and every
  learned position embedding (a parameter) zero, so that LRP conserves exactly (sinusoidal and rotary tables, which
  are buffers, stay: zero ones would zero the keys of GPT-J), vocabulary :py:data:`tests.models.VOCAB` (the ids of
  :py:func:`tests.models.token_ids` and of the test tokenizers).
"""

from __future__ import annotations

import contextlib
import io
import warnings

import torch

from tests.models import VOCAB
from zennit_attn.workflows.architecture_check.configs import model_class, tiny_config

#: Dense decoder architectures outside the former family table: rotary and learned positions, ALiBi (BLOOM, MPT),
#: parallel attention and MLP (Falcon, GPT-J, CodeGen), fused projections (Falcon's and BLOOM's per-head
#: ``query_key_value``, MPT's ``Wqkv``, CodeGen's ``qkv_proj``), gated and plain MLPs, LayerNorm and RMSNorm, an FFN
#: on the tokens of all rows in one dimension (OPT).
ARCHITECTURES = (
    'bloom',
    'codegen',
    'cohere',
    'falcon',
    'gemma',
    'gptj',
    'mpt',
    'olmo',
    'opt',
    'stablelm',
    'starcoder2',
)


def tiny_architecture(architecture: str, layers: int = 2, seed: int = 0) -> torch.nn.Module:
    """A tiny random causal language model of ``architecture`` (a ``model_type`` of :py:data:`ARCHITECTURES` or any
    other causal LM of transformers) with ``layers`` blocks (see the module's description)."""
    model_type, config_class = model_class('causal-lm', architecture)
    with contextlib.redirect_stderr(io.StringIO()):  # transformers' notes on the defaults before shrinking
        config = tiny_config(config_class)
    for name in ('num_hidden_layers', 'n_layer', 'n_layers', 'num_layers'):
        if hasattr(config, name):
            setattr(config, name, layers)
    config.vocab_size = VOCAB
    for name in ('pad_token_id', 'bos_token_id', 'eos_token_id'):
        if isinstance(getattr(config, name, None), int) and getattr(config, name) >= VOCAB:
            setattr(config, name, 1)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)  # the weights must not depend on what a test left as default
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter('ignore')
            torch.manual_seed(seed)
            model = model_type(config).to(torch.float64).eval()
    finally:
        torch.set_default_dtype(default)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.rsplit('.', 1)[-1] == 'bias' or 'position' in name:
                parameter.zero_()
    return model


def _llama_like(stack: str = 'model.layers', mlp: str = 'mlp.down_proj') -> dict:
    return {
        'mlp': f'{stack}.{{}}.{mlp}',
        'attention': f'{stack}.{{}}.self_attn.o_proj',
        'query': f'{stack}.{{}}.self_attn.q_proj',
        'key': f'{stack}.{{}}.self_attn.k_proj',
        'value': f'{stack}.{{}}.self_attn.v_proj',
        'roles': None,
    }


def _fused(stack: str, mlp: str, attention: str, projection: str, roles: str) -> dict:
    path = f'{stack}.{{}}.{projection}'
    return {
        'mlp': f'{stack}.{{}}.{mlp}',
        'attention': f'{stack}.{{}}.{attention}',
        'query': path,
        'key': path,
        'value': path,
        'roles': roles,
    }


#: The parts of each architecture of :py:data:`ARCHITECTURES`, read from its transformers code (``{}``: the block's
#: index): the FFN down projection, the attention output projection (every model here has 4 heads), the projections
#: of the queries, keys and values (AtMan's key site is the key projection: none normalises its keys), and for fused
#: projections the role of each output feature: BLOOM views ``query_key_value`` as ``[heads, 3, head_dim]``, CodeGen
#: splits ``qkv_proj`` into 4 model-parallel parts of query, value and key, Falcon (multi-query) holds the queries of
#: 4 heads and one key and one value head, MPT chunks ``Wqkv`` in three.
PARTS = {
    'bloom': _fused(
        'transformer.h',
        'mlp.dense_4h_to_h',
        'self_attention.dense',
        'self_attention.query_key_value',
        ('q' * 8 + 'k' * 8 + 'v' * 8) * 4,
    ),
    'codegen': _fused(
        'transformer.h', 'mlp.fc_out', 'attn.out_proj', 'attn.qkv_proj', ('q' * 8 + 'v' * 8 + 'k' * 8) * 4
    ),
    'cohere': _llama_like(),
    'falcon': _fused(
        'transformer.h',
        'mlp.dense_4h_to_h',
        'self_attention.dense',
        'self_attention.query_key_value',
        'q' * 32 + 'k' * 8 + 'v' * 8,
    ),
    'gemma': _llama_like(),
    'gptj': {
        'mlp': 'transformer.h.{}.mlp.fc_out',
        'attention': 'transformer.h.{}.attn.out_proj',
        'query': 'transformer.h.{}.attn.q_proj',
        'key': 'transformer.h.{}.attn.k_proj',
        'value': 'transformer.h.{}.attn.v_proj',
        'roles': None,
    },
    'mpt': _fused('transformer.blocks', 'ffn.down_proj', 'attn.out_proj', 'attn.Wqkv', 'q' * 32 + 'k' * 32 + 'v' * 32),
    'olmo': _llama_like(),
    'opt': {**_llama_like('model.decoder.layers', 'fc2'), 'attention': 'model.decoder.layers.{}.self_attn.out_proj'},
    'stablelm': _llama_like(),
    'starcoder2': _llama_like(mlp='mlp.c_proj'),
    'llava': _llama_like('model.language_model.layers'),
}
#: Heads of every model of :py:data:`PARTS`.
HEADS = 4
