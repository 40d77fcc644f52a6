"""Relevance on an accelerator equals relevance on the CPU: ``pytest tests/test_device.py --device cuda``.

Without ``--device`` (the default run, ``make test``) every test here is skipped; with a device the machine lacks
(``--device cuda`` without a CUDA GPU) too (the ``device`` fixture of ``tests/conftest.py``). ``--device cpu`` runs
them on the CPU against the CPU (a check of the tests themselves). Each test computes on the device and compares
with a result computed independently on the CPU:

1. rules against the naive formulas: explain() on the device equals the explicit AttnLRP and CP-LRP reference of
   ``tests/composites/test_reference.py`` (Llama written out in relevance form, computed on the CPU) in float64 to
   :py:data:`FLOAT64`;
2. conservation: CP-LRP in float64 with biases zeroed conserves the logit exactly on the device (:py:data:`EXACT`),
   for every family and head of ``tests/models.py``;
3. family parity: the AttnLRP relevance of every family on the device equals the CPU's, float64 to
   :py:data:`FLOAT64`, float32 to :py:data:`FLOAT32` (TF32 off); bfloat16 on the device (SDPA, so flash or
   memory-efficient kernels; mixtures of experts with transformers' default grouped-mm experts) against float32 on
   the CPU to :py:data:`BFLOAT16` (the bfloat16 CPU result's own error is of the same order);
4. restore: after the context on the device the model is as before (the same parameter objects, flags,
   implementations, outputs);
5. checkpointing, latent relevance, generation and the workflows (relevance patching, context attribution) on the
   device equal the CPU's (float64 models, :py:data:`FLOAT64`; checkpointing equals the device's own call);
6. a Qwen3.5-shaped hybrid (gated delta rule and softmax attention layers) and a Gemma-3-shaped vision-language
   model (text and pixels) on the device: float32 equal to the CPU's, bfloat16 close to the CPU's float32.

Tolerances are relative to the largest entry (:py:func:`tests.numbers.relative_error`).
"""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
import transformers

from tests.composites.test_reference import COMPOSITES, QUERIES, float64_softmax, make_model, run_both
from tests.models import ENCODER_DECODERS, FAMILY_HEADS, MOE, decoder_ids, tiny_model, token_ids
from tests.naive_rules import ATTNLRP, CPLRP
from tests.numbers import assert_close, relative_error
from zennit_attn import explain, explain_generation
from zennit_attn.composites import AttnLRPEpsilon, CPLRPEpsilon
from zennit_attn.workflows.architecture_check.check import check_inputs, randomize_zero_weights, zero_biases
from zennit_attn.workflows.architecture_check.configs import model_class, tiny_config
from zennit_attn.workflows.patching.scores import relevance_patching
from zennit_attn.workflows.sources import explain_sources

#: CP-LRP's conservation in float64 on the device
EXACT = 1e-10
#: float64 models on the device against the CPU: transformers computes some steps of a float64 model in float32
#: (RMSNorm, the attention softmax, the rotary tables), whose rounding differs between the devices (measured on an
#: H200: 6e-8 to 2e-7)
FLOAT64 = 1e-6
#: float32 on the device against float32 on the CPU (TF32 off: :py:func:`no_tf32`)
FLOAT32 = 1e-4
#: bfloat16 on the device against float32 on the CPU: the relative error of the token relevance (bfloat16 has an
#: 8-bit mantissa; on the CPU the same models give errors of 0.001-0.025 in bfloat16)
BFLOAT16 = 0.05
SEQ = 10
#: the fixture of tests/composites/test_reference.py (softmax in float64), used by the reference test here
__all__ = ['float64_softmax']


