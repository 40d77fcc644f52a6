"""The structure of a model found from what it computes (``zennit_attn.structure``): equal to what the former
family table said on its families (:py:mod:`tests.family_table`), equal to what the code of architectures the
table never listed says (:py:data:`tests.architectures.PARTS`), refused with a reason where a part cannot be
found, and the discovery pass leaves the model exactly as it was.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from transformers import AttentionInterface

from tests.architectures import ARCHITECTURES, HEADS, PARTS, tiny_architecture
from tests.family_table import FUSED, TABLE, expand, role_mask
from tests.family_table import HEADS as FAMILY_HEADS
from tests.models import LAYERS, tiny_hf_vit, tiny_llava, tiny_model, tiny_timm_vit, tiny_torchvision_vit
from zennit_attn.composites import AttnLRPEpsilon
from zennit_attn.composites.gamma import attention_projections
from zennit_attn.core.blocks import block_stacks
from zennit_attn.latent import Neuron, steer
from zennit_attn.methods.attention import key_sites, suppress_keys
from zennit_attn.structure import StructureError, example_inputs, model_structure

ROLES = ('query', 'key', 'value')


def build(family):
    if family == 'timm-vit':
        return tiny_timm_vit()
    if family == 'vit':
        return tiny_hf_vit()
    return tiny_model(family, FAMILY_HEADS.get(family))


def named(model, features):
    """``(path, mask or None)`` of a :py:class:`~zennit_attn.structure.Features`."""
    names = {id(module): name for name, module in model.named_modules()}
    mask = None if features.mask is None else features.mask.tolist()
    return names[id(features.module)], mask


def expected(entry, role):
    """``[(path, mask or None)]`` of a role of a table entry, every block."""
    return [
        (path, None if pattern not in FUSED else role_mask(FUSED[pattern], role).tolist())
        for pattern in entry
        for path in expand([pattern])
    ]


# ------------------------------------------------------------------------------------------- the family table
@pytest.mark.parametrize('family', sorted(TABLE))
def test_equals_the_family_table(family):
    """Every part the table named, found from what the model computes: the FFN down projections of every block
    (none found in the mixtures of experts: their blocks route tokens), the attention output projections with their
    heads, the query, key and value projections with the features of fused ones, in the order the forward pass runs
    them."""
    model = build(family)
    names = {id(module): name for name, module in model.named_modules()}
    entry = TABLE[family]
    structure = model_structure(model)
    blocks = [block for _, stack in structure.stacks for block in stack]
    assert len(blocks) == len(block_stacks(model)) * LAYERS
    if entry['mlp']:
        found = [names[id(structure.down_projection(block, layer))] for layer, block in enumerate(blocks)]
        assert sorted(found) == sorted(expand(entry['mlp']))
    else:
        for layer, block in enumerate(blocks):
            with pytest.raises(StructureError, match='routed mixture of experts'):
                structure.down_projection(block, layer)
    assert sorted(names[id(op.output)] for op in structure.attention) == sorted(expand(entry['attention']))
    assert {op.heads for op in structure.attention} == {entry['heads']}
    for role in ROLES:
        found = [named(model, source) for op in structure.attention for source in getattr(op, role)]
        assert sorted(found, key=str) == sorted(expected(entry[role], role), key=str), role
    assert not any(op.problems for op in structure.attention)


@pytest.mark.parametrize('family', sorted(TABLE))
def test_key_sites_and_attention_projections_equal_the_family_table(family):
    """AtMan's key sites (``k_norm`` where the model normalises its keys) and the gamma composite's attention
    projections are the table's."""
    model = build(family)
    names = {id(module): name for name, module in model.named_modules()}
    entry = TABLE[family]
    sites = []
    for module, mask in key_sites(model):
        width = module.weight.shape[-1] if type(module).__name__ == 'Conv1D' else module.weight.shape[0]
        width = getattr(module, 'out_features', width)
        keys = mask(width)
        sites.append((names[id(module)], None if bool(keys.all()) else keys.tolist()))
    assert sorted(sites, key=str) == sorted(expected(entry['key_sites'], 'key'), key=str)
    inputs, outputs = attention_projections(model)
    projections = {path for role in ROLES for path in expand(entry[role])}
    assert sorted(names[key] for key in inputs) == sorted(projections)
    assert sorted(names[key] for key in outputs) == sorted(expand(entry['attention']))


