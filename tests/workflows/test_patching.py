"""Relevance and activation patching (zennit_attn.workflows.patching) against hand computations on a tiny random
float64 Llama: activation patching is the metric change of a hand-patched forward pass, relevance patching with the
plain gradient is AtP from torch.autograd.grad, both agree exactly where the model is linear in the activation, and
batches give what pairs give one by one."""

from __future__ import annotations

import re

import pytest
import torch
from PIL import Image

from tests.models import tiny_model, token_ids
from tests.workflows.patching_helpers import ANSWERS, TIGHT, WRONG, difference
from zennit_attn.composites import MLPRules
from zennit_attn.results.render.colors import NEGATIVE, POSITIVE
from zennit_attn.rules import ConstantAttention, HalfGates, ProductRule
from zennit_attn.rules.products import ACTIVATION, SOFTMAX
from zennit_attn.workflows.patching import (
    PATHS,
    TASKS,
    activation_patching,
    agreement_pairs,
    by_template,
    correlation,
    ioi_pairs,
    pair_ids,
    path_weights,
    relevance_patching,
)
from zennit_attn.workflows.patching.tasks import AGREEMENT_OTHER_TEMPLATES, IOI_OTHER_TEMPLATES, task_pairs
from zennit_attn.workflows.patching.view import CELL, circuit_grid, save_circuit
from zennit_attn.workflows.statistics import pearson, spearman


def _o_proj_inputs(model, ids, grad=False):
    """The inputs of each layer's attention output projection (and their plain gradients of the metric)."""
    kept = []
    handles = [
        layer.self_attn.o_proj.register_forward_pre_hook(lambda module, args: kept.append(args[0]))
        for layer in model.model.layers
    ]
    try:
        with torch.set_grad_enabled(grad):
            embeds = model.get_input_embeddings()(ids).detach().requires_grad_(grad)
            value = difference(model(inputs_embeds=embeds).logits)
            grads = torch.autograd.grad(value.sum(), kept) if grad else None
    finally:
        for handle in handles:
            handle.remove()
    return kept, grads


@pytest.mark.parametrize('metric', ['logit_difference', 'log_probability'])
def test_activation_patching_is_the_metric_change_by_hand(llama, pairs, metric):
    clean, corrupted = pairs
    wrong = WRONG if metric == 'logit_difference' else None
    result = activation_patching(
        llama, clean, corrupted, ANSWERS, wrong, metric, components=('attention', 'heads'), progress=False
    )
    source, _ = _o_proj_inputs(llama, corrupted)
    layer, position, head = 1, 4, 2
    width = llama.config.hidden_size // llama.config.num_attention_heads

    def measure(features):
        def patch(module, args):
            patched = args[0].clone()
            patched[:, position, features] = source[layer][:, position, features]
            return (patched,)

        handle = llama.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(patch)
        try:
            with torch.no_grad():
                logits = llama(clean).logits[:, -1]
        finally:
            handle.remove()
        if metric == 'logit_difference':
            return logits.gather(1, ANSWERS[:, None])[:, 0] - logits.gather(1, WRONG[:, None])[:, 0]
        return logits.log_softmax(-1).gather(1, ANSWERS[:, None])[:, 0]

    torch.testing.assert_close(result['attention'][:, layer, position, 0], measure(slice(None)) - result.clean, **TIGHT)
    head_features = slice(head * width, (head + 1) * width)
    torch.testing.assert_close(
        result['heads'][:, layer, position, head], measure(head_features) - result.clean, **TIGHT
    )
    assert (result['attention'][:, :, :2] == 0).all()  # before the corrupted token nothing differs
    assert result['attention'][:, :, 2:].abs().sum() > 0


