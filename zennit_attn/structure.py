"""What a transformer is made of, read from what it computes: its attention operations (where their queries, keys and
values come from, their heads, the linear layer that takes their output) and its FFN down projections, whose inputs
are the FFN neurons of the paper's section 3.5.

:py:func:`model_structure` runs one *discovery pass* per model instance: a forward pass on a small example input (five
tokens; an image of the size the model takes) during which forward hooks of this module on the instance's modules
and a :py:class:`torch.overrides.TorchFunctionMode` record the outputs of linear layers, normalisation and activation
modules, element-wise non-linearities, products of two computed tensors, matrix products, softmaxes and
``scaled_dot_product_attention`` (the operations are told apart by their declarations in the operation registry,
:py:data:`RECORDED`), each with the autograd node that computed it. The hooks and the mode are removed
when the pass ends (also after an exception), and the hooks on the model other than torch's own (a composite's
context, steering, latent recording, a user's observers) are set aside for the pass: the structure is the model's own,
whatever context it is first asked for in, and no one's hook sees the pass. The result is cached per instance (a weak
reference: the cache does not keep a model alive). What is decided rests on what the model computed, not on the
names of its classes:

- an *attention operation* is ``scaled_dot_product_attention(q, k, v)``, or a matrix product of the attention
  probabilities (a softmax over the last dimension, also cast, sliced or dropped out) with the values, where the
  softmax's logits are computed from one matrix product of the queries with the keys (``softmax(q k^T) v``, with any
  scaling, mask, bias or soft-capping between);
- the *sources* of a query, key or value are the nearest recorded tensors it is computed from; the features of a
  source that hold it are those that receive a gradient from it (fused projections: GPT-2's ``c_attn``, GPT-NeoX's
  per-head ``query_key_value``, timm's ``qkv``); a source whose features hold the operand for some tokens or heads
  only is refused;
- the *attention output projection* is the linear layer whose input is the attention output rearranged (reshaped,
  transposed, copied, cast: its gradient is the incoming gradient permuted, checked numerically), or that output
  times a gate;
- an *FFN down projection* is a linear layer whose input is, rearranged, the output of an element-wise non-linearity
  or of a product of two computed tensors (``act(gate) * up``), computed token by token from linear layers of the same
  block (checked by the gradient: the last token's output depends on the last token's inputs only, which a
  state-space scan or a convolution over positions does not);
- a block *routes* its tokens to experts (a mixture of experts, also one with a shared expert beside the routed ones)
  if it computed a top-k or an arg-max of computed scores;
- a *key scaling site* is a source of the keys (a linear layer, or a normalisation such as ``k_norm``, which would
  undo a scaling before it) from which the keys are computed linearly: scaling the site's key features of token
  ``i`` scales key ``i`` exactly, checked by Euler's identity for functions of degree one (``sum(grad * site) ==
  sum(weights * keys)``).

Transformer blocks are found from the module tree (:py:mod:`zennit_attn.core.blocks`); the discovery
pass tells which of them ran on the model's text input (a vision-language model's language model).
"""

from __future__ import annotations

import contextlib
import inspect
import weakref
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode

from .core.blocks import NoBlocksError, block_stacks
from .core.devices import input_device
from .core.kinds import LINEARS, is_activation, model_configs, norm_kind
from .core.modules import inner_text_models, is_encoder_decoder, without_cache, word_embeddings
from .operations.calls import signature, tensors_of
from .operations.registry import OPERATIONS, op_name

__all__ = [
    'StructureError',
    'Features',
    'AttentionOp',
    'ModelStructure',
    'model_structure',
    'example_inputs',
    'EXAMPLE_TOKENS',
    'EXAMPLE_DECODER_TOKENS',
]

#: Tokens of the example input of text models (of the encoder in encoder-decoder models).
EXAMPLE_TOKENS = 5
#: Tokens of the example decoder input of encoder-decoder models: fewer than the encoder's, so that the keys of an
#: attention operation tell whether it attends to the input tokens (encoder and cross-attention) or not.
EXAMPLE_DECODER_TOKENS = 3
#: Side of the example image of vision models whose configuration has no image size (SegFormer, convolutional ones):
#: divisible by the strides of their stages.
EXAMPLE_IMAGE = 64

#: Kinds of recorded tensors, in the order in which one of several records of the same tensor is preferred.
KINDS = ('linear', 'norm', 'attention', 'matmul', 'softmax', 'product', 'activation')
#: Everything recorded: what a linear layer's input is directly computed from.
_ANY = frozenset(KINDS)
#: Where the search for the product behind attention logits stops (it passes soft-capping and gates).
_LOGITS = frozenset({'linear', 'norm', 'attention', 'matmul', 'softmax'})
#: Where the search for the linear layers behind an FFN activation or product stops.
_FEEDS = frozenset({'linear', 'norm', 'attention', 'matmul', 'softmax'})


def _record_kind(entry) -> str | None:
    """The kind of record (:py:data:`KINDS`) of an operation of the registry
    (:py:class:`~zennit_attn.operations.registry.Operation`): what its rule says it computes."""
    if entry.rule in ('attention', 'softmax'):
        return entry.rule
    if entry.rule == 'product' and entry.contraction:
        return 'matmul'
    if entry.rule == 'product' and not entry.layer:  # an element-wise product (a layer's is recorded as its module)
        return 'product'
    if entry.rule in ('elementwise', 'power'):  # element-wise non-linearities (not bounds: a clip of projections)
        return 'activation'
    return None