# ------------------------------------------------------------------------------------------- beyond the table
def other(architecture):
    return tiny_llava(zero_bias=True) if architecture == 'llava' else tiny_architecture(architecture)


@pytest.mark.parametrize('architecture', ARCHITECTURES + ('llava',))
def test_architectures_outside_the_table(architecture):
    """The parts their code names (fused projections split as their code splits them); a vision-language model's are
    those of its language model, the stack its text runs."""
    model = other(architecture)
    names = {id(module): name for name, module in model.named_modules()}
    parts = PARTS[architecture]
    structure = model_structure(model)
    [(path, blocks)] = structure.stacks
    assert path == parts['mlp'].split('.{}.')[0] and len(blocks) == LAYERS
    for layer, block in enumerate(blocks):
        assert names[id(structure.down_projection(block, layer))] == parts['mlp'].format(layer)
        [op] = structure.attention_in(block)
        assert (names[id(op.output)], op.heads) == (parts['attention'].format(layer), HEADS)
        for role in ROLES:
            mask = None if parts['roles'] is None else role_mask(parts['roles'], role).tolist()
            assert [named(model, source) for source in getattr(op, role)] == [(parts[role].format(layer), mask)]
        key_mask = None if parts['roles'] is None else role_mask(parts['roles'], 'key').tolist()
        assert [named(model, source) for source in op.key_scaling] == [(parts['key'].format(layer), key_mask)]


SDPA = ('cohere', 'gemma', 'gptj', 'olmo', 'opt', 'stablelm', 'starcoder2', 'falcon', 'codegen')


class KeysOfSdpa(torch.overrides.TorchFunctionMode):
    """Keep the keys that enter ``scaled_dot_product_attention`` (independent of the package)."""

    def __init__(self):
        super().__init__()
        self.keys = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            self.keys.append((args[1] if len(args) > 1 else kwargs['key']).detach())
        return func(*args, **kwargs)


@pytest.mark.parametrize('architecture', SDPA)
def test_key_sites_scale_the_keys_exactly(architecture):
    """One block with SDPA: with token 2's keys suppressed by 0.3 at the key sites, the keys that enter the attention
    are the plain ones with token 2's multiplied by 0.3, the others unchanged (up to the rounding of rotary embeddings
    that Cohere computes in float32)."""
    model = tiny_architecture(architecture, layers=1)
    model.config._attn_implementation = 'sdpa'
    ids = torch.tensor([[5, 17, 42, 8, 23, 61]])
    factors = torch.ones(1, 6, dtype=torch.float64)
    factors[0, 2] = 0.3
    with torch.no_grad():
        with KeysOfSdpa() as plain:
            model(ids)
        with suppress_keys(model, lambda: factors), KeysOfSdpa() as suppressed:
            model(ids)
    [keys], [scaled] = plain.keys, suppressed.keys  # [batch, heads, tokens, head dim]
    torch.testing.assert_close(scaled, keys * factors[:, None, :, None], rtol=1e-6, atol=1e-12)
    assert not torch.allclose(scaled[:, :, 2], keys[:, :, 2])


# ------------------------------------------------------------------------------------------- refusals
def test_routed_experts_have_no_ffn_down_projection():
    model = tiny_model('qwen2_moe')  # a shared expert beside the routed ones: still a routed mixture
    structure = model_structure(model)
    for layer, block in enumerate(model.model.layers):
        with pytest.raises(StructureError, match=f'block {layer} of Qwen2MoeForCausalLM picks experts by a top-k'):
            structure.down_projection(block, layer)


def test_a_state_space_model_has_no_attention_and_no_ffn():
    """Mamba: no attention operation (AtMan refused), and its mixer's output projection takes a gated scan over the
    positions, not a per-token FFN activation."""
    model = tiny_architecture('mamba')
    structure = model_structure(model)
    with pytest.raises(StructureError, match='MambaForCausalLM computed no attention operation'):
        key_sites(model)
    [(_, blocks)] = structure.stacks
    with pytest.raises(StructureError, match='block 1 of MambaForCausalLM has 0 FFN down projections'):
        structure.down_projection(blocks[1], 1)


