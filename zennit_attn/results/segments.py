"""Relevance summed over parts of the input: sentences, documents of a retrieval prompt, few-shot examples, chat turns,
or any character spans of the explained text (:py:class:`SegmentExplanation`, made by
:py:meth:`zennit_attn.Explanation.segments`); a :py:class:`Template` with named slots that builds a prompt and
knows each slot's span; :py:func:`sentences`, a built-in segmentation; and :py:func:`first_token_share`, the share
of the relevance that an attention sink (the first token) takes.

Tokens and characters are matched through the tokenizer's offset mapping: the text is tokenised again (without
special tokens) and must give the explained ids (special tokens of the explanation, such as a beginning-of-sequence
token, are skipped in the comparison and have no characters). Each token is assigned to at most one segment by one
rule: **a token belongs to the segment that holds its first non-whitespace character** (a token of whitespace only:
its first character). So ``' bear'`` belongs to the segment where ``'b'`` is, and a token that straddles a boundary
(``'ear'`` of a span ending after ``'e'``) belongs to the segment where it starts. Tokens outside every segment
(template text between slots, whitespace between spans, special tokens, a token of no characters) go to
:py:attr:`SegmentExplanation.other`, so that ``relevance.sum() + other == total``.
"""

from __future__ import annotations

import bisect
import math
import numbers
import os
import re
import string
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import torch

from .render.layout import Heatmap, ScaleLike, Segment, format_relevance
from .render.views import explanation_heatmaps, heatmaps_html, resolve_tokenizer, save_heatmaps, show_heatmaps

__all__ = [
    'Template',
    'sentences',
    'token_offsets',
    'assign_tokens',
    'SegmentExplanation',
    'segment_explanation',
    'first_token_share',
    'SpansLike',
]

#: what :py:meth:`zennit_attn.Explanation.segments` takes: character spans ``[(start, end), ...]``, a
#: :py:class:`Template`, or ``'sentences'``
SpansLike = Sequence[tuple[int, int]] | str | object

#: words after which a full stop does not end a sentence (compared in lower case, without the stop)
ABBREVIATIONS = frozenset(
    {
        'mr',
        'mrs',
        'ms',
        'dr',
        'prof',
        'sr',
        'jr',
        'st',
        'mt',
        'vs',
        'etc',
        'cf',
        'al',
        'fig',
        'figs',
        'eq',
        'no',
        'nos',
        'vol',
        'pp',
        'ca',
        'approx',
        'inc',
        'ltd',
        'co',
        'corp',
        'dept',
        'gen',
        'gov',
        'sen',
        'rep',
        'rev',
        'lt',
        'col',
        'sgt',
        'capt',
        'jan',
        'feb',
        'mar',
        'apr',
        'jun',
        'jul',
        'aug',
        'sep',
        'sept',
        'oct',
        'nov',
        'dec',
    }
)
_OTHER = 'other'
#: a sentence end: stops (with closing quotes or brackets) then whitespace (``stop``); the ideographic stops of
#: Chinese and Japanese, which no whitespace follows (``wide``); or a line break. The stops: Latin, the ellipsis,
#: the Devanagari danda, the Arabic question mark and full stop
_END = re.compile(
    r'(?P<stop>[.!?\u2026\u0964\u061f\u06d4]+)["\'\u201d\u2019)\]]*(?=\s)'
    r'|(?P<wide>[\u3002\uff01\uff1f\uff61]+)[\u300d\u300f\u201d\u2019\uff09\u3011]*'
    r'|\n'
)
_STARTS = re.compile(r'\s*(["\'\u201c\u2018(\[]*)(\S)')


