"""explain_generation(): every generated token explained over exactly its prefix, the whole answer, the views."""

from __future__ import annotations

import json
import re

import pytest
import torch

from tests.models import tiny_model
from zennit_attn import GenerationExplanation, explain, explain_generation

PROMPT = 'Question: where does the ice bear live? Answer:'
#: the tiny random models would otherwise end (or pad) their answers at once
NO_SPECIAL = {'suppress_tokens': [0, 1, 2, 3]}


@pytest.fixture(scope='module')
def t5():
    return tiny_model('t5')


@pytest.fixture(scope='module')
def generation(llama, tokenizer):
    return explain_generation(llama, tokenizer, PROMPT, max_new_tokens=6, generate_kwargs=NO_SPECIAL)


def test_rows_equal_explain_on_each_prefix_causal(llama, tokenizer, generation):
    prompt = tokenizer(PROMPT, return_tensors='pt').input_ids
    length = prompt.shape[1]
    expected = llama.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0, **NO_SPECIAL)[0]
    assert isinstance(generation, GenerationExplanation)
    assert torch.equal(generation.input_ids, expected)
    assert generation.prompt_length == generation.answer_start == length
    assert torch.equal(generation.target, expected[length:])
    assert torch.equal(generation.generated_ids, expected[length:])
    count = expected.shape[0] - length
    assert generation.relevance.shape == (count, expected.shape[0])
    assert generation.relevance.dtype == torch.float64
    for index in range(count):
        single = explain(llama, expected[None, : length + index], target=int(expected[length + index]))
        assert torch.equal(generation.relevance[index, : length + index], single.relevance[0])  # bit for bit
        assert float(generation.relevance[index, length + index :].abs().max()) == 0.0
        assert float(generation.logit[index]) == float(single.logit[0])
        assert int(generation.position[index]) == length + index - 1
    # the greedy answer: each explained logit is the largest at its step (suppressed ids aside)
    logits = llama(expected[None]).logits[0, length - 1 : -1].detach()
    logits[:, NO_SPECIAL['suppress_tokens']] = -float('inf')
    assert torch.equal(logits.argmax(-1), generation.target)


def test_answer_relevance_is_one_backward_pass_over_all_logits(llama, generation):
    count, columns = generation.relevance.shape
    start = generation.answer_start
    pairs = [(start + index - 1, int(generation.target[index])) for index in range(count)]
    whole = explain(llama, generation.input_ids[None, :-1], target=pairs)
    assert torch.equal(generation.answer_relevance[:-1], whole.relevance[0])
    assert float(generation.answer_relevance[-1]) == 0.0
    # (not bit for bit: transformers computes Llama's rotary embeddings in float32, which differ at the 1e-8 level
    # between sequence lengths, so the model's own logit at a position on the prefix and on the full sequence differ)
    assert float(whole.logit.sum()) == pytest.approx(float(generation.logit.sum()), rel=1e-7)
    # LRP is linear in the initial relevance: the answer is the sum of the rows
    difference = (generation.answer_relevance - generation.relevance.sum(0)).abs().max()
    assert float(difference) <= 1e-6 * float(generation.answer_relevance.abs().max())


def test_rows_equal_explain_on_each_prefix_t5(t5, tokenizer):
    """T5: the prompt is the encoder input; row i covers the encoder tokens, the decoder start token and the
    tokens generated before token i (the decoder side of the prefix)."""
    generation = explain_generation(t5, tokenizer, PROMPT, max_new_tokens=4, generate_kwargs=NO_SPECIAL)
    prompt = tokenizer(PROMPT, return_tensors='pt').input_ids
    length = prompt.shape[1]
    decoder = t5.generate(prompt, max_new_tokens=4, do_sample=False, **NO_SPECIAL)
    assert generation.encoder_decoder and generation.prompt_length == length and generation.answer_start == length + 1
    assert torch.equal(generation.input_ids, torch.cat([prompt[0], decoder[0]]))
    count = decoder.shape[1] - 1
    assert generation.relevance.shape == (count, length + 1 + count)
    for index in range(count):
        single = explain(t5, prompt, decoder_input_ids=decoder[:, : index + 1], target=int(decoder[0, index + 1]))
        assert torch.equal(generation.relevance[index, :length], single.relevance[0])
        assert torch.equal(generation.relevance[index, length : length + index + 1], single.decoder_relevance[0])
        assert float(generation.relevance[index, length + index + 1 :].abs().max()) == 0.0
        assert float(generation.logit[index]) == float(single.logit[0])
    pairs = [(index, int(decoder[0, index + 1])) for index in range(count)]
    whole = explain(t5, prompt, decoder_input_ids=decoder[:, :count], target=pairs)
    assert torch.equal(generation.answer_relevance[:-1], torch.cat([whole.relevance[0], whole.decoder_relevance[0]]))
    difference = (generation.answer_relevance - generation.relevance.sum(0)).abs().max()
    assert float(difference) <= 1e-6 * float(generation.answer_relevance.abs().max())
    assert generation.tokens()[length] == '<pad>'  # the decoder start token


