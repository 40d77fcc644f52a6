"""Registration guards of the AttnLRP composites: compiled models are refused, and a composite holds one model
at a time (no silent unhooking of the first model, no two sets of rules on one model); AttnLRP with constant
attention in the later blocks (:py:class:`~zennit_attn.composites.AttnLRPLateEpsilon`)."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.models import tiny_model, token_ids
from zennit_attn import conservation, explain
from zennit_attn.composites import (
    AttnLRPEpsilon,
    AttnLRPGamma,
    AttnLRPLateEpsilon,
    CPLRPEpsilon,
    CPLRPGamma,
    RelPEpsilon,
)
from zennit_attn.composites.attnlrp import refuse_compiled
from zennit_attn.core.errors import CompiledModelError, UnsupportedModelError

COMPOSITES = (AttnLRPEpsilon, CPLRPEpsilon, AttnLRPGamma, CPLRPGamma)


def _snapshot(model: torch.nn.Module) -> dict:
    """Everything registration may touch: each module's identity, its attributes (rebinding, adding or removing
    one changes the snapshot), the entries of its dictionaries (hooks, submodules, parameters, buffers) and the
    configuration's values."""
    modules = {}
    for name, module in model.named_modules():
        attributes = {}
        for key, value in vars(module).items():
            entries = tuple((k, id(v)) for k, v in value.items()) if isinstance(value, dict) else None
            attributes[key] = (id(value), entries)
        modules[name] = (id(module), type(module), attributes)
    config = getattr(model, 'config', None)
    return {'modules': modules, 'config': dict(vars(config)) if config is not None else None}


def _state(model: torch.nn.Module) -> dict:
    return {key: value.clone() for key, value in model.state_dict().items()}


def _assert_same_state(model, state):
    now = model.state_dict()
    assert now.keys() == state.keys()
    assert all(torch.equal(now[key], state[key]) for key in state)


def _hook_counts(model: torch.nn.Module) -> int:
    return sum(len(module._forward_hooks) + len(module._forward_pre_hooks) for module in model.modules())


def _relevance_in_context(model, ids, target):
    """The relevance per token of the last position's ``target`` logit, read as the gradient at the input
    embeddings of the already hooked ``model`` (what explain() computes inside the composite's context)."""
    with torch.enable_grad():
        embeddings = model.get_input_embeddings()(ids).detach().requires_grad_(True)
        logits = model(inputs_embeds=embeddings).logits[:, -1]
        logit = logits.gather(-1, target.view(-1, 1))[:, 0]
        (gradient,) = torch.autograd.grad(logit, embeddings, grad_outputs=logit.detach())
    return gradient.sum(-1)


# ------------------------------------------------------------------------------------------- compiled models
def test_refuses_torch_compile_wrapper():
    ids = token_ids('llama')
    expected = explain(tiny_model('llama'), ids)
    compiled = torch.compile(tiny_model('llama'), backend='eager')
    for method in ('attnlrp', 'cplrp'):
        with pytest.raises(CompiledModelError, match=r'LlamaForCausalLM') as info:
            explain(compiled, ids, method=method)
        message = str(info.value)
        assert 'torch.compile' in message and '_orig_mod' in message, message
    with pytest.raises(CompiledModelError, match=r'_orig_mod'):
        conservation(compiled, ids)
    # the advice works: the wrapped model gives exactly the relevance of an uncompiled one
    explanation = explain(compiled._orig_mod, ids)
    torch.testing.assert_close(explanation.relevance, expected.relevance, rtol=1e-12, atol=1e-12)
    assert torch.equal(explanation.target, expected.target)


def test_refuses_compiled_in_place():
    ids = token_ids('llama')
    expected = explain(tiny_model('llama'), ids).relevance
    model = tiny_model('llama')
    model.compile(backend='eager')
    with pytest.raises(CompiledModelError, match=r'LlamaForCausalLM') as info:
        explain(model, ids)
    message = str(info.value)
    assert 'in place' in message and 'uncompiled' in message and 'hooks' in message, message
    with pytest.raises(CompiledModelError, match=r'in place'):
        conservation(model, ids)
    assert _hook_counts(model) == 0
    # the suggested copy.deepcopy drops the in-place compilation and explains correctly
    torch.testing.assert_close(explain(copy.deepcopy(model), ids).relevance, expected, rtol=1e-12, atol=1e-12)


