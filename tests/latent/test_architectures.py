"""The latent workflow beyond the former family table: latent relevance, Neuron targets, conditions (CRP), steering
and reference samples on architectures the table never listed (:py:data:`tests.architectures.ARCHITECTURES`,
tiny random float64 models with zero biases) and on a vision-language model's language model (LLaVA), checked as the
tests of the table's families check them: sums the math fixes, read with plain hooks at the modules the models' code
names (:py:data:`tests.architectures.PARTS`), independently of the package's site code.
"""

from __future__ import annotations

import pytest
import torch

from tests.architectures import ARCHITECTURES, HEADS, PARTS, tiny_architecture
from tests.latent.helpers import TIGHT
from tests.models import LAYERS, tiny_llava, token_ids
from tests.text_tokenizer import byte_level_tokenizer
from zennit_attn import conservation, explain
from zennit_attn.composites import AttnLRPEpsilon, CPLRPEpsilon
from zennit_attn.latent import Neuron, reference_samples, steer

SAMPLE = ARCHITECTURES + ('llava',)
#: Architectures that compute parts in float32 (Cohere's rotary embedding, OLMo's LayerNorm): sums and linear
#: combinations hold to float32 rounding only.
APPROXIMATE = ('cohere', 'olmo')


def build(architecture):
    return tiny_llava(zero_bias=True) if architecture == 'llava' else tiny_architecture(architecture)


def module(model, architecture, part, layer):
    return model.get_submodule(PARTS[architecture][part].format(layer))


def watch(module, store, name, output=True):
    """Keep a copy of a module's output (or first input) and its ``x * grad`` with plain hooks, independent of the
    package's site code (a copy: Falcon adds the attention output to its MLP's output in place)."""

    def keep(tensor):
        store[name] = {'x': tensor.detach().clone()}
        if tensor.requires_grad:
            tensor.register_hook(lambda grad: store[name].__setitem__('r', store[name]['x'] * grad))

    if output:
        return module.register_forward_hook(lambda module, args, out: keep(out))
    return module.register_forward_pre_hook(lambda module, args: keep(args[0]))


def rows(tensor, batch):
    """``[batch, seq, features]`` of a tensor that a module may see as ``[batch * seq, features]`` (OPT's FFN)."""
    return tensor if tensor.dim() == 3 else tensor.unflatten(0, (batch, -1))


@pytest.mark.parametrize('method', ['attnlrp', 'cplrp'])
@pytest.mark.parametrize('architecture', SAMPLE)
def test_sums_of_neurons_and_heads(architecture, method):
    """Bias-free projections conserve: the FFN neurons of a block sum to the relevance of the down projection's output,
    the heads to that of the attention output projection's (per position); the residual entries are the block
    boundary sums of ``conservation()``."""
    model, ids = build(architecture), token_ids('llama', 6, 2)
    store, handles = {}, []
    for layer in range(LAYERS):
        handles += [
            watch(module(model, architecture, 'mlp', layer), store, f'mlp{layer}'),
            watch(module(model, architecture, 'attention', layer), store, f'attention{layer}'),
        ]
    try:
        exp = explain(model, ids, method=method, latent=('mlp', 'attention', 'residual'))
    finally:
        for handle in handles:
            handle.remove()
    assert exp.latent['attention'].shape == (2, LAYERS, 6, HEADS)
    for layer in range(LAYERS):
        mlp, attention = rows(store[f'mlp{layer}']['r'], 2), store[f'attention{layer}']['r']
        torch.testing.assert_close(exp.latent['mlp'][:, layer].sum(-1), mlp.sum(-1), **TIGHT)
        torch.testing.assert_close(exp.latent['attention'][:, layer].sum(-1), attention.sum(-1), **TIGHT)
    assert float(exp.latent['mlp'].abs().sum()) > 0
    composite = AttnLRPEpsilon() if method == 'attnlrp' else CPLRPEpsilon()
    report = conservation(model, ids[:1], composite=composite)
    torch.testing.assert_close(exp.latent['residual'][0].sum(-1).flip(0), report.sums[: LAYERS + 1, 0], **TIGHT)


