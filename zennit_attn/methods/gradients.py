"""The gradient baselines: gradient x input, Integrated Gradients and SmoothGrad (the last two by zennit's
attributors), at the task's input (word embeddings, pixels). The gradient reaching a batch normalisation module's
output is made contiguous (:py:func:`~zennit_attn.rules.contiguous_gradient`: torch's CPU backward of
``batch_norm`` is wrong for some strides of it), as the engine does for LRP (and the gradient methods of attention
maps, :py:mod:`~zennit_attn.methods.rollouts`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from zennit.attribution import IntegratedGradients, SmoothGrad

from ..inputs.task import Task
from ..rules import contiguous_gradient
from .selection import RowRandomness, Selected, row_randomness

__all__ = [
    'input_x_gradient',
    'integrated_gradients',
    'smoothgrad',
    'RowSmoothGrad',
    'ExactIntegratedGradients',
    'batch_norm_gradients',
    'BATCH_NORMS',
]

#: The batch normalisation modules whose output gradient the baselines make contiguous.
BATCH_NORMS = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d, torch.nn.SyncBatchNorm)


@contextlib.contextmanager
def batch_norm_gradients(model: torch.nn.Module) -> Iterator[None]:
    """For the time of the block, the gradient that reaches the output of each batch normalisation module of ``model``
    is made contiguous (:py:func:`~zennit_attn.rules.contiguous_gradient`)."""
    handles = [
        module.register_forward_hook(_contiguous_output)
        for module in model.modules()
        if isinstance(module, BATCH_NORMS)
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _contiguous_output(module, args, output) -> None:
    if isinstance(output, torch.Tensor) and output.requires_grad:
        output.register_hook(contiguous_gradient)


def input_x_gradient(task: Task, position=-1, target=None):
    """Gradient x input (Eq. 11 of the paper's appendix) at the input (word embeddings, pixels). Cost: one forward
    and one backward pass."""
    with torch.enable_grad(), batch_norm_gradients(task.model):
        inputs = task.inputs.clone().requires_grad_(True)
        logit = task.resolve(task.forward(inputs), position, target)
        (grad,) = torch.autograd.grad(logit.sum(), inputs)
    return task.finish(inputs.detach() * grad, logit, 'input_x_gradient')


def integrated_gradients(task: Task, position=-1, target=None, steps: int = 20, baseline: float = 0.0):
    """Integrated Gradients (Sundararajan et al. 2017) from a constant ``baseline`` input (default 0, the zero
    embedding or a black image), by zennit's :py:class:`zennit.attribution.IntegratedGradients` (right Riemann sum
    over ``steps`` points, the paper's Eq. of appendix A.1) with the points of the path in the input's precision
    (:py:class:`ExactIntegratedGradients`). Cost: ``steps`` forward and backward passes (plus one
    plain forward)."""
    logit = task.resolve_plain(position, target)
    attributor = ExactIntegratedGradients(
        Selected(task), n_iter=steps, baseline_fn=lambda inputs: torch.full_like(inputs, baseline)
    )
    with torch.enable_grad(), batch_norm_gradients(task.model):
        _, relevance = attributor(task.inputs.clone(), torch.ones_like)
    return task.finish(relevance, logit, 'integrated_gradients')


def smoothgrad(
    task: Task,
    position=-1,
    target=None,
    sigma: float = 0.1,
    samples: int = 20,
    seed: int | None = 0,
    multiply_input: bool = True,
):
    """SmoothGrad (Smilkov et al. 2017) by zennit's :py:class:`zennit.attribution.SmoothGrad`: the mean gradient
    over ``samples`` inputs with Gaussian noise of standard deviation ``sigma`` times the range (max - min) of each
    row's input (zennit's ``noise_level``; the paper uses ``sigma=0.1``; zennit's last sample is noise-free). The noise
    of a row is drawn on its tokens alone (:py:class:`RowSmoothGrad`): its range leaves the padding out, and with an
    integer ``seed`` its numbers come from the row's own generator (:py:func:`~.selection.row_randomness`), so that a
    text gets the same relevance alone as in a padded batch. With ``multiply_input`` (default) the mean gradient is
    multiplied by the input, a signed relevance like gradient x input; otherwise the gradient itself is returned.
    Cost: ``samples`` forward and backward passes (plus one plain forward)."""
    logit = task.resolve_plain(position, target)
    attributor = RowSmoothGrad(Selected(task), row_randomness(task, seed), noise_level=sigma, n_iter=samples)
    with torch.enable_grad(), batch_norm_gradients(task.model):
        _, gradient = attributor(task.inputs.clone(), torch.ones_like)
    return task.finish(gradient * task.inputs if multiply_input else gradient, logit, 'smoothgrad')


class ExactIntegratedGradients(IntegratedGradients):
    """zennit's :py:class:`~zennit.attribution.IntegratedGradients` with the fractions of the path, ``k / n`` for ``k =
    1 ... n``, as Python numbers: zennit takes them from a float32 ``torch.linspace``, which put the points of a
    float64 input off the path by up to 6e-8 of the input (0.05 is 0.0500000007 in float32) and the attribution off
    the Riemann sum by 2e-7 relative."""

    def forward(self, input, attr_output_fn):
        baseline = self.baseline_fn(input)
        result = torch.zeros_like(input)
        for step in range(1, self.n_iter + 1):
            output, gradient = self.grad(baseline + step / self.n_iter * (input - baseline), attr_output_fn)
            result += gradient / self.n_iter
        # the last point is the input itself, so ``output`` is the model's output at it
        return output, result * (input - baseline)


class RowSmoothGrad(SmoothGrad):
    """zennit's :py:class:`~zennit.attribution.SmoothGrad` with the noise of each row drawn from the row alone: on its
    tokens (``rows[r].valid``; every entry of a row without tokens, pixels), scaled by the range of those entries, from
    its generator (``rows[r].generator``; the global random state where it is None). zennit draws one noise tensor for
    the batch and scales it by each row's range over all its entries, padding included: a padded text's noise then
    depended on its pad tokens' embeddings (21% larger noise for another pad id, relevance 1.5e-3 apart on a scale of
    0.053) and on the other rows of its batch."""

    def __init__(self, model, rows: list[RowRandomness], **kwargs):
        super().__init__(model, **kwargs)
        self.rows = rows

    def forward(self, input, attr_output_fn):
        result = torch.zeros_like(input)
        for sample in range(self.n_iter):
            # zennit's convention: the last sample is the input itself (one sample is the gradient)
            epsilon = torch.zeros_like(input) if sample == self.n_iter - 1 else self.noise(input)
            output, gradient = self.grad(input + epsilon, attr_output_fn)
            result += gradient / self.n_iter
        return output, result

    def noise(self, input: torch.Tensor) -> torch.Tensor:
        """One draw of the noise of every row (0 at padding)."""
        epsilon = torch.zeros_like(input)
        for row, (valid, generator) in enumerate(self.rows):
            values = input[row] if valid is None else input[row, valid.to(input.device)]
            scale = self.noise_level * (values.amax() - values.amin())
            if generator is None:
                drawn = torch.randn(values.shape, dtype=input.dtype, device=input.device)
            else:
                drawn = torch.randn(values.shape, generator=generator, dtype=input.dtype).to(input.device)
            if valid is None:
                epsilon[row] = drawn * scale
            else:
                epsilon[row, valid.to(input.device)] = drawn * scale
        return epsilon