def test_refuses_compiled_submodule():
    ids = token_ids('llama')
    model = tiny_model('llama')
    model.model.layers[1].compile(backend='eager')
    with pytest.raises(CompiledModelError, match=r"LlamaForCausalLM.*'model\.layers\.1'.*LlamaDecoderLayer"):
        explain(model, ids)
    wrapped = tiny_model('llama')
    wrapped.model.layers[0] = torch.compile(wrapped.model.layers[0], backend='eager')
    with pytest.raises(CompiledModelError, match=r"'model\.layers\.0'.*_orig_mod"):
        explain(wrapped, ids)


@pytest.mark.parametrize('composite_class', COMPOSITES, ids=lambda cls: cls.__name__)
def test_register_refuses_compiled(composite_class):
    model = tiny_model('llama')
    compiled = torch.compile(model, backend='eager')
    with pytest.raises(CompiledModelError, match='_orig_mod'):
        composite_class().register(compiled)
    assert _hook_counts(compiled) == 0


def test_refuse_compiled_function():
    model = tiny_model('llama')
    assert refuse_compiled(model) is None
    with pytest.raises(CompiledModelError, match='_orig_mod'):
        refuse_compiled(torch.compile(model, backend='eager'))
    model.model.norm.compile(backend='eager')
    with pytest.raises(CompiledModelError, match=r"'model\.norm'"):
        refuse_compiled(model)
    with pytest.raises(CompiledModelError, match='in place'):
        refuse_compiled(model.model.norm)


# -------------------------------------------------------------------------------------- one model at a time
def test_same_composite_nested_on_one_model():
    ids = token_ids('llama')
    expected = explain(tiny_model('llama'), ids)
    model = tiny_model('llama')
    composite = AttnLRPEpsilon()
    with composite.context(model):
        snapshot, hooks = _snapshot(model), _hook_counts(model)
        with pytest.raises(RuntimeError, match=r'AttnLRPEpsilon is already registered to LlamaForCausalLM') as info:
            with composite.context(model):
                pass
        assert 'one model at a time' in str(info.value) and 'leave that context' in str(info.value)
        with pytest.raises(RuntimeError, match=r'already registered .* second instance, e\.g\. AttnLRPEpsilon\(\)'):
            composite.register(tiny_model('llama'))
        assert _hook_counts(model) == hooks > 0 and _snapshot(model) == snapshot
        torch.testing.assert_close(_relevance_in_context(model, ids, expected.target), expected.relevance)
    assert _hook_counts(model) == 0


def test_same_composite_on_two_models():
    ids = token_ids('llama')
    expected = explain(tiny_model('llama'), ids)
    first, second = tiny_model('llama'), tiny_model('llama', seed=1)
    second_snapshot, second_state = _snapshot(second), _state(second)
    composite = CPLRPEpsilon()
    plain_cplrp = explain(tiny_model('llama'), ids, method='cplrp').relevance
    with composite.context(first):
        torch.testing.assert_close(_relevance_in_context(first, ids, expected.target), plain_cplrp)
        with pytest.raises(RuntimeError, match=r'CPLRPEpsilon is already registered to LlamaForCausalLM'):
            with composite.context(second):
                pass
        # the first model keeps its rules, the second got nothing
        assert composite.registered_module is first
        torch.testing.assert_close(_relevance_in_context(first, ids, expected.target), plain_cplrp)
        assert _snapshot(second) == second_snapshot and _hook_counts(second) == 0
    _assert_same_state(second, second_state)
    # after the first context, the composite can be registered again, to either model
    with composite.context(second):
        assert composite.registered_module is second
    assert composite.registered_module is None
    torch.testing.assert_close(explain(first, ids, method='cplrp', composite=composite).relevance, plain_cplrp)


