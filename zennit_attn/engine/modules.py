"""Modules and module helpers of the engine: :py:class:`Logits` (a model's scores for zennit's attributors),
:py:func:`forward_parameters` (what a module's forward takes), :py:func:`output_scores`, and :py:class:`Operand` (the
roles of the operands of a family's inline products, as the family table declares them)."""

from __future__ import annotations

import functools
import inspect

import torch

#: Roles an :py:class:`Operand` may take, with the products each role enters.
ROLES = {
    'query': 'attention scores Q K^T (Prop. 3.3), whose softmax enters A V (Prop. 3.3)',
    'key': 'attention scores Q K^T (Prop. 3.3), whose softmax enters A V (Prop. 3.3)',
    'value': 'attention output A V (Prop. 3.3)',
    'gate': 'element-wise product act(gate) * up of a gated MLP (Prop. 3.2)',
    'up': 'element-wise product act(gate) * up of a gated MLP (Prop. 3.2)',
    'routing': 'routing weights of a mixture of experts, factors of weight * expert output (Prop. 3.2)',
    'routed': 'sum over experts of routing weight * expert output (Prop. 3.2 on each product)',
}


class Operand(torch.nn.Module):
    """Identity on a tensor that is an operand of a product computed inline by the host model.

    Parameters
    ----------
    role: str or tuple[str, ...]
        The role of the tensor (a key of :py:data:`ROLES`), or one role per section of the last dimension
        for fused projections (e.g. GPT-2's ``c_attn`` producing query, key and value at once).
    sections: tuple[int, ...], optional
        Sizes of the sections of the last dimension, one per role; by default equal sizes.
    """

    def __init__(self, role: str | tuple[str, ...], sections: tuple[int, ...] | None = None):
        super().__init__()
        roles = (role,) if isinstance(role, str) else tuple(role)
        unknown = [name for name in roles if name not in ROLES]
        if unknown:
            raise ValueError(f'Unknown operand role(s) {unknown}; known roles: {sorted(ROLES)}')
        if sections is not None and len(sections) != len(roles):
            raise ValueError(f'{len(roles)} roles need {len(roles)} sections, got {sections}')
        self.roles = roles
        self.sections = None if sections is None else tuple(int(size) for size in sections)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return input

    def section_sizes(self, size: int) -> tuple[int, ...]:
        """Sizes of the sections of a last dimension of ``size`` elements, one per role."""
        if self.sections is not None:
            if sum(self.sections) != size:
                raise ValueError(f'Operand sections {self.sections} do not add up to the last dimension {size}')
            return self.sections
        if size % len(self.roles):
            raise ValueError(f'Last dimension {size} cannot be split into {len(self.roles)} equal sections')
        return (size // len(self.roles),) * len(self.roles)

    def extra_repr(self) -> str:
        return f'roles={self.roles}' + (f', sections={self.sections}' if self.sections else '')


def forward_parameters(module: torch.nn.Module) -> tuple[str, ...]:
    """The names of the parameters of ``module.forward`` (none where it has no signature), cached per class's forward
    (not for a forward set on the instance: a wrapper such as accelerate's holds its module, which a cache would keep
    alive)."""
    forward = module.forward
    function = getattr(forward, '__func__', None)
    if function is not None and getattr(type(module), 'forward', None) is function:
        return _parameters(function)[1:]  # the method's ``self``
    return _signature(forward)


def _signature(function) -> tuple[str, ...]:
    try:
        return tuple(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return ()


_parameters = functools.lru_cache(maxsize=4096)(_signature)


def output_scores(output) -> torch.Tensor:
    """The scores a model output explains: the tensor itself, the ``logits`` (else ``last_hidden_state``) of a Hugging
    Face model output, or the first element of a tuple."""
    if isinstance(output, torch.Tensor):
        return output
    for field in ('logits', 'last_hidden_state'):
        value = output.get(field) if hasattr(output, 'get') else None
        if value is not None:
            return value
    if isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise TypeError(f'Cannot find logits or last_hidden_state in the model output {type(output).__name__}')


class Logits(torch.nn.Module):
    """Wrap a model whose output is not a tensor (a Hugging Face ``ImageClassifierOutput``) so that it returns its
    scores (:py:func:`output_scores`), as zennit's attributors need::

        with Gradient(model=Logits(hf_vit), composite=AttnLRPGamma()) as attributor:
            output, relevance = attributor(pixels, one_hot)
    """

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *args, **kwargs) -> torch.Tensor:
        return output_scores(self.model(*args, **kwargs))
