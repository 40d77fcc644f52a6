"""Relevance summed over character spans, template slots and sentences (zennit_attn.results.segments): which token goes
where (the first non-whitespace character decides), sums that add up to the row's total, clear errors."""

from __future__ import annotations

import io
import math
import re
from fractions import Fraction

import pytest
import torch

from tests.models import tiny_model
from tests.text_tokenizer import byte_level_tokenizer, sentencepiece_tokenizer
from zennit_attn import Explanation, explain
from zennit_attn.results.render.colors import css_rgb, relevance_to_rgb
from zennit_attn.results.segments import Template, assign_tokens, sentences, token_offsets

TEMPLATE = 'Question: {question}\nAnswer: {answer}'
QUESTION, ANSWER = 'where does the ice bear live?', 'in the Arctic.'


def made(tokenizer, text: str, values, bos: bool = False) -> Explanation:
    """An explanation of ``text`` with the given relevance (no model), to check sums exactly."""
    ids = torch.tensor([tokenizer(text).input_ids])
    relevance = torch.tensor([values], dtype=torch.float64)
    assert relevance.shape == ids.shape, (ids, relevance)
    return Explanation(
        relevance=relevance,
        embedding_relevance=None,
        target=torch.tensor([0]),
        logit=torch.tensor([1.0]),
        position=torch.tensor([ids.shape[1] - 1]),
        input_ids=ids,
        tokenizer=tokenizer,
    )


# ------------------------------------------------------------------------------------------------------ templates
def test_template_builds_text_and_spans():
    template = Template(TEMPLATE, question=QUESTION, answer=ANSWER)
    assert template.text == f'Question: {QUESTION}\nAnswer: {ANSWER}'
    assert template.names == ['question', 'answer']
    start = len('Question: ')
    assert template.spans == {
        'question': (start, start + len(QUESTION)),
        'answer': (start + len(QUESTION) + len('\nAnswer: '), len(template.text)),
    }
    for name, (begin, end) in template.spans.items():
        assert template.text[begin:end] == template.values[name]
    braces = Template('{{literal}} {a}', a='x')
    assert braces.text == '{literal} x' and braces.spans == {'a': (10, 11)}


@pytest.mark.parametrize(
    'template, values, message',
    [
        ('Context: {context}', {'context': 'a', 'question': 'b'}, r"the template has no slot\(s\) \['question'\]"),
        ('{a} and {a}', {'a': 'x'}, r"slot\(s\) \['a'\] appear more than once"),
        ('{a} and {b}', {'a': 'x'}, r"no value for template slot\(s\) \['b'\]"),
        ('no slots here', {}, 'has no slots'),
        ('{} here', {}, 'is not a name'),
        ('{0} here', {}, 'is not a name'),
        ('{a.b} here', {}, 'is not a name'),
        ('{a:>3}', {'a': 'x'}, 'format spec or conversion'),
        ('{a!r}', {'a': 'x'}, 'format spec or conversion'),
        ('{a} }', {'a': 'x'}, 'cannot read the template'),
    ],
)
def test_template_refuses_bad_templates(template, values, message):
    with pytest.raises(ValueError, match=message):
        Template(template, **values)


def test_template_refuses_a_value_that_is_not_text():
    with pytest.raises(TypeError, match="value of slot 'a' must be a str"):
        Template('{a}', a=3)


# ------------------------------------------------------------------------------------------------------ sentences
@pytest.mark.parametrize(
    'text, expected',
    [
        (
            'The ice bear lives in the Arctic. It eats seals!  Does it? Yes.',
            ['The ice bear lives in the Arctic.', 'It eats seals!', 'Does it?', 'Yes.'],
        ),
        (
            'Dr. Smith met Mr. J. R. Tolkien, e.g. in the U.S. in 1950. Then he left.',
            ['Dr. Smith met Mr. J. R. Tolkien, e.g. in the U.S. in 1950.', 'Then he left.'],
        ),
        (
            'It costs 3.50 euros. "Really?" he asked. "Yes." 2001 was a year.',
            ['It costs 3.50 euros.', '"Really?" he asked.', '"Yes."', '2001 was a year.'],
        ),
        (
            '  Context: bears\nQuestion: where?\n\nAnswer: north  ',
            ['Context: bears', 'Question: where?', 'Answer: north'],
        ),
        ('no end stop', ['no end stop']),
        ('   \n ', []),
        # ideographic stops need no space after them; quotes that close after them stay with them
        ('北京是首都。它很大！「真的吗？」是的。', ['北京是首都。', '它很大！', '「真的吗？」', '是的。']),
        ('東京は首都です。人口は多い｡', ['東京は首都です。', '人口は多い｡']),
        # scripts without case: the next word starts a sentence after a stop and a space
        ('दिल्ली राजधानी है। यह बड़ी है।', ['दिल्ली राजधानी है।', 'यह बड़ी है।']),
        ('القاهرة عاصمة. هل هي كبيرة؟ نعم', ['القاهرة عاصمة.', 'هل هي كبيرة؟', 'نعم']),
        ('Москва — столица. Она большая.', ['Москва — столица.', 'Она большая.']),
    ],
)
def test_sentences(text, expected):
    spans = sentences(text)
    assert [text[start:end] for start, end in spans] == expected
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))


