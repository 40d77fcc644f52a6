"""Vocabulary projection (``zennit_attn.latent.vocabulary_projection``) against the hand computation ``E w``, for
``torch.nn.Linear`` (Llama: weight ``[out, in]``) and transformers' ``Conv1D`` (GPT-2: weight ``[in, out]``)."""

from __future__ import annotations

import pytest
import torch

from tests.latent.helpers import llama
from tests.models import tiny_model
from zennit_attn.latent import Neuron, vocabulary_projection


def check(projection, expected, k):
    assert [token for token, _, _ in projection.top] == expected.topk(k).indices.tolist()
    assert [token for token, _, _ in projection.bottom] == (-expected).topk(k).indices.tolist()
    assert projection.scores.dtype == expected.dtype
    torch.testing.assert_close(projection.scores, expected, rtol=0, atol=1e-12)


def test_vocabulary_projection_linear():
    model = llama()
    projection = vocabulary_projection(model, Neuron('mlp', 1, 5), k=4)
    check(projection, model.lm_head.weight @ model.model.layers[1].mlp.down_proj.weight[:, 5], 4)
    residual = vocabulary_projection(model, Neuron('residual', 2, 3), k=2)
    check(residual, model.lm_head.weight[:, 3], 2)
    with pytest.raises(ValueError, match='attention'):
        vocabulary_projection(model, Neuron('attention', 0, 1))


def test_vocabulary_projection_conv1d():
    """GPT-2's down projection ``c_proj`` is a Conv1D with weight ``[ffn, hidden]``: neuron ``i`` writes row ``i``
    (a column would be the wrong vector, or the wrong size)."""
    model = tiny_model('gpt2')
    down = model.transformer.h[1].mlp.c_proj
    assert type(down).__name__ == 'Conv1D' and down.weight.shape[0] != down.weight.shape[1]
    for index in (0, 5, 31):
        expected = model.lm_head.weight @ down.weight[index]
        check(vocabulary_projection(model, Neuron('mlp', 1, index), k=3), expected, 3)
    check(vocabulary_projection(model, Neuron('residual', 1, 7), k=3), model.lm_head.weight[:, 7], 3)
    with pytest.raises(ValueError, match='index 64 is out of range'):
        vocabulary_projection(model, Neuron('mlp', 1, 64))


def test_float64_scores_are_float64():
    """The scores of a float64 model were computed in float32 (3.8e-10 from ``E w`` on the tiny Llama, enough to
    swap the order of near ties); a bfloat16 model's are float32."""
    model = llama()
    assert next(model.parameters()).dtype == torch.float64
    expected = model.lm_head.weight @ model.model.layers[0].mlp.down_proj.weight[:, 7]
    projection = vocabulary_projection(model, Neuron('mlp', 0, 7), k=100)
    assert projection.scores.dtype == torch.float64 and torch.equal(projection.scores, expected)
    assert [score for _, _, score in projection.top] == expected.sort(descending=True).values.tolist()
    low = tiny_model('llama', dtype=torch.bfloat16)
    assert vocabulary_projection(low, Neuron('mlp', 0, 7)).scores.dtype == torch.float32


@pytest.mark.parametrize('family', ['bert', 'roberta', 'distilbert'])
def test_masked_lm_heads_that_transform_are_refused(family):
    """A masked-language-model head runs a dense layer, an activation and a normalisation between the last block
    and the unembedding: ``E w`` skipped them and was returned as the neuron's vocabulary reading."""
    model = tiny_model(family, 'masked_lm')
    with pytest.raises(ValueError, match='transforms the last block.s output with .*(dense|vocab_transform)'):
        vocabulary_projection(model, Neuron('mlp', 1, 3))
    with pytest.raises(ValueError, match='before its output embeddings'):
        vocabulary_projection(model, Neuron('residual', 2, 3))
