"""The components relevance and activation patching score: latent sites (:py:mod:`zennit_attn.latent.sites`) read
as whole component outputs or as their units.

=============  ===========================  ==========================================================================
component      latent site                  what is patched
=============  ===========================  ==========================================================================
``residual``   ``'residual'``               the residual stream after each block (layer 0: the input of the first
                                            block, ``l + 1``: the output of block ``l``), all hidden dimensions
``attention``  ``'attention'``              the attention output: the input of the attention output projection, all
                                            heads (the projection is linear, so patching its input is patching its
                                            output, and ``(a' - a) . W^T g = (W a' - W a) . g``)
``heads``      ``'attention'``, per head    one head's output (its part of the output projection's input)
``mlp``        ``'mlp'``                    the MLP output: the input of the FFN down projection, all neurons (linear
                                            again, as for the attention output)
``neurons``    ``'mlp'``, per neuron        one FFN neuron
=============  ===========================  ==========================================================================

Each component has units (1 for a whole output, the heads, the neurons); a unit is patched at one position
(``per_position=True``) or at every position at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from ...latent.sites import SitePoint, find_sites

__all__ = ['COMPONENTS', 'DEFAULT_COMPONENTS', 'Component', 'component_points', 'check_components']

#: component -> (latent site, whether its units are the site's units (heads, neurons) rather than the whole output)
COMPONENTS: dict[str, tuple[str, bool]] = {
    'residual': ('residual', False),
    'attention': ('attention', False),
    'heads': ('attention', True),
    'mlp': ('mlp', False),
    'neurons': ('mlp', True),
}

#: The components scored by default (``neurons`` is cheap for relevance patching, but its activation patching costs
#: one forward pass per neuron and position).
DEFAULT_COMPONENTS: tuple[str, ...] = ('residual', 'attention', 'heads', 'mlp')


@dataclass(frozen=True)
class Component:
    """One component kind in one layer: ``name`` (a key of :py:data:`COMPONENTS`) at the latent site ``point``."""

    name: str
    point: SitePoint

    @property
    def per_unit(self) -> bool:
        return COMPONENTS[self.name][1]

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


def check_components(components) -> tuple[str, ...]:
    """``components`` as a tuple of keys of :py:data:`COMPONENTS`.

    Raises
    ------
    ValueError
        For an unknown component or none.
    """
    if isinstance(components, str):
        components = (components,)
    components = tuple(dict.fromkeys(components))
    unknown = [name for name in components if name not in COMPONENTS]
    if unknown or not components:
        raise ValueError(f'unknown component(s) {unknown or components}; known: {", ".join(COMPONENTS)}')
    return components


def component_points(model: torch.nn.Module, components: Sequence[str]) -> dict[str, list[Component]]:
    """``component -> [Component per layer]`` of ``model`` (:py:func:`~zennit_attn.latent.sites.find_sites`: a model
    without a site, e.g. the ``'mlp'`` of a routed mixture of experts, is refused with its reason)."""
    components = check_components(components)
    points = find_sites(model, tuple(dict.fromkeys(COMPONENTS[name][0] for name in components)))
    return {name: [Component(name, point) for point in points[COMPONENTS[name][0]]] for name in components}


def site_points(components: Mapping[str, list[Component]]) -> dict[str, list[SitePoint]]:
    """The latent site points the components need, each once (for a
    :py:class:`~zennit_attn.latent.recording.Recorder`)."""
    points: dict[str, list[SitePoint]] = {}
    for layers in components.values():
        for component in layers:
            points.setdefault(component.point.site, [])
            if component.point not in points[component.point.site]:
                points[component.point.site].append(component.point)
    return points