# ------------------------------------------------------------------------------------------- tokens to segments
def test_straddling_token_goes_where_its_first_non_space_character_is(tokenizer):
    text = 'The ice bear lives'
    ids = tokenizer(text).input_ids
    assert [tokenizer.decode([token]) for token in ids] == ['The', ' ice', ' bear', ' lives']
    offsets = token_offsets(tokenizer, ids, text)
    # ' ice' covers characters 3-6 (' ice'); its first non-space character 'i' is character 4
    assert assign_tokens(offsets, [(0, 5), (5, 18)], text) == [0, 0, 1, 1]  # 'ice' straddles 5: 'i' in span 0
    assert assign_tokens(offsets, [(0, 4), (4, 18)], text) == [0, 1, 1, 1]  # the space alone does not decide
    assert assign_tokens(offsets, [(0, 3), (5, 18)], text) == [0, -1, 1, 1]  # 'i' in no span: other
    assert assign_tokens(offsets, [(8, 18), (0, 3)], text) == [1, -1, 0, 0]  # spans in any order
    assert assign_tokens([None, (0, 3)], [(0, 3)], 'The') == [-1, 0]  # no characters: other
    assert assign_tokens([(3, 5)], [(4, 5)], 'ab   ') == [-1]  # whitespace only: its first character decides


def test_segments_of_a_straddling_span_sum_their_tokens(tokenizer):
    text = 'The ice bear lives'
    explanation = made(tokenizer, text, [0.5, 0.25, -0.125, 2.0])
    result = explanation.segments([(5, 18), (0, 5)], labels=['rest', 'head'])
    assert result.token_segment == [1, 1, 0, 0]
    assert result.relevance.tolist() == [-0.125 + 2.0, 0.5 + 0.25]
    assert result.other == 0.0 and result.total == 2.625
    assert result.as_dict() == {'rest': 1.875, 'head': 0.75, 'other': 0.0}


def test_template_segments_and_other_add_up_exactly(tokenizer):
    template = Template(TEMPLATE, question=QUESTION, answer=ANSWER)
    ids = tokenizer(template.text).input_ids
    values = [(index - 7) / 64 for index in range(len(ids))]  # dyadic: every float sum below is exact
    explanation = made(tokenizer, template.text, values)
    result = explanation.segments(template)
    texts = [tokenizer.decode([token]) for token in ids]
    question = [k for k, t in enumerate(texts) if result.token_segment[k] == 0]
    answer = [k for k, t in enumerate(texts) if result.token_segment[k] == 1]
    assert ''.join(texts[k] for k in question).strip() == QUESTION
    assert ''.join(texts[k] for k in answer).strip() == ANSWER
    assert ''.join(texts[k] for k, s in enumerate(result.token_segment) if s == -1) == 'Question:\nAnswer:'
    assert result.labels == ['question', 'answer'] and result.spans == list(template.spans.values())
    assert result.relevance.tolist() == [sum(values[k] for k in question), sum(values[k] for k in answer)]
    assert result.relevance.sum().item() + result.other == result.total == sum(values)
    assert result.other == sum(values[k] for k, s in enumerate(result.token_segment) if s == -1)


