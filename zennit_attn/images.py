"""Explaining image classifiers (timm ``VisionTransformer``/DeiT, Hugging Face ``ViTForImageClassification``):
pixel relevance by AttnLRP with the gamma composite, and the baselines of the paper's ViT comparison.

:py:func:`explain_image` is what :py:func:`zennit_attn.explain` calls for a floating-point ``[batch, channels,
height, width]`` input. Every method explains the same quantity, the target logit (no softmax), and returns an
:py:class:`ImageExplanation` with ``pixel_relevance`` ``[batch, channels, height, width]`` and ``relevance``
``[batch, height, width]`` (summed over channels). Methods that work on tokens (attention rollout,
gradient x rollout, Grad-CAM) give each pixel the value of its patch.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch

__all__ = ['ImageExplanation', 'explain_image', 'image_logits', 'attention_capture', 'IMAGE_METHODS', 'Logits']


@dataclass
class ImageExplanation:
    """What :py:func:`explain_image` returns.

    Attributes
    ----------
    relevance: torch.Tensor
        ``[batch, height, width]`` relevance per pixel (summed over channels).
    pixel_relevance: torch.Tensor
        ``[batch, channels, height, width]`` relevance per pixel and channel.
    target: torch.Tensor
        ``[batch]`` the explained class.
    logit: torch.Tensor
        ``[batch]`` the explained logit; for LRP the initial relevance.
    pixels: torch.Tensor
        ``[batch, channels, height, width]`` the explained input.
    method: str
        The method's name.
    """
    relevance: torch.Tensor
    pixel_relevance: torch.Tensor
    target: torch.Tensor
    logit: torch.Tensor
    pixels: torch.Tensor
    method: str = 'attnlrp'


def image_logits(output) -> torch.Tensor:
    """The ``[batch, classes]`` logits of a model output (tensor, tuple, or Hugging Face ``ImageClassifierOutput``)."""
    if isinstance(output, torch.Tensor):
        return output
    logits = output.get('logits') if hasattr(output, 'get') else None
    if logits is not None:
        return logits
    if isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise TypeError(f'Cannot find logits in the model output {type(output).__name__}')


class Logits(torch.nn.Module):
    """Wrap a classifier whose output is not a tensor (Hugging Face ``ImageClassifierOutput``) so that it returns
    its logits, as zennit's attributors need::

        with Gradient(model=Logits(hf_vit), composite=AttnLRPGamma()) as attributor:
            output, relevance = attributor(pixels, one_hot)
    """
    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return image_logits(self.model(pixels))


def _check(model: torch.nn.Module, pixels) -> torch.Tensor:
    if model.training:
        raise ValueError(f'{type(model).__name__} is in training mode (dropout active): call model.eval() first')
    pixels = torch.as_tensor(pixels)
    if pixels.dim() == 3:
        pixels = pixels[None]
    if pixels.dim() != 4 or not pixels.is_floating_point():
        raise ValueError(f'pixels must be a float tensor [batch, channels, height, width], got {pixels.dtype} '
                         f'{tuple(pixels.shape)}')
    return pixels.detach()


def _targets(target, logits: torch.Tensor) -> torch.Tensor:
    batch, classes = logits.shape
    if target is None:
        return logits.detach().argmax(-1)
    targets = torch.as_tensor(target, device=logits.device).long().flatten()
    if targets.numel() == 1:
        targets = targets.expand(batch)
    if targets.numel() != batch or bool(((targets < 0) | (targets >= classes)).any()):
        raise ValueError(f'target {target} does not fit {batch} rows of {classes} classes')
    return targets


def _select(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return logits.gather(1, targets[:, None].to(logits.device))[:, 0]


def _finish(pixels, pixel_relevance, targets, logit, method) -> ImageExplanation:
    pixel_relevance = pixel_relevance.detach()
    if torch.finfo(pixel_relevance.dtype).bits < 32:
        pixel_relevance = pixel_relevance.float()
    return ImageExplanation(relevance=pixel_relevance.sum(1), pixel_relevance=pixel_relevance, target=targets,
                            logit=logit.detach(), pixels=pixels, method=method)


def _plain(model, pixels, target):
    with torch.no_grad():
        logits = image_logits(model(pixels))
    targets = _targets(target, logits)
    return targets, _select(logits, targets)


def _gradient(model, pixels, targets) -> tuple[torch.Tensor, torch.Tensor]:
    """``(d logit / d pixels, logit)`` of a batch."""
    with torch.enable_grad():
        x = pixels.clone().requires_grad_(True)
        logit = _select(image_logits(model(x)), targets)
        (grad,) = torch.autograd.grad(logit.sum(), x)
    return grad, logit


# ----------------------------------------------------------------------------------------------------------- LRP
def lrp(model, pixels, target=None, composite=None) -> ImageExplanation:
    """LRP with ``composite`` (default :py:class:`~zennit_attn.composites.AttnLRPGamma`, the paper's ViT
    composite) in one forward and one backward pass; the target logit is the initial relevance."""
    from .composites import AttnLRPGamma

    composite = AttnLRPGamma() if composite is None else composite
    with torch.enable_grad():
        x = pixels.clone().requires_grad_(True)
        with composite.context(model) as modified:
            logits = image_logits(modified(x))
            targets = _targets(target, logits)
            logit = _select(logits, targets)
            (relevance,) = torch.autograd.grad(logit, x, grad_outputs=logit.detach())
    return _finish(pixels, relevance, targets, logit, 'attnlrp')


# ----------------------------------------------------------------------------------------------------- baselines
def input_x_gradient(model, pixels, target=None) -> ImageExplanation:
    """Gradient x input. One forward and one backward pass."""
    targets, _ = _plain(model, pixels, target)
    grad, logit = _gradient(model, pixels, targets)
    return _finish(pixels, pixels * grad, targets, logit, 'input_x_gradient')


def integrated_gradients(model, pixels, target=None, steps: int = 20, baseline: float = 0.0) -> ImageExplanation:
    """Integrated Gradients (Sundararajan et al. 2017) from a constant ``baseline`` image: ``(x - x0)`` times the
    mean gradient at ``x0 + k/steps (x - x0)``, ``k = 1..steps`` (right Riemann sum, as zennit's). ``steps``
    forward and backward passes."""
    targets, logit = _plain(model, pixels, target)
    start = torch.full_like(pixels, baseline)
    total = torch.zeros_like(pixels)
    for k in range(1, steps + 1):
        grad, _ = _gradient(model, start + k / steps * (pixels - start), targets)
        total += grad
    return _finish(pixels, (pixels - start) * total / steps, targets, logit, 'integrated_gradients')


def smoothgrad(model, pixels, target=None, sigma: float = 0.1, samples: int = 20, seed: int | None = 0,
               multiply_input: bool = True) -> ImageExplanation:
    """SmoothGrad (Smilkov et al. 2017): the mean gradient over ``samples`` copies with Gaussian noise of
    standard deviation ``sigma`` times each image's value range; multiplied by the input by default (a signed
    relevance like gradient x input). ``samples`` forward and backward passes."""
    targets, logit = _plain(model, pixels, target)
    scale = sigma * (pixels.flatten(1).amax(1) - pixels.flatten(1).amin(1)).view(-1, 1, 1, 1)
    generator = None if seed is None else torch.Generator(device=pixels.device).manual_seed(seed)
    total = torch.zeros_like(pixels)
    for _ in range(samples):
        noise = torch.randn(pixels.shape, generator=generator, device=pixels.device, dtype=pixels.dtype)
        grad, _ = _gradient(model, pixels + scale * noise, targets)
        total += grad
    mean = total / samples
    return _finish(pixels, mean * pixels if multiply_input else mean, targets, logit, 'smoothgrad')


def random(model, pixels, target=None, seed: int | None = 0) -> ImageExplanation:
    """Random relevance (standard normal, seeded): the chance level of the faithfulness score."""
    targets, logit = _plain(model, pixels, target)
    generator = None if seed is None else torch.Generator(device=pixels.device).manual_seed(seed)
    relevance = torch.randn(pixels.shape, generator=generator, device=pixels.device, dtype=pixels.dtype)
    return _finish(pixels, relevance, targets, logit, 'random')


# ----------------------------------------------------------------------------------------------- attention maps
def _is_timm_attention(module) -> bool:
    return type(module).__module__.startswith('timm.') and hasattr(module, 'fused_attn') and hasattr(
        module, 'attn_drop') and hasattr(module, 'qkv')


def _is_hf_attention(module) -> bool:
    return type(module).__name__ in ('ViTAttention', 'ViTSelfAttention') and type(module).__module__.startswith(
        'transformers.')


def prefix_tokens(model: torch.nn.Module) -> int:
    """Number of tokens before the patch tokens (class, distillation, register tokens)."""
    if hasattr(model, 'num_prefix_tokens'):
        return int(model.num_prefix_tokens)
    return 1  # Hugging Face ViT: the class token


@contextlib.contextmanager
def attention_capture(model: torch.nn.Module):
    """Collect the attention probabilities ``[batch, heads, tokens, tokens]`` of every attention layer, in the
    autograd graph, during forward passes inside the context.

    timm's fused ``scaled_dot_product_attention`` path does not materialise them: ``fused_attn`` is switched off
    for the context (and restored); the probabilities are read at ``attn_drop``. Hugging Face ViT is switched to
    eager attention and the probabilities are read from its attention modules' outputs.
    """
    from .methods import eager_attention

    maps: list[torch.Tensor] = []
    handles, fused = [], []

    def keep(tensor):
        maps.append(tensor)

    try:
        for module in model.modules():
            if _is_timm_attention(module):
                fused.append((module, module.fused_attn))
                module.fused_attn = False
                handles.append(module.attn_drop.register_forward_hook(lambda mod, args, output: keep(output)))
            elif _is_hf_attention(module):
                handles.append(module.register_forward_hook(
                    lambda mod, args, output: keep(output[1]) if isinstance(output, tuple) and len(output) > 1
                    and isinstance(output[1], torch.Tensor) else None))
        if not handles:
            raise TypeError(f'{type(model).__name__} has no attention layer that zennit-attn can read')
        with eager_attention(model):
            yield maps
    finally:
        for handle in handles:
            handle.remove()
        for module, value in fused:
            module.fused_attn = value


def _attention_run(model, pixels, target, grad: bool):
    with torch.enable_grad() if grad else torch.no_grad(), attention_capture(model) as maps:
        logits = image_logits(model(pixels))
        targets = _targets(target, logits)
        logit = _select(logits, targets)
        grads = torch.autograd.grad(logit.sum(), maps) if grad else None
    return maps, grads, targets, logit


def _token_to_pixels(model, pixels, token_relevance: torch.Tensor) -> torch.Tensor:
    """``[batch, tokens]`` relevance of all tokens -> ``[batch, channels, H, W]``: each patch token's value spread
    evenly over the pixels and channels of its patch (the prefix tokens dropped)."""
    batch, channels, height, width = pixels.shape
    patches = token_relevance[:, prefix_tokens(model):]
    count = patches.shape[1]
    rows = int(round((count * height / width) ** 0.5))
    cols = count // max(rows, 1)
    if rows * cols != count:
        raise ValueError(f'{count} patch tokens do not form a grid for a {height} x {width} image')
    grid = patches.reshape(batch, 1, rows, cols).to(pixels.dtype)
    spread = torch.nn.functional.interpolate(grid, size=(height, width), mode='nearest')
    return spread.expand(batch, channels, height, width) / (channels * (height // rows) * (width // cols))


def _query_row(matrix: torch.Tensor, model) -> torch.Tensor:
    """The row of the pooled token(s): the mean of the prefix rows (class token; DeiT's class and distillation
    tokens) for token pooling, else the mean of the patch rows (average pooling)."""
    prefix = prefix_tokens(model)
    if prefix > 0 and getattr(model, 'global_pool', 'token') == 'token':
        return matrix[:, :prefix].mean(1)
    return matrix[:, prefix:].mean(1)


def attention_rollout(model, pixels, target=None) -> ImageExplanation:
    """Attention rollout (Abnar & Zuidema 2020): ``R = prod_l 0.5 (I + mean_heads A_l)``, read at the pooled (class)
    token's row. Independent of the target. One forward pass."""
    from .methods import rollout

    maps, _, targets, logit = _attention_run(model, pixels, target, grad=False)
    result = rollout([attention.detach().mean(1) for attention in maps], normalize=True)
    relevance = _token_to_pixels(model, pixels, _query_row(result, model))
    return _finish(pixels, relevance, targets, logit, 'attention_rollout')