class Template:
    """A prompt built from a template with named slots (captum's ``TextTemplateInput`` idea), which knows the
    character span of each slot's value in the text it builds.

    ``Template('Context: {context}\\nQuestion: {question}', context=doc, question=q)`` has ``text`` (the prompt),
    ``names`` (the slots in order) and ``spans`` (``{'context': (9, 9 + len(doc)), ...}``). Pass ``template.text``
    to :py:func:`~zennit_attn.explain` and the template to :py:meth:`~zennit_attn.Explanation.segments`; the template
    text between the slots goes to ``other``. ``{{`` and ``}}`` are literal braces.

    Parameters
    ----------
    template: str
        The text with ``{name}`` slots; each slot appears once, without a format spec or conversion.
    **values: str
        One value per slot.

    Raises
    ------
    ValueError
        For a template without slots, an unnamed (``{}``), indexed (``{0}``, ``{a.b}``) or formatted (``{a:>3}``)
        slot, a slot that appears twice, a slot without a value, a value for a slot the template does not have, or
        a malformed template (a single ``{`` or ``}``).
    TypeError
        For a value that is not a str.
    """

    def __init__(self, template: str, /, **values: str):
        if not isinstance(template, str):
            raise TypeError(f'the template must be a str, got {type(template).__name__}')
        parsed = _parse_template(template)
        names = _slot_names(parsed, template)
        _check_slot_values(names, values)
        pieces, spans = [], {}
        length = 0
        for literal, name, _, _ in parsed:
            pieces.append(literal)
            length += len(literal)
            if name is not None:
                spans[name] = (length, length + len(values[name]))
                pieces.append(values[name])
                length += len(values[name])
        self.template = template
        self.values = dict(values)
        self.names = names
        self.spans = spans
        self.text = ''.join(pieces)

    def __repr__(self) -> str:
        return f'Template({self.template!r}, {", ".join(f"{k}={v!r}" for k, v in self.values.items())})'


def _parse_template(template: str) -> list[tuple]:
    """``(literal, name, spec, conversion)`` of each piece of ``template`` (:py:meth:`string.Formatter.parse`); a
    malformed template (a single brace) is refused."""
    try:
        return list(string.Formatter().parse(template))
    except ValueError as error:
        raise ValueError(
            f'cannot read the template {template!r}: {error} (write a literal brace as {{{{ or }}}})'
        ) from error


def _slot_names(parsed: list[tuple], template: str) -> list[str]:
    """The slot names of a parsed template, in order; refused: no slots, a slot that is not a name (``{}``,
    ``{0}``, ``{a.b}``), has a format spec or conversion, or appears twice."""
    names = [name for _, name, _, _ in parsed if name is not None]
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if not name.isidentifier():
            raise ValueError(f'template slot {{{name}}} is not a name: use named slots such as {{context}}')
        if spec or conversion:
            raise ValueError(
                f'template slot {{{name}}} has a format spec or conversion; slots take the value as '
                'it is: write {' + name + '}'
            )
    if not names:
        raise ValueError(f'the template {template!r} has no slots: write them as {{name}}')
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(
            f'template slot(s) {twice} appear more than once; each slot must appear once so that its '
            'span is one piece of the text (give each place its own name, e.g. {doc1} and {doc2})'
        )
    return names


def _check_slot_values(names: list[str], values: dict) -> None:
    """Refuse a slot without a value, a value for a slot the template does not have, and a value that is not a
    str."""
    missing = [name for name in names if name not in values]
    if missing:
        raise ValueError(
            f'no value for template slot(s) {missing}: pass them as keywords, e.g. '
            f'Template(template, {missing[0]}="...")'
        )
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise ValueError(f'the template has no slot(s) {unknown}; its slots are {names}')
    for name, value in values.items():
        if not isinstance(value, str):
            raise TypeError(f'the value of slot {name!r} must be a str, got {type(value).__name__}')


