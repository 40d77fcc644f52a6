"""Context attribution (:py:mod:`zennit_attn.workflows.sources`): source scores partition the explained quantity's
relevance, prompts with sources left out, chat templates, the views, the refusals."""

from __future__ import annotations

import io
import math

import pytest
import torch

from tests.models import tiny_model
from tests.text_tokenizer import byte_level_tokenizer
from zennit_attn import explain
from zennit_attn.workflows import sources
from zennit_attn.workflows.sources import SourceCiter, SourcePrompt, explain_sources, source_spans

CONTEXT = 'The ice bear lives in the Arctic. The penguin lives in the south. A bear is big.'
QUERY = 'where does the ice bear live?'
RESPONSE = ' in the Arctic.'
#: a ChatML-like template in the special tokens of the test tokenizer (as tests/inputs/test_chat.py)
TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
    '{% if add_generation_prompt %}<s>assistant\n{% endif %}'
)


@pytest.fixture(scope='module')
def zero_llama():
    return tiny_model('llama', zero_bias=True)


@pytest.fixture(scope='module')
def chat_tokenizer():
    tokenizer = byte_level_tokenizer()
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def test_logit_scores_and_other_sum_to_the_response_logits(zero_llama, tokenizer):
    """CP-LRP without biases: the sources' scores and the rest (template, query, response) are exactly the sum of the
    response tokens' logits."""
    result = explain_sources(zero_llama, tokenizer, CONTEXT, QUERY, RESPONSE, method='cplrp', objective='logit')
    ids = torch.tensor([result.prompt.ids() + result.response_ids])
    with torch.no_grad():
        logits = zero_llama(ids).logits[0]
    start = ids.shape[1] - len(result.response_ids)
    expected = math.fsum(float(logits[start - 1 + i, t]) for i, t in enumerate(result.response_ids))
    assert len(result.scores) == 3
    assert result.value == pytest.approx(expected, abs=1e-10)
    assert float(result.scores.sum()) + result.segments.other == pytest.approx(expected, abs=1e-9)


def test_log_probability_scores_sum_to_log_probability_plus_entropy(zero_llama, tokenizer):
    result = explain_sources(
        zero_llama, tokenizer, CONTEXT, QUERY, RESPONSE, method='cplrp', objective='log_probability'
    )
    ids = torch.tensor([result.prompt.ids() + result.response_ids])
    start = ids.shape[1] - len(result.response_ids)
    with torch.no_grad():
        log_p = zero_llama(ids).logits[0, start - 1 : -1].log_softmax(-1)
    chosen = log_p.gather(-1, torch.tensor(result.response_ids)[:, None])[:, 0]
    entropy = -(log_p.exp() * log_p).sum(-1)
    assert result.objective == 'log_probability'
    assert result.value == pytest.approx(float(chosen.sum()), abs=1e-10)
    assert float(result.scores.sum()) + result.segments.other == pytest.approx(
        float((chosen + entropy).sum()), abs=1e-9
    )


def test_log_odds_scores_sum_to_log_odds_plus_entropy_of_the_others(zero_llama, tokenizer):
    """The default objective: per token the logits receive y_i (delta_it - q_i), q the softmax over the other tokens;
    CP-LRP without biases sums to log(p_t / (1 - p_t)) + H(q) exactly."""
    result = explain_sources(zero_llama, tokenizer, CONTEXT, QUERY, RESPONSE, method='cplrp')
    ids = torch.tensor([result.prompt.ids() + result.response_ids])
    start = ids.shape[1] - len(result.response_ids)
    targets = torch.tensor(result.response_ids)[:, None]
    with torch.no_grad():
        logits = zero_llama(ids).logits[0, start - 1 : -1].to(torch.float64)
    log_p = logits.log_softmax(-1).gather(-1, targets)[:, 0]
    log_q = logits.scatter(-1, targets, -math.inf).log_softmax(-1)
    entropy = -(log_q.exp() * log_q.nan_to_num(neginf=0.0)).sum(-1)
    assert result.objective == 'log_odds'
    assert result.value == pytest.approx(float((log_p - torch.log1p(-log_p.exp())).sum()), abs=1e-9)
    assert float(result.scores.sum()) + result.segments.other == pytest.approx(
        float((log_p - torch.log1p(-log_p.exp()) + entropy).sum()), abs=1e-9
    )


