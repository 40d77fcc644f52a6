"""The decompositions the engine runs instead of composite torch functions equal those functions."""

from __future__ import annotations

import pytest
import torch
from transformers import SiglipVisionConfig, SiglipVisionModel

from zennit_attn.composites import AttnLRPEpsilon, CPLRPEpsilon
from zennit_attn.operations.decompositions import multi_head_attention
from zennit_attn.workflows.architecture_check.check import zero_biases


def _module(separate: bool, bias: bool) -> torch.nn.MultiheadAttention:
    torch.manual_seed(0)
    kdim = 6 if separate else None
    return torch.nn.MultiheadAttention(8, 2, bias=bias, kdim=kdim, vdim=kdim).double().eval()


def _call(function, module, query, key, value, **options):
    separate = not module._qkv_same_embed_dim
    return function(
        query,
        key,
        value,
        module.embed_dim,
        module.num_heads,
        module.in_proj_weight,
        module.in_proj_bias,
        None,
        None,
        False,
        0.0,
        module.out_proj.weight,
        module.out_proj.bias,
        training=False,
        use_separate_proj_weight=separate,
        q_proj_weight=module.q_proj_weight,
        k_proj_weight=module.k_proj_weight,
        v_proj_weight=module.v_proj_weight,
        **options,
    )


@pytest.mark.parametrize('separate', [False, True])
@pytest.mark.parametrize('bias', [False, True])
@pytest.mark.parametrize('masks', ['none', 'padding', 'float', 'bool3d', 'causal'])
@pytest.mark.parametrize('batched', [True, False])
def test_multi_head_attention_equals_torch(separate, bias, masks, batched):
    module = _module(separate, bias)
    generator = torch.Generator().manual_seed(1)
    batch = 3 if batched else 1
    source_width = 6 if separate else 8
    query = torch.randn(4, batch, 8, generator=generator, dtype=torch.float64)
    key = torch.randn(5, batch, source_width, generator=generator, dtype=torch.float64)
    value = torch.randn(5, batch, source_width, generator=generator, dtype=torch.float64)
    options = {}
    if masks == 'padding':
        padding = torch.zeros(batch, 5, dtype=torch.bool)
        padding[0, -2:] = True
        options['key_padding_mask'] = padding if batched else padding[0]
    elif masks == 'float':
        options['attn_mask'] = torch.randn(4, 5, generator=generator, dtype=torch.float64)
    elif masks == 'bool3d':
        mask = torch.rand(batch * 2, 4, 5, generator=generator) > 0.7
        mask[..., 0] = False
        options['attn_mask'] = mask
    elif masks == 'causal':
        options['attn_mask'] = torch.ones(4, 5, dtype=torch.bool).triu(1)
        options['is_causal'] = True
    if not batched:
        query, key, value = query[:, 0], key[:, 0], value[:, 0]
    for need_weights, average in ((True, True), (True, False), (False, True)):
        expected = _call(
            torch.nn.functional.multi_head_attention_forward,
            module,
            query,
            key,
            value,
            need_weights=need_weights,
            average_attn_weights=average,
            **options,
        )
        found = _call(
            multi_head_attention,
            module,
            query,
            key,
            value,
            need_weights=need_weights,
            average_attn_weights=average,
            **options,
        )
        torch.testing.assert_close(found[0], expected[0], rtol=0, atol=1e-12)
        if need_weights:
            torch.testing.assert_close(found[1], expected[1], rtol=0, atol=1e-12)
        else:
            assert found[1] is None


def test_unsupported_options_are_named():
    module = _module(False, True)
    x = torch.randn(4, 1, 8, dtype=torch.float64)
    with pytest.raises(NotImplementedError, match='add_zero_attn'):
        torch_args = (
            x,
            x,
            x,
            8,
            2,
            module.in_proj_weight,
            module.in_proj_bias,
            None,
            None,
            True,
            0.0,
            module.out_proj.weight,
            module.out_proj.bias,
        )
        multi_head_attention(*torch_args, training=False)


def test_siglip_attention_pooling_head_is_explained():
    """SigLIP's pooling head runs ``torch.nn.MultiheadAttention``: with the decomposition the engine
    explains it, and CP-LRP on a bias-free float64 model conserves exactly (the relevance 1 at the pooled feature
    arrives at the pixels); AttnLRP's softmax rule absorbs a part."""
    config = SiglipVisionConfig(
        hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8
    )
    torch.manual_seed(0)
    model = SiglipVisionModel(config).double().eval()
    zero_biases(model)
    pixels = torch.randn(1, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    totals = []
    for composite in (CPLRPEpsilon(), AttnLRPEpsilon()):
        leaf = pixels.clone().requires_grad_(True)
        with composite.context(model) as modified:
            modified(pixel_values=leaf).pooler_output[0, 3].backward()
        totals.append(float(leaf.grad.sum()))
    assert abs(totals[0] - 1) < 1e-10
    assert abs(totals[1] - 1) > 1e-3