@pytest.mark.parametrize('family, tolerance', [('llama', 1e-7), ('gpt2', 1e-13), ('mixtral', 1e-7), ('t5', 1e-13)])
def test_batched_rows_equal_per_prefix_rows_up_to_rounding(family, tolerance, tokenizer):
    """GPT-2 and T5 compute the same on a prefix and on the full sequence up to float64 rounding; Llama-like models
    up to their float32 rotary embeddings (about 1e-8 relative)."""
    model = tiny_model(family)
    exact = explain_generation(model, tokenizer, PROMPT, max_new_tokens=5, generate_kwargs=NO_SPECIAL)
    for batched in (True, 2):
        fast = explain_generation(
            model, tokenizer, PROMPT, max_new_tokens=5, generate_kwargs=NO_SPECIAL, batched=batched
        )
        assert torch.equal(fast.input_ids, exact.input_ids) and torch.equal(fast.target, exact.target)
        scale = float(exact.relevance.abs().max())
        assert float((fast.relevance - exact.relevance).abs().max()) <= tolerance * scale
        assert float(fast.relevance[exact.relevance == 0].abs().max()) == 0.0  # nothing after the prefix
        assert torch.allclose(fast.logit, exact.logit, rtol=tolerance, atol=0)


def test_sampling_and_other_methods(llama, tokenizer):
    torch.manual_seed(3)
    sampled = explain_generation(
        llama,
        tokenizer,
        PROMPT,
        max_new_tokens=3,
        generate_kwargs=dict(NO_SPECIAL, do_sample=True, top_k=20),
        method='input_x_gradient',
    )
    length = sampled.prompt_length
    assert sampled.method == 'input_x_gradient'
    for index in range(sampled.relevance.shape[0]):
        single = explain(
            llama,
            sampled.input_ids[None, : length + index],
            target=int(sampled.target[index]),
            method='input_x_gradient',
        )
        assert torch.equal(sampled.relevance[index, : length + index], single.relevance[0])


def test_prompt_forms(llama, tokenizer, generation):
    ids = tokenizer(PROMPT, return_tensors='pt')
    for prompt in (ids, ids.input_ids, ids.input_ids[0], ids.input_ids[0].tolist()):
        other = explain_generation(llama, tokenizer, prompt, max_new_tokens=6, generate_kwargs=NO_SPECIAL)
        assert torch.equal(other.relevance, generation.relevance)


def test_refusals(llama, tokenizer):
    with pytest.raises(ValueError, match='one prompt at a time'):
        explain_generation(llama, tokenizer, [PROMPT, PROMPT])
    with pytest.raises(ValueError, match='prompt is empty'):
        explain_generation(llama, tokenizer, '')
    with pytest.raises(ValueError, match='no tokens'):
        explain_generation(llama, tokenizer, [])
    with pytest.raises(ValueError, match='max_new_tokens'):
        explain_generation(llama, tokenizer, PROMPT, max_new_tokens=0)
    with pytest.raises(ValueError, match='generate_kwargs must not hold'):
        explain_generation(llama, tokenizer, PROMPT, generate_kwargs={'max_new_tokens': 3})
    with pytest.raises(ValueError, match='num_return_sequences'):
        explain_generation(llama, tokenizer, PROMPT, generate_kwargs={'num_return_sequences': 2})
    mask = tokenizer(PROMPT, return_tensors='pt').attention_mask
    with pytest.raises(ValueError, match="must not hold 'attention_mask'.*pass the tokenizer's output as the prompt"):
        explain_generation(llama, tokenizer, PROMPT, generate_kwargs={'attention_mask': mask})
    with pytest.raises(ValueError, match='batched'):
        explain_generation(llama, tokenizer, PROMPT, batched=0)
    padded = tokenizer([PROMPT, 'The ice'], return_tensors='pt', padding=True)
    with pytest.raises(ValueError, match='ids of one sequence'):
        explain_generation(llama, tokenizer, padded)
    with pytest.raises(ValueError, match='padding'):
        explain_generation(
            llama, tokenizer, {'input_ids': padded.input_ids[1:], 'attention_mask': padded.attention_mask[1:]}
        )
    with pytest.raises(TypeError, match='tokenizer'):
        explain_generation(llama, None, PROMPT)
    with pytest.raises(TypeError, match='cannot generate'):
        explain_generation(tiny_model('bert'), tokenizer, PROMPT)
    with pytest.raises(TypeError, match='steps'):
        explain_generation(llama, tokenizer, PROMPT, max_new_tokens=1, steps=3)


