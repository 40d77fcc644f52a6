"""explain(): what is explained, batches with padding, the zennit attributor path, bad input, and the host
synchronisations of one call."""

import collections
import copy

import pytest
import torch
from torch.overrides import TorchFunctionMode
from transformers import BertConfig, BertForSequenceClassification
from zennit.attribution import Gradient

from tests.models import tiny_model, token_ids
from tests.numbers import assert_close
from tests.text_tokenizer import byte_level_tokenizer
from zennit_attn import explain
from zennit_attn.composites import AttnLRPEpsilon, CPLRPEpsilon
from zennit_attn.core import UnsupportedModelError

#: the tiny Llama of these tests: :py:func:`tests.models.tiny_model` with a vocabulary of 50, intermediate size 48,
#: pad id 0 and SDPA attention (its weights are those of the ``LlamaConfig`` with these sizes built here before)
LLAMA = dict(vocab_size=50, intermediate_size=48, pad_token_id=0, attn_implementation='sdpa')


def build(cls, config_cls, **kwargs):
    torch.manual_seed(0)
    return cls(config_cls(**kwargs)).double().eval()


@pytest.fixture(scope='module')
def llama():
    return tiny_model('llama', **LLAMA)


@pytest.fixture(scope='module')
def bert():
    return build(
        BertForSequenceClassification,
        BertConfig,
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        num_labels=3,
    )


def ids(*shape, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, 50, shape, generator=generator)


def test_default_target_is_argmax_logit_at_last_position(llama):
    tokens = ids(2, 6)
    explanation = explain(llama, tokens)
    logits = llama(tokens).logits[:, -1]
    assert torch.equal(explanation.target, logits.argmax(-1))
    assert_close(explanation.logit, logits.gather(1, explanation.target[:, None])[:, 0].detach())
    assert torch.equal(explanation.position, torch.tensor([5, 5]))
    assert_close(explanation.relevance, explanation.embedding_relevance.sum(-1))


def test_targets_and_positions_per_row(llama):
    tokens = ids(2, 6)
    both = explain(llama, tokens, target=[7, 9], position=[2, 4])
    first = explain(llama, tokens[:1], target=7, position=2)
    second = explain(llama, tokens[1:], target=9, position=4)
    assert_close(both.relevance, torch.cat([first.relevance, second.relevance]))
    # causality: tokens after the explained position get exactly nothing
    assert float(first.relevance[0, 3:].abs().max()) == 0.0


@pytest.mark.parametrize('side', ['left', 'right'])
def test_padded_batch_equals_unpadded_rows(llama, side):
    short, long = ids(4, seed=2), ids(6, seed=3)
    pad = torch.zeros(2, dtype=torch.long)
    padded = torch.cat([pad, short]) if side == 'left' else torch.cat([short, pad])
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[0, :2] = 0 if side == 'left' else 1
    mask[0, 4:] = 0 if side == 'right' else 1
    batch = explain(llama, torch.stack([padded, long]), attention_mask=mask, target=[5, 6])
    alone = explain(llama, short, target=5)
    real = slice(2, 6) if side == 'left' else slice(0, 4)
    assert_close(batch.relevance[0, real], alone.relevance[0], tol=1e-9)
    assert float(batch.relevance[0, mask[0] == 0].abs().max()) == 0.0
    assert_close(batch.relevance[1], explain(llama, long, target=6).relevance[0], tol=1e-9)
    # a negative position counts back from each row's last token, not from the padding's end (before, -2 explained
    # position 4 of the right-padded row, a pad's logit, instead of its token 2); too far back: the padding or nothing
    earlier = explain(llama, torch.stack([padded, long]), attention_mask=mask, target=[5, 6], position=-2)
    assert earlier.position.tolist() == [4 if side == 'left' else 2, 4]
    assert_close(earlier.relevance[0, real], explain(llama, short, target=5, position=-2).relevance[0], tol=1e-9)
    with pytest.raises(ValueError, match=r'position -5 is (before the first token of|a padding token in) row'):
        explain(llama, torch.stack([padded, long]), attention_mask=mask, target=[5, 6], position=-5)


