"""Steering (``zennit_attn.latent.steer``) on a tiny random float64 Llama: the logits move as the arithmetic of a
steered last layer predicts, positions and generation behave as documented, everything is undone on exit, and what
would silently not be steered (a compiled model) is refused."""

from __future__ import annotations

import pytest
import torch

from tests.latent.helpers import TIGHT, llama, watch
from tests.models import token_ids
from zennit_attn import explain
from zennit_attn.composites import CompiledModelError
from zennit_attn.latent import Neuron, find_sites, steer
from zennit_attn.workflows.architecture_check.configs import model_class, tiny_config


def last_layer_prediction(model, ids, neuron, mode, value):
    """The logits the arithmetic predicts when FFN neuron ``neuron`` of the last layer is changed: the residual
    output changes by ``down_proj.weight[:, neuron] * (new - old)`` at every position."""
    layer = model.model.layers[-1]
    store = {}
    handles = [watch(layer.mlp.down_proj, store, 'a', output=False), watch(layer, store, 'h')]
    with torch.no_grad():
        model(ids)
    for handle in handles:
        handle.remove()
    old = store['a']['x'][..., neuron]
    new = {'set': torch.full_like(old, value), 'scale': old * value, 'add': old + value}[mode]
    hidden = store['h']['x'] + (new - old)[..., None] * layer.mlp.down_proj.weight[:, neuron]
    with torch.no_grad():
        return model.lm_head(model.model.norm(hidden))


def snapshot(model):
    return (
        {name: value.clone() for name, value in model.state_dict().items()},
        [
            (
                name,
                type(module),
                len(module._forward_hooks),
                len(module._forward_pre_hooks),
                len(module._backward_hooks),
            )
            for name, module in model.named_modules()
        ],
    )


def assert_restored(model, before):
    state, modules = snapshot(model)
    assert modules == before[1]
    assert all(torch.equal(state[name], value) for name, value in before[0].items())


@pytest.mark.parametrize('mode,value', [('set', 0.0), ('set', 3.0), ('scale', -2.0), ('add', 1.5)])
def test_steer_changes_logits_as_predicted(mode, value):
    model, ids = llama(), token_ids('llama', 6, 1)
    before = snapshot(model)
    expected = last_layer_prediction(model, ids, 11, mode, value)
    with torch.no_grad(), steer(model, {Neuron('mlp', -1, 11): value}, mode=mode):
        steered = model(ids).logits
    torch.testing.assert_close(steered, expected, **TIGHT)
    assert_restored(model, before)
    with torch.no_grad():
        plain = model(ids).logits
    assert not torch.allclose(plain, steered)


def test_steer_positions():
    model, ids = llama(), token_ids('llama', 6, 1)
    with torch.no_grad():
        plain = model(ids).logits
        with steer(model, {Neuron('mlp', 0, 3): 50.0}, positions=[4]):
            steered = model(ids).logits
    torch.testing.assert_close(steered[:, :4], plain[:, :4], **TIGHT)  # causal: earlier positions unchanged
    assert not torch.allclose(steered[:, 4:], plain[:, 4:])


