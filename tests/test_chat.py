"""Chat models (:py:mod:`zennit_attn.chat`): ``explain(model, messages, tokenizer=...)`` explains the assistant's
answer on the templated ids; the template's tokens are marked and hidden from the heatmaps on request."""
from __future__ import annotations

import io

import pytest
import torch

from tests.text_tokenizer import byte_level_tokenizer
from zennit_attn import explain
from zennit_attn.chat import encode_chat

#: a ChatML-like template in the special tokens of the test tokenizer
TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
            "{% if add_generation_prompt %}<s>assistant\n{% endif %}")
MESSAGES = [{'role': 'user', 'content': 'where does the ice bear live?'},
            {'role': 'assistant', 'content': 'in the Arctic.'}]


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
    assert ids[:len(prompt)] == prompt and ids[len(prompt):len(prompt) + len(answer)] == answer
    pairs = [(len(prompt) + index - 1, token) for index, token in enumerate(answer)]
    chat = explain(llama, MESSAGES, tokenizer=chat_tokenizer)
    reference = explain(llama, torch.tensor([ids]), target=pairs)
    assert torch.equal(chat.input_ids, reference.input_ids)
    assert torch.equal(chat.relevance, reference.relevance) and torch.equal(chat.logit, reference.logit)
    assert chat.target.tolist() == [answer] and chat.position.tolist() == [[p for p, _ in pairs]]
    # the template's tokens: everything but the two messages' content
    template = chat.template[0].tolist()
    assert template[len(prompt):len(prompt) + len(answer)] == [False] * len(answer)
    assert template[:5] == [True] * 5 and template[-2:] == [True, True]  # '<s>user\n' ... '</s>\n'
    question = chat_tokenizer.encode('where does the ice bear live?')
    assert sum(not flag for flag in template) == len(question) + len(answer)


def test_heatmaps_hide_the_template_unless_asked(llama, chat_tokenizer):
    chat = explain(llama, MESSAGES, tokenizer=chat_tokenizer)
    shown, everything = io.StringIO(), io.StringIO()
    chat.show(color=False, stream=shown)
    chat.show(color=False, stream=everything, template=True)
    assert '<s>' not in shown.getvalue() and 'Arctic' in shown.getvalue() and ' ice' in shown.getvalue()
    assert '<s>' in everything.getvalue() and '</s>' in everything.getvalue()
    # hidden tokens keep their relevance
    assert float(chat.relevance[0, chat.template[0]].abs().sum()) > 0


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
