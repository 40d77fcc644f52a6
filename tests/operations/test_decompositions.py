"""The decompositions the engine runs instead of composite torch functions equal those functions."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import SiglipVisionConfig, SiglipVisionModel

from tests.by_hand import attributed
from zennit_attn.composites import AttnLRPEpsilon, CPLRPEpsilon
from zennit_attn.operations.decompositions import group_norm, multi_head_attention
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


@pytest.mark.parametrize('shape', [(2, 8), (2, 8, 5), (2, 8, 3, 3)])
def test_group_norm_equals_torch(shape):
    """The decomposition of ``group_norm`` equals torch's (with and without the affine map), for inputs of one to three
    positions dimensions."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(shape, dtype=torch.float64, generator=generator)
    weight, bias = (torch.randn(8, dtype=torch.float64, generator=generator) for _ in range(2))
    for groups in (1, 2, 8):
        torch.testing.assert_close(group_norm(x, groups, weight, bias), F.group_norm(x, groups, weight, bias))
        torch.testing.assert_close(group_norm(x, groups), F.group_norm(x, groups))


class _Normalised(torch.nn.Module):
    """A bias-free linear map, a normalisation of its 8 features, a bias-free head."""

    def __init__(self, norm: torch.nn.Module):
        super().__init__()
        self.a, self.norm, self.head = torch.nn.Linear(8, 8, bias=False), norm, torch.nn.Linear(8, 3, bias=False)

    def forward(self, x):
        return self.head(self.norm(self.a(x)))


@pytest.mark.parametrize('composite', [AttnLRPEpsilon, CPLRPEpsilon], ids=lambda composite: composite.__name__)
def test_a_group_norm_of_one_group_is_explained_as_a_layer_norm(composite):
    """``GroupNorm(1, C)`` of ``[batch, C]`` is ``LayerNorm(C)``: the same relevance (1e-12) with the same weight and
    bias, the divisor held constant (Prop. 3.4); with no bias it conserves the relevance. Before, ``group_norm`` was
    refused as an operation without a rule."""
    torch.manual_seed(0)
    group = _Normalised(torch.nn.GroupNorm(1, 8)).double()
    layer = _Normalised(torch.nn.LayerNorm(8)).double()
    with torch.no_grad():
        group.norm.weight.uniform_(0.5, 1.5)
        layer.load_state_dict(group.state_dict())
    x = torch.randn(4, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    found, expected = (attributed(model, composite(), x) for model in (group, layer))
    torch.testing.assert_close(found, expected, rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        group.norm.bias.zero_()
    relevance = attributed(group, composite(), x)  # the relevance 1 of each of the 4 x 3 outputs
    torch.testing.assert_close(relevance.sum(), torch.tensor(12.0, dtype=torch.float64), rtol=1e-10, atol=1e-10)