def test_real_explanation_partition_is_exact(llama, tokenizer):
    """Each token counts once: the segments and other add up to the row's relevance in exact arithmetic, and
    each float sum is the correctly rounded sum of its tokens."""
    template = Template(
        'Context: {context}\nQuestion: {question}',
        context='The ice bear lives in the Arctic.',
        question='where does the ice bear live?',
    )
    explanation = explain(llama, template.text, tokenizer=tokenizer)
    result = explanation.segments(template)
    values = explanation.relevance[0].double().tolist()
    exact = [Fraction(0)] * 2
    other = Fraction(0)
    for value, segment in zip(values, result.token_segment):
        if segment == -1:
            other += Fraction(value)
        else:
            exact[segment] += Fraction(value)
    assert sum(exact) + other == sum(map(Fraction, values))
    assert result.relevance.tolist() == [float(part) for part in exact]
    assert result.other == float(other) and result.total == float(sum(map(Fraction, values)))
    assert math.isclose(result.relevance.sum().item() + result.other, explanation.relevance.sum().item(), rel_tol=1e-6)
    assert result.token_segment.count(0) >= 7 and result.token_segment.count(1) >= 7


def test_special_tokens_and_padding_go_to_other_or_nowhere(llama):
    tokenizer = byte_level_tokenizer(bos=True)
    texts = ['The ice bear lives in the Arctic.', 'The ice bear']
    explanation = explain(tiny_model('llama', attn_implementation='sdpa'), texts, tokenizer=tokenizer)
    assert explanation.input_ids[0, 0] == 1 and explanation.attention_mask[1].sum() < explanation.input_ids.shape[1]
    first = explanation.segments([(0, 12)], text=texts[0])
    assert first.token_segment[0] == -1 and first.positions[0] == 0  # '<s>': no characters
    assert first.other_text.startswith('<s>')
    second = explanation.segments('sentences', row=1)  # default text: the ids decoded, padding left out
    assert second.text == 'The ice bear' and second.labels == ['sentence 1']
    keep = explanation.attention_mask[1] != 0
    assert second.positions == torch.nonzero(keep)[:, 0].tolist()
    assert second.token_segment == [-1, 0, 0, 0]
    values = explanation.relevance[1][keep].double().tolist()
    assert second.other == values[0] and second.relevance.tolist() == [math.fsum(values[1:])]


def test_sentencepiece_offsets(llama):
    tokenizer = sentencepiece_tokenizer()
    text = 'The ice bear lives'
    explanation = explain(llama, text, tokenizer=tokenizer)
    result = explanation.segments([(0, 7), (8, 18)])
    texts = explanation.tokens()
    assert [''.join(t for t, s in zip(texts, result.token_segment) if s == k).strip() for k in (0, 1)] == [
        'The ice',
        'bear lives',
    ]
    assert result.labels == ['span 0', 'span 1']


# ------------------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    'spans, labels, message',
    [
        ([(0, 5), (4, 9)], None, r'spans 0 \(0, 5\) and 1 \(4, 9\) overlap'),
        ([(10, 18), (0, 12)], None, r'spans 1 \(0, 12\) and 0 \(10, 18\) overlap'),
        ([(0, 19)], None, r'span 0 \(0, 19\) is outside the text or empty: .* <= 18'),
        ([(-1, 3)], None, 'outside the text'),
        ([(3, 3)], None, 'outside the text or empty'),
        ([], None, 'spans is empty'),
        ('words', None, "got 'words'"),
        ([(0, 3), (4, 7)], ['a'], 'one str per span: 2 spans'),
        ([(0, 3), (4, 7)], ['a', 'a'], 'must differ'),
        ([(0, 3)], ['other'], "from 'other'"),
        ([(0, 3), (3, 3)], ['head', 'tail'], r"span 1 \('tail'\) \(3, 3\) is outside the text or empty"),
        ([(0, 5), (4, 9)], ['head', 'tail'], r"spans 0 \('head'\) \(0, 5\) and 1 \('tail'\) \(4, 9\) overlap"),
    ],
)
def test_bad_spans_are_refused(tokenizer, spans, labels, message):
    explanation = made(tokenizer, 'The ice bear lives', [1.0] * 4)
    with pytest.raises(ValueError, match=message):
        explanation.segments(spans, labels=labels)


def test_bad_span_types_are_refused(tokenizer):
    explanation = made(tokenizer, 'The ice bear lives', [1.0] * 4)
    with pytest.raises(TypeError, match='pair of ints'):
        explanation.segments([(0.0, 3)])
    with pytest.raises(TypeError, match="a Template or 'sentences'"):
        explanation.segments(5)


def test_text_that_is_not_the_explained_one_is_refused(tokenizer):
    explanation = made(tokenizer, 'The ice bear lives', [1.0] * 4)
    with pytest.raises(ValueError, match='does not tokenise to the explained ids .*first difference at token 2'):
        explanation.segments([(0, 3)], text='The ice lives')
    template = Template('{a} bear lives', a='The ice')
    with pytest.raises(ValueError, match="differs from the template's text"):
        explanation.segments(template, text='The ice bear')
    with pytest.raises(ValueError, match='labels= is not taken with a Template'):
        explanation.segments(template, labels=['x'])
    assert explanation.segments(template).relevance.tolist() == [2.0]


