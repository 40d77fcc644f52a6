"""Where latent relevance is read: the sites of a transformer, found from the family table, and :py:class:`Neuron`.

A *site* is a tensor inside every transformer block (paper section 3.5, "Understanding latent features"):

- ``'mlp'``: the input of the block's FFN down (output) projection, the "knowledge neurons" at the last
  non-linearity (``act(gate) * up`` in gated MLPs, ``act(fc1)`` otherwise); the projection is the family table's
  :py:attr:`~zennit_attn.engine.canonizers.Family.mlp_output`. Units: the FFN neurons.
- ``'attention'``: the input of the attention output projection (``A V`` of all heads, the table's
  :py:attr:`~zennit_attn.engine.canonizers.Family.attention_output`), split per head. Units: the heads; a head's value is
  the sum over its head dimension.
- ``'residual'``: the residual stream between blocks; layer 0 is the input of the first block, layer ``l + 1`` the
  output of block ``l``. Units: the hidden dimensions (recorded summed over them).
- ``'query'``, ``'key'``, ``'value'``: the outputs of the attention's q/k/v projections (the table's operand taps,
  fused projections split by their sections). Units: their features.

Routed mixtures of experts (Mixtral, Qwen-MoE, OLMoE) have no ``'mlp'`` site: a token's FFN is a routing-weighted
sum of a few of many experts, so "neuron ``i`` of layer ``l``" has no fixed meaning across tokens; their attention,
residual and q/k/v sites are recorded as for every other family. Encoder-decoder models (T5) are refused: their
encoder and decoder blocks see sequences of different lengths.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field

import torch

from ..engine.canonizers import block_stacks, family_of

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
    last dimension, for fused projections) and ``heads`` (the attention site: features split into that many
    heads)."""

    site: str
    layer: int
    module: torch.nn.Module
    kind: str
    index: int | None = None
    role: str | None = None
    tap: object = None
    heads: int | None = None
    masks: dict = field(default_factory=dict, repr=False)

    # --------------------------------------------------------------------------------------------- tensor access
    def select(self, tensor: torch.Tensor) -> torch.Tensor:
        """The site's features of the hooked tensor (all of them unless the projection is fused)."""
        mask = self.feature_mask(tensor.shape[-1], tensor.device)
        return tensor if mask is None else tensor[..., mask]

    def feature_mask(self, size: int, device) -> torch.Tensor | None:
        """``[size]`` boolean mask of the hooked tensor's last dimension that belongs to the site, or None (all)."""
        if self.tap is None:
            return None
        if size not in self.masks:
            self.masks[size] = self.tap.mask(self.role, size)
        return self.masks[size].to(device)

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
        if self.site == 'residual' or self.tap is not None:
            return None
        weight = getattr(self.module, 'weight', None)
        if isinstance(self.module, torch.nn.Linear):
            return self.module.in_features if self.kind == 'input' else self.module.out_features
        if weight is not None and weight.dim() == 2:  # transformers' Conv1D: weight [in, out]
            return weight.shape[0 if self.kind == 'input' else 1]
        return None

    # --------------------------------------------------------------------------------------------- hooks
    def hook(self, function, prepend: bool = False) -> torch.utils.hooks.RemovableHandle:
        """Call ``function(tensor)`` with the hooked tensor ``[batch, seq, ...]`` (whose :py:meth:`select` is the
        site tensor); a tensor it returns replaces it in the forward pass. Hooks run in the order they were
        registered (steering entered first edits first; recording registered before a composite's context sees the
        tensor before the composite's hooks), or first of all with ``prepend``. Hooks only the instance; remove the
        returned handle."""
        if self.kind == 'input':

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

            return self.module.register_forward_pre_hook(pre, prepend=prepend, with_kwargs=True)

        def post(module, args, output):
            tensor = output if self.index is None or isinstance(output, torch.Tensor) else output[self.index]
            result = function(tensor)
            if result is None:
                return None
            if self.index is None or isinstance(output, torch.Tensor):
                return result
            return type(output)(result if position == self.index else item for position, item in enumerate(output))

        return self.module.register_forward_hook(post, prepend=prepend)

    def hooked_features(self, index: int, size: int, device) -> torch.Tensor:
        """Indices into the hooked tensor's last dimension (of ``size``) of the features of unit ``index``."""
        mask = self.feature_mask(size, device)
        features = int(mask.sum()) if mask is not None else size
        positions = torch.arange(size, device=device) if mask is None else mask.nonzero()[:, 0]
        return positions[self.unit_features(index, features)]


