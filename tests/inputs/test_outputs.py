"""What a model's output is read as (:py:meth:`zennit_attn.inputs.task.Task.resolve`), float64.

1. An output map per row (semantic segmentation's ``[batch, classes, height, width]`` logits): a function of the
   whole map is explained, and CP-LRP conserves its value exactly on tiny SegFormer and BEiT segmentation models
   without constants (BEiT's decoder upsamples with transposed convolutions, which the gamma composites give their
   rule); a class index, the argmax, a contrast or a position is refused, naming the map (they were read as a
   position and a column of it).
2. One value per row (``[batch]``: a regression or reward head) is that row's value.
3. An output without the batch dimension (``logits[0]``, ``.squeeze(0)``) is refused: its positions were read as rows.
4. A detector's outputs per object query (DETR's, YOLOS's class logits and boxes): the query is named with
   ``position=`` (none was the last query), and CP-LRP conserves the explained class logit and box coordinate;
   without a position, a function of the whole output (all queries, a depth map) is explained and conserved.
"""

from __future__ import annotations

import pytest
import torch

from tests.models import tiny_hf_vision, tiny_hf_vit, tiny_model, token_ids
from zennit_attn import explain
from zennit_attn.composites import CPLRPEpsilon

#: ``model class -> configuration values`` of the segmentation models (BEiT's neck takes four layers' outputs)
SEGMENTATION = {
    'SegformerForSemanticSegmentation': {},
    'BeitForSemanticSegmentation': dict(num_hidden_layers=4, out_indices=[1, 2, 3, 4]),
}


def class_score(scores: torch.Tensor) -> torch.Tensor:
    """Class 1's score summed over the map."""
    return scores[:, 1].sum((-2, -1))


class Wrapped(torch.nn.Module):
    """``model``'s logits through ``read`` (a user's wrapper)."""

    def __init__(self, model: torch.nn.Module, read):
        super().__init__()
        self.model, self.read = model, read
        self.config = model.config

    def get_input_embeddings(self):
        return self.model.get_input_embeddings()

    def forward(self, *args, **kwargs):
        return self.read(self.model(*args, **kwargs).logits)


@pytest.mark.parametrize('name', sorted(SEGMENTATION))
def test_a_function_of_a_segmentation_map_is_explained_and_conserved(name):
    model, pixels = tiny_hf_vision(name, labels=2, **SEGMENTATION[name])
    with torch.no_grad():
        logits = model(pixel_values=pixels).logits
    assert logits.dim() == 4
    region = torch.zeros(logits.shape[-2:], dtype=torch.float64)
    region[1:3, :2] = 1.0
    for function in (class_score, lambda scores: (scores[:, 0] * region).sum((-2, -1))):
        explanation = explain(model, pixels, target=function, method='cplrp', composite=CPLRPEpsilon())
        torch.testing.assert_close(explanation.logit, function(logits), rtol=1e-12, atol=0)
        torch.testing.assert_close(explanation.pixel_relevance.sum((1, 2, 3)), explanation.logit, rtol=1e-9, atol=0)
        assert explanation.target.tolist() == [-1, -1]  # no class: the function is explained
    alone = explain(model, pixels[1:], target=class_score, method='cplrp', composite=CPLRPEpsilon())
    torch.testing.assert_close(explanation.pixel_relevance[1:].sum(), explanation.logit[1], rtol=1e-9, atol=0)
    default = explain(model, pixels, target=class_score)  # the image default, gamma on every layer
    torch.testing.assert_close(default.logit, class_score(logits), rtol=1e-12, atol=0)
    assert alone.logit.shape == (1,)


