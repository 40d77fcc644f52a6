"""Where latent relevance is read: the sites of a transformer, found from what the model computes
(:py:func:`~zennit_attn.structure.model_structure`), and :py:class:`Neuron`.

A *site* is a tensor inside every transformer block (paper section 3.5, "Understanding latent features"):

- ``'mlp'``: the input of the block's FFN down (output) projection, the "knowledge neurons" at the last
  non-linearity (``act(gate) * up`` in gated MLPs, ``act(fc1)`` otherwise): the linear layer whose input is the
  output of an element-wise non-linearity or of a gated product, computed token by token from linear layers of the
  block. Units: the FFN neurons.
- ``'attention'``: the input of the attention output projection (``A V`` of all heads: the linear layer whose input
  is the attention output, rearranged), split per head. Units: the heads; a head's value is the sum over its head
  dimension.
- ``'residual'``: the residual stream between blocks; layer 0 is the input of the first block, layer ``l + 1`` the
  output of block ``l``. Units: the hidden dimensions (recorded summed over them).
- ``'query'``, ``'key'``, ``'value'``: the outputs of the linear layers the attention's queries, keys and values are
  computed from (fused projections: the features that hold them). Units: their features.

Routed mixtures of experts (Mixtral, Qwen-MoE, OLMoE: blocks that pick experts by a top-k of computed scores) have no
``'mlp'`` site: a token's FFN is a routing-weighted sum of a few of many experts, so "neuron ``i`` of layer ``l``" has
no fixed meaning across tokens; their attention, residual and q/k/v sites are recorded as for every other model.
Encoder-decoder models (T5) are refused: their encoder and decoder blocks see sequences of different lengths. The
``'residual'`` site is refused where the blocks hold their hidden states in more than three dimensions (several
residual streams per token: DeepSeek-V4's and HY-V4's hyper-connections, Gemma-3n's AltUp), whose other sites are
``[batch, seq, features]`` as everywhere else. In a
vision-language model the sites are those of its language model (the blocks its text input runs).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import torch

from ..core.blocks import block_stacks
from ..core.modules import is_encoder_decoder
from ..structure import AttentionOp, ModelStructure, StructureError, model_structure

__all__ = ['SITES', 'Neuron', 'SitePoint', 'find_sites']

#: The sites :py:func:`find_sites` knows.
SITES: tuple[str, ...] = ('mlp', 'attention', 'residual', 'query', 'key', 'value')


@dataclass(frozen=True)
class Neuron:
    """One latent unit: ``site`` (a key of :py:data:`SITES`), ``layer`` (block index, negative counts from the
    end; for ``'residual'`` 0 is the input of the first block) and ``index`` (FFN neuron, head, hidden or q/k/v
    feature). Hashable: usable as a dictionary key (:py:func:`~zennit_attn.latent.steer`,
    :py:func:`~zennit_attn.latent.reference_samples`)."""

    site: str
    layer: int
    index: int

    def __post_init__(self):
        if self.site not in SITES:
            raise ValueError(f'unknown site {self.site!r}; known sites: {", ".join(SITES)}')
        for name in ('layer', 'index'):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise TypeError(f'Neuron {name} must be an integer, got {value!r}')
            object.__setattr__(self, name, int(value))
        if self.index < 0:
            raise ValueError(f'Neuron index must be >= 0, got {self.index}')

    def __str__(self) -> str:
        return f'{self.site}[{self.layer}, {self.index}]'


@dataclass(eq=False)
class SitePoint:
    """One site in one block: the module whose input (``kind='input'``) or output (``kind='output'``, element
    ``index`` of a tuple) is the site tensor ``[batch, seq, features]``, with ``features`` (a boolean mask over the
    last dimension, for fused projections; None: every feature), ``heads`` (the attention site: features split
    into that many heads) and ``block`` (the block that holds it, whose input tells ``batch`` and ``seq`` where
    the module sees ``[batch * seq, features]``)."""

    site: str
    layer: int
    module: torch.nn.Module
    kind: str
    index: int | None = None
    heads: int | None = None
    features: torch.Tensor | None = field(default=None, repr=False)
    block: torch.nn.Module | None = field(default=None, repr=False)

    # --------------------------------------------------------------------------------------------- tensor access
    def select(self, tensor: torch.Tensor) -> torch.Tensor:
        """The site's features of the hooked tensor (all of them unless the projection is fused)."""
        mask = self.feature_mask(tensor.shape[-1], tensor.device)
        return tensor if mask is None else tensor[..., mask]

    def feature_mask(self, size: int, device) -> torch.Tensor | None:
        """``[size]`` boolean mask of the hooked tensor's last dimension that belongs to the site, or None (all).

        Raises
        ------
        ValueError
            If the module returned another number of features than the structure's discovery pass saw.
        """
        if self.features is None:
            return None
        if size != self.features.numel():
            raise ValueError(
                f'{self.site} of layer {self.layer}: {type(self.module).__name__} returned {size} features where the '
                f'discovery pass of the model saw {self.features.numel()}'
            )
        return self.features.to(device)

    def units(self, features: int) -> int:
        """Number of units (neurons, heads, hidden dimensions) of a site tensor with ``features`` features."""
        return self.heads if self.heads is not None else features

    def reduce(self, values: torch.Tensor) -> torch.Tensor:
        """``[..., features]`` per-feature values -> per-unit values: summed per head (attention), over all hidden
        dimensions (residual: ``[...]``), unchanged otherwise."""
        if self.site == 'residual':
            return values.sum(-1)
        if self.heads is not None:
            return values.unflatten(-1, (self.heads, -1)).sum(-1)
        return values

    def unit_features(self, index: int, features: int) -> slice:
        """The features (of the site tensor) of unit ``index``."""
        if index >= self.units(features):
            raise ValueError(
                f'{self.site} of layer {self.layer} has {self.units(features)} units; index {index} is out of range'
            )
        if self.heads is not None:
            width = features // self.heads
            return slice(index * width, (index + 1) * width)
        return slice(index, index + 1)

    def width(self) -> int | None:
        """Number of features of the site tensor, where the module tells it without a forward pass: the input
        features of the module for an input site (``'mlp'``, ``'attention'``), its output features for an output
        site (``'query'``, ``'key'``, ``'value'``: under grouped-query attention the key and value projections have
        fewer outputs than inputs)."""
        if self.site == 'residual' or self.features is not None:
            return None
        weight = getattr(self.module, 'weight', None)
        if isinstance(self.module, torch.nn.Linear):
            return self.module.in_features if self.kind == 'input' else self.module.out_features
        if weight is not None and weight.dim() == 2:  # transformers' Conv1D: weight [in, out]
            return weight.shape[0 if self.kind == 'input' else 1]
        return None

    # --------------------------------------------------------------------------------------------- hooks
    def hook(self, function, prepend: bool = False) -> HookHandles:
        """Call ``function(tensor)`` with the hooked tensor ``[batch, seq, ...]`` (whose :py:meth:`select` is the
        site tensor); a tensor it returns replaces it in the forward pass. Hooks run in the order they were
        registered (steering entered first edits first; recording registered before a composite's context sees the
        tensor before the composite's hooks), or first of all with ``prepend``. Where the module sees the tokens of
        all rows in one dimension (``[batch * seq, features]``, OPT's FFN), ``function`` receives them as ``[batch,
        seq, features]`` (the shape of the block's input). Hooks only the instance; remove the returned handles."""
        handles = []
        if self.block is not None:
            tokens: dict = {}
            handles.append(self.block.register_forward_pre_hook(_tokens_of(tokens), with_kwargs=True))
            function = _unflattening(function, tokens)
        if self.kind == 'input':
            handles.append(
                self.module.register_forward_pre_hook(self._pre(function), prepend=prepend, with_kwargs=True)
            )
        else:
            handles.append(self.module.register_forward_hook(self._post(function), prepend=prepend))
        return HookHandles(handles)

    @staticmethod
    def _pre(function):
        """The forward pre-hook that hands the module's first tensor input to ``function``."""

        def pre(module, args, kwargs):
            if args:
                tensor, where = args[0], None
            else:
                where = next((key for key, value in kwargs.items() if isinstance(value, torch.Tensor)), None)
                if where is None:
                    return None
                tensor = kwargs[where]
            result = function(tensor)
            if result is None:
                return None
            if where is None:
                return (result,) + tuple(args[1:]), kwargs
            return args, {**kwargs, where: result}

        return pre

    def _post(self, function):
        """The forward hook that hands the module's output (element :py:attr:`index` of a tuple) to ``function``."""

        def post(module, args, output):
            tensor = output if self.index is None or isinstance(output, torch.Tensor) else output[self.index]
            result = function(tensor)
            if result is None:
                return None
            if self.index is None or isinstance(output, torch.Tensor):
                return result
            items = [result if position == self.index else item for position, item in enumerate(output)]
            return type(output)._make(items) if hasattr(type(output), '_make') else type(output)(items)

        return post

    def hooked_features(self, index: int, size: int, device) -> torch.Tensor:
        """Indices into the hooked tensor's last dimension (of ``size``) of the features of unit ``index``."""
        mask = self.feature_mask(size, device)
        features = int(mask.sum()) if mask is not None else size
        positions = torch.arange(size, device=device) if mask is None else mask.nonzero()[:, 0]
        return positions[self.unit_features(index, features)]


