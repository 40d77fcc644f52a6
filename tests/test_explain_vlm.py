"""explain() on text and images: vision-language models (LLaVA, Qwen2-VL) and CLIP, with a processor built from its
classes (:py:mod:`tests.processors`); tiny float64 models with biases, class and position embeddings zeroed, where
CP-LRP conserves exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from tests.models import POSITIONS, VLM_PATCH, tiny_clip, tiny_llava, tiny_model, tiny_qwen2_vl
from tests.numbers import assert_close, relative_error
from tests.processors import (
    clip_processor,
    image,
    llava_processor,
    paligemma_processor,
    qwen2_vl_processor,
    siglip_processor,
    tiny_paligemma,
)
from tests.text_tokenizer import byte_level_tokenizer
from zennit_attn import explain
from zennit_attn.composites import AttnLRPEpsilon, CPLRPEpsilon, CPLRPGamma
from zennit_attn.core.errors import UnsupportedModelError
from zennit_attn.inputs.vision_language import image_layout, text_length
from zennit_attn.latent import Neuron
from zennit_attn.results.explanation import MultimodalExplanation
from zennit_attn.rules import Gamma
from zennit_attn.workflows.architecture_check import configs, processors
from zennit_attn.workflows.architecture_check.check import zero_biases

LLAVA_TEXT = '<image>The ice bear lives'
QWEN_TEXT = '<|vision_start|><|image_pad|><|vision_end|>The ice bear lives'


@pytest.fixture(scope='module')
def llava():
    return tiny_llava(zero_bias=True), llava_processor()


@pytest.fixture(scope='module')
def qwen():
    return tiny_qwen2_vl(zero_bias=True), qwen2_vl_processor()


@pytest.fixture(scope='module')
def clip():
    return tiny_clip(zero_bias=True), clip_processor()


@pytest.mark.parametrize('family', ['llava', 'qwen'])
def test_cplrp_conserves_text_plus_pixels(family, request):
    """CP-LRP without biases: text relevance + all pixel relevance = the explained logit (the initial relevance)."""
    (model, processor), text = {
        'llava': (request.getfixturevalue('llava'), LLAVA_TEXT),
        'qwen': (request.getfixturevalue('qwen'), QWEN_TEXT),
    }[family]
    exp = explain(model, text, images=[image()], processor=processor, method='cplrp')
    assert isinstance(exp, MultimodalExplanation)
    total = float(exp.relevance.sum()) + float(exp.pixel_relevance.sum())
    assert abs(total - float(exp.logit)) < 1e-6 * max(1.0, abs(float(exp.logit)))
    assert abs(exp.total(0) - float(exp.logit)) < 1e-6
    assert exp.images[0].total != 0 and float(exp.relevance.abs().sum()) > 0


@pytest.mark.parametrize('family', ['llava', 'qwen'])
def test_patches_and_images_hold_all_pixel_relevance(family, request):
    """Per-patch sums equal the image's pixel sums, the images hold all of pixel_values' relevance, and the
    placeholder tokens get none (their embeddings are replaced by image features)."""
    (model, processor), text = {
        'llava': (request.getfixturevalue('llava'), LLAVA_TEXT),
        'qwen': (request.getfixturevalue('qwen'), QWEN_TEXT),
    }[family]
    exp = explain(model, text, images=[image()], processor=processor)
    for picture in exp.images:
        channels, height, width = picture.relevance.shape
        assert picture.pixels.shape == picture.relevance.shape
        assert torch.allclose(picture.patch_relevance.sum(), picture.relevance.sum(), atol=1e-12)
        rows, columns = picture.patch_relevance.shape
        blocks = picture.relevance.sum(0).reshape(rows, height // rows, columns, width // columns).sum((1, 3))
        assert torch.allclose(blocks, picture.patch_relevance, atol=1e-12)
    assert abs(sum(picture.total for picture in exp.images) - float(exp.pixel_relevance.sum())) < 1e-12
    assert bool(exp.image_tokens.any())
    assert float(exp.relevance[exp.image_tokens].abs().sum()) == 0.0


def test_two_images_llava(llava):
    model, processor = llava
    exp = explain(
        model,
        '<image> and <image>: the bear',
        images=[image(), image(30, 18, seed=3)],
        processor=processor,
        method='cplrp',
    )
    assert len(exp.images) == 2
    assert abs(exp.total(0) - float(exp.logit)) < 1e-6
    assert exp.tokens().count('[image 1]') == 1 and exp.tokens().count('[image 2]') == 1


def test_equals_a_direct_composite_run(llava):
    """explain() gives exactly the relevance of the composite run by hand (inputs_embeds and pixel_values as leaves,
    logit.backward() seeding relevance 1, scaled by the logit)."""
    model, processor = llava
    exp = explain(model, LLAVA_TEXT, images=[image()], processor=processor, method='cplrp')
    encoding = processor(text=LLAVA_TEXT, images=[image()], return_tensors='pt')
    embeddings = model.get_input_embeddings()(encoding['input_ids']).detach().requires_grad_(True)
    pixels = encoding['pixel_values'].double().requires_grad_(True)
    with CPLRPEpsilon().context(model) as modified:
        logits = modified(
            inputs_embeds=embeddings, pixel_values=pixels, attention_mask=encoding['attention_mask'], use_cache=False
        ).logits
        logit = logits[0, -1, int(exp.target)]
        logit.backward()
    scale = float(exp.logit)
    assert torch.allclose(exp.embedding_relevance, embeddings.grad * scale, atol=1e-12)
    assert torch.allclose(exp.pixel_relevance, pixels.grad * scale, atol=1e-12)


def test_qwen_explains_the_models_own_logit(qwen):
    """Qwen2-VL's multimodal rotary positions: the explained logit is the one of the model's forward on input_ids."""
    model, processor = qwen
    exp = explain(model, QWEN_TEXT, images=[image()], processor=processor)
    encoding = processor(text=QWEN_TEXT, images=[image()], return_tensors='pt')
    encoding['pixel_values'] = encoding['pixel_values'].double()
    with torch.no_grad():
        logits = model(**encoding).logits[0, -1]
    assert int(exp.target) == int(logits.argmax())
    assert abs(float(exp.logit) - float(logits.max())) < 1e-12
    assert image_layout(model, encoding['pixel_values'], encoding) == 'patches'


def test_clip_pairs_conserve(clip):
    """CLIP: each row is one (text, image) pair explained at its similarity score; its text + pixel relevance is
    that score."""
    model, processor = clip
    texts = ['The ice bear', 'the penguin lives in the south']
    exp = explain(model, texts, images=[image()], processor=processor, method='cplrp')
    encoding = processor(text=texts, images=[image()], return_tensors='pt', padding=True)
    encoding['pixel_values'] = encoding['pixel_values'].double()
    with torch.no_grad():
        scores = model(**encoding).logits_per_text[:, 0]
    assert torch.allclose(exp.logit, scores, atol=1e-12)
    for row in range(2):
        assert abs(exp.total(row) - float(exp.logit[row])) < 1e-6
        assert [picture.row for picture in exp.images] == [0, 1]
    one = explain(model, texts[1], images=image(), processor=processor, method='cplrp')
    assert torch.allclose(
        one.relevance[0, : int(one.attention_mask.sum())], exp.relevance[1, : int(one.attention_mask.sum())], atol=1e-10
    )


CLIP_TEXTS = ['The ice bear', 'the bear']


def clip_images():
    return [image(), image(seed=2)]


def clip_by_hand(model, processor, composite):
    """Each (text ``i``, image ``i``) pair's score and its text and pixel relevance from a run of ``composite`` on the
    model by hand, without explain(): the scores on the diagonal of ``logits_per_text`` are the initial relevance
    (``grad_outputs``); the composite's boundary at the model turns the gradient at the input ``pixel_values`` into
    relevance; the word embeddings (CLIP's forward takes ids only) are a leaf a forward hook makes of the embedding's
    output (inside the forward: an explained input of the engine), where relevance is the leaf times its gradient."""
    encoding = processor(text=CLIP_TEXTS, images=clip_images(), return_tensors='pt', padding=True)
    embedding = model.text_model.get_input_embeddings()
    pixels = encoding['pixel_values'].double().requires_grad_(True)
    leaves = []
    handle = embedding.register_forward_hook(
        lambda module, args, output: leaves.append(output.detach().requires_grad_(True)) or leaves[-1]
    )
    try:
        with composite.context(model) as modified:
            scores = modified(
                input_ids=encoding['input_ids'], attention_mask=encoding['attention_mask'], pixel_values=pixels
            ).logits_per_text.diagonal()
            (words,) = leaves
            text_grad, pixel_relevance = torch.autograd.grad(scores, (words, pixels), grad_outputs=scores.detach())
    finally:
        handle.remove()
    return scores.detach(), (words.detach() * text_grad).sum(-1), pixel_relevance


def test_clip_cplrp_conserves_every_pair(clip):
    """CP-LRP on CLIP without biases, class and position embeddings (float64): each pair's text + pixel relevance is
    its score to rounding (a rule that lets relevance leak or grow, e.g. a normaliser not held constant, breaks it);
    both the text and the image carry a part of it."""
    model, processor = clip
    exp = explain(model, CLIP_TEXTS, images=clip_images(), processor=processor, method='cplrp')
    text = exp.relevance.sum(1)
    pixels = exp.pixel_relevance.flatten(1).sum(1)
    torch.testing.assert_close(text + pixels, exp.logit, rtol=1e-12, atol=0)
    assert bool((text.abs() > 1e-3 * exp.logit.abs()).all()) and bool((pixels.abs() > 1e-3 * exp.logit.abs()).all())
    assert [exp.total(row) for row in range(2)] == pytest.approx(exp.logit.tolist(), rel=1e-12)


def test_clip_attnlrp_equals_the_composite_run_by_hand(clip):
    """AttnLRP of explain() with its default composite equals AttnLRPEpsilon() run on the model by hand
    (float64, 1e-12): the same scores, text and pixel relevance; it is not CP-LRP's (the softmax rule passes
    relevance through the attention probabilities)."""
    model, processor = clip
    exp = explain(model, CLIP_TEXTS, images=clip_images(), processor=processor)
    assert exp.method == 'attnlrp'
    scores, text, pixels = clip_by_hand(model, processor, AttnLRPEpsilon())
    torch.testing.assert_close(exp.logit, scores, rtol=1e-12, atol=0)
    assert_close(exp.relevance, text, tol=1e-12)
    assert_close(exp.pixel_relevance, pixels, tol=1e-12)
    _, cp_text, cp_pixels = clip_by_hand(model, processor, CPLRPEpsilon())
    assert relative_error(cp_text, text) > 0.1 and relative_error(cp_pixels, pixels) > 0.1


def test_siglip_conserves():
    """SigLIP's attention-pooling head (torch.nn.MultiheadAttention) runs as its decomposition: CP-LRP without
    biases is exact on the similarity score (text + pixels), AttnLRP finite."""
    model = tiny_clip(zero_bias=True, family='siglip')
    exp = explain(model, 'The ice bear', images=image(), processor=clip_processor(), method='cplrp')
    assert abs(exp.total(0) - float(exp.logit[0])) < 1e-6 * max(1.0, abs(float(exp.logit[0])))
    assert float(exp.pixel_relevance.abs().sum()) > 0
    exp = explain(model, 'The ice bear', images=image(), processor=clip_processor())
    assert bool(torch.isfinite(exp.pixel_relevance).all())


# ------------------------------------------------------------------------------------------------ hostile input
def test_images_without_processor(llava):
    with pytest.raises(TypeError, match='processor='):
        explain(llava[0], LLAVA_TEXT, images=[image()])
    for wrong in (llava[1].tokenizer, llava[1].image_processor):  # half a processor
        with pytest.raises(TypeError, match='processor with an image processor and a tokenizer'):
            explain(llava[0], LLAVA_TEXT, images=[image()], processor=wrong)


def test_wrong_number_of_images(llava, clip):
    with pytest.raises(ValueError, match='1 times for 2 images'):
        explain(llava[0], LLAVA_TEXT, images=[image(), image()], processor=llava[1])
    with pytest.raises(ValueError, match='0 times for 1 images'):
        explain(llava[0], 'The ice bear', images=[image()], processor=llava[1])
    with pytest.raises(ValueError, match='3 images for 2 texts'):
        explain(clip[0], ['a', 'b'], images=[image()] * 3, processor=clip[1])
    with pytest.raises(ValueError, match='no images'):
        explain(llava[0], LLAVA_TEXT, images=[], processor=llava[1])


def test_nan_pixels(llava):
    broken = np.full((16, 16, 3), np.nan, dtype=np.float32)
    with pytest.raises(ValueError, match='NaN or infinite'):
        explain(llava[0], LLAVA_TEXT, images=[broken], processor=llava[1])


def test_refusals(llava, clip):
    model, processor = llava
    with pytest.raises(ValueError, match='LRP methods'):
        explain(model, LLAVA_TEXT, images=[image()], processor=processor, method='input_x_gradient')
    with pytest.raises(ValueError, match='latent'):
        explain(model, LLAVA_TEXT, images=[image()], processor=processor, latent='mlp')
    with pytest.raises(ValueError, match='one text at a time'):
        explain(model, [LLAVA_TEXT, LLAVA_TEXT], images=[image()], processor=processor)
    with pytest.raises(ValueError, match='leave out target'):
        explain(clip[0], 'the bear', images=image(), processor=clip[1], target=0)


def test_unsupported_layout_is_named(llava):
    with pytest.raises(ValueError, match='Idefics3'):
        image_layout(llava[0], torch.zeros(1, 2, 3, 16, 16), {})


@pytest.mark.parametrize('family', ['llava', 'qwen'])
def test_gamma_on_the_vision_tower(family, request):
    """``CPLRPGamma(within='vision')``: the gamma rules act in the vision tower only. Gamma conserves without
    biases (the stabilisers made negligible, the attention projections without epsilon), so text + pixel relevance
    is still the logit; the pixels' relevance changes with gamma, and with ``gamma = 0`` it is CP-LRP's epsilon
    composite's."""
    (model, processor), text = {
        'llava': (request.getfixturevalue('llava'), LLAVA_TEXT),
        'qwen': (request.getfixturevalue('qwen'), QWEN_TEXT),
    }[family]
    base = explain(model, text, images=[image()], processor=processor, method='cplrp')
    gamma = explain(
        model,
        text,
        images=[image()],
        processor=processor,
        target=base.target,
        method='cplrp',
        composite=CPLRPGamma(
            within='vision', conv=Gamma(0.25, 1e-30), linear=Gamma(0.5, 1e-30), attention_in=None, attention_out=None
        ),
    )
    total = float(gamma.relevance.sum()) + float(gamma.pixel_relevance.sum())
    assert abs(total - float(base.logit)) < 1e-6 * max(1.0, abs(float(base.logit)))
    assert (gamma.pixel_relevance - base.pixel_relevance).abs().max() > 1e-3 * base.pixel_relevance.abs().max()
    whole = explain(
        model,
        text,
        images=[image()],
        processor=processor,
        target=base.target,
        method='cplrp',
        composite=CPLRPGamma(conv=Gamma(0.25, 1e-30), linear=Gamma(0.5, 1e-30), attention_in=None, attention_out=None),
    )
    assert (whole.relevance - gamma.relevance).abs().max() > 1e-3 * gamma.relevance.abs().max()  # the LM is outside
    zero = explain(
        model,
        text,
        images=[image()],
        processor=processor,
        target=base.target,
        method='cplrp',
        composite=CPLRPGamma(
            within='vision', conv=Gamma(0.0, 1e-30), linear=Gamma(0.0, 1e-30), attention_in=None, attention_out=None
        ),
    )
    for found, expected in ((zero.pixel_relevance, base.pixel_relevance), (zero.relevance, base.relevance)):
        torch.testing.assert_close(found, expected, rtol=0, atol=1e-9 * float(expected.abs().max()))