def test_atp_is_the_plain_gradient_by_hand(llama, pairs):
    clean, corrupted = pairs
    result = relevance_patching(
        llama, clean, corrupted, ANSWERS, WRONG, components=('attention', 'heads'), method='atp', steps=1
    )
    sites, grads = _o_proj_inputs(llama, clean, grad=True)
    source, _ = _o_proj_inputs(llama, corrupted)
    for layer in range(len(sites)):
        product = (source[layer] - sites[layer]) * grads[layer]
        torch.testing.assert_close(result['attention'][:, layer, :, 0], product.sum(-1), **TIGHT)
        heads = product.unflatten(-1, (llama.config.num_attention_heads, -1)).sum(-1)
        torch.testing.assert_close(result['heads'][:, layer], heads, **TIGHT)
    assert result.method == 'atp'
    torch.testing.assert_close(result.clean, difference(llama(clean).logits).detach(), **TIGHT)


@pytest.mark.parametrize('method', ['atp', 'mlp_rules', 'relp', 'attnlrp', 'cplrp'])
def test_exact_where_the_model_is_linear_in_the_activation(method):
    model = tiny_model('llama')
    model.model.norm = torch.nn.Identity().eval()  # the last residual stream -> logits is the linear head only
    clean = token_ids('llama', 6, 3)
    corrupted = clean.flip(1)
    exact = activation_patching(model, clean, corrupted, ANSWERS, WRONG, components=('residual',), progress=False)
    estimate = relevance_patching(model, clean, corrupted, ANSWERS, WRONG, components=('residual',), method=method)
    torch.testing.assert_close(estimate['residual'][:, -1, -1], exact['residual'][:, -1, -1], **TIGHT)
    assert not torch.allclose(estimate['residual'][:, 1], exact['residual'][:, 1])  # non-linear in between


def test_path_integral_converges_to_patching_the_embeddings(llama, pairs):
    """Eq. 3 with the plain gradient: the residual stream before the first block, at the one position where the
    prompts differ, patched is the corrupted run itself, and the path of the input embeddings moves exactly that
    activation: the Riemann sum of path_weights converges to activation patching (error O(1 / steps))."""
    clean, corrupted = pairs
    exact = activation_patching(llama, clean, corrupted, ANSWERS, WRONG, components=('residual',), progress=False)
    errors = []
    for steps in (1, 8, 64):
        estimate = relevance_patching(
            llama, clean, corrupted, ANSWERS, WRONG, components=('residual',), method='atp', steps=steps
        )
        errors.append(float((estimate['residual'][:, 0, 2, 0] - exact['residual'][:, 0, 2, 0]).abs().max()))
    assert errors[2] < errors[1] / 4 < errors[0] / 4
    assert errors[2] < 0.01 * float(exact['residual'][:, 0, 2, 0].abs().max())
    assert path_weights(4) == [(0.0, 0.25), (0.25, 0.25), (0.5, 0.25), (0.75, 0.25)]
    with pytest.raises(ValueError, match='steps must be a positive integer'):
        relevance_patching(llama, clean, corrupted, ANSWERS, WRONG, steps=0)


