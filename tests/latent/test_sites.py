"""Sites of ``zennit_attn.latent.sites``: :py:class:`Neuron` checks and the sizes of the site tensors, which the
index checks of neuron targets, conditions and steering use before any forward pass."""

from __future__ import annotations

import collections
import re

import pytest
import torch

from tests.latent.helpers import llama, watch
from tests.models import HEADS, HIDDEN, KV_HEADS, tiny_llava, tiny_model, token_ids
from zennit_attn import explain
from zennit_attn.latent import Neuron, find_sites, steer
from zennit_attn.latent.sites import SitePoint
from zennit_attn.structure import model_structure
from zennit_attn.workflows.architecture_check.configs import model_class, tiny_config


def test_neuron_checks():
    with pytest.raises(ValueError, match='unknown site'):
        Neuron('ffn', 0, 1)
    with pytest.raises(TypeError, match='integer'):
        Neuron('mlp', 0.5, 1)
    with pytest.raises(ValueError, match='index must be >= 0'):
        Neuron('mlp', 0, -1)
    assert str(Neuron('mlp', 1, 2)) == 'mlp[1, 2]'


@pytest.mark.parametrize('family', ['llama', 'gpt2'])
def test_widths_are_those_of_the_recorded_tensors(family):
    """Each site's width (told by the module, without a forward pass) is the last dimension of the tensor the site
    hooks; the tiny Llama has grouped-query attention (fewer key/value heads than query heads), so its key and value
    projections have fewer output than input features."""
    model = tiny_model(family)
    points = find_sites(model, ('mlp', 'attention', 'query', 'key', 'value'))
    store, handles = {}, []
    for site, layer_points in points.items():
        point = layer_points[0]
        handles.append(watch(point.module, store, site, output=point.kind == 'output'))
    with torch.no_grad():
        model(token_ids(family, 4, 1))
    for handle in handles:
        handle.remove()
    for site, layer_points in points.items():
        width = layer_points[0].width()
        if width is not None:  # None: fused projections (GPT-2's c_attn), measured at the forward pass
            assert width == store[site]['x'].shape[-1], site
    if family == 'llama':
        assert KV_HEADS < HEADS
        head_dim = HIDDEN // HEADS
        assert [points[site][0].width() for site in ('query', 'key', 'value')] == [
            HIDDEN,
            KV_HEADS * head_dim,
            KV_HEADS * head_dim,
        ]