def test_gamma_scope_is_checked(llava):
    model, _ = llava
    with pytest.raises(ValueError, match='no vision tower'):
        with CPLRPGamma(within='vision').context(tiny_model('llama')):
            pass
    with pytest.raises(ValueError, match='does not have'):
        with CPLRPGamma(within='model.no_such_tower').context(model):
            pass
    with pytest.raises(TypeError, match='within='):
        CPLRPGamma(within=3)
    assert all(parameter.requires_grad for parameter in model.parameters())


# ------------------------------------------------------------------------------------------------ batches of pairs
def pair_scores(model, encoding):
    encoding = {key: value.double() if value.is_floating_point() else value for key, value in encoding.items()}
    with torch.no_grad():
        return model(**encoding).logits_per_text


@pytest.mark.parametrize('family', ['clip', 'siglip'])
def test_batch_rows_equal_pairs_alone(family):
    """Every row of a padded batch of (text, image) pairs is its pair explained alone: the same score, text and
    pixel relevance to float64 precision, and CP-LRP conserves each row exactly. CLIP pools its end-of-text token
    under a causal mask, so its pads get exactly no relevance; SigLIP pools the last position (a pad in a padded
    text), so every text is padded to the 64 tokens SigLIP was trained with (as transformers' zero-shot pipeline
    pads it), alone as in the batch, and the pads keep their relevance (before: row 0 of SigLIP scored its pad
    position, its pad relevance was zeroed, and the pair alone was not padded at all)."""
    model = tiny_clip(zero_bias=True, family=family)
    processor = siglip_processor() if family == 'siglip' else clip_processor()
    texts = ['The bear', 'the penguin lives in the south']
    images = [image(), image(seed=2)]
    batch = explain(model, texts, images=images, processor=processor, method='cplrp')
    length = text_length(model)
    assert length == (POSITIONS if family == 'siglip' else None)
    padding = dict(padding='max_length', max_length=length) if length else dict(padding=True)
    scores = pair_scores(model, processor(text=texts, images=images, return_tensors='pt', **padding))
    torch.testing.assert_close(batch.logit, scores.diagonal(), rtol=0, atol=1e-12)
    for row, (text, picture) in enumerate(zip(texts, images)):
        alone = explain(model, text, images=picture, processor=processor, method='cplrp')
        width = alone.relevance.shape[1]
        assert width == (length or int(batch.attention_mask[row].sum()))
        scale = float(alone.relevance.abs().max())
        torch.testing.assert_close(batch.logit[row], alone.logit[0], rtol=0, atol=1e-12)
        torch.testing.assert_close(batch.relevance[row, :width], alone.relevance[0], rtol=0, atol=1e-12 * scale)
        assert float(batch.relevance[row, width:].abs().sum()) == 0.0
        torch.testing.assert_close(
            batch.pixel_relevance[row],
            alone.pixel_relevance[0],
            rtol=0,
            atol=1e-12 * float(alone.pixel_relevance.abs().max()),
        )
        assert abs(batch.total(row) - float(batch.logit[row])) < 1e-12 * max(1.0, abs(float(batch.logit[row])))
    if family == 'siglip':  # the pooled position is the last pad: it carries relevance
        assert bool((batch.attention_mask[0] == 0).any()) and float(batch.relevance[0, -1].abs()) > 0
    # padded on the left, a text is not the text alone (CLIP: its tokens at later learned positions, a score of 4.53
    # for 0.50 alone in a tiny CLIP with its biases; BLIP pools a pad): refused, SigLIP's padding being an input
    side = processor.tokenizer.padding_side
    processor.tokenizer.padding_side = 'left'
    try:
        encoding = processor(text=texts, images=images, return_tensors='pt', **padding)
        if family == 'siglip':
            assert explain(model, encoding, processor=processor, method='cplrp').logit.shape == (2,)
        else:
            with pytest.raises(ValueError, match='CLIPModel: the texts are padded on the left'):
                explain(model, encoding, processor=processor, method='cplrp')
    finally:
        processor.tokenizer.padding_side = side


