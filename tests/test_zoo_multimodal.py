"""The zoo walk over the image-text-to-text and masked-LM mappings (see ``test_zoo.py``), and the pixels it feeds."""

from __future__ import annotations

import pytest
import torch

from tests.test_zoo import check_mapping
from zennit_attn import zoo
from zennit_attn.engine.composites import CPLRPEpsilon


@pytest.mark.parametrize('mapping', ['image-text-to-text', 'masked-lm'])
def test_zoo(mapping):
    check_mapping(mapping)


def _tiny(architecture: str, mapping: str = 'image-text-to-text'):
    """The model and inputs of :py:func:`zoo.check` for ``architecture``, and what was fed."""
    model_class, config_class = zoo._model_class(mapping, architecture)
    config = zoo.tiny_config(config_class)
    torch.manual_seed(0)
    model = model_class(config).to(torch.float64).eval()
    zoo.zero_biases(model)
    inputs, fed = zoo._inputs(model, config, mapping, torch.Generator().manual_seed(0))
    return model, inputs, fed


@pytest.mark.parametrize('architecture', ['llava', 'qwen3_vl'])
def test_pixels_take_part_in_conservation(architecture):
    """LLaVA ([1, C, H, W] pixels) and Qwen3-VL (flattened patches with image_grid_thw) are walked with an image:
    the pixels carry relevance, and text plus pixel relevance (not the text alone) sums to the explained logit."""
    model, inputs, fed = _tiny(architecture)
    assert fed == 'text + image'
    image_token = model.config.image_token_id
    assert 0 <= image_token < model.get_input_embeddings().num_embeddings  # moved into the tiny vocabulary
    assert int((inputs['input_ids'] == image_token).sum()) > 0
    composite = CPLRPEpsilon()
    relevance, logit = zoo._relevances(model, inputs, composite)
    assert set(relevance) == {'inputs_embeds', 'pixel_values'}
    text, pixels = relevance['inputs_embeds'] * logit, relevance['pixel_values'] * logit
    assert abs(pixels) > 1e-3 * abs(logit)  # the pixel part matters ...
    assert abs(text + pixels - logit) <= 1e-6 * abs(logit)  # ... text + pixels is the logit
    assert abs(text - logit) > 1e-4 * abs(logit)  # and the text alone is not


def test_walk_records_what_was_fed():
    result = zoo.check('image-text-to-text', 'llava')
    assert (result.status, result.inputs) == ('explained', 'text + image'), result
    assert abs(result.ratio - 1) <= 1e-6
    text = zoo.check('image-text-to-text', 'evolla')  # a protein-text model: no pixels, and the page says so
    assert text.inputs.startswith('text only: '), text
    page = zoo.page([result, text])
    assert '| `llava` | explained | text + image |' in page
    assert '| `evolla` | explained | text only: the forward takes no pixel_values |' in page
