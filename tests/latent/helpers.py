"""Shared by the tests of ``zennit_attn.latent``: a bias-free tiny Llama, plain hooks that keep a module's tensor and
its ``x * grad`` independently of the package's site code, and the models of every family of the table."""

from __future__ import annotations

from tests.models import pixels, tiny_hf_vit, tiny_model, tiny_timm_vit, token_ids

TIGHT = dict(rtol=1e-9, atol=1e-12)


def llama(**kwargs):
    """The bias-free tiny Llama of :py:func:`tests.models.tiny_model` (``kwargs``: its further arguments)."""
    return tiny_model('llama', zero_bias=True, **kwargs)


def watch(module, store, name, output=True):
    """Keep ``x`` and ``x * grad`` of a module's output (or first input) with plain hooks, independent of the
    package's site code."""

    def keep(tensor):
        tensor = tensor[0] if isinstance(tensor, tuple) else tensor
        store[name] = {'x': tensor.detach()}
        if tensor.requires_grad:
            tensor.register_hook(lambda grad: store[name].__setitem__('r', tensor.detach() * grad))

    if output:
        return module.register_forward_hook(lambda module, args, out: keep(out))
    return module.register_forward_pre_hook(lambda module, args: keep(args[0]))


def build(family):
    """``(model, explain kwargs)`` of every family of the table (vision transformers included)."""
    if family == 'timm-vit':
        return tiny_timm_vit(), dict(input_ids=pixels())
    if family == 'vit':
        return tiny_hf_vit(), dict(input_ids=pixels())
    head = {'roberta': 'masked_lm'}.get(family)
    return tiny_model(family, head), dict(input_ids=token_ids(family, 6, 1))