def sentences(text: str) -> list[tuple[int, int]]:
    """Split ``text`` into sentences: their character spans, without the whitespace around them.

    Rules: a sentence ends after ``.``, ``!``, ``?`` or ``…`` (and the closing quotes or brackets after them) that
    whitespace follows, when the next word starts with an upper-case letter, a letter of a script without case
    (Devanagari, Arabic, Chinese), a digit or an opening quote or bracket; not after an abbreviation of
    :py:data:`ABBREVIATIONS` (``Dr.``, ``etc.``), a single letter (the initial ``J.``) or a word with inner stops
    (``e.g.``, ``U.S.``). The danda ``।`` and the Arabic ``؟`` and ``۔`` end a sentence as ``.`` does; the
    ideographic stops ``。``, ``！``, ``？`` (Chinese, Japanese) end one whatever follows. A line break always ends a
    sentence (lines of a prompt, list items). Text without such an end is one sentence.

    Parameters
    ----------
    text: str

    Returns
    -------
    list of tuple of int
        ``(start, end)`` of each sentence, in order, not overlapping; empty for a text of whitespace only.
    """
    if not isinstance(text, str):
        raise TypeError(f'text must be a str, got {type(text).__name__}')
    cuts = []
    for match in _END.finditer(text):
        end = match.end()
        if match.group('stop'):
            start_of_word = max(text.rfind(' ', 0, match.start()), text.rfind('\n', 0, match.start())) + 1
            word = text[start_of_word : match.start()]
            bare = word.lstrip('"\'\u201c\u2018([').lower()
            if match.group('stop') == '.' and (
                bare in ABBREVIATIONS
                or (len(bare) == 1 and bare.isalpha())
                or ('.' in bare and bare.replace('.', '').isalpha())
            ):
                continue
            following = _STARTS.match(text, end)
            if following is None:
                continue  # only whitespace follows: the end of the text
            head = following.group(2)
            caseless = head.isalpha() and head.lower() == head.upper()
            if not (head.isupper() or caseless or head.isdigit() or following.group(1)):
                continue
        cuts.append(end)
    spans, start = [], 0
    for end in cuts + [len(text)]:
        piece = text[start:end]
        lead = len(piece) - len(piece.lstrip())
        trail = len(piece) - len(piece.rstrip())
        if piece.strip():
            spans.append((start + lead, end - trail))
        start = end
    return spans


def _encode(tokenizer, text: str):
    try:
        encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    except NotImplementedError as error:
        raise ValueError(
            'character spans need a fast tokenizer (with an offset mapping): load it with '
            'AutoTokenizer.from_pretrained(..., use_fast=True)'
        ) from error
    return list(encoding['input_ids']), [tuple(pair) for pair in encoding['offset_mapping']]


def token_offsets(tokenizer, ids: Sequence[int], text: str) -> list[tuple[int, int] | None]:
    """The character span of each of ``ids`` in ``text``, by tokenising ``text`` again with offsets.

    ``text`` tokenised without special tokens must give ``ids``, or ``ids`` without their special tokens (which then
    get None: no characters).

    Parameters
    ----------
    tokenizer
        A fast Hugging Face tokenizer.
    ids: sequence of int
        The explained token ids (padding removed).
    text: str
        The text they were tokenised from.

    Returns
    -------
    list
        ``(start, end)`` per token, None for a token without characters.

    Raises
    ------
    ValueError
        Where ``text`` does not tokenise to ``ids``, or the tokenizer has no offset mapping.
    """
    ids = [int(token) for token in ids]
    again, offsets = _encode(tokenizer, text)
    if again == ids:
        return [pair if pair[1] > pair[0] else None for pair in offsets]
    special = set(getattr(tokenizer, 'all_special_ids', None) or ())
    kept = [index for index, token in enumerate(ids) if token not in special]
    mine = [(token, pair) for token, pair in zip(again, offsets) if token not in special]
    if [ids[index] for index in kept] != [token for token, _ in mine]:
        plain = [ids[index] for index in kept]
        first = next(
            (k for k, (a, b) in enumerate(zip(plain, [t for t, _ in mine])) if a != b), min(len(plain), len(mine))
        )
        raise ValueError(
            f'the text does not tokenise to the explained ids ({len(mine)} tokens against {len(plain)} '
            f'without special tokens, first difference at token {first}): pass text= the text that '
            'was explained (with a chat template: the templated text)'
        )
    result: list[tuple[int, int] | None] = [None] * len(ids)
    for index, (_, pair) in zip(kept, mine):
        result[index] = pair if pair[1] > pair[0] else None
    return result


