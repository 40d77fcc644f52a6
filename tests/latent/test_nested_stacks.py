"""Blocks held in nested lists (Funnel's ``funnel.encoder.blocks[i][j]``: one inner list per group of blocks between
two poolings) are blocks of one stack, in the order the model runs them; the inner lists are not blocks. Before, the
inner lists were taken for the encoder's 3 blocks (a list is never called), so the latent sites read the decoder's 2
blocks as the model's only stack ("layer 0" was the decoder's input), the conservation report read 0 at every encoder
boundary and checkpointing left the encoder out. Funnel runs two stacks, so the layer-indexed workflows refuse it by
name; the report reads every block (tiny random float64 model with zero biases: sums the math fixes).
"""

from __future__ import annotations

import pytest
import torch

from tests.models import zoo_model
from zennit_attn import conservation, explain
from zennit_attn.canonizers.checkpointing import checkpointed
from zennit_attn.composites import CPLRPEpsilon
from zennit_attn.core.blocks import block_stacks, transformer_blocks
from zennit_attn.latent import Neuron, steer

TIGHT = dict(rtol=1e-10, atol=1e-10)


@pytest.fixture(scope='module')
def funnel():
    model, inputs = zoo_model('masked-lm', 'funnel')
    return model, inputs['input_ids'][:1]


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = torch.nn.MultiheadAttention(4, 1, batch_first=True)

    def forward(self, x):
        return x + self.attention(x, x, x)[0]


def test_nested_lists_of_blocks_are_one_stack():
    """A list of lists of blocks is one stack of the blocks in module order, named by the outer list; no list is a
    block."""
    model = torch.nn.Module()
    model.groups = torch.nn.ModuleList([torch.nn.ModuleList([Block(), Block()]) for _ in range(3)])
    ((path, blocks),) = block_stacks(model)
    assert path == 'groups'
    assert blocks == [block for group in model.groups for block in group]


def test_every_block_of_funnel(funnel):
    model, _ = funnel
    stacks = block_stacks(model)
    assert [(path, len(blocks)) for path, blocks in stacks] == [
        ('funnel.encoder.blocks', 12),
        ('funnel.decoder.layers', 2),
    ]
    assert stacks[0][1] == [block for group in model.funnel.encoder.blocks for block in group]
    assert all(type(block).__name__ == 'FunnelLayer' for block in transformer_blocks(model))
    with checkpointed(model) as blocks:
        assert len(blocks) == 14


def test_layer_indexed_workflows_refuse_funnel(funnel):
    """Latent relevance, Neuron targets and steering refuse a model that runs two stacks, naming them."""
    model, ids = funnel
    with pytest.raises(ValueError, match=r"'funnel.encoder.blocks' \(12 blocks\), 'funnel.decoder.layers' \(2"):
        explain(model, ids, method='cplrp', latent='residual')
    with pytest.raises(ValueError, match='runs 2 stacks'):
        explain(model, ids, method='cplrp', target=Neuron('mlp', 0, 0), position=0)
    with pytest.raises(ValueError, match='runs 2 stacks'), steer(model, {Neuron('mlp', 0, 0): 0.0}):
        model(ids)


def test_conservation_report_of_funnel(funnel):
    """CP-LRP without biases: every boundary of the first group of encoder blocks and of the decoder is a cut (its sum
    is the logit); the later groups hand on only what reaches the decoder through the upsampled path (the rest goes
    through the decoder's skip connection from the first group), equal at each of their boundaries, not 0."""
    model, ids = funnel
    report = conservation(model, ids, composite=CPLRPEpsilon())
    sums = dict(zip(report.names, report.sums[:, 0]))
    logit = report.logit[0]
    cuts = ['input of funnel.encoder.blocks.0.0'] + [f'output of funnel.encoder.blocks.0.{j}' for j in range(4)]
    cuts += ['input of funnel.decoder.layers.0'] + [f'output of funnel.decoder.layers.{j}' for j in range(2)]
    for name in cuts:
        torch.testing.assert_close(sums[name], logit, **TIGHT)
    later = [sums[f'output of funnel.encoder.blocks.{i}.{j}'] for i in (1, 2) for j in range(4)]
    assert abs(float(later[0])) > 1e-3
    for value in later[1:]:
        torch.testing.assert_close(value, later[0], **TIGHT)
