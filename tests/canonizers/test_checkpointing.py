"""explain(..., checkpointing=True): the same relevance as without on every family, blocks recomputed, fewer saved
bytes, the model restored exactly (also after an exception), and refusals."""

import gc
import weakref

import pytest
import torch

from tests.models import (
    ENCODER_DECODERS,
    FAMILY_HEADS,
    decoder_ids,
    pixels,
    tiny_hf_vit,
    tiny_model,
    tiny_timm_vit,
    token_ids,
)
from zennit_attn import explain
from zennit_attn.canonizers.checkpointing import checkpointed
from zennit_attn.composites import AttnLRPEpsilon, CPLRPEpsilon
from zennit_attn.core import NoBlocksError, transformer_blocks
from zennit_attn.methods.registry import METHODS

#: The methods with a backward pass: checkpointing=True applies to them.
BACKWARD = [name for name, entry in METHODS.items() if entry.backward]


def relative_error(actual, expected):
    return float((actual - expected).abs().max()) / max(float(expected.abs().max()), 1e-300)


def text_inputs(family):
    extra = {'decoder_input_ids': decoder_ids(family, 3, 2)} if family in ENCODER_DECODERS else {}
    return token_ids(family, 12, 2), extra


@pytest.mark.parametrize('family, head', FAMILY_HEADS)
@pytest.mark.parametrize('method', ['attnlrp', 'cplrp'])
def test_same_relevance_on_every_family(family, head, method):
    model = tiny_model(family, head)
    ids, extra = text_inputs(family)
    plain = explain(model, ids, method=method, **extra)
    recomputed = explain(model, ids, method=method, checkpointing=True, **extra)
    assert relative_error(recomputed.relevance, plain.relevance) <= 1e-12
    assert relative_error(recomputed.logit, plain.logit) <= 1e-12
    if plain.decoder_relevance is not None:
        assert relative_error(recomputed.decoder_relevance, plain.decoder_relevance) <= 1e-12


@pytest.mark.parametrize('build', [tiny_timm_vit, tiny_hf_vit], ids=['timm', 'hf'])
def test_same_relevance_on_vision_transformers(build):
    model = build()
    images = pixels(2)
    for method in ('attnlrp', 'cplrp', 'input_x_gradient'):
        plain = explain(model, images, method=method)
        recomputed = explain(model, images, method=method, checkpointing=True)
        assert relative_error(recomputed.pixel_relevance, plain.pixel_relevance) <= 1e-12


@pytest.mark.parametrize('method', [name for name in BACKWARD if name not in ('attnlrp', 'cplrp')])
def test_every_backward_method(method):
    model = tiny_model('llama')
    ids = token_ids('llama', 10, 2)
    params = {'steps': 3} if method == 'integrated_gradients' else {'samples': 3} if method == 'smoothgrad' else {}
    plain = explain(model, ids, method=method, **params)
    recomputed = explain(model, ids, method=method, checkpointing=True, **params)
    assert relative_error(recomputed.relevance, plain.relevance) <= 1e-12


def test_blocks_are_recomputed_and_fewer_bytes_are_saved():
    """Each block runs twice (forward, recomputation); what autograd keeps (saved tensors plus the blocks' inputs
    that the checkpoints hold) is far less than without checkpointing."""
    model = tiny_model('llama')
    ids = token_ids('llama', 48, 1)
    explain(model, ids)  # the checks' probes run the model once per model: counted apart
    calls = []
    handle = model.model.layers[0].mlp.act_fn.register_forward_hook(lambda *args: calls.append(1))

    def kept_bytes(checkpointing):
        storages = {}

        def keep(tensor):
            storage = tensor.untyped_storage()
            storages.setdefault(storage.data_ptr(), storage.nbytes())

        def pack(tensor):
            keep(tensor)
            return tensor

        def block_inputs(module, args, kwargs):
            for value in [*args, *kwargs.values()]:
                for tensor in value if isinstance(value, tuple) else (value,):
                    if isinstance(tensor, torch.Tensor):
                        keep(tensor)

        hooks = (
            [block.register_forward_pre_hook(block_inputs, with_kwargs=True) for block in transformer_blocks(model)]
            if checkpointing
            else []
        )
        parameters = {tensor.untyped_storage().data_ptr() for tensor in model.parameters()}
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
                explanation = explain(model, ids, checkpointing=checkpointing)
        finally:
            for hook in hooks:
                hook.remove()
        return sum(size for pointer, size in storages.items() if pointer not in parameters), explanation

    without, reference = kept_bytes(False)
    assert len(calls) == 1
    with_checkpointing, explanation = kept_bytes(True)
    assert len(calls) == 3  # once more in the forward pass, once in the recomputation
    handle.remove()
    assert torch.equal(explanation.relevance, reference.relevance)
    assert with_checkpointing < 0.5 * without


