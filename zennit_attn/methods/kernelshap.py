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
    one-token text, a one-patch image, a row with one token that can change the value) its Shapley value is exactly
    ``f(x) - f(0)``, computed directly (there is no coalition to sample). Features that cannot change the explained
    value (:py:meth:`~zennit_attn.inputs.task.Task.attributable_features`: padding, tokens after the explained
    position of a causal model, a multiple-choice head's other choices) are no players: they keep their value in every
    coalition and get 0, their exact Shapley value, so that the samples go to the others. Cost: ``samples`` forward
    passes per input row, ``perturbation_batch`` perturbed inputs per forward pass, plus a linear regression."""
    logit = task.resolve_plain(position, target)
    mask = task.feature_mask()
    flat = mask[0].flatten()
    features = int(flat.max()) + 1
    attributable = task.attributable_features()
    if attributable is None:
        attributable = torch.ones(task.batch, features, dtype=torch.bool, device=mask.device)
    most = int(attributable.sum(1).max())
    if 1 < most and samples <= most:
        raise ValueError(
            f'kernelshap: samples={samples} coalitions cannot determine the Shapley values of {most} '
            f'features (a linear model with {most + 1} coefficients): use samples > {most} '
            '(default 2000)'
        )
    values = []
    for row in range(task.batch):
        players = attributable[row].to(mask.device)
        # captum sees the players' entries only: the others keep the input's value (a row's coalitions are those of
        # the row alone, whatever pads or later tokens the batch gives it), and get 0, their exact Shapley value
        kept = players[flat]
        number = (players.cumsum(0) - 1)[flat[kept]]
        explained = _Players(Selected(task, row), task.inputs[row], kept)
        entries = task.inputs[row].flatten()[kept][None]
        value = torch.zeros(features, dtype=task.inputs.dtype, device=flat.device)
        with torch.no_grad(), forked_random_state(seed, task.inputs.device):
            if int(players.sum()) == 1:  # no coalition to sample (captum fails): f(x) - f(0) exactly
                value[players] = (explained(entries) - explained(torch.zeros_like(entries))).to(value.dtype)
            else:
                attribution = KernelShap(explained).attribute(
                    entries,
                    baselines=0.0,
                    feature_mask=number[None],
                    n_samples=samples,
                    perturbations_per_eval=perturbation_batch,
                    show_progress=False,
                )
                value[players] = attribution[0, _first(number)].to(value.dtype)
        values.append(value)
    relevance = task.feature_relevance(torch.stack(values))
    return task.finish(relevance, logit, 'kernelshap')


def _first(number: torch.Tensor) -> torch.Tensor:
    """The first entry of each feature of ``number`` (feature ids ``0 .. n-1``): captum gives every entry of a feature
    the feature's value, read at its first entry."""
    count = int(number.max()) + 1
    return torch.full((count,), number.numel(), device=number.device).scatter_reduce(
        0, number, torch.arange(number.numel(), device=number.device), 'amin'
    )


class _Players(torch.nn.Module):
    """``explained`` (a module on inputs of the row's shape) of the row ``row`` with its ``kept`` entries (a mask of
    the flattened row) taken from the ``[n, kept entries]`` input: the entries captum perturbs."""

    def __init__(self, explained: torch.nn.Module, row: torch.Tensor, kept: torch.Tensor):
        super().__init__()
        self.explained, self.row, self.kept = explained, row, kept

    def forward(self, entries: torch.Tensor) -> torch.Tensor:
        inputs = self.row.flatten().repeat(entries.shape[0], 1)
        inputs[:, self.kept] = entries
        return self.explained(inputs.reshape(entries.shape[0], *self.row.shape))