def _block_stack(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks of the model's one stack of transformer blocks (:py:func:`~zennit_attn.engine.canonizers.block_stacks`)."""
    if getattr(getattr(model, 'config', None), 'is_encoder_decoder', False):
        raise ValueError(
            f'{type(model).__name__} is an encoder-decoder model: latent sites are defined for '
            'decoder-only and encoder-only transformers (encoder and decoder blocks see different '
            'sequences)'
        )
    stacks = block_stacks(model)
    if len(stacks) != 1:
        raise ValueError(
            f'{type(model).__name__} has {len(stacks)} stacks of transformer blocks '
            f'({", ".join(repr(path) for path, _ in stacks)}): latent sites need exactly one'
        )
    return stacks[0][1]


def _attention_outputs(block: torch.nn.Module) -> list[tuple[torch.nn.Module, torch.nn.Module]]:
    found = []
    for module in block.modules():
        family = family_of(module)
        child = None if family is None else family.attention_output.get(type(module).__name__)
        if child is not None and isinstance(getattr(module, child, None), torch.nn.Module):
            found.append((module, getattr(module, child)))
    return found


def _heads(model: torch.nn.Module, owner: torch.nn.Module) -> int:
    config = getattr(model, 'config', None)
    config = config.get_text_config() if hasattr(config, 'get_text_config') else config
    for source in (owner, getattr(owner, 'config', None), config):
        for name in ('num_heads', 'num_attention_heads', 'n_head', 'n_heads'):
            value = getattr(source, name, None)
            if isinstance(value, int) and value > 0:
                return value
    raise ValueError(f'cannot tell the number of attention heads of {type(owner).__name__}')


def _one(points: list, what: str, layer: int, model) -> object:
    if len(points) != 1:
        raise ValueError(
            f'block {layer} of {type(model).__name__} has {len(points)} {what} modules; latent sites need '
            'exactly one per block'
        )
    return points[0]


def find_sites(model: torch.nn.Module, sites=SITES) -> dict[str, list[SitePoint]]:
    """The :py:class:`SitePoint` of every layer of each of ``sites`` in ``model``, from the family table.

    Parameters
    ----------
    model: torch.nn.Module
        A decoder-only or encoder-only transformer of a supported family (or a vision transformer).
    sites: sequence of str
        Keys of :py:data:`SITES`.

    Returns
    -------
    dict
        ``site -> [SitePoint per layer]`` (``layers + 1`` points for ``'residual'``).

    Raises
    ------
    ValueError
        For an unknown site, a model without it (e.g. ``'mlp'`` in a routed mixture of experts), or an
        encoder-decoder model.
    """
    if isinstance(sites, str):
        sites = (sites,)
    sites = tuple(sites)
    unknown = [site for site in sites if site not in SITES]
    if unknown:
        raise ValueError(f'unknown latent site(s) {unknown}; known sites: {", ".join(SITES)}')
    blocks = _block_stack(model)
    found: dict[str, list[SitePoint]] = {}
    for site in dict.fromkeys(sites):
        points = []
        if site == 'residual':
            points.append(SitePoint('residual', 0, blocks[0], 'input'))
            points += [SitePoint('residual', layer + 1, block, 'output', index=0) for layer, block in enumerate(blocks)]
        for layer, block in enumerate(blocks):
            if site == 'attention':
                owner, child = _one(_attention_outputs(block), 'attention output', layer, model)
                points.append(SitePoint('attention', layer, child, 'input', heads=_heads(model, owner)))
            elif site == 'mlp':
                candidates = []
                for module in block.modules():
                    family = family_of(module)
                    name = None if family is None else family.mlp_output.get(type(module).__name__)
                    if name is not None and isinstance(getattr(module, name, None), torch.nn.Module):
                        candidates.append(getattr(module, name))
                if not candidates:
                    family = next((family_of(module) for module in block.modules() if family_of(module)), None)
                    name = family.name if family is not None else type(block).__name__
                    raise ValueError(
                        f'the {name} family has no "mlp" site: '
                        + (
                            'its FFN is a routed mixture of experts, whose neurons have no fixed per-token meaning; '
                            'record "attention", "residual", "query", "key" or "value"'
                            if family is not None and family.inline_operands
                            else 'the family table lists no FFN down projection (Family.mlp_output) for it'
                        )
                    )
                points.append(SitePoint('mlp', layer, _one(candidates, 'FFN down projection', layer, model), 'input'))
            elif site in ('query', 'key', 'value'):
                candidates = []
                for module in block.modules():
                    family = family_of(module)
                    if family is None:
                        continue
                    for child, tap in family.taps(module).items():
                        if site in tap.roles and isinstance(getattr(module, child, None), torch.nn.Module):
                            fused = len(tap.roles) > 1
                            candidates.append(
                                SitePoint(
                                    site,
                                    layer,
                                    getattr(module, child),
                                    'output',
                                    index=tap.index,
                                    role=site if fused else None,
                                    tap=tap if fused else None,
                                )
                            )
                points.append(_one(candidates, f'{site} projection', layer, model))
        found[site] = points
    return found
