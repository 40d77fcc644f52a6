"""The engine's audit (:py:mod:`zennit_attn.core.audit`): what a model computes outside the engine's view is refused
by name, or explained exactly; never the plain gradient in silence.

Each model is a tiny transformer written here (float64, no biases), explained by CP-LRP for the relevance of its
largest last-position logit: the input relevance must sum to that logit (1e-10), or the model is refused. Before the
audit (issue 40; relevance / logit on these models) they were explained wrongly without a word: blocks under a
reentrant checkpoint 1.032, a TorchScript MLP 1.079, heads run by ``torch.vmap`` 1.054, zennit's own rules beside
CP-LRP -405, layer scales held in a Python list 1.272, a temperature attribute 0.5, a tanh under
``DisableTorchFunction`` 0.54, a tensor changed in place under ``torch.no_grad()`` 1.263 or through ``x.detach()`` or
``x.data`` 0.5, a pre-hook inside a norm 0.443, a gradient hook that doubles the gradient 2.0; a hook on the final
LayerNorm was dropped (the model without it explained) and one on an RMSNorm halved the relevance; a non-reentrant
checkpoint raised torch's ``CheckpointError``. A language model called inside the context with the key-value cache of
earlier tokens kept their relevance in the cache: the explained tokens' relevance summed to 0.065 and to 1.046 of the
logit in two tiny Llamas.
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
import transformers
import zennit.composites
import zennit.rules
from torch import nn
from torch.utils.checkpoint import checkpoint

from tests.models import tiny_model, token_ids
from zennit_attn import explain
from zennit_attn.canonizers.checkpointing import checkpointed
from zennit_attn.composites import CPLRPEpsilon
from zennit_attn.core.errors import UnsupportedModelError

DIM, HEADS, LENGTH, CLASSES = 8, 2, 5, 7


class RMSNorm(nn.Module):
    """An RMSNorm written as Hugging Face writes it (the engine gives it the rule of its name)."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Attention(nn.Module):
    def __init__(self, per_head: bool = False):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))
        self.per_head = per_head

    def forward(self, x):
        batch, length, _ = x.shape
        q, k, v = (f(x).view(batch, length, HEADS, -1).transpose(1, 2) for f in (self.q, self.k, self.v))

        def head(q, k, v):
            return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(DIM // HEADS), -1) @ v

        y = torch.vmap(head, in_dims=1, out_dims=1)(q, k, v) if self.per_head else head(q, k, v)
        return self.o(y.transpose(1, 2).reshape(batch, length, DIM))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate, self.up = nn.Linear(DIM, 2 * DIM, bias=False), nn.Linear(DIM, 2 * DIM, bias=False)
        self.down, self.act = nn.Linear(2 * DIM, DIM, bias=False), nn.SiLU()

    def forward(self, x):
        return self.down(self.act(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, norm, per_head: bool = False):
        super().__init__()
        self.norm1, self.attn, self.norm2, self.mlp = norm(DIM), Attention(per_head), norm(DIM), MLP()

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Model(nn.Module):
    """Two blocks, a final norm and a head; ``run(block, x)`` runs each block (a checkpoint, ...)."""

    def __init__(self, norm=nn.LayerNorm, per_head: bool = False, run=None):
        super().__init__()
        self.blocks = nn.ModuleList(Block(norm, per_head) for _ in range(2))
        self.norm, self.head = norm(DIM), nn.Linear(DIM, CLASSES, bias=False)
        self.run = run

    def forward(self, x):
        for block in self.blocks:
            x = self.run(block, x) if self.run is not None else block(x)
        return self.head(self.norm(x))


def build(model_class=Model, **kwargs) -> nn.Module:
    """A seeded float64 ``model_class`` without biases (LayerNorm weights around 1), in eval mode."""
    torch.manual_seed(0)
    model = model_class(**kwargs).double().eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith('bias'):
                parameter.zero_()
            elif isinstance(model.get_submodule(name.rsplit('.', 1)[0]), nn.LayerNorm):
                parameter.uniform_(0.5, 1.5)
    return model


def inputs() -> torch.Tensor:
    return torch.randn(1, LENGTH, DIM, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


def explained(model: nn.Module, context=contextlib.nullcontext) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input relevance sum, logit)`` of CP-LRP for the relevance of the largest last-position logit (given as its
    value), with ``context(modified model)`` entered inside the composite's context."""
    leaf = inputs().requires_grad_(True)
    with CPLRPEpsilon().context(model) as modified, context(modified):
        logit = modified(leaf)[0, -1].max()
        logit.backward(logit.detach())
    return torch.zeros((), dtype=leaf.dtype) if leaf.grad is None else leaf.grad.sum(), logit.detach()


def assert_conserved(model: nn.Module, context=contextlib.nullcontext) -> torch.Tensor:
    """CP-LRP's input relevance sums to the explained logit (1e-10); returns the logit."""
    total, logit = explained(model, context)
    torch.testing.assert_close(total, logit, rtol=1e-10, atol=0)
    return logit


def plain_logit(model: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(inputs())[0, -1].max()


def refused(model: nn.Module, *words: str, context=contextlib.nullcontext) -> str:
    """The message of the :py:class:`UnsupportedModelError` of explaining ``model``, which names each of ``words``;
    the model is left as it was."""
    with pytest.raises(UnsupportedModelError) as error:
        explained(model, context)
    message = str(error.value)
    for word in words:
        assert word in message, message
    assert all(parameter.requires_grad for parameter in model.parameters())
    return message


def test_the_tiny_model_conserves():
    """The reference: the model as written is explained exactly."""
    assert_conserved(build())
    assert_conserved(build(norm=RMSNorm))


# ------------------------------------------------------------------------------------------------ checkpointing
def test_reentrant_checkpoint_is_refused():
    """Blocks under ``checkpoint(..., use_reentrant=True)`` run without gradients and are run again in the backward
    pass outside the engine (3.2% off before): refused where the output of the last one meets the final norm."""
    model = build(run=lambda block, x: checkpoint(block, x, use_reentrant=True))
    refused(model, 'use_reentrant=True', "LayerNorm in 'norm' (LayerNorm)", 'explain(..., checkpointing=True)')


def test_non_reentrant_checkpoint_is_refused():
    """Blocks under ``checkpoint(..., use_reentrant=False)`` would be recomputed in the backward pass without the
    rules (torch's CheckpointError before): refused while the block runs."""
    model = build(run=lambda block, x: checkpoint(block, x, use_reentrant=False))
    refused(model, 'use_reentrant=False', "'blocks.0", 'explain(..., checkpointing=True)')


def test_the_engines_checkpointing_conserves():
    """The engine's own checkpointing (``explain(..., checkpointing=True)``) recomputes the blocks with the rules:
    sanctioned, and exact."""
    model = build()
    without = assert_conserved(model)
    torch.testing.assert_close(
        assert_conserved(model, context=lambda modified: checkpointed(modified, list(modified.blocks))), without
    )


# ------------------------------------------------------------------------------------------------ compiled code
@pytest.mark.parametrize('compile', ['script', 'trace'])
def test_torchscript_submodule_is_refused(compile):
    """An MLP compiled by TorchScript runs outside the mode: its gate would get its plain gradient (7.9% off before).
    The refusal names the TorchScript module and the block that uses its output."""
    model = build()
    mlp = model.blocks[0].mlp
    with pytest.warns(Warning) if compile == 'trace' else contextlib.nullcontext():
        model.blocks[0].mlp = torch.jit.script(mlp) if compile == 'script' else torch.jit.trace(mlp, inputs())
    refused(model, 'TorchScript', "'blocks.0.mlp'", "add in 'blocks.0' (Block)")


def test_vmap_attention_is_refused():
    """Attention per head by ``torch.vmap``: the functorch transform runs outside the mode (5.4% off before)."""
    refused(build(per_head=True), 'torch.vmap', "'blocks.0.attn' (Attention)")


def test_an_operation_outside_the_mode_is_refused():
    """The audit is load-bearing: a tanh computed under ``torch._C.DisableTorchFunction`` (unseen by the classifying
    mode, so without the identity rule) is refused; the same model computing it in the mode conserves."""

    class Hidden(Model):
        def __init__(self, hide: bool):
            super().__init__()
            self.hide = hide

        def forward(self, x):
            with torch._C.DisableTorchFunction() if self.hide else contextlib.nullcontext():
                x = torch.tanh(x)
            return super().forward(x)

    assert_conserved(build(Hidden, hide=False))
    refused(
        build(Hidden, hide=True), 'DisableTorchFunction', "LayerNorm in 'blocks.0.norm1' (LayerNorm)", 'TanhBackward'
    )


# ------------------------------------------------------------------------------------------------ hooks
@pytest.mark.parametrize('norm', [nn.LayerNorm, nn.RMSNorm, RMSNorm])
def test_hook_on_a_norm_is_explained(norm):
    """A forward hook that scales the output of the final norm (a steering hook) is part of the explained model: the
    logit is the hooked model's (the LayerNorm's hook was dropped before, the RMSNorm's halved the relevance), and
    CP-LRP conserves it."""
    model = build(norm=norm)
    unhooked = plain_logit(model)
    model.norm.register_forward_hook(lambda module, args, output: output * 2)
    torch.testing.assert_close(assert_conserved(model), 2 * unhooked, rtol=1e-12, atol=0)


def test_pre_hooks_before_the_composite_are_explained():
    """Forward pre-hooks registered before the composite change the inputs of a block and of a norm inside the mode:
    explained (a tanh gets its identity rule)."""
    model = build()
    model.blocks[1].register_forward_pre_hook(lambda module, args: (torch.tanh(args[0]),))
    model.norm.register_forward_pre_hook(lambda module, args: (args[0] * 3,))
    assert_conserved(model)


def test_pre_hook_inside_a_norm_is_refused():
    """A pre-hook registered after the composite on a norm runs inside the norm, where the mode leaves the operations
    to the norm's rule: refused."""

    @contextlib.contextmanager
    def hooked(modified):
        handle = modified.norm.register_forward_pre_hook(lambda module, args: (torch.tanh(args[0]),))
        yield
        handle.remove()

    refused(
        build(), "LayerNorm in 'norm' (LayerNorm): an input computed outside the engine", 'pre-hook', context=hooked
    )


class GradientHooked(Model):
    """Registers a gradient hook on the output of its first block; ``change``: the hook doubles the gradient."""

    def __init__(self, change: bool):
        super().__init__()
        self.change = change
        self.seen = []

    def forward(self, x):
        x = self.blocks[0](x)
        x.register_hook(lambda grad: grad * 2 if self.change else self.seen.append(grad))
        return self.head(self.norm(self.blocks[1](x)))


def test_gradient_hook_inside_the_forward():
    """A gradient hook registered inside the forward that reads the gradient (latent recording) leaves the
    explanation exact; one that changes it is refused in the backward pass."""
    model = build(GradientHooked, change=False)
    assert_conserved(model)
    assert len(model.seen) == 1
    with pytest.raises(UnsupportedModelError, match=r'changes a gradient with a hook registered inside its forward'):
        explained(build(GradientHooked, change=True))


def _doubled(module, gradients):
    return tuple(None if gradient is None else 2 * gradient for gradient in gradients)


BACKWARD_HOOKS = {
    'backward hook': lambda module: module.register_backward_hook(lambda m, grad_in, grad_out: _doubled(m, grad_in)),
    'full backward hook': lambda module: module.register_full_backward_hook(
        lambda m, grad_in, grad_out: _doubled(m, grad_in)
    ),
    'backward pre-hook': lambda module: module.register_full_backward_pre_hook(_doubled),
}


@pytest.mark.parametrize('path', ['blocks.0', 'blocks.0.attn', 'blocks.0.mlp', 'blocks.0.mlp.down', 'norm'])
@pytest.mark.parametrize('hook', sorted(BACKWARD_HOOKS))
def test_backward_hooks_are_refused(hook, path):
    """A module backward hook runs in the relevance pass on the rules' modified gradient; one that returns a gradient
    changes the relevance. Refused by name, registered before the composite or inside its context. Before, a hook of
    ``register_backward_hook`` that doubles the gradient passed in silence (CP-LRP's relevance / logit 2.0 at a block
    or the final norm, 1.056 at the MLP, 0.992 at the attention), the full hooks were refused as a kernel's output."""
    model = build()
    handle = BACKWARD_HOOKS[hook](model.get_submodule(path))
    kind = 'backward pre-hook' if 'pre' in hook else 'backward hook'
    refused(model, f"a {kind} on '{path}' ({type(model.get_submodule(path)).__name__}, register_")
    handle.remove()
    assert_conserved(model)

    @contextlib.contextmanager
    def hooked(modified):
        inner = BACKWARD_HOOKS[hook](modified.get_submodule(path))
        try:
            yield
        finally:
            inner.remove()

    refused(model, f"a {kind} on '{path}'", context=hooked)
    assert not any(module._backward_hooks or module._backward_pre_hooks for module in model.modules())


def _scaled_norms(module, args, output):
    return output * 1.5 if isinstance(module, nn.LayerNorm) else None


def _scaled_norm_inputs(module, args):
    return (args[0] * 1.5, *args[1:]) if isinstance(module, nn.LayerNorm) else None


GLOBAL_HOOKS = {
    'backward hook': lambda: torch.nn.modules.module.register_module_full_backward_hook(lambda m, gi, go: None),
    'forward hook': lambda: torch.nn.modules.module.register_module_forward_hook(_scaled_norms),
    'forward pre-hook': lambda: torch.nn.modules.module.register_module_forward_pre_hook(_scaled_norm_inputs),
}


@pytest.mark.parametrize('hook', sorted(GLOBAL_HOOKS))
def test_global_module_hooks_are_refused(hook):
    """torch's global module hooks: backward hooks run on every module's modified gradient, forward hooks before the
    rules' hooks of every module (the rules of the norms then undo or miss their change), forward pre-hooks on the
    model before the mode is entered: refused by name. Before, a global forward hook that scales the LayerNorms'
    outputs by 1.5 got CP-LRP's relevance of another logit than the model's, in silence (0.643 for the model's 0.912);
    the same hook registered on each LayerNorm is explained exactly."""
    model = build()
    handle = GLOBAL_HOOKS[hook]()
    try:
        refused(model, f'a global {hook} on every module')
    finally:
        handle.remove()
    assert_conserved(model)
    if hook == 'forward hook':  # on the modules themselves: seen by the mode, after the rules
        handles = [module.register_forward_hook(_scaled_norms) for module in model.modules()]
        logit = assert_conserved(model)
        torch.testing.assert_close(logit, plain_logit(model), rtol=1e-12, atol=0)
        for each in handles:
            each.remove()


def test_zennit_rules_beside_the_composite_are_refused():
    """zennit's own rules registered beside CP-LRP (-405 times the logit before): refused when registered first (at
    the composite's registration) and when registered inside its context (when the model runs)."""
    model = build()
    rules = zennit.composites.LayerMapComposite([(nn.Linear, zennit.rules.Epsilon())])
    with rules.context(model), pytest.raises(RuntimeError, match=r'already has zennit rules registered \(Epsilon at'):
        explained(model)
    assert not any(module._forward_hooks for module in model.modules())
    refused(model, 'zennit rule', "'blocks.0.attn.q' (Linear)", context=rules.context)


# ------------------------------------------------------------------------------------------------ tensors
class ListScaled(Model):
    """Layer scales held in a Python list: parameters the module does not register."""

    def __init__(self):
        super().__init__()
        self.scales = [nn.Parameter(torch.rand(DIM) + 0.5) for _ in self.blocks]

    def forward(self, x):
        for block, scale in zip(self.blocks, self.scales):
            x = x + scale.to(x.dtype) * (block(x) - x)
        return self.head(self.norm(x))


class Tempered(Model):
    """A learnable temperature set as a plain attribute (not registered)."""

    def __init__(self):
        super().__init__()
        self.temperature = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)

    def forward(self, x):
        return super().forward(x) * self.temperature


@pytest.mark.parametrize('model_class', [ListScaled, Tempered])
def test_unregistered_gradient_tensors_are_refused(model_class):
    """Tensors that require a gradient without being registered parameters were taken for relevance-carrying factors
    (relevance 1.272 and 0.5 times the logit before): refused, saying how to register them."""
    refused(build(model_class), 'neither an input of the model nor computed from one', 'nn.ParameterList')


def test_registered_scales_conserve():
    """The same scales registered (``nn.ParameterList``) are frozen constants: exact."""

    class Registered(ListScaled):
        def __init__(self):
            super().__init__()
            self.scales = nn.ParameterList(self.scales)

    assert_conserved(build(Registered))


def test_leaf_made_inside_the_forward_is_an_input():
    """A tensor made a leaf inside the forward (``detach().requires_grad_()``, where a caller reads relevance) is an
    explained input: the relevance of the blocks after it sums to the logit there."""

    class Cut(Model):
        def forward(self, x):
            self.leaf = self.blocks[0](x).detach().requires_grad_()
            return self.head(self.norm(self.blocks[1](self.leaf)))

    model = build(Cut)
    total, logit = explained(model)
    assert float(total) == 0.0  # no relevance reaches the input: the leaf cuts the graph
    torch.testing.assert_close((model.leaf.grad * model.leaf).sum(), logit, rtol=1e-10, atol=0)


class Subclass(torch.Tensor):
    """A tensor subclass with a ``__torch_function__`` of its own (it doubles every product)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        output = super().__torch_function__(func, types, args, kwargs)
        if func in (torch.mul, torch.Tensor.mul, torch.Tensor.__mul__):
            output = super().__torch_function__(torch.Tensor.mul, types, (output, 2))
        return output


def test_tensor_subclass_is_refused():
    """An input of a subclass that computes its operations itself runs them outside the mode: refused."""
    model = build()
    leaf = inputs().as_subclass(Subclass).requires_grad_(True)
    with pytest.raises(UnsupportedModelError, match=r'the subclass Subclass with a __torch_function__ of its own'):
        with CPLRPEpsilon().context(model) as modified:
            modified(leaf)


class Functional(Model):
    """Runs the MLPs with ``torch.func.functional_call``: with the modules' own parameters, or (``fast``) with copies
    that require a gradient, kept in plain dicts (fast weights, not registered)."""

    def __init__(self, fast: bool = False):
        super().__init__()
        self.fast = (
            [
                {name: value.detach().double().requires_grad_() for name, value in block.mlp.named_parameters()}
                for block in self.blocks
            ]
            if fast
            else None
        )

    def forward(self, x):
        for index, block in enumerate(self.blocks):
            x = x + block.attn(block.norm1(x))
            given = dict(block.mlp.named_parameters()) if self.fast is None else self.fast[index]
            x = x + torch.func.functional_call(block.mlp, given, (block.norm2(x),))
        return self.head(self.norm(x))


def test_functional_call():
    """``torch.func.functional_call`` with a module's own parameters is explained; with unregistered tensors that
    require a gradient it is refused (they would be relevance-carrying factors of every linear layer)."""
    assert_conserved(build(Functional))
    refused(build(Functional, fast=True), "linear in 'blocks.0.mlp.gate' (Linear)", 'neither an input of the model')


@pytest.mark.parametrize('parametrization', ['symmetric', 'weight_norm'])
def test_parametrized_weights_conserve(parametrization):
    """Weights computed in the forward from registered parameters (``torch.nn.utils.parametrize``, weight norm) are
    constants of the frozen parameters: exact."""

    class Symmetric(nn.Module):
        def forward(self, weight):
            return weight.triu() + weight.triu(1).transpose(0, 1)

    model = build()
    for block in model.blocks:
        if parametrization == 'symmetric':
            torch.nn.utils.parametrize.register_parametrization(block.attn.o, 'weight', Symmetric())
        else:
            torch.nn.utils.parametrizations.weight_norm(block.mlp.down)
    assert_conserved(model)


def test_writes_into_views_and_properties_conserve():
    """In-place writes into a slice of a buffer and of a relevance-carrying tensor, and the ``.T`` / ``.mT`` views,
    are operations the engine saw: exact."""

    class Written(Model):
        def forward(self, x):
            buffer = torch.zeros_like(x)
            buffer[:, 1:] = x[:, :-1]  # a shift written into a constant tensor
            x = x + buffer
            x[..., :2] *= 3  # a write into a view of a relevance-carrying tensor
            x = (x.mT.mT + x.T.T) / 2
            return super().forward(x)

    assert_conserved(build(Written))


def test_custom_autograd_function_is_refused():
    """An autograd function of the model's own is a kernel whose backward the engine does not know: refused."""

    class Doubled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return torch.tanh(x)

        @staticmethod
        def backward(ctx, grad):
            return grad

    class Kernel(Model):
        def forward(self, x):
            return super().forward(Doubled.apply(x))

    refused(build(Kernel), 'custom autograd function', 'Doubled')


def test_steering_hook_on_llamas_final_norm_explained():
    """``explain(method='cplrp')`` on a tiny Llama (float64, no biases) with a hook that scales its final RMSNorm's
    output: the hooked model's logit, and token relevance that sums to it (half of it before)."""
    model = tiny_model('llama', zero_bias=True)
    ids = token_ids('llama', 6, 1, seed=3)
    plain = explain(model, ids, method='cplrp')
    handle = model.model.norm.register_forward_hook(lambda module, args, output: output * 2)
    try:
        hooked = explain(model, ids, method='cplrp', target=plain.target)
    finally:
        handle.remove()
    torch.testing.assert_close(hooked.logit, 2 * plain.logit, rtol=1e-12, atol=0)
    torch.testing.assert_close(hooked.relevance.sum(-1), hooked.logit, rtol=1e-10, atol=0)


def test_in_place_change_without_gradients_is_refused():
    """A relevance-carrying tensor changed in place under ``torch.no_grad()`` inside the forward: the backward pass
    does not know the change (relevance half the logit before); refused where the tensor is used next (its version
    changed)."""

    class Unseen(Model):
        def forward(self, x):
            x = self.blocks[0](x)
            with torch.no_grad():
                x[..., :4] *= 2
            return self.head(self.norm(self.blocks[1](x)))

    refused(build(Unseen), 'changed in place after the engine saw it', 'torch.no_grad()', "'blocks.1.norm1'")


@pytest.mark.parametrize('alias', ['detach', 'data'])
def test_change_through_an_alias_is_refused(alias):
    """A relevance-carrying tensor changed in place through ``x.detach()`` (relevance half the logit before: seen by
    its version) or ``x.data`` (refused where it is read)."""

    class Aliased(Model):
        def forward(self, x):
            x = self.blocks[0](x)
            (x.detach() if alias == 'detach' else x.data).mul_(2)
            return self.head(self.norm(self.blocks[1](x)))

    words = ('changed in place after the engine saw it', "LayerNorm in 'blocks.1.norm1'")
    refused(build(Aliased), *(words if alias == 'detach' else ('x.data of a relevance-carrying tensor',)))


# ------------------------------------------------------------------------------------------------ caches
def test_a_cache_of_earlier_tokens_is_refused():
    """A language model called with the key-value cache of earlier tokens (as generation calls it) explains the new
    tokens only: the cached keys and values are constants that keep the earlier tokens' relevance (CP-LRP: the new
    tokens' relevance summed to 1.046 of the logit here). Refused, naming the argument; an empty cache, which the
    forward fills, is no constant: CP-LRP conserves the logit with it."""
    model = tiny_model('llama')
    ids = token_ids('llama', 5)
    with torch.no_grad():
        cache = model(ids[:, :3], use_cache=True).past_key_values
    leaf = model.get_input_embeddings()(ids[:, 3:]).detach().requires_grad_(True)
    with pytest.raises(UnsupportedModelError, match='past_key_values holding 3 earlier tokens'):
        with CPLRPEpsilon().context(model) as modified:
            modified(inputs_embeds=leaf, past_key_values=cache)
    assert all(parameter.requires_grad for parameter in model.parameters())
    leaf = model.get_input_embeddings()(ids).detach().requires_grad_(True)
    with CPLRPEpsilon().context(model) as modified:
        logit = modified(inputs_embeds=leaf, past_key_values=transformers.DynamicCache()).logits[0, -1].max()
        logit.backward(logit.detach())
    torch.testing.assert_close(leaf.grad.sum(), logit.detach(), rtol=1e-10, atol=0)