def grad_attention_rollout(model, pixels, target=None) -> ImageExplanation:
    """Gradient x attention rollout (Chefer et al. 2021, generic): ``A_l = mean_heads((dlogit/dA_l * A_l)^+)``,
    ``R = prod_l (I + A_l)``, read at the pooled token's row. One forward and one backward pass."""
    from .methods import rollout

    maps, grads, targets, logit = _attention_run(model, pixels, target, grad=True)
    weighted = [(attention.detach() * grad).clamp(min=0).mean(1) for attention, grad in zip(maps, grads)]
    relevance = _token_to_pixels(model, pixels, _query_row(rollout(weighted, normalize=False), model))
    return _finish(pixels, relevance, targets, logit, 'grad_attention_rollout')


def gradcam(model, pixels, target=None, layer: int = -1) -> ImageExplanation:
    """Grad-CAM for ViTs as in Chefer et al. 2021 (the paper's baseline): the attention map of ``layer`` (default
    the last), each head weighted by its mean gradient over the pooled token's row,
    ``max(0, mean_h w_h A_h[cls, j])``. One forward and one backward pass."""
    maps, grads, targets, logit = _attention_run(model, pixels, target, grad=True)
    attention, grad = maps[layer].detach(), grads[layer]
    row = _query_row(attention.flatten(0, 1), model).view(attention.shape[0], attention.shape[1], -1)
    row_grad = _query_row(grad.flatten(0, 1), model).view(attention.shape[0], attention.shape[1], -1)
    weights = row_grad.mean(-1, keepdim=True)
    relevance = _token_to_pixels(model, pixels, (weights * row).mean(1).clamp(min=0))
    return _finish(pixels, relevance, targets, logit, 'gradcam')