def test_padding_the_model_reads_is_refused():
    """SigLIP texts padded to the longest (the processor's output given as it is) put SigLIP's pooled position on a
    pad for the shorter text: refused, not explained with the pads' relevance zeroed."""
    model, processor = tiny_clip(zero_bias=True, family='siglip'), siglip_processor()
    encoding = processor(
        text=['The bear', 'the penguin lives in the south'], images=[image()], return_tensors='pt', padding=True
    )
    with pytest.raises(
        ValueError,
        match=r'SiglipModel reads the padding of row 0: its pads get relevance .* padded '
        r'to 64 tokens',
    ):
        explain(model, encoding, method='cplrp')


@pytest.mark.filterwarnings('ignore:__array__ implementation:DeprecationWarning')  # PaliGemma's processor's labels
def test_paligemma_conserves_text_plus_pixels():
    """PaliGemma's processor returns labels with every encoding; they are left out (before: the model computed a
    loss, refused as cross_entropy), its token_type_ids are passed (the image and prompt attend to each other both
    ways), the explained logit is the model's own and CP-LRP conserves it over text and pixels."""
    model, processor = tiny_paligemma(), paligemma_processor()
    text = '<image>The ice bear'
    exp = explain(model, text, images=[image()], processor=processor, method='cplrp')
    total = float(exp.relevance.sum()) + float(exp.pixel_relevance.sum())
    assert abs(total - float(exp.logit)) < 1e-12 * max(1.0, abs(float(exp.logit)))
    assert exp.images[0].total != 0 and float(exp.relevance.abs().sum()) > 0
    encoding = dict(processor(text=text, images=[image()], return_tensors='pt'))
    assert 'labels' in encoding and 'token_type_ids' in encoding
    del encoding['labels']
    encoding['pixel_values'] = encoding['pixel_values'].double()
    with torch.no_grad():
        logits = model(**encoding).logits[0, -1]
        causal = model(**{key: value for key, value in encoding.items() if key != 'token_type_ids'}).logits[0, -1]
    assert int(exp.target) == int(logits.argmax())
    assert abs(float(exp.logit) - float(logits.max())) < 1e-12
    assert abs(float(causal[int(exp.target)]) - float(logits.max())) > 1e-6  # token_type_ids change the logit
    assert float(exp.relevance[exp.image_tokens].abs().sum()) == 0.0


