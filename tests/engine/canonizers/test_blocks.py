"""The one transformer-block finder (checkpointing, latent sites, conservation report): the stacks of every family.

The expected stacks below are what the three finders it replaced gave on these models (checked against copies of
them when they were replaced): ``checkpointing.transformer_blocks`` (the flat list), ``latent.sites.
transformer_blocks`` (the one stack of decoder- and encoder-only models) and ``diagnostics.layer_stacks`` (the
named stacks, decoder first in encoder-decoder models; it found no stack in timm's ``Sequential``).
"""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers.modeling_layers import GradientCheckpointingLayer

from tests.models import FAMILIES as MODEL_FAMILIES
from tests.models import (
    FAMILY_HEADS,
    LAYERS,
    tiny_clip,
    tiny_hf_vit,
    tiny_llava,
    tiny_model,
    tiny_qwen2_vl,
    tiny_timm_vit,
)
from zennit_attn.engine.canonizers import ATTENTION_OUTPUTS, FAMILIES, operand_taps, supported_families
from zennit_attn.engine.canonizers.blocks import (
    NoBlocksError,
    attention_linears,
    block_stacks,
    is_block,
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


def test_every_supported_family_is_covered():
    assert set(FAMILY_HEADS) <= set(EXPECTED)
    tested = {family for family, _ in EXPECTED} | set(VISION)
    assert set(supported_families()) <= tested


def test_a_transformers_family_outside_the_table():
    """transformers marks its blocks, so models of families without an entry (BLOOM) have blocks too
    (checkpointing of the gradient methods, conservation of a family entry being written)."""
    model = transformers.BloomForCausalLM(
        transformers.BloomConfig(vocab_size=100, hidden_size=32, n_layer=3, n_head=4, bos_token_id=1, eos_token_id=2)
    )
    assert 'bloom' not in supported_families()
    assert block_stacks(model) == [('transformer.h', list(model.transformer.h))]


def test_table_blocks_only_from_their_package():
    """timm's ``Block`` is a block (Family.blocks); a class of the same name defined elsewhere is not."""
    assert any(family.blocks == ('Block',) and family.package == 'timm' for family in FAMILIES)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(2, 2)

    model = torch.nn.Sequential(Block(), Block())
    assert not is_block(model[0])
    with pytest.raises(NoBlocksError, match='^Sequential has no transformer blocks'):
        block_stacks(model)


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
    with pytest.raises(NoBlocksError, match='^Linear has no transformer blocks: .*Family.blocks'):
        block_stacks(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError):  # NoBlocksError is a TypeError
        transformer_blocks(torch.nn.Sequential(torch.nn.ReLU()))


HEADS = {'bert': 'seq_cls', 'roberta': 'masked_lm', 'distilbert': 'seq_cls', 't5': 'seq2seq', 't5_relu': 'seq2seq'}


@pytest.mark.parametrize('family', list(MODEL_FAMILIES) + ['timm-vit', 'vit'])
def test_attention_linears_agree_with_the_table(family):
    """The structural finder (for models outside the table) finds exactly the projections the table's taps and
    ``attention_output`` entries name, input and output apart, on every family of the table."""
    model = (
        tiny_timm_vit()
        if family == 'timm-vit'
        else tiny_hf_vit()
        if family == 'vit'
        else tiny_model(family, HEADS.get(family))
    )
    names = {id(module): name for name, module in model.named_modules()}
    table_in = sorted(
        names[id(getattr(module, child))]
        for module, child, tap in operand_taps(model)
        if set(tap.roles) <= {'query', 'key', 'value'}
    )
    table_out = sorted(
        names[id(getattr(module, child))]
        for module in model.modules()
        if (child := ATTENTION_OUTPUTS.get(type(module).__name__)) is not None
    )
    found_in, found_out = attention_linears(model)
    assert table_in and table_out
    assert (sorted(found_in), sorted(found_out)) == (table_in, table_out)


def test_vision_towers():
    assert vision_towers(tiny_llava()) == ['model.vision_tower']
    assert vision_towers(tiny_qwen2_vl()) == ['model.visual']
    assert vision_towers(tiny_clip()) == ['vision_model']
    assert vision_towers(tiny_model('llama')) == []
