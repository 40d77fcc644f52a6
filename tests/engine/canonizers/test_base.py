"""The general mechanism: operand taps and inline-function routing against explicit-module implementations."""

import pytest
import torch

from tests.numbers import assert_close
from zennit_attn.engine.canonizers import InlineActivationCanonizer, OperandCanonizer, SettingCanonizer
from zennit_attn.engine.canonizers.families import separate_qkv
from zennit_attn.engine.composites import AttnLRPEpsilon, CPLRPEpsilon
from zennit_attn.engine.modules import MatMul


class InlineAttention(torch.nn.Module):
    """Single-head attention computed inline, as Hugging Face does."""

    def __init__(self, dim):
        super().__init__()
        self.q, self.k, self.v, self.o = (torch.nn.Linear(dim, dim, bias=False) for _ in range(4))

    def forward(self, x):
        scores = self.q(x) @ self.k(x).transpose(-1, -2) / x.shape[-1] ** 0.5
        return self.o(scores.softmax(-1) @ self.v(x)) + x


class ModuleAttention(InlineAttention):
    """The same attention with explicit modules for both products and the softmax."""

    def __init__(self, dim):
        super().__init__(dim)
        self.scores, self.softmax, self.mix = MatMul(), torch.nn.Softmax(-1), MatMul()

    def forward(self, x):
        scores = self.scores(self.q(x), self.k(x).transpose(-1, -2)) / x.shape[-1] ** 0.5
        return self.o(self.mix(self.softmax(scores), self.v(x))) + x


