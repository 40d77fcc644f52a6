"""The zoo walk over the image-text-to-text and masked-LM mappings (see ``test_zoo.py``), and the pixels it feeds."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from tests.test_zoo import check_mapping
from tools import supported_models
from zennit_attn.composites import CPLRPEpsilon
from zennit_attn.workflows.architecture_check import check, configs, processors
from zennit_attn.workflows.architecture_check.pixels import VIA_PROCESSOR


@pytest.mark.parametrize(
    'mapping',
    [
        # every vision-language architecture of transformers, each explained twice (about 90 s)
        pytest.param('image-text-to-text', marks=pytest.mark.slow),
        'masked-lm',
    ],
)
def test_zoo(mapping):
    check_mapping(mapping)


def _tiny(architecture: str, mapping: str = 'image-text-to-text'):
    """The model and inputs of :py:func:`check.check_architecture` for ``architecture``, and what was fed (as the
    check builds them: eager experts, which float64 needs, weights drawn anew, zero biases)."""

    def build():
        model_class, config_class = configs.model_class(mapping, architecture)
        return model_class, configs.tiny_config(config_class)

    return check.built_model(mapping, build, 0, torch.Generator().manual_seed(0))


@pytest.mark.parametrize(
    'architecture', ['llava', 'qwen3_vl', 'got_ocr2', 'minicpmv4_6', 'fast_vlm', 'nemotron_h_omni']
)
def test_pixels_take_part_in_conservation(architecture):
    """LLaVA ([1, C, H, W] pixels), Qwen3-VL (flattened patches with image_grid_thw), GOT-OCR 2 (a SAM tower
    initialised with weights of 1e-10, drawn anew: its pixels carried 1e-20 of the logit), MiniCPM-V 4.6 (no image
    placeholder id by default: its image features were never merged) and FastVLM (a FastViT tower whose conditional
    position encoding was zeroed as a position table, and whose std 0.02 shrank the pixels to 1e-40) and Nemotron-H
    Omni (a processor that requires an audio feature extractor no mapping names; RADIO's class and register tokens
    zeroed) are walked with an image: the pixels carry relevance, and text plus pixel relevance (not the text alone)
    sums to the explained logit."""
    model, inputs, fed = _tiny(architecture)
    assert fed.startswith('text + image')
    image_token = model.config.image_token_id
    assert 0 <= image_token < model.get_input_embeddings().num_embeddings  # moved into the tiny vocabulary
    assert int((inputs['input_ids'] == image_token).sum()) > 0
    relevance, logit = check.input_relevances(model, inputs, CPLRPEpsilon())
    assert set(relevance) == {'inputs_embeds', 'pixel_values'}
    text, pixels = relevance['inputs_embeds'] * logit, relevance['pixel_values'] * logit
    assert abs(pixels) > 1e-3 * abs(logit)  # the pixel part matters ...
    assert abs(text + pixels - logit) <= 1e-6 * abs(logit)  # ... text + pixels is the logit
    assert abs(text - logit) > 1e-4 * abs(logit)  # and the text alone is not


def test_zero_biases_keeps_convolutions_named_as_positions():
    """A convolution named as a position embedding (FastViT's conditional position encoding ``pos_emb``) is a
    function of its input, not a constant: its weight is kept (zeroed, it cut FastVLM's pixels off), its bias and a
    position table are zeroed."""
    model = torch.nn.Module()
    model.pos_emb = torch.nn.Conv2d(2, 2, 3, padding=1)
    model.position_embeddings = torch.nn.Embedding(4, 2)
    weight = model.pos_emb.weight.detach().clone()
    check.zero_biases(model)
    assert torch.equal(model.pos_emb.weight, weight)
    assert not model.pos_emb.bias.any() and not model.position_embeddings.weight.any()


def test_walk_records_what_was_fed():
    result = check.check_architecture('image-text-to-text', 'llava')
    assert result.status == 'explained' and result.inputs.startswith(f'{VIA_PROCESSOR}, pixel share '), result
    assert abs(result.ratio - 1) <= 1e-6
    text = check.check_architecture('image-text-to-text', 'evolla')  # a protein-text model: no pixels, the page says so
    assert text.inputs.startswith('text only: '), text
    page = supported_models.page([result, text])
    assert f'| `llava` | explained | exact | {result.inputs} |' in page
    assert '| `evolla` | explained | exact | text only: the forward takes no pixel_values |' in page


#: Architectures whose pixel inputs only their processor lays out, and the fields of that layout: Gemma 3's image
#: tokens between its begin- and end-of-image tokens, Llama 3.2 Vision's tiles with aspect-ratio ids and
#: cross-attention masks, Fuyu's flattened patches ``[patches, 3 * 8 * 8]``, Idefics' image attention mask (its
#: processor pads images it finds no ``<image>`` token for with zeros: pixels without relevance); with the shape of
#: the pixels.
PROCESSED = {
    'gemma3': ({'pixel_values', 'token_type_ids'}, (1, 3, 32, 32)),
    'mllama': ({'pixel_values', 'aspect_ratio_ids', 'aspect_ratio_mask', 'cross_attention_mask'}, (1, 1, 4, 3, 32, 32)),
    'fuyu': ({'pixel_values'}, (16, 192)),
    'idefics': ({'pixel_values', 'image_attention_mask'}, (1, 1, 3, 32, 32)),
}


@pytest.mark.parametrize('architecture', sorted(PROCESSED))
def test_processor_pixels_conserve(architecture):
    """The walk feeds Gemma 3, Llama 3.2 Vision, Fuyu and Idefics the outputs of their own processors (built offline and
    fitted to the tiny configuration; guessed layouts ran none of them): the pixels carry relevance, and text plus
    pixels is exactly the explained logit."""
    model, inputs, fed = _tiny(architecture)
    assert fed == VIA_PROCESSOR
    fields, shape = PROCESSED[architecture]
    assert fields <= set(inputs) and tuple(inputs['pixel_values'].shape) == shape, inputs
    relevance, logit = check.input_relevances(model, inputs, CPLRPEpsilon())
    pixels = relevance['pixel_values'] * logit
    assert abs(pixels) > 1e-5 * abs(logit)
    assert abs(sum(relevance.values()) * logit - logit) <= 1e-6 * abs(logit)


def test_ovis2_is_fed_its_processor_whatever_the_hash_seed():
    """Ovis2's processor expands its '<image>' into '<IMG_ATOM>' tokens of the configuration's ``image_token_id``:
    with both strings at that id, the tokenizer kept one of them by Python's hash seed, and under some seeds (5) the
    walk fed Ovis2 a guessed layout after the forward failed on the processor's outputs. Each string has its own id
    now (the processor's own token of a field that a literal token has already is a placeholder, with a free id)."""
    code = (
        'from zennit_attn.workflows.architecture_check import check; '
        "print(check.check_architecture('image-text-to-text', 'ovis2').inputs)"
    )
    environment = {**os.environ, 'PYTHONHASHSEED': '5'}
    found = subprocess.run([sys.executable, '-c', code], env=environment, capture_output=True, text=True, check=True)
    assert found.stdout.startswith(f'{VIA_PROCESSOR}, pixel share '), found.stdout


def test_offline_tokenizer_has_the_model_ids():
    """The tokenizer made in memory splits off each special token wherever it stands, with the id it is given, and
    names the model-specific tokens (what processors read of it)."""
    tokenizer = processors.offline_tokenizer(96, {'<image>': 95, '<boi>': 93}, {1, 2, 95}, {'image_token': '<image>'})
    assert tokenizer('w10 <boi><image><image> w11')['input_ids'] == [10, 93, 95, 95, 11]
    assert (tokenizer.image_token, tokenizer.image_token_id) == ('<image>', 95)
    assert {tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id}.isdisjoint({1, 2, 93, 95})