def _check_spans(spans, length: int, labels: Sequence[str] | None = None) -> list[tuple[int, int]]:
    """``spans`` as ``(start, end)`` pairs, refused where one is not a pair of ints, outside the text, empty or
    overlapping another; each is named by its index and, where ``labels`` has one for it, its label."""
    if isinstance(spans, (str, bytes)) or not isinstance(spans, Sequence):
        raise TypeError(
            f"spans must be a list of (start, end) character spans, a Template or 'sentences', got {spans!r}"
        )

    def tag(index: int) -> str:
        label = labels[index] if labels is not None and index < len(labels) else None
        return f'{index}' + (f' ({label!r})' if isinstance(label, str) else '')

    checked = []
    for index, span in enumerate(spans):
        if (
            not isinstance(span, Sequence)
            or len(span) != 2
            or not all(isinstance(value, numbers.Integral) and not isinstance(value, bool) for value in span)
        ):
            raise TypeError(f'span {tag(index)} must be a pair of ints (start, end), got {span!r}')
        start, end = int(span[0]), int(span[1])
        if not 0 <= start < end <= length:
            raise ValueError(
                f'span {tag(index)} {tuple(span)} is outside the text or empty: spans are (start, end) '
                f'with 0 <= start < end <= {length} (the length of the text)'
            )
        checked.append((start, end))
    if not checked:
        raise ValueError('spans is empty: give at least one (start, end) character span')
    order = sorted(range(len(checked)), key=lambda index: checked[index])
    for before, after in zip(order, order[1:]):
        if checked[after][0] < checked[before][1]:
            raise ValueError(
                f'spans {tag(before)} {checked[before]} and {tag(after)} {checked[after]} overlap: a '
                'character may belong to one segment only'
            )
    return checked


def assign_tokens(offsets: Sequence[tuple[int, int] | None], spans: Sequence[tuple[int, int]], text: str) -> list[int]:
    """The segment of each token: the index of the span that holds its first non-whitespace character (a token of
    whitespace only: its first character), -1 for a token in no span or without characters (``other``).

    Parameters
    ----------
    offsets: sequence of (int, int) or None
        Each token's character span (:py:func:`token_offsets`).
    spans: sequence of (int, int)
        Non-overlapping character spans.
    text: str

    Returns
    -------
    list of int
    """
    order = sorted(range(len(spans)), key=lambda index: spans[index])
    starts = [spans[index][0] for index in order]
    result = []
    for pair in offsets:
        if pair is None:
            result.append(-1)
            continue
        start, end = pair
        piece = text[start:end]
        anchor = start + (len(piece) - len(piece.lstrip())) if piece.strip() else start
        slot = bisect.bisect_right(starts, anchor) - 1
        inside = slot >= 0 and spans[order[slot]][0] <= anchor < spans[order[slot]][1]
        result.append(order[slot] if inside else -1)
    return result


def _shorten(text: str, width: int = 60) -> str:
    flat = ' '.join(text.split())
    if len(flat) <= width:
        return flat
    head = (width - 3) * 2 // 3
    return flat[:head].rstrip() + ' \u2026 ' + flat[-(width - 3 - head) :].lstrip()


