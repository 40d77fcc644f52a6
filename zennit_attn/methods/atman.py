"""AtMan (Deb et al. 2023): the relevance of a token is the drop of the explained score when its attention keys are
suppressed in every layer and head (:py:func:`~zennit_attn.methods.attention.suppress_keys`), one forward pass per
token, without gradients."""

from __future__ import annotations

import torch

from ..inputs.objectives import OutputFunction
from ..inputs.task import Task
from .attention import suppress_keys

__all__ = ['atman']


def atman(
    task: Task, position=-1, target=None, p: float = 1.0, score: str = 'log_softmax', perturbation_batch: int = 16
):
    """AtMan (Deb et al. 2023, appendix A.1): for each token ``i`` the pre-softmax attention scores of key ``i``
    are multiplied by ``1 - p`` in every layer and head, and the relevance of ``i`` is the drop of the explained
    score: ``R_i = s(x) - s(x | i suppressed)``. ``score='log_softmax'`` (default) uses the log-probability of the
    target, since AtMan relies on the softmax (the paper attributes AtMan with it, all other methods without);
    ``'logit'`` uses the logit. ``p=1.0`` is the paper's Wikipedia setting (0.7-0.9 on SQuAD). Keys are scaled
    by forward hooks on the key sites found from what the model computes
    (:py:func:`~zennit_attn.methods.attention.key_sites`). Tokens that cannot change the explained
    logit (after the explained position of a causal model, padding, an image's class token) get 0 without a pass.
    Cost: one forward pass per token, ``perturbation_batch`` perturbed inputs per forward pass.

    With a contrast (``explain(..., contrast=...)``) both scores give the same value (the log-softmax normaliser
    cancels in the difference). A target function receives the logits: it needs ``score='logit'`` (it may apply the
    log-softmax itself). A multiple-choice head's choices are refused (its keys are those of one choice at a time,
    :py:meth:`~zennit_attn.inputs.task.Task.check_token_layout`)."""
    task.check_token_layout('AtMan')
    if isinstance(task.objective, OutputFunction) and score == 'log_softmax':
        raise ValueError(
            "atman with a target function: its score='log_softmax' would hand the function "
            "log-probabilities instead of the logits; pass score='logit' (the function is then the "
            'score; it may apply log_softmax itself)'
        )

    def read(scores, rows=None):
        return task.select(scores.log_softmax(-1) if score == 'log_softmax' else scores, rows)

    current: list[torch.Tensor | None] = [None]
    device = task.inputs.device
    tokens = task.token_count()  # before the keys are looked for: a video has no patch grid (refused by name)
    with torch.no_grad(), suppress_keys(task.model, lambda: current[0]):
        scores = task.forward(task.inputs)
        logit = task.resolve(scores, position, target)
        reference = read(scores)
        jobs = task.attributable_tokens().nonzero().tolist()
        relevance = torch.zeros(task.batch, tokens, dtype=reference.dtype, device=device)
        for start in range(0, len(jobs), perturbation_batch):
            chunk = jobs[start : start + perturbation_batch]
            rows = torch.tensor([row for row, _ in chunk], device=device)
            suppressed_tokens = torch.tensor([token for _, token in chunk], device=device)
            factor = torch.ones(len(chunk), tokens, dtype=task.inputs.dtype, device=device)
            factor[torch.arange(len(chunk), device=device), suppressed_tokens] = 1.0 - p
            current[0] = factor
            try:
                suppressed = read(task.forward(task.inputs[rows], rows), rows)
            finally:
                current[0] = None
            relevance[rows, suppressed_tokens] = reference[rows] - suppressed
    return task.finish(task.token_relevance(relevance), logit, 'atman')