def test_views(generation, tokenizer, tmp_path, capsys):
    count = generation.relevance.shape[0]
    tokens = generation.tokens()
    assert len(tokens) == generation.input_ids.shape[0] and tokens[0] == 'Question'
    # a random model's answer may hold a stray byte: shown as <0xC3> by the heatmaps, as U+FFFD by decode()
    shown = re.sub(r'(<0x[0-9A-F]{2}>)+', '\ufffd', ''.join(tokens[generation.answer_start :]))
    assert shown == generation.answer()
    page = generation.to_html()
    assert page.startswith('<!DOCTYPE html>') and '<script>' in page and 'src=' not in page
    data = json.loads(
        re.search(r'<script type="application/json" class="za-data">(.*?)</script>', page, re.S)
        .group(1)
        .replace('<\\/', '</')
    )
    assert len(data['views']) == count + 1  # one per generated token, and the whole answer
    assert page.count('za-gen') - page.count('.za-gen') >= count
    for index, view in enumerate(data['views'][:-1]):
        assert view['values'] == generation.relevance[index].tolist()
        assert view['upto'] == generation.answer_start + index
        assert view['scale'] == float(generation.relevance[index].abs().max())
    assert data['views'][-1]['values'] == generation.answer_relevance.tolist()
    shared = json.loads(
        re.search(r'class="za-data">(.*?)</script>', generation.to_html(scale='shared'), re.S)
        .group(1)
        .replace('<\\/', '</')
    )
    assert len({view['scale'] for view in shared['views']}) == 1
    words = json.loads(
        re.search(r'class="za-data">(.*?)</script>', generation.to_html(words=True), re.S)
        .group(1)
        .replace('<\\/', '</')
    )
    assert len(words['views'][-1]['values']) == len(generation.tokens(words=True)) < len(tokens)
    assert sum(words['views'][-1]['values']) == pytest.approx(float(generation.answer_relevance.sum()))
    assert '<script>' in generation._repr_html_() and '<html' not in generation._repr_html_()

    generation.show(color=False)
    out = capsys.readouterr().out
    assert out.startswith('whole answer') and 'prompt: Question[' in out and 'answer: ' in out
    generation.show(token=-1, color=False)
    assert capsys.readouterr().out.startswith(f'generated token {count} of {count}')
    generation.show(token='all', color=False)
    assert capsys.readouterr().out.count('generated token') == count
    with pytest.raises(IndexError, match='generated token 99 is out of range'):
        generation.show(token=99)
    with pytest.raises(ValueError, match="'all'"):
        generation.show(token='every')

    assert generation.save(tmp_path / 'answer.html').read_text(encoding='utf-8') == page
    for suffix in ('png', 'svg', 'pdf', 'tex'):
        assert generation.save(tmp_path / f'answer.{suffix}').stat().st_size > 0
    snippet = generation.save(tmp_path / 'token.tex', token=0).read_text(encoding='utf-8')
    assert 'generated token 1 of' in snippet
    with pytest.raises(ValueError, match='suffix'):
        generation.save(tmp_path / 'answer.txt')


