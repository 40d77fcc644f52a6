"""The general mechanism: operand taps and inline-function routing against explicit-module implementations."""
import pytest
import torch

from zennit_attn.canonizers import InlineActivationCanonizer, OperandCanonizer
from zennit_attn.canonizers.families import separate_qkv
from zennit_attn.composites import AttnLRPEpsilon, CPLRPEpsilon
from zennit_attn.layers import MatMul


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


def assert_close(actual, expected, tol=1e-10):
    assert float((actual - expected).abs().max()) <= tol * float(expected.abs().max())


@pytest.mark.parametrize('composite_cls', [AttnLRPEpsilon, CPLRPEpsilon])
def test_operand_taps_equal_explicit_matmul_and_softmax_rules(composite_cls):
    """Operands scaled at q/k/v == Prop. 3.3 on both MatMul modules with Prop. 3.1 on the softmax module
    (AttnLRP), or the attention matrix as constant (CP-LRP)."""
    inline, module = pair(InlineAttention, ModuleAttention)
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    tapped = relevance(inline, composite_cls(canonizers=[OperandCanonizer({'InlineAttention': separate_qkv('q', 'k', 'v')})]), x)
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
    return (
        not any(name.split('.')[-1].startswith('attnlrp_') for name, _ in model.named_modules())
        and not any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks for m in model.modules())
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
