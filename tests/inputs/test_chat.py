"""Chat models (:py:mod:`zennit_attn.inputs.chat`): ``explain(model, messages, tokenizer=...)`` explains the assistant's
answer on the templated ids; the template's tokens are marked and hidden from the heatmaps on request."""

from __future__ import annotations

import io

import pytest
import torch

from tests.text_tokenizer import byte_level_tokenizer
from zennit_attn import explain, explain_generation
from zennit_attn.inputs.chat import encode_chat

#: a ChatML-like template in the special tokens of the test tokenizer
TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
    '{% if add_generation_prompt %}<s>assistant\n{% endif %}'
)
MESSAGES = [
    {'role': 'user', 'content': 'where does the ice bear live?'},
    {'role': 'assistant', 'content': 'in the Arctic.'},
]


@pytest.fixture(scope='module')
def chat_tokenizer():
    tokenizer = byte_level_tokenizer()
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def templated_ids(tokenizer, messages, **kwargs) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs))


def test_answer_equals_explain_on_the_templated_ids(llama, chat_tokenizer):
    ids = templated_ids(chat_tokenizer, MESSAGES)
    prompt = templated_ids(chat_tokenizer, MESSAGES[:1], add_generation_prompt=True)
    answer = chat_tokenizer.encode('in the Arctic.')
    assert ids[: len(prompt)] == prompt and ids[len(prompt) : len(prompt) + len(answer)] == answer
    pairs = [(len(prompt) + index - 1, token) for index, token in enumerate(answer)]
    chat = explain(llama, MESSAGES, tokenizer=chat_tokenizer)
    reference = explain(llama, torch.tensor([ids]), target=pairs)
    assert torch.equal(chat.input_ids, reference.input_ids)
    assert torch.equal(chat.relevance, reference.relevance) and torch.equal(chat.logit, reference.logit)
    assert chat.target.tolist() == [answer] and chat.position.tolist() == [[p for p, _ in pairs]]
    # the template's tokens: everything but the two messages' content
    template = chat.template[0].tolist()
    assert template[len(prompt) : len(prompt) + len(answer)] == [False] * len(answer)
    assert template[:5] == [True] * 5 and template[-2:] == [True, True]  # '<s>user\n' ... '</s>\n'
    question = chat_tokenizer.encode('where does the ice bear live?')
    assert sum(not flag for flag in template) == len(question) + len(answer)


def test_contents_that_occur_in_the_template_are_found_at_their_turn(llama, chat_tokenizer):
    """A content found by its text was found where the text first occurs: the answer 'a' inside the role marker
    'assistant' (its logit explained instead of the answer's, and the answer marked as template), a message 'user'
    in the marker of its own turn. Each is found where the conversation rendered with it replaced holds the
    replacement."""
    messages = [{'role': 'user', 'content': 'user'}, {'role': 'assistant', 'content': 'a'}]
    ids = templated_ids(chat_tokenizer, messages)
    prompt = templated_ids(chat_tokenizer, messages[:1], add_generation_prompt=True)
    answer = chat_tokenizer.encode('a')
    assert ids[len(prompt) : len(prompt) + len(answer)] == answer
    chat = encode_chat(chat_tokenizer, messages)
    assert chat.answer == [(len(prompt) - 1, answer[0])]
    content = [position for position, flag in enumerate(chat.template[0].tolist()) if not flag]
    user = chat_tokenizer.encode('user')
    assert content == [5 + index for index in range(len(user))] + [len(prompt)]  # after '<s>user\n', the answer
    explained = explain(llama, messages, tokenizer=chat_tokenizer, method='cplrp')
    reference = explain(llama, torch.tensor([ids]), target=[(len(prompt) - 1, answer[0])], method='cplrp')
    assert torch.equal(explained.logit, reference.logit) and torch.equal(explained.relevance, reference.relevance)


def test_heatmaps_hide_the_template_unless_asked(llama, chat_tokenizer):
    chat = explain(llama, MESSAGES, tokenizer=chat_tokenizer)
    shown, everything = io.StringIO(), io.StringIO()
    chat.show(color=False, stream=shown)
    chat.show(color=False, stream=everything, template=True)
    assert '<s>' not in shown.getvalue() and 'Arctic' in shown.getvalue() and ' ice' in shown.getvalue()
    assert '<s>' in everything.getvalue() and '</s>' in everything.getvalue()
    # hidden tokens keep their relevance
    assert float(chat.relevance[0, chat.template[0]].abs().sum()) > 0
    # tokens() lists what the heatmaps show; with the template, one token per entry of the relevance
    assert len(chat.tokens()) == int((~chat.template[0]).sum())
    assert len(chat.tokens(template=True)) == chat.relevance.shape[1]
    # the hidden template ends a word: the question's last word and the answer's first are two words (before: one
    # word ' livein' of both messages, their relevance summed)
    messages = [{'role': 'user', 'content': 'where does the ice bear live'}, MESSAGES[1]]
    words = explain(llama, messages, tokenizer=chat_tokenizer).tokens(words=True)
    assert words == ['where', ' does', ' the', ' ice', ' bear', ' live', 'in', ' the', ' Arctic', '.']