def test_sequence_classification_is_explained_directly(bert):
    tokens = ids(2, 5)
    explanation = explain(bert, tokens, target=1)
    assert explanation.position is None
    assert_close(explanation.logit, bert(tokens).logits[:, 1].detach())
    # right padding in an encoder: same relevance for the real tokens, none for padding
    padded = torch.cat([tokens[:1, :3], torch.zeros(1, 2, dtype=torch.long)], 1)
    mask = torch.tensor([[1, 1, 1, 0, 0]])
    assert_close(
        explain(bert, padded, target=1, attention_mask=mask).relevance[0, :3],
        explain(bert, tokens[:1, :3], target=1).relevance[0],
        tol=1e-9,
    )
    with pytest.raises(ValueError, match='pad on the right'):
        explain(bert, padded.flip(1), target=1, attention_mask=mask.flip(1))


def test_base_model_explains_a_hidden_unit():
    model = tiny_model('llama', 'base', **LLAMA)
    tokens = ids(1, 5)
    explanation = explain(model, tokens, target=3, position=2)
    assert_close(explanation.logit, model(tokens).last_hidden_state[:, 2, 3].detach())
    assert float(explanation.relevance[0, 3:].abs().max()) == 0.0


def test_zennit_gradient_attributor_gives_the_same_relevance(llama):
    """The drop-in path: zennit's Gradient attributor with the composite yields relevance at the input."""

    class LastLogits(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, inputs_embeds):
            return self.model(inputs_embeds=inputs_embeds, use_cache=False).logits[:, -1]

    tokens = ids(2, 6)
    reference = explain(llama, tokens)
    embeddings = llama.get_input_embeddings()(tokens).detach()
    one_hot = torch.nn.functional.one_hot(reference.target, LLAMA['vocab_size']).double()
    composite = AttnLRPEpsilon()
    with Gradient(model=LastLogits(llama), composite=composite) as attributor:
        output, relevance = attributor(embeddings, lambda out: out * one_hot)
    assert_close(relevance.sum(-1), reference.relevance)
    # inactive composite: the plain gradient (input x gradient differs from AttnLRP)
    with composite.context(LastLogits(llama)) as modified:
        with composite.inactive():
            leaf = embeddings.clone().requires_grad_()
            (plain,) = torch.autograd.grad((modified(leaf) * one_hot).sum(), leaf)
    leaf = embeddings.clone().requires_grad_()
    (expected,) = torch.autograd.grad((llama(inputs_embeds=leaf).logits[:, -1] * one_hot).sum(), leaf)
    assert_close(plain, expected)