class HookHandles:
    """The handles of the hooks of :py:meth:`SitePoint.hook`, removed together."""

    def __init__(self, handles: list):
        self.handles = handles

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


def _tokens_of(tokens: dict):
    """A forward pre-hook of a block that keeps ``(batch, seq)`` of its first tensor input in ``tokens``."""

    def keep(module, args, kwargs):
        tensor = next((value for value in (*args, *kwargs.values()) if isinstance(value, torch.Tensor)), None)
        tokens['shape'] = tuple(tensor.shape[:2]) if tensor is not None and tensor.dim() >= 3 else None

    return keep


def _unflattening(function, tokens: dict):
    """``function`` of ``[batch, seq, features]`` tensors, also called with tensors that hold the tokens in other
    leading dimensions (with the ``(batch, seq)`` a block's pre-hook keeps in ``tokens``): ``[batch * seq, features]``
    (OPT's FFN) and ``[batch, 1, seq, features]`` (the key-value projection of multi-head latent attention: DeepSeek-V3,
    MiniCPM3). The tensor is viewed as ``[batch, seq, features]`` and given its own shape again after, also where
    ``function`` returns nothing, so that a gradient hook it registers on the view is on the forward pass's path."""

    def call(tensor):
        shape = tokens.get('shape')
        if not isinstance(tensor, torch.Tensor) or shape is None or not _tokens_elsewhere(tensor, shape):
            return function(tensor)
        view = tensor.view(*shape, tensor.shape[-1])
        result = function(view)
        return (view if result is None else result).view(tensor.shape)

    return call


