"""What ``explain()`` refuses or accepts before any method runs (``zennit_attn.inputs.task``): the defects a
hostile-user probe found, each with the behaviour that replaced a silent wrong answer or an obscure error."""

from __future__ import annotations

import copy
import functools
import gc
import weakref

import numpy as np
import pytest
import torch
import transformers
from transformers import BatchEncoding
from transformers.models.bart.modeling_bart import shift_tokens_right

from tests.models import POSITIONS, VOCAB, pixels, tiny_config, tiny_hf_vit, tiny_model, tiny_timm_vit, token_ids
from zennit_attn import conservation, explain
from zennit_attn.core.errors import UnsupportedModelError
from zennit_attn.core.modules import decoder_word_embeddings, forward_parameters, is_encoder_decoder, without_cache
from zennit_attn.inputs.checks import is_image_model, keeps_left_padding, keeps_right_padding
from zennit_attn.inputs.task import ImageTask, Readout, TokenTask
from zennit_attn.workflows.architecture_check.check import zero_biases
from zennit_attn.workflows.architecture_check.configs import model_class
from zennit_attn.workflows.architecture_check.configs import tiny_config as architecture_tiny_config


@pytest.fixture(scope='module')
def ids():
    return token_ids('llama', 6, 2, seed=3)


def test_modality_follows_the_model():
    assert is_image_model(tiny_timm_vit()) and is_image_model(tiny_hf_vit())
    assert not is_image_model(tiny_model('llama')) and not is_image_model(tiny_model('t5'))


# ------------------------------------------------------------------------------------------------ non-finite values
def test_non_finite_pixels_are_refused_like_tokens():
    model, x = tiny_timm_vit(), pixels(3)
    x[1, 0, 2, 2] = float('nan')
    with pytest.raises(ValueError, match=r'row\(s\) \[1\] are NaN'):
        explain(model, x)
    with pytest.raises(ValueError, match='NaN'):
        explain(model, x, method='input_x_gradient')


@pytest.mark.parametrize('kind', ['llama', 'timm'])
def test_a_nan_parameter_is_named_on_both_paths(kind):
    if kind == 'llama':
        model, inputs, name = tiny_model('llama'), token_ids('llama', 5), 'model.layers.1.mlp.down_proj.weight'
    else:
        model, inputs, name = tiny_timm_vit(), pixels(), 'blocks.1.mlp.fc2.weight'
    with torch.no_grad():
        model.get_parameter(name)[0, 0] = float('nan')
    for method in ('attnlrp', 'input_x_gradient', 'random'):
        with pytest.raises(FloatingPointError, match=name.replace('.', r'\.')):
            explain(model, inputs, method=method)


# ------------------------------------------------------------------------------------------------ method parameters
@pytest.mark.parametrize(
    'method, params, match',
    [
        ('atman', dict(perturbation_batch=-1), 'perturbation_batch'),
        ('atman', dict(perturbation_batch=0), 'perturbation_batch'),
        ('atman', dict(p=1.5), 'p must'),
        ('atman', dict(score='probability'), 'score'),
        ('integrated_gradients', dict(steps=0), 'steps'),
        ('integrated_gradients', dict(steps=2.5), 'steps'),
        ('smoothgrad', dict(samples=0), 'samples'),
        ('smoothgrad', dict(sigma=-1.0), 'sigma'),
        ('kernelshap', dict(samples=0), 'samples'),
        ('kernelshap', dict(perturbation_batch=0), 'perturbation_batch'),
        ('gradcam', dict(layer=2), 'out of range'),
        ('gradcam', dict(layer=-3), 'out of range'),
        ('gradcam', dict(layer=0.5), 'integer'),
        ('attention_rollout', dict(dt=-0.1), 'dt'),
        ('grad_attention_rollout', dict(dt=1.5), 'dt'),
        ('random', dict(seed=0.5), 'seed'),
    ],
)
def test_method_parameters_are_validated(llama, ids, method, params, match):
    with pytest.raises(ValueError, match=match):
        explain(llama, ids, method=method, **params)


def test_parameter_validation_holds_for_images_too():
    model, x = tiny_timm_vit(), pixels()
    with pytest.raises(ValueError, match='steps'):
        explain(model, x, method='integrated_gradients', steps=0)
    with pytest.raises(ValueError, match='out of range'):
        explain(model, x, method='gradcam', layer=7)


