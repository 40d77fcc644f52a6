"""Leave-one-out agreement: how well an attribution of tokens matches the drop of the explained score when each token
is left out, for any method's :py:class:`~zennit_attn.results.explanation.Explanation` (or any relevance vector).

Leave-one-out (LOO) is the reference that "When LRP Diverges from Leave-One-Out in Transformers" (You, Zeng, Tsai,
Yamada, Zhao, BlackboxNLP 2025, arXiv 2510.18810) compares LRP with. For each token ``i`` of a row,
:py:func:`token_drops` measures the drop ``f(x) - f(x without i)`` of the explained value ``f`` (the explained logit,
no softmax, or whatever the explanation explains: a contrast, a function of the scores; the same target and position)
in two ways (:py:data:`LOO_MODES`):

- ``'zeroed'``: the token's word embedding is set to the baseline (0, the baseline of the perturbation curves of
  :py:mod:`~zennit_attn.workflows.evaluation.perturbation`); the sequence keeps its length and positions;
- ``'deleted'``: the token is removed from the sequence, the tokens after it move one position up (the model numbers
  the positions afresh), as if it had never been written. The explained position itself cannot be deleted (its
  output is what is explained): for a causal language model that is the last token, for an encoder the pooled or
  chosen position; its drop is NaN. Padding is removed before deletion (each row runs alone, unpadded).

Tokens that cannot change the explained value take no part (NaN drop): padding, and tokens after the explained
position of a causal model. All leave-one-out inputs of one row and mode are evaluated in batched forward passes
(``batch_size`` at a time), with a tqdm progress bar over the rows.

:py:meth:`TokenDrops.agreement` correlates a relevance vector with the drops of the tokens that take part: Spearman's
rank correlation and Pearson's correlation per mode (:py:mod:`~zennit_attn.workflows.statistics`); a constant vector
(e.g. a relevance that is 0 everywhere, or a row with a single token) has no correlation: NaN.
:py:class:`LeaveOneOutAgreement` summarises many rows by the mean and standard error of each correlation over the rows
where it is finite (:py:func:`~zennit_attn.workflows.evaluation.perturbation.mean_sem`), with the count.
:py:func:`leave_one_out` does both for explanations: each row's drops, scored against its own relevance.

The drops depend only on the input and on what is explained, not on the method: to compare methods that explain the
same target, compute the drops once and score every method's explanation with :py:meth:`TokenDrops.agreement_of`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from ...core.modules import forward_parameters, logits_to_keep
from ...inputs.objectives import Logit, Objective
from ...inputs.task import TokenTask
from ...results.explanation import Explanation
from ..statistics import pearson, spearman
from .faithfulness import explained_task
from .perturbation import mean_sem

__all__ = ['LOO_MODES', 'TokenDrops', 'Agreement', 'LeaveOneOutAgreement', 'token_drops', 'leave_one_out']

#: How a token is left out: its word embedding set to the baseline, or the token deleted from the sequence.
LOO_MODES = ('zeroed', 'deleted')


@dataclass
class Agreement:
    """The correlations of one relevance vector with the leave-one-out drops of one row, per mode of
    :py:data:`LOO_MODES`.

    Attributes
    ----------
    spearman, pearson: dict
        Mode -> Spearman's rank correlation, Pearson's correlation (NaN where either vector is constant).
    tokens: dict
        Mode -> the number of tokens that take part.
    """

    spearman: dict[str, float]
    pearson: dict[str, float]
    tokens: dict[str, int]


@dataclass
class TokenDrops:
    """The leave-one-out drops of one explained row (see the module's description).

    Attributes
    ----------
    score: dict
        Mode -> the explained value of the unperturbed input (``'deleted'``: of the unpadded row).
    drops: dict
        Mode -> ``[seq]`` float64 ``score - (the explained value without token i)``; NaN for the tokens that take no
        part (padding, tokens after the explained position of a causal model, and for ``'deleted'`` the explained
        position).
    input_ids: torch.Tensor
        ``[seq]`` the row's token ids, padding as -1.
    target: torch.Tensor
        The row's explained target.
    objective: Objective or None
        What was explained of the scores (:py:mod:`zennit_attn.inputs.objectives`); not compared.
    row: int
        The row of the explanation the drops are of (for the objective's contrast).
    """

    score: dict[str, float]
    drops: dict[str, torch.Tensor]
    input_ids: torch.Tensor
    target: torch.Tensor
    objective: Objective | None = field(default=None, repr=False, compare=False)
    row: int = 0

    @property
    def modes(self) -> tuple[str, ...]:
        return tuple(self.drops)

    def agreement(self, relevance) -> Agreement:
        """Spearman's and Pearson's correlation of ``relevance`` (``[seq]``, a tensor or sequence of numbers) with the
        drops of each mode, over the tokens that take part.

        Raises
        ------
        ValueError
            If ``relevance`` does not have one value per token, or is not finite where the tokens take part.
        """
        relevance = torch.as_tensor(relevance).detach().to('cpu', torch.float64).reshape(-1)
        if relevance.numel() != self.input_ids.numel():
            raise ValueError(f'{relevance.numel()} relevance values for a row of {self.input_ids.numel()} tokens')
        spearmans, pearsons, tokens = {}, {}, {}
        for mode, drops in self.drops.items():
            taking_part = torch.isfinite(drops)
            values = relevance[taking_part]
            if not bool(torch.isfinite(values).all()):
                raise ValueError(f'the relevance has non-finite values at tokens that take part ({mode})')
            tokens[mode] = int(taking_part.sum())
            spearmans[mode] = spearman(values, drops[taking_part]) if tokens[mode] > 1 else math.nan
            pearsons[mode] = pearson(values, drops[taking_part]) if tokens[mode] > 1 else math.nan
        return Agreement(spearman=spearmans, pearson=pearsons, tokens=tokens)

    def agreement_of(self, explanation: Explanation, row: int = 0) -> Agreement:
        """:py:meth:`agreement` of row ``row`` of any method's ``explanation`` of the same input and target.

        Raises
        ------
        ValueError
            If the explanation's row has other token ids (padding removed) or another target than these drops.
        """
        present = torch.ones(explanation.input_ids.shape[1], dtype=torch.bool)
        if explanation.attention_mask is not None:
            present = explanation.attention_mask[row].cpu() != 0
        own = self.input_ids.cpu() >= 0  # the drops' own tokens (padding is -1)
        if not torch.equal(explanation.input_ids[row].cpu()[present], self.input_ids.cpu()[own]):
            raise ValueError('the explanation is of another input than these drops: explain the same token ids')
        if not torch.equal(explanation.target[row].cpu(), self.target.cpu()):
            raise ValueError(
                f'the explanation explains target {explanation.target[row].tolist()}, these drops target '
                f"{self.target.tolist()}: explain the same target (e.g. target= the drops' target)"
            )
        if not _same_objective(explanation.objective, row, self.objective, self.row):
            raise ValueError(
                f'the explanation explains {_objective_name(explanation.objective)}, these drops '
                f'{_objective_name(self.objective)}: explain the same objective (target function, contrast)'
            )
        # the explanation's tokens in the places of the drops' (padding takes no part: 0 there)
        relevance = torch.zeros(self.input_ids.numel(), dtype=torch.float64)
        relevance[own] = explanation.relevance[row].detach().to('cpu', torch.float64)[present]
        return self.agreement(relevance)


def _objective_name(objective: Objective | None) -> str:
    if objective is None:
        return 'the logit'
    function = getattr(objective, 'function', None)
    return type(objective).__name__ + ('' if function is None else f' of {getattr(function, "__name__", function)}')


def _same_objective(a: Objective | None, row_a: int, b: Objective | None, row_b: int) -> bool:
    """Whether two objectives explain the same value of rows ``row_a`` and ``row_b``: the same kind, target function
    and contrast (None counts as the logit)."""
    a, b = a or Logit(), b or Logit()
    if type(a) is not type(b) or getattr(a, 'function', None) is not getattr(b, 'function', None):
        return False
    if a.contrast is None or b.contrast is None:
        return a.contrast is None and b.contrast is None
    return torch.equal(a.contrast[row_a].cpu(), b.contrast[row_b].cpu())


@dataclass
class LeaveOneOutAgreement:
    """The agreement of many rows: per mode, the mean and standard error of each correlation over the rows where it is
    finite.

    Attributes
    ----------
    spearman, pearson: dict
        Mode -> ``(mean, standard error)``.
    count: dict
        Mode -> the number of rows with a finite Spearman correlation.
    agreements: list of Agreement
        Each row's.
    """

    spearman: dict[str, tuple[float, float]]
    pearson: dict[str, tuple[float, float]]
    count: dict[str, int]
    agreements: list[Agreement] = field(repr=False)

    @classmethod
    def of(cls, agreements: Sequence[Agreement]) -> LeaveOneOutAgreement:
        """The summary of ``agreements`` (each row's)."""
        agreements = list(agreements)
        modes = list(dict.fromkeys(mode for agreement in agreements for mode in agreement.spearman))
        return cls(
            spearman={mode: mean_sem([a.spearman.get(mode, math.nan) for a in agreements]) for mode in modes},
            pearson={mode: mean_sem([a.pearson.get(mode, math.nan) for a in agreements]) for mode in modes},
            count={mode: sum(math.isfinite(a.spearman.get(mode, math.nan)) for a in agreements) for mode in modes},
            agreements=agreements,
        )


def _check_modes(modes: str | Sequence[str]) -> tuple[str, ...]:
    modes = (modes,) if isinstance(modes, str) else tuple(modes)
    if not modes or len(set(modes)) != len(modes) or any(mode not in LOO_MODES for mode in modes):
        raise ValueError(f'modes must be distinct items of {LOO_MODES}, got {modes!r}')
    return modes


def _explanations(explanations) -> list[Explanation]:
    items = [explanations] if isinstance(explanations, Explanation) else list(explanations)
    bad = [type(item).__name__ for item in items if not isinstance(item, Explanation)]
    if bad or not items:
        raise TypeError(
            'leave-one-out takes explanations of language models (zennit_attn.Explanation, or a list of them), '
            f'got {bad[0] if bad else "none"}'
        )
    return items


def _scores(forward, inputs: torch.Tensor, batch_size: int | None, **per_row) -> torch.Tensor:
    """``forward(batch, **chunk)`` of ``inputs`` in chunks of ``batch_size`` (all at once for None), without
    gradients, as float64 on the CPU; ``per_row`` tensors are chunked alike."""
    size = inputs.shape[0] if batch_size is None else batch_size
    with torch.no_grad():
        return torch.cat(
            [
                forward(
                    inputs[start : start + size], **{key: value[start : start + size] for key, value in per_row.items()}
                )
                .detach()
                .flatten()
                .to('cpu', torch.float64)
                for start in range(0, inputs.shape[0], size)
            ]
        )


def _zeroed(task: TokenTask, extra: dict, row: int, valid: torch.Tensor, baseline, batch_size) -> tuple:
    """``(score, drops)`` of row ``row`` with each valid token's word embedding set to ``baseline``."""
    tokens = valid.nonzero()[:, 0]
    inputs = task.inputs[row]
    variants = inputs[None].repeat(len(tokens) + 1, *([1] * inputs.dim()))
    variants[torch.arange(1, len(tokens) + 1, device=inputs.device), tokens] = torch.as_tensor(
        baseline, dtype=inputs.dtype, device=inputs.device
    )
    rows = torch.full((len(variants),), row, dtype=torch.long, device=inputs.device)

    def forward(batch, rows):
        return task.select(task.forward(batch, rows, **extra), rows)

    scores = _scores(forward, variants, batch_size, rows=rows)
    drops = torch.full((inputs.shape[0],), math.nan, dtype=torch.float64)
    drops[tokens.cpu()] = scores[0] - scores[1:]
    return float(scores[0]), drops


def _deletion_kwargs(task: TokenTask, row: int, present: torch.Tensor, kept: torch.Tensor) -> dict:
    """The model's keyword arguments for the variants of row ``row`` that keep the unpadded tokens ``present[kept]``
    (``kept``: ``[variants, tokens]`` indices into the present tokens): an all-ones attention mask, positions numbered
    afresh, per-token tensors (``token_type_ids``) of the kept tokens."""
    kwargs = {}
    seq = task.input_ids.shape[1]
    for key, value in task.base_kwargs().items():
        if key == 'attention_mask':
            kwargs[key] = torch.ones(kept.shape, dtype=value.dtype, device=value.device)
        elif key == 'position_ids':
            kwargs[key] = None  # numbered afresh by the model
        elif isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[:2] == (task.batch, seq):
            kwargs[key] = value[row][present.to(value.device)][kept.to(value.device)]
        elif isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == task.batch:
            raise ValueError(
                f'leave-one-out by deletion cannot re-index the model argument {key!r} (shape {tuple(value.shape)}): '
                "leave it out or use modes=('zeroed',)"
            )
    return kwargs


def _deleted(task: TokenTask, row: int, valid: torch.Tensor, batch_size) -> tuple:
    """``(score, drops)`` of row ``row`` (unpadded) with each valid token other than the explained position deleted."""
    seq = task.input_ids.shape[1]
    present = (
        torch.ones(seq, dtype=torch.bool) if task.attention_mask is None else (task.attention_mask[row] != 0).cpu()
    )
    index = present.nonzero()[:, 0]
    explained = int(task.query_positions()[row])
    position = int((index < explained).sum())  # the explained position among the present tokens
    candidates = [int(token) for token in valid.cpu().nonzero()[:, 0] if int(token) != explained]
    order = torch.arange(len(index))
    kept = [order] + [order[order != int((index < token).sum())] for token in candidates]
    shifted = [position] + [position - int(token < explained) for token in candidates]
    keep = (
        task.positions is not None and task.readout.model_output and 'logits_to_keep' in forward_parameters(task.model)
    )
    device = task.inputs.device
    inputs = task.inputs[row][index.to(device)]
    scores = []
    # the unpadded row (its own length), then every deletion (one token shorter)
    for group, positions in ((kept[:1], shifted[:1]), (kept[1:], shifted[1:])):
        if not group:
            continue
        group = torch.stack(group)
        kwargs = _deletion_kwargs(task, row, present, group)
        chunked = {key: value for key, value in kwargs.items() if isinstance(value, torch.Tensor)}
        fixed = {key: value for key, value in kwargs.items() if key not in chunked}

        def forward(batch, positions, rows, fixed=fixed, **chunk):
            kept = torch.unique(positions) if keep else None
            extra = {'logits_to_keep': logits_to_keep(kept, batch.shape[1])} if keep else {}
            output = task.forward(batch, **fixed, **chunk, **extra)
            if output.dim() == 3:  # an output per position: the explained one of each variant
                where = torch.searchsorted(kept, positions) if keep else positions
                output = output[torch.arange(len(batch), device=output.device), where.to(output.device)]
            return task.objective.value(output, task.targets[rows].to(output.device), rows)

        scores.append(
            _scores(
                forward,
                inputs[group.to(device)],
                batch_size,
                positions=torch.tensor(positions, dtype=torch.long, device=device),
                rows=torch.full((len(group),), row, dtype=torch.long, device=device),
                **chunked,
            )
        )
    scores = torch.cat(scores)
    drops = torch.full((seq,), math.nan, dtype=torch.float64)
    drops[torch.tensor(candidates, dtype=torch.long)] = scores[0] - scores[1:]
    return float(scores[0]), drops


def token_drops(
    model: torch.nn.Module,
    explanations: Explanation | Iterable[Explanation],
    modes: str | Sequence[str] = LOO_MODES,
    baseline: float | torch.Tensor = 0.0,
    batch_size: int | None = None,
    progress: bool = True,
    model_kwargs: dict | None = None,
) -> list[TokenDrops]:
    """The leave-one-out drops of every row of ``explanations`` (see the module's description).

    Parameters
    ----------
    model: torch.nn.Module
        The explained language model, in eval mode.
    explanations: Explanation or iterable of Explanation
        What :py:func:`~zennit_attn.explain` returned (any method; only the input and what is explained are used).
    modes: str or sequence of str
        Items of :py:data:`LOO_MODES`: ``'zeroed'`` and/or ``'deleted'``.
    baseline: float or torch.Tensor
        ``'zeroed'``: the value a left-out token's word embedding is set to (broadcast to the embedding).
    batch_size: int, optional
        Leave-one-out inputs per forward pass (default: those of one row and mode at once).
    progress: bool
        A tqdm progress bar over the rows.
    model_kwargs: dict, optional
        Further arguments of the model's forward, as given to ``explain`` (``'deleted'`` drops the deleted token's
        entry of per-token tensors such as ``token_type_ids``).

    Returns
    -------
    list of TokenDrops
        One per row, in order.

    Raises
    ------
    ValueError
        For an unknown mode, a ``batch_size`` that is not a positive integer, and ``'deleted'`` for an explanation
        of several ``(position, token)`` pairs per row, of an encoder-decoder model, of a model that is run on its
        token ids, or with a model argument that cannot be re-indexed.
    """
    modes = _check_modes(modes)
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f'batch_size must be a positive integer, got {batch_size!r}')
    explanations = _explanations(explanations)
    results = []
    with tqdm(total=sum(e.input_ids.shape[0] for e in explanations), disable=not progress, desc='leave-one-out') as bar:
        for explanation in explanations:
            task, extra = explained_task(model, explanation, model_kwargs)
            if 'deleted' in modes:
                _check_deletion(task)
            valid = task.attributable_tokens()
            for row in range(task.batch):
                scores, drops = {}, {}
                for mode in modes:
                    if mode == 'zeroed':
                        scores[mode], drops[mode] = _zeroed(task, extra, row, valid[row], baseline, batch_size)
                    else:
                        scores[mode], drops[mode] = _deleted(task, row, valid[row], batch_size)
                ids = task.input_ids[row].cpu()
                if task.attention_mask is not None:  # padding marked -1: the row's own tokens are what is compared
                    ids = torch.where(task.attention_mask[row].cpu() != 0, ids, torch.full_like(ids, -1))
                results.append(TokenDrops(scores, drops, ids, task.targets[row].cpu(), explanation.objective, row))
                bar.update(1)
    return results


def _check_deletion(task: TokenTask) -> None:
    """Refuse deletion where the explained value cannot follow a shorter sequence."""
    reason = None
    if task.positions is not None and task.positions.dim() == 2:
        reason = 'it explains several (position, token) pairs per row, whose positions and tokens deletion moves'
    elif task.decoder_embeddings is not None:
        reason = 'the model is an encoder-decoder model (deletion of its encoder tokens is not supported)'
    elif task.lookups is not None:
        reason = f'{type(task.model).__name__} is run on its token ids ({task.ids_reason})'
    elif task.choices is not None:
        reason = f'{type(task.model).__name__} scores choices of one length (deletion would shorten one of them)'
    if reason is not None:
        raise ValueError(f"leave-one-out by deletion does not apply: {reason}; use modes=('zeroed',)")


def leave_one_out(
    model: torch.nn.Module,
    explanations: Explanation | Iterable[Explanation],
    modes: str | Sequence[str] = LOO_MODES,
    **options,
) -> LeaveOneOutAgreement:
    """The leave-one-out agreement of explanations: each row's :py:func:`token_drops`, correlated with its own
    relevance (:py:meth:`TokenDrops.agreement`), summarised over the rows (:py:class:`LeaveOneOutAgreement`).

    Parameters
    ----------
    model: torch.nn.Module
        The explained language model, in eval mode.
    explanations: Explanation or iterable of Explanation
        Any method's explanations.
    modes: str or sequence of str
        Items of :py:data:`LOO_MODES`.
    **options
        ``baseline``, ``batch_size``, ``progress``, ``model_kwargs`` of :py:func:`token_drops`.
    """
    explanations = _explanations(explanations)
    drops = iter(token_drops(model, explanations, modes, **options))
    agreements = [
        next(drops).agreement_of(explanation, row)
        for explanation in explanations
        for row in range(explanation.input_ids.shape[0])
    ]
    return LeaveOneOutAgreement.of(agreements)