def test_bad_input_raises_clear_errors(llama):
    tokens = ids(1, 5)
    with pytest.raises(ValueError, match='Nothing to explain'):
        explain(llama, torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(ValueError, match='out of range'):
        explain(llama, tokens, target=LLAMA['vocab_size'])
    with pytest.raises(ValueError, match='out of range'):
        explain(llama, tokens, target=-1)
    with pytest.raises(ValueError, match='one entry per row'):
        explain(llama, tokens, target=[1, 2])
    with pytest.raises(ValueError, match='out of range'):
        explain(llama, tokens, position=5)
    with pytest.raises(ValueError, match='padding token'):
        explain(llama, tokens, position=0, attention_mask=torch.tensor([[0, 1, 1, 1, 1]]))
    with pytest.raises(ValueError, match='masks every token'):
        explain(llama, tokens, attention_mask=torch.zeros(1, 5, dtype=torch.long))
    with pytest.raises(ValueError, match='integer tensor'):
        explain(llama, tokens.double())
    llama.train()
    try:
        with pytest.raises(ValueError, match='training mode'):
            explain(llama, tokens)
    finally:
        llama.eval()


def test_dropout_outside_the_module_tree_is_refused():
    """A model in eval mode whose forward still drops at random (a dropout module that ``model.eval()`` does not
    reach, here one a forward hook of a block calls; ``training=True`` written into the code) is refused: before, two
    calls of CP-LRP on a tiny Llama gave relevances 0.1 apart, each conserving the logit of its own random draw."""
    model = tiny_model('llama', **LLAMA)
    dropout = torch.nn.Dropout(0.3)  # in training mode, outside the model's module tree
    handle = model.model.layers[0].register_forward_hook(lambda module, args, output: dropout(output))
    try:
        with pytest.raises(UnsupportedModelError, match=r"dropout in 'model\.layers\.0'.*probability 0\.3"):
            explain(model, ids(1, 5), method='cplrp')
        dropout.eval()
        found = explain(model, ids(1, 5), method='cplrp').relevance
    finally:
        handle.remove()
    assert torch.equal(found, explain(model, ids(1, 5), method='cplrp').relevance)


def test_methods_dispatch():
    model = tiny_model('llama', **LLAMA)
    tokens = ids(2, 5)
    assert_close(
        explain(model, tokens, method='cplrp').relevance,
        explain(model, tokens, method='cplrp', composite=CPLRPEpsilon()).relevance,
    )
    leaf = model.get_input_embeddings()(tokens).detach().requires_grad_()
    logits = model(inputs_embeds=leaf).logits[:, -1]
    target = logits.argmax(-1)
    (grad,) = torch.autograd.grad(logits.gather(1, target[:, None]).sum(), leaf)
    assert_close(explain(model, tokens, method='input_x_gradient').relevance, (leaf * grad).sum(-1).detach())
    with pytest.raises(ValueError, match='Unknown method'):
        explain(model, tokens, method='lime-ish')
    with pytest.raises(TypeError, match='composite='):
        explain(model, tokens, steps=3)


def test_several_position_token_pairs_in_one_backward_pass(llama):
    """The heatmap of several (position, token) pairs is the sum of their single heatmaps (LRP is linear in
    the initial relevance), and each logit is its own initial relevance."""
    tokens = ids(1, 7)
    pairs = [(4, 11), (5, 12), (6, 13)]
    together = explain(llama, tokens, target=pairs)
    assert together.target.shape == (1, 3) and torch.equal(together.position[0], torch.tensor([4, 5, 6]))
    single = sum(explain(llama, tokens, target=token, position=position).relevance for position, token in pairs)
    assert_close(together.relevance, single)
    logits = llama(tokens).logits[0]
    assert_close(together.logit[0], torch.stack([logits[p, t] for p, t in pairs]).detach())
    with pytest.raises(ValueError, match='out of range'):
        explain(llama, tokens, target=[(7, 1)])


def test_non_finite_results_raise(llama):
    """A model that returns NaN logits must not yield a plausible-looking heatmap."""
    handle = llama.lm_head.register_forward_hook(lambda module, input, output: output * float('nan'))
    try:
        with pytest.raises(FloatingPointError, match='non-finite'):
            explain(llama, ids(1, 4), target=3)
    finally:
        handle.remove()


def test_top_skips_padding():
    from zennit_attn import Explanation

    explanation = Explanation(
        relevance=torch.tensor([[0.0, 0.0, -1.0, -2.0]]),
        embedding_relevance=None,
        target=torch.tensor([0]),
        logit=torch.tensor([1.0]),
        position=None,
        input_ids=torch.tensor([[2, 2, 5, 6]]),
        attention_mask=torch.tensor([[0, 0, 1, 1]]),
    )
    assert [item[:2] for item in explanation.top(3)] == [(2, -1.0), (3, -2.0)]
    # ranked in float64: values apart by less than float32 resolves keep their order and their values
    close = Explanation(
        relevance=torch.tensor([[1.0, 1.0 + 1e-9]], dtype=torch.float64),
        embedding_relevance=None,
        target=torch.tensor([0]),
        logit=torch.tensor([1.0]),
        position=None,
        input_ids=torch.tensor([[5, 6]]),
    )
    assert close.top(2) == [(1, 1.0 + 1e-9, None), (0, 1.0, None)]


def test_composite_without_boundary_is_refused(llama):
    """A composite without the root RelevanceBoundary would return gradients, not relevance."""
    from zennit.composites import LayerMapComposite

    from zennit_attn.rules import Identity

    with pytest.raises(TypeError, match='RelevanceBoundary'):
        explain(llama, ids(1, 4), composite=LayerMapComposite([(torch.nn.SiLU, Identity())]))
    assert not any(module._forward_hooks or module._forward_pre_hooks for module in llama.modules())


# ------------------------------------------------------------------------------------------------------- text in
@pytest.fixture(scope='module')
def text_model():
    """A tiny Llama over the 100 ids of the test tokenizer (SDPA: padded float64 batches stay finite)."""
    return tiny_model('llama', attn_implementation='sdpa')


TEXTS = ['The ice bear lives in the', 'Question: where does the polar bear live? Answer: in the Arctic.']


def test_text_in_equals_ids_in(text_model, tokenizer):
    by_text = explain(text_model, TEXTS[0], tokenizer=tokenizer)
    ids = tokenizer(TEXTS[0], return_tensors='pt').input_ids
    by_ids = explain(text_model, ids)
    assert torch.equal(by_text.input_ids, ids)
    assert torch.equal(by_text.relevance, by_ids.relevance) and torch.equal(by_text.target, by_ids.target)
    assert by_text.tokenizer is tokenizer and by_ids.tokenizer is None
    # what the tokenizer returns is accepted as it is, and the tokenizer may come along
    encoding = explain(text_model, tokenizer(TEXTS[0], return_tensors='pt'), tokenizer=tokenizer)
    assert torch.equal(encoding.relevance, by_ids.relevance) and encoding.tokenizer is tokenizer
    assert explain(text_model, ids, tokenizer=tokenizer).tokens() == ['The', ' ice', ' bear', ' lives', ' in', ' the']


def test_list_of_texts_equals_padded_ids(text_model, tokenizer):
    batch = explain(text_model, TEXTS, tokenizer=tokenizer)
    encoding = tokenizer(TEXTS, return_tensors='pt', padding=True)
    assert bool((encoding.attention_mask == 0).any())  # the first text is padded
    padded = explain(text_model, encoding.input_ids, attention_mask=encoding.attention_mask)
    assert torch.equal(batch.input_ids, encoding.input_ids) and torch.equal(
        batch.attention_mask, encoding.attention_mask
    )
    assert torch.equal(batch.relevance, padded.relevance)
    for row, text in enumerate(TEXTS):
        alone = explain(text_model, text, tokenizer=tokenizer)
        length = alone.input_ids.shape[1]
        assert_close(batch.relevance[row, :length], alone.relevance[0], tol=1e-9)
        assert int(batch.target[row]) == int(alone.target[0])


def test_tokenizer_without_pad_token_pads_with_eos(text_model):
    """As Hugging Face users do (pad_token = eos_token), without changing the tokenizer; padding is masked, so the
    relevance is that of any other pad id; left padding follows the tokenizer's padding_side."""
    from tests.text_tokenizer import byte_level_tokenizer

    tokenizer = byte_level_tokenizer(pad=False)
    assert tokenizer.pad_token is None
    batch = explain(text_model, TEXTS, tokenizer=tokenizer)
    assert tokenizer.pad_token is None  # unchanged
    mask = batch.attention_mask
    assert bool((batch.input_ids[mask == 0] == tokenizer.eos_token_id).all())
    reference = explain(text_model, TEXTS, tokenizer=byte_level_tokenizer())
    assert_close(batch.relevance, reference.relevance, tol=1e-12)
    tokenizer.padding_side = 'left'
    left = explain(text_model, TEXTS, tokenizer=tokenizer)
    assert int(left.attention_mask[0, 0]) == 0 and int(left.attention_mask[0, -1]) == 1
    length = int(left.attention_mask[0].sum())
    assert_close(left.relevance[0, -length:], reference.relevance[0, :length], tol=1e-9)


def test_text_refusals(text_model, tokenizer):
    with pytest.raises(TypeError, match='tokenizer='):
        explain(text_model, TEXTS[0])
    with pytest.raises(TypeError, match='tokenizer='):
        explain(text_model, TEXTS)
    with pytest.raises(ValueError, match='gives no tokens'):
        explain(text_model, '', tokenizer=tokenizer)
    with pytest.raises(ValueError, match='empty'):
        explain(text_model, [], tokenizer=tokenizer)
    with pytest.raises(ValueError, match=r"text 1 \(''\) gives no tokens"):
        explain(text_model, ['The ice', ''], tokenizer=tokenizer)
    with pytest.raises(TypeError, match='item 1 is int'):
        explain(text_model, ['The ice', 5], tokenizer=tokenizer)

    class NoPad:  # neither a pad nor an end-of-sequence token
        pad_token_id = eos_token_id = None

        def __call__(self, texts, **kwargs):
            return {'input_ids': [[5, 6]] * len(texts)}

    with pytest.raises(ValueError, match='no pad token and no end-of-sequence token'):
        explain(text_model, TEXTS, tokenizer=NoPad())
    with pytest.raises(TypeError, match=r'model must be a torch.nn.Module .*got function: a pipeline holds'):
        explain(lambda ids: text_model(ids), TEXTS, tokenizer=tokenizer)  # an AttributeError from inside before


def test_a_masked_language_model_is_explained_at_its_mask_token(tokenizer):
    """With its tokenizer, a masked language model is explained where every row holds the mask token once (it was
    explained at the last token, ``[SEP]``: a heatmap of another prediction); rows without it keep the last token."""
    model = tiny_model('bert', 'masked_lm')
    masking = copy.deepcopy(tokenizer)
    masking.mask_token = '<unk>'
    ids = token_ids('bert', 6, 2)
    ids[:, 2] = masking.mask_token_id
    explanation = explain(model, ids, tokenizer=masking)
    assert explanation.position.tolist() == [2, 2]
    torch.testing.assert_close(explanation.relevance, explain(model, ids, position=2).relevance, rtol=0, atol=0)
    ids[1, 2] = 7  # a row without the mask token: the default for all rows
    assert explain(model, ids, tokenizer=masking).position.tolist() == [5, 5]
    assert explain(model, {'input_ids': ids[:1].tolist()}, tokenizer=masking).position.tolist() == [2]


#: Tensor functions that wait for the device's result on an accelerator (a host synchronisation): values read on the
#: host, and outputs whose shape depends on the values.
SYNCHRONISING = frozenset(
    {
        'item',
        'tolist',
        '__bool__',
        '__int__',
        '__float__',
        '__index__',
        'nonzero',
        'argwhere',
        'masked_select',
        'unique',
        'unique_consecutive',
        'bincount',
        'repeat_interleave',
    }
)


class Synchronisations(TorchFunctionMode):
    """Counts the calls of :py:data:`SYNCHRONISING` functions made through torch's function dispatch (by the model,
    the engine under its classifying mode and the library around it)."""

    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, '__name__', '')
        if name in SYNCHRONISING:
            self.counts[name] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize('method', ['attnlrp', 'cplrp'])