def test_gradcam_layer_counts_from_either_end(llama, ids):
    torch.testing.assert_close(
        explain(llama, ids, method='gradcam', layer=1).relevance,
        explain(llama, ids, method='gradcam', layer=-1).relevance,
    )


def test_unknown_parameters_and_composites_for_baselines(llama, ids):
    with pytest.raises(TypeError, match='takes no parameter'):
        explain(llama, ids, method='smoothgrad', steps=3)
    with pytest.raises(ValueError, match='composite= applies to the LRP methods'):
        from zennit_attn.composites import AttnLRPEpsilon

        explain(llama, ids, method='random', composite=AttnLRPEpsilon())


# ------------------------------------------------------------------------------------------------ model state
def test_a_submodule_in_training_mode_is_named(ids):
    model = tiny_model('llama')
    model.model.layers[1].mlp.train()
    with pytest.raises(ValueError, match="submodule 'model.layers.1.mlp'.*training mode"):
        explain(model, ids)
    model.eval()
    explain(model, ids)
    vit = tiny_timm_vit()
    vit.blocks[0].attn.attn_drop.train()
    with pytest.raises(ValueError, match="'blocks.0.attn.attn_drop'"):
        explain(vit, pixels())


def test_inference_mode_says_what_to_do(llama, ids):
    with torch.inference_mode():
        with pytest.raises(RuntimeError, match='outside the inference_mode block'):
            explain(llama, ids)
    with torch.no_grad():  # no_grad around the call is fine: explain enables gradients itself
        torch.testing.assert_close(explain(llama, ids).relevance, explain(llama, ids).relevance)


def test_a_model_on_the_meta_device_is_refused(ids):
    import transformers

    with torch.device('meta'):
        model = transformers.LlamaForCausalLM(tiny_config('llama')).eval()
    with pytest.raises(ValueError, match='meta device'):
        explain(model, ids)


# ------------------------------------------------------------------------------------------------ inputs
def test_tokenizer_outputs_are_accepted(llama, ids):
    mask = torch.ones_like(ids)
    mask[1, -2:] = 0  # right padding (float64 eager attention gives NaN for fully masked rows)
    reference = explain(llama, ids, attention_mask=mask)
    encodings = BatchEncoding({'input_ids': ids, 'attention_mask': mask}), {'input_ids': ids, 'attention_mask': mask}
    for encoding in encodings:
        torch.testing.assert_close(explain(llama, encoding).relevance, reference.relevance)
    with pytest.raises(ValueError, match='different values'):
        explain(llama, {'input_ids': ids, 'attention_mask': mask}, attention_mask=torch.ones_like(ids))
    with pytest.raises(ValueError, match='no input_ids'):
        explain(llama, {'ids': ids})


def test_token_type_ids_of_an_encoding_reach_the_model():
    model = tiny_model('bert', 'seq_cls')
    ids = token_ids('bert', 6)
    types = torch.tensor([[0, 0, 0, 1, 1, 1]])
    reference = explain(model, ids, model_kwargs={'token_type_ids': types})
    torch.testing.assert_close(
        explain(model, {'input_ids': ids, 'token_type_ids': types}).relevance, reference.relevance
    )
    assert not torch.allclose(explain(model, ids).relevance, reference.relevance)


def test_text_is_refused_with_the_fix(llama):
    for text in ('The ice bear lives in the', ['The ice bear', 'lives in the']):
        with pytest.raises(TypeError, match="tokenizer\\(text, return_tensors='pt'\\)"):
            explain(llama, text)


def test_integer_like_targets_and_positions(llama, ids):
    reference = explain(llama, ids, target=5, position=2)
    for target, position in ((np.int64(5), np.int64(2)), (torch.tensor(5), torch.tensor(2)), (5, [2, 2])):
        torch.testing.assert_close(explain(llama, ids, target=target, position=position).relevance, reference.relevance)
    with pytest.raises(ValueError, match='target must be an integer'):
        explain(llama, ids, target=3.7)
    with pytest.raises(ValueError, match='position must be an integer'):
        explain(llama, ids, position=2.5)
    with pytest.raises(ValueError, match='position must hold integers'):
        explain(llama, ids, position=torch.tensor([2.0, 2.0]))
    with pytest.raises(ValueError, match='target'):
        explain(llama, ids, target=[(2, 5.5)])


def test_ids_outside_the_vocabulary(llama):
    with pytest.raises(ValueError, match=f'vocabulary of Embedding has {VOCAB} entries'):
        explain(llama, torch.tensor([[3, 4, VOCAB]]))
    with pytest.raises(ValueError, match='vocabulary'):
        explain(llama, torch.tensor([[3, -1, 4]]))


