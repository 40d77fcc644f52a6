"""zennit_attn.integrations.captum: AttnLRP and CP-LRP as captum attribution methods, on their own and inside captum's
LLMGradientAttribution, equal to explain(); and their refusals."""

import pytest
import torch
from captum.attr import LayerGradientXActivation, LLMAttributionResult, LLMGradientAttribution, TextTokenInput

from tests.models import tiny_hf_vit, tiny_model, two_tables
from tests.numbers import assert_close
from tests.text_tokenizer import byte_level_tokenizer
from zennit_attn import explain
from zennit_attn.composites import AttnLRPEpsilon
from zennit_attn.integrations.captum import CPLRP, AttnLRP

PROMPT = 'The ice bear lives in the'
ANSWER = ' Arctic.'


@pytest.fixture(scope='module')
def model():
    return tiny_model('llama')  # float64, eager attention


@pytest.fixture(scope='module')
def tokenizer():
    return byte_level_tokenizer(bos=True)


def per_target_explanations(model, tokenizer, method='attnlrp', **kwargs):
    """explain() of every answer token after the prompt and the answer tokens before it."""
    ids = tokenizer(PROMPT, return_tensors='pt').input_ids
    answer = tokenizer.encode(ANSWER, add_special_tokens=False)
    assert len(answer) > 1  # the test covers the appended target prefix
    rows = []
    for index, token in enumerate(answer):
        prefix = torch.cat([ids, torch.tensor([answer[:index]], dtype=torch.long)], 1)
        rows.append(explain(model, prefix, target=token, method=method, **kwargs).relevance[0, : ids.shape[1]])
    return torch.stack(rows), answer


@pytest.mark.parametrize('cls, method', [(AttnLRP, 'attnlrp'), (CPLRP, 'cplrp')])
def test_llm_gradient_attribution_equals_explain(model, tokenizer, cls, method):
    result = LLMGradientAttribution(cls(model), tokenizer).attribute(TextTokenInput(PROMPT, tokenizer), target=ANSWER)
    expected, answer = per_target_explanations(model, tokenizer, method)
    assert isinstance(result, LLMAttributionResult)
    assert result.token_attr.dtype == torch.float64
    assert_close(result.token_attr, expected)
    assert_close(result.seq_attr, expected.sum(0))
    assert result.input_tokens == tokenizer.convert_ids_to_tokens(tokenizer(PROMPT).input_ids)
    assert len(result.output_tokens) == len(answer)


def test_cplrp_is_not_attnlrp(model, tokenizer):
    """The two adapters run different methods (else the test above could not tell them apart)."""
    attnlrp, _ = per_target_explanations(model, tokenizer, 'attnlrp')
    cplrp, _ = per_target_explanations(model, tokenizer, 'cplrp')
    assert float((attnlrp - cplrp).abs().max()) > 1e-3 * float(attnlrp.abs().max())


def test_not_captums_gradient_x_activation(model, tokenizer):
    """AttnLRP is not captum's own gradient x activation at the same layer (which explains the log-probability)."""
    inp = TextTokenInput(PROMPT, tokenizer)
    ours = LLMGradientAttribution(AttnLRP(model), tokenizer).attribute(inp, target=ANSWER).token_attr
    theirs = (
        LLMGradientAttribution(LayerGradientXActivation(model, model.get_input_embeddings()), tokenizer)
        .attribute(inp, target=ANSWER)
        .token_attr
    )
    assert float((ours - theirs).abs().max()) > 1e-3 * float(ours.abs().max())


def test_skip_tokens(model, tokenizer):
    """captum's skip_tokens drop the skipped token's column; the others keep explain()'s numbers."""
    result = LLMGradientAttribution(AttnLRP(model), tokenizer).attribute(
        TextTokenInput(PROMPT, tokenizer, skip_tokens=['<s>']), target=ANSWER
    )
    expected, _ = per_target_explanations(model, tokenizer)
    assert_close(result.token_attr, expected[:, 1:])
    assert result.input_tokens[0] == 'The'


def test_composite(model, tokenizer):
    composite_kwargs = dict(epsilon=1e-2)
    result = LLMGradientAttribution(AttnLRP(model, composite=AttnLRPEpsilon(**composite_kwargs)), tokenizer).attribute(
        TextTokenInput(PROMPT, tokenizer), target=ANSWER
    )
    expected, _ = per_target_explanations(model, tokenizer, composite=AttnLRPEpsilon(**composite_kwargs))
    default, _ = per_target_explanations(model, tokenizer)
    assert_close(result.token_attr, expected)
    assert float((expected - default).abs().max()) > 1e-6 * float(default.abs().max())


