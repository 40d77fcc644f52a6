"""Edge patching (zennit_attn.workflows.patching.edges) on a tiny random float64 Llama with grouped-query attention:
each edge of the plain gradient is the derivative of the metric when only the receiver reads the sender's change
(hand-made hooks), the edges into the logits sum to the node score of the last residual stream for every method, and
edges go forward only."""

from __future__ import annotations

import html

import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from tests.models import tiny_model, token_ids
from tests.workflows.patching_helpers import ANSWERS, TIGHT, WRONG, difference
from zennit_attn.workflows.patching import relevance_patching
from zennit_attn.workflows.patching.edges import Node, edge_patching
from zennit_attn.workflows.patching.view import ROW, edge_graph, save_edges


def _head_write(model, clean, corrupted, layer, head):
    """W_O (z'_h - z_h): what head ``head`` of ``layer`` changes in the residual stream."""
    kept = []
    o_proj = model.model.layers[layer].self_attn.o_proj
    handle = o_proj.register_forward_pre_hook(lambda module, args: kept.append(args[0].detach()))
    try:
        with torch.no_grad():
            model(clean), model(corrupted)
    finally:
        handle.remove()
    delta = (kept[1] - kept[0]).unflatten(-1, (model.config.num_attention_heads, -1))
    mask = torch.zeros(delta.shape[-2], 1, dtype=delta.dtype)
    mask[head] = 1
    return F.linear((delta * mask).flatten(-2), o_proj.weight)


def _receiver_derivative(model, clean, write, layer, site, unit):
    """d m / d t where only ``unit`` of ``site`` (q_proj, k_proj, v_proj) of block ``layer`` reads ``x + t * write``."""
    block = model.model.layers[layer]
    projection = getattr(block.self_attn, {'query': 'q_proj', 'key': 'k_proj', 'value': 'v_proj'}[site])
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    t = torch.zeros(clean.shape[0], 1, 1, dtype=write.dtype, requires_grad=True)
    state = {}

    def keep_input(module, args, kwargs):
        state['x'] = args[0] if args else kwargs['hidden_states']

    def shift(module, args, output):
        x = state['x']
        moved = F.linear(block.input_layernorm(x + t * write), module.weight, module.bias)
        still = F.linear(block.input_layernorm(x), module.weight, module.bias)
        mask = torch.zeros(output.shape[-1], dtype=output.dtype)
        mask[unit * head_dim : (unit + 1) * head_dim] = 1
        return output + mask * (moved - still)

    handles = [
        block.register_forward_pre_hook(keep_input, with_kwargs=True),
        projection.register_forward_hook(shift),
    ]
    try:
        value = difference(model(clean).logits)
        (gradient,) = torch.autograd.grad(value.sum(), t)
    finally:
        for handle in handles:
            handle.remove()
    return gradient[:, 0, 0]


@pytest.mark.parametrize('site, unit', [('query', 3), ('key', 1), ('value', 0)])
def test_plain_edges_are_the_derivative_of_one_receiver_reading_the_change(llama, pairs, site, unit):
    clean, corrupted = pairs
    edges = edge_patching(llama, clean, corrupted, ANSWERS, WRONG, method='atp', steps=1)
    write = _head_write(llama, clean, corrupted, 0, 2)
    expected = _receiver_derivative(llama, clean, write, 1, site, unit)
    sender, receiver = edges.senders.index(Node('head', 0, 2)), edges.receivers.index(Node(site, 1, unit))
    torch.testing.assert_close(edges.scores[:, sender, receiver], expected, **TIGHT)
    assert float(expected.abs().max()) > 1e-6


@pytest.mark.parametrize('family', ['llama', 'gpt2', 'phi3'])
@pytest.mark.parametrize('method', ['atp', 'attnlrp', 'cplrp'])
def test_edges_into_the_logits_sum_to_the_last_residual_node(family, method):
    """The change of the residual stream after the last block is the embeddings' plus every head's and MLP's write
    (output biases cancel): the edges into the logits sum to relevance patching of that residual stream, for every
    method, span and path (two changed positions: the causal paths differ from the straight one); GPT-2 and Phi-3
    compute queries, keys and values in one fused projection."""
    model = tiny_model(family)
    clean = token_ids(family, 6, 3)
    corrupted = clean.clone()
    corrupted[:, 2] = (corrupted[:, 2] + 7) % model.config.vocab_size
    corrupted[:, 4] = (corrupted[:, 4] + 5) % model.config.vocab_size
    span = 0.5 if method == 'attnlrp' else 1.0  # a path that stops halfway for one of the methods
    path = 'straight' if method == 'cplrp' else 'causal'
    options = dict(method=method, steps=2, span=span, path=path)
    edges = edge_patching(model, clean, corrupted, ANSWERS, WRONG, **options)
    nodes = relevance_patching(model, clean, corrupted, ANSWERS, WRONG, components=('residual',), **options)
    assert edges.path == {'attnlrp': '2 steps, span 0.5', 'cplrp': '2 steps, straight path', 'atp': '2 steps'}[method]
    logits = edges.receivers.index(Node('logits', model.config.num_hidden_layers))
    torch.testing.assert_close(edges.scores[:, :, logits].sum(1), nodes.summed('residual')[:, -1, 0], **TIGHT)
    torch.testing.assert_close(edges.clean, nodes.clean, **TIGHT)
    assert float(nodes.summed('residual')[:, -1, 0].abs().max()) > 1e-4


def test_edges_go_forward_and_rank(llama, pairs):
    clean, corrupted = pairs
    edges = edge_patching(llama, clean, corrupted, ANSWERS, WRONG, method='attnlrp', steps=1)
    layers, heads = llama.config.num_hidden_layers, llama.config.num_attention_heads
    kv = llama.config.num_key_value_heads
    assert len(edges.senders) == 1 + layers * (heads + 1)
    assert len(edges.receivers) == layers * (heads + 2 * kv) + 1
    for s, sender in enumerate(edges.senders):
        for r, receiver in enumerate(edges.receivers):
            forward = sender.kind == 'embedding' or sender.layer < receiver.layer
            assert bool(edges.valid[s, r]) == forward
            if not forward:
                assert bool((edges.scores[:, s, r] == 0).all())
    top = edges.top(5)
    assert [abs(entry.score) for entry in top] == sorted((abs(entry.score) for entry in top), reverse=True)
    mean = edges.mean()
    assert top[0].score == pytest.approx(
        float(mean[edges.senders.index(top[0].sender), edges.receivers.index(top[0].receiver)])
    )
    assert str(top[0]).count('->') == 1
    with pytest.raises(ValueError, match='k must be a positive integer'):
        edges.top(0)


def test_edge_view(llama, pairs, tmp_path):
    clean, corrupted = pairs
    edges = edge_patching(llama, clean, corrupted, ANSWERS, WRONG, method='atp', steps=1)
    positions, top, scale = edge_graph(edges, k=6)
    assert scale == pytest.approx(max(abs(entry.score) for entry in top))
    assert {node for entry in top for node in (entry.sender, entry.receiver)} == set(positions)
    for entry in top:  # senders above their receivers
        assert positions[entry.sender][1] < positions[entry.receiver][1]
    page = save_edges(edges, tmp_path / 'edges.html', k=6).read_text()
    assert page.count('<line ') == 6 and all(html.escape(str(entry)) in page for entry in top)
    assert 'atp, 1 step;' in page
    image = Image.open(save_edges(edges, tmp_path / 'edges.png', k=6))
    assert image.size[1] == max(y for _, y in positions.values()) + ROW
