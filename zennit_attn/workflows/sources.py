"""Which part of the context made the model say this: context attribution in one backward pass.

:py:func:`explain_sources` puts a context (a text, or a list of documents) and a query into a prompt (plain, or the
model's chat template), lets the model answer (greedy) unless a response is given, explains the whole response (the
sum of its tokens' log-odds, log-probabilities or logits) by :py:func:`~zennit_attn.explain` in one backward pass, and
sums the relevance of the context's tokens per source (sentences, documents or character spans) with
:py:meth:`zennit_attn.Explanation.segments`. The result, a :py:class:`SourceExplanation`, lists the sources by score
and shows the context with each source coloured by its score (terminal, HTML, figures). :py:class:`SourceCiter` is
the same in ContextCite's shape: an object that holds the model, the tokenizer, the context and the query, computes
the attributions once and hands them out with ``get_attributions(top_k=)``.

:py:class:`SourcePrompt` is the prompt with the sources as parts that can be left out: the ablations of ContextCite
and of the metrics in :py:mod:`zennit_attn.workflows.evaluation.source_ablation` remove sources from the same prompt.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import torch

from ..explain import explain
from ..inputs.objectives import OBJECTIVES
from ..methods.propagation import method_of
from ..results.render.layout import Heatmap, ScaleLike, Segment, format_relevance
from ..results.render.views import heatmaps_html, save_heatmaps, show_heatmaps
from ..results.segments import SegmentExplanation, sentences
from .generation import generate_answer

__all__ = [
    'CHAT_TEMPLATE',
    'PLAIN_TEMPLATE',
    'REDUCTIONS',
    'SourcePrompt',
    'SourceExplanation',
    'SourceCiter',
    'explain_sources',
    'explain_response',
    'source_scores',
    'source_spans',
]

#: The user message of a chat prompt (ContextCite's default prompt).
CHAT_TEMPLATE = 'Context: {context}\n\nQuery: {query}'
#: A plain prompt for a model without chat template (the answer follows ``Answer:``).
PLAIN_TEMPLATE = 'Context: {context}\nQuestion: {query}\nAnswer:'
#: How the relevance of a source's tokens gives its score: their sum (default), the sum of the positive ones, the mean.
REDUCTIONS = ('sum', 'positive', 'mean')
#: The slots of a template (any other text of it, braces included, is literal).
_SLOTS = re.compile(r'\{(context|query)\}')


@dataclass
class SourcePrompt:
    """A prompt holding a context split into sources (any of which can be left out), and a query.

    Attributes
    ----------
    context: str
        The whole context.
    spans: list of (int, int)
        Each source's character span of ``context`` (in order, not overlapping).
    query: str
    template: str
        The prompt (plain) or the user message (chat) with ``{context}`` and ``{query}``.
    chat: bool
        Whether the tokenizer's chat template renders the user message (with its generation prompt).
    tokenizer
        The model's (fast) tokenizer.
    """

    context: str
    spans: list[tuple[int, int]]
    query: str
    template: str
    chat: bool
    tokenizer: object = field(repr=False, compare=False)

    def __post_init__(self):
        slots = _SLOTS.findall(self.template)
        for slot in ('context', 'query'):
            if slots.count(slot) != 1:
                raise ValueError(f'the template must hold {{{slot}}} once: {self.template!r}')
        if self.chat and not getattr(self.tokenizer, 'chat_template', None):
            raise ValueError(
                f'{type(self.tokenizer).__name__} has no chat template: use chat=False (a plain prompt) or set '
                "the model's chat template on the tokenizer"
            )
        ends = [0] + [end for _, end in self.spans]
        if not self.spans or any(
            start < previous or end <= start or end > len(self.context)
            for (start, end), previous in zip(self.spans, ends)
        ):
            raise ValueError(
                f'sources must be non-empty character spans of the context in order, not overlapping: {self.spans}'
            )

    @property
    def sources(self) -> list[str]:
        """The text of each source."""
        return [self.context[start:end] for start, end in self.spans]

    def kept_context(self, keep: Sequence[bool] | None = None) -> tuple[str, list[tuple[int, int] | None]]:
        """The context without the sources where ``keep`` is False (each with the text up to the next source; after
        the last source kept, the context's own end: removing the last sentence of ``'A. B. C.'`` leaves ``'A. B.'``,
        not ``'A. B. '``), and the span of every source in it (None for a removed one)."""
        keep = [True] * len(self.spans) if keep is None else [bool(value) for value in keep]
        if len(keep) != len(self.spans):
            raise ValueError(f'keep needs one value per source ({len(self.spans)}), got {len(keep)}')
        last = max((index for index, kept in enumerate(keep) if kept), default=None)
        pieces, spans = [self.context[: self.spans[0][0]]], []
        cursor = len(pieces[0])
        for index, (start, end) in enumerate(self.spans):
            if not keep[index]:
                spans.append(None)
                continue
            following = self.spans[index + 1][0] if index + 1 < len(self.spans) else len(self.context)
            pieces.append(self.context[start:following] if index != last else self.context[start:end])
            spans.append((cursor, cursor + end - start))
            cursor += len(pieces[-1])
        if last is not None:
            pieces.append(self.context[self.spans[-1][1] :])
        return ''.join(pieces), spans

    def text(self, keep: Sequence[bool] | None = None) -> tuple[str, list[tuple[int, int] | None]]:
        """The rendered prompt with the sources where ``keep`` is True, and each source's span in it (None where
        left out)."""
        context, spans = self.kept_context(keep)
        message, before = self.message(context)
        text = message
        if self.chat:
            text = self.tokenizer.apply_chat_template(
                [{'role': 'user', 'content': message}], tokenize=False, add_generation_prompt=True
            )
        found = text.find(message)
        if found < 0:
            raise ValueError("the chat template does not render the user's message as it is: cannot find the sources")
        start = found + before
        return text, [None if span is None else (start + span[0], start + span[1]) for span in spans]

    def message(self, context: str) -> tuple[str, int]:
        """The template with its slots filled by ``context`` and the query (each slot once, in the template's text
        only: a context or query holding ``{query}`` or ``{context}`` is not filled again), and where the context
        starts in it."""
        pieces = _SLOTS.split(self.template)  # literal, slot name, literal, slot name, literal
        filled, start = [], 0
        for index, piece in enumerate(pieces):
            if index % 2 == 0:
                filled.append(piece)
            elif piece == 'context':
                start = sum(map(len, filled))
                filled.append(context)
            else:
                filled.append(self.query)
        return ''.join(filled), start

    def ids(self, keep: Sequence[bool] | None = None) -> list[int]:
        """The prompt's token ids (the chat template's special tokens as the template writes them)."""
        text, _ = self.text(keep)
        return list(self.tokenizer(text, add_special_tokens=not self.chat)['input_ids'])

    def response_ids(self, response: str) -> list[int]:
        """The ids of ``response`` after the prompt: the prompt and the response tokenised together, less the
        prompt's ids (refused where the two do not split there)."""
        prompt = self.ids()
        text, _ = self.text()
        ids = list(self.tokenizer(text + response, add_special_tokens=not self.chat)['input_ids'])
        if ids[: len(prompt)] != prompt or len(ids) == len(prompt):
            raise ValueError(
                f'the response {response!r} does not follow the prompt as tokens of its own (it merges with '
                'the end of the prompt, or gives no token): start it with a space or a line break'
            )
        return ids[len(prompt) :]