#: The operations the discovery pass records (by the name of the registry,
#: :py:func:`~zennit_attn.operations.registry.op_name`), with the kind of their records: derived from their
#: declarations in the registry, the one home of what an operation is.
RECORDED = {
    name: kind for name, kind in ((name, _record_kind(entry)) for name, entry in OPERATIONS.items()) if kind is not None
}
#: Operations that select a few of many by computed scores (a router's choice of experts): a block that runs one on
#: computed scores routes its tokens.
ROUTING = frozenset({'topk', 'argmax'})
#: Packages whose hooks on a model the discovery pass keeps: torch's own (``weight_norm``, ``spectral_norm``,
#: pruning), which compute the weights the model runs with. Every other hook (zennit's rules, zennit-attn's
#: composites, steering and recording, a user's observers and interventions) is set aside: the structure is that of
#: the model, not of a context it is in when first asked for, and no one's hook sees the pass.
_KEPT_HOOKS = ('torch.',)
#: The hooks of a module that the discovery pass may set aside.
_HOOK_DICTS = ('_forward_pre_hooks', '_forward_hooks', '_backward_pre_hooks', '_backward_hooks')


class StructureError(ValueError):
    """A part of a model (an attention operation's keys, an FFN down projection, ...) cannot be found from what the
    model computes, or the discovery pass cannot run."""


# ------------------------------------------------------------------------------------------------------ results
@dataclass(frozen=True, eq=False)
class Features:
    """The features of a module's output (its last dimension) that hold an operand of an attention operation.

    Attributes
    ----------
    module: torch.nn.Module
        A linear layer or a normalisation module.
    mask: torch.Tensor or None
        ``[features]`` boolean mask of the output's last dimension, or None where every feature holds the operand.
    """

    module: torch.nn.Module
    mask: torch.Tensor | None = None

    def select(self, size: int) -> torch.Tensor:
        """The ``[size]`` boolean mask of the operand's features in an output whose last dimension has ``size``.

        Raises
        ------
        StructureError
            If the discovery pass saw an output of another size.
        """
        if self.mask is None:
            return torch.ones(size, dtype=torch.bool)
        if size != self.mask.numel():
            raise StructureError(
                f'{type(self.module).__name__} returned {size} features where the discovery pass saw '
                f'{self.mask.numel()}'
            )
        return self.mask


@dataclass(frozen=True, eq=False)
class AttentionOp:
    """One attention operation of a model, as the discovery pass saw it.

    Attributes
    ----------
    block: torch.nn.Module or None
        The innermost transformer block whose forward ran it (None outside blocks).
    query, key, value: tuple of Features
        The nearest linear layers whose outputs the queries, keys and values are computed from (normalisations such as
        ``k_norm`` passed); empty where they cannot be told (see :py:attr:`problems`).
    key_scaling: tuple of Features
        The nearest modules (linear layers or normalisations) whose key features scale the keys exactly; empty where
        none does (see :py:attr:`problems`).
    output: torch.nn.Module or None
        The linear layer whose input is the attention output (the heads); None where none is.
    heads: int or None
        The number of heads in the input of :py:attr:`output` (its features divided by the head dimension).
    keys: int
        The number of keys (tokens attended to) in the discovery pass.
    problems: dict of str to str
        Why a field above is empty: ``'query'``, ``'key'``, ``'value'``, ``'key_scaling'``, ``'output'`` -> reason.
    """

    block: torch.nn.Module | None
    query: tuple[Features, ...]
    key: tuple[Features, ...]
    value: tuple[Features, ...]
    key_scaling: tuple[Features, ...]
    output: torch.nn.Module | None
    heads: int | None
    keys: int
    problems: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class ModelStructure:
    """What :py:func:`model_structure` found in a model.

    Attributes
    ----------
    name: str
        The model's class name (for messages).
    stacks: list of (str, list of torch.nn.Module)
        The model's stacks of transformer blocks (:py:func:`~zennit_attn.core.blocks.block_stacks`)
        that the discovery pass ran, in module order.
    attention: tuple of AttentionOp
        Every attention operation, in the order the forward pass ran them.
    down_projections: dict of int to tuple of torch.nn.Module
        ``id(block) -> the FFN down projections called in the block``.
    routed_experts: frozenset of int
        Ids of the blocks that route their tokens to experts (that computed a top-k or an arg-max of computed
        scores).
    input_keys: int or None
        In encoder-decoder models the number of keys of an operation that attends to the input (encoder) tokens; None
        in other models (every operation does).
    sequence_first: bool
        Whether the blocks hold their hidden states ``[seq, batch, features]`` (XLNet) rather than ``[batch, seq,
        features]``.
    repeated: frozenset of int
        Ids of the blocks that ran more than once in the pass (layers that share one block: ALBERT).
    hidden_shape: tuple of int or None
        The shape of the hidden states the first block took in the pass (its first tensor input of three or more
        dimensions; None where it took none): three dimensions where the blocks hold one hidden vector per token
        (``[batch, seq, hidden]``), four where they hold several residual streams per token (the hyper-connections of
        DeepSeek-V4 and HY-V4, ``[batch, seq, streams, hidden]``; Gemma-3n's AltUp, ``[streams, batch, seq,
        hidden]``).
    calls: dict of int to int
        ``id(block) -> how many times it ran through its module call in the pass`` (absent: never; SqueezeBERT calls
        its blocks' ``forward`` directly, which runs no hook, and Mllama skips its cross-attention blocks without an
        image).
    unchained: frozenset of int
        Ids of the blocks whose hidden states in (their first argument, else their first tensor keyword) are not
        those the block before them gave out (the output, or its first element): the residual stream is passed on in
        more than one tensor (Reformer's reversible layers: its two halves).
    """

    name: str
    stacks: list[tuple[str, list[torch.nn.Module]]]
    attention: tuple[AttentionOp, ...]
    down_projections: Mapping[int, tuple[torch.nn.Module, ...]]
    routed_experts: frozenset[int]
    input_keys: int | None
    sequence_first: bool = False
    repeated: frozenset[int] = frozenset()
    hidden_shape: tuple[int, ...] | None = None
    unchained: frozenset[int] = frozenset()
    calls: Mapping[int, int] = field(default_factory=dict)

    def attention_in(self, block: torch.nn.Module) -> list[AttentionOp]:
        """The attention operations that ``block``'s forward ran (innermost block)."""
        return [op for op in self.attention if op.block is block]

    def down_projection(self, block: torch.nn.Module, layer: int) -> torch.nn.Module:
        """The FFN down projection of ``block`` (layer ``layer`` in messages).

        Raises
        ------
        StructureError
            If the block holds routed experts, or has no or several FFN down projections.
        """
        if id(block) in self.routed_experts:
            raise StructureError(
                f'its FFN is a routed mixture of experts (block {layer} of {self.name} picks experts by a top-k of '
                'computed scores), whose neurons have no fixed per-token meaning'
            )
        found = self.down_projections.get(id(block), ())
        if len(found) != 1:
            raise StructureError(
                f'block {layer} of {self.name} has {len(found)} FFN down projections (linear layers whose input is '
                'the output of an element-wise non-linearity or of a gated product computed from linear layers '
                'of the block); the FFN neurons need exactly one'
            )
        return found[0]

    def key_sites(self) -> list[Features]:
        """The modules whose key features scale the keys of every attention operation over the input tokens (all
        operations; in encoder-decoder models those of the encoder and the cross-attention), one entry per module.

        Raises
        ------
        StructureError
            If the model has no attention operation, or one whose keys cannot be scaled exactly at a module.
        """
        operations = [op for op in self.attention if self.input_keys is None or op.keys == self.input_keys]
        if not operations:
            raise StructureError(f'{self.name} computed no attention operation in the discovery pass')
        sites: dict[int, Features] = {}
        for op in operations:
            if not op.key_scaling:
                raise StructureError(
                    f'the keys of an attention operation of {self.name} cannot be scaled exactly at a module: '
                    f'{op.problems.get("key_scaling", "no source found")}'
                )
            sites.update((id(site.module), site) for site in op.key_scaling)
        return list(sites.values())


