"""explain() on text and images: vision-language models (LLaVA, Qwen2-VL) and CLIP, with a processor built from its
classes (:py:mod:`tests.processors`); tiny float64 models with biases, class and position embeddings zeroed, where
CP-LRP conserves exactly."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.models import tiny_clip, tiny_llava, tiny_model, tiny_qwen2_vl
from tests.processors import clip_processor, image, llava_processor, qwen2_vl_processor
from zennit_attn import explain
from zennit_attn.composites import CPLRPEpsilon, CPLRPGamma
from zennit_attn.explanation import MultimodalExplanation
from zennit_attn.rules import Gamma
from zennit_attn.vision_language import image_layout

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
    (model, processor), text = {'llava': (request.getfixturevalue('llava'), LLAVA_TEXT),
                                'qwen': (request.getfixturevalue('qwen'), QWEN_TEXT)}[family]
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
    (model, processor), text = {'llava': (request.getfixturevalue('llava'), LLAVA_TEXT),
                                'qwen': (request.getfixturevalue('qwen'), QWEN_TEXT)}[family]
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
    exp = explain(model, '<image> and <image>: the bear', images=[image(), image(30, 18, seed=3)],
                  processor=processor, method='cplrp')
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
        logits = modified(inputs_embeds=embeddings, pixel_values=pixels, attention_mask=encoding['attention_mask'],
                          use_cache=False).logits
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
    assert torch.allclose(one.relevance[0, :int(one.attention_mask.sum())],
                          exp.relevance[1, :int(one.attention_mask.sum())], atol=1e-10)


def test_clip_attnlrp_is_finite(clip):
    model, processor = clip
    exp = explain(model, ['The ice bear', 'the bear'], images=[image(), image(seed=2)], processor=processor)
    assert bool(torch.isfinite(exp.pixel_relevance).all()) and exp.method == 'attnlrp'


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
    (model, processor), text = {'llava': (request.getfixturevalue('llava'), LLAVA_TEXT),
                                'qwen': (request.getfixturevalue('qwen'), QWEN_TEXT)}[family]
    base = explain(model, text, images=[image()], processor=processor, method='cplrp')
    gamma = explain(model, text, images=[image()], processor=processor, target=base.target,
                    composite=CPLRPGamma(within='vision', conv=Gamma(0.25, 1e-30), linear=Gamma(0.5, 1e-30),
                                         attention_in=None, attention_out=None))
    total = float(gamma.relevance.sum()) + float(gamma.pixel_relevance.sum())
    assert abs(total - float(base.logit)) < 1e-6 * max(1.0, abs(float(base.logit)))
    assert (gamma.pixel_relevance - base.pixel_relevance).abs().max() > 1e-3 * base.pixel_relevance.abs().max()
    whole = explain(model, text, images=[image()], processor=processor, target=base.target,
                    composite=CPLRPGamma(conv=Gamma(0.25, 1e-30), linear=Gamma(0.5, 1e-30), attention_in=None,
                                         attention_out=None))
    assert (whole.relevance - gamma.relevance).abs().max() > 1e-3 * gamma.relevance.abs().max()  # the LM is outside
    zero = explain(model, text, images=[image()], processor=processor, target=base.target,
                   composite=CPLRPGamma(within='vision', conv=Gamma(0.0, 1e-30), linear=Gamma(0.0, 1e-30),
                                        attention_in=None, attention_out=None))
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