@dataclass
class SourceExplanation:
    """What :py:func:`explain_sources` returns: a score per source of the context for the response.

    Attributes
    ----------
    prompt: SourcePrompt
    response: str
    response_ids: list of int
    scores: torch.Tensor
        ``[sources]`` float64: each source's score (its tokens' relevance reduced by ``reduce``).
    value: float
        The explained quantity: the sum over the response's tokens of their log-odds (``objective='log_odds'``),
        log-probabilities (``'log_probability'``) or logits (``'logit'``).
    method: str
    objective: str
    reduce: str
    explanation: zennit_attn.Explanation
        The token relevance of the prompt and response.
    segments: zennit_attn.results.segments.SegmentExplanation
        The relevance summed per source (``other``: the template, the query, the response).
    """

    prompt: SourcePrompt
    response: str
    response_ids: list[int]
    scores: torch.Tensor
    value: float
    method: str
    objective: str
    reduce: str
    explanation: object = field(repr=False, compare=False)
    segments: SegmentExplanation = field(repr=False, compare=False)

    @property
    def sources(self) -> list[str]:
        """The text of each source."""
        return self.prompt.sources

    def sorted(self) -> list[tuple[int, float, str]]:
        """``(index, score, text)`` of every source, the highest score first."""
        order = sorted(range(len(self.sources)), key=lambda index: -float(self.scores[index]))
        return [(index, float(self.scores[index]), self.sources[index]) for index in order]

    def top(self, k: int) -> list[tuple[int, float, str]]:
        """The ``k`` highest-scored sources as :py:meth:`sorted` lists them."""
        return self.sorted()[: int(k)]

    def heatmaps(self) -> list[Heatmap]:
        """One :py:class:`~zennit_attn.results.render.layout.Heatmap`: the context, each source coloured by its
        score (with the text up to the next source), captioned with the query, the response and the method."""
        spans, context = self.prompt.spans, self.prompt.context
        ends = [start for start, _ in spans[1:]] + [len(context)]
        pieces = [context[start:end] for (start, _), end in zip(spans, ends)]
        values = [float(value) for value in self.scores]
        positions = [[index] for index in range(len(spans))]
        if spans[0][0] > 0:  # text before the first source: neutral
            pieces, values, positions = [context[: spans[0][0]], *pieces], [0.0, *values], [[-1], *positions]
        title = (
            f'{self.method}, {self.objective} of the response {self.response!r} ({format_relevance(self.value)}) '
            f'to {self.prompt.query!r}; sources scored by the {self.reduce} of their relevance'
        )
        return [Heatmap([Segment(pieces, values, None, positions)], title=title)]

    def show(self, scale: ScaleLike = None, color: bool | None = None, stream: IO | None = None) -> None:
        """Print the context with its sources coloured by their scores (see :py:meth:`zennit_attn.Explanation.show`)."""
        show_heatmaps(self.heatmaps(), scale, color, stream)

    def to_html(self, scale: ScaleLike = None) -> str:
        """A standalone HTML page of the context with its sources coloured by their scores."""
        return heatmaps_html(self.heatmaps(), scale, title='Source relevance')

    def _repr_html_(self) -> str:
        return heatmaps_html(self.heatmaps(), standalone=False)

    def save(self, path: str | os.PathLike, scale: ScaleLike = None, **options) -> Path:
        """Write the context with its sources coloured in the format of the suffix of ``path`` (``.html``, ``.png``,
        ``.svg``, ``.pdf``, ``.tex``; options as for :py:meth:`zennit_attn.Explanation.save`)."""
        return save_heatmaps(self.heatmaps(), path, scale, title='Source relevance', **options)


