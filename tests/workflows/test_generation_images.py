"""explain_generation() with images: a vision-language model (tiny LLaVA and Qwen2-VL, float64, biases zeroed, where
CP-LRP conserves exactly) answers a text about an image; every generated token is explained at text tokens and
pixels over exactly its prefix, the whole answer in one more backward pass; the views show the image overlays."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch
from PIL import Image

from tests.models import tiny_clip, tiny_llava, tiny_qwen2_vl
from tests.processors import (
    clip_processor,
    image,
    llava_processor,
    paligemma_processor,
    qwen2_vl_processor,
    tiny_paligemma,
)
from zennit_attn import GenerationExplanation, explain, explain_generation
from zennit_attn.cli import main
from zennit_attn.inputs.vision_language import extend_encoding

TEXTS = {'llava': '<image>The ice bear lives', 'qwen': '<|vision_start|><|image_pad|><|vision_end|>The ice bear lives'}
#: the tiny random models would otherwise end their answers at once; the image tokens (100) are suppressed by
#: explain_generation itself
NO_SPECIAL = {'suppress_tokens': [0, 1, 2, 3]}
SUPPRESSED = [0, 1, 2, 3, 100, 101]
NEW = 3


@pytest.fixture(scope='module', params=['llava', 'qwen'])
def case(request):
    """``(model, processor, text, generation)`` of one family (CP-LRP, 3 new tokens)."""
    model, processor = {'llava': (tiny_llava, llava_processor), 'qwen': (tiny_qwen2_vl, qwen2_vl_processor)}[
        request.param
    ]
    model, processor = model(zero_bias=True), processor()
    text = TEXTS[request.param]
    generation = explain_generation(
        model, processor, text, images=[image()], max_new_tokens=NEW, method='cplrp', generate_kwargs=NO_SPECIAL
    )
    return model, processor, text, generation


def prefix_encoding(processor, text, ids):
    """The processor's output for ``text`` and the image, with ``ids`` (prompt and answer tokens) as input ids and
    the per-token fields extended by hand: ones for the mask, text (0) for Qwen's ``mm_token_type_ids``."""
    encoding = dict(processor(text=text, images=[image()], return_tensors='pt'))
    extra = ids.shape[1] - encoding['input_ids'].shape[1]
    encoding['input_ids'] = ids
    encoding['attention_mask'] = torch.cat([encoding['attention_mask'], torch.ones(1, extra, dtype=torch.long)], 1)
    if 'mm_token_type_ids' in encoding:
        encoding['mm_token_type_ids'] = torch.cat(
            [encoding['mm_token_type_ids'], torch.zeros(1, extra, dtype=torch.long)], 1
        )
    return encoding


def test_each_row_conserves_text_plus_pixels(case):
    """CP-LRP without biases: row i's text relevance + pixel relevance = its logit; the whole answer's = the sum."""
    _, _, _, generation = case
    assert isinstance(generation, GenerationExplanation)
    count = generation.relevance.shape[0]
    assert count == NEW and generation.pixel_relevance.shape[0] == count and len(generation.token_images) == count
    for index in range(count):
        total = float(generation.relevance[index].sum()) + float(generation.pixel_relevance[index].sum())
        assert abs(total - float(generation.logit[index])) < 1e-6 * max(1.0, abs(float(generation.logit[index])))
        assert abs(generation.total(index) - float(generation.logit[index])) < 1e-6
        assert generation.image_relevance(index) != 0.0
    assert abs(generation.total() - float(generation.logit.sum())) < 1e-6
    assert float(generation.relevance[:, generation.image_tokens].abs().max()) == 0.0  # placeholders: replaced


def test_rows_equal_explain_on_each_prefix(case):
    """Row i is explain() on the prefix: the text with the image for the first row, and the processor's output
    extended by the generated tokens (built here by hand) for the others; same numbers."""
    model, processor, text, generation = case
    length = generation.prompt_length
    prompt = processor(text=text, images=[image()], return_tensors='pt')
    assert torch.equal(generation.input_ids[:length], prompt['input_ids'][0])
    assert generation.answer_start == length and generation.input_ids.shape[0] == length + NEW
    first = explain(
        model, text, images=[image()], processor=processor, method='cplrp', target=int(generation.target[0])
    )
    assert torch.equal(generation.relevance[0, :length], first.relevance[0])
    assert torch.equal(generation.pixel_relevance[0], first.pixel_relevance)
    for index in range(NEW):
        ids = generation.input_ids[None, : length + index]
        single = explain(
            model,
            prefix_encoding(processor, text, ids),
            processor=processor,
            method='cplrp',
            target=int(generation.target[index]),
        )
        scale = float(single.pixel_relevance.abs().max())
        assert float((generation.relevance[index, : length + index] - single.relevance[0]).abs().max()) <= 1e-10
        assert float(generation.relevance[index, length + index :].abs().max()) == 0.0
        assert float((generation.pixel_relevance[index] - single.pixel_relevance).abs().max()) <= 1e-10 * scale
        assert float(generation.logit[index]) == pytest.approx(float(single.logit[0]), abs=1e-12)
        assert int(generation.position[index]) == length + index - 1
        # the greedy answer: each generated token is the largest logit on its prefix (suppressed ids aside), so the
        # per-token fields were extended as model.generate extends them
        encoding = prefix_encoding(processor, text, ids)
        encoding['pixel_values'] = encoding['pixel_values'].double()
        with torch.no_grad():
            logits = model(**encoding).logits[0, -1]
        logits[SUPPRESSED] = -float('inf')
        assert int(logits.argmax()) == int(generation.target[index])


