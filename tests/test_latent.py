"""Latent relevance, neuron targets, conditional relevance, steering, vocabulary projection and reference samples
(``zennit_attn.latent``), on tiny random float64 models.

Every numeric check is one the math fixes: conservation of the epsilon rule with zero bias (neuron relevances sum
to the MLP output's relevance), the block-boundary sums of ``conservation()``, gradient x input computed
independently with plain autograd, the arithmetic of a steered last layer, and brute force over the same texts.
"""
from __future__ import annotations

import pytest
import torch

from tests.canonizers.test_vision import pixels, tiny_hf_vit, tiny_timm_vit
from tests.conftest import MOE, tiny_model, token_ids
from tests.text_tokenizer import byte_level_tokenizer
from zennit_attn import conservation, explain
from zennit_attn.canonizers import supported_families
from zennit_attn.latent import SITES, Neuron, find_sites, reference_samples, steer, top_neurons, vocabulary_projection

TIGHT = dict(rtol=1e-9, atol=1e-12)


def llama(**kwargs):
    return tiny_model('llama', zero_bias=True, **kwargs)


def watch(module, store, name, output=True):
    """Keep ``x`` and ``x * grad`` of a module's output (or first input) with plain hooks, independent of the
    package's site code."""
    def keep(tensor):
        tensor = tensor[0] if isinstance(tensor, tuple) else tensor
        store[name] = {'x': tensor.detach()}
        if tensor.requires_grad:
            tensor.register_hook(lambda grad: store[name].__setitem__('r', tensor.detach() * grad))
    if output:
        return module.register_forward_hook(lambda module, args, out: keep(out))
    return module.register_forward_pre_hook(lambda module, args: keep(args[0]))


# ------------------------------------------------------------------------------------------------ recording
@pytest.mark.parametrize('method', ['attnlrp', 'cplrp', 'input_x_gradient'])
def test_sums_of_neurons_and_heads(method):
    """Bias-free projections conserve: the FFN neurons of a block sum to the MLP output's relevance, the heads to
    the attention output's (per position)."""
    model, ids = llama(), token_ids('llama', 7, 2)
    store, handles = {}, []
    for layer, block in enumerate(model.model.layers):
        handles += [watch(block.mlp, store, f'mlp{layer}'), watch(block.self_attn, store, f'attn{layer}')]
    try:
        exp = explain(model, ids, method=method, latent=('mlp', 'attention'))
    finally:
        for handle in handles:
            handle.remove()
    for layer in range(2):
        torch.testing.assert_close(exp.latent['mlp'][:, layer].sum(-1), store[f'mlp{layer}']['r'].sum(-1), **TIGHT)
        torch.testing.assert_close(exp.latent['attention'][:, layer].sum(-1), store[f'attn{layer}']['r'].sum(-1),
                                   **TIGHT)
    assert float(exp.latent['mlp'].abs().sum()) > 0


@pytest.mark.parametrize('family', ['llama', 'gpt2', 'bert', 'phi'])
def test_residual_equals_conservation(family):
    model = tiny_model(family)
    ids = token_ids(family, 6, 1)
    exp = explain(model, ids, latent='residual')
    report = conservation(model, ids)
    layers = exp.latent['residual'].shape[1] - 1
    torch.testing.assert_close(exp.latent['residual'][0].sum(-1).flip(0), report.sums[:layers + 1, 0], **TIGHT)


@pytest.mark.parametrize('method', ['attnlrp', 'cplrp', 'input_x_gradient'])
@pytest.mark.parametrize('family', ['llama', 'gpt2', 'qwen2_moe'])
def test_recording_leaves_relevance_bit_identical(family, method):
    model = tiny_model(family)
    ids = token_ids(family, 6, 2)
    plain = explain(model, ids, method=method)
    sites = ('attention', 'residual', 'query', 'key', 'value') + (() if family in MOE else ('mlp',))
    recorded = explain(model, ids, method=method, latent=sites)
    assert torch.equal(plain.relevance, recorded.relevance)
    assert torch.equal(plain.logit, recorded.logit)