# ------------------------------------------------------------------------------------------------------ recording
@dataclass(eq=False)
class _Record:
    """A recorded tensor: ``output`` of kind ``kind`` computed from ``inputs`` (by ``module``), in ``block``."""

    kind: str
    output: torch.Tensor
    inputs: tuple[torch.Tensor, ...]
    module: torch.nn.Module | None = None
    block: torch.nn.Module | None = None
    dim: int | None = None


class Trace:
    """The tensors one discovery pass recorded, by the autograd node that computed them; and the current block."""

    def __init__(self):
        self.records: list[_Record] = []
        self.by_node: dict[object, list[_Record]] = {}
        self.blocks: list[torch.nn.Module] = []
        self.routing: set[int] = set()
        #: how many times each block ran (by id; absent: it did not run): more than once where layers share a block
        #: (ALBERT)
        self.calls: Counter = Counter()
        #: the shape of the first tensor the first block that ran took (its hidden states)
        self.block_shape: tuple[int, ...] | None = None
        #: ``id(block) -> [hidden states in, hidden states out]`` of each block's first run: the tensor a residual
        #: site reads at its input (its first argument, else its first tensor keyword) and at its output (the output,
        #: or its first element)
        self.hidden: dict[int, list] = {}
        #: the ``[batch, tokens]`` token ids of the pass (None for other inputs)
        self.token_ids: tuple[int, int] | None = None

    def add(self, kind: str, output, inputs, module=None, dim=None) -> None:
        """Record ``output`` (ignored unless it is a tensor computed with autograd)."""
        if not isinstance(output, torch.Tensor) or output.grad_fn is None:
            return
        record = _Record(kind, output, tuple(inputs), module, self.blocks[-1] if self.blocks else None, dim)
        self.records.append(record)
        self.by_node.setdefault(output.grad_fn, []).append(record)

    def function(self, kind: str, name: str, func, output, args: tuple, kwargs: dict) -> None:
        """Record the result of a torch function of :py:data:`RECORDED` (the operation ``name`` of the registry)."""
        entry = OPERATIONS[name]
        arguments = signature(func, entry.params).bind(args, kwargs)
        if kind == 'attention':
            self.add(kind, output, [arguments.get(key) for key in ('query', 'key', 'value')])
        elif kind == 'softmax':
            self.add(kind, output, [arguments.get('input')], dim=arguments.get('dim'))
        elif kind in ('matmul', 'product'):
            operands = _factors(func, entry, arguments, args, kwargs)
            if operands is not None and all(_computed(operand) for operand in operands):
                self.add(kind, output, operands)
        elif args and isinstance(args[0], torch.Tensor):
            self.add(kind, output, args[:1])

    def frontier(self, tensor: torch.Tensor, stop: frozenset[str]) -> list[_Record]:
        """The nearest records of a kind in ``stop`` that ``tensor`` is computed from (itself included), one per
        tensor (of several records of one tensor the first kind of :py:data:`KINDS`, a module's before a function's).
        """
        found: dict[int, _Record] = {}
        seen: set = set()
        pending = [tensor.grad_fn] if isinstance(tensor, torch.Tensor) and tensor.grad_fn is not None else []
        while pending:
            node = pending.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            records = [record for record in self.by_node.get(node, ()) if record.kind in stop]
            if records:
                best = min(records, key=lambda record: (KINDS.index(record.kind), record.module is None))
                found[id(best)] = best
                continue
            pending.extend(parent for parent, _ in node.next_functions)
        return list(found.values())