def test_ids_only_explanation_needs_a_tokenizer(tokenizer):
    explanation = made(tokenizer, 'The ice bear lives', [1.0] * 4)
    bare = Explanation(
        relevance=explanation.relevance,
        embedding_relevance=None,
        target=explanation.target,
        logit=explanation.logit,
        position=explanation.position,
        input_ids=explanation.input_ids,
    )
    with pytest.raises(
        ValueError,
        match='segments are character spans of the text, matched to tokens with the tokenizer: pass tokenizer=',
    ):
        bare.segments([(0, 3)], text='The ice bear lives')
    assert bare.segments([(0, 3)], text='The ice bear lives', tokenizer=tokenizer).relevance.tolist() == [1.0]


def test_tokenizer_without_offsets_is_refused(tokenizer):
    class Slow:
        all_special_ids = []

        def decode(self, ids, **kwargs):
            return tokenizer.decode(ids, **kwargs)

        def __call__(self, text, **kwargs):
            raise NotImplementedError('return_offset_mapping is not available when using Python tokenizers')

    explanation = made(tokenizer, 'The ice bear lives', [1.0] * 4)
    with pytest.raises(ValueError, match='need a fast tokenizer'):
        explanation.segments([(0, 3)], tokenizer=Slow())


# ----------------------------------------------------------------------------------------------------- rendering
def test_segments_render_their_sums(tokenizer):
    template = Template(TEMPLATE, question=QUESTION, answer=ANSWER)
    count = len(tokenizer(template.text).input_ids)
    values = [0.0] * count
    values[3], values[-1], values[0] = 1.5, -3.0, 0.25  # a question token, the answer's last, 'Question' (other)
    result = made(tokenizer, template.text, values).segments(template)
    assert result.relevance.tolist() == [1.5, -3.0] and result.other == 0.25
    (heatmap,) = result.heatmaps()
    assert heatmap.values == [1.5, -3.0, 0.25]
    assert [segment.label for segment in heatmap.segments] == [
        'question: +1.5',
        'answer: -3',
        'other (outside every segment): +0.25',
    ]
    assert heatmap.segments[0].tokens == [QUESTION] and heatmap.segments[1].tokens == [ANSWER]
    stream = io.StringIO()
    result.show(color=False, stream=stream)
    lines = stream.getvalue().splitlines()
    assert lines[0].endswith('relevance of 2 segment(s) and other, total -1.25')
    assert lines[1:] == [
        f'question: +1.5: {QUESTION}[+1.5]',
        f'answer: -3: {ANSWER}[-3]',
        'other (outside every segment): +0.25: Question | : | | A | ns | wer | :[+0.25]',
    ]
    page = result.to_html()
    boxes = re.findall(r'<span class="za-t[^"]*" data-i="0" style="background: (rgb\([^)]*\))', page)
    assert boxes == [css_rgb(relevance_to_rgb(value, 3.0)) for value in (1.5, -3.0, 0.25)]
    assert 'relevance sum -1.25' in page


def test_segments_save_every_format(tokenizer, tmp_path):
    result = made(tokenizer, 'The ice bear lives', [0.5, 0.25, -0.125, 2.0]).segments('sentences')
    for suffix in ('.html', '.tex', '.svg'):
        path = result.save(tmp_path / f'segments{suffix}')
        assert path.stat().st_size > 0
    assert 'sentence 1: +2.625' in (tmp_path / 'segments.html').read_text()


@pytest.mark.parametrize(
    'values, empty',
    [
        (dict(question='', answer=ANSWER), ['question']),
        (dict(question=QUESTION, answer=''), ['answer']),
        (dict(question='', answer=''), ['question', 'answer']),
    ],
)
def test_an_empty_template_slot_is_named(tokenizer, values, empty):
    """An empty slot has no characters, so no tokens: refused naming the slot (it was "span 0 (9, 9) is outside the
    text or empty", the slot's name left for the user to find)."""
    template = Template(TEMPLATE, **values)
    explanation = made(tokenizer, template.text, [1.0] * len(tokenizer(template.text).input_ids))
    with pytest.raises(ValueError, match=re.escape(f"template slot(s) {empty} are empty (value '')")):
        explanation.segments(template)