def test_tables_per_codebook_are_refused():
    """MusicGen's decoder embeds ``num_codebooks`` rows of ``input_ids`` per sequence with one table each: its rows are
    not tokens of one sequence (explaining them as a batch would be silently wrong), so it is refused by name."""
    from transformers import MusicgenDecoderConfig, MusicgenForCausalLM

    config = MusicgenDecoderConfig(
        vocab_size=32,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        ffn_dim=32,
        num_codebooks=4,
        pad_token_id=0,
        bos_token_id=0,
    )
    with pytest.raises(
        UnsupportedModelError,
        match=r'MusicgenForCausalLM embeds its input_ids with a ModuleList '
        r'of tables \(one per codebook, here 4\)',
    ):
        explain(MusicgenForCausalLM(config).eval(), torch.randint(1, 30, (4, 5)))


@pytest.mark.parametrize('family, head', [('llama', 'causal_lm'), ('gpt2', 'causal_lm'), ('bert', 'seq_cls')])
def test_inputs_longer_than_the_positions(family, head):
    model = tiny_model(family, head)
    explain(model, token_ids(family, POSITIONS))
    with pytest.raises(ValueError, match=f'{POSITIONS + 1} positions, more than the {POSITIONS}'):
        explain(model, token_ids(family, POSITIONS + 1))


def test_image_inputs():
    model = tiny_timm_vit()
    x = pixels(1)
    torch.testing.assert_close(explain(model, x[0]).pixel_relevance, explain(model, x).pixel_relevance)
    with pytest.raises(ValueError, match='floating point'):
        explain(model, (x * 255).to(torch.uint8))
    with pytest.raises(ValueError, match=r'\[batch, channels, height, width\]'):
        explain(model, x[0, 0])
    with pytest.raises(TypeError, match='takes pixels'):
        explain(model, 'a picture')


def test_pixels_in_another_layout_are_refused_by_their_channels():
    """A 3-D pixel tensor is one image [channels, height, width] only where its channels are the model's: SigLIP 2
    takes flattened patches [batch, patches, features] (with spatial_shapes), which a batch axis in front turned into
    an error inside transformers."""
    model, x = tiny_hf_vit(), pixels(1)
    torch.testing.assert_close(
        explain(model, x[0], method='cplrp').pixel_relevance, explain(model, x, method='cplrp').pixel_relevance
    )
    patches = x.reshape(1, x.shape[1], -1).transpose(1, 2)  # [1, height * width, channels]: not [C, H, W]
    for wrong in (patches, x[:, :1]):
        with pytest.raises(ValueError, match=f'with the {x.shape[1]} channels ViTForImageClassification takes'):
            explain(model, wrong)
    with pytest.raises(ValueError, match=r'the frames of a video, \[batch, frames, channels, height, width\]'):
        explain(model, torch.stack([x, x], 1))


def test_audio_and_other_float_inputs_are_refused_by_name():
    """A model whose main input is neither token ids nor pixels (wav2vec 2.0's input_values) is refused naming it,
    not as ids of the wrong dtype."""
    config = transformers.Wav2Vec2Config(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        conv_dim=(8, 8),
        conv_stride=(5, 2),
        conv_kernel=(10, 3),
        num_feat_extract_layers=2,
        num_conv_pos_embeddings=4,
        num_conv_pos_embedding_groups=2,
        num_labels=2,
    )
    model = transformers.Wav2Vec2ForSequenceClassification(config).eval()
    with pytest.raises(UnsupportedModelError, match=r"takes 'input_values' \(a float tensor, here of shape \(1, 400\)"):
        explain(model, torch.randn(1, 400))


def test_image_models_refuse_token_arguments_and_use_model_kwargs():
    model, x = tiny_timm_vit(), pixels()
    for name, value in (
        ('position', 3),
        ('attention_mask', torch.ones(2, 4)),
        ('decoder_input_ids', torch.ones(2, 1, dtype=torch.long)),
    ):
        with pytest.raises(ValueError, match=f'{name} do(es)? not apply'):
            explain(model, x, **{name: value})
    hf = tiny_hf_vit()
    calls = []
    handle = hf.register_forward_pre_hook(lambda module, args, kwargs: calls.append(dict(kwargs)), with_kwargs=True)
    try:
        explain(hf, x, method='input_x_gradient', model_kwargs={'interpolate_pos_encoding': False})
    finally:
        handle.remove()
    assert calls and all(call.get('interpolate_pos_encoding') is False for call in calls)