def test_causal_paths(llama, pairs):
    """Two changed positions (2 and 4): a component at position p in [2, 4) takes its gradients on the path that moves
    the token at 2 alone (by hand; for the embeddings at 2 the Riemann sum converges to activation patching, which
    the straight path, moving the token at 4 as well, does not), a component at p >= 4 those of the straight path;
    with one changed position the two paths are the same."""
    clean, corrupted = pairs
    one = {
        path: relevance_patching(llama, clean, corrupted, ANSWERS, WRONG, components=('residual', 'mlp'), path=path)
        for path in PATHS
    }
    for component in ('residual', 'mlp'):
        torch.testing.assert_close(one['causal'][component], one['straight'][component], rtol=0, atol=0)
    twice = corrupted.clone()
    twice[:, 4] = (twice[:, 4] + 11) % llama.config.vocab_size
    start, end = (llama.get_input_embeddings()(ids).detach() for ids in (clean, twice))
    moving = torch.zeros(1, clean.shape[1], 1, dtype=start.dtype)
    moving[:, :3] = 1  # the tokens up to position 2
    by_hand = 0
    for alpha, weight in path_weights(4):
        point = torch.lerp(start, end, alpha * moving).requires_grad_(True)
        (gradient,) = torch.autograd.grad(difference(llama(inputs_embeds=point).logits).sum(), point)
        by_hand = by_hand + weight * ((end - start) * gradient)[:, 2].sum(-1)
    scores = {
        path: relevance_patching(llama, clean, twice, ANSWERS, WRONG, components=('residual', 'mlp'), path=path)
        for path in PATHS
    }
    torch.testing.assert_close(scores['causal']['residual'][:, 0, 2, 0], by_hand, **TIGHT)
    assert not torch.allclose(scores['straight']['residual'][:, 0, 2, 0], by_hand)
    for component in ('residual', 'mlp'):
        torch.testing.assert_close(
            scores['causal'][component][:, :, 4:], scores['straight'][component][:, :, 4:], **TIGHT
        )
        assert not torch.allclose(scores['causal'][component][:, :, 2:4], scores['straight'][component][:, :, 2:4])
    exact = activation_patching(llama, clean, twice, ANSWERS, WRONG, components=('residual',), progress=False)
    errors = {
        path: float(
            (
                relevance_patching(llama, clean, twice, ANSWERS, WRONG, components=('residual',), steps=64, path=path)[
                    'residual'
                ][:, 0, 2, 0]
                - exact['residual'][:, 0, 2, 0]
            )
            .abs()
            .max()
        )
        for path in PATHS
    }
    assert errors['causal'] < 0.01 * float(exact['residual'][:, 0, 2, 0].abs().max()) < errors['straight']
    with pytest.raises(ValueError, match='unknown path'):
        relevance_patching(llama, clean, corrupted, ANSWERS, WRONG, path='curved')


def test_span_stops_the_path_short(llama, pairs):
    """With ``span=s`` the points are ``alpha = s k / steps``: for the embeddings at the one changed position (the only
    input the path moves) the score is the Riemann sum of the plain gradients at those points by hand, and it
    approaches ``(m(x + s (x' - x)) - m(x)) / s`` as the steps grow."""
    clean, corrupted = pairs
    assert path_weights(4, span=0.5) == [(0.0, 0.25), (0.125, 0.25), (0.25, 0.25), (0.375, 0.25)]
    start, end = (llama.get_input_embeddings()(ids).detach() for ids in (clean, corrupted))
    by_hand = 0
    for alpha, weight in path_weights(4, span=0.5):
        point = torch.lerp(start, end, alpha).requires_grad_(True)
        (gradient,) = torch.autograd.grad(difference(llama(inputs_embeds=point).logits).sum(), point)
        by_hand = by_hand + weight * ((end - start) * gradient)[:, 2].sum(-1)
    estimate = relevance_patching(
        llama, clean, corrupted, ANSWERS, WRONG, components=('residual',), method='atp', steps=4, span=0.5
    )
    torch.testing.assert_close(estimate['residual'][:, 0, 2, 0], by_hand, **TIGHT)
    with torch.no_grad():
        halfway = difference(llama(inputs_embeds=torch.lerp(start, end, 0.5)).logits)
        limit = (halfway - difference(llama(inputs_embeds=start).logits)) / 0.5
    errors = [
        float((relevance_patching(
            llama, clean, corrupted, ANSWERS, WRONG, components=('residual',), steps=steps, span=0.5
        )['residual'][:, 0, 2, 0] - limit).abs().max())
        for steps in (4, 64)
    ]  # fmt: skip
    assert errors[1] < errors[0] / 8
    for span in (0, 1.5, True, '1'):
        with pytest.raises(ValueError, match='span must be a number in'):
            relevance_patching(llama, clean, corrupted, ANSWERS, WRONG, span=span)


