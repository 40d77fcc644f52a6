"""The components relevance and activation patching score: latent sites (:py:mod:`zennit_attn.latent.sites`) read
as whole component outputs or as their units, and the sites derived from them (the outputs of the attention and FFN
output projections, the residual stream between attention and MLP), under their names or TransformerLens's.

=============  ======================================  =============================================================
component      site                                    what is patched
=============  ======================================  =============================================================
``residual``   ``'residual'``                          the residual stream between blocks (layer 0: the input of the
                                                       first block, ``l + 1``: the output of block ``l``), all hidden
                                                       dimensions
``resid_mid``  block input + ``attn_out``              the residual stream of block ``l`` after the attention, before
                                                       the MLP (sequential pre-norm blocks only, checked)
``attention``  ``'attention'``                         the input of the attention output projection, all heads (the
                                                       projection is linear, so patching its input is patching its
                                                       output, and ``(a' - a) . W^T g = (W a' - W a) . g``)
``heads``      ``'attention'``, per head               one head's output (its part of the output projection's input)
``attn_out``   output of the attention projection      the attention output projection's output (``W a + b``)
``mlp``        ``'mlp'``                               the input of the FFN down projection, all neurons (linear
                                                       again, as for the attention output)
``neurons``    ``'mlp'``, per neuron                   one FFN neuron
``mlp_out``    output of the FFN down projection       the MLP's output (``W h + b``)
=============  ======================================  =============================================================

TransformerLens's site names are accepted as well (:py:data:`TRANSFORMER_LENS`): ``resid_mid``, ``attn_out`` and
``mlp_out`` are components of their own, ``resid_pre`` (the residual stream entering block ``l``), ``resid_post``
(leaving block ``l``), ``z`` (per head) and ``mlp_post`` (the hidden activation after the non-linearity or the gate
product) name layers of ``residual``, ``heads`` and ``mlp`` (:py:data:`ALIASES`). A hook name of TransformerLens
(``'blocks.3.hook_resid_pre'``, :py:data:`HOOK_NAMES`) names one layer of one of them, and a module path of the model
(``'model.layers.3.mlp'``, as nnsight names modules) the output of that module (element 0 of a tuple), one unit at
one layer. The scores are keyed by the name given.

Each component has units (1 for a whole output, the heads, the neurons); a unit is patched at one position
(``per_position=True``) or at every position at once.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from ...latent.sites import HookHandles, SitePoint, find_sites
from ...structure import example_inputs

__all__ = [
    'COMPONENTS',
    'DEFAULT_COMPONENTS',
    'DERIVED_SITES',
    'ALIASES',
    'TRANSFORMER_LENS',
    'HOOK_NAMES',
    'Component',
    'ResidualSum',
    'component_points',
    'check_components',
    'check_sequential',
    'block_count',
    'site_points',
]

#: component -> (site: a latent site or a key of :py:data:`DERIVED_SITES`, whether its units are the site's units
#: (heads, neurons) rather than the whole output)
COMPONENTS: dict[str, tuple[str, bool]] = {
    'residual': ('residual', False),
    'resid_mid': ('resid_mid', False),
    'attention': ('attention', False),
    'heads': ('attention', True),
    'attn_out': ('attn_out', False),
    'mlp': ('mlp', False),
    'neurons': ('mlp', True),
    'mlp_out': ('mlp_out', False),
}

#: The components scored by default (``neurons`` is cheap for relevance patching, but its activation patching costs
#: one forward pass per neuron and position).
DEFAULT_COMPONENTS: tuple[str, ...] = ('residual', 'attention', 'heads', 'mlp')

#: TransformerLens's site names that name layers of a component: name -> (component, its layers; ``resid_pre``
#: ``l`` is the residual stream entering block ``l``, ``resid_post`` ``l`` the one leaving it).
ALIASES: dict[str, tuple[str, slice]] = {
    'resid_pre': ('residual', slice(0, -1)),
    'resid_post': ('residual', slice(1, None)),
    'z': ('heads', slice(None)),
    'mlp_post': ('mlp', slice(None)),
}

#: TransformerLens's site names (``blocks.{l}.<hook>``) and what each is here: a component or an alias.
TRANSFORMER_LENS: dict[str, str] = {
    'resid_pre': 'residual, layers 0 to L - 1',
    'resid_mid': 'resid_mid',
    'resid_post': 'residual, layers 1 to L',
    'attn_out': 'attn_out',
    'z': 'heads',
    'mlp_out': 'mlp_out',
    'mlp_post': 'mlp',
}

#: TransformerLens's hook names ``blocks.{l}.<hook>`` -> site name.
HOOK_NAMES: dict[str, str] = {
    'hook_resid_pre': 'resid_pre',
    'hook_resid_mid': 'resid_mid',
    'hook_resid_post': 'resid_post',
    'hook_attn_out': 'attn_out',
    'attn.hook_z': 'z',
    'hook_mlp_out': 'mlp_out',
    'mlp.hook_post': 'mlp_post',
}

_HOOK_NAME = re.compile(r'blocks\.(\d+)\.(.+)')


@dataclass(eq=False)
class ResidualSum(SitePoint):
    """The residual stream after a block's attention: the block's input plus the output of :py:attr:`module` (the
    attention output projection), for blocks that add that output to their input and feed the sum to the MLP and to
    the next residual addition (:py:func:`check_sequential`). The hooked function receives the sum; a tensor it
    returns replaces the sum (the module's output changes by the difference), and its gradient is the module
    output's (that of the sum): in a pass with gradients the output is replaced by itself computed through the sum
    (``output.detach() + (sum - sum.detach())``, the same values), so that the sum is on the backward pass's path."""

    def hook(self, function, prepend: bool = False) -> HookHandles:
        """As :py:meth:`SitePoint.hook`, with the sum as the hooked tensor (``[batch, seq, hidden]``)."""
        kept: dict = {}

        def keep(module, args, kwargs):
            kept['base'] = next(value for value in (*args, *kwargs.values()) if isinstance(value, torch.Tensor))

        def post(module, args, output):
            tensor = output if isinstance(output, torch.Tensor) else output[self.index or 0]
            total = tensor + kept.pop('base').detach()
            result = function(total)
            if result is None and not tensor.requires_grad:
                return None
            # the module's output as it was (x - x is 0 exactly), on a path through the sum in the backward pass:
            # the gradient reaches the sum (whose hooks read it) and from it the output, once
            changed = tensor.detach() + (total - total.detach()) if result is None else tensor + (result - total)
            if isinstance(output, torch.Tensor):
                return changed
            return type(output)(changed if index == (self.index or 0) else item for index, item in enumerate(output))

        return HookHandles(
            [
                self.block.register_forward_pre_hook(keep, with_kwargs=True),
                self.module.register_forward_hook(post, prepend=prepend),
            ]
        )


def _output(site: str, point: SitePoint) -> SitePoint:
    """The output of the module whose input is the latent site ``point``."""
    return SitePoint(site, point.layer, point.module, 'output', block=point.block)


def _residual_sum(site: str, point: SitePoint) -> SitePoint:
    """The residual stream after the attention whose output projection's input is ``point``."""
    return ResidualSum(site, point.layer, point.module, 'output', block=point.block)


#: derived site -> (the latent site it is derived from, how its point is made of the latent site's point)
DERIVED_SITES: dict[str, tuple[str, Callable[[str, SitePoint], SitePoint]]] = {
    'attn_out': ('attention', _output),
    'mlp_out': ('mlp', _output),
    'resid_mid': ('attention', _residual_sum),
}


@dataclass(frozen=True)
class Component:
    """One component kind in one layer: ``name`` (a key of :py:data:`COMPONENTS`, or the module path of a module's
    output) at the site ``point``; ``layer`` its number on the block axis (block ``l``; for ``'residual'`` the
    stream entering block ``l``; None for a module path)."""

    name: str
    point: SitePoint
    layer: int | None = None

    @property
    def per_unit(self) -> bool:
        return COMPONENTS[self.name][1] if self.name in COMPONENTS else False

    @property
    def site_key(self) -> tuple[str, int]:
        """The latent site's ``(site, layer)``: the key of its tensors in a
        :py:class:`~zennit_attn.latent.recording.Recorder`."""
        return self.point.site, self.point.layer

    def units(self, features: int) -> int:
        """Number of units of a site tensor with ``features`` features (1 for a whole output)."""
        return self.point.units(features) if self.per_unit else 1

    def reduce(self, values: torch.Tensor) -> torch.Tensor:
        """``[..., features]`` per-feature values of the site tensor -> ``[..., units]``: the sum over each unit's
        features."""
        if not self.per_unit:
            return values.sum(-1, keepdim=True)
        if self.point.heads is not None:
            return values.unflatten(-1, (self.point.heads, -1)).sum(-1)
        return values

    def feature_mask(self, unit: int, size: int, device) -> torch.Tensor:
        """``[size]`` boolean mask of the hooked tensor's features that belong to ``unit``."""
        mask = torch.zeros(size, dtype=torch.bool, device=device)
        if self.per_unit:
            mask[self.point.hooked_features(unit, size, device)] = True
            return mask
        site = self.point.feature_mask(size, device)
        return mask.fill_(True) if site is None else site.clone()


def _names() -> str:
    return (
        f'components: {", ".join(COMPONENTS)}; TransformerLens site names: {", ".join(TRANSFORMER_LENS)}; hook names '
        f'blocks.<layer>.<hook> with <hook> one of {", ".join(HOOK_NAMES)}; or the path of a module of the model '
        "(e.g. 'model.layers.0.mlp')"
    )


def check_components(components) -> tuple[str, ...]:
    """``components`` as a tuple of names (each once).

    Raises
    ------
    ValueError
        For none, or a name that is not a string.
    """
    if isinstance(components, str):
        components = (components,)
    components = tuple(dict.fromkeys(components))
    wrong = [name for name in components if not isinstance(name, str) or not name]
    if wrong or not components:
        raise ValueError(f'unknown component(s) {wrong or components}; known: {_names()}')
    return components


def _component_layers(model: torch.nn.Module, name: str, layers: slice) -> list[Component]:
    """The components of ``name`` (a key of :py:data:`COMPONENTS`) in ``layers``."""
    site = COMPONENTS[name][0]
    derived = DERIVED_SITES.get(site)
    points = find_sites(model, derived[0] if derived else site)[derived[0] if derived else site]
    if derived:
        points = [derived[1](site, point) for point in points]
    if site == 'resid_mid':
        check_sequential(model, points)
    numbers = range(len(points))
    return [Component(name, points[index], index) for index in numbers[layers]]


def _resolve(model: torch.nn.Module, name: str) -> list[Component]:
    """The components a name gives: a component, an alias, a hook name or a module path."""
    if name in COMPONENTS:
        return _component_layers(model, name, slice(None))
    if name in ALIASES:
        component, layers = ALIASES[name]
        found = _component_layers(model, component, layers)
        # numbered from 0 on the block axis: resid_post l leaves block l
        return [Component(item.name, item.point, item.layer - found[0].layer) for item in found]
    hook = _HOOK_NAME.fullmatch(name)
    if hook and hook.group(2) in HOOK_NAMES:
        found = _resolve(model, HOOK_NAMES[hook.group(2)])
        chosen = [item for item in found if item.layer == int(hook.group(1))]
        if not chosen:
            raise ValueError(
                f'{name!r}: the model has {len(found)} layers of {HOOK_NAMES[hook.group(2)]!r} (0 to {len(found) - 1})'
            )
        return chosen
    try:
        module = model.get_submodule(name)
    except AttributeError:
        raise ValueError(f'unknown component {name!r}; known: {_names()}') from None
    return [Component(name, SitePoint(name, 0, module, 'output', index=0))]


def component_points(model: torch.nn.Module, components: Sequence[str]) -> dict[str, list[Component]]:
    """``name -> [Component per layer]`` of ``model`` for each of ``components`` (keys of :py:data:`COMPONENTS`,
    TransformerLens's site names (:py:data:`ALIASES`) and hook names (:py:data:`HOOK_NAMES`), module paths): the
    latent sites (:py:func:`~zennit_attn.latent.sites.find_sites`: a model without a site, e.g. the ``'mlp'`` of a
    routed mixture of experts, is refused with its reason) and those derived from them (:py:data:`DERIVED_SITES`).

    Raises
    ------
    ValueError
        For an unknown name (the message lists the known ones), a model without a site, a layer the model does not
        have, ``resid_mid`` in a model whose blocks are not sequential (:py:func:`check_sequential`).
    """
    return {name: _resolve(model, name) for name in check_components(components)}


def check_sequential(model: torch.nn.Module, points: Sequence[ResidualSum], rtol: float = 1e-4) -> None:
    """Check on the model's example input (:py:func:`~zennit_attn.structure.example_inputs`) that the first block
    is sequential, as :py:class:`ResidualSum` needs: its output is its input plus the outputs of the attention
    output projection and of the FFN down projection (no post-attention norms, no scaled residuals), and its MLP
    reads the sum of the input and the attention output (not the input alone, as in parallel blocks).

    Raises
    ------
    ValueError
        Where either does not hold (the ``resid_mid`` of such a model is no tensor of its forward pass).
    """
    point = points[0]
    mlp = find_sites(model, 'mlp')['mlp'][0].module
    inputs = example_inputs(model)
    seen: dict = {}

    def record(name):
        def hook(module, args, output):
            seen[name] = output if isinstance(output, torch.Tensor) else output[0]

        return hook

    def record_input(module, args, kwargs):
        seen['input'] = next(value for value in (*args, *kwargs.values()) if isinstance(value, torch.Tensor))

    def scaled(module, args, output):
        return output * 2

    runs = []
    for extra in (None, scaled):
        handles = [
            point.block.register_forward_pre_hook(record_input, with_kwargs=True),
            point.module.register_forward_hook(record('attention')),
            mlp.register_forward_hook(record('mlp')),
            point.block.register_forward_hook(record('output')),
        ]
        if extra is not None:
            handles.append(point.module.register_forward_hook(extra))
        try:
            with torch.no_grad():
                model(**inputs)
        finally:
            for handle in handles:
                handle.remove()
        runs.append(dict(seen))
        seen.clear()
    first, second = runs
    summed = first['input'] + first['attention'] + first['mlp']
    scale = float(first['output'].abs().max())
    sequential = torch.allclose(summed, first['output'], rtol=rtol, atol=rtol * scale)
    if not sequential or torch.equal(first['mlp'], second['mlp']):
        reason = (
            'its MLP does not read the attention output (parallel attention and MLP)'
            if sequential
            else (
                'its output is not its input plus the outputs of the attention and FFN output projections (norms '
                'after them, scaled residuals)'
            )
        )
        raise ValueError(
            f'{type(model).__name__} has no resid_mid: {reason}; patch resid_pre, resid_post, attn_out or mlp_out'
        )


def block_count(model: torch.nn.Module) -> int:
    """The number of blocks of the model's stack of transformer blocks."""
    return len(find_sites(model, 'residual')['residual']) - 1


def site_points(components: Mapping[str, list[Component]]) -> dict[str, list[SitePoint]]:
    """The site points the components need, each ``(site, layer)`` once (for a
    :py:class:`~zennit_attn.latent.recording.Recorder`)."""
    unique = {component.site_key: component.point for layers in components.values() for component in layers}
    points: dict[str, list[SitePoint]] = {}
    for point in unique.values():
        points.setdefault(point.site, []).append(point)
    return points