@dataclass
class SegmentExplanation:
    """Relevance of one row of an :py:class:`~zennit_attn.Explanation` summed over segments of its text
    (:py:meth:`zennit_attn.Explanation.segments`); it shows and saves itself like the explanation, one coloured box
    per segment, labelled with its sum.

    Attributes
    ----------
    labels: list of str
        One per segment (template slot names, ``'sentence 1'``, ...).
    spans: list of (int, int)
        Each segment's character span of ``text``.
    text: str
        The explained text.
    relevance: torch.Tensor
        ``[segments]`` float64: each segment's relevance, the sum (``math.fsum``) of its tokens' relevance.
    other: float
        The relevance of the tokens in no segment (special tokens, template text, whitespace between spans).
    total: float
        The relevance of all tokens of the row (padding excluded; the encoder's for encoder-decoder models).
        ``relevance.sum() + other`` equals it up to the rounding of each sum (exactly where the sums are exact).
    token_segment: list of int
        For each token of the row (padding removed), its segment, -1 for ``other``.
    positions: list of int
        The input position of each of those tokens.
    row: int
    title: str
        The explanation's caption of the row.
    other_text: str
        The text of the ``other`` tokens (joined with ``' | '``).
    """

    labels: list[str]
    spans: list[tuple[int, int]]
    text: str
    relevance: torch.Tensor
    other: float
    total: float
    token_segment: list[int]
    positions: list[int]
    row: int = 0
    title: str = ''
    other_text: str = field(default='', repr=False)

    def as_dict(self) -> dict[str, float]:
        """``{label: relevance, ..., 'other': other}``."""
        return {**dict(zip(self.labels, self.relevance.tolist())), _OTHER: self.other}

    def heatmaps(self) -> list[Heatmap]:
        """One :py:class:`~zennit_attn.results.render.layout.Heatmap`: a box per segment (its text shortened to 60
        characters, coloured by its sum), then ``other`` (scale not yet resolved)."""
        parts = []
        for index, (label, (start, end), value) in enumerate(zip(self.labels, self.spans, self.relevance.tolist())):
            members = [position for position, segment in zip(self.positions, self.token_segment) if segment == index]
            parts.append(
                Segment(
                    [_shorten(self.text[start:end])], [value], f'{label}: {format_relevance(value)}', [members or [-1]]
                )
            )
        members = [position for position, segment in zip(self.positions, self.token_segment) if segment == -1]
        parts.append(
            Segment(
                [_shorten(self.other_text) or '(no tokens)'],
                [self.other],
                f'{_OTHER} (outside every segment): {format_relevance(self.other)}',
                [members or [-1]],
            )
        )
        title = (
            f'{self.title}; relevance of {len(self.labels)} segment(s) and other, total {format_relevance(self.total)}'
        )
        return [Heatmap(parts, title=title)]

    def show(self, scale: ScaleLike = None, color: bool | None = None, stream: IO | None = None) -> None:
        """Print the segments (see :py:meth:`zennit_attn.Explanation.show`)."""
        show_heatmaps(self.heatmaps(), scale, color, stream)

    def to_html(self, scale: ScaleLike = None) -> str:
        """A standalone HTML page of the segments."""
        return heatmaps_html(self.heatmaps(), scale, title='Segment relevance')

    def _repr_html_(self) -> str:
        return heatmaps_html(self.heatmaps(), standalone=False)

    def save(self, path: str | os.PathLike, scale: ScaleLike = None, **options) -> Path:
        """Write the segments in the format of the suffix of ``path`` (``.html``, ``.png``, ``.svg``, ``.pdf``,
        ``.tex``; options as for :py:meth:`zennit_attn.Explanation.save`)."""
        return save_heatmaps(self.heatmaps(), path, scale, title='Segment relevance', **options)


def segment_explanation(
    explanation,
    spans: SpansLike,
    labels: Sequence[str] | None = None,
    text: str | None = None,
    row: int = 0,
    tokenizer=None,
) -> SegmentExplanation:
    """The relevance of ``row`` of ``explanation`` summed over segments of its text (the implementation of
    :py:meth:`zennit_attn.Explanation.segments`, which documents the parameters)."""
    try:
        tokenizer = resolve_tokenizer(tokenizer, explanation)
    except ValueError as error:
        raise ValueError(
            'segments are character spans of the text, matched to tokens with the tokenizer: pass '
            'tokenizer=..., or explain(model, text, tokenizer=tokenizer), which stores it'
        ) from error
    (heatmap,) = explanation_heatmaps(explanation, [row], False, tokenizer, template=True)  # every token counts
    row = int(row) % explanation.relevance.shape[0]
    tokens = heatmap.segments[0]
    positions = [group[0] for group in tokens.positions]
    ids = [int(explanation.input_ids[row, position]) for position in positions]
    values = explanation.relevance[row].detach().to('cpu', torch.float64)[positions].tolist()
    if isinstance(spans, Template):
        text, labels, spans = _template_segments(spans, text, labels)
    if text is None:
        text = tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    if not isinstance(text, str):
        raise TypeError(f'text must be a str, got {type(text).__name__}')
    if isinstance(spans, str):
        spans, labels = _sentence_segments(spans, text, labels)
    spans = _check_spans(spans, len(text), labels)
    labels = _segment_labels(labels, len(spans))
    assignment = assign_tokens(token_offsets(tokenizer, ids, text), spans, text)
    sums = [
        math.fsum(value for value, segment in zip(values, assignment) if segment == index)
        for index in range(len(spans))
    ]
    other = [index for index, segment in enumerate(assignment) if segment == -1]
    return SegmentExplanation(
        labels=labels,
        spans=spans,
        text=text,
        relevance=torch.tensor(sums, dtype=torch.float64),
        other=math.fsum(values[index] for index in other),
        total=math.fsum(values),
        token_segment=assignment,
        positions=positions,
        row=row,
        title=heatmap.title or '',
        other_text=' | '.join(tokens.tokens[index] for index in other),
    )