@pytest.mark.parametrize('per_position', [True, False])
def test_batches_give_what_pairs_give_one_by_one(llama, pairs, per_position):
    clean, corrupted = pairs
    components = ('residual', 'attention', 'heads', 'mlp')
    together = relevance_patching(llama, clean, corrupted, ANSWERS, WRONG, components=components + ('neurons',))
    exact = activation_patching(
        llama, clean, corrupted, ANSWERS, WRONG, components=components, per_position=per_position, batch_size=5
    )
    for row in range(clean.shape[0]):
        alone = relevance_patching(
            llama, clean[row], corrupted[row], ANSWERS[row], WRONG[row], components=components + ('neurons',)
        )
        single = activation_patching(
            llama, clean[row], corrupted[row], ANSWERS[row], WRONG[row], components=components,
            per_position=per_position, batch_size=1, progress=False,
        )  # fmt: skip
        for component in components:
            torch.testing.assert_close(together[component][row], alone[component][0], **TIGHT)
            torch.testing.assert_close(exact[component][row], single[component][0], **TIGHT)
    # the FFN neurons of a bias-free down projection sum to the MLP output
    torch.testing.assert_close(together['neurons'].sum(-1), together['mlp'][..., 0], **TIGHT)


def test_correlation_and_methods_differ(llama, pairs):
    clean, corrupted = pairs
    exact = activation_patching(llama, clean, corrupted, ANSWERS, WRONG, components=('mlp',), progress=False)
    pearson, spearman, count = correlation(exact, exact, 'mlp')
    assert pearson == pytest.approx(1.0, abs=1e-12) and spearman == pytest.approx(1.0, abs=1e-12)
    assert count == int((exact['mlp'] != 0).sum()) > 3  # the last block's MLP before the last position: exactly 0
    chosen = activation_patching(
        llama, clean, corrupted, ANSWERS, WRONG, components=('mlp',), progress=False, layers=[-1]
    )
    torch.testing.assert_close(chosen['mlp'][:, 1], exact['mlp'][:, 1], **TIGHT)
    assert (chosen['mlp'][:, 0] == 0).all() and (exact['mlp'][:, 0] != 0).any()
    scores = {
        method: relevance_patching(llama, clean, corrupted, ANSWERS, WRONG, components=('mlp',), method=method)['mlp']
        for method in ('atp', 'mlp_rules', 'relp', 'attnlrp', 'cplrp')
    }
    assert not torch.allclose(scores['atp'], scores['relp'])
    assert not torch.allclose(scores['relp'], scores['attnlrp'])
    assert not torch.allclose(scores['relp'], scores['cplrp'])
    assert not torch.allclose(scores['mlp_rules'], scores['atp'])
    assert not torch.allclose(scores['mlp_rules'], scores['attnlrp'])


def test_correlation_pools_groups_of_several_lengths(llama, pairs):
    clean, corrupted = pairs
    short = relevance_patching(llama, clean[:1, 1:], corrupted[:1, 1:], ANSWERS[:1], WRONG[:1], components=('mlp',))
    exact_short = activation_patching(
        llama, clean[:1, 1:], corrupted[:1, 1:], ANSWERS[:1], WRONG[:1], components=('mlp',), progress=False
    )
    full = relevance_patching(llama, clean, corrupted, ANSWERS, WRONG, components=('mlp',))
    exact = activation_patching(llama, clean, corrupted, ANSWERS, WRONG, components=('mlp',), progress=False)
    pooled = correlation([full, short], [exact, exact_short], 'mlp')
    a = torch.cat([full['mlp'].flatten(), short['mlp'].flatten()]).double()
    b = torch.cat([exact['mlp'].flatten(), exact_short['mlp'].flatten()]).double()
    used = (a != 0) | (b != 0)
    assert (
        pooled[2] == int(used.sum()) == correlation(full, exact, 'mlp')[2] + correlation(short, exact_short, 'mlp')[2]
    )
    assert pooled[:2] == pytest.approx((pearson(a[used], b[used]), spearman(a[used], b[used])), abs=1e-12)
    with pytest.raises(ValueError, match='one reference per estimate'):
        correlation([full, short], [exact], 'mlp')
    with pytest.raises(ValueError, match='shapes'):
        correlation([full, short], [exact_short, exact], 'mlp')


