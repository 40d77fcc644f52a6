"""Quantized and low-precision models: bitsandbytes 8-/4-bit and torchao int8 weight-only layers and float16/bfloat16
models explained within a stated tolerance of the float32 model; quantized layers without a backward pass refused.

Tolerances are relative to the largest float32 token relevance, measured on this tiny Llama with seeds 0-2
(bitsandbytes 0.50.2 on the CPU, torchao 0.18, torch 2.15); each bound is about 3-5x the largest value measured:

=================================  ==========================  =========
model                              measured (max of 3 seeds)   tolerance
=================================  ==========================  =========
bitsandbytes 8-bit vs float32      0.0034                      0.02
bitsandbytes 4-bit vs float32      0.064 (the model changes)   0.2
bitsandbytes 4-bit vs dequantized  0 (the same function)       1e-5
torchao int8 vs float32            0.0036                      0.02
torchao int8 vs dequantized        0                           1e-5
float16 vs float32                 0.0043                      0.02
bfloat16 vs float32                0.014                       0.05
=================================  ==========================  =========
"""

import importlib.util
import logging
import warnings

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from zennit_attn import explain
from zennit_attn.composites import AttnLRPEpsilon
from zennit_attn.core import UnsupportedModelError
from zennit_attn.core.quantization import (
    UnsupportedQuantizationError,
    packed_for_cpu,
    quantization_of,
    unexplained_quantized,
)
from zennit_attn.workflows.evaluation import explanation_curves

