"""Chat models: a conversation (``[{'role': ..., 'content': ...}, ...]``) as the input of
:py:func:`~zennit_attn.explain`, through the tokenizer's chat template.

:py:func:`encode_chat` renders the conversation with the tokenizer's chat template, tokenises it and marks which tokens
are the template's (role markers, special tokens, separators) and which carry the messages' content (found by the
tokenizer's character offsets), and where the assistant's final answer is. ``explain(model, messages,
tokenizer=...)`` then explains

- a conversation that ends with an assistant turn: the answer, i.e. the sum of its tokens' logits, each at the
  position before it, in one backward pass (``target=`` the answer's ``(position, token)`` pairs, as
  :py:func:`~zennit_attn.explain_generation` explains a whole answer);
- a conversation that ends with another turn (a user's question): the model's next-token prediction after the
  template's generation prompt (``add_generation_prompt=True``), i.e. the first token of the answer it would give
  (``target=`` as for any text).

The template's tokens keep their relevance; the explanation's heatmaps leave them out unless asked
(``explanation.show(template=True)``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

__all__ = ['ChatEncoding', 'is_conversation', 'check_conversation', 'encode_chat', 'prompt_ids']


@dataclass
class ChatEncoding:
    """A conversation rendered by the chat template and tokenised.

    Attributes
    ----------
    input_ids: torch.Tensor
        ``[1, seq]`` the templated conversation's token ids.
    template: torch.Tensor
        ``[1, seq]`` True for the template's own tokens (no character of any message's content).
    answer: list of (int, int)
        The final assistant answer's ``(position, token)`` pairs (``position`` the one before the token's, whose
        output predicts it); empty for a conversation that does not end with an assistant turn.
    text: str
        The rendered conversation.
    """

    input_ids: torch.Tensor
    template: torch.Tensor
    answer: list[tuple[int, int]]
    text: str


def is_conversation(value) -> bool:
    """Whether ``value`` is meant as a conversation (and is then checked by :py:func:`check_conversation`): a list
    (or tuple) holding a mapping (a message) or a list of mappings (a batch of conversations), or one message (a
    mapping with ``'role'`` or ``'content'`` and no ``'input_ids'``)."""
    if isinstance(value, Mapping):
        return 'input_ids' not in value and ('role' in value or 'content' in value)
    return isinstance(value, (list, tuple)) and any(
        isinstance(item, Mapping)
        or (isinstance(item, (list, tuple)) and any(isinstance(inner, Mapping) for inner in item))
        for item in value
    )


def check_conversation(messages) -> None:
    """Refuse what is not one conversation of text messages, naming the problem: a batch of conversations, a single
    message, a message that is not a mapping or has no ``'role'`` or ``'content'``, a role or content that is not
    text.

    Raises
    ------
    TypeError
        For a batch of conversations, a single message or an item that is not a message.
    ValueError
        For a message without ``'role'`` or ``'content'`` or whose role or content is not text.
    """
    if isinstance(messages, Mapping):
        raise TypeError(
            f'got one message ({_keys(messages)}), not a conversation: pass a list of messages, e.g. '
            '[{"role": "user", "content": "..."}]'
        )
    if not isinstance(messages, (list, tuple)) or not messages:
        raise TypeError('messages must be a non-empty list of {"role": ..., "content": ...} mappings')
    if all(isinstance(item, (list, tuple)) for item in messages):
        raise TypeError(
            f'got a batch of {len(messages)} conversations (a list of lists of messages): one '
            'conversation is explained at a time; call it once per conversation'
        )
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            kind = (
                'a list (a conversation inside the conversation?)'
                if isinstance(message, (list, tuple))
                else f'a {type(message).__name__}'
            )
            raise TypeError(f'message {index} is {kind}, not a {{"role": ..., "content": ...}} mapping')
        missing = [key for key in ('role', 'content') if key not in message]
        if missing:
            raise ValueError(
                f'message {index} has no {" and no ".join(map(repr, missing))} ({_keys(message)}): '
                'each message is {"role": ..., "content": ...}'
            )
        if not isinstance(message['role'], str) or not isinstance(message['content'], str):
            parts = (
                (
                    "; content given as a list of parts (text, images) is what a processor's chat template "
                    'takes: with images, pass processor.apply_chat_template(messages, tokenize=True, '
                    'return_dict=True, add_generation_prompt=True) and processor='
                )
                if isinstance(message['content'], (list, tuple))
                else ''
            )
            raise ValueError(
                f'message {index} must have a text role and content, got role '
                f'{type(message["role"]).__name__} and content {type(message["content"]).__name__}'
                f'{parts}'
            )


def _keys(message: Mapping) -> str:
    return f'keys: {sorted(map(str, message))}' if message else 'no keys'


def encode_chat(tokenizer, messages) -> ChatEncoding:
    """Render ``messages`` with ``tokenizer``'s chat template and tokenise it (see the module's documentation).

    Parameters
    ----------
    tokenizer
        A fast Hugging Face tokenizer with a chat template (``tokenizer.chat_template``).
    messages: list of dict
        ``{'role': str, 'content': str}`` per turn. Ending with an ``'assistant'`` turn, its content is the explained
        answer; otherwise the template's generation prompt is added.

    Returns
    -------
    ChatEncoding

    Raises
    ------
    ValueError
        For a tokenizer without a chat template, a malformed message (:py:func:`check_conversation`), a final answer
        that is empty, a template that does not contain a message's content as it is.
    TypeError
        For a tokenizer without character offsets (a slow tokenizer), and what is not one conversation (a batch of
        them, a single message: :py:func:`check_conversation`).
    """
    check_conversation(messages)
    if tokenizer is None:
        raise ValueError(
            'a conversation (a list of {"role", "content"} messages) needs tokenizer= to apply its chat template'
        )
    if not getattr(tokenizer, 'chat_template', None):
        raise ValueError(
            f'{type(tokenizer).__name__} has no chat template (tokenizer.chat_template is not set): '
            "explain the conversation as plain text, or set the model's chat template on the "
            'tokenizer'
        )
    answered = messages[-1]['role'] == 'assistant'
    if answered and not messages[-1]['content']:
        raise ValueError(
            'the final assistant message is empty: no answer to explain (leave the turn out to '
            'explain the next-token prediction after the generation prompt)'
        )
    text = tokenizer.apply_chat_template(
        [dict(message) for message in messages], tokenize=False, add_generation_prompt=not answered
    )
    if not getattr(tokenizer, 'is_fast', False):
        raise TypeError(
            f'{type(tokenizer).__name__} gives no character offsets: use the fast tokenizer '
            '(AutoTokenizer.from_pretrained(..., use_fast=True)) to tell template and content apart'
        )
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = encoding['input_ids'], encoding['offset_mapping']
    spans = _content_spans(tokenizer, messages, text, not answered)
    template = torch.tensor([[not any(_overlaps(offset, span) for span in spans) for offset in offsets]])
    answer = _answer_pairs(ids, offsets, spans[-1]) if answered else []
    return ChatEncoding(input_ids=torch.tensor([ids], dtype=torch.long), template=template, answer=answer, text=text)


#: Stands in for one message's content while the conversation is rendered again to find where that content begins
#: (:py:func:`_content_spans`): a string no template adds and no message is likely to hold.
_PLACEHOLDER = 'Zq7xPlaceholderOfZennitAttnQ9v'


def _content_spans(tokenizer, messages, text: str, generation_prompt: bool) -> list[tuple[int, int] | None]:
    """The character span of each message's content in the rendered ``text`` (None for an empty content). Each is
    found where the conversation rendered with that content replaced by :py:data:`_PLACEHOLDER` holds the placeholder,
    not where the content's text first occurs: an answer ``'a'`` occurs in the role marker ``assistant`` before it,
    and a message ``'user'`` in the marker of its own turn. A template that does not render a content as it is is
    refused."""
    spans = []
    for index, message in enumerate(messages):
        content = message['content']
        if not content:
            spans.append(None)
            continue
        marked = [dict(item) for item in messages]
        marked[index]['content'] = _PLACEHOLDER
        rendered = tokenizer.apply_chat_template(marked, tokenize=False, add_generation_prompt=generation_prompt)
        start = rendered.find(_PLACEHOLDER)
        if start < 0 or text[start : start + len(content)] != content:
            raise ValueError(
                f'the chat template does not render message {index} ({message["role"]}) with its '
                "content as it is: cannot tell its tokens from the template's"
            )
        spans.append((start, start + len(content)))
    return spans


def _overlaps(offset: tuple[int, int], span: tuple[int, int] | None) -> bool:
    """Whether a token's character ``offset`` overlaps a content ``span``."""
    return span is not None and offset[0] < span[1] and offset[1] > span[0]