def _computed(value) -> bool:
    """Whether ``value`` is a tensor computed with autograd (not a parameter, constant or number)."""
    return isinstance(value, torch.Tensor) and value.grad_fn is not None and value.dim() > 0


def _factors(func, entry, arguments: dict, args: tuple, kwargs: dict) -> tuple | None:
    """The two factors of a recorded product or matrix product, in the order of the product (without the additive
    term of ``addmm`` and its kind: the declaration's ``additive``); None for other forms."""
    additive = arguments.get(entry.additive) if entry.additive is not None else None
    factors = [tensor for tensor in tensors_of(list(args) + list(kwargs.values()), []) if tensor is not additive]
    if getattr(func, '__name__', '').startswith('__r'):  # ``x.__rmatmul__(y)`` is ``y @ x``
        factors = factors[::-1]
    return tuple(factors) if len(factors) == 2 else None


class _Recording(TorchFunctionMode):
    """Record the torch functions of :py:data:`RECORDED` in ``trace`` while it is entered."""

    def __init__(self, trace: Trace):
        super().__init__()
        self.trace = trace

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        output = func(*args, **kwargs)
        name = op_name(func)
        kind = RECORDED.get(name)
        if kind is not None:
            self.trace.function(kind, name, func, output, args, kwargs)
        elif name in ROUTING and args and _computed(args[0]) and self.trace.blocks:
            self.trace.routing.add(id(self.trace.blocks[-1]))
        return output


class ModuleHooks:
    """Forward hooks of the discovery pass on the modules of a model: linear layers (whose outputs are made to require
    a gradient where they do not), normalisation and activation modules, and the blocks (the current block)."""

    def __init__(self, trace: Trace, blocks: list[torch.nn.Module]):
        self.trace = trace
        self.blocks = {id(block) for block in blocks}
        self.handles: list = []

    def register(self, model: torch.nn.Module) -> None:
        for module in model.modules():
            if id(module) in self.blocks:
                self.handles.append(module.register_forward_pre_hook(self.enter, with_kwargs=True))
                self.handles.append(module.register_forward_hook(self.leave, always_call=True))
            kind = self.kind(module)
            if kind is not None:
                self.handles.append(module.register_forward_hook(self.recorder(kind), with_kwargs=True))

    @staticmethod
    def kind(module: torch.nn.Module) -> str | None:
        if isinstance(module, LINEARS):
            return 'linear'
        if norm_kind(module) is not None:
            return 'norm'
        if is_activation(module):
            return 'activation'
        return None

    def enter(self, module, args, kwargs) -> None:
        self.trace.blocks.append(module)
        self.trace.calls[id(module)] += 1
        hidden = (
            args[0] if args else next((value for value in kwargs.values() if isinstance(value, torch.Tensor)), None)
        )
        if isinstance(hidden, torch.Tensor):
            self.trace.hidden.setdefault(id(module), [hidden, None])
        first = next((value for value in args if isinstance(value, torch.Tensor)), None)
        if self.trace.block_shape is None and first is not None and first.dim() >= 3:
            self.trace.block_shape = tuple(first.shape)

    def leave(self, module, args, output) -> None:
        if self.trace.blocks and self.trace.blocks[-1] is module:
            self.trace.blocks.pop()
        try:
            first = output if isinstance(output, torch.Tensor) or output is None else output[0]
        except (IndexError, KeyError, TypeError):
            first = None
        entry = self.trace.hidden.get(id(module))
        if entry is not None and entry[1] is None and isinstance(first, torch.Tensor):
            entry[1] = first

    def recorder(self, kind: str):
        def record(module, args, kwargs, output):
            inputs = args[:1] if args else [value for value in kwargs.values() if isinstance(value, torch.Tensor)][:1]
            if kind == 'linear' and isinstance(output, torch.Tensor) and not output.requires_grad:
                output = output.detach().requires_grad_().clone()  # a node to find it by; the same values
            self.trace.add(kind, output, inputs, module)
            return output if kind == 'linear' else None

        return record

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