def test_contrast_runner_up_per_generated_token(llama, tokenizer):
    """contrast='runner-up': each row explains the generated token's logit minus the best other token's, equal to
    explain(..., contrast=...) on its prefix; the whole answer is the sum of the differences."""
    generation = explain_generation(
        llama, tokenizer, PROMPT, max_new_tokens=3, generate_kwargs=NO_SPECIAL, contrast='runner-up'
    )
    length = generation.prompt_length
    ids = generation.input_ids
    for index in range(3):
        prefix = ids[None, : length + index]
        logits = llama(prefix).logits[0, -1].detach()
        logits[int(generation.target[index])] = -float('inf')
        assert int(generation.contrast[index]) == int(logits.argmax())
        single = explain(llama, prefix, target=int(generation.target[index]), contrast=int(generation.contrast[index]))
        assert torch.equal(generation.relevance[index, : length + index], single.relevance[0])
        assert float(generation.logit[index]) == float(single.logit[0])
    pairs = [(length + index - 1, int(generation.target[index])) for index in range(3)]
    whole = explain(llama, ids[None, :-1], target=pairs, contrast=generation.contrast.tolist())
    assert torch.equal(generation.answer_relevance[:-1], whole.relevance[0])
    # explicit ids: one per generated token, checked
    explicit = explain_generation(
        llama, tokenizer, PROMPT, max_new_tokens=3, generate_kwargs=NO_SPECIAL, contrast=generation.contrast.tolist()
    )
    assert torch.equal(explicit.relevance, generation.relevance)
    with pytest.raises(ValueError, match='contrast has 2 tokens, but the model generated 3'):
        explain_generation(llama, tokenizer, PROMPT, max_new_tokens=3, generate_kwargs=NO_SPECIAL, contrast=[4, 5])
    with pytest.raises(ValueError, match=r"contrast ' bears' is 2 tokens"):
        explain_generation(llama, tokenizer, PROMPT, max_new_tokens=3, contrast=' bears')


@pytest.mark.parametrize('family', ['llama', 'gpt2', 'bart'])
@pytest.mark.parametrize('batched', [False, True])
def test_palrp_rows_keep_the_positions_of_each_prefix(family, batched, tokenizer):
    """PA-LRP's positions (``method='palrp'``): row ``i``'s ``position_relevance`` is ``explain()``'s on that prefix
    (an encoder-decoder's encoder then decoder positions, as the tokens), zeros after it, the whole answer's in
    ``answer_position_relevance``; ``with_positions()`` adds them to the tokens, and ``total()`` counts them. Before:
    dropped without a word (a palrp row held the tokens' share alone: in the tiny Llama half the rotations'
    relevance missing)."""
    if family == 'bart':
        from zennit_attn.workflows.architecture_check.configs import model_class, tiny_config

        model_type, config_type = model_class('seq2seq-lm', 'bart')
        torch.manual_seed(0)
        model = model_type(tiny_config(config_type)).double().eval()
        model.generation_config.forced_eos_token_id = model.generation_config.forced_bos_token_id = None
        with torch.no_grad():
            model.model.encoder.embed_positions.weight.normal_(0, 0.5)
            model.model.decoder.embed_positions.weight.normal_(0, 0.5)
    else:
        model = tiny_model(family)
    generation = explain_generation(
        model, tokenizer, PROMPT[:12], max_new_tokens=3, method='palrp', batched=batched, generate_kwargs=NO_SPECIAL
    )
    length, start = generation.prompt_length, generation.answer_start
    ids = generation.input_ids
    count = generation.relevance.shape[0]
    assert generation.position_relevance.shape == generation.relevance.shape
    tolerance = 0 if not batched else 1e-7
    for index in range(count):
        if generation.encoder_decoder:
            single = explain(
                model,
                ids[None, :length],
                decoder_input_ids=ids[None, length : start + index],
                method='palrp',
                target=int(ids[start + index]),
            )
            expected = torch.cat([single.position_relevance[0], single.decoder_position_relevance[0]])
        else:
            single = explain(model, ids[None, : start + index], target=int(ids[start + index]), method='palrp')
            expected = single.position_relevance[0]
        got = generation.position_relevance[index]
        assert float((got[: expected.shape[0]] - expected).abs().max()) <= tolerance * float(expected.abs().max())
        assert float(got[expected.shape[0] :].abs().max()) == 0.0
        assert generation.total(index) == pytest.approx(
            float(generation.relevance[index].sum() + expected.sum()), rel=1e-6
        )
    assert float(expected.abs().sum()) > 0
    assert generation.answer_position_relevance.shape == generation.answer_relevance.shape
    difference = generation.answer_position_relevance - generation.position_relevance.sum(0)
    assert float(difference.abs().max()) <= 1e-6 * float(generation.answer_position_relevance.abs().max())
    pairs = generation.with_positions()
    assert torch.equal(pairs.relevance, generation.relevance + generation.position_relevance)
    assert torch.equal(pairs.answer_relevance, generation.answer_relevance + generation.answer_position_relevance)
    assert pairs.position_relevance is None and pairs.total() == pytest.approx(generation.total(), rel=1e-12)
    without = explain_generation(model, tokenizer, PROMPT[:12], max_new_tokens=3, generate_kwargs=NO_SPECIAL)
    assert without.position_relevance is None and without.answer_position_relevance is None