def test_host_synchronisations_do_not_grow_with_the_layers(method):
    """On an accelerator each synchronisation stalls the host until the device is done: an explanation forces a few
    per call (reading the target and the position, checking the input ids), none per layer."""
    found = {}
    for layers in (2, 6):
        model = tiny_model('llama', num_hidden_layers=layers, **LLAMA)
        tokens = ids(1, 12)
        explain(model, tokens, target=5, method=method)  # the first call finds the model's facts once
        with Synchronisations() as counter:
            explain(model, tokens, target=5, method=method)
        found[layers] = counter.counts
    assert found[2] == found[6] and sum(found[6].values()) <= 8, found


@pytest.mark.parametrize(('method', 'contrast'), [('attnlrp', None), ('cplrp', None), ('attnlrp', 7)])
def test_the_explained_logits_are_not_kept_for_the_backward_pass(method, contrast):
    """The plain pass keeps no logits for its backward pass (the explained logit is read by indexing); nor may an
    explanation of a logit or a contrast of two: neither the boundary's conversion of relevance at the outputs nor the
    reading of the explained entry may keep a row of the vocabulary (``[..., vocab]``) alive until the backward."""
    vocab = 4099  # no other dimension of the model has this size
    model = tiny_model('llama', **{**LLAMA, 'vocab_size': vocab})
    weights = {parameter.untyped_storage().data_ptr() for parameter in model.parameters()}
    kept = []

    def pack(tensor):
        if tensor.shape and tensor.shape[-1] == vocab and tensor.untyped_storage().data_ptr() not in weights:
            kept.append(tuple(tensor.shape))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        explain(model, ids(1, 12), target=5, contrast=contrast, method=method)
    assert kept == []  # the values: test_zennit_gradient_attributor_gives_the_same_relevance, the objectives' tests