def _tokens_elsewhere(tensor: torch.Tensor, shape: tuple[int, int]) -> bool:
    """Whether ``tensor`` holds the ``(batch, seq)`` tokens of ``shape`` in leading dimensions other than its first
    two: all in one (``[batch * seq, features]``), or the rows first and the tokens in the dimensions up to the last
    (``[batch, 1, seq, features]``)."""
    batch, seq = shape
    if tensor.dim() == 2:
        return tensor.shape[0] == batch * seq
    if tensor.dim() < 4 or tensor.shape[0] != batch:
        return False
    return math.prod(tensor.shape[1:-1]) == seq


def _block_stack(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks of the model's one stack of transformer blocks (:py:func:`~zennit_attn.core.blocks.
    block_stacks`); of several, the one the model's text input runs (a vision-language model's language model).
    Refused for a model whose input runs several stacks (Funnel's encoder and decoder), an encoder-decoder model,
    blocks that keep the sequence first (XLNet), blocks that run several times (ALBERT) and blocks none of which runs
    through its module call (SqueezeBERT calls ``layer.forward(...)``: no hook on them runs)."""
    if is_encoder_decoder(model):
        raise ValueError(
            f'{type(model).__name__} is an encoder-decoder model: latent sites are defined for '
            'decoder-only and encoder-only transformers (encoder and decoder blocks see different '
            'sequences)'
        )
    stacks, structure = block_stacks(model), model_structure(model)
    if structure.sequence_first:
        raise ValueError(
            f'the blocks of {type(model).__name__} hold their hidden states [seq, batch, features] (the sequence '
            'first), where latent sites read [batch, seq, features]: latent relevance, neuron targets and steering '
            'are not available for it'
        )
    if len(stacks) > 1:
        stacks = structure.stacks
    if len(stacks) != 1:
        held = ', '.join(f'{path!r} ({len(blocks)} blocks)' for path, blocks in stacks)
        raise ValueError(
            f'{type(model).__name__} runs {len(stacks)} stacks of transformer blocks on its input ({held}): layer l '
            'of a latent site is block l of one stack, and no one stack holds all the blocks the model runs (reading '
            "one would leave the others' layers out): latent relevance, Neuron targets, conditions, steering and "
            'patching by layer are not available for it; explain without latent=, or patch module paths'
        )
    _check_ran(model, *stacks[0])
    repeated = [index for index, block in enumerate(stacks[0][1]) if id(block) in structure.repeated]
    if repeated:
        raise ValueError(
            f'block {repeated[0]} of {type(model).__name__} runs several times in one forward pass (its layers share '
            "one block, as ALBERT's): latent sites are read per block, which would hold the layers of all its runs"
        )
    return stacks[0][1]


def _check_ran(model: torch.nn.Module, path: str, blocks: list[torch.nn.Module]) -> None:
    """Refuse a stack none of whose blocks ran through its module call in the discovery pass (no hook on them ran:
    the sites' hooks would see none of them). A stack of which some blocks ran is read: a block skipped for some
    inputs (Mllama's cross-attention blocks without an image) runs for others, and each call checks that its hooks
    ran."""
    calls = model_structure(model).calls
    if any(id(block) in calls for block in blocks):
        return
    raise ValueError(
        f'the blocks of {type(model).__name__} ({path!r}, {type(blocks[0]).__name__}) did not run through their '
        'module call in its forward pass (the hooks on them never ran: the model calls block.forward(...) '
        "directly, as SqueezeBERT's encoder does), so the block boundaries and the blocks of its attention and "
        'FFN cannot be seen: latent relevance, Neuron targets, conditions, steering and patching by layer are not '
        'available for it; explain without latent='
    )


def _one(points: list, what: str, layer: int, model) -> object:
    if len(points) != 1:
        raise ValueError(
            f'block {layer} of {type(model).__name__} has {len(points)} {what}s; latent sites need exactly one per '
            'block'
        )
    return points[0]


def _attention(structure: ModelStructure, block: torch.nn.Module, layer: int, model) -> AttentionOp:
    """The one attention operation of ``block``."""
    return _one(structure.attention_in(block), 'attention operation', layer, model)


def _attention_point(structure: ModelStructure, block: torch.nn.Module, layer: int, model) -> SitePoint:
    """The input of the attention output projection of ``block``, split into its heads."""
    op = _attention(structure, block, layer, model)
    if op.output is None or op.heads is None:
        reason = op.problems.get('output', 'the head dimension does not divide its input features')
        raise ValueError(f'the attention of block {layer} of {type(model).__name__} has no output projection: {reason}')
    return SitePoint('attention', layer, op.output, 'input', heads=op.heads, block=block)


def _mlp_point(structure: ModelStructure, block: torch.nn.Module, layer: int, model) -> SitePoint:
    """The input of the FFN down projection of ``block``."""
    try:
        module = structure.down_projection(block, layer)
    except StructureError as error:
        family = getattr(getattr(model, 'config', None), 'model_type', None) or type(model).__name__
        raise StructureError(
            f'the {family} family has no "mlp" site: {error}; record "attention", "residual", "query", "key" or "value"'
        ) from None
    return SitePoint('mlp', layer, module, 'input', block=block)


def _operand_point(structure: ModelStructure, site: str, block: torch.nn.Module, layer: int, model) -> SitePoint:
    """The output of the linear layer ``block``'s queries, keys or values (``site``) are computed from."""
    op = _attention(structure, block, layer, model)
    sources = getattr(op, site)
    if len(sources) != 1:
        reason = op.problems.get(site, f'{len(sources)} linear layers')
        raise ValueError(
            f'the {site}s of block {layer} of {type(model).__name__} do not come from one linear layer: {reason}'
        )
    return SitePoint(site, layer, sources[0].module, 'output', features=sources[0].mask, block=block)


def _points(site: str, blocks: list[torch.nn.Module], model) -> list[SitePoint]:
    """The points of ``site`` in every block."""
    structure = model_structure(model)
    if site == 'residual':
        _check_residual(structure, blocks, model)
        first = SitePoint('residual', 0, blocks[0], 'input')
        return [first] + [
            SitePoint('residual', layer + 1, block, 'output', index=0) for layer, block in enumerate(blocks)
        ]
    if site == 'attention':
        return [_attention_point(structure, block, layer, model) for layer, block in enumerate(blocks)]
    if site == 'mlp':
        return [_mlp_point(structure, block, layer, model) for layer, block in enumerate(blocks)]
    return [_operand_point(structure, site, block, layer, model) for layer, block in enumerate(blocks)]


def _check_residual(structure: ModelStructure, blocks: list[torch.nn.Module], model) -> None:
    """Refuse the residual site of blocks whose hidden states are not ``[batch, seq, hidden]`` (the shape the
    discovery pass saw at the first block: :py:attr:`~zennit_attn.structure.ModelStructure.hidden_shape`) or that pass
    on the residual stream in more than one tensor (:py:attr:`~zennit_attn.structure.ModelStructure.unchained`)."""
    unchained = [layer for layer, block in enumerate(blocks) if id(block) in structure.unchained]
    if unchained:
        layer = unchained[0]
        raise ValueError(
            f'the hidden states block {layer} of {type(model).__name__} ({type(blocks[layer]).__name__}) takes are not '
            f'those block {layer - 1} gives out: its blocks pass on the residual stream in more than one tensor (as '
            'reversible layers pass its two halves), where the "residual" site reads one tensor at each block '
            'boundary: latent relevance, neuron targets, conditions and steering of the residual site are not '
            'available for it; use another site'
        )
    shape = structure.hidden_shape
    if shape is None or len(shape) == 3:
        return
    raise ValueError(
        f'the blocks of {type(model).__name__} hold their hidden states in {len(shape)} dimensions ({list(shape)} for '
        'the example input of the discovery pass; several residual streams per token, as hyper-connections and AltUp '
        'keep them), where the "residual" site reads [batch, seq, hidden]: latent relevance, neuron targets, '
        'conditions and steering of the residual site are not available for it; use the "mlp", "attention", '
        '"query", "key" or "value" site'
    )


def find_sites(model: torch.nn.Module, sites=SITES) -> dict[str, list[SitePoint]]:
    """The :py:class:`SitePoint` of every layer of each of ``sites`` in ``model``, from what the model computes
    (:py:func:`~zennit_attn.structure.model_structure`: one discovery pass per model instance, cached).

    Parameters
    ----------
    model: torch.nn.Module
        A decoder-only or encoder-only transformer, a vision transformer, or a vision-language model (its language
        model).
    sites: sequence of str
        Keys of :py:data:`SITES`.

    Returns
    -------
    dict
        ``site -> [SitePoint per layer]`` (``layers + 1`` points for ``'residual'``).

    Raises
    ------
    ValueError
        For an unknown site, a model without it (e.g. ``'mlp'`` in a routed mixture of experts; a
        :py:class:`~zennit_attn.structure.StructureError` where what the model computes does not show it; the
        ``'residual'`` site of blocks with several residual streams), or an encoder-decoder model.
    """
    if isinstance(sites, str):
        sites = (sites,)
    sites = tuple(sites)
    unknown = [site for site in sites if site not in SITES]
    if unknown:
        raise ValueError(f'unknown latent site(s) {unknown}; known sites: {", ".join(SITES)}')
    blocks = _block_stack(model)
    return {site: _points(site, blocks, model) for site in dict.fromkeys(sites)}
