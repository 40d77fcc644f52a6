"""Everything the engine and the composites change on a model is put back: after the block, when the block raises,
and when registering fails half-way."""

import pytest
import torch

from zennit_attn.composites import AttnLRPEpsilon, CPLRPEpsilon


class InlineAttention(torch.nn.Module):
    """Single-head attention computed inline, as Hugging Face does, with a tanh head."""

    def __init__(self, dim: int = 6):
        super().__init__()
        self.q, self.k, self.v, self.o = (torch.nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.act = torch.nn.GELU()

    def forward(self, x):
        scores = self.q(x) @ self.k(x).transpose(-1, -2) / x.shape[-1] ** 0.5
        return torch.tanh(self.o(self.act(scores.softmax(-1) @ self.v(x)))) + x


def snapshot(model: torch.nn.Module) -> list:
    """Everything a composite may change on a module tree: children, hooks (by identity), flags, config values and the
    parameters (their objects and ``requires_grad``)."""
    return [
        (
            name,
            type(module),
            dict(module._modules),
            dict(module._forward_hooks),
            dict(module._forward_pre_hooks),
            dict(module._forward_hooks_always_called),
            dict(module._backward_hooks),
            dict(getattr(module, 'config', None).__dict__) if hasattr(module, 'config') else None,
            [
                (id(parameter), parameter.requires_grad)
                for parameter in module._parameters.values()
                if parameter is not None
            ],
            {key: value for key, value in module.__dict__.items() if not key.startswith('_')},
        )
        for name, module in model.named_modules()
    ]


@pytest.mark.parametrize('composite', [AttnLRPEpsilon, CPLRPEpsilon])
def test_the_block_leaves_the_model_as_it_was(composite):
    """After the block, also one that raises, the model is as before (a user's own hook survives) and no torch
    function mode is left on the stack."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(InlineAttention()).double()
    model[0].q.register_forward_hook(lambda *args: None)  # a user's own hook must survive
    before = snapshot(model)
    depth = torch._C._len_torch_function_stack()
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    with composite().context(model) as modified:
        modified(x).sum().backward()
    assert snapshot(model) == before and torch._C._len_torch_function_stack() == depth
    with pytest.raises(RuntimeError, match='shapes cannot be multiplied'):
        with composite().context(model) as modified:
            modified(x[:, :3])  # 3 features: fails inside the forward, with the mode entered
    assert snapshot(model) == before and torch._C._len_torch_function_stack() == depth


def test_a_second_composite_on_the_same_model_is_refused_cleanly():
    model = InlineAttention().double()
    before = snapshot(model)
    with AttnLRPEpsilon().context(model):
        inside = snapshot(model)
        with pytest.raises(RuntimeError, match='another zennit-attn composite'):
            with CPLRPEpsilon().context(model):
                pass  # pragma: no cover
        assert snapshot(model) == inside
    assert snapshot(model) == before


class Settings:
    """A configuration that refuses to change its attention implementation."""

    def __init__(self):
        self.__dict__.update(_attn_implementation_internal='flash_attention_2', value=0)

    @property
    def _attn_implementation(self):
        return self._attn_implementation_internal

    def __setattr__(self, key, value):
        if key == '_attn_implementation_internal':
            raise AttributeError('the attention implementation cannot be changed')
        super().__setattr__(key, value)


class Configured(InlineAttention):
    def __init__(self):
        super().__init__()
        self.config = Settings()


def test_a_failure_while_registering_undoes_what_was_done():
    """A configuration that refuses the engine's setting (after the relevance boundary and the engine's first
    changes): the registration fails and the model is as before."""
    model = torch.nn.Sequential(InlineAttention(), Configured()).double()
    before = snapshot(model)
    with pytest.raises(AttributeError, match='cannot be changed'):
        with AttnLRPEpsilon().context(model):
            pass  # pragma: no cover
    assert snapshot(model) == before