def test_fields_that_are_not_model_inputs_are_left_out(llava):
    """A processor output's labels (a loss's targets) and fields the forward does not take (num_crops) are left
    out: the explanation is that of the encoding without them (before: LLaVA computed a loss from the labels,
    refused as cross_entropy)."""
    model, processor = llava
    encoding = dict(processor(text=LLAVA_TEXT, images=[image()], return_tensors='pt'))
    plain = explain(model, encoding, processor=processor, method='cplrp')
    extra = dict(encoding, labels=encoding['input_ids'].clone(), num_crops=torch.tensor([1]))
    found = explain(model, extra, processor=processor, method='cplrp')
    torch.testing.assert_close(found.logit, plain.logit, rtol=0, atol=0)
    torch.testing.assert_close(found.relevance, plain.relevance, rtol=0, atol=0)
    torch.testing.assert_close(found.pixel_relevance, plain.pixel_relevance, rtol=0, atol=0)


# ------------------------------------------------------------------------------------------------ contrast, checkpoints
def test_contrast_with_images(llava):
    """contrast= with images: relevance is linear in the initial relevance, so text and pixel relevance are the
    target's minus the contrast token's, and CP-LRP conserves the difference of the logits."""
    model, processor = llava
    base = explain(model, LLAVA_TEXT, images=[image()], processor=processor, method='cplrp', target=64)
    other = explain(model, LLAVA_TEXT, images=[image()], processor=processor, method='cplrp', target=5)
    exp = explain(model, LLAVA_TEXT, images=[image()], processor=processor, method='cplrp', target=64, contrast=5)
    assert int(exp.contrast) == 5
    torch.testing.assert_close(exp.logit, base.logit - other.logit, rtol=0, atol=1e-12)
    for found, minuend, subtrahend in (
        (exp.relevance, base.relevance, other.relevance),
        (exp.pixel_relevance, base.pixel_relevance, other.pixel_relevance),
    ):
        torch.testing.assert_close(found, minuend - subtrahend, rtol=0, atol=1e-12 * float(minuend.abs().max()))
    assert abs(exp.total(0) - float(exp.logit)) < 1e-12
    runner = explain(model, LLAVA_TEXT, images=[image()], processor=processor, method='cplrp', contrast='runner-up')
    assert int(runner.contrast) != int(runner.target) and abs(runner.total(0) - float(runner.logit)) < 1e-12


