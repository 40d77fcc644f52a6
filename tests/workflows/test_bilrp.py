"""Second-order relevance of similarity models (:py:mod:`zennit_attn.workflows.bilrp`): the token-pair matrix
sums to the similarity (CP-LRP, no biases), equals the BiLRP formula written out on an encoder whose embedding is
linear in its tokens, does not depend on the batching of the dimensions or on the order of the pair, and is shown as
a matrix and as linked tokens."""

from __future__ import annotations

import pytest
import torch
import transformers

from tests.models import tiny_model
from tests.text_tokenizer import byte_level_tokenizer
from zennit_attn.composites import AttnLRPEpsilon, CPLRPEpsilon
from zennit_attn.workflows.bilrp import explain_similarity

A, B = 'the cat sat on the mat', 'a cat lay on a rug'


def tiny_encoder() -> torch.nn.Module:
    """A tiny random BERT (the base model, no head) in float64 with every bias and the position and token-type
    tables zeroed: nothing absorbs relevance."""
    model = tiny_model('bert', head='base', zero_bias=True)
    with torch.no_grad():
        model.embeddings.position_embeddings.weight.zero_()
        model.embeddings.token_type_embeddings.weight.zero_()
    return model


@pytest.mark.parametrize('similarity', ['cosine', 'dot'])
@pytest.mark.parametrize('pooling', ['mean', 'cls'])
def test_cplrp_pair_relevance_sums_to_the_similarity(similarity, pooling):
    found = explain_similarity(
        tiny_encoder(), A, B, byte_level_tokenizer(), pooling=pooling, similarity=similarity, composite=CPLRPEpsilon()
    )
    assert float(found.relevance.sum()) == pytest.approx(found.score, rel=1e-9, abs=1e-12)
    assert found.relevance.shape == (len(found.labels_a), len(found.labels_b))


def test_batching_and_order_do_not_change_the_relevance():
    model, tokenizer = tiny_encoder(), byte_level_tokenizer()
    whole = explain_similarity(model, A, B, tokenizer, batch_size=64)
    batched = explain_similarity(model, A, B, tokenizer, batch_size=5)
    swapped = explain_similarity(model, B, A, tokenizer, batch_size=7)
    torch.testing.assert_close(batched.relevance, whole.relevance, rtol=1e-10, atol=1e-13)
    torch.testing.assert_close(swapped.relevance, whole.relevance.T, rtol=1e-10, atol=1e-13)
    assert swapped.score == pytest.approx(whole.score)


@pytest.mark.parametrize(
    'arguments, match',
    [
        (dict(a=[A, B]), r'a= is a list of 2 items: explain_similarity compares one input with one other'),
        (dict(b=None), 'b= is None: explain_similarity compares two inputs'),
        (dict(batch_size=0), 'batch_size must be a positive integer .* got 0'),
        (dict(batch_size=2.5), 'batch_size must be a positive integer .* got 2.5'),
        (dict(a=''), "a='' gives no tokens: nothing to explain"),
        (dict(b=torch.zeros(3, 8, 8).numpy()), 'b= is an image \\(ndarray\\), which needs the processor'),
    ],
)
def test_arguments_are_refused_by_name(arguments, match):
    """Before: "an image needs the processor" for a list of texts or None, ``range()`` and reshape errors."""
    given = dict(a=A, b=B, batch_size=64) | arguments
    with pytest.raises(ValueError, match=match):
        explain_similarity(
            tiny_encoder(), given['a'], given['b'], byte_level_tokenizer(), batch_size=given['batch_size']
        )


class Output:
    def __init__(self, last_hidden_state):
        self.last_hidden_state = last_hidden_state


class LinearEncoder(torch.nn.Module):
    """Token vectors projected by ``W``: the mean-pooled embedding is linear in the tokens."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.words = torch.nn.Embedding(100, 6)
        self.project = torch.nn.Linear(6, 5, bias=False)
        self.training = False

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.words

    def forward(self, input_ids, attention_mask):
        return Output(self.project(self.words(input_ids)))


def test_pair_relevance_is_the_bilrp_formula():
    """For ``e = (1/n) sum_i W x_i`` the pair relevance is ``R_ij = sum_k (W x_i)_k (W y_j)_k / (n m)``, divided by
    the norms for the cosine."""
    model, tokenizer = LinearEncoder().double(), byte_level_tokenizer()
    found = explain_similarity(model, A, B, tokenizer, composite=AttnLRPEpsilon())
    with torch.no_grad():
        a, b = (model.project(model.words(tokenizer(text, return_tensors='pt')['input_ids'][0])) for text in (A, B))
        expected = a @ b.T / (len(a) * len(b))
        expected = expected / (a.mean(0).norm() * b.mean(0).norm())
    torch.testing.assert_close(found.relevance, expected, rtol=1e-12, atol=1e-14)


def test_views_link_the_tokens(tmp_path):
    found = explain_similarity(tiny_encoder(), A, B, byte_level_tokenizer())
    page = found.html()
    spans = [page.count(f'class="za-t" data-side="{side}"') for side in 'ab']
    assert spans == [len(found.labels_a), len(found.labels_b)]
    assert found.top_pairs(3)[0][2] == pytest.approx(float(found.relevance.max()))
    found.figure(tmp_path / 'pairs.png')
    found.figure(tmp_path / 'pairs.html')
    assert (tmp_path / 'pairs.png').stat().st_size > 1000 and 'mouseenter' in (tmp_path / 'pairs.html').read_text()


def test_refusals():
    model, tokenizer = tiny_encoder(), byte_level_tokenizer()
    with pytest.raises(ValueError, match='similarity must be one of'):
        explain_similarity(model, A, B, tokenizer, similarity='euclidean')
    with pytest.raises(ValueError, match='a= is a text, which needs its tokenizer'):
        explain_similarity(model, A, B)
    with pytest.raises(ValueError, match="pooling='features' needs a model with get_text_features"):
        explain_similarity(model, A, B, tokenizer, pooling='features')


def test_text_image_pairs_of_a_clip_model():
    """CLIP-like models: token x patch relevance (pixels summed per patch of the vision tower) that CP-LRP conserves
    with every bias, position table and class embedding zeroed."""
    torch.manual_seed(0)
    config = transformers.CLIPConfig(
        text_config=dict(
            vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2
        ),
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=16,
            patch_size=4,
        ),
        projection_dim=16,
    )
    model = transformers.CLIPModel(config).double().eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith('bias') or 'position_embedding' in name or 'class_embedding' in name:
                parameter.zero_()
    pixels = torch.randn(1, 3, 16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    found = explain_similarity(model, 'a cat', pixels, byte_level_tokenizer(), composite=CPLRPEpsilon())
    assert found.relevance.shape == (len(found.labels_a), 16) and found.labels_b[1] == 'patch (0, 1)'
    assert float(found.relevance.sum()) == pytest.approx(found.score, rel=1e-9)


def test_a_composite_with_positions_is_refused():
    """BiLRP reads the relevance of the tokens of each input: PA-LRP's positions (a composite with
    ``positions=True``) would take a share that no pair holds. Before: accepted, the positions' share dropped
    without a word (CP-LRP on the BERT with a random table: pairs summing to 0.0015 for a similarity of 0.898, as
    without positions)."""
    with pytest.raises(ValueError, match='positions=True'):
        explain_similarity(tiny_encoder(), A, B, byte_level_tokenizer(), composite=CPLRPEpsilon(positions=True))