def source_spans(context: str | Sequence[str], sources) -> tuple[str, list[tuple[int, int]]]:
    """``(context, spans)``: a list of documents joined by blank lines; ``sources`` as character spans of the
    context: ``'sentences'`` (:py:func:`~zennit_attn.results.segments.sentences`), ``'documents'`` (each document of a
    list) or the spans themselves."""
    documents = None
    if not isinstance(context, str):
        documents = list(context)
        if not documents or not all(isinstance(document, str) and document.strip() for document in documents):
            raise ValueError('context must be a text or a list of non-empty texts (documents)')
        context = '\n\n'.join(documents)
    if isinstance(sources, str):
        if sources == 'sentences':
            return context, sentences(context)
        if sources != 'documents':
            raise ValueError(f"sources must be 'sentences', 'documents' or character spans, got {sources!r}")
        if documents is None:
            raise ValueError("sources='documents' needs the context as a list of documents")
        starts = [sum(len(document) + 2 for document in documents[:index]) for index in range(len(documents))]
        return context, [(start, start + len(document)) for start, document in zip(starts, documents)]
    return context, [(int(start), int(end)) for start, end in sources]


def source_scores(segments: SegmentExplanation, relevance: torch.Tensor, reduce: str = 'sum') -> torch.Tensor:
    """``[sources]`` float64: the relevance of each segment's tokens reduced by ``reduce`` (:py:data:`REDUCTIONS`:
    ``'sum'`` the segments' own sums, ``'positive'`` the sum of the positive relevance, ``'mean'`` the sum over the
    number of tokens); ``relevance`` is the explained row's ``[seq]`` relevance."""
    if reduce not in REDUCTIONS:
        raise ValueError(f'reduce must be one of {", ".join(map(repr, REDUCTIONS))}, got {reduce!r}')
    if reduce == 'sum':
        return segments.relevance.clone()
    values = relevance.detach().to('cpu', torch.float64)
    scores = []
    for index in range(len(segments.spans)):
        members = [
            values[position].item()
            for position, segment in zip(segments.positions, segments.token_segment)
            if segment == index
        ]
        if reduce == 'positive':
            scores.append(math.fsum(value for value in members if value > 0))
        else:
            scores.append(math.fsum(members) / max(len(members), 1))
    return torch.tensor(scores, dtype=torch.float64)