def test_target_function_with_images(llava):
    """A callable target with images, as for text: twice the logit gives twice the text and pixel relevance."""
    model, processor = llava
    base = explain(model, LLAVA_TEXT, images=[image()], processor=processor, method='cplrp', target=5)
    twice = explain(
        model,
        LLAVA_TEXT,
        images=[image()],
        processor=processor,
        method='cplrp',
        target=lambda logits: 2.0 * logits[:, 5],
    )
    torch.testing.assert_close(twice.logit, 2 * base.logit, rtol=0, atol=1e-12)
    torch.testing.assert_close(twice.relevance, 2 * base.relevance, rtol=0, atol=1e-12)
    torch.testing.assert_close(twice.pixel_relevance, 2 * base.pixel_relevance, rtol=0, atol=1e-12)


@pytest.mark.parametrize('family', ['llava', 'qwen', 'clip'])
def test_checkpointing_with_images(family, request):
    """checkpointing=True recomputes the blocks of the vision tower and of the text model in the backward pass: the
    same relevance (LLaVA's language model gets use_cache=False, else its cache grew in the recomputation)."""
    (model, processor), text = {
        'llava': (request.getfixturevalue('llava'), LLAVA_TEXT),
        'qwen': (request.getfixturevalue('qwen'), QWEN_TEXT),
        'clip': (request.getfixturevalue('clip'), ['The ice bear', 'the bear']),
    }[family]
    plain = explain(model, text, images=[image()], processor=processor)
    saved = explain(model, text, images=[image()], processor=processor, checkpointing=True)
    torch.testing.assert_close(saved.logit, plain.logit, rtol=0, atol=0)
    torch.testing.assert_close(saved.relevance, plain.relevance, rtol=0, atol=1e-12)
    torch.testing.assert_close(saved.pixel_relevance, plain.pixel_relevance, rtol=0, atol=1e-12)


