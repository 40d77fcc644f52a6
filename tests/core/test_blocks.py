"""The one transformer-block finder (checkpointing, latent sites, conservation report): the stacks of every family.

The expected stacks below are what the three finders it replaced gave on these models (checked against copies of
them when they were replaced): ``checkpointing.transformer_blocks`` (the flat list), ``latent.sites.
transformer_blocks`` (the one stack of decoder- and encoder-only models) and ``diagnostics.layer_stacks`` (the
named stacks, decoder first in encoder-decoder models; it found no stack in timm's ``Sequential``). The attention
projections found from the module tree are those the former family table named (:py:mod:`tests.family_table`).
"""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers.modeling_layers import GradientCheckpointingLayer

from tests.family_table import HEADS, TABLE, expand
from tests.models import (
    FAMILY_HEADS,
    LAYERS,
    TABLE_FAMILY,
    tiny_clip,
    tiny_hf_vit,
    tiny_llava,
    tiny_model,
    tiny_qwen2_vl,
    tiny_timm_vit,
)
from zennit_attn.core.blocks import (
    NoBlocksError,
    attention_linears,
    block_stacks,
    is_block,
    is_repeated_block,
    transformer_blocks,
    vision_towers,
)

#: (family, head) -> paths of the stacks, in module order
EXPECTED = {
    **{(family, 'causal_lm'): ['model.layers'] for family, head in FAMILY_HEADS if head == 'causal_lm'},
    ('gpt2', 'causal_lm'): ['transformer.h'],
    ('gpt_neox', 'causal_lm'): ['gpt_neox.layers'],
    ('bert', 'seq_cls'): ['bert.encoder.layer'],
    ('bert', 'masked_lm'): ['bert.encoder.layer'],
    ('roberta', 'seq_cls'): ['roberta.encoder.layer'],
    ('roberta', 'masked_lm'): ['roberta.encoder.layer'],
    ('distilbert', 'seq_cls'): ['distilbert.transformer.layer'],
    ('distilbert', 'masked_lm'): ['distilbert.transformer.layer'],
    ('t5', 'seq2seq'): ['encoder.block', 'decoder.block'],
    ('t5_relu', 'seq2seq'): ['encoder.block', 'decoder.block'],
    ('llama', 'base'): ['layers'],
    ('gpt2', 'base'): ['h'],
    ('bert', 'base'): ['encoder.layer'],
    ('t5', 'base'): ['encoder.block', 'decoder.block'],
}
VISION = {'timm-vit': (tiny_timm_vit, ['blocks']), 'vit': (tiny_hf_vit, ['vit.layers'])}


def check(model, paths):
    stacks = block_stacks(model)
    assert [path for path, _ in stacks] == paths
    for path, blocks in stacks:
        assert blocks == list(model.get_submodule(path))
        assert len(blocks) == LAYERS
    assert transformer_blocks(model) == [block for path in paths for block in model.get_submodule(path)]


@pytest.mark.parametrize('family, head', sorted(EXPECTED))
def test_stacks_of_every_family(family, head):
    check(tiny_model(family, head), EXPECTED[family, head])


@pytest.mark.parametrize('family', sorted(VISION))
def test_stacks_of_vision_transformers(family):
    build, paths = VISION[family]
    check(build(), paths)


def test_every_family_of_the_former_table_is_covered():
    assert set(FAMILY_HEADS) <= set(EXPECTED)
    tested = {TABLE_FAMILY.get(family, family) for family, _ in EXPECTED} | set(VISION)
    assert {TABLE_FAMILY.get(family, family) for family in TABLE} <= tested


def test_a_transformers_family_outside_the_table():
    """transformers marks its blocks, so models of families without an entry (BLOOM) have blocks too
    (checkpointing of the gradient methods, conservation of a family entry being written)."""
    model = transformers.BloomForCausalLM(
        transformers.BloomConfig(vocab_size=100, hidden_size=32, n_layer=3, n_head=4, bos_token_id=1, eos_token_id=2)
    )
    assert 'bloom' not in TABLE
    assert block_stacks(model) == [('transformer.h', list(model.transformer.h))]


class SelfAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 2)


class Block(torch.nn.Module):
    def __init__(self, attention: bool):
        super().__init__()
        self.inner = SelfAttention() if attention else torch.nn.Linear(2, 2)


def test_repeated_blocks_hold_attention():
    """Where no module is a GradientCheckpointingLayer (timm), a block is an element of a ModuleList or Sequential of
    one class that holds an attention module: timm's ``Block``; not a repeated module without attention, not the
    attention modules themselves, not the elements of a container of mixed classes."""
    vit = tiny_timm_vit()
    assert all(is_repeated_block(block, vit.blocks) and not is_block(block) for block in vit.blocks)
    assert is_block(vit.blocks[0], vit.blocks)
    plain = torch.nn.Sequential(Block(False), Block(False))
    assert not is_block(plain[0], plain)
    with pytest.raises(NoBlocksError, match='^Sequential has no transformer blocks'):
        block_stacks(plain)
    attention = torch.nn.Sequential(SelfAttention(), SelfAttention())
    with pytest.raises(NoBlocksError, match='^Sequential has no transformer blocks'):
        block_stacks(attention)
    mixed = torch.nn.Sequential(Block(True), torch.nn.Linear(2, 2))
    with pytest.raises(NoBlocksError):
        block_stacks(mixed)
    model = torch.nn.Sequential(Block(True), Block(True))
    assert block_stacks(model) == [('', list(model))]


def test_marked_blocks_come_first():
    """A model with a GradientCheckpointingLayer has no repeated blocks besides (a model's own choice of blocks)."""
    model = torch.nn.Module()
    model.marked = torch.nn.ModuleList([GradientCheckpointingLayer(), GradientCheckpointingLayer()])
    model.repeated = torch.nn.ModuleList([Block(True), Block(True)])
    assert block_stacks(model) == [('marked', list(model.marked))]


def test_blocks_inside_blocks_are_not_listed_and_a_block_may_be_the_model():
    class Outer(GradientCheckpointingLayer):
        def __init__(self):
            super().__init__()
            self.inner = torch.nn.ModuleList([GradientCheckpointingLayer(), GradientCheckpointingLayer()])

    model = torch.nn.Module()
    model.first = torch.nn.ModuleList([Outer(), Outer()])
    model.second = torch.nn.Sequential(Outer())
    assert block_stacks(model) == [('first', list(model.first)), ('second', list(model.second))]
    assert transformer_blocks(model) == [*model.first, *model.second]
    assert block_stacks(model.first[0]) == [('', [model.first[0]])]


def test_no_blocks_names_the_model_class():
    with pytest.raises(NoBlocksError, match='^Linear has no transformer blocks: .*GradientCheckpointingLayer'):
        block_stacks(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError):  # NoBlocksError is a TypeError
        transformer_blocks(torch.nn.Sequential(torch.nn.ReLU()))


@pytest.mark.parametrize('family', sorted(TABLE))
def test_attention_linears_agree_with_the_table(family):
    """The structural finder finds exactly the projections the former table's taps and ``attention_output`` entries
    named, input and output apart, on every family of the table."""
    model = (
        tiny_timm_vit()
        if family == 'timm-vit'
        else tiny_hf_vit()
        if family == 'vit'
        else tiny_model(family, HEADS.get(family))
    )
    entry = TABLE[family]
    table_in = sorted({path for role in ('query', 'key', 'value') for path in expand(entry[role])})
    table_out = sorted(expand(entry['attention']))
    found_in, found_out = attention_linears(model)
    assert table_in and table_out
    assert (sorted(found_in), sorted(found_out)) == (table_in, table_out)


def test_vision_towers():
    assert vision_towers(tiny_llava()) == ['model.vision_tower']
    assert vision_towers(tiny_qwen2_vl()) == ['model.visual']
    assert vision_towers(tiny_clip()) == ['vision_model']
    assert vision_towers(tiny_model('llama')) == []