@pytest.fixture(autouse=True)
def no_tf32():
    """TF32 matrix products and convolutions off for the time of a test (float32 compared with the CPU's float32),
    then as they were."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def on(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """A copy of ``model`` on ``device`` (the CPU original stays)."""
    return copy.deepcopy(model).to(device)


def inputs_of(family: str, batch: int = 1) -> dict:
    """The keyword arguments of :py:func:`explain` for a family: ids and, for encoder-decoders, decoder ids."""
    extra = {'decoder_input_ids': decoder_ids(family, 4, batch)} if family in ENCODER_DECODERS else {}
    return {'input_ids': token_ids(family, SEQ, batch), **extra}


def tokens(explanation) -> torch.Tensor:
    """Token relevance on the CPU in float64: encoder then decoder tokens for encoder-decoders."""
    parts = [explanation.relevance]
    if explanation.decoder_relevance is not None:
        parts.append(explanation.decoder_relevance)
    return torch.cat([part.detach().double().cpu() for part in parts], -1)


# ------------------------------------------------------------------------------------------------- 1. the rules
@pytest.mark.parametrize('variant', [ATTNLRP, CPLRP])
@pytest.mark.parametrize('target,position', QUERIES[:2] + QUERIES[3:])
@pytest.mark.usefixtures('float64_softmax')
def test_reference_llama(device, variant, target, position):
    """explain() on the device equals the explicit reference (relevance form, float64, CPU) to rounding."""
    model = make_model(2, 2)
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(7))
    # the reference reads the CPU model's weights; explain() runs a copy on the device (run_both: explain first)
    reference_setup = (model, ids)
    exp_cpu, reference, logits, _ = run_both(reference_setup, target, position, variant, torch.float64)
    exp = explain(on(model, device), ids, target=target, position=position, composite=COMPOSITES[variant]())
    assert exp.relevance.device.type == device.type
    assert relative_error(exp.logit.cpu(), logits) <= FLOAT64
    assert_close(exp.embedding_relevance.cpu(), reference, FLOAT64)
    assert_close(exp.relevance.cpu(), exp_cpu.relevance, FLOAT64)


# ------------------------------------------------------------------------------------------------- 2. conservation
@pytest.mark.parametrize('family,head', FAMILY_HEADS)
def test_cplrp_conserves_on_the_device(device, family, head):
    """CP-LRP, float64, biases (and learned position embeddings) zeroed: the input relevance is the logit."""
    model = tiny_model(family, head, zero_bias=True)
    for module in model.modules():  # learned position and segment embeddings are inputs of their own
        if isinstance(module, torch.nn.Embedding) and module is not model.get_input_embeddings():
            torch.nn.init.zeros_(module.weight)
    exp = explain(on(model, device), **inputs_of(family), method='cplrp')
    assert abs(float(tokens(exp).sum()) - float(exp.logit)) <= EXACT * max(1.0, abs(float(exp.logit)))


# ------------------------------------------------------------------------------------------------- 3. family parity
@pytest.mark.parametrize('dtype', [torch.float64, torch.float32], ids=['float64', 'float32'])
@pytest.mark.parametrize('family,head', FAMILY_HEADS)
def test_attnlrp_equals_the_cpu(device, family, head, dtype):
    """AttnLRP on the device equals AttnLRP on the CPU (SDPA attention where the family has it)."""
    attention = 'eager' if family == 'gemma2' else 'sdpa'
    model = tiny_model(family, head, dtype=dtype, attn_implementation=attention)
    inputs = inputs_of(family, batch=2)
    expected = explain(model, **inputs)
    actual = explain(on(model, device), **inputs)
    assert torch.equal(actual.target.cpu(), expected.target)
    assert_close(tokens(actual), tokens(expected), FLOAT64 if dtype == torch.float64 else FLOAT32)


BFLOAT16_FAMILIES = ('llama', 'qwen3', 'gemma3', 'gpt2', 'phi3', 'mixtral', 'qwen3_moe', 'bert', 't5')


@pytest.mark.parametrize('family', BFLOAT16_FAMILIES)
def test_bfloat16_is_close_to_float32(device, family):
    """bfloat16 on the device (SDPA kernels; mixtures of experts: transformers' default experts implementation,
    grouped matrix products) against float32 on the CPU, both explaining the float32 model's prediction."""
    head = dict(FAMILY_HEADS)[family]
    attention = 'eager' if family == 'gemma2' else 'sdpa'
    reference = tiny_model(family, head, dtype=torch.float32, attn_implementation=attention)
    model = tiny_model(family, head, dtype=torch.bfloat16, attn_implementation=attention)
    if family in MOE:
        assert model.config._experts_implementation not in (None, 'eager')  # the default kernels are explained
    inputs = inputs_of(family)
    expected = explain(reference, **inputs)
    actual = explain(model.to(device), **inputs, target=expected.target)
    error = relative_error(tokens(actual), tokens(expected))
    assert error <= BFLOAT16, f'{family}: bfloat16 relative error {error:.3g}'