def test_reductions_by_hand(llama, tokenizer):
    total = explain_sources(llama, tokenizer, CONTEXT, QUERY, RESPONSE)
    relevance = total.explanation.relevance[0].to(torch.float64)
    segments = total.segments
    for reduce in ('positive', 'mean'):
        scores = explain_sources(llama, tokenizer, CONTEXT, QUERY, RESPONSE, reduce=reduce).scores
        for index in range(3):
            values = [float(relevance[p]) for p, s in zip(segments.positions, segments.token_segment) if s == index]
            expected = sum(v for v in values if v > 0) if reduce == 'positive' else sum(values) / len(values)
            assert float(scores[index]) == pytest.approx(expected, abs=1e-12)
    assert [index for index, _, _ in total.sorted()] == sorted(range(3), key=lambda i: -float(total.scores[i]))
    assert total.top(1)[0][2] == total.sources[total.top(1)[0][0]]


def test_kept_context_and_spans(tokenizer):
    context, spans = source_spans(CONTEXT, 'sentences')
    prompt = SourcePrompt(context, spans, QUERY, 'Context: {context}\nQuestion: {query}\nAnswer:', False, tokenizer)
    assert prompt.kept_context([True, False, True])[0] == 'The ice bear lives in the Arctic. A bear is big.'
    # the separator before a removed last source goes with it (it was kept: '... south. ' before '\nQuestion:'): the
    # ablated prompt is the prompt of the context without that source
    assert prompt.kept_context([False, True, False])[0] == 'The penguin lives in the south.'
    assert prompt.kept_context([True, True, False])[0] == CONTEXT[: CONTEXT.index(' A bear')]
    assert prompt.kept_context([False, False, False])[0] == ''
    text, spans = prompt.text([True, False, True])
    assert spans[1] is None and [text[a:b] for a, b in (spans[0], spans[2])] == [prompt.sources[0], prompt.sources[2]]
    joined, spans = source_spans(['doc one.', 'doc two.'], 'documents')
    assert joined == 'doc one.\n\ndoc two.' and [joined[a:b] for a, b in spans] == ['doc one.', 'doc two.']


def test_chat_template_sources_and_generated_response(llama, chat_tokenizer):
    result = explain_sources(
        llama, chat_tokenizer, 'A bear. The ice bear lives. A penguin.', 'where?', max_new_tokens=3
    )
    assert result.prompt.chat
    text, spans = result.prompt.text()
    assert text.startswith('<s>user\nContext: ') and [text[a:b] for a, b in spans] == result.sources
    assert len(result.response_ids) >= 1
    ids = explain(llama, [{'role': 'user', 'content': 'x'}], tokenizer=chat_tokenizer).input_ids
    assert int(ids[0, 0]) == 1  # the template's <s>, as the prompt's ids have it
    assert result.prompt.ids()[0] == 1


@pytest.mark.parametrize('template', ['{context}\n{query}\nAnswer:', '{query}\n{context}\nAnswer:'])
def test_slots_are_filled_once(zero_llama, tokenizer, template):
    """A context holding the literal ``{query}`` (and a query holding ``{context}``) stays as it is: before, the query
    was filled into the context too, and every later source was scored on shifted text."""
    context = 'The bear is in the {query} Arctic. A bear is big.'
    query = 'where {context}?'
    result = explain_sources(zero_llama, tokenizer, context, query, RESPONSE, method='cplrp', template=template)
    text, spans = result.prompt.text()
    assert [text[a:b] for a, b in spans] == result.sources
    assert result.sources == ['The bear is in the {query} Arctic.', 'A bear is big.']
    assert text == template.format(context=context, query=query)


def test_a_generated_response_is_explained_as_its_ids(zero_llama, tokenizer, monkeypatch):
    """A response generated byte by byte (' ', 'b', 'e', 'a', 'r', then the end-of-sequence token) decodes to ' bear',
    which tokenises to one other id: the generated ids are explained (before, the one id of ' bear'), their scores and
    the rest summing to their logits (CP-LRP without biases)."""
    generated = [tokenizer.convert_tokens_to_ids(piece) for piece in ['Ġ', 'b', 'e', 'a', 'r']]
    assert tokenizer(tokenizer.decode(generated))['input_ids'] != generated
    end = torch.tensor(generated + [tokenizer.eos_token_id])
    monkeypatch.setattr(sources, 'generate_answer', lambda model, tokenizer, ids, new_tokens: end)
    result = explain_sources(zero_llama, tokenizer, CONTEXT, QUERY, method='cplrp', objective='logit')
    assert result.response_ids == generated and result.response == ' bear'
    ids = torch.tensor([result.prompt.ids() + generated])
    start = ids.shape[1] - len(generated)
    with torch.no_grad():
        logits = zero_llama(ids).logits[0]
    expected = math.fsum(float(logits[start - 1 + i, t]) for i, t in enumerate(generated))
    assert result.value == pytest.approx(expected, abs=1e-10)
    assert float(result.scores.sum()) + result.segments.other == pytest.approx(expected, abs=1e-9)
    assert result.segments.total == pytest.approx(expected, abs=1e-9)
    assert result.segments.positions[-len(generated) :] == list(range(start, ids.shape[1]))