def test_latent_reduce_sum_and_padding():
    model = llama()
    ids = token_ids('llama', 6, 2)
    mask = torch.ones_like(ids)
    mask[1, -2:] = 0
    full = explain(model, ids, attention_mask=mask, latent=('mlp', 'residual'))
    reduced = explain(model, ids, attention_mask=mask, latent=('mlp', 'residual'), latent_reduce='sum')
    assert reduced.latent.reduce == 'sum' and reduced.latent['mlp'].shape == (2, 2, 64)
    torch.testing.assert_close(reduced.latent['mlp'], full.latent['mlp'].sum(2), **TIGHT)
    torch.testing.assert_close(reduced.latent['residual'], full.latent['residual'].sum(2), **TIGHT)
    assert float(full.latent['mlp'][1, :, -2:].abs().sum()) == 0  # padding
    assert float(full.latent.activation['mlp'][1, :, -2:].abs().sum()) == 0


def test_cplrp_query_and_key_get_no_relevance():
    model = llama()
    exp = explain(model, token_ids('llama', 6, 1), method='cplrp', latent=('query', 'key', 'value'))
    assert float(exp.latent['query'].abs().sum()) == 0 and float(exp.latent['key'].abs().sum()) == 0
    assert float(exp.latent['value'].abs().sum()) > 0


def build(family):
    """``(model, explain kwargs)`` of every family of the table (vision transformers included)."""
    if family == 'timm-vit':
        return tiny_timm_vit(), dict(input_ids=pixels())
    if family == 'vit':
        return tiny_hf_vit(), dict(input_ids=pixels())
    head = {'roberta': 'masked_lm'}.get(family)
    return tiny_model(family, head), dict(input_ids=token_ids(family, 6, 1))


