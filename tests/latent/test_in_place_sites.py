"""A site tensor the forward pass changes in place after the site gave it out (as Falcon adds the attention output to
its MLP's output in place): a Neuron target (:py:class:`~zennit_attn.latent.targets.LatentTarget`) and edge
patching's kept tensors read it after the forward pass. Before, both read the changed tensor silently (the target
the site's value + 1 in the toy below, edge patching's senders the same); now the copies edge patching keeps without
a graph are the site's value, and a tensor read with its graph (the target, edge patching's receivers) is refused by
name where its version changed after the site.
"""

from __future__ import annotations

import pytest
import torch

from zennit_attn.latent.sites import SitePoint
from zennit_attn.latent.targets import LatentTarget
from zennit_attn.workflows.patching.edges import _kept, _Layout


class Toy(torch.nn.Module):
    """A linear site whose output the forward pass changes in place after it (``in_place``)."""

    def __init__(self, in_place: bool):
        super().__init__()
        self.linear = torch.nn.Linear(3, 3, bias=False, dtype=torch.float64)
        self.in_place = in_place

    def forward(self, x):
        y = self.linear(x)
        if self.in_place:
            y += 1.0
        return (y * y).sum()


class Run:
    """The part of a task that a readout calls: one forward pass of the model."""

    def __init__(self, model):
        self.model = model

    def run(self, inputs, rows=None, model=None, **extra):
        return (model or self.model)(inputs)


def toy(in_place: bool):
    torch.manual_seed(0)
    model, x = Toy(in_place), torch.randn(1, 2, 3, dtype=torch.float64, requires_grad=True)
    return model, x, SitePoint('value', 0, model.linear, 'output'), model.linear(x).detach()


def test_a_neuron_target_reads_the_site_or_refuses():
    model, x, point, given = toy(in_place=False)
    scores = LatentTarget(point, index=1).read(Run(model), x)
    torch.testing.assert_close(scores.detach(), given[..., 1:2], rtol=0, atol=0)
    model, x, point, _ = toy(in_place=True)
    with pytest.raises(ValueError, match='value layer 0: Linear gave out a tensor .* changed in place'):
        LatentTarget(point, index=1).read(Run(model), x)
    weights = torch.ones(1, 2, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match='changed in place'):
        LatentTarget(point, weights=weights).read(Run(model), x)


def test_edge_patching_keeps_the_site_or_refuses():
    model, x, point, given = toy(in_place=True)
    layout = _Layout({'value': [point]}, 1, 3)
    with torch.no_grad(), _kept(model, layout, keep_graph=False) as kept:
        model(x)
    torch.testing.assert_close(kept[('value', 0)], given, rtol=0, atol=0)  # not given + 1
    with _kept(model, layout, keep_graph=True) as kept:
        model(x)
        with pytest.raises(ValueError, match=r'edge patching: value layer 0 of Toy \(Linear\) .* changed in place'):
            kept.check()
    model.in_place = False
    with _kept(model, layout, keep_graph=True) as kept:
        model(x)
        kept.check()
        torch.testing.assert_close(kept[('value', 0)].detach(), given, rtol=0, atol=0)