@pytest.mark.parametrize('architecture', SAMPLE)
def test_neuron_target_and_conditions(architecture):
    """A Neuron target explains the neuron's activation (read with a plain hook), and under CP-LRP its input relevance
    sums to it; the conditional heatmaps of the heads of a layer sum to the heatmap of all heads as one condition,
    and the residual stream is a cut (all its hidden units as one condition: the unconditional heatmap)."""
    model, ids = build(architecture), token_ids('llama', 5, 1)
    exp = explain(model, ids, target=Neuron('mlp', 1, 5), method='cplrp')
    store = {}
    handle = watch(module(model, architecture, 'mlp', 1), store, 'x', output=False)
    with torch.no_grad():
        model(ids)
    handle.remove()
    activation = rows(store['x']['x'], 1)[:, -1, 5]
    close = dict(rtol=1e-6, atol=1e-9) if architecture in APPROXIMATE else TIGHT
    torch.testing.assert_close(exp.logit, activation, **close)
    torch.testing.assert_close(exp.relevance.sum(-1), activation, **close)
    heads = [Neuron('attention', 1, head) for head in range(HEADS)]
    singles = explain(model, ids, condition=heads)
    together = explain(model, ids, condition=[heads])
    torch.testing.assert_close(singles.relevance.sum(0), together.relevance[0], **close)
    hidden = model.config.get_text_config().hidden_size  # OPT's embeddings are wider than its residual stream
    cut = explain(model, ids, condition=[[Neuron('residual', 1, index) for index in range(hidden)]])
    torch.testing.assert_close(cut.relevance[0], explain(model, ids).relevance[0], **close)


def run(model, ids, watched, store):
    """Run ``model`` on ``ids`` with plain hooks (registered last: they see what steering made) on the modules of
    ``watched`` (``name -> (module, output)``); their tensors ``[batch, seq, features]``."""
    handles = [watch(module, store, name, output) for name, (module, output) in watched.items()]
    try:
        model(ids)
    finally:
        for handle in handles:
            handle.remove()
    return {name: rows(store[name]['x'], ids.shape[0]) for name in watched}


@pytest.mark.parametrize('architecture', SAMPLE)
def test_steering(architecture):
    """Adding 1.5 to FFN neuron 7 of the last layer changes the down projection's output by 1.5 times its column 7
    (at every position), setting head 1 of the first layer to 0 zeroes its features in the attention output
    projection's input; both undone on exit."""
    model, ids = build(architecture), token_ids('llama', 6, 1)
    down = module(model, architecture, 'mlp', LAYERS - 1)
    projection = module(model, architecture, 'attention', 0)
    store = {}
    with torch.no_grad():
        plain = run(model, ids, {'down': (down, True), 'heads': (projection, False)}, store)
        with steer(model, {Neuron('mlp', LAYERS - 1, 7): 1.5}, mode='add'):
            added = run(model, ids, {'down': (down, True)}, store)['down']
        with steer(model, {Neuron('attention', 0, 1): 0.0}):
            heads = run(model, ids, {'heads': (projection, False)}, store)['heads']
    torch.testing.assert_close(added - plain['down'], (1.5 * down.weight[:, 7]).expand_as(added), **TIGHT)
    width = projection.in_features // HEADS
    assert float(heads[..., width : 2 * width].abs().sum()) == 0
    torch.testing.assert_close(heads[..., :width], plain['heads'][..., :width], **TIGHT)
    assert not any(module._forward_hooks or module._forward_pre_hooks for module in model.modules())


@pytest.mark.parametrize('architecture', ['bloom', 'opt', 'llava'])
def test_reference_samples(architecture):
    """ActMax over a stream of texts equals the brute force over the texts one at a time."""
    model, tokenizer = build(architecture), byte_level_tokenizer()
    texts = ['The ice bear lives in the Arctic.', 'seals and fish', 'the penguin lives in the south', 'bear bear']
    neuron = Neuron('mlp', 1, 5)
    refs = reference_samples(
        model,
        tokenizer,
        texts,
        [neuron],
        k=2,
        by='activation',
        batch_size=3,
        max_length=16,
        explain=False,
        progress=False,
    )
    scores = []
    for text in texts:
        ids = torch.tensor([tokenizer(text, truncation=True, max_length=16)['input_ids']])
        values = explain(model, ids, latent='mlp').latent.activation['mlp'][0, 1, :, 5]
        scores.append((float(values.max()), text, int(values.argmax())))
    best = sorted(scores, key=lambda item: -item[0])[:2]
    assert [(entry.text, entry.position) for entry in refs[neuron]] == [(text, position) for _, text, position in best]
    torch.testing.assert_close(
        torch.tensor([entry.score for entry in refs[neuron]]),
        torch.tensor([score for score, _, _ in best]),
        rtol=1e-6,
        atol=1e-9,
    )