@pytest.mark.parametrize('family', supported_families())
def test_every_family_records_every_site_it_has(family):
    """Each site is recorded with the right shape and equals activation x gradient computed with plain autograd
    (method input_x_gradient); MoE families have no 'mlp' site, T5 (encoder-decoder) none at all: clear errors."""
    model, kwargs = build(family)
    if family == 't5':
        with pytest.raises(ValueError, match='encoder-decoder'):
            explain(model, latent='residual', **kwargs)
        return
    sites = [site for site in SITES if not (site == 'mlp' and family in MOE)]
    if family in MOE:
        with pytest.raises(ValueError, match=f'{family}.*mixture of experts'):
            explain(model, latent='mlp', **kwargs)
    points = find_sites(model, sites)
    store, handles = {}, []
    for site in sites:
        for point in points[site]:
            handles.append(watch(point.module, store, (site, point.layer), output=point.kind == 'output'))
    try:
        exp = explain(model, method='input_x_gradient', latent=sites, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    layers = len(points['attention'])
    for site in sites:
        values = exp.latent[site]
        assert values.shape[1] == layers + (site == 'residual')
        assert bool(torch.isfinite(values).all())
        for point in points[site]:
            raw = point.select(store[(site, point.layer)]['r'])
            expected = point.reduce(raw)
            if expected.dim() == values.dim() - 1 and values.dim() >= 3:
                torch.testing.assert_close(values[:, point.layer], expected.to(values.dtype), rtol=1e-5, atol=1e-7)
    assert float(exp.latent['attention'].abs().sum()) > 0


# ------------------------------------------------------------------------------------------------ neuron targets
@pytest.mark.parametrize('site,layer,index', [('mlp', 1, 5), ('mlp', 0, 17), ('attention', 1, 2), ('value', 0, 3),
                                              ('residual', 1, 4)])
def test_neuron_target_conserves_under_cplrp(site, layer, index):
    """Bias-free random Llama, CP-LRP: the input relevance sums to the neuron's activation (the initial relevance)."""
    model, ids = llama(), token_ids('llama', 6, 2)
    exp = explain(model, ids, target=Neuron(site, layer, index), method='cplrp')
    point = find_sites(model, site)[site][layer]
    store = {}
    handle = watch(point.module, store, 'x', output=point.kind == 'output')
    with torch.no_grad():
        model(ids)
    handle.remove()
    tensor = point.select(store['x']['x'])
    features = point.unit_features(index, tensor.shape[-1])
    activation = tensor[:, -1, features].sum(-1)
    torch.testing.assert_close(exp.logit, activation, **TIGHT)
    torch.testing.assert_close(exp.relevance.sum(-1), activation, **TIGHT)
    assert exp.target.tolist() == [index, index]


def test_neuron_target_with_gradient_methods():
    model, ids = llama(), token_ids('llama', 6, 1)
    neuron = Neuron('mlp', 1, 5)
    gradient = explain(model, ids, target=neuron, method='input_x_gradient')
    lrp = explain(model, ids, target=neuron, method='cplrp')
    torch.testing.assert_close(gradient.logit, lrp.logit, **TIGHT)
    integrated = explain(model, ids, target=neuron, method='integrated_gradients', steps=4)
    torch.testing.assert_close(integrated.logit, lrp.logit, **TIGHT)


def plant(model, ids, target, layer=1, neuron=7, strength=20.0):
    """Make FFN neuron ``neuron`` of ``layer`` carry the logit of ``target`` at the last position."""
    mlp = model.model.layers[layer].mlp
    with torch.no_grad():
        mlp.gate_proj.weight[neuron] *= 4
        mlp.up_proj.weight[neuron] *= 4
        store = {}
        handle = watch(mlp.down_proj, store, 'x', output=False)
        model(ids)
        handle.remove()
        sign = float(torch.sign(store['x']['x'][0, -1, neuron]))
        mlp.down_proj.weight[:, neuron] = sign * strength * model.lm_head.weight[target]
    return model


@pytest.mark.parametrize('method', ['attnlrp', 'cplrp', 'input_x_gradient'])
def test_planted_neuron_ranks_first(method):
    ids = token_ids('llama', 6, 1)
    model = plant(llama(), ids, target=42)
    exp = explain(model, ids, target=42, method=method, latent='mlp')
    best = top_neurons(exp, k=3)
    assert (best[0].layer, best[0].index) == (1, 7)
    if method != 'input_x_gradient':  # LRP conserves: the planted neuron carries most of the logit
        assert best[0].relevance > 0.5 * float(exp.logit[0])
    assert top_neurons(exp, k=1, absolute=True)[0][:2] == (1, 7)


# ------------------------------------------------------------------------------------------------ conditions
def test_conditions_sum_to_the_site_and_the_cut():
    model, ids = llama(), token_ids('llama', 5, 1)
    whole = explain(model, ids, latent=('mlp', 'residual'))
    layer = 1
    every = [Neuron('mlp', layer, index) for index in range(64)]
    singles = explain(model, ids, condition=every)
    assert singles.relevance.shape == (64, 5)
    # the relevance each condition receives is the neuron's recorded latent relevance
    torch.testing.assert_close(singles.logit, whole.latent['mlp'][0, layer].sum(0), **TIGHT)
    site = explain(model, ids, condition=[every])
    torch.testing.assert_close(singles.relevance.sum(0), site.relevance[0], **TIGHT)
    # the residual stream is a cut: all its hidden units together give the unconditional heatmap
    for boundary in (1, 2):
        cut = explain(model, ids, condition=[[Neuron('residual', boundary, index) for index in range(32)]])
        torch.testing.assert_close(cut.relevance[0], whole.relevance[0], **TIGHT)
        torch.testing.assert_close(cut.logit[0], whole.latent['residual'][0, boundary].sum(), **TIGHT)


def test_conditions_batch_rows_and_conservation():
    """Two input rows x three conditions; under CP-LRP with zero biases each conditional heatmap sums to the
    relevance its condition receives."""
    model, ids = llama(), token_ids('llama', 5, 2)
    conditions = [Neuron('mlp', 1, 3), [Neuron('mlp', 1, 4), Neuron('mlp', 1, 9)], Neuron('attention', 0, 1)]
    exp = explain(model, ids, method='cplrp', condition=conditions, latent=('mlp', 'attention'))
    assert exp.relevance.shape == (6, 5)
    torch.testing.assert_close(exp.relevance.sum(-1), exp.logit, **TIGHT)
    mlp, attention = exp.latent['mlp'], exp.latent['attention']
    expected = torch.stack([torch.stack([mlp[row, 1, :, 3].sum(), mlp[row, 1, :, [4, 9]].sum(),
                                         attention[row, 0, :, 1].sum()]) for row in range(2)]).flatten()
    torch.testing.assert_close(exp.logit, expected, **TIGHT)
    assert exp.input_ids.shape[0] == 6
    reduced = explain(model, ids, method='cplrp', condition=conditions, latent='mlp', latent_reduce='sum')
    torch.testing.assert_close(reduced.relevance, exp.relevance, **TIGHT)
    torch.testing.assert_close(reduced.latent['mlp'], exp.latent['mlp'].sum(2), **TIGHT)  # of the input rows


# ------------------------------------------------------------------------------------------------ steering
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
    return ({name: value.clone() for name, value in model.state_dict().items()},
            [(name, type(module), len(module._forward_hooks), len(module._forward_pre_hooks),
              len(module._backward_hooks)) for name, module in model.named_modules()])


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


# ------------------------------------------------------------------------------------------------ projection
def test_vocabulary_projection():
    model = llama()
    projection = vocabulary_projection(model, Neuron('mlp', 1, 5), k=4)
    expected = model.lm_head.weight @ model.model.layers[1].mlp.down_proj.weight[:, 5]
    assert [token for token, _, _ in projection.top] == expected.topk(4).indices.tolist()
    assert [token for token, _, _ in projection.bottom] == (-expected).topk(4).indices.tolist()
    torch.testing.assert_close(projection.scores, expected.float())
    residual = vocabulary_projection(model, Neuron('residual', 2, 3), k=2)
    torch.testing.assert_close(residual.scores, model.lm_head.weight[:, 3].float())
    with pytest.raises(ValueError, match='attention'):
        vocabulary_projection(model, Neuron('attention', 0, 1))


# ------------------------------------------------------------------------------------------------ references
def corpus(count=23):
    words = ['The ice bear lives in the Arctic.', 'seals and fish', 'the penguin lives in the south',
             'Question: where does the bear live?', 'Answer: in the north.', 'bear bear lives']
    return [' '.join(words[(index * 7 + offset) % len(words)] for offset in range(1 + index % 3))
            for index in range(count)]


@pytest.mark.parametrize('by', ['activation', 'relevance'])
def test_reference_samples_stream_equals_brute_force(by):
    model, tokenizer = llama(), byte_level_tokenizer()
    texts = corpus()
    neurons = [Neuron('mlp', 1, 5), Neuron('attention', 0, 2)]
    consumed = []

    def stream():
        for text in texts:
            consumed.append(text)
            yield text
    refs = reference_samples(model, tokenizer, stream(), neurons, k=4, by=by, batch_size=5, max_length=16,
                             explain=False, progress=False)
    assert len(consumed) == len(texts)
    for neuron in neurons:
        scores = []
        for text in texts:  # brute force: one text at a time
            ids = torch.tensor([tokenizer(text, truncation=True, max_length=16)['input_ids']])
            if by == 'activation':
                exp = explain(model, ids, latent=neuron.site)
                values = exp.latent.activation[neuron.site][0, neuron.layer, :, neuron.index]
            else:
                exp = explain(model, ids, latent=neuron.site)
                values = exp.latent[neuron.site][0, neuron.layer, :, neuron.index]
            scores.append((float(values.max()), text, int(values.argmax())))
        best = sorted(scores, key=lambda item: -item[0])[:4]
        got = refs[neuron]
        assert [entry.text for entry in got] == [text for _, text, _ in best]
        assert [entry.position for entry in got] == [position for _, _, position in best]
        torch.testing.assert_close(torch.tensor([entry.score for entry in got]),
                                   torch.tensor([score for score, _, _ in best]), rtol=1e-6, atol=1e-9)
        assert len(got) == 4


def test_reference_samples_explained_and_rendered():
    model, tokenizer = llama(), byte_level_tokenizer()
    neuron = Neuron('mlp', 1, 5)
    refs = reference_samples(model, tokenizer, corpus(8), [neuron], k=2, batch_size=3, max_length=16,
                             progress=False)
    for entry in refs[neuron]:
        # a padded batch against one text: equal up to the rounding of a different batch layout
        torch.testing.assert_close(entry.explanation.logit[0], torch.tensor(entry.activation, dtype=torch.float64),
                                   rtol=1e-6, atol=1e-9)
        assert int(entry.explanation.position[0]) == entry.position
    html = refs[neuron].to_html()
    assert 'ActMax references of mlp[1, 5]' in html and '#2' in html


# ------------------------------------------------------------------------------------------------ errors
def test_bad_input_gets_clear_errors():
    model, ids = llama(), token_ids('llama', 5, 1)
    with pytest.raises(ValueError, match="unknown latent site"):
        explain(model, ids, latent=('mlp', 'neurons'))
    with pytest.raises(ValueError, match='unknown site'):
        Neuron('ffn', 0, 1)
    with pytest.raises(TypeError, match='integer'):
        Neuron('mlp', 0.5, 1)
    with pytest.raises(ValueError, match='layer 5 is out of range'):
        explain(model, ids, target=Neuron('mlp', 5, 1))
    with pytest.raises(ValueError, match='64 units; index 64 is out of range'):
        explain(model, ids, target=Neuron('mlp', 1, 64))
    with pytest.raises(ValueError, match='index 4 is out of range'):
        explain(model, ids, condition=[Neuron('attention', 1, 4)])
    with pytest.raises(ValueError, match='mixtral family has no "mlp" site'):
        explain(tiny_model('mixtral'), ids, latent='mlp')
    with pytest.raises(ValueError, match='cannot explain a Neuron target'):
        explain(model, ids, target=Neuron('mlp', 1, 1), method='atman')
    with pytest.raises(ValueError, match='one backward pass'):
        explain(model, ids, latent='mlp', method='integrated_gradients')
    with pytest.raises(ValueError, match='latent_reduce'):
        explain(model, ids, latent='mlp', latent_reduce='mean')
    with pytest.raises(ValueError, match='share site and layer'):
        explain(model, ids, condition=[[Neuron('mlp', 1, 1), Neuron('mlp', 0, 1)]])
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
    assert not any(module._forward_hooks for module in model.modules())  # nothing left behind by the refusals
    with pytest.raises(KeyError, match='was not recorded'):
        explain(model, ids, latent='mlp').latent['attention']
    with pytest.raises(ValueError, match='no latent relevance'):
        top_neurons(explain(model, ids))


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
    torch.testing.assert_close(scaled.latent.activation['mlp'][0, 1, :, 3],
                               3 * plain.latent.activation['mlp'][0, 1, :, 3], **TIGHT)


@pytest.mark.parametrize('family', ['timm-vit', 'vit'])
def test_vision_transformers_cut_and_neuron_target(family):
    """ViTs: the residual stream is a cut (conditional on all hidden units = the unconditional pixel heatmap), and a
    neuron target explains the neuron's activation."""
    model, kwargs = build(family)
    whole = explain(model, latent='mlp', **kwargs)
    hidden = model.embed_dim if family == 'timm-vit' else model.config.hidden_size
    cut = explain(model, condition=[[Neuron('residual', 1, index) for index in range(hidden)]], **kwargs)
    torch.testing.assert_close(cut.relevance, whole.relevance, rtol=1e-9, atol=1e-12)
    target = explain(model, target=Neuron('mlp', 1, 3), method='input_x_gradient', **kwargs)
    point = find_sites(model, 'mlp')['mlp'][1]
    store = {}
    handle = watch(point.module, store, 'x', output=False)
    with torch.no_grad():
        model(kwargs['input_ids'])
    handle.remove()
    torch.testing.assert_close(target.logit, store['x']['x'][:, -1, 3], **TIGHT)
