"""Models run on their token ids (:py:mod:`zennit_attn.inputs.lookups`): every token table's lookup is a relevance
leaf."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
import transformers

from tests.architectures import tiny_architecture
from tests.models import tiny_model, two_tables
from zennit_attn import explain
from zennit_attn.core.errors import UnsupportedModelError
from zennit_attn.inputs.lookups import TokenLookups, id_tables, needs_ids
from zennit_attn.inputs.task import TokenTask
from zennit_attn.workflows.architecture_check.check import zero_biases
from zennit_attn.workflows.architecture_check.configs import model_class, tiny_config


def test_relevance_of_both_tables_is_each_tokens_share_of_the_logit():
    model = two_tables()
    ids = torch.tensor([[3, 7, 1, 12]])
    explanation = explain(model, ids, method='cplrp')
    target = int(explanation.target[0])
    with torch.no_grad():
        rows = (model.embed(ids) + model.per_token(ids)) * model.scale
        expected = (rows * model.head.weight[target]).sum(-1)[0]
        word = (model.embed(ids) * model.scale * model.head.weight[target]).sum(-1)[0]
    torch.testing.assert_close(explanation.relevance[0], expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(explanation.embedding_relevance[0].sum(-1), word, rtol=1e-10, atol=1e-12)
    assert float(explanation.relevance.sum()) == pytest.approx(float(explanation.logit[0]), rel=1e-10)


def test_reasons():
    model = two_tables()
    assert needs_ids(model, model.embed) == "it looks the token ids up in 'per_token' too"
    assert TokenLookups(model, model.embed).tables == [('per_token', model.per_token)]
    llama = tiny('llama')
    assert needs_ids(llama, llama.get_input_embeddings()) is None

    class Routed(torch.nn.Module):  # a block that routes by token id (DeepSeek-V4's hash routing)
        def forward(self, hidden_states, input_ids=None):
            return hidden_states

    llama.model.layers[0].add_module('router', Routed())
    assert needs_ids(llama, llama.get_input_embeddings()) == "'model.layers.0.router' (Routed) takes the token ids"
    assert needs_ids(torch.nn.Linear(2, 2), None) == 'the forward of Linear takes no inputs_embeds'


def test_the_search_for_tables_runs_once_and_again_for_a_new_table():
    """The search runs the model; it runs once per model while the model stays the same. A table replaced is found
    again, and its rows are what the tokens' relevance is made of (not the replaced table's)."""
    model = two_tables()
    runs = []
    model.register_forward_pre_hook(lambda module, args, kwargs: runs.append(1), with_kwargs=True)
    assert id_tables(model, model.embed) == [('per_token', model.per_token)]
    assert id_tables(model, model.embed) == [('per_token', model.per_token)]
    assert TokenTask(model, torch.tensor([[3, 7, 1]])).lookups.tables == [('per_token', model.per_token)]
    assert len(runs) == 1
    torch.manual_seed(1)
    model.per_token = torch.nn.Embedding(20, 6).double().eval()
    assert id_tables(model, model.embed) == [('per_token', model.per_token)]
    assert len(runs) == 2
    ids = torch.tensor([[3, 7, 1, 12]])
    explanation = explain(model, ids, method='cplrp')
    target = int(explanation.target[0])
    with torch.no_grad():
        expected = ((model.embed(ids) + model.per_token(ids)) * model.scale * model.head.weight[target]).sum(-1)[0]
    torch.testing.assert_close(explanation.relevance[0], expected, rtol=1e-10, atol=1e-12)


def test_other_methods_are_refused_where_a_second_table_would_stay_fixed():
    with pytest.raises(ValueError, match="looks its token ids up in 'per_token'"):
        explain(two_tables(), torch.tensor([[3, 7, 1]]), method='input_x_gradient')


def test_word_lookup_of_other_ids_is_refused_and_other_lookups_kept():
    model = two_tables()
    lookups = TokenLookups(model, model.embed)
    ids = torch.tensor([[3, 7, 1]])
    lookups.record()
    with lookups.substituting(ids, model.embed(ids)):
        with pytest.raises(RuntimeError, match='embeds ids of shape \\(1, 2\\), not the explained tokens'):
            model.embed(ids[:, :2])
        positions = model.per_token(torch.arange(3)[None])  # not the tokens: the table's own output
        tokens = model.per_token(torch.tensor([[3, 7, 0]]))  # the tokens, one replaced: a leaf
    leaves = lookups.recorded()
    assert type(positions.grad_fn).__name__ == 'EmbeddingBackward0' and len(leaves) == 1 and leaves[0].is_leaf
    assert tokens.grad_fn is not None and type(tokens.grad_fn).__name__ != 'EmbeddingBackward0'
    torch.testing.assert_close(leaves[0], model.per_token(torch.tensor([[3, 7, 0]])).detach())


def tiny(architecture: str, **overrides):
    architecture_class, config_class = model_class('causal-lm', architecture)
    config = tiny_config(config_class)
    with contextlib.suppress(Exception):
        config._experts_implementation = 'eager'
    for key, value in overrides.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    model = architecture_class(config).double().eval()
    zero_biases(model)
    return model


@pytest.fixture(scope='module')
def gemma4():
    return tiny('gemma4_text')


def test_gemma4_per_layer_embeddings_conserve(gemma4):
    ids = torch.tensor([[5, 17, 33, 8, 61, 2]])
    explanation = explain(gemma4, ids, method='cplrp')
    assert TokenTask(gemma4, ids).ids_reason == "it looks the token ids up in 'model.embed_tokens_per_layer' too"
    assert float(explanation.relevance.sum()) == pytest.approx(float(explanation.logit[0]), rel=1e-9)
    # the per-layer table carries relevance of its own: the word embeddings alone do not conserve
    assert abs(float(explanation.embedding_relevance.sum() - explanation.logit[0])) > 1e-5
    with torch.no_grad():  # the explained logit is the model's on its ids
        logits = gemma4(input_ids=ids).logits[0, -1]
    assert float(explanation.logit[0]) == pytest.approx(float(logits.max()), rel=1e-12)


def test_tokens_a_model_puts_ahead_of_the_ids_absorb_relevance_of_their_own():
    """CPM-Ant embeds prompt tokens of its own ahead of the ids: the ids' rows are the explained input, the prompt's
    rows a leaf of their own (:py:attr:`~zennit_attn.inputs.lookups.TokenLookups.own`) whose relevance no token gets;
    with the tokens' relevance, CP-LRP conserves the logit exactly."""
    from zennit_attn.composites import CPLRPEpsilon

    model = tiny('cpmant')
    ids = torch.tensor([[5, 17, 33, 8, 61, 2]])
    lookups = TokenLookups(model, model.get_input_embeddings())
    embeddings = model.get_input_embeddings()(ids).detach().requires_grad_(True)
    lookups.record()
    with CPLRPEpsilon().context(model) as modified, lookups.substituting(ids, embeddings):
        logits = modified(input_ids=ids).logits[0, -1]
        logits[logits.argmax()].backward()  # relevance 1 at the logit
    (own,) = lookups.own
    assert own.shape == (1, model.config.prompt_length, model.config.hidden_size)
    tokens = float(embeddings.grad.sum())
    assert tokens + float(own.grad.sum()) == pytest.approx(1.0, rel=1e-9)
    assert abs(tokens - 1) > 1e-3  # the prompt takes a share
    explanation = explain(model, ids, method='cplrp')
    assert float(explanation.relevance.sum() / explanation.logit[0]) == pytest.approx(tokens, rel=1e-9)