class Attention(torch.nn.Module):
    """Attention of 2 heads whose keys are normalised inline (``normalize``) or not."""

    def __init__(self, normalized_keys: bool):
        super().__init__()
        self.q, self.k, self.v, self.o = (torch.nn.Linear(8, 8, bias=False) for _ in range(4))
        self.normalized_keys = normalized_keys

    def forward(self, x):
        heads = lambda t: t.unflatten(-1, (2, 4)).transpose(1, 2)  # noqa: E731
        keys = self.k(x)
        if self.normalized_keys:
            keys = torch.nn.functional.normalize(keys, dim=-1)
        out = torch.nn.functional.scaled_dot_product_attention(heads(self.q(x)), heads(keys), heads(self.v(x)))
        return self.o(out.transpose(1, 2).flatten(2))


class Block(torch.nn.Module):
    def __init__(self, normalized_keys: bool, scaled_ffn: bool):
        super().__init__()
        self.attention = Attention(normalized_keys)
        self.up, self.down = torch.nn.Linear(8, 16, bias=False), torch.nn.Linear(16, 8, bias=False)
        self.act = torch.nn.GELU()
        self.scaled_ffn = scaled_ffn

    def forward(self, x):
        x = x + self.attention(x)
        hidden = self.act(self.up(x))
        return x + self.down(hidden * 0.5 if self.scaled_ffn else hidden)


