"""conservation(): layer-boundary sums that the rules fix exactly."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from tests.models import decoder_ids, pixels, seq2seq_with_positions, tiny_hf_vit, tiny_model, token_ids
from tests.numbers import assert_close
from zennit_attn import conservation, explain
from zennit_attn.composites import AttnLRPEpsilon, CPLRPEpsilon
from zennit_attn.core import block_stacks

#: the tiny Llama of these tests: :py:func:`tests.models.tiny_model` with 3 blocks, a vocabulary of 50, intermediate
#: size 48 and SDPA attention (the weights of the ``LlamaConfig`` with these sizes built here before)
LLAMA = dict(vocab_size=50, intermediate_size=48, num_hidden_layers=3, attn_implementation='sdpa')


def test_cp_lrp_conserves_at_every_boundary_of_a_bias_free_llama():
    """CP-LRP has no softmax rule and Llama no biases: every boundary carries exactly the logit."""
    model = tiny_model('llama', **LLAMA)
    report = conservation(model, torch.randint(3, 50, (2, 6)), composite=CPLRPEpsilon())
    assert report.names[:3] == ['output of model.layers.2', 'output of model.layers.1', 'output of model.layers.0']
    assert torch.allclose(report.sums[:-1], report.logit.expand(len(report.names) - 1, -1), rtol=1e-10, atol=0)
    assert float(report.sums[-1].abs().max()) == 0.0  # Llama has no position embeddings


def test_attnlrp_leaks_only_inside_blocks_and_matches_explain():
    model = tiny_model('llama', **LLAMA)
    tokens = torch.randint(3, 50, (1, 6))
    report = conservation(model, tokens)
    explanation = explain(model, tokens)
    # the last block's output carries the logit exactly (final RMSNorm and lm_head conserve)
    assert torch.allclose(report.sums[0], report.logit, rtol=1e-10, atol=0)
    # input of the first block == word embeddings (nothing between them in Llama)
    assert torch.allclose(report.sums[-3], report.sums[-2], rtol=1e-10, atol=0)
    assert torch.allclose(report.sums[-2], explanation.relevance.double().sum(1), rtol=1e-10, atol=0)
    # the softmax rule absorbs something in every block
    assert float((report.sums[:-3] - report.sums[1:-2]).abs().min()) > 1e-6
    assert 'word embeddings' in str(report)


def test_position_embeddings_are_reported_separately():
    torch.manual_seed(0)
    model = (
        GPT2LMHeadModel(
            GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=4, n_positions=16, bos_token_id=1, eos_token_id=2)
        )
        .double()
        .eval()
    )
    report = conservation(model, torch.randint(3, 50, (1, 5)))
    assert abs(float(report.sums[-1, 0])) > 1e-6
    # word + position embeddings add up to the input of the first block (dropout is identity in eval mode)
    assert torch.allclose(report.sums[-2:].sum(0), report.sums[-3], rtol=1e-10, atol=0)
    assert torch.allclose(report.input_fraction, report.sums[-3] / report.logit, rtol=1e-10, atol=0)
    assert [name for name, _ in block_stacks(model)] == ['transformer.h']
    assert report.names[:3] == ['output of transformer.h.1', 'output of transformer.h.0', 'input of transformer.h.0']


def test_batch_rows_are_reported_separately():
    """Position embeddings are shared by all rows; each row still gets its own sums."""
    torch.manual_seed(0)
    model = (
        GPT2LMHeadModel(
            GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=4, n_positions=16, bos_token_id=1, eos_token_id=2)
        )
        .double()
        .eval()
    )
    tokens = torch.randint(3, 50, (2, 5))
    both = conservation(model, tokens, composite=CPLRPEpsilon())
    for row in range(2):
        alone = conservation(model, tokens[row : row + 1], composite=CPLRPEpsilon())
        assert torch.allclose(both.sums[:, row], alone.sums[:, 0], rtol=1e-12, atol=0)


def test_encoder_decoder_boundaries_decoder_first():
    """The decoder's blocks are nearer the output: reported first, then the encoder's."""
    model = tiny_model('t5', 'seq2seq')
    report = conservation(model, token_ids('t5', 5), decoder_input_ids=decoder_ids('t5', 3))
    assert report.names == [
        'output of decoder.block.1',
        'output of decoder.block.0',
        'input of decoder.block.0',
        'output of encoder.block.1',
        'output of encoder.block.0',
        'input of encoder.block.0',
        'word embeddings',
        'other embeddings',
    ]


def test_positions_of_pa_lrp_are_a_row_of_their_own():
    """With PA-LRP's positions GPT-2's learned table is an input of the explanation: the relevance it absorbs as one of
    the other embeddings is reported as the positions', and what reaches the input is unchanged."""
    model = tiny_model('gpt2')
    ids = torch.tensor([[5, 17, 3, 28, 9, 14, 22]])
    plain = conservation(model, ids)
    positions = conservation(model, ids, composite=AttnLRPEpsilon(positions=True))
    assert positions.names == [*plain.names, 'positions']
    other, row = plain.names.index('other embeddings'), positions.names.index('positions')
    assert abs(float(plain.sums[other, 0])) > 1e-3
    assert_close(positions.sums[row], plain.sums[other], 1e-10)
    assert float(positions.sums[other, 0]) == 0
    assert_close(positions.input_fraction, plain.input_fraction, 1e-10)


def test_image_models_are_refused_naming_what_to_compare():
    """The report's boundaries are a language model's blocks and embeddings; an image model raised an AttributeError
    from inside (its patch embedding has no ``embedding_dim``)."""
    with pytest.raises(TypeError, match='takes pixels: compare explain'):
        conservation(tiny_hf_vit(), pixels())


def test_positions_of_an_encoder_decoder_are_both_sequences():
    """BART's encoder and decoder tables are both inputs of PA-LRP's explanation: the positions row holds both
    (what the plain report counts among the other embeddings), and with CP-LRP on the bias-free model all of the logit
    reaches the input. Before: the decoder's positions were left out (input fraction -0.04 for a conserving
    explanation)."""
    model = seq2seq_with_positions('bart')
    ids, decoder = torch.tensor([[5, 17, 3, 28, 9, 14, 22]]), torch.tensor([[2, 7, 8]])
    report = conservation(model, ids, decoder_input_ids=decoder, composite=CPLRPEpsilon(positions=True))
    assert_close(report.input_fraction, torch.ones(1, dtype=torch.float64), 1e-12)
    plain = conservation(model, ids, decoder_input_ids=decoder, composite=CPLRPEpsilon())
    other = plain.names.index('other embeddings')
    assert_close(report.sums[report.names.index('positions')], plain.sums[other], 1e-10)
