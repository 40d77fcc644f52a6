"""Reference samples (``zennit_attn.latent.reference_samples``): the streamed top-k equals brute force over the same
texts one at a time, padding is never reported, several units of one site and layer are recorded in one pass, and
the model is checked before the first text is read."""

from __future__ import annotations

import pytest
import torch

from tests.latent.helpers import llama
from tests.text_tokenizer import byte_level_tokenizer
from zennit_attn import explain
from zennit_attn.composites import CompiledModelError
from zennit_attn.latent import Neuron, reference_samples, steer
from zennit_attn.latent.references import BY


def corpus(count=23):
    words = [
        'The ice bear lives in the Arctic.',
        'seals and fish',
        'the penguin lives in the south',
        'Question: where does the bear live?',
        'Answer: in the north.',
        'bear bear lives',
    ]
    return [
        ' '.join(words[(index * 7 + offset) % len(words)] for offset in range(1 + index % 3)) for index in range(count)
    ]


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

    refs = reference_samples(
        model, tokenizer, stream(), neurons, k=4, by=by, batch_size=5, max_length=16, explain=False, progress=False
    )
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
        torch.testing.assert_close(
            torch.tensor([entry.score for entry in got]),
            torch.tensor([score for score, _, _ in best]),
            rtol=1e-6,
            atol=1e-9,
        )
        assert len(got) == 4


def test_reference_samples_explained_and_rendered():
    model, tokenizer = llama(), byte_level_tokenizer()
    neuron = Neuron('mlp', 1, 5)
    refs = reference_samples(model, tokenizer, corpus(8), [neuron], k=2, batch_size=3, max_length=16, progress=False)
    for entry in refs[neuron]:
        # a padded batch against one text: equal up to the rounding of a different batch layout
        torch.testing.assert_close(
            entry.explanation.logit[0], torch.tensor(entry.activation, dtype=torch.float64), rtol=1e-6, atol=1e-9
        )
        assert int(entry.explanation.position[0]) == entry.position
    html = refs[neuron].to_html()
    assert 'ActMax references of mlp[1, 5]' in html and '#2' in html


def test_references_never_sit_on_padding():
    """Batches of texts of different lengths (right-padded): the neuron's activation is shifted below 0 at every
    real token, so a padding position (recorded as 0) would win if it were not excluded. The references equal
    brute force over the texts one at a time, without padding."""
    model, tokenizer = llama(), byte_level_tokenizer()
    texts = corpus(11)
    neuron = Neuron('mlp', 1, 5)
    lengths = [len(tokenizer(text, truncation=True, max_length=16)['input_ids']) for text in texts]
    assert len(set(lengths)) > 1
    with steer(model, {neuron: -100.0}, mode='add'):
        refs = reference_samples(
            model, tokenizer, texts, [neuron], k=len(texts), batch_size=4, max_length=16, explain=False, progress=False
        )[neuron]
        expected = []
        for text in texts:
            ids = torch.tensor([tokenizer(text, truncation=True, max_length=16)['input_ids']])
            values = explain(model, ids, latent='mlp').latent.activation['mlp'][0, 1, :, 5]
            assert float(values.max()) < 0
            expected.append((float(values.max()), int(values.argmax())))
    assert len(refs) == len(texts)
    for entry in refs:
        assert 0 <= entry.position < len(entry.input_ids) == lengths[texts.index(entry.text)]
        score, position = expected[texts.index(entry.text)]
        assert entry.position == position
        assert entry.score == pytest.approx(score, rel=1e-9) and entry.activation == entry.score


@pytest.mark.parametrize('by', BY)
def test_units_of_one_site_and_layer_together_equal_each_alone(by):
    model, tokenizer = llama(), byte_level_tokenizer()
    neurons = [Neuron('mlp', 0, 1), Neuron('mlp', 0, 2), Neuron('attention', 1, 0), Neuron('attention', 1, 3)]
    options = dict(k=3, by=by, batch_size=4, max_length=16, explain=False, progress=False)
    together = reference_samples(model, tokenizer, corpus(9), neurons, **options)
    for neuron in neurons:
        alone = reference_samples(model, tokenizer, corpus(9), [neuron], **options)[neuron]
        assert [(entry.text, entry.position, entry.score, entry.activation) for entry in together[neuron]] == [
            (entry.text, entry.position, entry.score, entry.activation) for entry in alone
        ]


def test_the_model_is_checked_before_the_first_text():
    """A model in training mode (dropout would make the ranking random) or a compiled one is refused before the
    stream is read, for both rankings, with and without the explanations."""
    model, tokenizer = llama(), byte_level_tokenizer()
    consumed = []

    def stream():
        for text in corpus(6):
            consumed.append(text)
            yield text

    model.train()
    for by in BY:
        for explained in (False, True):
            with pytest.raises(ValueError, match='training mode.*model.eval'):
                reference_samples(
                    model, tokenizer, stream(), [Neuron('mlp', 1, 5)], by=by, explain=explained, progress=False
                )
    model.eval()
    with pytest.raises(CompiledModelError):
        reference_samples(torch.compile(model), tokenizer, stream(), [Neuron('mlp', 1, 5)], progress=False)
    assert consumed == []