def test_refusals(llama, pairs):
    clean, corrupted = pairs
    with pytest.raises(ValueError, match='same shape'):
        relevance_patching(llama, clean, corrupted[:, :-1], ANSWERS, WRONG)
    with pytest.raises(ValueError, match='unknown relevance patching method'):
        relevance_patching(llama, clean, corrupted, ANSWERS, WRONG, method='gradient')
    with pytest.raises(ValueError, match='needs wrong='):
        relevance_patching(llama, clean, corrupted, ANSWERS)
    with pytest.raises(ValueError, match='unknown component'):
        activation_patching(llama, clean, corrupted, ANSWERS, WRONG, components=('edges',))
    with pytest.raises(ValueError, match='one token id per prompt pair'):
        activation_patching(llama, clean, corrupted, ANSWERS[:2], WRONG[:2])
    with pytest.raises(ValueError, match='no "mlp" site'):
        relevance_patching(tiny_model('mixtral'), clean, corrupted, ANSWERS, WRONG, components=('mlp',))


@pytest.mark.parametrize('patching', [relevance_patching, activation_patching])
@pytest.mark.parametrize(
    'arguments, match',
    [
        (dict(clean=[], corrupted=[]), r'clean holds no token ids \(shape \(0,\)\)'),
        (dict(clean=torch.zeros(0, 4, dtype=torch.long)), r'clean holds no token ids \(shape \(0, 4\)\)'),
        (dict(clean=torch.zeros(3, 0, dtype=torch.long)), r'clean holds no token ids \(shape \(3, 0\)\)'),
        (dict(corrupted=torch.full((3, 6), 100)), 'corrupted holds ids from 100 to 100, but the vocabulary'),
        (dict(answers=torch.tensor([1, 100, 3])), r"answers= holds the token id 100, outside the model's 100 logits"),
        (dict(wrong=torch.tensor([4, 5, 1000])), r"wrong= holds the token id 1000, outside the model's 100 logits"),
        (dict(answers=-1), 'answers= holds the negative token id -1'),
    ],
)
def test_empty_pairs_and_ids_outside_the_vocabulary_are_refused(llama, pairs, patching, arguments, match):
    """Before: raw reshape and index errors (``cannot reshape tensor of 0 elements``, ``index 100 is out of
    bounds``)."""
    clean, corrupted = pairs
    given = dict(clean=clean, corrupted=corrupted, answers=ANSWERS, wrong=WRONG)
    given.update(arguments)
    extra = {'progress': False} if patching is activation_patching else {}
    with pytest.raises(ValueError, match=match):
        patching(llama, **given, **extra)