def test_plots(model, tokenizer):
    """captum's two plots of an adapter's result show explain()'s numbers, read back from the matplotlib artists: the
    heatmap's pixels and the value written in each cell are the relevance of every prompt token (columns) for every
    answer token (rows), and the bars (a positive and a negative part per prompt token) add up to the sequence
    relevance."""
    matplotlib = pytest.importorskip('matplotlib')
    matplotlib.use('Agg')
    pyplot = pytest.importorskip('matplotlib.pyplot')
    result = LLMGradientAttribution(AttnLRP(model), tokenizer).attribute(
        TextTokenInput(PROMPT, tokenizer), target=ANSWER
    )
    expected, answer = per_target_explanations(model, tokenizer)
    figure, axes = result.plot_token_attr(show=False)
    try:
        assert_token_plot(axes, expected, len(answer))
    finally:
        pyplot.close(figure)
    figure, axes = result.plot_seq_attr(show=False)
    try:
        assert_sequence_plot(axes, expected.sum(0))
    finally:
        pyplot.close(figure)


def assert_token_plot(axes, expected, answer_tokens):
    """The heatmap of ``plot_token_attr`` holds ``expected`` (answer tokens x prompt tokens) as its pixels, in a
    colour scale symmetric about 0, and writes each value (4 decimals) at its cell."""
    (heatmap,) = axes.get_images()
    assert_close(torch.as_tensor(heatmap.get_array().data), expected)
    bound = float(expected.abs().max())
    assert heatmap.norm.vmin == pytest.approx(-bound, rel=1e-12) and heatmap.norm.vmax == pytest.approx(
        bound, rel=1e-12
    )
    assert len(axes.get_yticks()) == answer_tokens and len(axes.get_xticks()) == expected.shape[1]
    cells = {tuple(text.get_position()): text.get_text() for text in axes.texts}
    assert cells == {
        (column, row): f'{float(expected[row, column]):.4f}'
        for row in range(expected.shape[0])
        for column in range(expected.shape[1])
    }


def assert_sequence_plot(axes, expected):
    """The bars of ``plot_seq_attr``: first the positive parts, then the negative parts of ``expected``, one bar of
    each per prompt token at its position; their heights add up to ``expected``."""
    bars = axes.patches
    count = expected.shape[0]
    assert len(bars) == 2 * count
    centres = [bar.get_x() + bar.get_width() / 2 for bar in bars]
    assert centres == pytest.approx([*range(count), *range(count)], abs=1e-12)
    heights = torch.tensor([bar.get_height() for bar in bars], dtype=torch.float64)
    assert bool((heights[:count] >= 0).all()) and bool((heights[count:] <= 0).all())
    assert_close(heights[:count] + heights[count:], expected)


# ------------------------------------------------------------------------------------------- the plain captum API
def test_attribute_ids_and_embeddings_equal_explain(model, tokenizer):
    ids = tokenizer(PROMPT, return_tensors='pt').input_ids
    token = tokenizer.encode(ANSWER, add_special_tokens=False)[0]
    expected = explain(model, ids, target=token).embedding_relevance
    assert_close(AttnLRP(model).attribute(ids, target=token), expected)
    assert_close(AttnLRP(model).attribute((ids,), target=torch.tensor([token])), expected)
    embeddings = model.get_input_embeddings()(ids).detach()
    assert_close(AttnLRP(model).attribute(embeddings, target=token), expected)
    # position= and target=None (the argmax) as explain() has them
    assert_close(AttnLRP(model).attribute(ids, position=3), explain(model, ids, position=3).embedding_relevance)
    assert_close(
        CPLRP(model).attribute(ids, target=token), explain(model, ids, target=token, method='cplrp').embedding_relevance
    )