def test_whole_answer_is_the_sum_of_the_rows(case):
    """One backward pass from the sum of all generated logits: explain() with the (position, token) pairs on the
    full prefix, equal to the sum of the rows (LRP is linear in the initial relevance), text and pixels."""
    model, processor, text, generation = case
    start = generation.answer_start
    pairs = [(start + index - 1, int(generation.target[index])) for index in range(NEW)]
    whole = explain(
        model,
        prefix_encoding(processor, text, generation.input_ids[None, :-1]),
        processor=processor,
        method='cplrp',
        target=pairs,
    )
    assert float((generation.answer_relevance[:-1] - whole.relevance[0]).abs().max()) <= 1e-10
    assert float(generation.answer_relevance[-1]) == 0.0
    assert float((generation.answer_pixel_relevance - whole.pixel_relevance).abs().max()) <= 1e-10
    for answer, rows in (
        (generation.answer_relevance, generation.relevance),
        (generation.answer_pixel_relevance, generation.pixel_relevance),
    ):
        assert float((answer - rows.sum(0)).abs().max()) <= 1e-6 * float(answer.abs().max())
    (picture,) = generation.images
    assert abs(picture.total - float(generation.answer_pixel_relevance.sum())) < 1e-12
    assert torch.allclose(picture.patch_relevance.sum(), picture.relevance.sum(), atol=1e-12)
    assert abs(sum(images[0].total for images in generation.token_images) - picture.total) < 1e-9


def test_the_processors_output_as_prompt(case):
    """The processor's output (a mapping with pixel_values) is a prompt too, with images= left out."""
    model, processor, text, generation = case
    encoding = processor(text=text, images=[image()], return_tensors='pt')
    again = explain_generation(
        model, processor, encoding, max_new_tokens=NEW, method='cplrp', generate_kwargs=NO_SPECIAL
    )
    assert torch.equal(again.relevance, generation.relevance)
    assert torch.equal(again.pixel_relevance, generation.pixel_relevance)
    extended = extend_encoding(dict(encoding), generation.input_ids[None])
    assert int(extended['attention_mask'].sum()) == generation.input_ids.shape[0]


def test_views_show_the_images(case, tmp_path, capsys):
    _, _, _, generation = case
    page = generation.to_html()
    assert page.count('<img class="za-overlay" src="data:image/png;base64,') == 1
    data = json.loads(re.search(r'class="za-data">(.*?)</script>', page, re.S).group(1).replace('<\\/', '</'))
    assert len(data['views']) == NEW + 1
    assert all(
        len(view['images']) == 1 and view['images'][0]['src'].startswith('data:image/png;base64,')
        for view in data['views']
    )
    assert data['views'][-1]['images'][0]['caption'].endswith('for the whole answer')
    assert '[image 1]' in generation.tokens()
    assert generation.save(tmp_path / 'answer.html').read_text(encoding='utf-8') == page
    text_only = dataclasses.replace(
        generation, images=[], token_images=[], pixel_relevance=None, answer_pixel_relevance=None
    )
    assert 'data:image' not in text_only.to_html()
    if generation.image_tokens[0]:  # LLaVA (the figures take about 1.5 s each: one family is enough)
        with_image = generation.save(tmp_path / 'answer.png').read_bytes()
        assert with_image != text_only.save(tmp_path / 'text.png').read_bytes()
        assert Image.open(tmp_path / 'answer.png').size != Image.open(tmp_path / 'text.png').size
    assert generation.save(tmp_path / 'answer.tex').read_text(encoding='utf-8').count('answer_image1.png') == 1
    snippet = generation.save(tmp_path / 'token.tex', token=0, alpha=0.5).read_text(encoding='utf-8')
    assert 'generated token 1 of' in snippet and 'token_image1.png' in snippet
    generation.show(color=False)
    out = capsys.readouterr().out
    assert out.startswith('whole answer') and 'image 1: relevance' in out and 'patch relevance' in out
    generation.show(token='all', color=False)
    assert capsys.readouterr().out.count('pixel relevance: image 1') == NEW


