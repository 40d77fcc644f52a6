"""The composites leave the model's parameters as they found them: the same ``Parameter`` objects (an optimizer's
references stay valid), the same ``requires_grad`` flags (a mix of frozen and trainable ones), tied weights still one
object, also when the block inside the context raises. zennit 1.0's ``ParamMod`` context sets and restores
parameters with ``load_state_dict(assign=True)``, which puts new objects into the module; the relevance rules (gamma)
compute the modified parameters themselves and keep the module's own (zennit 0.5.1 and 1.0 alike)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from tests.models import tiny_llava, tiny_model, token_ids
from tests.processors import image, llava_processor
from zennit_attn import explain
from zennit_attn.composites import AttnLRPEpsilon, AttnLRPGamma, CPLRPEpsilon, CPLRPGamma
from zennit_attn.inputs.checks import rule_hooks
from zennit_attn.rules import RelevanceRule

COMPOSITES = (AttnLRPEpsilon, CPLRPEpsilon, AttnLRPGamma, CPLRPGamma)
GAMMA = (AttnLRPGamma, CPLRPGamma)
#: the epsilon composite that each gamma composite extends
EPSILON_OF = {AttnLRPGamma: AttnLRPEpsilon, CPLRPGamma: CPLRPEpsilon}
LLAVA_TEXT = '<image>The ice bear lives'


def parameter_state(model: torch.nn.Module) -> list[tuple[str, int, bool]]:
    """``(name, id, requires_grad)`` of every parameter, a tied one under each of its names."""
    return [
        (name, id(parameter), parameter.requires_grad)
        for name, parameter in model.named_parameters(remove_duplicate=False)
    ]


def freeze_every_other(model: torch.nn.Module) -> None:
    """A mix of frozen and trainable parameters (as in fine-tuning a part of a model)."""
    for index, parameter in enumerate(model.parameters()):
        parameter.requires_grad_(index % 2 == 0)


def relevance_in_context(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Relevance at the input embeddings for the last position's largest logit, in the hooked ``model``."""
    with torch.enable_grad():
        embeddings = model.get_input_embeddings()(ids).detach().requires_grad_(True)
        logits = model(inputs_embeds=embeddings).logits[:, -1]
        logit = logits.max(-1).values
        (gradient,) = torch.autograd.grad(logit.sum(), embeddings)
    return embeddings.detach() * gradient * logit.detach().view(-1, 1, 1)


def assert_trainable(model: torch.nn.Module, ids: torch.Tensor) -> None:
    """A plain backward pass after the context reaches every trainable parameter and no frozen one: an optimizer's
    references (the parameter objects) get their gradients."""
    model.zero_grad(set_to_none=True)
    model(ids).logits.sum().backward()
    for name, parameter in model.named_parameters():
        assert (parameter.grad is not None) == parameter.requires_grad, name
    model.zero_grad(set_to_none=True)


@pytest.fixture(scope='module')
def tied_llama():
    model = tiny_model('llama', tie_word_embeddings=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    freeze_every_other(model)
    return model


@pytest.mark.parametrize('raises', [False, True], ids=['returns', 'raises'])
@pytest.mark.parametrize('composite_class', COMPOSITES, ids=lambda cls: cls.__name__)
def test_parameters_are_kept(tied_llama, composite_class, raises):
    """Every composite, its rules run (a backward pass inside the context), then the context left normally or by
    an exception: the model holds the same parameter objects with the same flags, the LM head still shares the
    embedding's weight, and the gamma composites did run their relevance rules (on the LM head, among others)."""
    model, ids = tied_llama, token_ids('llama', 6, 2)
    before = parameter_state(model)
    composite = composite_class()
    with pytest.raises(ZeroDivisionError) if raises else contextlib.nullcontext():
        with composite.context(model):
            hooks = [hook for _, hook in rule_hooks(model)]
            relevance = relevance_in_context(model, ids)
            if raises:
                1 / 0
    assert bool(torch.isfinite(relevance).all()) and float(relevance.abs().sum()) > 0
    assert any(isinstance(hook, RelevanceRule) for hook in hooks) == (composite_class in GAMMA)
    assert parameter_state(model) == before
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert_trainable(model, ids)


@pytest.mark.parametrize('composite_class', GAMMA, ids=lambda cls: cls.__name__)
def test_gamma_changes_relevance_not_parameters(tied_llama, composite_class):
    """The gamma rules act (the relevance differs from the epsilon composite's) with the model's parameter values
    unchanged afterwards."""
    model, ids = tied_llama, token_ids('llama', 6, 2)
    values = {name: parameter.detach().clone() for name, parameter in model.named_parameters()}
    with EPSILON_OF[composite_class]().context(model):
        reference = relevance_in_context(model, ids)
    with composite_class().context(model):
        relevance = relevance_in_context(model, ids)
    assert float((relevance - reference).abs().max()) > 1e-3 * float(reference.abs().max())
    for name, parameter in model.named_parameters():
        assert torch.equal(parameter, values[name]), name


@pytest.fixture(scope='module')
def llava():
    """Tiny LLaVA whose vision tower has a tied weight (the first MLP projection of its two layers is one
    parameter) and a mix of frozen and trainable parameters."""
    model = tiny_llava(zero_bias=True)
    layers = model.model.vision_tower.encoder.layers
    layers[1].mlp.fc1.weight = layers[0].mlp.fc1.weight
    freeze_every_other(model)
    return model, llava_processor()


@pytest.mark.parametrize('raises', [False, True], ids=['returns', 'raises'])
@pytest.mark.parametrize('composite_class', GAMMA, ids=lambda cls: cls.__name__)
def test_vision_scope_keeps_parameters(llava, composite_class, raises):
    """``within='vision'`` on a vision-language model: explain() with the composite, then the composite's context
    by hand with a backward pass through the gamma rules of the vision tower, left normally or by an exception."""
    model, processor = llava
    layers = model.model.vision_tower.encoder.layers
    before = parameter_state(model)
    method = 'cplrp' if composite_class is CPLRPGamma else 'attnlrp'
    composite = composite_class(within='vision')
    exp = explain(model, LLAVA_TEXT, images=[image()], processor=processor, method=method, composite=composite)
    assert float(exp.pixel_relevance.abs().sum()) > 0
    assert parameter_state(model) == before
    encoding = processor(text=LLAVA_TEXT, images=[image()], return_tensors='pt')
    pixels = encoding['pixel_values'].double().requires_grad_(True)
    composite = composite_class(within='vision')
    with pytest.raises(ZeroDivisionError) if raises else contextlib.nullcontext():
        with composite.context(model) as modified:
            assert isinstance(dict(rule_hooks(model))['model.vision_tower.encoder.layers.1.mlp.fc1'], RelevanceRule)
            logits = modified(
                input_ids=encoding['input_ids'],
                pixel_values=pixels,
                attention_mask=encoding['attention_mask'],
                use_cache=False,
            ).logits
            logits[0, -1].max().backward()
            if raises:
                1 / 0
    assert float(pixels.grad.abs().sum()) > 0
    assert parameter_state(model) == before
    assert layers[1].mlp.fc1.weight is layers[0].mlp.fc1.weight
