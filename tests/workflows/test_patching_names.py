"""The names circuit users know (issue 43): the directions of activation and relevance patching (denoising and noising,
Heimersheim and Nanda 2024), metrics of the full logits (FullLogits), TransformerLens's site names and hook names,
and module paths as components, each against what the math fixes on tiny random float64 models."""

from __future__ import annotations

import pytest
import torch

from tests.models import tiny_model, token_ids
from zennit_attn.workflows.patching import FullLogits, activation_patching, correlation, relevance_patching

TIGHT = dict(rtol=1e-9, atol=1e-12)
ANSWERS, WRONG = torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6])


# ------------------------------------------------------------------------------------------------ directions
@pytest.mark.parametrize('direction', ['denoising', 'noising'])
def test_patching_a_whole_residual_stream_gives_the_other_run(llama, pairs, direction):
    """Every position of the residual stream entering a block patched: denoising (clean into corrupted) restores the
    clean metric, noising (corrupted into clean) gives the corrupted metric; the score is the change from the run's
    own metric."""
    clean, corrupted = pairs
    result = activation_patching(
        llama,
        clean,
        corrupted,
        ANSWERS,
        WRONG,
        components=('residual',),
        per_position=False,
        progress=False,
        direction=direction,
    )
    assert result.direction == direction
    change = result.clean - result.corrupted
    expected = change if direction == 'denoising' else -change
    assert bool((change.abs() > 1e-6).all())  # the pairs differ in their metric: the test can fail
    for layer in range(1, llama.config.num_hidden_layers + 1):
        torch.testing.assert_close(result['residual'][:, layer, 0], expected, **TIGHT)


def test_denoising_is_noising_of_the_exchanged_pairs(llama, pairs):
    """Denoising patches the clean activations into the corrupted run: noising with clean and corrupted exchanged,
    for activation patching and for relevance patching (the gradient at the corrupted run, the path from it)."""
    clean, corrupted = pairs
    options = dict(components=('attention', 'mlp'), progress=False)
    denoised = activation_patching(llama, clean, corrupted, ANSWERS, WRONG, direction='denoising', **options)
    exchanged = activation_patching(llama, corrupted, clean, ANSWERS, WRONG, **options)
    estimate = relevance_patching(
        llama, clean, corrupted, ANSWERS, WRONG, components=('attention', 'mlp'), steps=2, direction='denoising'
    )
    reverse = relevance_patching(llama, corrupted, clean, ANSWERS, WRONG, components=('attention', 'mlp'), steps=2)
    for kind in ('attention', 'mlp'):
        torch.testing.assert_close(denoised[kind], exchanged[kind], **TIGHT)
        torch.testing.assert_close(estimate[kind], reverse[kind], **TIGHT)
    torch.testing.assert_close(denoised.clean, exchanged.corrupted, **TIGHT)
    torch.testing.assert_close(estimate.clean, reverse.corrupted, **TIGHT)
    torch.testing.assert_close(estimate.corrupted, reverse.clean, **TIGHT)
    noised = relevance_patching(llama, clean, corrupted, ANSWERS, WRONG, components=('attention',), steps=1)
    with pytest.raises(ValueError, match='different directions'):
        correlation(noised, denoised, 'attention')
    with pytest.raises(ValueError, match='unknown patching direction .*denoising'):
        activation_patching(llama, clean, corrupted, ANSWERS, WRONG, direction='clean_to_corrupted')


# ------------------------------------------------------------------------------------------------ metrics
def _second_position(logits):
    """A metric of a non-final position, the same for every row (a callable metric does not know the rows): the
    logit difference of tokens 3 and 7 at position 2, where the prompts of a pair differ."""
    return logits[:, 2, 3] - logits[:, 2, 7]


def test_a_metric_of_the_full_logits_reads_any_position(llama, pairs):
    """FullLogits hands the [n, seq, vocab] logits to the function: activation patching of the residual stream at
    position 2 of block 1 is the hand-patched forward pass's change of the metric at position 2 (the later positions,
    whose activations differ too, change nothing of it), and relevance patching (AtP, one step) is the plain gradient
    of that metric by hand."""
    clean, corrupted = pairs
    metric = FullLogits(_second_position)
    exact = activation_patching(llama, clean, corrupted, metric=metric, components=('residual',), progress=False)
    estimate = relevance_patching(llama, clean, corrupted, metric=metric, components=('residual',), steps=1)
    block = llama.model.layers[1]
    kept = {}
    handle = block.register_forward_pre_hook(lambda module, args: kept.setdefault('source', args[0]))
    try:
        with torch.no_grad():
            llama(corrupted)
    finally:
        handle.remove()

    def patch(module, args):
        patched = args[0].clone()
        patched[:, 2] = kept['source'][:, 2]
        return (patched,)

    handle = block.register_forward_pre_hook(patch)
    try:
        with torch.no_grad():
            patched = _second_position(llama(clean).logits)
    finally:
        handle.remove()
    with torch.no_grad():
        reference = _second_position(llama(clean).logits)
    torch.testing.assert_close(exact['residual'][:, 1, 2, 0], patched - reference, **TIGHT)
    torch.testing.assert_close(exact.clean, reference, **TIGHT)
    assert bool((exact['residual'][:, 1, 2, 0].abs() > 1e-6).all())
    assert bool((kept['source'][:, 3:] != clean_site(llama, clean, block)[:, 3:]).any())
    assert bool((exact['residual'][:, 1, 3:, 0] == 0).all())  # position 2 does not see later positions
    # AtP by hand: the gradient of the metric at the input of block 1
    inputs = {}
    handle = block.register_forward_pre_hook(lambda module, args: inputs.setdefault('site', args[0]))
    try:
        value = _second_position(llama(clean).logits)
        (gradient,) = torch.autograd.grad(value.sum(), inputs['site'])
    finally:
        handle.remove()
    by_hand = ((kept['source'] - inputs['site']) * gradient).sum(-1)
    torch.testing.assert_close(estimate['residual'][:, 1, :, 0], by_hand, **TIGHT)


def clean_site(model, ids, block):
    """The input of ``block`` in the forward pass of ``ids``."""
    kept = {}
    handle = block.register_forward_pre_hook(lambda module, args: kept.setdefault('site', args[0]))
    try:
        with torch.no_grad():
            model(ids)
    finally:
        handle.remove()
    return kept['site']


def test_full_logits_metric_refusals(llama, pairs):
    clean, corrupted = pairs
    with pytest.raises(TypeError, match='FullLogits needs a callable'):
        FullLogits('logit')
    with pytest.raises(ValueError, match='one value per row'):
        activation_patching(llama, clean, corrupted, metric=FullLogits(lambda logits: logits[:, :, 0]), progress=False)
    with pytest.raises(ValueError, match='pass no answers'):
        relevance_patching(llama, clean, corrupted, ANSWERS, metric=FullLogits(lambda logits: logits[:, 0, 0]))


@pytest.fixture(scope='module')
def gpt2():
    return tiny_model('gpt2')


@pytest.fixture(scope='module')
def gpt2_pairs(gpt2):
    clean = token_ids('gpt2', 6, 3)
    corrupted = clean.clone()
    corrupted[:, 2] = (corrupted[:, 2] + 7) % gpt2.config.vocab_size
    return clean, corrupted