def test_key_and_value_indices_are_checked_against_the_projection_outputs():
    """Grouped-query attention: 16 key/value features, 32 input features; index 16 to 31 is refused before the
    forward pass (it counted the input features), index 15 works."""
    model, ids = llama(), token_ids('llama', 5, 1)
    features = KV_HEADS * (HIDDEN // HEADS)
    for site in ('key', 'value'):
        with pytest.raises(
            ValueError, match=f'{site} of layer 0 has {features} units; index {features} is out of range'
        ):
            with steer(model, {Neuron(site, 0, features): 0.0}):
                pass  # no forward pass: the index is checked on entering
        with pytest.raises(ValueError, match=f'has {features} units; index {HIDDEN - 1} is out of range'):
            with steer(model, {Neuron(site, 0, HIDDEN - 1): 0.0}):
                pass
        exp = explain(model, ids, target=Neuron(site, 0, features - 1), method='input_x_gradient')
        assert exp.target.tolist() == [features - 1]
    assert not any(module._forward_hooks for module in model.modules())


def test_fused_sites_hold_their_features_only():
    """GPT-2's fused ``c_attn``: the key site is its middle third (the features the structure found), and an output
    of another width than the discovery pass saw is refused rather than masked wrongly."""
    model = tiny_model('gpt2')
    point = find_sites(model, 'key')['key'][0]
    assert point.module is model.transformer.h[0].attn.c_attn
    mask = point.feature_mask(3 * HIDDEN, 'cpu')
    assert mask.tolist() == [False] * HIDDEN + [True] * HIDDEN + [False] * HIDDEN
    assert point.width() is None  # fused: measured at the forward pass
    with pytest.raises(ValueError, match='Conv1D returned 64 features where the discovery pass of the model saw 96'):
        point.feature_mask(64, 'cpu')


def test_a_vision_language_model_has_the_sites_of_its_language_model():
    """LLaVA holds two stacks of blocks (its CLIP vision tower's, its Llama's); its text runs the language model's,
    whose blocks are the sites'."""
    model = tiny_llava()
    points = find_sites(model, ('residual', 'mlp'))
    blocks = list(model.model.language_model.layers)
    assert [point.module for point in points['residual'][1:]] == blocks
    assert [point.module for point in points['mlp']] == [block.mlp.down_proj for block in blocks]
    with pytest.raises(ValueError, match='is an encoder-decoder model'):
        find_sites(tiny_model('t5'), 'residual')


def test_blocks_that_keep_the_sequence_first_are_refused():
    """XLNet's blocks take their hidden states ``[seq, batch, features]``: read as ``[batch, seq, features]``, the
    recorded relevance of one row was that of the first position of every row (on the architecture check's tiny XLNet
    the residual stream's sums per layer were 0.0003, 0.0003 and 0.0 where the logit is 0.077, under CP-LRP, which
    conserves it at every layer of the other models); the discovery pass tells the layout, and the sites refuse it.
    The Llama's sites read as before."""
    model_type, config_type = model_class('causal-lm', 'xlnet')
    torch.manual_seed(0)
    model = model_type(tiny_config(config_type)).double().eval()
    assert model_structure(model).sequence_first
    assert not model_structure(llama()).sequence_first
    with pytest.raises(ValueError, match=r'XLNetLMHeadModel hold their hidden states \[seq, batch, features\]'):
        explain(model, torch.tensor([[5, 17, 3, 28, 9]]), method='cplrp', latent='residual')


def test_a_block_shared_by_layers_is_refused():
    """ALBERT runs one block for all its layers: before, the recording refused the block's second run as if the
    method ran a second forward pass; the discovery pass counts the runs (``ModelStructure.repeated``) and the sites
    say why."""
    model_type, config_type = model_class('masked-lm', 'albert')
    torch.manual_seed(0)
    model = model_type(tiny_config(config_type)).double().eval()
    assert model.config.num_hidden_layers > 1 and model.config.num_hidden_groups == 1
    with pytest.raises(ValueError, match=r'block 0 of AlbertForMaskedLM runs several times in one forward pass'):
        find_sites(model, 'residual')


def test_a_site_tensor_with_the_tokens_behind_a_singleton_is_read_per_token():
    """Multi-head latent attention (DeepSeek-V3, MiniCPM3) runs its key-value projection on ``[batch, 1, seq,
    rank]``: the value site read it as ``[batch, seq, features]``, so the recorded values were ``[batch, layers, 1, seq,
    units]``, ``latent_reduce='sum'`` summed the singleton instead of the positions, the padding was not zeroed and a
    value neuron target was refused as a map. Now the tokens are read where they are."""
    model_type, config_type = model_class('causal-lm', 'deepseek_v3')
    torch.manual_seed(0)
    config = tiny_config(config_type)
    config._experts_implementation = 'eager'  # grouped-mm kernels refuse float64
    model = model_type(config).double().eval()
    ids = torch.tensor([[5, 17, 3, 28, 9, 14], [30, 4, 11, 7, 25, 6]])
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    full = explain(model, ids, attention_mask=mask, method='cplrp', latent='value')
    layers, units = len(find_sites(model, 'value')['value']), config.num_attention_heads * config.v_head_dim
    assert full.latent['value'].shape == (2, layers, 6, units)
    assert float(full.latent['value'][1, :, :2].abs().max()) == 0  # the pads
    summed = explain(model, ids, attention_mask=mask, method='cplrp', latent='value', latent_reduce='sum')
    torch.testing.assert_close(summed.latent['value'], full.latent['value'].sum(2), rtol=1e-12, atol=1e-15)
    neuron = explain(model, ids[:1], method='cplrp', target=Neuron('value', 1, 2), position=3)
    torch.testing.assert_close(neuron.logit[0], full.latent.activation['value'][0, 1, 3, 2], rtol=1e-12, atol=0)
    torch.testing.assert_close(neuron.relevance.sum(), neuron.logit[0], rtol=1e-9, atol=0)  # CP-LRP conserves it


@pytest.mark.parametrize(
    'architecture,shape,site', [('deepseek_v4', [1, 5, 4, 32], 'query'), ('gemma3n_text', [4, 1, 5, 32], 'attention')]
)
def test_the_residual_site_of_blocks_with_several_residual_streams_is_refused(architecture, shape, site):
    """DeepSeek-V4's hyper-connections keep the residual stream ``[batch, seq, streams, hidden]``, Gemma-3n's AltUp
    ``[streams, batch, seq, hidden]``: read as ``[batch, seq, hidden]``, ``steer({Neuron('residual', 0, 3): 0.0})``
    zeroed all 32 hidden dimensions of stream 3 (DeepSeek-V4) or position 3 of every stream (Gemma-3n), positions
    crashed with a broadcast error, and the recorded residual relevance was ``[1, 3, 6, 4]`` / ``[4, 3, 1, 6]`` where
    ``[batch, layers + 1, seq]`` is documented. The discovery pass records the shape of the hidden states and the
    residual site is refused by name for latent relevance, neuron targets, conditions and steering; the other sites,
    ``[batch, seq, features]``, read as before."""
    model_type, config_type = model_class('causal-lm', architecture)
    torch.manual_seed(0)
    config = tiny_config(config_type)
    config._experts_implementation = 'eager'  # grouped-mm kernels refuse float64
    model = model_type(config).double().eval()
    ids = torch.tensor([[5, 17, 3, 28, 9, 14]])
    assert list(model_structure(model).hidden_shape) == shape
    assert list(model_structure(llama()).hidden_shape) == [1, 5, HIDDEN]
    message = rf'{model_type.__name__} hold their hidden states in 4 dimensions \({re.escape(str(shape))} for the'
    with pytest.raises(ValueError, match=message):
        explain(model, ids, method='cplrp', latent='residual')
    with pytest.raises(ValueError, match=message):
        explain(model, ids, method='cplrp', target=Neuron('residual', 1, 3))
    with pytest.raises(ValueError, match=message):
        explain(model, ids, method='cplrp', condition=Neuron('residual', 1, 3))
    with pytest.raises(ValueError, match=message):
        with steer(model, {Neuron('residual', 0, 3): 0.0}):
            pass
    assert not any(module._forward_hooks or module._forward_pre_hooks for module in model.modules())
    recorded = explain(model, ids, method='cplrp', latent=site).latent[site]
    assert recorded.shape[:3] == (1, config.num_hidden_layers, 6)
    with torch.no_grad():
        plain = model(ids).logits
        with steer(model, {Neuron(site, 0, 1): 3.0}, mode='add', positions=[-1]):
            steered = model(ids).logits
    torch.testing.assert_close(steered[:, :-1], plain[:, :-1], rtol=1e-12, atol=1e-12)  # causal: earlier positions
    assert float((steered[:, -1] - plain[:, -1]).abs().max()) > 1e-3


def test_blocks_that_pass_on_the_residual_stream_in_two_tensors_are_refused_at_the_residual_site():
    """Reformer's reversible layers take the two halves of the residual stream (``prev_attn_output``,
    ``hidden_states``) and return both: the residual site read the first half at the input of block 0 and the second
    at the output of each block, and steering a block output crashed with ``TypeError: ReformerOutput.__new__()
    missing ...`` (a named tuple). The discovery pass checks that each block takes what the block before gave out
    (:py:attr:`~zennit_attn.structure.ModelStructure.unchained`), and the residual site says why it is refused."""
    model_type, config_type = model_class('causal-lm', 'reformer')
    torch.manual_seed(0)
    model = model_type(tiny_config(config_type)).double().eval()
    blocks = model.reformer.encoder.layers
    assert id(blocks[1]) in model_structure(model).unchained
    assert not model_structure(llama()).unchained
    with pytest.raises(
        ValueError,
        match=r'hidden states block 1 of ReformerModelWithLMHead \(ReformerLayer\) takes are not those block 0 gives',
    ):
        with steer(model, {Neuron('residual', 0, 3): 5.0}):
            pass
    assert not any(module._forward_hooks or module._forward_pre_hooks for module in model.modules())


def test_an_output_site_of_a_named_tuple_is_replaced_in_it():
    """A module returning a named tuple (as Reformer's layers do) gets its site element replaced: ``type(output)(
    generator)`` raised ``TypeError: ... __new__() missing ...``."""
    Pair = collections.namedtuple('Pair', ['hidden_states', 'extra'])

    class Twice(torch.nn.Module):
        def forward(self, x):
            return Pair(2 * x, x)

    module = Twice()
    point = SitePoint('residual', 1, module, 'output', index=0)
    handle = point.hook(lambda tensor: tensor + 1)
    x = torch.arange(6.0).view(1, 2, 3)
    output = module(x)
    handle.remove()
    assert type(output) is Pair
    assert torch.equal(output.hidden_states, 2 * x + 1) and torch.equal(output.extra, x)