def test_tasks_are_the_two_modalities(llama, ids):
    assert isinstance(TokenTask(llama, ids).inputs, torch.Tensor)
    task = ImageTask(tiny_timm_vit(), pixels())
    assert task.token_count() == 5 and task.grid() == (2, 2)
    assert task.attributable_tokens().tolist() == [[False, True, True, True, True]] * 2
    # a patch token's value is spread evenly over its pixels and channels
    spread = task.token_relevance(torch.tensor([[9.0, 1.0, 2.0, 3.0, 4.0]] * 2, dtype=torch.float64))
    torch.testing.assert_close(spread.sum((1, 2, 3)), torch.full((2,), 10.0, dtype=torch.float64))


class _Doubled(Readout):
    """A readout of the same run: twice the model's scores."""

    def read(self, task, inputs, rows=None, model=None, initial_relevance=False, **extra):
        return 2 * super().read(task, inputs, rows, model, initial_relevance, **extra)


def test_a_readout_is_an_object_the_task_receives(llama, ids):
    """Another readout changes what the task's forward returns, not the task's class; the original task keeps
    reading the model's logits."""
    task = TokenTask(llama, ids)
    doubled = task.with_readout(_Doubled())
    assert type(doubled) is TokenTask and type(task.readout) is Readout and isinstance(doubled.readout, _Doubled)
    with torch.no_grad():
        torch.testing.assert_close(doubled.forward(task.inputs), 2 * task.forward(task.inputs))
        torch.testing.assert_close(task.forward(task.inputs), llama(ids).logits)
    with pytest.raises(TypeError, match='readout must be a zennit_attn.inputs.task.Readout'):
        task.with_readout(lambda scores: scores)


def test_conservation_still_reports_the_same(llama, ids):
    report = conservation(llama, ids[:1])
    torch.testing.assert_close(report.logit, explain(llama, ids[:1]).logit)
    encoded = conservation(llama, BatchEncoding({'input_ids': ids[:1], 'attention_mask': torch.ones_like(ids[:1])}))
    torch.testing.assert_close(encoded.sums, report.sums)


@pytest.mark.parametrize(
    'position, target, kept',
    [(-1, 5, [5]), (2, None, [2]), (None, [(4, 7), (2, 5)], [2, 4])],
    ids=['last', 'argmax', 'pairs'],
)
def test_the_explained_logit_is_read_at_the_kept_positions(llama, ids, position, target, kept):
    """With ``logits_to_keep`` the model computes the explained positions' logits only (one for all rows, or one
    per pair; counted from the end, :py:func:`~zennit_attn.core.modules.logits_to_keep`); the explained value of
    each row is the full logits' at its position and target."""
    with torch.no_grad():
        full = llama(ids, use_cache=False).logits
    task = TokenTask(llama, ids)
    extra = task.keep_logits(position, target)
    assert (extra['logits_to_keep'] + ids.shape[1]).tolist() == kept
    with torch.no_grad():
        value = task.resolve(llama(inputs_embeds=task.inputs, use_cache=False, **extra).logits, position, target)
    rows = torch.arange(len(ids))
    if target is None:
        expected = full[rows, 2, full[:, 2].argmax(-1)]
    elif position is None:
        expected = torch.stack([full[rows, 4, 7], full[rows, 2, 5]], 1)
    else:
        expected = full[rows, -1, 5]
    torch.testing.assert_close(value, expected, rtol=1e-12, atol=1e-12)


def test_forward_parameters_keep_no_wrapped_module_alive():
    """The parameters of a forward set on the instance (accelerate's wrappers hold their module) are read, not
    cached: the module is freed with its last reference. A class's forward is read without ``self``."""
    model = tiny_model('llama')
    assert forward_parameters(model)[:2] == ('input_ids', 'attention_mask')
    layer = torch.nn.Linear(2, 2)
    layer.forward = functools.partial(lambda module, input, scale=1.0: module.weight @ input * scale, layer)
    assert forward_parameters(layer) == ('input', 'scale')
    reference = weakref.ref(layer)
    del layer
    gc.collect()
    assert reference() is None