def test_model_is_restored_exactly_also_after_an_exception():
    model = tiny_model('llama')
    layer = model.model.layers[0]
    sentinel = layer.forward  # a bound method; no instance attribute
    assert 'forward' not in layer.__dict__

    def custom(*args, **kwargs):  # an instance forward that was there before (e.g. an accelerate hook)
        return type(layer).forward(layer, *args, **kwargs)

    model.model.layers[1].forward = custom
    with pytest.raises(RuntimeError, match='inside'):
        with checkpointed(model) as blocks:
            assert blocks == list(model.model.layers)
            assert 'forward' in layer.__dict__
            raise RuntimeError('inside')
    assert 'forward' not in layer.__dict__ and layer.forward == sentinel
    assert model.model.layers[1].__dict__['forward'] is custom
    # and after explain() raising inside the checkpointed call (a target out of range is found after the forward)
    with pytest.raises(ValueError, match='out of range'):
        explain(model, token_ids('llama', 6), target=10**6, checkpointing=True)
    assert 'forward' not in layer.__dict__
    assert model.model.layers[1].__dict__['forward'] is custom


def test_refusals():
    model = tiny_model('llama')
    ids = token_ids('llama', 6)
    for method in sorted(set(METHODS) - set(BACKWARD)):
        with pytest.raises(ValueError, match='checkpointing'):
            explain(model, ids, method=method, checkpointing=True)
    with pytest.raises(TypeError, match='checkpointing'):
        explain(model, ids, checkpointing='yes')
    with pytest.raises(
        NoBlocksError,
        match='^checkpointing=True: Linear has no transformer blocks: .*explain it without checkpointing$',
    ):
        with checkpointed(torch.nn.Linear(2, 2)):
            pass
    with pytest.raises(ValueError, match='empty list of blocks'):
        with checkpointed(model, blocks=[]):
            pass
    with checkpointed(model):
        with pytest.raises(ValueError, match='already checkpointed'):
            with checkpointed(model):
                pass
    assert 'forward' not in model.model.layers[0].__dict__


@pytest.mark.parametrize('family', ['llama', 'gpt2', 'bert', 'phi'])
@pytest.mark.parametrize('reduce', [None, 'sum'])
def test_latent_relevance_is_the_same(family, reduce):
    """latent= with checkpointing: the recomputation of each block is not recorded a second time (no 'second
    forward pass' refusal), and every site's relevance and activation equal those without checkpointing."""
    from zennit_attn.latent import SITES

    model = tiny_model(family)
    ids, extra = text_inputs(family)
    plain = explain(model, ids, latent=SITES, latent_reduce=reduce, **extra)
    recomputed = explain(model, ids, latent=SITES, latent_reduce=reduce, checkpointing=True, **extra)
    assert relative_error(recomputed.relevance, plain.relevance) <= 1e-12
    assert set(recomputed.latent) == set(plain.latent) == set(SITES)
    for site in SITES:
        assert relative_error(recomputed.latent[site], plain.latent[site]) <= 1e-12, site
        assert torch.equal(recomputed.latent.activation[site], plain.latent.activation[site]), site
        assert float(plain.latent[site].abs().max()) > 0 or site in ('query', 'key'), site


def test_conditions_and_neuron_targets_are_refused():
    from zennit_attn.latent import Neuron

    model = tiny_model('llama')
    ids = token_ids('llama', 6)
    with pytest.raises(ValueError, match='checkpointing'):
        explain(model, ids, condition=[Neuron('mlp', 0, 1)], checkpointing=True)
    with pytest.raises(ValueError, match='checkpointing'):
        explain(model, ids, target=Neuron('mlp', 0, 1), checkpointing=True)


@pytest.mark.parametrize('composite', [AttnLRPEpsilon, CPLRPEpsilon])
def test_a_checkpointed_block_keeps_no_activation_alive(composite):
    """Between the forward and the backward pass a checkpointed block keeps only its input, with the rules as without
    them: the tensors computed inside it (an attention softmax's output, the activation's input, the second norm's
    input) are freed after its forward. The rules' autograd nodes must not hold them as attributes (the identity
    rule's chain source, the softmax's NaN rows: 3.2x the checkpointed plain pass's peak memory on a 7B model)."""
    model = tiny_model('llama', attn_implementation='eager')
    inside = []

    def keep(module, args, output):
        inside.append(weakref.ref(output))

    def keep_input(module, args):
        inside.append(weakref.ref(args[0]))

    handles = []
    for layer in model.model.layers:
        handles += [
            layer.mlp.gate_proj.register_forward_hook(keep),
            layer.post_attention_layernorm.register_forward_pre_hook(keep_input),
            layer.self_attn.register_forward_hook(lambda module, args, output: inside.append(weakref.ref(output[1]))),
        ]
    embeddings = model.get_input_embeddings()(token_ids('llama', 12)).detach().requires_grad_(True)
    try:
        with composite().context(model) as modified, checkpointed(modified):
            logits = modified(inputs_embeds=embeddings, use_cache=False, output_attentions=True).logits
            del modified
            gc.collect()
            seen, alive = len(inside), [ref for ref in inside if ref() is not None]
            logits[0, -1, 5].backward()
    finally:
        for handle in handles:
            handle.remove()
    assert seen == 3 * len(model.model.layers)  # the forward's (the backward pass recomputes them)
    assert embeddings.grad is not None
    assert not alive, f'{len(alive)} of {seen} tensors computed inside checkpointed blocks are alive'
