"""The general mechanism (:py:mod:`zennit_attn.canonizers.general`): equal to the family table where both apply,
exact rules on hand-checkable modules, and named refusals."""
from __future__ import annotations

import pytest
import torch

from tests.models import FAMILIES, decoder_ids, pixels, tiny_hf_vit, tiny_model, tiny_timm_vit, token_ids
from zennit_attn.canonizers import GeneralCanonizer, UnsupportedModelError, canonizers_for
from zennit_attn.composites import AttnLRPEpsilon, CPLRPEpsilon

HEADS = {'bert': 'seq_cls', 'roberta': 'masked_lm', 'distilbert': 'seq_cls', 't5': 'seq2seq', 't5_relu': 'seq2seq'}


def relevance(model, composite, inputs: dict) -> list[torch.Tensor]:
    """Relevance at every float input for relevance 1 at the largest last-position score."""
    leaves = {key: value.detach().clone().requires_grad_(True) for key, value in inputs.items()
              if isinstance(value, torch.Tensor) and value.is_floating_point()}
    rest = {key: value for key, value in inputs.items() if key not in leaves}
    with composite.context(model) as modified:
        output = modified(**leaves, **rest)
        scores = output.logits if hasattr(output, 'logits') else output
        scores = scores[0, -1] if scores.dim() == 3 else scores[0]
        scores[scores.argmax()].backward()
    return [leaf.grad for leaf in leaves.values()]


def family_inputs(family: str, model) -> dict:
    ids = token_ids(family, 7, 1, seed=2)
    inputs = {'inputs_embeds': model.get_input_embeddings()(ids)}
    if family.startswith('t5'):
        decoder = model.get_decoder().get_input_embeddings()
        inputs['decoder_inputs_embeds'] = decoder(decoder_ids(family, 3, 1))
        inputs['use_cache'] = False
    return inputs


@pytest.mark.parametrize('composite', [AttnLRPEpsilon, CPLRPEpsilon])
@pytest.mark.parametrize('family', FAMILIES)
def test_general_equals_table(family, composite):
    """On every family of the table, the general mechanism gives the table's relevance (float64, 1e-12), for the
    models' own attention implementation and for eager attention."""
    model = tiny_model(family, HEADS.get(family))
    assert canonizers_for(model) and not isinstance(canonizers_for(model)[0], GeneralCanonizer)
    inputs = family_inputs(family, model)
    for implementation in ('eager', model.config._attn_implementation):
        model.config._attn_implementation = implementation
        table = relevance(model, composite(general=False), inputs)
        general = relevance(model, composite(general=True), inputs)
        for expected, found in zip(table, general):
            torch.testing.assert_close(found, expected, rtol=0, atol=1e-12)
        assert all(parameter.requires_grad for parameter in model.parameters())  # unfrozen again


@pytest.mark.parametrize('builder', [tiny_timm_vit, tiny_hf_vit])
def test_general_equals_table_vision(builder):
    model = builder()
    for composite in (AttnLRPEpsilon, CPLRPEpsilon):
        table = relevance(model, composite(general=False), {'x': pixels(1)}) if builder is tiny_timm_vit else \
            relevance(model, composite(general=False), {'pixel_values': pixels(1)})
        key = 'x' if builder is tiny_timm_vit else 'pixel_values'
        general = relevance(model, composite(general=True), {key: pixels(1)})
        torch.testing.assert_close(general[0], table[0], rtol=0, atol=1e-12)


class Gated(torch.nn.Module):
    """``down(silu(gate(x)) * up(x)) / ||x||`` computed inline, with an inline softmax mixing of positions."""
    def __init__(self):
        super().__init__()
        self.gate, self.up, self.down = (torch.nn.Linear(4, 4, bias=False) for _ in range(3))

    def forward(self, x):
        mixed = torch.softmax(x @ x.transpose(-1, -2), -1) @ x
        return self.down(torch.nn.functional.silu(self.gate(mixed)) * self.up(mixed)) / x.norm()


