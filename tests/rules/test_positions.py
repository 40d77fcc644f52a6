"""PA-LRP's positions (:py:mod:`zennit_attn.rules.positions`): the position encodings as explained inputs."""

import pytest
import torch

from tests.models import pixels, seq2seq_with_positions, tiny_hf_vision, tiny_hf_vit, tiny_model, tiny_timm_vit
from tests.numbers import assert_close
from zennit_attn import explain
from zennit_attn.composites import AttnLRPEpsilon, CPLRPEpsilon
from zennit_attn.inputs.task import make_task
from zennit_attn.rules.positions import PositionInputs
from zennit_attn.workflows.architecture_check.check import zero_biases
from zennit_attn.workflows.architecture_check.configs import model_class, tiny_config

TOKENS = torch.tensor([[5, 17, 3, 28, 9, 14, 22], [30, 4, 11, 7, 25, 6, 19]])


@pytest.mark.parametrize('family', ['llama', 'gpt_neox', 'qwen3_moe', 'gemma3'])
def test_rotary_positions_take_what_the_tokens_give_up(family):
    """RoPE multiplies the token path by the positions' cos and sin: with both carrying relevance the uniform rule
    gives each factor half. In one layer every other rule on the way from the rotation to the tokens conserves
    (linear maps without bias, the normalisation's identity rule), so the tokens and the positions of PA-LRP together
    hold exactly the tokens' relevance of AttnLRP, row by row, and the positions hold a share of it."""
    model = tiny_model(family, num_hidden_layers=1)
    attnlrp = explain(model, TOKENS, method='attnlrp')
    palrp = explain(model, TOKENS, method='palrp')
    positions = palrp.position_relevance
    assert positions.shape == TOKENS.shape
    assert_close(palrp.relevance.sum(-1) + positions.sum(-1), attnlrp.relevance.sum(-1), 1e-12)
    assert float(positions.abs().sum()) > 1e-6 * float(attnlrp.relevance.abs().sum())
    assert not torch.allclose(palrp.relevance, attnlrp.relevance, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ('family', 'table'),
    [('gpt2', lambda model: model.transformer.wpe), ('bert', lambda model: model.bert.embeddings.position_embeddings)],
)
def test_learned_positions_take_what_a_constant_absorbed(family, table):
    """A learned table is added to the word embeddings: the sum's relevance is shared in proportion to the addends
    (Eq. 8), so the tokens keep AttnLRP's relevance exactly and the positions get ``p * g`` with the same modified
    gradient ``g`` at the sum (read off the tokens' own relevance, ``e * g``)."""
    model = tiny_model(family)
    attnlrp = explain(model, TOKENS, method='attnlrp')
    palrp = explain(model, TOKENS, method='palrp')
    assert_close(palrp.relevance, attnlrp.relevance, 1e-12)
    embeddings = model.get_input_embeddings()(TOKENS).detach()
    gradient = palrp.embedding_relevance / embeddings
    expected = (table(model).weight.detach()[: TOKENS.shape[1]] * gradient).sum(-1)
    assert_close(palrp.position_relevance, expected, 1e-9)
    assert float(expected.abs().sum()) > 0


def test_rows_are_explained_as_alone():
    """Encodings computed once for all rows are repeated per row: each row's positions get its own relevance."""
    model = tiny_model('llama')
    both = explain(model, TOKENS, method='palrp')
    for row in range(2):
        alone = explain(model, TOKENS[row : row + 1], method='palrp')
        assert_close(both.position_relevance[row], alone.position_relevance[0], 1e-12)
        assert_close(both.relevance[row], alone.relevance[0], 1e-12)


def test_constant_gates_give_the_rotations_nothing():
    """CP-LRP holds the attention probabilities constant: the queries and keys, and with them the rotations, carry no
    relevance."""
    model = tiny_model('llama')
    explanation = explain(model, TOKENS, method='cplrp', composite=CPLRPEpsilon(positions=True))
    assert float(explanation.position_relevance.abs().max()) == 0
    assert_close(explanation.relevance, explain(model, TOKENS, method='cplrp').relevance, 1e-12)