def test_an_encoder_whose_configuration_says_encoder_decoder_has_no_decoder():
    """Transformers' UMT5 token classifier keeps ``is_encoder_decoder=True`` from the T5 configuration, but it is an
    encoder with a classifier: explain() gave it decoder inputs (swallowed by its ``**kwargs``) and read the default
    position from the decoder's, the last one, so a right-padded row was explained at a pad (3.2 for the row's -1.47).
    Whether a model is an encoder-decoder is now also what its forward takes (``core.modules.is_encoder_decoder``)."""
    config = architecture_tiny_config(transformers.UMT5Config)
    config.num_labels, config.pad_token_id = 3, 0
    model = transformers.UMT5ForTokenClassification(config).double().eval()
    assert config.is_encoder_decoder and not is_encoder_decoder(model)
    ids = torch.tensor([[7, 11, 13, 19, 29, 37, 41, 43], [5, 9, 17, 23, 31, 0, 0, 0]])
    mask = (ids != 0).long()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
    explanation = explain(model, ids, attention_mask=mask, target=0, method='cplrp')
    assert explanation.position.tolist() == [7, 4] and explanation.decoder_input_ids is None
    torch.testing.assert_close(explanation.logit, logits[[0, 1], [7, 4], 0], rtol=1e-12, atol=1e-14)


def _tiny(config_class, model_class, **settings):
    config = architecture_tiny_config(config_class)
    for key, value in settings.items():
        setattr(config, key, value)
    return model_class(config).double().eval()


@pytest.mark.parametrize(
    'build, error, match',
    [
        (  # a classifier's decoder reads the input shifted right (test_encoder_decoder_heads_need_their_decoder_input)
            lambda: _tiny(transformers.BartConfig, transformers.BartForSequenceClassification, num_labels=3),
            ValueError,
            'BartForSequenceClassification computes its decoder input from input_ids',
        ),
        (  # no decoder start token: torch.full(..., None) or an AttributeError before
            lambda: _tiny(transformers.T5Config, transformers.T5ForConditionalGeneration, decoder_start_token_id=None),
            ValueError,
            'no decoder_start_token_id in its configuration: pass decoder_input_ids=',
        ),
        (  # integer-only quantization: the embedding and its scaling factor ('tuple' has no attribute 'detach')
            lambda: _tiny(transformers.IBertConfig, transformers.IBertForSequenceClassification, num_labels=3),
            UnsupportedModelError,
            r'\(QuantEmbedding\) returns a tuple, not a tensor of embeddings',
        ),
        (  # two scores per position ('Cannot find logits or last_hidden_state')
            lambda: _tiny(transformers.BertConfig, transformers.BertForQuestionAnswering),
            TypeError,
            "holds start_logits and end_logits, two scores per position: explain one of them, .*output='start_logits'",
        ),
        (  # two heads, neither named logits
            lambda: _tiny(transformers.BertConfig, transformers.BertForPreTraining),
            TypeError,
            r'its tensors \(prediction_logits, seq_relationship_logits\) with output=',
        ),
        (  # an image encoder with a text decoder: its decoder's tokens would be constants
            lambda: (
                transformers.VisionEncoderDecoderModel(
                    transformers.VisionEncoderDecoderConfig.from_encoder_decoder_configs(
                        architecture_tiny_config(transformers.ViTConfig),
                        tiny_config('gpt2', add_cross_attention=True, is_decoder=True),
                    )
                )
                .double()
                .eval()
            ),
            UnsupportedModelError,
            'reads images with its encoder and writes text with its decoder',
        ),
    ],
    ids=[
        'bart-classifier',
        't5-without-start-token',
        'ibert',
        'bert-question-answering',
        'bert-pretraining',
        'image-encoder-decoder',
    ],
)
def test_models_explain_cannot_run_are_refused_with_the_reason(build, error, match):
    """Models whose head or embeddings the explanation cannot use are refused naming why (the sweep over transformers'
    classification and question-answering heads found raw errors from inside transformers and zennit-attn)."""
    with pytest.raises(error, match=match):
        explain(build(), torch.tensor([[5, 9, 17, 23, 31, 40]]), method='cplrp')