# ------------------------------------------------------------------------------------------------ refusals, named
def test_arguments_that_do_not_apply_say_why(llava, clip):
    model, processor = llava
    stacks = r"its stacks: 'model.vision_tower.encoder.layers', 'model.language_model.layers'\)"
    for arguments, message in (
        (dict(latent='mlp'), 'latent= with images: latent relevance is read at the sites of one stack .*' + stacks),
        (dict(condition=[Neuron('mlp', 0, 1)]), 'condition= with images: .*' + stacks),
        (dict(target=Neuron('mlp', 0, 1)), 'a Neuron target with images: .*' + stacks),
        (dict(attention_mask=torch.ones(1, 8)), 'attention_mask= does not apply .* processor makes the attention'),
        (
            dict(decoder_input_ids=torch.ones(1, 1, dtype=torch.long)),
            'decoder_input_ids= does not apply .* decoder-only',
        ),
        (dict(tokenizer=processor.tokenizer), r'tokenizer= does not apply .* \(processor.tokenizer\)'),
    ):
        with pytest.raises(ValueError, match=message):
            explain(model, LLAVA_TEXT, images=[image()], processor=processor, **arguments)
    with pytest.raises(ValueError, match=r'CLIPModel scores \(text, image\) pairs: .* leave out contrast='):
        explain(clip[0], 'the bear', images=image(), processor=clip[1], contrast=3)
    with pytest.raises(ValueError, match=r"latent= with images: .* CLIPModel runs the vision tower's blocks"):
        explain(clip[0], 'the bear', images=image(), processor=clip[1], latent='mlp')


def other_image_token_processor() -> transformers.LlavaProcessor:
    """LLaVA's processor whose ``<image>`` token is id 101 (another token added before it), where the model's is 100."""
    processor = llava_processor()
    tokenizer = byte_level_tokenizer()
    tokenizer.add_special_tokens({'additional_special_tokens': ['<other>', '<image>']})
    return transformers.LlavaProcessor(
        image_processor=processor.image_processor,
        tokenizer=tokenizer,
        patch_size=VLM_PATCH,
        vision_feature_select_strategy='default',
        image_token='<image>',
        num_additional_image_tokens=1,
    )