def test_models_without_a_known_encoding_and_composites_without_positions_are_refused():
    model = tiny_model('t5')  # relative position biases: no input of the explanation
    hooks = {name: dict(module._forward_hooks) for name, module in model.named_modules()}
    with pytest.raises(ValueError, match='T5ForConditionalGeneration has no position encoding'):
        explain(model, TOKENS[:1], method='palrp')
    assert hooks == {name: dict(module._forward_hooks) for name, module in model.named_modules()}
    with pytest.raises(ValueError, match=r"method='palrp' .* needs positions=True"):
        explain(tiny_model('llama'), TOKENS, method='palrp', composite=AttnLRPEpsilon())


def _zoo_model(architecture: str) -> torch.nn.Module:
    """The architecture check's tiny random model of ``architecture`` (a causal LM), in float64."""
    model_type, config_type = model_class('causal-lm', architecture)
    torch.manual_seed(0)
    return model_type(tiny_config(config_type)).double().eval()


def test_rotations_as_complex_numbers_are_refused():
    """DeepSeek-V2 and Llama 4 compute their rotary embeddings as complex numbers (``freqs_cis``), which are no
    floating-point input: PA-LRP would pass them as constants and give the positions nothing (before: no position
    relevance, without a word)."""
    model = _zoo_model('llama4_text')
    with pytest.raises(ValueError, match='model.rotary_emb returns its rotations as complex numbers'):
        explain(model, TOKENS[:1, :5], method='palrp')


def test_an_encoding_that_does_not_run_is_refused():
    """LFM3's tiny configuration has convolutions only: its rotary embedding is never called, so there is no
    position relevance to read (before: none, without a word)."""
    model = _zoo_model('lfm3')
    assert set(model.config.layer_types) == {'conv'}
    with pytest.raises(ValueError, match=r'no position encoding of the model ran .*model.rotary_emb found, not'):
        explain(model, TOKENS[:1, :5], method='palrp')


def test_the_encodings_are_restored_after_the_explanation():
    model = tiny_model('llama')
    rotary = model.model.rotary_emb
    before = (dict(rotary._forward_hooks), dict(model._forward_pre_hooks))
    composite = AttnLRPEpsilon(positions=True)
    explain(model, TOKENS, composite=composite, method='palrp')
    assert (dict(rotary._forward_hooks), dict(model._forward_pre_hooks)) == before
    assert 'positions: PA-LRP' in composite.describe()


class _SharedTable(torch.nn.Module):
    """A toy model whose position table gives one ``[seq, hidden]`` tensor for all rows (no batch dimension)."""

    def __init__(self):
        super().__init__()
        self.wpe = torch.nn.Embedding(8, 4)

    def forward(self, embeddings):
        return embeddings + self.wpe(torch.arange(embeddings.shape[1]))


def test_a_table_without_rows_is_read_for_one_row_and_refused_for_several():
    model = _SharedTable().double()
    positions = PositionInputs()
    handles = positions.register(model, list(model.named_modules()))
    try:
        embeddings = torch.randn(1, 5, 4, dtype=torch.float64, requires_grad=True)
        output = model(embeddings)
        (leaf,) = [leaf for _, _, leaf in positions.recorded]
        (relevance,) = torch.autograd.grad(output, [leaf], torch.ones_like(output))
        assert_close(positions.per_position([relevance])['input'], model.wpe.weight[:5].detach().sum(-1)[None], 1e-12)
        with pytest.raises(ValueError, match=r'one \[5, 4\] tensor for all rows of the batch'):
            model(torch.randn(2, 5, 4, dtype=torch.float64, requires_grad=True))
    finally:
        handles.remove()
    assert not model.wpe._forward_hooks and not model._forward_pre_hooks


def test_views_of_position_token_pairs():
    model = tiny_model('llama')
    explanation = explain(model, TOKENS, method='palrp')
    pairs = explanation.with_positions()
    assert torch.equal(pairs.relevance, explanation.relevance + explanation.position_relevance)
    assert pairs.top(1)[0][0] == int(pairs.relevance[0].argmax())
    with pytest.raises(ValueError, match="has no position relevance: explain with method='palrp'"):
        explain(model, TOKENS, method='attnlrp').with_positions()