def test_refusals(case):
    model, processor, text, _ = case
    with pytest.raises(TypeError, match="second argument must be the model's processor"):
        explain_generation(model, processor.tokenizer, text, images=[image()])
    with pytest.raises(ValueError, match='batched= does not apply with images'):
        explain_generation(model, processor, text, images=[image()], batched=True)
    with pytest.raises(ValueError, match='contrast= does not apply with images'):
        explain_generation(model, processor, text, images=[image()], contrast='runner-up')
    with pytest.raises(ValueError, match='LRP methods'):
        explain_generation(model, processor, text, images=[image()], method='input_x_gradient')
    encoding = processor(text=text, images=[image()], return_tensors='pt')
    with pytest.raises(ValueError, match='already holds pixel_values'):
        explain_generation(model, processor, encoding, images=[image()])
    with pytest.raises(ValueError, match='already holds pixel_values'):
        explain(model, encoding, images=[image()], processor=processor)
    with pytest.raises(ValueError, match="generate_kwargs must not hold 'pixel_values'"):
        explain_generation(model, processor, text, images=[image()], generate_kwargs={'pixel_values': None})
    with pytest.raises(ValueError, match='0 times for 1 images'):
        explain_generation(model, processor, 'The ice bear', images=[image()])
    with pytest.raises(TypeError, match='unknown option'):
        dataclasses.replace(case[3], images=[]).to_html(alpha=0.5)


@pytest.mark.filterwarnings('ignore:__array__ implementation:DeprecationWarning')  # PaliGemma's processor's labels
def test_paligemma_explains_the_logits_it_generated_with():
    """PaliGemma's prompt (token type 0) attends both ways, its answer (type 1) causally: the generated tokens get
    token type 1 as PaliGemma's generate gives them (before: 0, the answer joined the prompt's two-way attention and
    each row explained another logit than the one the token was generated with), each row is the logit of the model
    on its prefix with those types, and CP-LRP conserves it over text and pixels."""
    model, processor = tiny_paligemma(), paligemma_processor()
    text = '<image>The ice bear'
    generation = explain_generation(
        model, processor, text, images=[image()], max_new_tokens=NEW, method='cplrp', generate_kwargs=NO_SPECIAL
    )
    encoding = dict(processor(text=text, images=[image()], return_tensors='pt'))
    del encoding['labels']
    encoding['pixel_values'] = encoding['pixel_values'].double()
    prompt = encoding['input_ids'].shape[1]
    ids = generation.input_ids[None]
    for index in range(NEW):
        prefix = ids[:, : prompt + index]
        types = {fill: torch.cat([encoding['token_type_ids'], torch.full((1, index), fill)], 1) for fill in (0, 1)}
        with torch.no_grad():
            logits = {
                fill: model(
                    input_ids=prefix,
                    pixel_values=encoding['pixel_values'],
                    attention_mask=torch.ones_like(prefix),
                    token_type_ids=types[fill],
                ).logits[0, -1]
                for fill in (0, 1)
            }
        token = int(ids[0, prompt + index])
        assert token == int(logits[1].argmax())  # greedy generation chose it with type 1
        assert abs(float(generation.logit[index]) - float(logits[1][token])) < 1e-12
        if index:
            assert abs(float(logits[0][token]) - float(logits[1][token])) > 1e-7  # the types matter
        total = float(generation.relevance[index].sum()) + float(generation.pixel_relevance[index].sum())
        assert abs(total - float(generation.logit[index])) < 1e-12


def test_clip_cannot_generate():
    with pytest.raises(TypeError, match='CLIPModel scores \\(text, image\\) pairs and cannot generate'):
        explain_generation(tiny_clip(zero_bias=True), clip_processor(), 'the bear', images=[image()])


def test_command_line(case, tmp_path, capsys):
    model, processor, text, generation = case
    if 'qwen' in type(model).__name__.lower():
        pytest.skip('one family end to end is enough')
    model.save_pretrained(tmp_path / 'llava')
    processor.save_pretrained(tmp_path / 'llava')
    Image.fromarray(image()).save(tmp_path / 'picture.png')
    output = tmp_path / 'answer.html'
    code = main(
        [
            'generate',
            '--model',
            str(tmp_path / 'llava'),
            '--prompt',
            text,
            '--image',
            str(tmp_path / 'picture.png'),
            '--dtype',
            'float64',
            '--method',
            'cplrp',
            '--max-new-tokens',
            '2',
            '--output',
            str(output),
            '--quiet',
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert 'with 1 image(s)' in out and '+ images' in out and 'patch relevance' in out
    assert output.read_text(encoding='utf-8').count('<img class="za-overlay"') == 1