def test_encoder_decoder_heads_need_their_decoder_input():
    """An encoder-decoder question-answering head computes its decoder input from ``input_ids`` shifted right, as it
    was trained: without ``decoder_input_ids`` it is refused (before, its decoder ran on the start token alone and a
    start logit of a one-token decoder was explained, which the model never gives). With the shifted input the
    explained logit is the model's own on the ids, and CP-LRP conserves it over the encoder's and the decoder's
    tokens. The classifier, which finds its end-of-sequence tokens in the ids, cannot run on embeddings."""
    ids = torch.tensor([[5, 9, 17, 23, 31, 40]])
    model = _tiny(transformers.BartConfig, transformers.BartForQuestionAnswering)
    zero_biases(model)
    with pytest.raises(ValueError, match=r'BartForQuestionAnswering computes its decoder input from input_ids'):
        explain(model, ids, output='start_logits', target=3)
    shifted = shift_tokens_right(ids, model.config.pad_token_id, model.config.decoder_start_token_id)
    exp = explain(model, ids, decoder_input_ids=shifted, output='start_logits', target=3, method='cplrp')
    with torch.no_grad():
        logit = model(input_ids=ids).start_logits[0, 3]
    assert abs(float(exp.logit) - float(logit)) < 1e-12
    total = float(exp.relevance.sum() + exp.decoder_relevance.sum())
    assert abs(total - float(exp.logit)) < 1e-10 * max(1.0, abs(float(exp.logit)))
    classifier = _tiny(transformers.BartConfig, transformers.BartForSequenceClassification, num_labels=3)
    with pytest.raises(UnsupportedModelError, match='BartForSequenceClassification cannot be run on embeddings'):
        explain(classifier, ids, decoder_input_ids=shifted, method='cplrp')


def test_right_padding_is_refused_where_the_model_reads_the_pads():
    """XLNet's classifier summarises the last position, a pad in a right-padded row: explained at it, the row got
    the logit 0.025 for its own -0.0016. A right-padded batch is refused for a model whose right-padded rows give
    other outputs than the rows alone (:py:func:`~zennit_attn.inputs.checks.keeps_right_padding`); BERT, which masks its
    pads, explains each padded row as the row alone."""
    ids = torch.tensor([[7, 11, 13, 19, 29, 37], [5, 9, 17, 23, 0, 0]])
    mask = (ids != 0).long()
    xlnet = _tiny(transformers.XLNetConfig, transformers.XLNetForSequenceClassification, num_labels=3, pad_token_id=0)
    assert keeps_right_padding(xlnet) is False
    with pytest.raises(ValueError, match='pads rows on the right, and XLNetForSequenceClassification gives'):
        explain(xlnet, ids, attention_mask=mask, target=0, method='cplrp')
    funnel = _tiny(
        transformers.FunnelConfig, transformers.FunnelForSequenceClassification, num_labels=3, pad_token_id=0
    )
    assert keeps_right_padding(funnel) is False  # its pooling reads the pads (a probe of six tokens: it needs more)
    bert = _tiny(transformers.BertConfig, transformers.BertForSequenceClassification, num_labels=3, pad_token_id=0)
    assert keeps_right_padding(bert) is True
    batch = explain(bert, ids, attention_mask=mask, target=0, method='cplrp')
    alone = explain(bert, ids[1:, :4], target=0, method='cplrp')
    torch.testing.assert_close(batch.relevance[1, :4], alone.relevance[0], rtol=1e-9, atol=1e-14)