def _vit_with_positions(build, **overrides) -> torch.nn.Module:
    """A bias-free tiny vision transformer (class token 0) whose position table holds random values."""
    model = build(zero_bias=True, **overrides)
    tables = [p for name, p in model.named_parameters() if name.endswith(('pos_embed', 'position_embeddings'))]
    for table in tables:
        table.data.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    return model


@pytest.mark.parametrize('build', [tiny_timm_vit, tiny_hf_vit])
def test_a_vision_transformers_table_takes_what_the_constant_absorbed(build):
    """A ViT's table is a parameter added to the patch embeddings and the class token: the pixels keep exactly their
    relevance without positions, the table gets ``p * g``, and with CP-LRP (bias-free, class token 0) pixels and
    positions together conserve the logit, which the pixels alone do not (before: refused, a parameter)."""
    model = _vit_with_positions(build)
    parameters = dict(model.named_parameters())
    image = pixels(batch=1)
    with_positions = explain(model, image, target=1, composite=CPLRPEpsilon(positions=True))
    without = explain(model, image, target=1, composite=CPLRPEpsilon())
    assert torch.equal(with_positions.pixel_relevance, without.pixel_relevance)
    positions = with_positions.position_relevance
    assert positions.shape == (1, 5)  # the class token and 2 x 2 patches
    assert_close(with_positions.pixel_relevance.sum() + positions.sum(), with_positions.logit[0], 1e-12)
    assert abs(float(without.pixel_relevance.sum() - without.logit[0])) > 1e-3 * abs(float(without.logit[0]))
    assert dict(model.named_parameters()) == parameters  # the same parameter objects, in their places
    pairs = with_positions.with_positions()
    assert_close(pairs.relevance.sum(), with_positions.relevance.sum() + positions[0, 1:].sum(), 1e-12)
    default = explain(model, image, target=1, method='palrp')  # AttnLRPGamma with positions
    assert torch.equal(default.pixel_relevance, explain(model, image, target=1, method='attnlrp').pixel_relevance)


def test_a_table_without_the_class_token_and_a_raising_forward():
    """timm's ``no_embed_class`` table holds the patches' positions only: the class token's position gets 0. A forward
    that raises while the table is replaced leaves the parameter in its place, and a batch of several images is
    refused before the model runs (its code may read the table as one row)."""
    model = _vit_with_positions(tiny_timm_vit, no_embed_class=True)
    table = model.pos_embed
    explanation = explain(model, pixels(batch=1), target=0, composite=CPLRPEpsilon(positions=True))
    assert explanation.position_relevance.shape == (1, 5) and float(explanation.position_relevance[0, 0]) == 0
    assert_close(explanation.pixel_relevance.sum() + explanation.position_relevance.sum(), explanation.logit[0], 1e-12)
    with pytest.raises(ValueError, match='explain one image at a time'):
        explain(model, pixels(batch=2), method='palrp')
    with pytest.raises(RuntimeError, match='boom'):
        with AttnLRPEpsilon(positions=True).context(model) as modified:
            handle = modified.blocks[0].register_forward_hook(_raise)
            try:
                modified(pixels(batch=1).requires_grad_())
            finally:
                handle.remove()
    assert model.pos_embed is table and model._parameters['pos_embed'] is table
    assert not model._forward_hooks and not model._forward_pre_hooks


def _raise(*_):
    raise RuntimeError('boom')