#: the per-layer table of the real Gemma 3n and Gemma 4 (their vocabulary: 262,400 and 262,144 ids)
PER_LAYER_ROWS = 262_144


def per_layer_pair(architecture: str):
    """A tiny model of 256 ids with a per-layer table of 256 rows, and the same model with a table of
    :py:data:`PER_LAYER_ROWS` rows whose first 256 are the first model's: both compute the same function of the ids
    (checked). Gemma 3n's AltUp scales the per-layer path by ``correct_output_scale``, initialised to 0: set at
    random, so that the per-layer table reaches the logits."""
    small = tiny(architecture, vocab_size=256, vocab_size_per_layer_input=256)
    with torch.no_grad():
        for name, parameter in small.named_parameters():
            if name.endswith('correct_output_scale'):
                parameter.normal_()
    config = copy.deepcopy(small.config)
    config.vocab_size_per_layer_input = PER_LAYER_ROWS
    torch.manual_seed(1)
    large = type(small)(config).double().eval()
    state = small.state_dict()
    table = large.model.embed_tokens_per_layer.weight.detach().clone()
    table[:256] = state['model.embed_tokens_per_layer.weight']
    state['model.embed_tokens_per_layer.weight'] = table
    large.load_state_dict(state)
    return small, large


@pytest.mark.parametrize('architecture', ['gemma4_text', 'gemma3n_text'])
def test_a_per_layer_table_of_another_size_is_a_lookup_of_the_ids(architecture):
    """The per-layer table is recognised by its index (the ids), not by its size: a table of 262,144 rows for 256
    ids (more than the vocabulary) carries the relevance of its lookups as one of 256 rows does. Before, its lookups
    were constants of the model: Gemma 4's CP-LRP relevance summed to 0.987 of the logit, and both models' relevance
    differed from the 256-row model's by up to 6e-3 (Gemma 4) and 3e-4 (Gemma 3n)."""
    small, large = per_layer_pair(architecture)
    ids = torch.tensor([[5, 17, 33, 8, 61, 2, 200, 255]])
    with torch.no_grad():
        assert torch.equal(small(ids).logits, large(ids).logits)
    table = large.model.embed_tokens_per_layer
    assert table.num_embeddings == PER_LAYER_ROWS > large.get_input_embeddings().num_embeddings == 256
    assert id_tables(large, large.get_input_embeddings()) == [('model.embed_tokens_per_layer', table)]
    assert TokenTask(large, ids).ids_reason == "it looks the token ids up in 'model.embed_tokens_per_layer' too"
    for method in ('cplrp', 'attnlrp'):
        expected, explanation = (explain(model, ids, method=method) for model in (small, large))
        torch.testing.assert_close(explanation.relevance, expected.relevance, rtol=1e-12, atol=1e-14)
        # the per-layer table carries relevance of its own
        assert abs(float(explanation.relevance.sum() - explanation.embedding_relevance.sum())) > 1e-5
    explanation = explain(large, ids, method='cplrp')
    if architecture == 'gemma4_text':  # biases zeroed: CP-LRP conserves the logit exactly
        assert float(explanation.relevance.sum()) == pytest.approx(float(explanation.logit[0]), rel=1e-12)
    # Gemma 3n adds the constant 1 to its AltUp coefficients (a bias that cannot be zeroed): no exact conservation