def test_nan_of_the_model_is_not_taken_for_pads_that_reach_the_row():
    """Transformers' float64 eager attention returns NaN for a fully masked row (Bloom, Gemma 2, MPT): the left-padding
    probe took that for a model that carries its pads into the row and refused with that reason. It now says what the
    explanation finds, the NaN of the model itself and what to do; in float32 the same batch is explained."""
    config = architecture_tiny_config(transformers.BloomConfig)
    config.pad_token_id = 0
    ids = torch.tensor([[0, 0, 0, 5, 9, 17, 23, 31], [7, 11, 13, 19, 29, 37, 41, 43]])
    mask = (ids != 0).long()
    torch.manual_seed(0)
    model = transformers.BloomForCausalLM(config).eval()
    assert keeps_left_padding(copy.deepcopy(model).double()) is None
    with pytest.raises(FloatingPointError, match='float64 eager attention in transformers returns NaN'):
        explain(copy.deepcopy(model).double(), ids, attention_mask=mask, method='cplrp')
    explanation = explain(model, ids, attention_mask=mask, method='cplrp')
    alone = explain(model, ids[:1, 3:], method='cplrp')
    torch.testing.assert_close(explanation.relevance[0, 3:], alone.relevance[0], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize('field', ['start_logits', 'end_logits'])
def test_a_question_answering_head_is_explained_at_the_field_named(field):
    """``output='start_logits'`` (or ``'end_logits'``) explains a question-answering head's score of a position, as a
    classifier's: CP-LRP with zero biases and no position or segment embeddings conserves the score of the position
    it predicts; another position by ``target``; a field the output does not hold is named with the ones it does."""
    model = _tiny(transformers.BertConfig, transformers.BertForQuestionAnswering)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith('bias') or 'position_embeddings' in name or 'token_type' in name:
                parameter.zero_()
    ids = torch.tensor([[5, 9, 17, 23, 31, 40, 44, 50]])
    with torch.no_grad():
        scores = getattr(model(input_ids=ids), field)[0]
    explanation = explain(model, ids, output=field, method='cplrp')
    assert explanation.target.tolist() == [int(scores.argmax())]
    torch.testing.assert_close(explanation.logit, scores.max()[None], rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(explanation.relevance.sum(1), explanation.logit, rtol=1e-9, atol=1e-14)
    other = explain(model, ids, output=field, target=2, method='cplrp')
    torch.testing.assert_close(other.relevance.sum(1), scores[2:3], rtol=1e-9, atol=1e-14)
    with pytest.raises(ValueError, match="has no tensor 'answer'; its tensors: start_logits, end_logits"):
        explain(model, ids, output='answer')


class OwnClassifier(torch.nn.Module):
    """A classifier of one's own: a Hugging Face encoder with a head on the first token's state, called on ids only
    (``embeds``: also on ``inputs_embeds``, with ``get_input_embeddings``, as zennit-attn's guide asked of wrappers)."""

    def __init__(self, encoder: torch.nn.Module, embeds: bool = False):
        super().__init__()
        self.encoder = encoder
        self.head = torch.nn.Linear(encoder.config.hidden_size, 3, bias=False).double()
        if embeds:
            self.get_input_embeddings = encoder.get_input_embeddings

    def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None):
        state = self.encoder(input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds)
        return self.head(state.last_hidden_state[:, 0])


class IdsOnly(OwnClassifier):
    def forward(self, input_ids, attention_mask=None):
        return super().forward(input_ids, attention_mask)


class MeanOfAll(OwnClassifier):
    """A head on the mean of every position, pads included."""

    def forward(self, input_ids, attention_mask=None):
        return self.head(self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state.mean(1))


def test_a_model_of_ones_own_around_a_hugging_face_model_is_explained_at_its_tokens():
    """A wrapper without ``get_input_embeddings`` was taken for an image model ('pixels must be [batch, channels,
    ...]'). Its tokens are those of the one Hugging Face model inside it (``core.modules.word_embeddings``); a forward
    of ids only is run on them (the lookups of :py:mod:`zennit_attn.inputs.lookups`): CP-LRP conserves exactly and
    equals the wrapper run on its embeddings; two towers with their own tables are refused, naming why."""
    encoder = transformers.BertModel(tiny_config('bert')).double()
    with torch.no_grad():
        for name, parameter in encoder.named_parameters():
            if name.endswith('bias') or 'position' in name or 'token_type' in name:
                parameter.zero_()
    torch.manual_seed(0)
    ids_only, embedded = IdsOnly(encoder).eval(), OwnClassifier(encoder, embeds=True).eval()
    embedded.head.weight = ids_only.head.weight
    both = (ids_only, embedded)
    ids = token_ids('bert', 6, 2)
    mask = torch.ones_like(ids)
    ids[1, 4:], mask[1, 4:] = 0, 0
    assert not is_image_model(ids_only)
    on_ids = explain(ids_only, ids, attention_mask=mask, target=1, method='cplrp')
    on_embeddings = explain(embedded, ids, attention_mask=mask, target=1, method='cplrp')
    torch.testing.assert_close(on_ids.relevance.sum(-1), on_ids.logit, rtol=1e-9, atol=0)
    torch.testing.assert_close(on_ids.relevance, on_embeddings.relevance, rtol=1e-10, atol=1e-14)
    alone = explain(ids_only, ids[1:, :4], target=1, method='cplrp')
    torch.testing.assert_close(alone.relevance, on_ids.relevance[1:, :4], rtol=1e-9, atol=1e-14)
    # the structure of the model inside (AtMan's keys, latent sites) is found on that model's example ids
    atman = [explain(model, ids, attention_mask=mask, target=1, method='atman', score='logit') for model in both]
    torch.testing.assert_close(atman[0].relevance, atman[1].relevance, rtol=1e-9, atol=1e-15)
    latent = [explain(model, ids, attention_mask=mask, target=1, latent=['mlp']).latent['mlp'] for model in both]
    torch.testing.assert_close(latent[0], latent[1], rtol=1e-9, atol=1e-15)
    with pytest.raises(UnsupportedModelError, match=r'ask IdsOnly for its attention probabilities'):
        explain(ids_only, ids, method='attention_rollout')
    # the padding probes run it on the ids of the model inside: a head that averages the pads is refused for them
    # (explained before, the padded row 33% off the row alone)
    with pytest.raises(ValueError, match='pads rows on the right, and MeanOfAll gives'):
        explain(MeanOfAll(encoder).eval(), ids, attention_mask=mask, method='cplrp')
    towers = IdsOnly(transformers.BertModel(tiny_config('bert')).double()).eval()
    towers.other = transformers.BertModel(tiny_config('bert')).double()
    with pytest.raises(TypeError, match='finds no word embedding table in it'):
        explain(towers, ids)


def test_a_model_configured_to_return_tuples_is_read_by_field_names():
    """``config.return_dict=False`` makes a Hugging Face model return a tuple, whose first element was read as the
    scores: a question-answering head's start logits, explained without a word where its output object is refused
    for holding two scores per position. The task asks for the output object (``return_dict=True``)."""
    model = _tiny(transformers.BertConfig, transformers.BertForQuestionAnswering, return_dict=False)
    ids = torch.tensor([[5, 9, 17, 23, 31, 40]])
    with torch.no_grad():
        assert isinstance(model(ids), tuple)
        end = model(ids, return_dict=True).end_logits
    with pytest.raises(TypeError, match='holds start_logits and end_logits'):
        explain(model, ids, method='cplrp')
    explanation = explain(model, ids, output='end_logits', target=2, method='cplrp')
    torch.testing.assert_close(explanation.logit, end[:, 2], rtol=1e-12, atol=0)


def test_models_that_pass_use_cache_through_keywords_run_without_a_cache():
    """GraniteMoeHybrid's forward takes ``use_cache`` only through ``**kwargs``: explain() built a cache, and with
    linear-attention layers alone transformers cannot build one (``get_seq_length can only be called on Attention
    layers``). A Hugging Face model that takes keywords now gets ``use_cache=False`` as one that names it does; a
    module of one's own with ``**kwargs`` gets nothing it may not take."""
    config = architecture_tiny_config(transformers.GraniteMoeHybridConfig)
    config._experts_implementation = 'eager'  # grouped-mm kernels refuse float64
    torch.manual_seed(0)
    model = transformers.GraniteMoeHybridForCausalLM(config).double().eval()
    assert set(config.layer_types) == {'linear_attention'}
    assert 'use_cache' not in forward_parameters(model) and without_cache(model) == {'use_cache': False}
    explanation = explain(model, torch.tensor([[5, 17, 3, 28, 9]]), method='cplrp')
    torch.testing.assert_close(explanation.relevance.sum(), explanation.logit.sum(), rtol=1e-6, atol=0)  # conserved

    class Wrapper(torch.nn.Module):
        def forward(self, x, **kwargs):
            return x

    assert without_cache(Wrapper()) == {}


def test_an_encoder_decoder_whose_decoder_is_causal_only_on_ids_is_refused():
    """FSMT builds its decoder's causal mask only where it gets ``input_ids``: run on embeddings, as zennit-attn runs
    encoder-decoder models, its decoder read the later decoder tokens, so the explained logit was not the model's
    (-0.22237 against -0.22189 at the third of four positions, relevance on the fourth token). Before, its decoder's
    table was not found (an AttributeError); now the table is found (``decoder_word_embeddings``) and the model is
    refused by experiment, in float64 too, where its own forward on ids fails."""
    model_type, config_type = model_class('seq2seq-lm', 'fsmt')
    torch.manual_seed(0)
    model = model_type(architecture_tiny_config(config_type)).eval()
    assert decoder_word_embeddings(model) is model.model.decoder.embed_tokens
    ids, decoder_ids = torch.tensor([[5, 17, 3, 28, 9]]), torch.tensor([[2, 11, 7, 4]])
    for dtype in (torch.float32, torch.float64):
        with pytest.raises(UnsupportedModelError, match='its decoder reads the tokens after each position'):
            explain(model.to(dtype), ids, decoder_input_ids=decoder_ids, method='cplrp', target=3)
