"""The rules of the engine written out by hand in the gradient formulation, on small modules: a forward
with the rules applied by hand (:py:func:`scaled`, :py:func:`identity`, ``detach``) differentiated plainly
(:py:func:`by_hand`), against the library's relevance (:py:func:`attributed`)."""

from __future__ import annotations

import torch

from zennit_attn.composites import CPLRPEpsilon


def scaled(tensor: torch.Tensor, factor: float) -> torch.Tensor:
    """``tensor`` whose gradient is multiplied by ``factor`` (detached for 0): a factor's share (Prop. 3.2)."""
    if factor == 0:
        return tensor.detach()
    result = tensor.view_as(tensor)
    result.register_hook(lambda grad: grad * factor)
    return result


def identity(input: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
    """``output`` (an element-wise function of ``input``) with the identity rule's gradient ``f(x) / x`` (Eq. 9)."""
    ratio = (output / input).detach()
    return input * ratio


def by_hand(forward, x: torch.Tensor) -> torch.Tensor:
    """Relevance at ``x`` for relevance 1 at every output element, by the plain gradient of ``forward`` (written with
    the rules applied by hand: :py:func:`scaled`, :py:func:`identity`, ``detach``)."""
    xx = x.clone().requires_grad_(True)
    out = forward(xx)
    (out * torch.where(out == 0, 0.0, 1 / out).detach()).sum().backward()
    return xx.grad * x


def attributed(model, composite, x: torch.Tensor) -> torch.Tensor:
    """The relevance at ``x`` of ``model`` under ``composite`` for relevance 1 at every output element."""
    leaf = x.clone().requires_grad_(True)
    with composite.context(model) as modified:
        modified(leaf).sum().backward()
    return leaf.grad


def assert_same_relevance(model, reference, composite, outputs: int):
    """``model`` (float64, ``reference``'s parameters) gets the relevance of ``reference``, the same function written
    otherwise, on a random ``[3, 4]`` input (1e-12); CP-LRP conserves the relevance 1 of each of its ``outputs``
    (1e-10)."""
    torch.manual_seed(0)
    x = torch.randn(3, 4, dtype=torch.float64)
    model, reference = model.double(), reference.double()
    reference.load_state_dict(model.state_dict())
    found = attributed(model, composite(), x)
    torch.testing.assert_close(found, attributed(reference, composite(), x), rtol=0, atol=1e-12)
    if composite is CPLRPEpsilon:
        torch.testing.assert_close(
            found.sum(), torch.tensor(float(outputs), dtype=torch.float64), rtol=1e-10, atol=1e-12
        )