def test_without_an_answer_the_next_token_after_the_generation_prompt(llama, chat_tokenizer):
    ids = templated_ids(chat_tokenizer, MESSAGES[:1], add_generation_prompt=True)
    chat = explain(llama, MESSAGES[:1], tokenizer=chat_tokenizer, target=7)
    reference = explain(llama, torch.tensor([ids]), target=7)
    assert torch.equal(chat.relevance, reference.relevance) and int(chat.position[0]) == len(ids) - 1
    assert encode_chat(chat_tokenizer, MESSAGES[:1]).answer == []


def test_refusals(llama, chat_tokenizer):
    plain = byte_level_tokenizer()
    with pytest.raises(ValueError, match='has no chat template'):
        explain(llama, MESSAGES, tokenizer=plain)
    with pytest.raises(ValueError, match='needs tokenizer='):
        explain(llama, MESSAGES)
    with pytest.raises(ValueError, match="ends with the assistant's answer, which is explained: leave out target="):
        explain(llama, MESSAGES, tokenizer=chat_tokenizer, target=5)
    with pytest.raises(ValueError, match='the final assistant message is empty'):
        explain(llama, [MESSAGES[0], {'role': 'assistant', 'content': ''}], tokenizer=chat_tokenizer)
    with pytest.raises(ValueError, match='must have a text role and content'):
        explain(llama, [{'role': 'user', 'content': ['a list']}], tokenizer=chat_tokenizer)


@pytest.mark.parametrize(
    'messages, error, match',
    [
        (
            [MESSAGES, MESSAGES],
            TypeError,
            r'a batch of 2 conversations \(a list of lists of messages\): one conversation '
            'is explained at a time',
        ),
        ([{'content': 'hi'}], ValueError, r"message 0 has no 'role' \(keys: \['content'\]\)"),
        ([MESSAGES[0], {'role': 'assistant'}], ValueError, r"message 1 has no 'content' \(keys: \['role'\]\)"),
        ([{}], ValueError, r"message 0 has no 'role' and no 'content' \(no keys\)"),
        (
            [{'role': 'user', 'content': 5}],
            ValueError,
            'message 0 must have a text role and content, got role str and content int',
        ),
        (
            [{'role': 'user', 'content': [{'type': 'text', 'text': 'hi'}]}],
            ValueError,
            r"content list; content given as a list of parts \(text, images\) is what a processor's chat "
            r'template takes',
        ),
        ([{'role': 3, 'content': 'hi'}], ValueError, 'got role int and content str'),
        (
            [MESSAGES[0], 'in the Arctic.'],
            TypeError,
            r'message 1 is a str, not a \{"role": ..., "content": ...\} mapping',
        ),
        ([[MESSAGES[0]], MESSAGES[1]], TypeError, r'message 0 is a list \(a conversation inside the conversation\?\)'),
        (MESSAGES[0], TypeError, r"got one message \(keys: \['content', 'role'\]\), not a conversation: pass a list"),
    ],
    ids=[
        'batch',
        'no role',
        'no content',
        'empty message',
        'content int',
        'content parts',
        'role int',
        'text item',
        'nested',
        'one message',
    ],
)
def test_malformed_or_batched_messages_are_named(llama, chat_tokenizer, messages, error, match):
    """Each gave torch's "Could not infer dtype of dict" (a list of conversations, a message without 'role' or
    'content') or a message about input_ids or texts: now the problem is named, by explain and explain_generation."""
    with pytest.raises(error, match=match):
        explain(llama, messages, tokenizer=chat_tokenizer)
    with pytest.raises(error, match=match):
        explain_generation(llama, chat_tokenizer, messages, max_new_tokens=1)


def test_explain_generation_of_a_conversation_is_that_of_its_templated_prompt(llama, chat_tokenizer):
    """A conversation that does not end with the answer is the prompt rendered with the generation prompt: the
    same explanation as of those ids; one ending with the answer is refused (explain() explains that answer)."""
    prompt = templated_ids(chat_tokenizer, MESSAGES[:1], add_generation_prompt=True)
    options = dict(max_new_tokens=3, generate_kwargs={'suppress_tokens': [0, 1, 2, 3]})
    chat = explain_generation(llama, chat_tokenizer, MESSAGES[:1], **options)
    reference = explain_generation(llama, chat_tokenizer, torch.tensor([prompt]), **options)
    assert chat.input_ids[: len(prompt)].tolist() == prompt and chat.prompt_length == len(prompt)
    assert torch.equal(chat.input_ids, reference.input_ids) and torch.equal(chat.relevance, reference.relevance)
    assert torch.equal(chat.answer_relevance, reference.answer_relevance)
    with pytest.raises(ValueError, match="ends with the assistant's answer, but explain_generation generates"):
        explain_generation(llama, chat_tokenizer, MESSAGES, max_new_tokens=1)