# ------------------------------------------------------------------------------------------------------ the pass
def example_inputs(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A small input of ``model`` for the discovery pass: :py:data:`EXAMPLE_TOKENS` token ids (avoiding the ids the
    configuration names, such as padding and image tokens) for text models (and :py:data:`EXAMPLE_DECODER_TOKENS`
    decoder ids for encoder-decoder models; for a model of one's own whose forward takes ``input_ids``, those of the
    Hugging Face text model inside it), one random image for vision models (Hugging Face's ``pixel_values`` models,
    timm's with a ``patch_embed``; a model of one's own with a 2-D convolution and without a token table, such as
    torchvision's: the first convolution's channels, its ``image_size`` or :py:data:`EXAMPLE_IMAGE` pixels, as its
    first argument).

    Raises
    ------
    StructureError
        For a model whose input this cannot tell: pass ``inputs`` to :py:func:`model_structure`.
    """
    device, dtype = _placement(model)
    patch = getattr(model, 'patch_embed', None)
    if patch is not None and hasattr(patch, 'img_size') and hasattr(getattr(patch, 'proj', None), 'in_channels'):
        first = next(iter(_parameters(model)), 'x')  # timm's forward(x)
        return {first: _image(patch.proj.in_channels, patch.img_size, device, dtype)}
    config = getattr(model, 'config', None)
    main = getattr(model, 'main_input_name', None)
    if main == 'pixel_values' and config is not None:
        vision = getattr(config, 'vision_config', None) or config
        # a model without a fixed image size (SegFormer, convolutional ones) takes any: the smallest it needs
        size = getattr(vision, 'image_size', None) or EXAMPLE_IMAGE
        return {'pixel_values': _image(getattr(vision, 'num_channels', 3), size, device, dtype)}
    if main == 'input_ids' and config is not None:
        inputs = {'input_ids': _token_ids(model, config, EXAMPLE_TOKENS, device)}
        if is_encoder_decoder(model):
            inputs['decoder_input_ids'] = _token_ids(model, config, EXAMPLE_DECODER_TOKENS, device)
        return inputs
    inner = inner_text_models(model) if main is None and 'input_ids' in _parameters(model) else []
    if inner and getattr(inner[0], 'config', None) is not None:  # a model of one's own around a text model: its ids
        return {'input_ids': _token_ids(inner[0], inner[0].config, EXAMPLE_TOKENS, device)}
    first = next(iter(_parameters(model)), None)
    stem = next((module for module in model.modules() if isinstance(module, torch.nn.Conv2d)), None)
    if main is None and first is not None and stem is not None and word_embeddings(model) is None:
        # an image model of one's own (torchvision's): an image of its first convolution's channels
        return {first: _image(stem.in_channels, getattr(model, 'image_size', None) or EXAMPLE_IMAGE, device, dtype)}
    raise StructureError(
        f'cannot build an example input for {type(model).__name__} (neither token ids nor an image of a known '
        'size): pass inputs= to zennit_attn.structure.model_structure'
    )


def _placement(model: torch.nn.Module) -> tuple[torch.device, torch.dtype]:
    """The device of the model's inputs (:py:func:`~zennit_attn.core.devices.input_device`) and the floating-point
    type of its first floating-point parameter."""
    dtype = next(
        (parameter.dtype for parameter in model.parameters() if parameter.is_floating_point()),
        torch.get_default_dtype(),
    )
    return input_device(model), dtype


def _image(channels: int, size, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    height, width = (size, size) if isinstance(size, int) else tuple(size)
    generator = torch.Generator().manual_seed(0)
    return torch.rand(1, channels, height, width, generator=generator, dtype=dtype).to(device)


def _token_ids(model: torch.nn.Module, config, count: int, device: torch.device) -> torch.Tensor:
    """``[1, count]`` ids from 3 upwards that no ``*_token_id``/``*_token_index`` field of the configuration (or its
    text configuration) names."""
    text = config.get_text_config() if hasattr(config, 'get_text_config') else config
    vocabulary = getattr(text, 'vocab_size', None) or model.get_input_embeddings().num_embeddings
    special = set()
    for source in (config, text):
        for name, value in vars(source).items():
            if name.endswith(('token_id', 'token_index', 'token_ids')):
                special.update(value if isinstance(value, (list, tuple)) else [value])
    ids = [token for token in range(3, vocabulary) if token not in special][:count]
    if len(ids) < count:
        raise StructureError(f'{type(model).__name__} has too small a vocabulary ({vocabulary}) for an example input')
    return torch.tensor([ids], device=device)


@contextlib.contextmanager
def _discovery_settings(model: torch.nn.Module) -> Iterator[None]:
    """For the pass: evaluation mode, attention that torch functions show (``eager`` where another implementation
    than ``eager`` or ``sdpa`` is set), experts as their plain loop; everything put back after (each configuration's
    own values, in the order in which setting a configuration's value sets those of its sub-configurations)."""
    training = [(module, module.training) for module in model.modules()]
    configs = model_configs(model)
    saved = [
        (config, config._attn_implementation, getattr(config, '_experts_implementation', None)) for config in configs
    ]
    try:
        model.eval()
        for config in configs:
            if config._attn_implementation not in ('eager', 'sdpa'):
                config._attn_implementation = 'eager'
            if hasattr(config, '_experts_implementation'):
                config._experts_implementation = 'eager'
        yield
    finally:
        for config, attention, experts in saved:
            config._attn_implementation = attention
            if hasattr(config, '_experts_implementation'):
                config._experts_implementation = experts
        for module, mode in training:
            module.training = mode


def _is_kept(hook) -> bool:
    """Whether a hook function comes from torch (:py:data:`_KEPT_HOOKS`; also a bound method, a
    ``functools.partial`` or a hook object such as ``WeightNorm``)."""
    function = getattr(hook, 'func', hook)
    module = getattr(function, '__module__', None) or getattr(type(function), '__module__', '')
    return module.startswith(_KEPT_HOOKS)


@contextlib.contextmanager
def _hooks_set_aside(model: torch.nn.Module) -> Iterator[None]:
    """For the pass: the hooks on ``model``'s modules removed, except torch's own (:py:data:`_KEPT_HOOKS`);
    afterwards every hook dictionary as it was, in its order."""
    saved = []
    for module in model.modules():
        for name in _HOOK_DICTS:
            hooks = getattr(module, name)
            aside = [key for key, hook in hooks.items() if not _is_kept(hook)]
            if aside:
                saved.append((hooks, list(hooks.items())))
                for key in aside:
                    del hooks[key]
    try:
        yield
    finally:
        for hooks, items in saved:
            hooks.clear()
            hooks.update(items)


def _run(model: torch.nn.Module, inputs) -> None:
    """One forward pass of ``model`` on ``inputs`` (keyword arguments, or the one positional argument), without a
    key/value cache where the model has one."""
    kwargs = dict(inputs) if isinstance(inputs, Mapping) else {}
    args = () if isinstance(inputs, Mapping) else (inputs,)
    model(*args, **{**without_cache(model), **kwargs})


def _parameters(model: torch.nn.Module) -> Mapping:
    try:
        return inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return {}


def trace_model(model: torch.nn.Module, inputs=None) -> tuple[Trace, list[tuple[str, list[torch.nn.Module]]]]:
    """Run the discovery pass: ``(trace, stacks of blocks)``."""
    try:
        stacks = block_stacks(model)
    except NoBlocksError:
        stacks = []
    inputs = example_inputs(model) if inputs is None else inputs
    trace = Trace()
    ids = inputs.get('input_ids') if isinstance(inputs, Mapping) else None
    if isinstance(ids, torch.Tensor) and ids.dim() == 2:
        trace.token_ids = tuple(ids.shape)
    hooks = ModuleHooks(trace, [block for _, blocks in stacks for block in blocks])
    try:
        with _discovery_settings(model), _hooks_set_aside(model):
            hooks.register(model)
            with _Recording(trace):
                _run(model, inputs)
    except StructureError:
        raise
    except Exception as error:
        raise StructureError(
            f'the discovery pass of {type(model).__name__} (a forward pass on a small example input) failed: '
            f'{type(error).__name__}: {error}; pass inputs= to zennit_attn.structure.model_structure'
        ) from error
    finally:
        hooks.remove()
    return trace, stacks


# ------------------------------------------------------------------------------------------------------ analysis
def _rearranged(consumer: torch.Tensor, producer: torch.Tensor) -> bool:
    """Whether ``consumer`` is ``producer``'s entries rearranged (viewed, transposed, copied, cast): the gradient it
    sends to ``producer`` is its incoming gradient permuted (a random one, so that a permutation is the only way)."""
    if consumer.numel() != producer.numel():
        return False
    weights = torch.randn(consumer.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    weights = weights.to(consumer.dtype).to(consumer.device)
    (grad,) = torch.autograd.grad((consumer * weights).sum(), producer, retain_graph=True, allow_unused=True)
    if grad is None:
        return False
    expected = weights.to(grad.dtype).flatten().sort().values
    return torch.equal(grad.flatten().sort().values, expected)


def _sources(trace: Trace, operand: torch.Tensor, through_norms: bool) -> tuple[list[_Record], str | None]:
    """The nearest linear layers (``through_norms``: past normalisation modules) or modules (linear layers and
    normalisations) that ``operand`` is computed from; ``(records, reason)`` with the reason where they are not only
    such modules."""
    records = trace.frontier(operand, _ANY)
    if through_norms:
        records = _past_norms(trace, records)
    wanted = ('linear',) if through_norms else ('linear', 'norm')
    strangers = sorted({record.kind for record in records if record.kind not in wanted or record.module is None})
    if not records:
        return [], 'it is computed from no linear layer'
    if strangers:
        return [], f'it is computed from outputs of kind {", ".join(strangers)} as well as from linear layers'
    return records, None


def _past_norms(trace: Trace, records: list[_Record]) -> list[_Record]:
    """``records`` with each normalisation module replaced by the nearest records its input is computed from."""
    while any(record.kind == 'norm' and record.inputs for record in records):
        found = {}
        for record in records:
            nearest = trace.frontier(record.inputs[0], _ANY) if record.kind == 'norm' and record.inputs else [record]
            found.update((id(item), item) for item in nearest)
        records = list(found.values())
    return records


def _features(operand: torch.Tensor, records: list[_Record]) -> tuple[tuple[Features, ...], str | None, bool]:
    """``(features per source, reason, linear)``: the features of each source's output that hold ``operand`` (those
    that receive a gradient from it), a reason where a source holds it for some tokens or heads only, and whether
    ``operand`` is computed from the sources linearly (Euler's identity for functions of degree one)."""
    weights = torch.randn(operand.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    weighted = operand * weights.to(operand.dtype).to(operand.device)
    outputs = [record.output for record in records]
    grads = torch.autograd.grad(weighted.sum(), outputs, retain_graph=True, allow_unused=True)
    features, euler = [], 0.0
    for record, grad in zip(records, grads):
        grad = torch.zeros_like(record.output) if grad is None else grad
        support = (grad != 0).reshape(-1, grad.shape[-1])
        mask = support.any(0)
        if not bool(mask.any()):
            return (), f'{type(record.module).__name__} is on its path but receives no gradient from it', False
        if not torch.equal(support, mask.expand_as(support)):
            return (), f'{type(record.module).__name__} holds it in some tokens or heads only', False
        features.append(Features(record.module, None if bool(mask.all()) else mask.cpu()))
        euler += float((grad.double() * record.output.detach().double()).sum())
    weighted = weighted.detach().double()
    total, scale = float(weighted.sum()), float(weighted.abs().sum())
    tolerance = max(1e-6, 50 * torch.finfo(operand.dtype).eps) * max(scale, 1e-300)
    return tuple(features), None, abs(euler - total) <= tolerance


def _operand(trace: Trace, operand: torch.Tensor) -> tuple[tuple[Features, ...], str | None]:
    """The linear layers an operand comes from, with their features, or ``((), reason)``."""
    records, reason = _sources(trace, operand, through_norms=True)
    if reason is not None:
        return (), reason
    features, reason, _ = _features(operand, records)
    return features, reason


def _key_scaling(trace: Trace, keys: torch.Tensor) -> tuple[tuple[Features, ...], str | None]:
    """The nearest modules whose key features scale ``keys`` exactly, or ``((), reason)``."""
    records, reason = _sources(trace, keys, through_norms=False)
    if reason is not None:
        return (), f'the keys: {reason}'
    features, reason, linear = _features(keys, records)
    if reason is not None:
        return (), f'the keys: {reason}'
    if not linear:
        names = ', '.join(sorted({type(record.module).__name__ for record in records}))
        return (), f'the keys are not a linear function of the outputs of {names} (a normalisation in between?)'
    return features, None


@dataclass(eq=False)
class _Operation:
    """An attention operation found in a trace: its operands, output record and number of keys."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    output: _Record
    keys: int


def _operations(trace: Trace) -> list[_Operation]:
    """Every attention operation of the trace, in the order they ran."""
    operations = []
    for record in trace.records:
        if record.kind == 'attention' and all(isinstance(operand, torch.Tensor) for operand in record.inputs):
            query, key, value = record.inputs
            operations.append(_Operation(query, key, value, record, key.shape[-2]))
        elif record.kind == 'matmul':
            operation = _eager_operation(trace, record)
            if operation is not None:
                operations.append(operation)
    return operations


def _eager_operation(trace: Trace, product: _Record) -> _Operation | None:
    """``product`` as ``softmax(q k^T) @ v`` (its first factor the probabilities), or None."""
    probabilities, value = product.inputs
    sources = trace.frontier(probabilities, _ANY)
    if len(sources) != 1 or sources[0].kind != 'softmax':
        return None
    softmax = sources[0]
    if softmax.dim not in (-1, softmax.output.dim() - 1):
        return None
    logits = trace.frontier(softmax.inputs[0], _LOGITS)
    if len(logits) != 1 or logits[0].kind != 'matmul':
        return None
    query, key = logits[0].inputs
    return _Operation(query, key, value, product, softmax.output.shape[-1])


def _attention_output(trace: Trace, record: _Record, outputs: dict[int, _Operation]) -> _Operation | None:
    """The attention operation whose output ``record`` is, or whose output it multiplies (a gated output)."""
    if id(record) in outputs:
        return outputs[id(record)]
    if record.kind != 'product':
        return None
    for factor in record.inputs:
        found = [outputs[id(source)] for source in trace.frontier(factor, _ANY) if id(source) in outputs]
        if found:
            return found[0]
    return None


def _fed_by_linears(trace: Trace, tensor: torch.Tensor, block) -> bool:
    """Whether ``tensor`` is computed (through activations and products) from linear layers of ``block`` only."""
    records = trace.frontier(tensor, _FEEDS)
    return bool(records) and all(record.kind == 'linear' and record.block is block for record in records)


def _is_ffn(trace: Trace, record: _Record) -> bool:
    """Whether ``record`` is an FFN activation or product: computed from linear layers of its block, token by token."""
    if record.kind not in ('activation', 'product'):
        return False
    if not all(_fed_by_linears(trace, tensor, record.block) for tensor in record.inputs):
        return False
    return _per_token(
        record.output, [found.output for tensor in record.inputs for found in trace.frontier(tensor, _FEEDS)]
    )


def _per_token(tensor: torch.Tensor, sources: list[torch.Tensor]) -> bool:
    """Whether the last token of ``tensor`` (positions along its second-to-last dimension) is computed from the last
    token of ``sources`` only (not a sequence mixer such as a state-space scan or a convolution over positions)."""
    if tensor.dim() < 2 or any(source.dim() < 2 or source.shape[-2] != tensor.shape[-2] for source in sources):
        return False
    weights = torch.zeros(tensor.shape, dtype=torch.float64)
    weights[..., -1, :] = torch.randn(
        weights[..., -1, :].shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64
    )
    weighted = (tensor * weights.to(tensor.dtype).to(tensor.device)).sum()
    grads = torch.autograd.grad(weighted, sources, retain_graph=True, allow_unused=True)
    return all(grad is None or not bool(grad[..., :-1, :].any()) for grad in grads)


@dataclass
class _Consumers:
    """What the linear layers of a trace take as input: attention outputs and FFN activations or products."""

    projections: dict[int, list[_Record]] = field(default_factory=dict)
    down: dict[int, list[torch.nn.Module]] = field(default_factory=dict)


def _consumers(trace: Trace, operations: list[_Operation]) -> _Consumers:
    """Sort the linear layers that take an attention output or an FFN activation or product (rearranged) as input."""
    outputs = {id(operation.output): operation for operation in operations}
    found = _Consumers()
    for linear in trace.records:
        if linear.kind != 'linear' or not linear.inputs:
            continue
        sources = trace.frontier(linear.inputs[0], _ANY)
        if len(sources) != 1 or not _rearranged(linear.inputs[0], sources[0].output):
            continue
        operation = _attention_output(trace, sources[0], outputs)
        if operation is not None:
            found.projections.setdefault(id(operation), []).append(linear)
        elif _is_ffn(trace, sources[0]):
            modules = found.down.setdefault(id(linear.block), [])
            if linear.module not in modules:
                modules.append(linear.module)
    return found


def _attention_op(trace: Trace, operation: _Operation, projections: list[_Record]) -> AttentionOp:
    """The :py:class:`AttentionOp` of a found operation and the linear layers that take its output."""
    problems = {}
    parts = {}
    for name in ('query', 'key', 'value'):
        parts[name], reason = _operand(trace, getattr(operation, name))
        if reason is not None:
            problems[name] = reason
    key_scaling, reason = _key_scaling(trace, operation.key)
    if reason is not None:
        problems['key_scaling'] = reason
    output = heads = None
    modules = list(dict.fromkeys(record.module for record in projections))
    if len(modules) == 1:
        output = modules[0]
        width, head = projections[0].inputs[0].shape[-1], operation.output.output.shape[-1]
        heads = width // head if width % head == 0 else None
    else:
        problems['output'] = f'{len(modules)} linear layers take the attention output as their input'
    block = operation.output.block
    return AttentionOp(
        block, parts['query'], parts['key'], parts['value'], key_scaling, output, heads, operation.keys, problems
    )


def discover(model: torch.nn.Module, inputs=None) -> ModelStructure:
    """Run the discovery pass on ``model`` and read its structure (not cached: see :py:func:`model_structure`)."""
    with torch.inference_mode(False), torch.enable_grad():  # the analysis differentiates what the pass computed
        trace, stacks = trace_model(model, inputs)
        operations = _operations(trace)
        consumers = _consumers(trace, operations)
        attention = tuple(
            _attention_op(trace, operation, consumers.projections.get(id(operation), [])) for operation in operations
        )
    ran = [(path, blocks) for path, blocks in stacks if all(id(block) in trace.calls for block in blocks)]
    return ModelStructure(
        name=type(model).__name__,
        stacks=ran,
        attention=attention,
        down_projections={key: tuple(modules) for key, modules in consumers.down.items()},
        routed_experts=frozenset(trace.routing),
        input_keys=EXAMPLE_TOKENS if is_encoder_decoder(model) else None,
        sequence_first=_sequence_first(trace),
        repeated=frozenset(key for key, count in trace.calls.items() if count > 1),
        hidden_shape=trace.block_shape,
        unchained=_unchained(trace, stacks),
        calls=dict(trace.calls),
    )


def _unchained(trace: Trace, stacks: list[tuple[str, list[torch.nn.Module]]]) -> frozenset[int]:
    """Ids of the blocks whose hidden states in are not those the block before them in their stack (the one before
    that ran) gave out: blocks that pass on the residual stream in more than one tensor (Reformer's reversible
    layers take the two halves of the stream, ``prev_attn_output`` and ``hidden_states``, and return them)."""
    found = set()
    for _, blocks in stacks:
        previous = None
        for block in blocks:
            entry = trace.hidden.get(id(block))
            if entry is None:
                continue
            if previous is not None and previous[1] is not None:
                given, taken = previous[1], entry[0]
                if given is not taken and (given.shape != taken.shape or not torch.equal(given, taken)):
                    found.add(id(block))
            previous = entry
    return frozenset(found)


def _sequence_first(trace: Trace) -> bool:
    """Whether the blocks of the pass took their hidden states ``[seq, batch, features]`` (XLNet): the first block's
    first input has the token ids' two sizes swapped (told apart where the pass's ids are not square)."""
    if trace.token_ids is None or trace.block_shape is None:
        return False
    batch, tokens = trace.token_ids
    return batch != tokens and trace.block_shape[:2] == (tokens, batch)


# ------------------------------------------------------------------------------------------------------ the cache
#: ``model -> (structure, {module path: module})``: one discovery pass per model instance, while its modules stay.
_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def model_structure(model: torch.nn.Module, inputs=None) -> ModelStructure:
    """The structure of ``model`` (:py:class:`ModelStructure`), from one discovery pass per model instance.

    The result is cached for the instance (a weak reference) and used again while every module it names is still
    the model's at the same path. Call it before entering contexts that change the model's forward pass (composites,
    steering); zennit-attn's own functions do.

    Parameters
    ----------
    model: torch.nn.Module
        A Hugging Face model (text, vision, vision-language: its text path) or a timm vision transformer.
    inputs: mapping or tensor, optional
        The example input of the pass (keyword arguments of the model, or its positional input); default
        :py:func:`example_inputs`. Given, the pass runs again and its result is cached.

    Returns
    -------
    ModelStructure

    Raises
    ------
    StructureError
        If the pass cannot run (no example input known, the forward pass fails).
    """
    entry = _CACHE.get(model) if inputs is None else None
    if entry is not None and _unchanged(model, entry[1]):
        return entry[0]
    structure = discover(model, inputs)
    paths = {id(module): name for name, module in model.named_modules()}
    _CACHE[model] = (
        structure,
        {paths[key]: module for key, module in _named(structure).items() if key in paths},
    )
    return structure


def _named(structure: ModelStructure) -> dict[int, torch.nn.Module]:
    """Every module ``structure`` names, by id."""
    modules = [block for _, blocks in structure.stacks for block in blocks]
    for op in structure.attention:
        modules += [source.module for part in (op.query, op.key, op.value, op.key_scaling) for source in part]
        modules += [op.block, op.output]
    modules += [module for found in structure.down_projections.values() for module in found]
    return {id(module): module for module in modules if module is not None}


def _unchanged(model: torch.nn.Module, modules: Mapping[str, torch.nn.Module]) -> bool:
    """Whether every module of ``modules`` is still ``model``'s at its path."""
    try:
        return all(model.get_submodule(path) is module for path, module in modules.items())
    except AttributeError:
        return False