#: Image attribution methods by name: ``(model, pixels, target, **params) -> ImageExplanation``.
IMAGE_METHODS: dict[str, Callable[..., ImageExplanation]] = {
    'input_x_gradient': input_x_gradient,
    'integrated_gradients': integrated_gradients,
    'smoothgrad': smoothgrad,
    'attention_rollout': attention_rollout,
    'grad_attention_rollout': grad_attention_rollout,
    'gradcam': gradcam,
    'random': random,
}


def explain_image(model: torch.nn.Module, pixels, target=None, composite=None, method: str = 'attnlrp',
                  **params) -> ImageExplanation:
    """Explain an image classifier's logit: relevance per pixel, by AttnLRP or a baseline.

    Parameters
    ----------
    model: torch.nn.Module
        A timm ``VisionTransformer`` / ``VisionTransformerDistilled`` or a Hugging Face
        ``ViTForImageClassification``, in eval mode (or any image classifier for the gradient baselines).
    pixels: torch.Tensor
        ``[batch, channels, height, width]`` (or ``[channels, height, width]``) float input, as the model takes it.
    target: int, sequence of int, tensor or None
        Class to explain, one for all rows or one per row; None explains the argmax.
    composite: zennit.core.Composite, optional
        For the LRP methods; default :py:class:`~zennit_attn.composites.AttnLRPGamma` for ``'attnlrp'`` and
        :py:class:`~zennit_attn.composites.CPLRPGamma` for ``'cplrp'``.
    method: str
        ``'attnlrp'`` (default), ``'cplrp'`` or a key of :py:data:`IMAGE_METHODS`.
    **params
        Hyperparameters of the baseline.

    Returns
    -------
    ImageExplanation
    """
    from .composites import CPLRPGamma

    pixels = _check(model, pixels)
    if method in ('attnlrp', 'cplrp'):
        if params:
            raise TypeError(f'LRP takes no parameters {sorted(params)}; configure it through composite=')
        if composite is None and method == 'cplrp':
            composite = CPLRPGamma()
        explanation = lrp(model, pixels, target, composite)
        explanation.method = method
        return explanation
    if method not in IMAGE_METHODS:
        raise ValueError(f'Unknown image method {method!r}; known: attnlrp, cplrp, {", ".join(IMAGE_METHODS)}')
    if composite is not None:
        raise ValueError(f'composite= applies to the LRP methods, not to {method!r}')
    return IMAGE_METHODS[method](model, pixels, target, **params)