def _answer_pairs(ids: list[int], offsets: list, span: tuple[int, int] | None) -> list[tuple[int, int]]:
    """``(position, token)`` of every token of the final answer (its content ``span``), each explained at the
    position before it, which predicts it; an answer without a token after the template is refused."""
    positions = [position for position, offset in enumerate(offsets) if _overlaps(offset, span)]
    answer = [(position - 1, int(ids[position])) for position in positions]
    if not answer or answer[0][0] < 0:
        raise ValueError('the final assistant message gives no token after the template to explain')
    return answer


def prompt_ids(tokenizer, messages) -> torch.Tensor:
    """``[1, seq]`` ids of a conversation as the prompt of a generated answer
    (:py:func:`~zennit_attn.explain_generation`): rendered by the tokenizer's chat template with its generation prompt,
    as :py:func:`encode_chat` renders a conversation that does not end with the assistant's answer.

    Raises
    ------
    ValueError
        For a conversation that ends with the assistant's answer (the model is to generate it), and as
        :py:func:`encode_chat`.
    TypeError
        As :py:func:`encode_chat`.
    """
    chat = encode_chat(tokenizer, messages)
    if chat.answer:
        raise ValueError(
            "the conversation ends with the assistant's answer, but explain_generation generates the "
            'answer itself: leave out the last turn, or explain that answer with explain(model, '
            'messages, tokenizer=tokenizer)'
        )
    return chat.input_ids