def test_two_composites_on_one_model():
    ids = token_ids('llama')
    expected = explain(tiny_model('llama'), ids)
    model = tiny_model('llama')
    for other in (AttnLRPEpsilon(), CPLRPEpsilon(), AttnLRPGamma()):
        with AttnLRPEpsilon().context(model):
            hooks = _hook_counts(model)
            with pytest.raises(RuntimeError, match=r'LlamaForCausalLM already has .*AttnLRPEpsilon'):
                with other.context(model):
                    pass
            assert _hook_counts(model) == hooks
            torch.testing.assert_close(_relevance_in_context(model, ids, expected.target), expected.relevance)
            assert other.registered_module is None
    # also for a submodule or a parent of the registered model
    with AttnLRPEpsilon().context(model):
        with pytest.raises(
            RuntimeError,
            match=r'LlamaModel already has AttnLRPEpsilon registered \(as part of '
            r'LlamaForCausalLM\)',
        ):
            AttnLRPEpsilon().register(model.model)
    with AttnLRPEpsilon().context(model.model):
        with pytest.raises(RuntimeError, match=r"LlamaForCausalLM already has .* at 'model'"):
            AttnLRPEpsilon().register(model)
    torch.testing.assert_close(explain(model, ids).relevance, expected.relevance)


def test_everything_restored_after_refusal_and_error():
    ids = token_ids('llama')
    first, second = tiny_model('llama'), tiny_model('llama', seed=1)
    snapshots = [_snapshot(first), _snapshot(second)]
    states = [_state(first), _state(second)]
    composite = AttnLRPEpsilon()
    with pytest.raises(ZeroDivisionError):
        with composite.context(first):
            assert composite.registered_module is first
            with pytest.raises(RuntimeError):
                composite.register(second)
            with pytest.raises(RuntimeError):
                AttnLRPEpsilon().register(first)
            1 / 0
    assert composite.registered_module is None
    for model, snapshot, state in zip((first, second), snapshots, states):
        assert _snapshot(model) == snapshot
        _assert_same_state(model, state)
    # registered again after the failed block: the same relevance as a fresh composite
    expected = explain(tiny_model('llama', seed=1), ids).relevance
    torch.testing.assert_close(explain(second, ids, composite=composite).relevance, expected)
    torch.testing.assert_close(
        explain(first, ids, composite=composite).relevance, explain(tiny_model('llama'), ids).relevance
    )