@pytest.mark.parametrize('case', ['qwen-llava', 'qwen-clip', 'llava-qwen', 'llava-clip', 'llava-token', 'clip-llava'])
def test_processor_of_another_model(case, llava, qwen, clip):
    """A processor that is not the model's is refused before the model runs, naming the evidence and both (before:
    TypeError get_rope_index() missing mm_token_type_ids, an unpacking error in LLaVA's vision tower, a mismatch of
    image tokens and features inside the model)."""
    models = {'llava': llava[0], 'qwen': qwen[0], 'clip': clip[0]}
    processors = {'llava': llava[1], 'qwen': qwen[1], 'clip': clip[1], 'token': other_image_token_processor()}
    texts = {'llava': LLAVA_TEXT, 'token': LLAVA_TEXT, 'qwen': QWEN_TEXT, 'clip': 'The ice bear'}
    evidence = {
        'qwen-llava': r'computes its rotary positions \(get_rope_index\) from mm_token_type_ids',
        'qwen-clip': 'the text holds no image token of Qwen2VLForConditionalGeneration \\(id 100\\)',
        'llava-qwen': 'describes its pixel_values with image_grid_thw, which the forward of '
        'LlavaForConditionalGeneration does not take',
        'llava-clip': 'the text holds no image token of LlavaForConditionalGeneration',
        'llava-token': r'the text holds no image token of LlavaForConditionalGeneration \(id 100\) for its '
        r"pixel_values \(the processor's image token '<image>' is id 101\)",
        'clip-llava': r"the processor puts the image placeholder token '<image>' into the text, which "
        'CLIPModel does not take',
    }[case]
    model_name, processor_name = case.split('-')
    model, processor = models[model_name], processors[processor_name]
    model_type = model.config.model_type
    with pytest.raises(
        ValueError,
        match=f'{evidence}.*: the processor \\({type(processor).__name__}\\) is not the '
        f'processor of {type(model).__name__} \\(model_type {model_type!r}\\)',
    ):
        explain(model, texts[processor_name], images=[image()], processor=processor)


def test_second_pixel_input_is_refused():
    """DeepSeek-VL hybrid takes the image twice (``pixel_values`` and ``high_res_pixel_values`` for its second tower):
    explain() reads pixel relevance from ``pixel_values`` only, so it refuses by name rather than lose the
    high-resolution tower's share (before: the forward failed on the second input's dtype, or, in float32, the text
    and pixel relevance fell short of the logit)."""
    model_class, config_class = configs.model_class('image-text-to-text', 'deepseek_vl_hybrid')
    config = configs.tiny_config(config_class)
    torch.manual_seed(0)
    model = model_class(config).double().eval()
    vocab = model.get_input_embeddings().num_embeddings
    model.config.image_token_id = vocab - 1  # the placeholder into the tiny vocabulary (the walk moves it so)
    processor = processors.build_processor(model, config, vocab, {vocab - 1})
    text = f'w10 {processor.image_token} w11'
    encoding = processor(text=text, images=[processors.small_image()], return_tensors='pt')
    assert {'pixel_values', 'high_res_pixel_values'} <= set(encoding)
    with pytest.raises(ValueError, match='takes the image also as high_res_pixel_values'):
        explain(model, text, images=[processors.small_image()], processor=processor)


def _architecture(architecture: str, vocab_special=frozenset()):
    """A tiny random model of ``architecture`` (the architecture check's configuration, float64, no biases) and the
    processor of its architecture fitted to it."""
    model_class, config_class = configs.model_class('image-text-to-text', architecture)
    config = configs.tiny_config(config_class)
    torch.manual_seed(0)
    model = model_class(config).double().eval()
    zero_biases(model)
    vocab = model.get_input_embeddings().num_embeddings
    return model, processors.build_processor(model, config, vocab, set(vocab_special))


def test_git_explains_the_last_text_token():
    """GIT's hidden states hold its image tokens in front of the text (17 + 4 rows here): the explained logit is the
    last text token's, as the model's forward gives it, and CP-LRP conserves it over text and pixels. Before, the
    positions of the text were passed as ``logits_to_keep`` counted from the start: the logit of image token 3 was
    explained (another target, and no relevance for the text). A model without ``logits_to_keep`` whose output rows
    are not its tokens is refused by name."""
    model, processor = _architecture('git')
    text, picture = 'w4 w5 w6 w7', processors.small_image()
    exp = explain(model, text, images=[picture], processor=processor, method='cplrp')
    encoding = processor(text=text, images=[picture], return_tensors='pt')
    with torch.no_grad():
        logits = model(input_ids=encoding['input_ids'], pixel_values=encoding['pixel_values'].double()).logits[0]
    assert logits.shape[0] == encoding['input_ids'].shape[1] + 17
    assert int(exp.target) == int(logits[-1].argmax())
    assert abs(float(exp.logit) - float(logits[-1].max())) < 1e-12
    assert abs(exp.total(0) - float(exp.logit)) < 1e-10
    assert float(exp.relevance.abs().sum()) > 0.1 * abs(float(exp.logit))
    with pytest.raises(UnsupportedModelError, match='has 21 positions for an input of 4 tokens'):
        explain(model, text, images=[picture], processor=processor, model_kwargs={'logits_to_keep': 0})