LLAMA = dict(
    vocab_size=50,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
TARGET = 5

needs_bnb = pytest.mark.skipif(
    importlib.util.find_spec('bitsandbytes') is None,
    reason='bitsandbytes is not installed: pip install "zennit-attn[quantized]"',
)
needs_torchao = pytest.mark.skipif(
    importlib.util.find_spec('torchao') is None, reason='torchao is not installed: pip install "zennit-attn[quantized]"'
)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Largest deviation relative to the largest expected value."""
    return float((actual - expected).abs().max() / expected.abs().max())


@pytest.fixture(scope='module')
def float32():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**LLAMA)).eval()


@pytest.fixture(scope='module')
def ids():
    return torch.randint(3, 50, (2, 12), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope='module')
def reference(float32, ids):
    return explain(float32, ids, target=TARGET).relevance


@pytest.fixture(scope='module')
def saved(float32, tmp_path_factory):
    folder = tmp_path_factory.mktemp('llama')
    float32.save_pretrained(folder)
    return folder


def load(folder, quantization_config) -> torch.nn.Module:
    """The saved model quantized on loading, as users do (``from_pretrained(..., quantization_config=...)``)."""
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        logging.disable(logging.WARNING)
        try:
            model = LlamaForCausalLM.from_pretrained(
                folder, quantization_config=quantization_config, dtype=torch.float32, device_map='cpu'
            )
        finally:
            logging.disable(logging.NOTSET)
    return model.eval()


def explain_quietly(model, ids):
    with warnings.catch_warnings():  # bitsandbytes warns that 8-bit inputs go through float16
        warnings.simplefilter('ignore')
        return explain(model, ids, target=TARGET)


# ------------------------------------------------------------------------------------------------- bitsandbytes
@needs_bnb
def test_bitsandbytes_8bit_within_tolerance_of_float32(saved, ids, reference):
    from transformers import BitsAndBytesConfig

    model = load(saved, BitsAndBytesConfig(load_in_8bit=True))
    projection = model.model.layers[0].self_attn.q_proj
    assert type(projection).__name__ == 'Linear8bitLt' and projection.weight.dtype == torch.int8
    assert quantization_of(projection) == 'bitsandbytes 8-bit'
    explanation = explain_quietly(model, ids)
    assert explanation.relevance.dtype == torch.float32
    assert relative_error(explanation.relevance, reference) <= 0.02


@needs_bnb
def test_bitsandbytes_4bit_explains_the_dequantized_model(saved, ids, reference):
    from transformers import BitsAndBytesConfig

    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type='nf4', bnb_4bit_compute_dtype=torch.float32)
    model = load(saved, config)
    assert quantization_of(model.model.layers[0].mlp.down_proj) == 'bitsandbytes 4-bit'
    relevance = explain_quietly(model, ids).relevance
    dequantized = load(saved, config).dequantize().eval()
    assert quantization_of(dequantized.model.layers[0].mlp.down_proj) is None
    # 4-bit weights change the model itself; the explanation is that of the model the 4-bit weights define
    assert relative_error(relevance, explain(dequantized, ids, target=TARGET).relevance) <= 1e-5
    assert relative_error(relevance, reference) <= 0.2


# ------------------------------------------------------------------------------------------------- torchao
@needs_torchao
def test_torchao_int8_weight_only_within_tolerance(float32, saved, ids, reference):
    from torchao.quantization import Int8WeightOnlyConfig
    from transformers import TorchAoConfig

    model = load(saved, TorchAoConfig(Int8WeightOnlyConfig()))
    assert quantization_of(model.model.layers[0].self_attn.v_proj) == 'torchao'
    relevance = explain_quietly(model, ids).relevance
    assert relative_error(relevance, reference) <= 0.02
    dequantized = LlamaForCausalLM(LlamaConfig(**LLAMA)).eval()
    dequantized.load_state_dict(float32.state_dict())
    for quantized, plain in zip(model.modules(), dequantized.modules()):
        if quantization_of(quantized) == 'torchao':
            plain.weight.data = quantized.weight.dequantize().float()
    assert relative_error(relevance, explain(dequantized, ids, target=TARGET).relevance) <= 1e-5


# ------------------------------------------------------------------------------------------------- 16 bits
@pytest.mark.parametrize('dtype, tolerance', [(torch.float16, 0.02), (torch.bfloat16, 0.05)])
def test_16_bit_model_within_tolerance_of_float32_relevance_in_float32(float32, ids, reference, dtype, tolerance):
    model = LlamaForCausalLM(LlamaConfig(**LLAMA))
    model.load_state_dict(float32.state_dict())
    model = model.to(dtype).eval()
    explanation = explain(model, ids, target=TARGET)
    # summed over the hidden dimension in float32, returned in float32
    assert explanation.relevance.dtype == torch.float32
    assert explanation.embedding_relevance.dtype == torch.float32
    assert torch.equal(explanation.relevance, explanation.embedding_relevance.sum(-1))
    assert relative_error(explanation.relevance, reference) <= tolerance


def test_float16_overflow_is_refused_not_returned(float32, ids):
    model = LlamaForCausalLM(LlamaConfig(**LLAMA))
    model.load_state_dict(float32.state_dict())
    model = model.half().eval()
    with torch.no_grad():
        model.model.norm.weight.fill_(1e3)  # finite weights, but the logits overflow float16 (|logit| > 65504)
        model.lm_head.weight.mul_(1e3)
    with pytest.raises(
        FloatingPointError, match='torch.float16 overflowed inside the model: explain in float32 or bfloat16'
    ):
        explain(model, ids, target=TARGET)


# ------------------------------------------------------------------------------------------------- refused
def test_torch_ao_dynamic_quantization_refused_for_every_method(float32, ids):
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        model = torch.ao.quantization.quantize_dynamic(float32, {torch.nn.Linear}, dtype=torch.qint8).eval()
    found = unexplained_quantized(model)
    assert list(found) == ['torch.ao.nn.quantized.dynamic.modules.linear.Linear']
    assert found['torch.ao.nn.quantized.dynamic.modules.linear.Linear'][0] == 'model.layers.0.self_attn.q_proj'
    for method in ('attnlrp', 'input_x_gradient', 'atman'):
        with pytest.raises(UnsupportedQuantizationError) as error:
            explain(model, ids, target=TARGET, method=method)
        message = str(error.value)
        assert isinstance(error.value, UnsupportedModelError)
        assert (
            '  - torch.ao.nn.quantized.dynamic.modules.linear.Linear (at model.layers.0.self_attn.q_proj): '
            'torch.ao quantized kernels have no backward pass'
        ) in message
        assert 'Dequantize first' in message and 'BitsAndBytesConfig(load_in_8bit=True)' in message


class QuantLinear(torch.nn.Module):
    """A GPTQ-style layer: int8 ``qweight`` and scales, a kernel without a backward pass (the input is detached)."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        scale = linear.weight.abs().amax(1, keepdim=True) / 127
        self.register_buffer('qweight', (linear.weight / scale).round().to(torch.int8))
        self.register_buffer('scales', scale.detach())

    def forward(self, x):
        return x.detach() @ (self.qweight.to(x.dtype) * self.scales).T


def test_unknown_quantized_layer_refused_not_skipped(float32, ids):
    model = LlamaForCausalLM(LlamaConfig(**LLAMA))
    model.load_state_dict(float32.state_dict())
    for layer in model.model.layers:
        layer.mlp.down_proj = QuantLinear(layer.mlp.down_proj)
    model.eval()
    # before the check, input x gradient ran and silently lost the MLP branches' relevance
    with pytest.raises(
        UnsupportedQuantizationError,
        match=(
            r'  - tests\.core\.test_quantization\.QuantLinear \(at model\.layers\.0\.mlp\.down_proj\): '
            r"its 'qweight' holds torch\.int8 values, and no backward pass through it is known"
        ),
    ):
        explain(model, ids, target=TARGET, method='input_x_gradient')


def test_integer_buffers_that_are_not_weights_are_not_refused(float32):
    # BERT-style position_ids buffers and integer embedding tables are not quantized linear layers
    model = torch.nn.Sequential(torch.nn.Embedding(5, 4), torch.nn.Linear(4, 4))
    model[1].register_buffer('position_ids', torch.arange(4))
    assert unexplained_quantized(model) == {}
    assert unexplained_quantized(float32) == {}


@pytest.mark.slow
def test_gguf_dequantized_smollm2_is_a_float_model(smollm2):
    """SmolLM2's GGUF file (Q4_1) is dequantized on loading: a float32 model, nothing refused."""
    model, tokenizer = smollm2
    assert unexplained_quantized(model) == {}
    assert all(quantization_of(module) is None for module in model.modules())
    assert {parameter.dtype for parameter in model.parameters()} == {torch.float32}
    explanation = explain(model, 'The Eiffel Tower is located in the city of', tokenizer=tokenizer, target=' Paris')
    assert explanation.relevance.dtype == torch.float32 and bool(torch.isfinite(explanation.relevance).all())


@needs_bnb
def test_gamma_rule_on_a_quantized_vit_layer_refused():
    """The gamma rule recomputes a layer with modified weights, which a bitsandbytes layer holds in 8 bits."""
    import bitsandbytes as bnb

    from tests.models import pixels, tiny_hf_vit
    from zennit_attn.composites import AttnLRPGamma
    from zennit_attn.rules import Epsilon

    model = tiny_hf_vit(dtype=torch.float32)
    plain = model.vit.layers[0].mlp.fc1
    quantized = bnb.nn.Linear8bitLt(plain.in_features, plain.out_features, has_fp16_weights=False, threshold=0.0)
    quantized.weight = bnb.nn.Int8Params(plain.weight.data.clone(), requires_grad=False, has_fp16_weights=False)
    quantized.bias = torch.nn.Parameter(plain.bias.data.clone())
    model.vit.layers[0].mlp.fc1 = quantized.to('cpu').eval()
    images = pixels(dtype=torch.float32)
    with pytest.raises(
        UnsupportedQuantizationError,
        match=(
            r"Gamma \(the 'linear' rule\) recomputes 'vit\.layers\.0\.mlp\.fc1' with modified "
            r'weights, which the bitsandbytes 8-bit layer Linear8bitLt does not hold in floating point: dequantize '
            r'the model first, or pass linear=Epsilon\(\) to AttnLRPGamma'
        ),
    ):
        explain(model, images, target=0)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        explanation = explain(model, images, target=0, composite=AttnLRPGamma(linear=Epsilon()))
    assert bool(torch.isfinite(explanation.relevance).all())


@needs_bnb
def test_bitsandbytes_4bit_layer_not_yet_quantized_refused():
    """bitsandbytes quantizes 4-bit weights on ``.to(device)``; before that its forward fails with a bare assertion."""
    import bitsandbytes as bnb

    model = torch.nn.Sequential(bnb.nn.Linear4bit(16, 8, compute_dtype=torch.float32))
    assert list(unexplained_quantized(model).values()) == [
        (
            '0',
            'its 4-bit weights are not quantized yet (bitsandbytes quantizes them when the layer moves to its '
            "device): call model.to('cpu') or model.cuda() first",
        )
    ]
    assert unexplained_quantized(model.to('cpu')) == {}


@needs_bnb
def test_bitsandbytes_4bit_on_a_device_without_its_kernels_refused(monkeypatch, float32, ids):
    """A 4-bit layer on a device for which the installed bitsandbytes has no 4-bit kernel is refused with the device
    and the devices it has kernels for (simulated here: the CPU taken out of the kernels' devices), never run."""
    import bitsandbytes as bnb

    from zennit_attn.core import quantization

    assert quantization.bitsandbytes_supports('cpu') and 'cpu' in quantization.bitsandbytes_devices()
    assert not quantization.bitsandbytes_supports('no-such-device')
    model = torch.nn.Sequential(bnb.nn.Linear4bit(16, 8, compute_dtype=torch.float32)).to('cpu')
    assert unexplained_quantized(model) == {}
    supported = quantization.bitsandbytes_supports
    monkeypatch.setattr(quantization, 'bitsandbytes_supports', lambda device: device != 'cpu' and supported(device))
    path, why = unexplained_quantized(model)['bitsandbytes.nn.modules.Linear4bit']
    assert path == '0' and "no 4-bit kernel for the 'cpu' device" in why and 'kernels here: none' in why


@needs_bnb
def test_bitsandbytes_4bit_packed_for_cpu_inference_is_unpacked_for_gradients(saved, ids, reference):
    """On a CPU with AVX-512 BF16 bitsandbytes packs 4-bit weights for a kernel without gradient in its first pass
    without gradients: explained after generate() or torch.no_grad(), a Llama gave its tokens no relevance but the
    explained one's own (the residual stream), under every method. zennit-attn's own passes without gradients (the
    checks' probes, the plain pass of Integrated Gradients) no longer pack a model; a packed one is unpacked."""
    from transformers import BitsAndBytesConfig

    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type='nf4', bnb_4bit_compute_dtype=torch.float32)
    model = load(saved, config)
    layers = [module for module in model.modules() if quantization_of(module) == 'bitsandbytes 4-bit']
    if not getattr(layers[0], 'support_avx512bf16_for_cpu', False):
        pytest.skip('bitsandbytes packs 4-bit weights only on CPUs with AVX-512 BF16')
    fresh = explain_quietly(model, ids).relevance
    integrated = explain(model, ids, target=TARGET, method='integrated_gradients', steps=4).relevance
    assert not any(packed_for_cpu(layer) for layer in layers)  # explain() ran no pass that packs the model
    with torch.no_grad():
        model(input_ids=ids)  # as generate() does
    assert all(packed_for_cpu(layer) for layer in layers)
    packed = explain_quietly(model, ids).relevance
    assert not any(packed_for_cpu(layer) for layer in layers)
    # the packed model's scales are rounded to bfloat16 (its first pass changed the model, as bitsandbytes does in every
    # such pass): the same model to 4-bit precision, with every token relevant
    assert relative_error(packed, fresh) <= 0.2 and bool((packed[:, :-1].abs() > 0).all())
    with torch.no_grad():
        model(input_ids=ids)
    assert (
        relative_error(explain(model, ids, target=TARGET, method='integrated_gradients', steps=4).relevance, integrated)
        <= 0.2
    )
    with torch.no_grad():
        model(input_ids=ids)
    with AttnLRPEpsilon().context(model) as modified:
        assert not any(packed_for_cpu(layer) for layer in layers)
        embeddings = model.get_input_embeddings()(ids).detach().requires_grad_(True)
        logit = modified(inputs_embeds=embeddings, use_cache=False).logits[:, -1, TARGET]
        (relevance,) = torch.autograd.grad(logit, embeddings, grad_outputs=logit.detach())
    assert all(layer.support_avx512bf16_for_cpu for layer in layers)  # the setting restored on exit
    # each packing rounds the scales anew: compare with explain() of the model as the context left it
    explanation = explain_quietly(model, ids)
    torch.testing.assert_close(relevance.sum(-1), explanation.relevance, rtol=1e-5, atol=1e-7)
    curves = explanation_curves(model, explanation, steps=2, progress=False)  # perturbed passes without gradients
    assert not any(packed_for_cpu(layer) for layer in layers)  # they left the model as it was explained
    torch.testing.assert_close(curves[0].morf[0], explanation.logit[0].double(), rtol=1e-6, atol=0)