@pytest.mark.parametrize('composite_class', COMPOSITES, ids=lambda cls: cls.__name__)
def test_two_composites_on_a_model_without_taps(composite_class):
    """A plain MLP gets no operand taps, so nothing but the registration guard stops a second set of rules
    (which changes the relevance: the rules would be applied twice)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).double().eval()
    inputs = torch.randn(2, 6, dtype=torch.float64)

    def relevance():
        leaf = inputs.clone().requires_grad_(True)
        output = model(leaf)[:, 0]
        return torch.autograd.grad(output, leaf, grad_outputs=output.detach())[0]

    snapshot = _snapshot(model)
    with composite_class().context(model):
        expected, hooks = relevance(), _hook_counts(model)
        with pytest.raises(RuntimeError, match=rf'Sequential already has {composite_class.__name__}'):
            with composite_class().context(model):
                pass
        assert _hook_counts(model) == hooks
        torch.testing.assert_close(relevance(), expected, rtol=0, atol=0)
    assert _snapshot(model) == snapshot


# ------------------------------------------------------------------------- constant attention in the later blocks
def test_late_blocks_by_depth():
    llama = tiny_model('llama', num_hidden_layers=5)
    layers = list(llama.model.layers)
    assert AttnLRPLateEpsilon().late_blocks(llama) == layers[3:]  # ceil(0.5 * 5) = 3
    assert AttnLRPLateEpsilon(start=0.2).late_blocks(llama) == layers[1:]
    assert AttnLRPLateEpsilon(start=0).late_blocks(llama) == layers
    assert AttnLRPLateEpsilon(start=1).late_blocks(llama) == []
    t5 = tiny_model('t5')  # each stack by its own depth
    encoder, decoder = list(t5.encoder.block), list(t5.decoder.block)
    assert AttnLRPLateEpsilon().late_blocks(t5) == encoder[len(encoder) // 2 :] + decoder[len(decoder) // 2 :]


def test_late_ends_are_attnlrp_and_relp():
    """start=1 has no later block (AttnLRP's rules everywhere), start=0 has every block (RelP's product rules),
    to the bit; the later half is neither."""
    ids = token_ids('llama')
    model = tiny_model('llama', num_hidden_layers=4)
    attnlrp, relp = explain(model, ids).relevance, explain(model, ids, composite=RelPEpsilon()).relevance
    assert torch.equal(explain(model, ids, composite=AttnLRPLateEpsilon(start=1.0)).relevance, attnlrp)
    assert torch.equal(explain(model, ids, composite=AttnLRPLateEpsilon(start=0.0)).relevance, relp)
    half = explain(model, ids, method='attnlrp_late').relevance
    assert float((half - attnlrp).abs().max()) > 1e-6 and float((half - relp).abs().max()) > 1e-6


def _query_key_gradients(model, ids, composite) -> list[float]:
    """The largest gradient magnitude at the queries and keys of each layer in one backward pass of ``composite`` (0
    where they do not reach the logit)."""
    outputs = []
    handles = [
        projection.register_forward_hook(lambda module, args, output: outputs.append(output))
        for layer in model.model.layers
        for projection in (layer.self_attn.q_proj, layer.self_attn.k_proj)
    ]
    try:
        with torch.enable_grad(), composite.context(model):
            embeddings = model.get_input_embeddings()(ids).detach().requires_grad_(True)
            logit = model(inputs_embeds=embeddings).logits[0, -1].max()
            gradients = torch.autograd.grad(logit, outputs, allow_unused=True)  # None: detached from the logit
    finally:
        for handle in handles:
            handle.remove()
    return [0.0 if gradient is None else float(gradient.abs().max()) for gradient in gradients]


def test_late_blocks_pass_no_relevance_to_queries_and_keys():
    """In the later blocks the attention probabilities are constants: no gradient reaches their queries and keys,
    which AttnLRP's softmax rule gives one; the earlier blocks keep it."""
    model, ids = tiny_model('llama', num_hidden_layers=4), token_ids('llama')
    late = _query_key_gradients(model, ids, AttnLRPLateEpsilon())
    assert late[4:] == [0.0] * 4 and min(late[:4]) > 1e-8  # layers 2 and 3 (queries, keys), layers 0 and 1
    assert min(_query_key_gradients(model, ids, AttnLRPEpsilon())) > 1e-8


def test_late_method_label_and_refusals():
    model, ids = tiny_model('llama'), token_ids('llama')
    explanation = explain(model, ids, method='attnlrp_late')
    assert explanation.method == 'attnlrp_late'
    given = explain(model, ids, composite=AttnLRPLateEpsilon())  # the composite names its method
    assert given.method == 'attnlrp_late' and torch.equal(given.relevance, explanation.relevance)
    with pytest.raises(ValueError, match=r"composite gives the relevance of 'attnlrp_late'"):
        explain(model, ids, method='attnlrp', composite=AttnLRPLateEpsilon())
    with pytest.raises(ValueError, match=r'needs an AttnLRPLateEpsilon composite'):
        explain(model, ids, method='attnlrp_late', composite=AttnLRPEpsilon())
    for start in (1.5, -0.1, True, '0.5'):
        with pytest.raises(ValueError, match='start must be a number in'):
            AttnLRPLateEpsilon(start=start)
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    snapshot = _snapshot(mlp)
    with pytest.raises(UnsupportedModelError, match=r'Sequential has no transformer blocks.*AttnLRPEpsilon\(\)'):
        AttnLRPLateEpsilon().register(mlp)
    assert _snapshot(mlp) == snapshot


class _InlineHead(torch.nn.Module):
    """A linear layer and logits computed with the layer's weight inline (``x @ head.weight.T``) or by the layer."""

    def __init__(self, inline: bool):
        super().__init__()
        torch.manual_seed(0)
        self.inline = inline
        self.body, self.head = torch.nn.Linear(4, 4), torch.nn.Linear(4, 3, bias=False)

    def forward(self, x):
        h = torch.tanh(self.body(x))
        return h @ self.head.weight.T if self.inline else self.head(h)