class InlineHead(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dense, self.out = torch.nn.Linear(dim, dim), torch.nn.Linear(dim, 2)

    def forward(self, x):
        return self.out(torch.tanh(self.dense(x[:, 0])))


class ModuleHead(InlineHead):
    def __init__(self, dim):
        super().__init__(dim)
        self.act = torch.nn.Tanh()

    def forward(self, x):
        return self.out(self.act(self.dense(x[:, 0])))


def relevance(model, composite, x, target=0):
    x = x.clone().requires_grad_()
    with composite.context(model) as modified:
        output = modified(x)
        selected = output[..., target] if output.dim() == 2 else output[:, -1, target]
        (grad,) = torch.autograd.grad(selected, x, grad_outputs=selected.detach())
    return grad


def pair(inline_cls, module_cls, seed=0, dim=6):
    torch.manual_seed(seed)
    inline = inline_cls(dim).double()
    module = module_cls(dim).double()
    module.load_state_dict(inline.state_dict(), strict=False)
    return inline, module


@pytest.mark.parametrize('composite_cls', [AttnLRPEpsilon, CPLRPEpsilon])
def test_operand_taps_equal_explicit_matmul_and_softmax_rules(composite_cls):
    """Operands scaled at q/k/v == Prop. 3.3 on both MatMul modules with Prop. 3.1 on the softmax module
    (AttnLRP), or the attention matrix as constant (CP-LRP)."""
    inline, module = pair(InlineAttention, ModuleAttention)
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    taps = OperandCanonizer({'InlineAttention': separate_qkv('q', 'k', 'v')})
    tapped = relevance(inline, composite_cls(canonizers=[taps]), x)
    explicit = relevance(module, composite_cls(canonizers=[]), x)
    assert_close(tapped, explicit)
    plain = relevance(inline, composite_cls(canonizers=[]), x)
    assert float((plain - explicit).abs().max()) > 1e-3 * float(explicit.abs().max())


def test_inline_function_routed_through_identity_rule():
    inline, module = pair(InlineHead, ModuleHead)
    x = torch.randn(3, 4, 6, dtype=torch.float64)
    routed = relevance(inline, AttnLRPEpsilon(canonizers=[InlineActivationCanonizer({'InlineHead': ('tanh',)})]), x)
    explicit = relevance(module, AttnLRPEpsilon(canonizers=[]), x)
    assert_close(routed, explicit)
    plain = relevance(inline, AttnLRPEpsilon(canonizers=[]), x)
    assert float((plain - explicit).abs().max()) > 1e-3 * float(explicit.abs().max())


def clean(model):
    return not any(name.split('.')[-1].startswith('attnlrp_') for name, _ in model.named_modules()) and not any(
        m._forward_hooks or m._forward_pre_hooks or m._backward_hooks for m in model.modules()
    )


def test_exception_inside_the_block_restores_and_leaves_no_function_mode():
    inline, _ = pair(InlineHead, ModuleHead)
    model = torch.nn.Sequential(inline)
    model[0].dense.register_forward_hook(lambda *args: None)  # a user's own hook must survive
    user_hooks = dict(model[0].dense._forward_hooks)
    composite = AttnLRPEpsilon(canonizers=[InlineActivationCanonizer({'InlineHead': ('tanh',)})])
    depth = torch._C._len_torch_function_stack()
    with pytest.raises(IndexError):
        with composite.context(model) as modified:
            modified(torch.randn(3, 6, dtype=torch.float64)[:, 0])  # 1-D features: x[:, 0] fails inside forward
    assert torch._C._len_torch_function_stack() == depth
    assert dict(model[0].dense._forward_hooks) == user_hooks
    model[0].dense._forward_hooks.clear()
    assert clean(model)


def test_a_second_composite_on_the_same_model_is_refused_cleanly():
    inline, _ = pair(InlineAttention, ModuleAttention)
    canonizer = OperandCanonizer({'InlineAttention': separate_qkv('q', 'k', 'v')})
    with AttnLRPEpsilon(canonizers=[canonizer]).context(inline):
        with pytest.raises(RuntimeError, match='another zennit-attn composite'):
            with AttnLRPEpsilon(canonizers=[canonizer]).context(inline):
                pass
        assert sum(name.startswith('attnlrp_') for name, _ in inline.named_children()) == 3
    assert clean(inline)


# ----------------------------------------------------------------------------------- a failure on a later module
def snapshot(model):
    """Everything a canonizer may change on a module tree: children, hooks (by identity), config values."""
    return [
        (
            name,
            type(module),
            dict(module._modules),
            dict(module._forward_hooks),
            dict(module._forward_pre_hooks),
            dict(module._forward_hooks_always_called),
            dict(getattr(module, 'config', None).__dict__) if hasattr(module, 'config') else None,
        )
        for name, module in model.named_modules()
    ]


def two_attentions_the_second_refusing():
    """Two attentions; the second already has a child ``attnlrp_k``, so a tap of its ``k`` fails after its ``q``
    (and all of the first attention's taps) were applied."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(InlineAttention(6), InlineAttention(6)).double()
    model[1].attnlrp_k = torch.nn.Identity()
    return model


def test_a_failure_on_the_second_module_undoes_the_first():
    model = two_attentions_the_second_refusing()
    before = snapshot(model)
    canonizer = OperandCanonizer({'InlineAttention': separate_qkv('q', 'k', 'v')})
    with pytest.raises(RuntimeError, match="InlineAttention already has an attribute 'attnlrp_k'"):
        canonizer.apply(model)
    assert snapshot(model) == before
    assert not any(name.startswith('attnlrp_') for name, _ in model[0].named_children())
    # through a composite, after a first canonizer that succeeded on both modules
    first = InlineActivationCanonizer({'InlineAttention': ('tanh',)})
    with pytest.raises(RuntimeError, match="already has an attribute 'attnlrp_k'"):
        with AttnLRPEpsilon(canonizers=[first, canonizer]).context(model):
            pass  # pragma: no cover
    assert snapshot(model) == before
    assert sum(len(module._forward_hooks) + len(module._forward_pre_hooks) for module in model.modules()) == 0


class Settings:
    """A configuration whose ``frozen`` attribute refuses to be set where ``refuse`` is true."""

    def __init__(self, refuse):
        self.__dict__.update(experts='grouped', value=0, refuse=refuse)

    def __setattr__(self, key, value):
        if key == 'frozen' and self.refuse:
            raise AttributeError('frozen cannot be set')
        super().__setattr__(key, value)


class Configured(torch.nn.Module):
    def __init__(self, refuse):
        super().__init__()
        self.config = Settings(refuse)
        self.config.__dict__['frozen'] = 'no'


def test_a_setting_that_fails_undoes_the_values_set_before():
    """The second configuration refuses its second value: the first value of it and both values of the first
    configuration are put back."""
    model = torch.nn.Sequential(Configured(False), Configured(True))
    with pytest.raises(AttributeError, match='frozen cannot be set'):
        SettingCanonizer({'experts': 'eager', 'frozen': 'yes'}).apply(model)
    for module in model:
        assert (module.config.experts, module.config.frozen) == ('grouped', 'no')