def explain_sources(
    model: torch.nn.Module,
    tokenizer,
    context: str | Sequence[str],
    query: str,
    response: str | None = None,
    sources: str | Sequence[tuple[int, int]] = 'sentences',
    method: str | None = None,
    objective: str = 'log_odds',
    reduce: str = 'sum',
    chat: bool | None = None,
    template: str | None = None,
    max_new_tokens: int = 32,
    **params,
) -> SourceExplanation:
    """Score every source of the context (sentences, documents, spans) by its relevance for the model's response to
    ``query``, from one backward pass.

    Parameters
    ----------
    model: torch.nn.Module
        A decoder-only language model (``...ForCausalLM``) in eval mode.
    tokenizer
        Its fast tokenizer (with character offsets).
    context: str or sequence of str
        The context, or a list of documents (joined by blank lines).
    query: str
    response: str, optional
        The response to explain (tokenised after the prompt); None lets the model generate it (greedy,
        ``max_new_tokens``; the end-of-sequence token is not part of it) and explains the ids it generated.
    sources: 'sentences', 'documents' or list of (int, int)
        The sources: the context's sentences (:py:func:`~zennit_attn.results.segments.sentences`), its documents (a
        list of documents), or character spans of the context (of the documents joined by blank lines).
    method: str, optional
        A method of :py:func:`~zennit_attn.explain` with ``(position, token)`` targets (``'attnlrp'``,
        ``'cplrp'``, ``'input_x_gradient'``, ...); default the LRP method of ``composite=`` among ``params``,
        ``'attnlrp'`` without one. With PA-LRP's positions (``'palrp'``, a composite with ``positions=True``) a
        source's score holds its tokens' relevance and their positions'.
    objective: str
        What is explained of each response token, summed over the response: ``'log_odds'`` (default:
        ``log(p / (1 - p))``, ContextCite's logit-probability; :py:class:`~zennit_attn.inputs.objectives.LogOdds`),
        ``'log_probability'`` (what the ablations of the metrics measure, but its relevance vanishes for the tokens the
        context makes certain: the gradient ``delta_it - p_i`` goes to 0 as ``p_t`` goes to 1) or ``'logit'``.
        docs/results/sources.md measures the three.
    reduce: str
        How a source's tokens give its score (:py:data:`REDUCTIONS`): ``'sum'`` (default), ``'positive'``,
        ``'mean'``.
    chat: bool, optional
        Render the prompt with the tokenizer's chat template (the user's message: ``template``); default: where the
        tokenizer has one.
    template: str, optional
        With ``{context}`` and ``{query}`` once each (filled once: other text, braces included, is literal, and a
        context or query holding a slot's name stays as it is): the user's message (:py:data:`CHAT_TEMPLATE`) or
        the plain prompt (:py:data:`PLAIN_TEMPLATE`).
    max_new_tokens: int
        The length of a generated response.
    **params
        Passed to :py:func:`~zennit_attn.explain` (``composite=``, the method's parameters).

    Returns
    -------
    SourceExplanation

    Raises
    ------
    ValueError
        For an unknown ``objective`` or ``reduce``, bad sources, a chat prompt without chat template, a template
        without its slots, an empty generated response, a response that does not tokenise apart from the prompt.
    """
    method = method_of(method, params.get('composite'))
    if objective not in OBJECTIVES:
        raise ValueError(f'objective must be one of {", ".join(map(repr, OBJECTIVES))}, got {objective!r}')
    if reduce not in REDUCTIONS:
        raise ValueError(f'reduce must be one of {", ".join(map(repr, REDUCTIONS))}, got {reduce!r}')
    chat = bool(getattr(tokenizer, 'chat_template', None)) if chat is None else chat
    context, spans = source_spans(context, sources)
    template = template or (CHAT_TEMPLATE if chat else PLAIN_TEMPLATE)
    prompt = SourcePrompt(context, spans, query, template, chat, tokenizer)
    if response is None:
        response_ids = _generated_response(model, prompt, max_new_tokens)
        response = tokenizer.decode(response_ids, skip_special_tokens=True)
    else:
        response_ids = prompt.response_ids(response)
    return explain_response(model, prompt, response, response_ids, method, objective, reduce, **params)