def test_rules_by_hand():
    """The inline operations get AttnLRP's rules: computed here by hand in the gradient formulation."""
    torch.manual_seed(0)
    model = Gated().double()
    x = torch.randn(3, 4, dtype=torch.float64)
    for composite, gate_factor in ((AttnLRPEpsilon(general=True), 0.5), (CPLRPEpsilon(general=True), 0.0)):
        leaf = x.clone().requires_grad_(True)
        with composite.context(model) as modified:
            modified(leaf).sum().backward()
        # by hand: the output relevance 1 per element; norm constant; products by the uniform rule (CP: the
        # gate and the softmax output constant); silu by the identity rule; softmax plain gradient
        xx = x.clone().requires_grad_(True)
        norm = x.norm()
        scores_in = xx if gate_factor else xx.detach()
        scores = torch.softmax(_half(scores_in, gate_factor) @ _half(scores_in, gate_factor).transpose(-1, -2), -1)
        mixed = _half(scores, gate_factor) @ _half(xx, 0.5 if gate_factor else 1.0)
        gate = model.gate(mixed)
        activated = _identity(gate, torch.nn.functional.silu(gate))
        out = model.down(_half(activated, gate_factor) * _half(model.up(mixed), 0.5 if gate_factor else 1.0)) / norm
        with_relevance = out.detach()
        (out * (1 / with_relevance)).sum().backward()
        torch.testing.assert_close(leaf.grad, xx.grad * x, rtol=1e-10, atol=1e-12)


def _half(tensor, factor):
    if factor == 0:
        return tensor.detach()
    result = tensor.view_as(tensor)
    result.register_hook(lambda grad: grad * factor)
    return result


def _identity(input, output):
    ratio = (output / input).detach()
    return input * ratio


class Exponential(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)

    def forward(self, x):
        return torch.exp(self.linear(x))


class Kernel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


class Custom(Exponential):
    def forward(self, x):
        return self.linear(Kernel.apply(x))


class TupleNorm(torch.nn.Module):
    def forward(self, x):
        return x * 2


class MambaMixer(Exponential):
    pass


class Block(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.mixer = inner

    def forward(self, x):
        return self.mixer(x)


@pytest.mark.parametrize('model, match', [
    (Exponential(), r"exp in the model \(Exponential\)"),
    (Custom(), r'Kernel in .*custom autograd function'),
    (Block(MambaMixer()), r"exp in 'mixer' \(MambaMixer\).*MambaMixer is not softmax attention"),
])
def test_refusals_name_op_and_module(model, match):
    """An operation without a rule, a custom kernel and a state-space layer are refused, naming what and where; the
    model is left as it was."""
    x = torch.randn(2, 3, requires_grad=True)
    with pytest.raises(UnsupportedModelError, match=match):
        with AttnLRPEpsilon(general=True).context(model) as modified:
            modified(x)
    assert all(parameter.requires_grad for parameter in model.parameters())
    assert not model._forward_hooks and not model._forward_pre_hooks


class ScaledNorm(torch.nn.Module):
    """Named like a normalisation, but not one."""
    def forward(self, x):
        return x * 3


class CenteredNorm(torch.nn.Module):
    """A LayerNorm written by hand (no torch class): found by its name, confirmed as mean-subtracting."""
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(5) + 0.5)
        self.bias = torch.nn.Parameter(torch.zeros(5))

    def forward(self, x):
        centered = x - x.mean(-1, keepdim=True)
        return centered * torch.rsqrt(centered.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight + self.bias


def test_norms_by_name_are_confirmed():
    x = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
    with pytest.raises(UnsupportedModelError, match='ScaledNorm is named like a normalisation but its output changes'):
        with AttnLRPEpsilon(general=True).context(Block(ScaledNorm())) as modified:
            modified(x)
    norm = CenteredNorm().double()
    layer = torch.nn.LayerNorm(5, eps=1e-5).double()
    with torch.no_grad():
        layer.weight.copy_(norm.weight)
    grads = []
    for module in (norm, layer):
        leaf = x.detach().clone().requires_grad_(True)
        with AttnLRPEpsilon(general=True).context(Block(module)) as modified:
            modified(leaf)[:, :3].sum().backward()
        grads.append(leaf.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-10, atol=1e-12)
