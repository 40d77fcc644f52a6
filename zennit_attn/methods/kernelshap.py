"""KernelSHAP (Lundberg & Lee 2017) by captum's :py:class:`captum.attr.KernelShap`, one feature per token or image
patch. captum and scikit-learn (which fits captum's surrogate) are not dependencies of zennit-attn: this module is
imported on the method's first use, which needs ``pip install 'zennit-attn[baselines]'``
(:py:data:`~zennit_attn.methods.declarations.DECLARATIONS` names them)."""

from __future__ import annotations

import torch
from captum.attr import KernelShap

from ..inputs.task import Task
from .selection import Selected, forked_random_state

__all__ = ['kernelshap']


def kernelshap(
    task: Task, position=-1, target=None, samples: int = 2000, perturbation_batch: int = 64, seed: int | None = 0
):
    """KernelSHAP (Lundberg & Lee 2017) by captum's :py:class:`captum.attr.KernelShap`, one feature per token (per
    patch of an image), absent features set to 0 (the zero embedding, black patches: the baseline of the
    perturbation metric); ``samples`` coalitions (captum's and the paper's default 2000). With a single feature (a
    one-token text, a one-patch image) its Shapley value is exactly ``f(x) - f(0)``, computed directly (there is no
    coalition to sample). Cost: ``samples`` forward passes per input row, ``perturbation_batch`` perturbed inputs
    per forward pass, plus a linear regression."""
    logit = task.resolve_plain(position, target)
    mask = task.feature_mask()
    flat = mask[0].flatten()
    features = int(flat.max()) + 1
    if 1 < features and samples <= features:
        raise ValueError(
            f'kernelshap: samples={samples} coalitions cannot determine the Shapley values of {features} '
            f'features (a linear model with {features + 1} coefficients): use samples > {features} '
            '(default 2000)'
        )
    if features == 1:
        with torch.no_grad():
            absent = task.select(task.forward(torch.zeros_like(task.inputs)))
            present = task.select(task.forward(task.inputs))
        relevance = task.feature_relevance((present - absent)[:, None].to(task.inputs.dtype))
        return task.finish(relevance, logit, 'kernelshap')
    # captum gives every entry of a feature the feature's value: read it at the feature's first entry
    first = torch.full((features,), flat.numel(), device=flat.device).scatter_reduce(
        0, flat, torch.arange(flat.numel(), device=flat.device), 'amin'
    )
    values = []
    for row in range(task.batch):
        with torch.no_grad(), forked_random_state(seed, task.inputs.device):
            attribution = KernelShap(Selected(task, row)).attribute(
                task.inputs[row : row + 1],
                baselines=0.0,
                feature_mask=mask,
                n_samples=samples,
                perturbations_per_eval=perturbation_batch,
                show_progress=False,
            )
        values.append(attribution.flatten(1)[0, first].to(task.inputs.dtype))
    relevance = task.feature_relevance(torch.stack(values))
    return task.finish(relevance, logit, 'kernelshap')