class _MapTable(torch.nn.Module):
    """A convolution whose feature map gets a position table ``[1, channels, height, width]`` (as PiT's), pooled."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 4, 4, bias=False)
        self.pos_embed = torch.nn.Parameter(torch.randn(1, 4, 2, 2))
        self.head = torch.nn.Linear(4, 2, bias=False)

    def forward(self, x):
        return self.head((self.conv(x) + self.pos_embed).mean((2, 3)))


def test_tables_that_are_not_one_position_per_token_are_refused():
    """A table over a feature map would be summed per channel, not per position; timm's EVA-02 adds a table and
    rotates its queries and keys with a rotary embedding the attention reads by a method (``rope.get_embed()``), not
    a module PA-LRP reads: the rotations' share would be missing from the positions' (before the refusal: the table's
    share alone, without a word); and a table held as a parameter is never a text's positions."""
    torch.manual_seed(0)
    with pytest.raises(ValueError, match=r'pos_embed has shape \[1, 4, 2, 2\]'):
        explain(_MapTable().double().eval(), pixels(batch=1), target=0, method='palrp')
    timm = pytest.importorskip('timm')
    eva = timm.create_model(
        'eva02_tiny_patch14_224', num_classes=3, img_size=8, patch_size=4, embed_dim=32, depth=1, num_heads=2
    )
    with pytest.raises(ValueError, match=r"Eva has a rotary embedding PA-LRP does not read \('rope', RotaryEmbedding"):
        explain(eva.double().eval(), pixels(batch=1), target=0, method='palrp')
    task = make_task(tiny_model('gpt2'), TOKENS)
    with pytest.raises(ValueError, match='tables held as parameters, a vision tower'):
        task.add_position_relevance(torch.zeros(2, TOKENS.shape[1]), frozenset({'held'}))


def test_a_table_of_deit_with_two_prefix_tokens():
    """Hugging Face's DeiT puts a class and a distillation token before the patches (before: counted as one, so its
    table of 18 positions was refused for 17 tokens, and the rollout for 17 patch tokens): CP-LRP with the positions
    conserves on the bias-free model with both tokens 0, and each head reads its own prefix tokens."""
    model, images = tiny_hf_vision('DeiTForImageClassificationWithTeacher')
    zero_biases(model)
    for token in (model.deit.embeddings.cls_token, model.deit.embeddings.distillation_token):
        torch.nn.init.zeros_(token)
    explanation = explain(model, images[:1], target=0, composite=CPLRPEpsilon(positions=True))
    assert explanation.position_relevance.shape == (1, 18)
    assert_close(explanation.pixel_relevance.sum() + explanation.position_relevance.sum(), explanation.logit[0], 1e-12)
    assert make_task(model, images).pooled_tokens() == 2
    assert make_task(tiny_hf_vision('DeiTForImageClassification')[0], images).pooled_tokens() == 1


@pytest.mark.parametrize(('family', 'rows'), [('bart', 2), ('marian', 1)])  # Marian's table has no batch dimension
def test_an_encoder_decoder_models_two_sequences_of_positions(family, rows):
    """BART's learned and Marian's sinusoidal tables run over the encoder's and over the decoder's tokens: each
    sequence's positions are read apart (by the path of the model's encoder; before: refused, two sequences). CP-LRP on
    the bias-free model: encoder and decoder tokens and positions together conserve the logit, which the tokens alone
    do not, and the tokens keep their relevance; ``with_positions()`` adds each sequence's positions to its tokens."""
    model = seq2seq_with_positions(family)
    ids = TOKENS[:rows, :6]
    decoder = torch.cat([torch.full((rows, 1), model.config.decoder_start_token_id), TOKENS[:rows, 2:4]], 1)
    explanation = explain(model, ids, decoder_input_ids=decoder, composite=CPLRPEpsilon(positions=True))
    without = explain(model, ids, decoder_input_ids=decoder, composite=CPLRPEpsilon())
    assert explanation.position_relevance.shape == ids.shape
    assert explanation.decoder_position_relevance.shape == decoder.shape
    total = explanation.relevance.sum(1) + explanation.decoder_relevance.sum(1)
    positions = explanation.position_relevance.sum(1) + explanation.decoder_position_relevance.sum(1)
    assert_close(total + positions, explanation.logit, 1e-12)
    assert float((without.relevance.sum(1) + without.decoder_relevance.sum(1) - without.logit).abs().max()) > 1e-3
    assert torch.equal(explanation.relevance, without.relevance)
    assert torch.equal(explanation.decoder_relevance, without.decoder_relevance)
    pairs = explanation.with_positions()
    assert_close(pairs.decoder_relevance, explanation.decoder_relevance + explanation.decoder_position_relevance, 0)