def test_an_epsilon_rule_on_a_layer_used_inline_is_refused():
    """The epsilon rule of a layer applies where the layer is called: logits computed with its weight inline would get
    the plain gradient instead, so ``AttnLRPEpsilon(epsilon=0.1)`` refuses them, naming the layer; with epsilon 0
    (nothing registered) both spellings give one relevance."""
    x = torch.randn(2, 4, dtype=torch.float64)

    def relevance(model, composite):
        leaf = x.clone().requires_grad_(True)
        with composite.context(model.double()) as modified:
            modified(leaf)[:, 0].sum().backward()
        return leaf.grad

    torch.testing.assert_close(
        relevance(_InlineHead(True), AttnLRPEpsilon()), relevance(_InlineHead(False), AttnLRPEpsilon()), rtol=0, atol=0
    )
    relevance(_InlineHead(False), AttnLRPEpsilon(epsilon=0.1))
    with pytest.raises(UnsupportedModelError, match=r"parameters of 'head' \(Linear\) outside its forward"):
        relevance(_InlineHead(True), AttnLRPEpsilon(epsilon=0.1))


class _Layer(torch.nn.Module):
    """A bias-free linear map then tanh: by a layer module, or with the parameters of a module that is not a layer
    (``F.linear``, ``addmm``, ``matmul``, ``einsum``, or ``F.linear`` with a view of a stack of weights, as
    transformers' fused experts compute)."""

    def __init__(self, spelling: str):
        super().__init__()
        torch.manual_seed(0)
        self.spelling = spelling
        self.layer = torch.nn.Linear(4, 4, bias=False)
        self.weight = torch.nn.Parameter(self.layer.weight.detach().clone())
        self.experts = torch.nn.Parameter(torch.stack([-self.weight.detach(), self.weight.detach()]))

    def forward(self, x):
        spellings = {
            'layer': lambda: self.layer(x),
            'linear': lambda: torch.nn.functional.linear(x, self.weight),
            'addmm': lambda: torch.addmm(torch.zeros(4, dtype=x.dtype), x, self.weight.T),
            'matmul': lambda: x @ self.weight.T,
            'einsum': lambda: torch.einsum('ni,oi->no', x, self.weight),
            'expert': lambda: torch.nn.functional.linear(x, self.experts[1]),
        }
        return torch.tanh(spellings[self.spelling]())


def test_a_linear_map_with_parameters_of_a_module_that_is_not_a_layer_gets_the_epsilon_rule():
    """``AttnLRPEpsilon(epsilon=0.1)`` gives a linear map that a model computes with its parameters outside a layer
    module (fused experts' weights, a router's weight) the epsilon rule of its linear layers: every spelling gets the
    layer's relevance (1e-12; before, the plain gradient: 80% of the largest relevance apart, the sum 12 against the
    rule's 8.14); a tiny Qwen3-MoE's batched experts (which gather copies of their weights) run as their loop and get
    the loop's relevance."""
    x = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))

    def relevance(model):
        leaf = x.clone().requires_grad_(True)
        with AttnLRPEpsilon(epsilon=0.1).context(model.double()) as modified:
            modified(leaf).sum().backward()
        return leaf.grad

    expected = relevance(_Layer('layer'))
    for spelling in ('linear', 'addmm', 'matmul', 'einsum', 'expert'):
        torch.testing.assert_close(relevance(_Layer(spelling)), expected, rtol=0, atol=1e-12, msg=spelling)
    found = {}
    for implementation in ('eager', 'batched_mm'):
        model = tiny_model('qwen3_moe', zero_bias=True)
        for module in model.modules():
            if getattr(module, 'config', None) is not None:
                module.config._experts_implementation = implementation
        found[implementation] = explain(model, token_ids('qwen3_moe', 6, 1), composite=AttnLRPEpsilon(epsilon=0.1))
    torch.testing.assert_close(found['batched_mm'].relevance, found['eager'].relevance, rtol=0, atol=1e-12)