def test_tables_are_told_apart_by_their_index_not_their_size():
    """A position table (GPT-2's ``wpe``: 64 rows for 100 ids, which the size rule took for a table of the ids) is
    looked up with positions: not a table of the ids, so GPT-2 runs on its embeddings; a second table of the ids
    larger than the vocabulary is one."""
    gpt2 = tiny_model('gpt2')
    assert gpt2.transformer.wpe.num_embeddings * 2 >= gpt2.config.vocab_size
    assert id_tables(gpt2, gpt2.get_input_embeddings()) == []
    assert needs_ids(gpt2, gpt2.get_input_embeddings()) is None
    model = two_tables()
    model.per_token = torch.nn.Embedding(1000, 6).double().eval()  # 50 times the vocabulary
    assert needs_ids(model, model.embed) == "it looks the token ids up in 'per_token' too"
    ids = torch.tensor([[3, 7, 1, 12]])
    explanation = explain(model, ids, method='cplrp')
    target = int(explanation.target[0])
    with torch.no_grad():
        rows = (model.embed(ids) + model.per_token(ids)) * model.scale
        expected = (rows * model.head.weight[target]).sum(-1)[0]
    torch.testing.assert_close(explanation.relevance[0], expected, rtol=1e-10, atol=1e-12)


def test_a_table_given_the_ids_that_looks_up_positions_is_not_a_table_of_the_ids():
    """BigBird-Pegasus's decoder passes ``input_ids`` to its learned positions, which look up ``arange(seq)`` (one
    ``[seq, hidden]`` row per position, not per token): before, that table was taken for a second table of the ids
    and CP-LRP crashed on its 2-D relevance (``IndexError: Dimension out of range``). It is a constant of the model
    (zero here, with the biases), and the word embeddings carry all relevance: CP-LRP conserves the logit exactly."""
    model = tiny_architecture('bigbird_pegasus')
    assert id_tables(model, model.get_input_embeddings()) == []
    ids = torch.tensor([[15, 27, 33, 8, 61, 42]])
    explanation = explain(model, ids, method='cplrp')
    assert float(explanation.relevance.sum()) == pytest.approx(float(explanation.logit[0]), rel=1e-12)
    torch.testing.assert_close(explanation.relevance, explanation.embedding_relevance.sum(-1), rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(explanation.logit[0], model(ids).logits[0, -1, explanation.target[0]])


@pytest.mark.parametrize('family', ['gpt2', 'llama'])
def test_a_decoder_classifier_is_explained_at_the_token_it_pools(family):
    """Transformers' sequence classifiers of decoders score the last token that is not padding, which they find in the
    ids; on embeddings they score the last position. Run on the embeddings, a right-padded row (or any row ending in
    the pad token, GPT-2's end of text where that is its pad) was explained at a pad: another logit, 9% of it in the
    relevance (GPT-2). The model is now run on its ids (:py:func:`~zennit_attn.inputs.checks.reads_ids`): the logit
    the model gives, and each row's relevance its own, under CP-LRP with zero biases summing to it."""
    model = tiny_model(family, 'seq_cls', pad_token_id=0)
    zero_biases(model)
    pad = model.config.pad_token_id
    assert 'pad token (0) ends the input' in needs_ids(model, model.get_input_embeddings())
    row = torch.tensor([[5, 9, 17, 23, 31]])
    padded = torch.cat([torch.cat([row, torch.full((1, 3), pad)], 1), torch.tensor([[5, 9, 17, 23, 31, 40, 44, 50]])])
    mask = (padded != pad).long()
    with torch.no_grad():
        logits = model(input_ids=padded, attention_mask=mask).logits
        ending = torch.cat([row, torch.full((1, 1), pad)], 1)
        own = model(input_ids=ending).logits
    batch = explain(model, padded, attention_mask=mask, target=torch.tensor([1, 0]), method='cplrp')
    alone = explain(model, row, target=1, method='cplrp')
    torch.testing.assert_close(batch.logit, logits[[0, 1], [1, 0]], rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(batch.relevance[0, :5], alone.relevance[0], rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(batch.relevance.sum(1), batch.logit, rtol=1e-9, atol=1e-14)
    single = explain(model, ending, target=0, method='cplrp')  # one row that ends in the pad token, no mask
    torch.testing.assert_close(single.logit, own[:, 0], rtol=1e-12, atol=1e-14)


def test_a_classifier_that_takes_logits_to_keep_keeps_its_positions():
    """BioGPT's sequence classifier takes ``logits_to_keep``, which explain() passes to language-model heads only:
    given to the classifier, it left one position to pool from (an IndexError)."""
    config = tiny_config(transformers.BioGptConfig)
    config.num_labels, config.pad_token_id = 3, 0
    model = transformers.BioGptForSequenceClassification(config).double().eval()
    ids = torch.tensor([[5, 9, 17, 23, 31, 40, 44, 50]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    explanation = explain(model, ids, target=2, method='cplrp')
    torch.testing.assert_close(explanation.logit, logits[:, 2], rtol=1e-12, atol=1e-14)


def test_a_head_that_fails_on_embeddings_is_refused_by_name():
    """ESM C's classifier takes ``inputs_embeds`` and hands it to a base model that does not (its ``**kwargs`` swallow
    them: ``embedding(): argument 'indices' must be Tensor, not NoneType`` from inside torch). A forward that runs on
    the ids and fails on their embeddings computes from the ids themselves (BLT's hashed n-grams, Longformer's global
    attention mask), where no relevance reaches: it is refused, naming the error."""
    config = tiny_config(transformers.EsmcConfig)
    config.num_labels = 3
    model = transformers.EsmcForSequenceClassification(config).double().eval()
    assert needs_ids(model, model.get_input_embeddings()) is None
    with pytest.raises(UnsupportedModelError, match='fails when run on the embeddings of its tokens \\(TypeError'):
        explain(model, torch.tensor([[5, 9, 17, 23, 21, 20, 14, 10]]), method='cplrp')