class SourceCiter:
    """The sources of a context cited for the model's response to a query, in ContextCite's shape (its
    ``ContextCiter``): constructed from the model, the tokenizer, the context and the query; the attributions
    (:py:func:`explain_sources`, one backward pass) are computed on first use and kept.

    Parameters
    ----------
    model: torch.nn.Module
    tokenizer
    context: str or sequence of str
    query: str
    response: str, optional
        None: the model's greedy response (generated on first use).
    **options
        The other arguments of :py:func:`explain_sources` (``sources=``, ``method=``, ``objective=``, ``reduce=``,
        ``chat=``, ``template=``, ``max_new_tokens=``, ``composite=``, ...).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer,
        context: str | Sequence[str],
        query: str,
        response: str | None = None,
        **options,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.context = context
        self.query = query
        self.options = dict(options)
        self._response = response
        self._explanation: SourceExplanation | None = None

    @property
    def explanation(self) -> SourceExplanation:
        """The attributions (:py:func:`explain_sources`), computed on first use and kept."""
        if self._explanation is None:
            self._explanation = explain_sources(
                self.model, self.tokenizer, self.context, self.query, self._response, **self.options
            )
        return self._explanation

    @property
    def response(self) -> str:
        """The response cited for (the model's own where none was given)."""
        return self.explanation.response

    @property
    def sources(self) -> list[str]:
        """The text of each source."""
        return self.explanation.sources

    def get_attributions(self, top_k: int | None = None) -> torch.Tensor | list[tuple[int, float, str]]:
        """The score of every source, ``[sources]`` float64 in the order of :py:attr:`sources` (as ContextCite's
        array); with ``top_k``, the ``top_k`` highest-scored sources as ``(index, score, text)``, the highest first
        (:py:meth:`SourceExplanation.top`; ContextCite shows them as a data frame).

        Raises
        ------
        ValueError
            For ``top_k`` not a positive integer.
        """
        if top_k is None:
            return self.explanation.scores.clone()
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f'top_k must be a positive integer or None, got {top_k!r}')
        return self.explanation.top(top_k)