def test_steer_in_generate_and_restored_after_exception():
    model, ids = llama(), token_ids('llama', 4, 1)
    before = snapshot(model)
    edits = {Neuron('mlp', 1, 7): 40.0, Neuron('attention', 0, 1): 0.0}
    with steer(model, edits):
        generated = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
    manual = ids
    with torch.no_grad(), steer(model, edits):
        for _ in range(4):
            token = model(manual, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
            manual = torch.cat([manual, token], 1)
    assert torch.equal(generated, manual)
    with pytest.raises(RuntimeError, match='boom'):
        with steer(model, edits):
            raise RuntimeError('boom')
    assert_restored(model, before)


def test_steering_composes_with_recording_and_nesting():
    """Recording and neuron targets see the steered activation; nested steering applies in order (inner wins)."""
    model, ids = llama(), token_ids('llama', 5, 1)
    neuron = Neuron('mlp', 1, 3)
    with steer(model, {neuron: 2.0}), steer(model, {neuron: 5.0}):
        exp = explain(model, ids, latent='mlp')
        target = explain(model, ids, target=neuron, method='cplrp')
    assert bool((exp.latent.activation['mlp'][0, 1, :, 3] == 5.0).all())
    assert float(target.logit[0]) == 5.0
    with steer(model, {neuron: 3.0}, mode='scale'):
        scaled = explain(model, ids, latent='mlp')
    plain = explain(model, ids, latent='mlp')
    torch.testing.assert_close(
        scaled.latent.activation['mlp'][0, 1, :, 3], 3 * plain.latent.activation['mlp'][0, 1, :, 3], **TIGHT
    )


def test_steer_last_position_in_generate_steers_every_prediction():
    """``positions=-1`` in generate (key/value cache): the prompt's last token is steered in the first pass, so the
    first generated token already follows the steering, then each generated token in its own pass; this equals
    steering positions ``P - 1`` to the end in every pass of a generation without a cache."""
    model, ids = llama(), token_ids('llama', 4, 1)
    edits = {Neuron('mlp', 1, 7): 40.0}
    options = dict(max_new_tokens=4, do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    plain = model.generate(ids, **options)
    with steer(model, edits, positions=-1):
        steered = model.generate(ids, **options)
    manual, logits = ids, []
    with torch.no_grad():
        for _ in range(4):
            with steer(model, edits, positions=list(range(ids.shape[1] - 1, manual.shape[1]))):
                logits.append(model(manual, use_cache=False).logits[:, -1])
            manual = torch.cat([manual, logits[-1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(steered.sequences, manual)
    # generate returns its logits in float32
    torch.testing.assert_close(torch.stack(steered.logits), torch.stack(logits).float(), rtol=1e-6, atol=1e-6)
    assert float((steered.logits[0] - plain.logits[0]).abs().max()) > 1e-3  # the first token's logits moved
    with torch.no_grad():  # the earlier prompt tokens are not steered
        with steer(model, edits, positions=-1):
            prompt = model(ids).logits
        unsteered = model(ids).logits
    torch.testing.assert_close(prompt[:, :-1], unsteered[:, :-1], **TIGHT)


@pytest.mark.parametrize('how', ['torch.compile', 'in place'])
def test_steer_refuses_compiled_models(how):
    """A compiled model runs traced code that bypasses the steering hooks: refused, as explain() refuses it."""
    model = llama()
    if how == 'in place':
        model.compile()
        compiled = model
    else:
        compiled = torch.compile(model)
    with pytest.raises(
        CompiledModelError, match='forward hooks of steering, so steering would silently change nothing. Steer'
    ):
        with steer(compiled, {Neuron('mlp', 0, 1): 0.0}):
            pass
    assert not any(module._forward_hooks or module._forward_pre_hooks for module in model.modules())


def test_steer_bad_input_gets_clear_errors():
    model = llama()
    with pytest.raises(ValueError, match='mode'):
        with steer(model, {Neuron('mlp', 1, 1): 0.0}, mode='multiply'):
            pass
    with pytest.raises(ValueError, match='out of range'):
        with steer(model, {Neuron('mlp', 1, 99): 0.0}):
            pass
    for value in (float('nan'), float('inf')):
        with pytest.raises(ValueError, match='must be finite'):
            with steer(model, {Neuron('mlp', 1, 1): value}):
                pass
    assert not any(module._forward_hooks or module._forward_pre_hooks for module in model.modules())


def tiny_architecture(mapping, architecture):
    """The architecture check's tiny random float64 model of ``architecture`` (of the auto-mapping ``mapping``)."""
    model_type, config_type = model_class(mapping, architecture)
    torch.manual_seed(0)
    return model_type(tiny_config(config_type)).double().eval()


@pytest.mark.parametrize(
    'mapping,architecture,neuron,positions,embeds',
    [
        ('causal-lm', 'cpmant', Neuron('mlp', 1, 3), 38, False),  # 32 prompt tokens in front of the input's
        ('masked-lm', 'longformer', Neuron('mlp', 1, 3), 512, False),  # padded to a multiple of its attention window
        ('causal-lm', 'prophetnet', Neuron('mlp', 1, 3), 18, True),  # the main stream, then two n-gram streams
    ],
)
def test_positions_are_refused_where_the_site_holds_other_positions_than_the_input(
    mapping, architecture, neuron, positions, embeds
):
    """The positions were counted in the site tensor, not in the input: CPM-Ant's 32 prompt tokens in front made
    ``positions=[0]`` steer a prompt token (logit change 0.000 where editing the first input token changes them by
    0.294), Longformer's padding of 6 to 512 tokens made ``[-1]`` steer pad 511 (0.000 where the last token gives
    0.041), ProphetNet's main stream and two n-gram streams (18 positions for 6 tokens) made ``[-1]`` steer the last
    position of the second n-gram stream, which no logit reads (0.000). Steering with positions now compares the
    site's positions with the tokens of the forward call's input and refuses where they differ; without positions
    every position of the site is steered, as before. (CPM-Ant takes no ``inputs_embeds``; the tiny Longformer's
    padding of them looks up a pad id beyond its vocabulary.)"""
    model = tiny_architecture(mapping, architecture)
    ids = torch.tensor([[5, 17, 3, 28, 9, 14]])
    message = (
        rf'{neuron.site} layer {neuron.layer} of {type(model).__name__} holds {positions} positions where the input of '
        r'the forward call has 6 tokens .* steer all positions \(positions=None\)'
    )
    for steps in ([0], -1):
        with pytest.raises(ValueError, match=message):
            with torch.no_grad(), steer(model, {neuron: 5.0}, mode='add', positions=steps):
                model(ids)
        if not embeds:
            continue
        with pytest.raises(ValueError, match=message):  # inputs_embeds tell the tokens as well
            with torch.no_grad(), steer(model, {neuron: 5.0}, mode='add', positions=steps):
                model(inputs_embeds=model.get_input_embeddings()(ids))
    assert not any(module._forward_hooks or module._forward_pre_hooks for module in model.modules())
    point = find_sites(model, neuron.site)[neuron.site][neuron.layer]
    with torch.no_grad():
        plain = model(ids).logits
        with steer(model, {neuron: 5.0}, mode='add'):
            steered = model(ids).logits

        def add(module, args, kwargs):  # every position of the site, as steer without positions
            name, tensor = (None, args[0]) if args else next(iter(kwargs.items()))
            tensor = tensor.clone()
            tensor[..., neuron.index] += 5.0
            return ((tensor, *args[1:]), kwargs) if name is None else (args, {**kwargs, name: tensor})

        handle = point.module.register_forward_pre_hook(add, with_kwargs=True)
        manual = model(ids).logits
        handle.remove()
    torch.testing.assert_close(steered, manual, **TIGHT)
    assert float((steered - plain).abs().max()) > 1e-3


def test_steering_a_block_the_forward_pass_skips_is_refused():
    """Mllama without images skips its cross-attention block: ``steer({Neuron('residual', 2, 3): 100.0})`` (the
    output of that block) was accepted and changed the logits by 0.000, where explain() refuses the neuron. After each
    forward call of the model every edit's hook must have run; the blocks that run are steered as before."""
    model = tiny_architecture('causal-lm', 'mllama')
    ids = torch.tensor([[5, 17, 3, 28, 9, 14]])
    skipped = model.model.layers[1]
    assert type(skipped).__name__ == 'MllamaCrossAttentionDecoderLayer'
    message = (
        r'steering residual\[2, 3\]: the forward pass of MllamaForCausalLM did not reach residual layer 2 '
        r'\(MllamaCrossAttentionDecoderLayer did not run in this call'
    )
    for edits in ({Neuron('residual', 2, 3): 100.0}, {Neuron('residual', 1, 3): 1.0, Neuron('residual', 2, 3): 1.0}):
        with pytest.raises(RuntimeError, match=message):
            with torch.no_grad(), steer(model, edits, mode='add'):
                model(ids)
    assert not any(module._forward_hooks or module._forward_pre_hooks for module in model.modules())
    with torch.no_grad():
        plain = model(ids).logits
        with steer(model, {Neuron('residual', 1, 3): 100.0}, mode='add'):
            steered = model(ids).logits
    assert float((steered - plain).abs().max()) > 0.1