class _CountedWalks(torch.nn.Module):
    """Counts the walks over its modules (``named_modules``, which ``modules`` and ``parameters`` call too)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model, self.walks = model, 0

    def named_modules(self, *args, **kwargs):
        self.walks += 1
        return super().named_modules(*args, **kwargs)

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    def get_input_embeddings(self):
        return self.model.get_input_embeddings()


@pytest.mark.parametrize('method', ['attnlrp', 'cplrp'])
def test_one_call_walks_the_modules_once(method):
    """The checks of the model, the registration of the composite (its refusals, the engine, the rules, the marks of
    the registration) share one walk over the modules: a walk costs about 1 ms per 400 modules in every call."""
    model = _CountedWalks(tiny_model('llama', num_hidden_layers=3, **LLAMA)).eval()
    tokens = ids(1, 8)
    explain(model, tokens, target=5, method=method)
    model.walks = 0
    explain(model, tokens, target=5, method=method)
    assert model.walks == 1


def test_a_decoder_classifier_is_padded_with_its_pad_token():
    """A decoder's sequence classifier scores the last token that is not its pad token, which it finds in the ids:
    texts padded with the end-of-sequence token (a tokenizer without a pad token) made it score a pad (0.013 where
    the row alone gives 0.136, the pad's relevance left out). explain() pads texts with the model's pad token where
    the tokenizer has none, and a batch padded with another id is refused."""
    model = tiny_model('llama', head='seq_cls', zero_bias=True, attn_implementation='sdpa')
    model.config.pad_token_id = 0
    tokenizer = byte_level_tokenizer(pad=False)
    texts = ['The ice bear lives in the', 'The polar bear lives in the north, the penguin']
    batch = explain(model, texts, tokenizer=tokenizer, target=1, method='cplrp')
    alone = explain(model, texts[0], tokenizer=tokenizer, target=1, method='cplrp')
    real = batch.attention_mask[0].bool()
    assert int(batch.input_ids[0, ~real].unique()) == 0
    assert_close(batch.logit[0], alone.logit[0], tol=1e-12)
    assert_close(batch.relevance[0, real], alone.relevance[0], tol=1e-12)
    eos = batch.input_ids.masked_fill(~batch.attention_mask.bool(), tokenizer.eos_token_id)
    with pytest.raises(ValueError, match=r'finds its padding in the ids by its pad token \(id 0\), but the padding'):
        explain(model, eos, attention_mask=batch.attention_mask, target=1, method='cplrp')


def test_decoder_padding_is_left_out_of_the_views():
    """An encoder-decoder row whose decoder input is padded (``decoder_attention_mask``) shows its decoder tokens
    without the padding, as the encoder's (before, the decoder's pads were shown with relevance 0)."""
    model = tiny_model('t5', zero_bias=True)
    tokenizer = byte_level_tokenizer()
    decoder = torch.tensor([[0, 20, 21, 0], [0, 22, 23, 24]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    explanation = explain(
        model,
        token_ids('t5', 5, 2),
        decoder_input_ids=decoder,
        model_kwargs={'decoder_attention_mask': mask},
        target=7,
        tokenizer=tokenizer,
    )
    assert torch.equal(explanation.decoder_attention_mask, mask)
    (heatmap,) = explanation.heatmaps(rows=0)
    assert heatmap.segments[1].positions == [[0], [1], [2]]
    assert [group for group in explanation.heatmaps(rows=1)[0].segments[1].positions] == [[0], [1], [2], [3]]