def test_qwen_left_padded_rows_get_their_multimodal_positions():
    """A left-padded processor output of Qwen2-VL: the rotary positions come from its ``get_rope_index`` with the
    attention mask, as its forward on the ids computes them, so the explained logit is the model's and the relevance
    is that of the unpadded text. Before, the positions of left padding (the token count before each token) replaced
    them: the logit 1.25e-4 (relative) off the model's. (SDPA: float64 eager attention gives NaN on padding.)"""
    model, processor = tiny_qwen2_vl(zero_bias=True, attn_implementation='sdpa'), qwen2_vl_processor()
    tokenizer = processor.tokenizer
    plain = processor(text=QWEN_TEXT, images=[image()], return_tensors='pt')
    side = tokenizer.padding_side
    tokenizer.padding_side = 'left'
    try:
        length = plain['input_ids'].shape[1] + 3
        padded = processor(
            text=QWEN_TEXT, images=[image()], return_tensors='pt', padding='max_length', max_length=length
        )
    finally:
        tokenizer.padding_side = side
    assert int(padded['attention_mask'][0, :3].sum()) == 0
    alone, left = (explain(model, dict(encoding), processor=processor) for encoding in (plain, padded))
    inputs = {key: value.double() if value.is_floating_point() else value for key, value in padded.items()}
    with torch.no_grad():
        logit = model(**inputs).logits[0, -1, int(left.target)]
    assert abs(float(left.logit) - float(logit)) < 1e-12
    assert_close(left.relevance[:, 3:], alone.relevance, 1e-10)
    assert_close(left.pixel_relevance, alone.pixel_relevance, 1e-10)


def test_strip_of_slices_is_refused():
    """MiniCPM-V lays the patches of every image slice side by side in one strip ``[1, channels, patch, width]`` with
    ``target_sizes``: four dimensions, but not ``[images, channels, height, width]`` (two images were read as one
    image of 8 x 50,304 pixels, the second image's relevance inside it)."""
    model, processor = _architecture('minicpmv4_6')
    placeholder = processor.image_token
    text = f'w10 {placeholder} w11 {placeholder} w12'
    with pytest.raises(ValueError, match=r'pixel_values of shape \(1, 3, 8, \d+\) with target_sizes: the patches'):
        explain(model, text, images=[processors.small_image(), processors.small_image(32, 56)], processor=processor)


def test_encoder_decoder_with_images_is_refused():
    """T5Gemma 2 with images: refused by name. Before, the architecture check's tiny T5Gemma 2 was refused for its
    missing decoder start token, with advice ('pass decoder_input_ids=') that explain() refuses with images."""
    model, processor = _architecture('t5gemma2')
    encoding = processor(text=f'w10 {processor.image_token} w11', images=[image()], return_tensors='pt')
    with pytest.raises(UnsupportedModelError, match='T5Gemma2ForConditionalGeneration is an encoder-decoder model'):
        explain(model, dict(encoding), processor=processor)


def test_palrp_refuses_a_position_table_held_as_a_parameter():
    """BLIP's vision tower holds its position table as a parameter, a constant of the explanation: PA-LRP read the
    text tower's table alone and gave position relevance without the vision positions' share. Refused, naming it."""
    config = configs.tiny_config(transformers.BlipConfig)
    torch.manual_seed(0)
    model = transformers.BlipModel(config).double().eval()
    vocab = model.text_model.get_input_embeddings().num_embeddings
    processor = processors.build_processor(model, config, vocab, set())
    with pytest.raises(ValueError, match=r"BlipModel holds a position table as a parameter \('vision_model"):
        explain(model, ['w4 w5 w6'], images=processors.small_image(), processor=processor, method='palrp')


def test_palrp_refuses_the_positions_of_a_vision_tower(llava):
    """LLaVA's vision tower has a position table of its own (a module, as the text's rotary embedding is): PA-LRP read
    both as one sequence, refused only where their lengths differed, and summed the tower's 17 positions into a text
    of 17 tokens. The encodings outside the language model (``model.get_decoder()``) are the vision tower's: refused by
    name whatever the lengths."""
    model, processor = llava
    with pytest.raises(ValueError, match="position encodings of LlavaForConditionalGeneration's vision"):
        explain(model, LLAVA_TEXT, images=[image()], processor=processor, method='palrp')
    assert explain(model, [5, 9, 14], method='palrp').position_relevance.shape == (1, 3)  # the text alone