@pytest.mark.parametrize(
    ('build', 'kwargs'),
    [
        (lambda: _vit_with_positions(tiny_hf_vit), {'model_kwargs': {'interpolate_pos_encoding': True}}),
        (lambda: _vit_with_positions(tiny_timm_vit, dynamic_img_size=True), {}),
        (lambda: _vit_with_positions(tiny_timm_vit, dynamic_img_size=True, no_embed_class=True), {}),
    ],
)
@pytest.mark.parametrize('size', [(4, 20), (4, 16)])
def test_a_table_interpolated_to_another_grid_is_refused(build, kwargs, size):
    """A table of 2 x 2 patches (and the class token) that the model interpolates to the image's grid (Hugging Face's
    ``interpolate_pos_encoding``, timm's ``dynamic_img_size``) holds the positions of the 2 x 2 grid, not the
    image's. Before: a 1 x 5 grid read the table's 5 positions as 5 patches without the class token (the class
    token's relevance 0, its position's 0.077 on the first patch), a 1 x 4 grid read the 2 x 2 positions as a row,
    without a word; now refused, naming both grids. The table's own grid is still read."""
    model = build()
    image = torch.rand(1, 3, *size, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r'a grid of 2 x 2 patches.*1 x \d patches'):
        explain(model, image, target=0, method='palrp', **kwargs)
    assert explain(model, pixels(batch=1), target=0, method='palrp', **kwargs).position_relevance.shape == (1, 5)


def test_the_pairs_are_not_made_twice():
    """``with_positions()`` of what ``with_positions()`` returned would add the positions a second time: refused, for
    text and images (before: GPT-2's pairs then held tokens + 2 x positions, a ViT's pixels + 2 x the spread
    positions, without a word). The copy is marked (``pairs``); the explanation itself is not."""
    text = explain(tiny_model('gpt2'), TOKENS, method='palrp')
    pairs = text.with_positions()
    assert pairs.pairs and not text.pairs
    with pytest.raises(ValueError, match='already holds the positions'):
        pairs.with_positions()
    image = explain(_vit_with_positions(tiny_timm_vit), pixels(batch=1), target=0, method='palrp')
    assert image.with_positions().pairs and not image.pairs
    with pytest.raises(ValueError, match='already holds the positions'):
        image.with_positions().with_positions()


def test_an_image_padded_to_whole_patches_is_refused():
    """timm's ``dynamic_img_pad`` pads a 10 x 10 image to 3 x 3 patches of 4 (``dynamic_img_size`` interpolating the
    2 x 2 table to them): before, the table's positions were read as the 2 x 2 grid of whole patches the image has
    (5 positions spread over pixels the model cut into 9 patches), without a word; now refused. An image of whole
    patches is still read."""
    model = _vit_with_positions(tiny_timm_vit, dynamic_img_size=True, dynamic_img_pad=True)
    image = torch.rand(1, 3, 10, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r'pads the image of 10 x 10 pixels to 3 x 3 patches'):
        explain(model, image, target=0, method='palrp')
    assert explain(model, pixels(batch=1), target=0, method='palrp').position_relevance.shape == (1, 5)


def test_a_table_read_by_its_weight_for_another_size_is_refused_by_name():
    """CLIP's and SigLIP's vision towers interpolate their table's weight for another image size without calling the
    table (``interpolate_pos_encoding``): no position input runs, refused naming that case (before: named only as a
    hybrid without attention layers)."""
    model, images = tiny_hf_vision('CLIPForImageClassification')
    image = torch.rand(1, 3, 64, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r'no position encoding of the model ran .*interpolate_pos_encoding'):
        explain(model, image, target=0, method='palrp', model_kwargs={'interpolate_pos_encoding': True})
    assert explain(model, images[:1], target=0, method='palrp').position_relevance.shape == (1, 17)