def _template_segments(template: Template, text: str | None, labels) -> tuple[str, list[str], list[tuple[int, int]]]:
    """``(text, labels, spans)`` of a :py:class:`Template`'s slots; refused: another ``text``, ``labels`` (the slot
    names are the labels), and an empty slot (no characters, hence no tokens and no relevance to sum)."""
    if text is not None and text != template.text:
        raise ValueError("text= differs from the template's text: leave text= out (the template builds it)")
    if labels is not None:
        raise ValueError('labels= is not taken with a Template: its slot names are the labels')
    empty = [name for name in template.names if not template.values[name]]
    if empty:
        raise ValueError(
            f"template slot(s) {empty} are empty (value ''): an empty slot has no characters, "
            'hence no tokens and no relevance to sum; give it text, or build the template without '
            'it'
        )
    return template.text, list(template.names), [template.spans[name] for name in template.names]


def _sentence_segments(spans: str, text: str, labels) -> tuple[list[tuple[int, int]], list[str]]:
    """``(spans, labels)`` of ``spans='sentences'``: the :py:func:`sentences` of ``text``, labelled ``sentence 1``,
    ... unless ``labels`` are given; any other string is refused."""
    if spans != 'sentences':
        raise ValueError(
            f"spans must be a list of (start, end) character spans, a Template or 'sentences', got {spans!r}"
        )
    spans = sentences(text)
    if not spans:
        raise ValueError('the text has no sentences (it is whitespace only)')
    return spans, [f'sentence {index + 1}' for index in range(len(spans))] if labels is None else labels


def _segment_labels(labels, count: int) -> list[str]:
    """The labels of ``count`` segments (default ``span 0``, ...): one distinct str per segment, none of them
    ``other``."""
    labels = [f'span {index}' for index in range(count)] if labels is None else list(labels)
    if len(labels) != count or not all(isinstance(label, str) for label in labels):
        raise ValueError(f'labels must be one str per span: {count} spans, got {labels!r}')
    if len(set(labels)) != len(labels) or _OTHER in labels:
        raise ValueError(
            f'labels must differ from each other and from {_OTHER!r} (the tokens in no segment), got {labels!r}'
        )
    return labels


def first_token_share(relevance: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The share of the first (non-padding) token in each row's absolute relevance, ``|R_first| / sum_i |R_i|``.

    Llama-, Qwen- and Gemma-like models attend heavily to the first token whatever it is (an *attention sink*,
    Xiao et al. 2024): its value vector is a place to put attention that should change nothing. Relevance can
    follow the attention there, so the first token may take a share that says little about the input's content; a
    share far above ``1 / tokens`` (the share of an even spread) is that effect. Measured with AttnLRP on
    SmolLM2-135M for 20 Wikipedia sentences of about 37 tokens (``benchmarks/attention_sinks.py``): 6 % on average
    (twice an even share), at most 19 %. The heatmaps can leave the first token out of the colour scale
    (``scale_without_first=True``) so that the other tokens keep their contrast where it dominates.

    Parameters
    ----------
    relevance: torch.Tensor
        ``[batch, seq]``.
    attention_mask: torch.Tensor, optional
        ``[batch, seq]``, 0 at padding (left or right).

    Returns
    -------
    torch.Tensor
        ``[batch]`` float64 in [0, 1]; NaN for a row whose relevance is 0 everywhere.
    """
    if relevance.dim() != 2:
        raise ValueError(f'relevance must be [batch, seq], got shape {tuple(relevance.shape)}')
    magnitude = relevance.detach().to(torch.float64).abs()
    keep = (
        torch.ones_like(magnitude, dtype=torch.bool)
        if attention_mask is None
        else attention_mask.to(magnitude.device) != 0
    )
    magnitude = magnitude.masked_fill(~keep, 0.0)
    first = keep.to(torch.int64).argmax(dim=1)
    return magnitude.gather(1, first[:, None])[:, 0] / magnitude.sum(dim=1)