@pytest.mark.parametrize(
    'name, options',
    [
        ('DetrForObjectDetection', dict(use_timm_backbone=False, use_pretrained_backbone=False)),
        ('YolosForObjectDetection', dict(image_size=[32, 32], num_detection_tokens=10)),
    ],
)
def test_a_detectors_query_is_named_and_conserved(name, options):
    model, pixels = tiny_hf_vision(name, **options)
    with torch.no_grad():
        output = model(pixel_values=pixels)
    with pytest.raises(ValueError, match='gives outputs per position .* name the one to explain with position='):
        explain(model, pixels, target=1)
    for field, values in (('logits', output.logits), ('pred_boxes', output.pred_boxes)):
        explanation = explain(
            model, pixels, position=[3, 5], target=1, output=field, method='cplrp', composite=CPLRPEpsilon()
        )
        torch.testing.assert_close(explanation.logit, values[[0, 1], [3, 5], 1], rtol=1e-12, atol=0)
        torch.testing.assert_close(explanation.pixel_relevance.sum((1, 2, 3)), explanation.logit, rtol=1e-9, atol=0)
        assert explanation.position.tolist() == [3, 5]


def test_an_image_model_output_per_position_is_explained_whole_by_a_function():
    """Without a position, a function of an image model's whole output per position is explained: GLPN's depth map
    (``output='predicted_depth'``, ``[batch, height, width]``) over a corner, DETR's class 1 over every object query;
    CP-LRP conserves both (a function received a row of the map before, or was refused)."""
    depth_model, pixels = tiny_hf_vision('GLPNForDepthEstimation')
    corner = lambda depth: depth[:, :4, :4].sum((-2, -1))  # noqa: E731
    detector, images = tiny_hf_vision('DetrForObjectDetection', use_timm_backbone=False, use_pretrained_backbone=False)
    every_query = lambda logits: logits[..., 1].sum(-1)  # noqa: E731
    with torch.no_grad():
        depth = depth_model(pixel_values=pixels).predicted_depth
        logits = detector(pixel_values=images).logits
    for model, inputs, function, output, value in (
        (depth_model, pixels, corner, 'predicted_depth', corner(depth)),
        (detector, images, every_query, None, every_query(logits)),
    ):
        explanation = explain(model, inputs, target=function, output=output, method='cplrp', composite=CPLRPEpsilon())
        torch.testing.assert_close(explanation.logit, value, rtol=1e-12, atol=0)
        torch.testing.assert_close(explanation.pixel_relevance.sum((1, 2, 3)), explanation.logit, rtol=1e-9, atol=0)
        assert explanation.position is None and explanation.target.tolist() == [-1, -1]


@pytest.mark.parametrize(
    'options, match',
    [
        ({}, 'is a map of shape'),
        ({'target': 1}, 'a class index or the argmax'),
        ({'target': class_score, 'position': 0}, 'position'),
    ],
)
def test_a_segmentation_map_needs_a_function(options, match):
    model, pixels = tiny_hf_vision('SegformerForSemanticSegmentation', labels=2)
    with pytest.raises(ValueError, match=match):
        explain(model, pixels, **options)


def test_one_value_per_row_is_that_rows_value():
    model = tiny_hf_vit(zero_bias=True)
    images = torch.rand(2, 3, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    wrapped = Wrapped(model, lambda logits: logits[:, 2]).eval()
    explanation = explain(wrapped, images, method='cplrp', composite=CPLRPEpsilon())
    with torch.no_grad():
        torch.testing.assert_close(explanation.logit, model(pixel_values=images).logits[:, 2], rtol=1e-12, atol=0)
    torch.testing.assert_close(explanation.pixel_relevance.sum((1, 2, 3)), explanation.logit, rtol=1e-9, atol=0)


@pytest.mark.parametrize(
    'read', [lambda logits: logits[0], lambda logits: logits.squeeze(0), lambda logits: logits.sum()]
)
def test_an_output_without_its_batch_dimension_is_refused(read):
    model = tiny_model('llama')
    wrapped = Wrapped(model, read).eval()
    with pytest.raises(ValueError, match='its first dimension must be the batch'):
        explain(wrapped, token_ids('llama', 6))