# ------------------------------------------------------------------------------------------------- 4. restore
def test_context_restores_the_model_on_the_device(device):
    """After the composite's context (also one left by an exception) the model on the device has the same
    parameter objects, flags, attention implementation and outputs."""
    model = tiny_model('llama', attn_implementation='sdpa').to(device)
    parameters = [(parameter, parameter.requires_grad) for parameter in model.parameters()]
    ids = token_ids('llama', SEQ).to(device)
    with torch.no_grad():
        before = model(ids).logits
    for _ in range(2):
        with contextlib.suppress(ZeroDivisionError), CPLRPEpsilon().context(model) as modified:
            modified(ids)
            1 / 0
    assert [(parameter, parameter.requires_grad) for parameter in model.parameters()] == parameters
    assert all(parameter.device.type == device.type for parameter in model.parameters())
    assert model.config._attn_implementation == 'sdpa'
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)


# ------------------------------------------------------------------------------------------------- 5. the rest
def test_checkpointing_on_the_device(device):
    """explain(checkpointing=True) recomputes each block in the backward pass on the device: the same relevance."""
    model = on(tiny_model('llama', zero_bias=True), device)
    ids = token_ids('llama', SEQ, batch=2)
    plain, checkpointed = explain(model, ids), explain(model, ids, checkpointing=True)
    assert_close(checkpointed.relevance.cpu(), plain.relevance.cpu(), 1e-12)


def test_latent_relevance_equals_the_cpu(device):
    """Latent relevance (every site of tests/latent's models) recorded on the device equals the CPU's."""
    model = tiny_model('llama')
    ids = token_ids('llama', SEQ)
    sites = ('mlp', 'attention', 'residual', 'query', 'key', 'value')
    expected = explain(model, ids, latent=sites).latent
    actual = explain(on(model, device), ids, latent=sites).latent
    assert sorted(actual) == sorted(expected)
    for site in expected:
        assert_close(actual[site].cpu(), expected[site], FLOAT64)


def test_generation_equals_the_cpu(device, tokenizer):
    """explain_generation on the device generates the same tokens and explains each as the CPU does."""
    model = tiny_model('llama')
    expected = explain_generation(model, tokenizer, 'the bear', max_new_tokens=4)
    actual = explain_generation(on(model, device), tokenizer, 'the bear', max_new_tokens=4)
    assert actual.input_ids.cpu().tolist() == expected.input_ids.tolist()
    assert_close(actual.relevance.cpu(), expected.relevance, FLOAT64)
    assert_close(actual.answer_relevance.cpu(), expected.answer_relevance, FLOAT64)


def test_relevance_patching_equals_the_cpu(device):
    """Relevance patching (the default path, AtP over 4 steps) on the device equals the CPU's."""
    model = tiny_model('llama')
    clean = token_ids('llama', 8, batch=2, seed=1)
    corrupted = clean.clone()
    corrupted[:, 2] = token_ids('llama', 2, batch=1, seed=2)[0]
    answers, wrong = torch.tensor([5, 6]), torch.tensor([7, 8])
    expected = relevance_patching(model, clean, corrupted, answers, wrong)
    actual = relevance_patching(on(model, device), clean, corrupted, answers, wrong)
    for component, scores in expected.scores.items():
        assert_close(actual.scores[component].cpu(), scores, FLOAT64)