class Model(torch.nn.Module):
    """Two blocks of :py:class:`Block` (found as blocks: a ModuleList of one class that holds attention)."""

    def __init__(self, normalized_keys: bool = False, scaled_ffn: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = torch.nn.ModuleList([Block(normalized_keys, scaled_ffn) for _ in range(2)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def test_a_model_of_ones_own_with_example_inputs():
    model = Model()
    with pytest.raises(StructureError, match=r'cannot build an example input for Model \(.*\): pass inputs='):
        model_structure(model)
    structure = model_structure(model, inputs=torch.randn(1, 5, 8))
    for layer, block in enumerate(model.blocks):
        assert structure.down_projection(block, layer) is block.down
        [op] = structure.attention_in(block)
        assert (op.output, op.heads) == (block.attention.o, 2)
        assert [source.module for source in op.key_scaling] == [block.attention.k]
    assert model_structure(model) is structure  # cached: later calls need no inputs


def test_keys_normalised_inline_are_refused_for_atman():
    """Scaling ``k`` before ``normalize(k)`` would be undone: no module's output scales these keys exactly."""
    model = Model(normalized_keys=True)
    model_structure(model, inputs=torch.randn(1, 5, 8))
    with pytest.raises(StructureError, match='the keys are not a linear function of the outputs of Linear'):
        key_sites(model)


def test_a_scaled_activation_is_not_taken_for_the_ffn_neurons():
    """``down(0.5 * act(up(x)))``: the input of ``down`` is not the activation rearranged; no site rather than a
    wrong one."""
    model = Model(scaled_ffn=True)
    structure = model_structure(model, inputs=torch.randn(1, 5, 8))
    with pytest.raises(StructureError, match='block 0 of Model has 0 FFN down projections'):
        structure.down_projection(model.blocks[0], 0)


def test_a_failing_forward_pass_is_reported():
    model = Model()
    with pytest.raises(StructureError, match='the discovery pass of Model .* failed: RuntimeError: .*shapes'):
        model_structure(model, inputs=torch.randn(1, 5, 3))


# ------------------------------------------------------------------------------------------- the pass itself
def test_example_inputs():
    llama = tiny_model('llama')
    assert example_inputs(llama)['input_ids'].tolist() == [[3, 4, 5, 6, 7]]
    t5 = example_inputs(tiny_model('t5'))
    assert (t5['input_ids'].shape, t5['decoder_input_ids'].shape) == ((1, 5), (1, 3))
    assert example_inputs(tiny_timm_vit())['x'].shape == (1, 3, 8, 8)
    assert example_inputs(tiny_hf_vit())['pixel_values'].shape == (1, 3, 8, 8)
    assert example_inputs(tiny_torchvision_vit())['x'].shape == (1, 3, 8, 8)  # its image_size (it failed)
    llava = example_inputs(tiny_llava())['input_ids']  # the image token (100) is left out
    assert 100 not in llava.tolist()[0]


def snapshot(model):
    return (
        {name: value.clone() for name, value in model.state_dict().items()},
        [
            (name, len(module._forward_hooks), len(module._forward_pre_hooks), module.training)
            for name, module in model.named_modules()
        ],
        [(name, parameter.requires_grad, parameter.grad) for name, parameter in model.named_parameters()],
    )


def test_the_pass_leaves_the_model_as_it_was():
    """A model in training mode, with an attention implementation of its own and frozen embeddings: after the pass
    the same parameters, hooks, modes, gradients (none) and implementation; the pass ran eager attention in
    evaluation mode, inside ``no_grad``."""
    model = tiny_model('llama').train()
    model.model.embed_tokens.weight.requires_grad_(False)
    calls = []

    def attention(module, query, key, value, attention_mask, **kwargs):
        calls.append(module)
        raise AssertionError('the discovery pass must not run an attention implementation of the model')

    AttentionInterface.register('structure_test', attention)
    model.config._attn_implementation = 'structure_test'
    before = snapshot(model)
    with torch.no_grad():
        structure = model_structure(model)
    after = snapshot(model)
    assert after[1:] == before[1:]
    assert all(torch.equal(after[0][name], value) for name, value in before[0].items())
    assert model.config._attn_implementation == 'structure_test' and not calls
    assert len(structure.attention) == LAYERS


@pytest.mark.filterwarnings('ignore:`torch.nn.utils.weight_norm` is deprecated:FutureWarning')
def test_no_hook_but_torchs_own_sees_the_pass():
    """A user's forward hook does not see the discovery pass (its first call is the user's own forward), and
    torch's weight norm, a pre-hook that computes the weight, stays: the pass runs with the weight it computes (the
    FFN down projection is found through it) and restores both hooks."""
    model = tiny_model('llama')
    down = model.model.layers[0].mlp.down_proj
    torch.nn.utils.weight_norm(down)  # a pre-hook of torch that sets down.weight from weight_g and weight_v
    seen = []
    handle = down.register_forward_hook(lambda module, args, output: seen.append(args[0].shape))
    try:
        structure = model_structure(model)
        assert seen == []
        assert structure.down_projection(model.model.layers[0], 0) is down
        model(torch.tensor([[3, 4]]))
        assert seen == [torch.Size([1, 2, model.config.intermediate_size])]
        assert len(down._forward_pre_hooks) == 1 and len(down._forward_hooks) == 1
    finally:
        handle.remove()


def parts(model, structure):
    """Paths of the FFN down projections, attention output projections and key sites of ``structure``."""
    names = {id(module): name for name, module in model.named_modules()}
    [(_, blocks)] = structure.stacks
    down = [names[id(structure.down_projection(block, layer))] for layer, block in enumerate(blocks)]
    keys = [names[id(site.module)] for site in structure.key_sites()]
    return down, [names[id(op.output)] for op in structure.attention], keys


def test_first_asked_inside_a_context():
    """Asked first inside a composite's context (the engine's hooks and mode on the model) and while
    steering, the structure is the model's own: the parts found outside on an equal model; the context's hooks are
    as they were."""
    plain = tiny_architecture('bloom')
    expected = parts(plain, model_structure(plain))
    model = tiny_architecture('bloom')
    with AttnLRPEpsilon().context(model), steer(model, {Neuron('residual', 1, 0): 0.0}):
        hooks = [(len(module._forward_hooks), len(module._forward_pre_hooks)) for module in model.modules()]
        found = parts(model, model_structure(model))
        assert [(len(module._forward_hooks), len(module._forward_pre_hooks)) for module in model.modules()] == hooks
    assert found == expected


def test_the_cache_follows_the_modules_and_lets_the_model_go():
    model = tiny_model('llama')
    structure = model_structure(model)
    assert model_structure(model) is structure
    replacement = torch.nn.Linear(64, 32, bias=False, dtype=torch.float64)
    model.model.layers[1].mlp.down_proj = replacement
    renewed = model_structure(model)
    assert renewed is not structure
    assert renewed.down_projection(model.model.layers[1], 1) is replacement
    reference = weakref.ref(model)
    del model, structure, renewed
    gc.collect()
    assert reference() is None