def test_layers_have_one_numbering_for_every_component(llama, pairs):
    """Layer l is block l for every component (the residual stream entering it), -1 the last block; the residual
    stream's extra layer L (leaving the last block) is refused with components that do not have it. Before,
    ``layers=[2]`` of 2 blocks was refused for ``('attention',)`` but accepted with ``('residual', 'attention')``,
    where the attention scores came back all 0."""
    clean, corrupted = pairs
    blocks = llama.config.num_hidden_layers
    both = ('residual', 'attention')
    full = activation_patching(llama, clean, corrupted, ANSWERS, WRONG, components=both, progress=False)
    for layers, patched in (([1], 1), ([-1], blocks - 1), ([0], 0)):
        chosen = activation_patching(
            llama, clean, corrupted, ANSWERS, WRONG, components=both, progress=False, layers=layers
        )
        for component in both:
            torch.testing.assert_close(chosen[component][:, patched], full[component][:, patched], **TIGHT)
            others = [layer for layer in range(chosen[component].shape[1]) if layer != patched]
            assert (chosen[component][:, others] == 0).all()
    last = activation_patching(
        llama, clean, corrupted, ANSWERS, WRONG, components=('residual',), progress=False, layers=[blocks]
    )
    torch.testing.assert_close(last['residual'][:, blocks], full['residual'][:, blocks], **TIGHT)
    for components in (('attention',), both, ('attention', 'residual')):
        with pytest.raises(
            ValueError,
            match=rf"layers=\[{blocks}\]: 'attention' has no layer {blocks} \(of {blocks} "
            rf'blocks\); its layers are 0 to {blocks - 1}',
        ):
            activation_patching(
                llama, clean, corrupted, ANSWERS, WRONG, components=components, progress=False, layers=[blocks]
            )
    with pytest.raises(ValueError, match=rf"layers=\[{-blocks - 1}\]: 'residual' has no layer {-blocks - 1}"):
        activation_patching(
            llama, clean, corrupted, ANSWERS, WRONG, components=both, progress=False, layers=[-blocks - 1]
        )
    with pytest.raises(ValueError, match='layers must be a non-empty list of integers'):
        activation_patching(llama, clean, corrupted, ANSWERS, WRONG, components=both, progress=False, layers=[])


def test_half_gates_rule_and_the_plain_engine_is_atp(llama, pairs):
    rule = HalfGates()
    assert rule.shares([ACTIVATION, None]) == (0.5, 0.5)  # silu(gate) * up
    assert rule.shares([SOFTMAX, None]) == (1.0, 1.0) and rule.shares([None, None]) == (1.0, 1.0)  # the gradient
    clean, corrupted = pairs
    components = ('residual', 'heads', 'mlp')
    atp = relevance_patching(llama, clean, corrupted, ANSWERS, WRONG, components=components, method='atp')

    class Gradient(ProductRule):  # every factor its whole gradient
        needs_kinds = False

        def shares(self, kinds):
            return (1.0,) * len(kinds)

    class Plain(MLPRules):  # every rule off (an activation's output is a gate still: it is one, whatever its rule)
        activation_rule = None
        product_rule = Gradient()

    plain = relevance_patching(llama, clean, corrupted, ANSWERS, WRONG, components=components, method=Plain())
    for component in components:
        torch.testing.assert_close(plain[component], atp[component], **TIGHT)


def test_constant_attention_rule():
    rule = ConstantAttention()
    assert rule.shares([SOFTMAX, None]) == (0.0, 1.0)  # A V: linear in V
    assert rule.shares([ACTIVATION, None]) == (0.5, 0.5)  # silu(gate) * up: the half rule
    assert rule.shares([None, None]) == (0.5, 0.5)  # q k^T
    assert rule.shares([SOFTMAX, SOFTMAX]) == (0.5, 0.5)


class WordTokenizer:
    """Words with their leading space and punctuation as tokens (ids from a growing table)."""

    def __init__(self):
        self.table = {}

    def encode(self, text, add_special_tokens=False):
        return [self.table.setdefault(piece, len(self.table)) for piece in re.findall(r' ?\w+|[^\w\s]', text)]