def _generated_response(model: torch.nn.Module, prompt: SourcePrompt, max_new_tokens: int) -> list[int]:
    """The ids the model generates after ``prompt`` (greedy,
    :py:func:`~zennit_attn.workflows.generation.generate_answer`), less the end-of-sequence tokens it ends with (the
    tokenizer's and the model's generation configuration's): the ids explained, as generated (decoding and tokenising
    them again may give other ids).

    Raises
    ------
    ValueError
        For an empty response (the model ended at once, or generated only white space).
    """
    tokenizer = prompt.tokenizer
    ids = [int(token) for token in generate_answer(model, tokenizer, torch.tensor([prompt.ids()]), max_new_tokens)]
    ends = {getattr(tokenizer, 'eos_token_id', None)}
    configured = getattr(getattr(model, 'generation_config', None), 'eos_token_id', None)
    ends.update(configured if isinstance(configured, (list, tuple)) else [configured])
    while ids and ids[-1] in ends:
        ids.pop()
    if not ids or not tokenizer.decode(ids, skip_special_tokens=True).strip():
        raise ValueError('the model generated an empty response: nothing to explain')
    return ids


def explain_response(
    model: torch.nn.Module,
    prompt: SourcePrompt,
    response: str,
    response_ids: Sequence[int],
    method: str | None = None,
    objective: str = 'log_odds',
    reduce: str = 'sum',
    **params,
) -> SourceExplanation:
    """:py:func:`explain_sources` for a prompt and a tokenised response: one call of :py:func:`~zennit_attn.explain`
    with the response's ``(position, token)`` pairs, summed per source."""
    method = method_of(method, params.get('composite'))
    ids = prompt.ids() + list(response_ids)
    start = len(ids) - len(response_ids)
    pairs = [(start - 1 + index, int(token)) for index, token in enumerate(response_ids)]
    explanation = explain(
        model,
        torch.tensor([ids]),
        target=pairs,
        method=method,
        objective=objective,
        tokenizer=prompt.tokenizer,
        **params,
    )
    if explanation.position_relevance is not None:  # PA-LRP: the sources' tokens with their positions
        explanation = explanation.with_positions()
    segments = _response_segments(explanation, prompt, response, start)
    return SourceExplanation(
        prompt=prompt,
        response=response,
        response_ids=list(response_ids),
        scores=source_scores(segments, explanation.relevance[0], reduce),
        value=float(explanation.logit.detach().to(torch.float64).sum()),
        method=method,
        objective=objective,
        reduce=reduce,
        explanation=explanation,
        segments=segments,
    )


def _response_segments(explanation, prompt: SourcePrompt, response: str, start: int) -> SegmentExplanation:
    """The relevance of the explained row (the prompt's ids, then the response's from ``start``) summed per source.

    The prompt's tokens are matched to the prompt's text (:py:meth:`zennit_attn.Explanation.segments`); the
    response's tokens are ``other``, without being matched to ``response`` (a generated response is explained as the
    ids the model generated, which its text tokenised again need not give)."""
    text, spans = prompt.text()
    mask = torch.zeros_like(explanation.input_ids)
    mask[:, :start] = 1
    segments = dataclasses.replace(explanation, attention_mask=mask).segments(
        spans, labels=[f'source {index}' for index in range(len(spans))], text=text
    )
    values = explanation.relevance[0, start:].detach().to('cpu', torch.float64).tolist()
    pieces = [prompt.tokenizer.decode([int(token)]) for token in explanation.input_ids[0, start:]]
    return dataclasses.replace(
        segments,
        text=text + response,
        other=math.fsum([segments.other, *values]),
        total=math.fsum([segments.total, *values]),
        token_segment=segments.token_segment + [-1] * len(values),
        positions=segments.positions + list(range(start, start + len(values))),
        other_text=' | '.join(filter(None, [segments.other_text, *pieces])),
    )