def test_attribute_batch_with_attention_mask(model, tokenizer):
    """additional_forward_args are model.forward's arguments after the input: (attention_mask,)."""
    ids = torch.tensor([[5, 17, 23, 42, 8, 11], [9, 31, 7, 12, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    targets = [4, 60]
    expected = explain(model, ids, target=targets, attention_mask=mask).embedding_relevance
    actual = AttnLRP(model).attribute(ids, target=targets, additional_forward_args=(mask,))
    assert_close(actual, expected)
    assert float(actual[1, 4:].abs().max()) == 0.0
    unmasked = explain(model, ids, target=targets).embedding_relevance
    assert float((unmasked[1] - expected[1]).abs().max()) > 1e-6
    # by name (beyond captum's arguments: a model's second forward argument need not be the mask), not twice
    assert_close(AttnLRP(model).attribute(ids, target=targets, attention_mask=mask), expected)
    with pytest.raises(TypeError, match='got the attention mask twice'):
        AttnLRP(model).attribute(ids, target=targets, additional_forward_args=(mask,), attention_mask=mask)


def test_nothing_global(model, tokenizer):
    """Using the adapter leaves captum's own method untouched."""
    attribute = LayerGradientXActivation.attribute
    AttnLRP(model).attribute(tokenizer(PROMPT, return_tensors='pt').input_ids, target=4)
    assert LayerGradientXActivation.attribute is attribute
    assert not isinstance(LayerGradientXActivation(model, model.get_input_embeddings()), AttnLRP)


# ------------------------------------------------------------------------------------------- refusals
def test_refuses_captum_arguments_without_meaning_for_lrp(model, tokenizer):
    ids = tokenizer(PROMPT, return_tensors='pt').input_ids
    with pytest.raises(TypeError, match=r"takes no argument\(s\) \['baselines'\].*LRP needs no baseline"):
        AttnLRP(model).attribute(ids, baselines=torch.zeros_like(ids), target=4)
    with pytest.raises(TypeError, match=r"\['internal_batch_size', 'n_steps'\]"):
        AttnLRP(model).attribute(ids, target=4, n_steps=10, internal_batch_size=2)
    with pytest.raises(ValueError, match='attribute_to_layer_input must be False'):
        AttnLRP(model).attribute(ids, target=4, attribute_to_layer_input=True)
    llm = LLMGradientAttribution(AttnLRP(model), tokenizer)
    with pytest.raises(TypeError, match=r"takes no argument\(s\) \['baselines'\]"):
        llm.attribute(TextTokenInput(PROMPT, tokenizer), target=ANSWER, baselines=0)
    with pytest.raises(TypeError, match='target= and position= are not taken here'):
        llm.attribute(TextTokenInput(PROMPT, tokenizer), target=ANSWER, position=2)


def test_refuses_targets_that_are_not_tokens(model, tokenizer):
    ids = tokenizer(PROMPT, return_tensors='pt').input_ids
    with pytest.raises(TypeError, match="target must be a token id, got the text ' Arctic.'"):
        AttnLRP(model).attribute(ids, target=ANSWER)
    with pytest.raises(TypeError, match="captum's tuple targets index an output tensor"):
        AttnLRP(model).attribute(ids, target=(3, 4))
    with pytest.raises(TypeError, match='got float 4.0'):
        AttnLRP(model).attribute(ids, target=4.0)
    with pytest.raises(ValueError, match='out of range'):
        AttnLRP(model).attribute(ids, target=100)
    with pytest.raises(TypeError, match='must be a token id'):
        AttnLRP(model).attribute(ids, target=torch.tensor([4.0]))


def test_refuses_models_and_inputs_it_cannot_explain(model):
    with pytest.raises(TypeError, match='classifies images: use zennit_attn.explain'):
        AttnLRP(tiny_hf_vit())
    with pytest.raises(TypeError, match='needs a language model with word embeddings'):
        AttnLRP(torch.nn.Linear(3, 3))
    with pytest.raises(TypeError, match='explains a torch.nn.Module'):
        AttnLRP(lambda x: x)
    with pytest.raises(TypeError, match='must be a zennit Composite'):
        AttnLRP(model, composite='epsilon')
    with pytest.raises(ValueError, match=r'word embeddings must be \[batch, seq, 32\]'):
        AttnLRP(model).attribute(torch.zeros(1, 4, 7, dtype=torch.float64), target=4)
    with pytest.raises(TypeError, match='takes one input tensor'):
        AttnLRP(model).attribute((torch.tensor([[5, 6]]), torch.tensor([[5, 6]])), target=4)
    with pytest.raises(TypeError, match='additional_forward_args, but LlamaForCausalLM.forward takes'):
        AttnLRP(model).attribute(torch.tensor([[5, 6]]), target=4, additional_forward_args=(None,) * 50)
    training = tiny_model('llama').train()
    with pytest.raises(Exception, match='training'):
        AttnLRP(training).attribute(torch.tensor([[5, 6]]), target=4)


def test_models_run_on_their_ids():
    """A second token table (Gemma 4's per-layer embeddings) has no place in an attribution of the embeddings."""
    model = two_tables()
    with pytest.raises(ValueError, match="looks its token ids up in 'per_token'"):
        AttnLRP(model).attribute(torch.tensor([[3, 7, 1]]), target=0)


@pytest.mark.parametrize('cls', [AttnLRP, CPLRP])
def test_a_composite_with_positions_is_refused(cls):
    """A captum attribution is of the word embeddings: PA-LRP's positions (a composite with ``positions=True``) have
    no place in it, and the tokens' share it would return is not AttnLRP's (Llama: the rotations' half given to the
    positions). Before: accepted, the positions dropped without a word (0.104285 for the tokens, AttnLRP 0.104275)."""
    with pytest.raises(ValueError, match="method='palrp'"):
        cls(tiny_model('llama'), composite=AttnLRPEpsilon(positions=True))
