"""The errors zennit-attn raises where it refuses to explain: one base class, :py:class:`ZennitAttnError`.

Every refusal is an :py:class:`Exception` of its own kind, not a :py:class:`TypeError`: torch turns a ``TypeError``
raised inside an operator's ``__torch_function__`` (``a + b`` while the engine classifies it) into ``NotImplemented``,
and Python then raises a ``TypeError`` of its own without the refusal's message. A refusal derived from
:py:class:`ZennitAttnError` reaches the caller as it was raised.
"""

from __future__ import annotations

__all__ = ['ZennitAttnError', 'UnsupportedModelError', 'CompiledModelError']


class ZennitAttnError(Exception):
    """Base of the refusals of zennit-attn: a model, a module, an operation or an input that no rule explains
    correctly. The message names what is refused and what to do instead."""


class UnsupportedModelError(ZennitAttnError):
    """A model contains modules or operations that zennit-attn has no rule for (the message names the operation and
    the module path)."""


class CompiledModelError(ZennitAttnError):
    """A model, or one of its submodules, is compiled with ``torch.compile``, which bypasses the hooks of the LRP
    rules (see :py:func:`~zennit_attn.composites.refuse_compiled`)."""