def test_context_attribution_equals_the_cpu(device, tokenizer):
    """explain_sources (its default objective, the log-odds) on the device gives the CPU's source scores."""
    model = tiny_model('llama')
    context = 'The ice bear lives in the Arctic. The penguin lives in the south.'
    expected = explain_sources(model, tokenizer, context, 'where?', ' in the Arctic.')
    actual = explain_sources(on(model, device), tokenizer, context, 'where?', ' in the Arctic.')
    assert_close(actual.scores.cpu(), expected.scores, FLOAT64)


# ------------------------------------------------------------------------------------------------- 6. hybrid, VLM
def _qwen35_hybrid() -> tuple[torch.nn.Module, dict]:
    """A tiny random Qwen3.5-shaped hybrid: three gated-delta-rule layers, then a softmax attention layer (the
    layout of Qwen3.5), transformers' torch path of the recurrence."""
    config = transformers.Qwen3_5TextConfig(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        layer_types=['linear_attention'] * 3 + ['full_attention'],
        pad_token_id=0,
    )
    torch.manual_seed(0)
    return transformers.Qwen3_5ForCausalLM(config).eval(), {'input_ids': token_ids('llama', 12), 'use_cache': False}


def _gemma3_vlm() -> tuple[torch.nn.Module, dict]:
    """A tiny random Gemma-3-shaped vision-language model (SigLIP tower, Gemma 3 text model) in float32, and its
    inputs (ids with image tokens, pixels) from the architecture check's offline builders."""
    cls, config_class = model_class('image-text-to-text', 'gemma3')
    config = tiny_config(config_class)
    torch.manual_seed(0)
    model = cls(config).float().eval()
    randomize_zero_weights(model, torch.Generator().manual_seed(0))
    zero_biases(model)
    inputs, fed = check_inputs(model, config, 'image-text-to-text', torch.Generator().manual_seed(0))
    assert fed.startswith('text + image'), fed
    return model, inputs


def _relevance(model: torch.nn.Module, inputs: dict, device: torch.device, dtype: torch.dtype, target: int):
    """Input x modified gradient (AttnLRP) of the text embeddings and of every floating-point input that is not a
    mask (the pixels) for the logit ``target`` at the last position, with ``model`` on ``device`` in ``dtype``; CPU
    float64 tensors by input."""
    model = on(model, device).to(dtype)
    leaves = {'inputs_embeds': model.get_input_embeddings()(inputs['input_ids'].to(device)).detach()}
    kwargs = {}
    for key, value in inputs.items():
        value = value.to(device) if torch.is_tensor(value) else value
        if torch.is_tensor(value) and value.is_floating_point() and 'mask' not in key:
            leaves[key] = value.to(dtype)
        elif key != 'input_ids':
            kwargs[key] = value
    leaves = {key: leaf.detach().requires_grad_(True) for key, leaf in leaves.items()}
    with AttnLRPEpsilon().context(model) as modified:
        modified(**leaves, **kwargs).logits[0, -1, target].backward()
    return {key: (leaf * leaf.grad).double().cpu() for key, leaf in leaves.items()}


@pytest.mark.parametrize('build', [_qwen35_hybrid, _gemma3_vlm], ids=['qwen3_5-hybrid', 'gemma3-vlm'])
def test_hybrid_and_vision_language_models(device, build):
    """float32 on the device equals the CPU's (text and pixel relevance); bfloat16 on the device is close to it."""
    model, inputs = build()
    with torch.no_grad():
        target = int(model(**inputs).logits[0, -1].argmax())
    expected = _relevance(model, inputs, torch.device('cpu'), torch.float32, target)
    assert len(expected) == (2 if build is _gemma3_vlm else 1)
    actual = _relevance(model, inputs, device, torch.float32, target)
    for key, value in expected.items():
        assert_close(actual[key], value, FLOAT32)
    bfloat16 = _relevance(model, inputs, device, torch.bfloat16, target)
    error = relative_error(bfloat16['inputs_embeds'].sum(-1), expected['inputs_embeds'].sum(-1))
    assert error <= BFLOAT16, f'bfloat16 token relevance: relative error {error:.3g}'