def test_tasks_are_deterministic_pairs_of_one_length():
    tokenizer = WordTokenizer()
    ioi = ioi_pairs(tokenizer, 24, seed=3)
    assert ioi == ioi_pairs(tokenizer, 24, seed=3) != ioi_pairs(tokenizer, 24, seed=4)
    first = ioi[0]
    assert first.answer in first.clean and first.wrong in first.clean and first.clean.count(first.wrong) == 2
    assert first.corrupted.count(first.wrong) == 1
    abc = ioi_pairs(tokenizer, 4, corruption='abc')
    assert all(name not in pair.corrupted for pair in abc for name in (pair.answer, pair.wrong))
    assert pair_ids(tokenizer, abc)['clean'].shape == pair_ids(tokenizer, abc)['corrupted'].shape
    agreement = agreement_pairs(tokenizer, 8)
    assert {pair.answer for pair in agreement} == {' is', ' are'}
    ids = pair_ids(tokenizer, agreement)
    assert ids['clean'].shape == ids['corrupted'].shape == (8, 5)
    assert ((ids['clean'] != ids['corrupted']).sum(1) == 1).all()
    both = agreement_pairs(tokenizer, 8, corruption='both')
    ids = pair_ids(tokenizer, both)
    assert ((ids['clean'] != ids['corrupted']).sum(1) == 2).all()
    assert [(pair.clean, pair.answer) for pair in both] == [(pair.clean, pair.answer) for pair in agreement]
    assert {pair.task for pair in both} == {'agreement_both'}


def test_tasks_of_other_templates_group_by_template():
    tokenizer = WordTokenizer()
    for task in TASKS:
        others = IOI_OTHER_TEMPLATES if task.startswith('ioi') else AGREEMENT_OTHER_TEMPLATES
        pairs = task_pairs(tokenizer, task, 12, templates=others[:3])
        assert {pair.task for pair in pairs} == {task}
        groups = by_template(pairs)
        assert [group[0].template for group in groups] == list(others[:3])
        assert [len(group) for group in groups] == [4, 4, 4]
        for group in groups:  # one length per template: each group batches
            ids = pair_ids(tokenizer, group)
            changed = (ids['clean'] != ids['corrupted']).sum(1)
            assert (changed == {'ioi': 1, 'ioi_abc': 3, 'agreement': 1, 'agreement_both': 2}[task]).all()
        assert task_pairs(tokenizer, task, 4) == task_pairs(tokenizer, task, 4, seed=0)
    mixed = task_pairs(tokenizer, 'ioi', 8, templates=IOI_OTHER_TEMPLATES)
    with pytest.raises(ValueError, match='lengths'):
        pair_ids(tokenizer, mixed)
    with pytest.raises(ValueError, match='unknown task'):
        task_pairs(tokenizer, 'greater_than', 4)
    with pytest.raises(ValueError, match='unknown agreement corruption'):
        agreement_pairs(tokenizer, 4, corruption='attractor')
    with pytest.raises(ValueError, match='must hold each of'):
        ioi_pairs(tokenizer, 4, templates=['When{a} and{b} went to the store, they gave a drink to'])
    with pytest.raises(ValueError, match='empty'):
        agreement_pairs(tokenizer, 4, templates=[])


def test_circuit_view(llama, pairs, tmp_path):
    clean, corrupted = pairs
    scores = relevance_patching(llama, clean, corrupted, ANSWERS, WRONG)
    columns, grid = circuit_grid(scores)
    heads = llama.config.num_attention_heads
    assert columns == ['residual', 'attention', 'mlp', *(f'head {index}' for index in range(heads))]
    assert grid.shape == (llama.config.num_hidden_layers + 1, 3 + heads)
    torch.testing.assert_close(grid[:, 0], scores.summed('residual').mean(0)[:, 0], **TIGHT)
    assert grid[-1, 1:].isnan().all()  # the residual stream has one layer more than the blocks
    image = Image.open(save_circuit(scores, tmp_path / 'view.png'))
    largest = grid[~grid.isnan()].abs().argmax()
    row, column = divmod(int(largest), grid.shape[1])
    cell = image.getpixel((4 * CELL + column * CELL + CELL // 2, 2 * CELL + row * CELL + CELL // 2))
    assert cell in (POSITIVE, NEGATIVE)  # the largest score in the saturated colour
    page = save_circuit(scores, tmp_path / 'view.html', k=3).read_text()
    assert page.count('<li>') == 3 and str(scores.top(1)[0]) in page
    with pytest.raises(ValueError):
        save_circuit(scores, tmp_path / 'view.svg')