def test_an_empty_generated_response_is_refused(zero_llama, tokenizer, monkeypatch):
    end = torch.tensor([tokenizer.eos_token_id])
    monkeypatch.setattr(sources, 'generate_answer', lambda model, tokenizer, ids, new_tokens: end)
    with pytest.raises(ValueError, match='generated an empty response'):
        explain_sources(zero_llama, tokenizer, CONTEXT, QUERY)


def test_views(llama, tokenizer):
    result = explain_sources(llama, tokenizer, CONTEXT, QUERY, RESPONSE)
    stream = io.StringIO()
    result.show(color=False, stream=stream)
    assert 'The penguin lives in the south.' in stream.getvalue()
    assert 'A bear is big.' in result.to_html()


def test_refusals(llama, tokenizer):
    with pytest.raises(ValueError, match='objective'):
        explain_sources(llama, tokenizer, CONTEXT, QUERY, RESPONSE, objective='probability')
    with pytest.raises(ValueError, match='reduce'):
        explain_sources(llama, tokenizer, CONTEXT, QUERY, RESPONSE, reduce='max')
    with pytest.raises(ValueError, match='list of documents'):
        explain_sources(llama, tokenizer, CONTEXT, QUERY, RESPONSE, sources='documents')
    with pytest.raises(ValueError, match='chat template'):
        explain_sources(llama, tokenizer, CONTEXT, QUERY, RESPONSE, chat=True)
    with pytest.raises(ValueError, match='in order'):
        explain_sources(llama, tokenizer, CONTEXT, QUERY, RESPONSE, sources=[(10, 20), (5, 8)])
    with pytest.raises(ValueError, match='contrast'):
        explain(llama, torch.tensor([[5, 6, 7]]), contrast=4, objective='log_probability')


def test_the_citer_gives_the_function_s_numbers_once(llama, tokenizer, monkeypatch):
    """SourceCiter (ContextCite's shape): the scores of explain_sources with the same arguments, computed on first use
    and kept; top_k lists the highest-scored sources as SourceExplanation.top does."""
    direct = explain_sources(llama, tokenizer, CONTEXT, QUERY, RESPONSE, reduce='positive')
    calls = []
    original = sources.explain_sources

    def counted(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(sources, 'explain_sources', counted)
    citer = SourceCiter(llama, tokenizer, CONTEXT, QUERY, RESPONSE, reduce='positive')
    assert calls == []
    scores = citer.get_attributions()
    assert torch.equal(scores, direct.scores) and scores.dtype == torch.float64
    assert bool((scores != 0).any()) and len(set(scores.tolist())) > 1
    assert citer.get_attributions(top_k=2) == direct.top(2) == direct.sorted()[:2]
    assert citer.sources == direct.sources and citer.response == RESPONSE
    assert len(calls) == 1
    scores[0] = 1e9  # a copy: the kept attributions do not change
    assert torch.equal(citer.get_attributions(), direct.scores)
    with pytest.raises(ValueError, match='top_k must be a positive integer'):
        citer.get_attributions(top_k=0)


def test_palrp_scores_are_of_position_token_pairs(tokenizer):
    """PA-LRP (a composite with ``positions=True``): each source's score holds its tokens' and their positions'
    relevance, so that with CP-LRP on the bias-free GPT-2 the scores and the rest sum to the response's logits.
    Before: the tokens' share alone, the positions dropped without a word."""
    from zennit_attn.composites import CPLRPEpsilon

    model = tiny_model('gpt2', zero_bias=True)
    result = explain_sources(
        model, tokenizer, CONTEXT, QUERY, RESPONSE, composite=CPLRPEpsilon(positions=True), objective='logit'
    )
    assert float(result.scores.sum()) + result.segments.other == pytest.approx(result.value, abs=1e-10)
    tokens = explain_sources(model, tokenizer, CONTEXT, QUERY, RESPONSE, composite=CPLRPEpsilon(), objective='logit')
    assert abs(float(tokens.scores.sum()) + tokens.segments.other - tokens.value) > 1e-4
