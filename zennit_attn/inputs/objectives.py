"""What is explained of a model's scores at the explained position(s): an :py:class:`Objective`.

:py:class:`Logit` (the default) explains the target's logit; :py:class:`Contrast` the difference of the target's and a
contrast token's logit ("why ' Paris' rather than ' London'?", ``explain(..., contrast=...)``);
:py:class:`OutputFunction` any scalar function of the scores (``explain(..., target=callable)``: a
log-probability with a temperature, the sum of a class's tokens, a KL term); :py:class:`MapFunction` a function of a
whole output map per row (a segmentation map, a depth map: :py:func:`map_objective`). A
:py:class:`~zennit_attn.inputs.task.Task`
holds one objective and reads every explained value through it (:py:meth:`~zennit_attn.inputs.task.Task.select`), so
every method explains the same value.

For LRP the explained value ``f`` is the initial relevance. The scores ``y`` receive the relevance ``y_i df/dy_i``
(the Deep Taylor decomposition of ``f`` at ``y``), which the AttnLRP rules propagate as the gradient ``df/dy``: the
backward pass starts with ``f`` converted to the gradient ``f / f`` (:py:class:`RelevanceToGradient`) and reaches the
scores as ``df/dy``, the model's output boundary passing gradients
(:py:func:`~zennit_attn.rules.boundary.gradient_outputs`: no row of the scores is kept for a conversion that would
multiply by ``y`` and divide by it again): for a logit or a difference of logits this is ``f`` itself, split exactly
(relevance is linear in it: a contrast's relevance is the target's minus the contrast's); for a softmax probability
it is the paper's softmax rule (Proposition 3.1), for which see the notes of :py:class:`OutputFunction`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .checks import as_integers, default_position

__all__ = [
    'RUNNER_UP',
    'OBJECTIVES',
    'Objective',
    'Logit',
    'LogProbability',
    'LogOdds',
    'Contrast',
    'OutputFunction',
    'MapFunction',
    'map_objective',
    'objective_for',
    'RelevanceToGradient',
]

#: ``contrast=RUNNER_UP``: at each explained position the most likely token other than the target.
RUNNER_UP = 'runner-up'


class RelevanceToGradient(torch.autograd.Function):
    """Identity whose backward turns the initial relevance ``R`` given at the value ``f`` into the factor ``R / f``,
    and ``fallback`` where ``f == 0`` (1: the limit of ``R / f`` for ``R = f``, for targets whose value may vanish;
    0: nothing flows from a zero value). ``RelevanceToGradient.apply(value, fallback)``; used by the objectives here and
    by the latent targets (:py:mod:`zennit_attn.latent.targets`)."""

    @staticmethod
    def forward(ctx, value, fallback: float = 1.0):
        """Return ``value`` unchanged and keep it (and ``fallback``) for the backward pass."""
        ctx.save_for_backward(value)
        ctx.fallback = fallback
        return value.view_as(value)

    @staticmethod
    def backward(ctx, relevance):
        """Return ``relevance / value`` (``fallback`` where ``value == 0``); no gradient for ``fallback``."""
        (value,) = ctx.saved_tensors
        nonzero = value != 0
        return torch.where(
            nonzero, relevance / torch.where(nonzero, value, 1), torch.full_like(relevance, ctx.fallback)
        ), None


def _gather(selected: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``selected[..., ids]``, one entry of the last dimension per leading index (``ids``: ``selected.shape[:-1]``), by
    advanced indexing: its backward pass keeps the indices only (``gather`` keeps all of ``selected``, a row of the
    vocabulary per explained position, alive until the backward pass)."""
    rows = selected.reshape(-1, selected.shape[-1])
    ids = ids.to(selected.device).expand(selected.shape[:-1]).reshape(-1)
    return rows[torch.arange(rows.shape[0], device=rows.device), ids].reshape(selected.shape[:-1])


class Objective:
    """What is explained of the scores at the explained position(s).

    :py:meth:`resolve` fixes what depends on the unperturbed scores (a runner-up token, checks of a function) and
    returns the resolved objective; :py:meth:`value` is the explained value of ``[batch, outputs]`` (or
    ``[batch, pairs, outputs]``) ``selected`` scores, one per row (or per row and pair).
    """

    #: ``[batch]`` (or ``[batch, pairs]``) contrast token ids, None for no contrast
    contrast: torch.Tensor | None = None
    #: The gradient of a zero initial relevance ``f`` (:py:class:`RelevanceToGradient`): 1, the limit of ``f / f``, for
    #: values that may vanish where the scores do not (a difference, a log-probability)
    fallback: float = 1.0

    def resolve(self, selected: torch.Tensor, targets: torch.Tensor) -> Objective:
        """The objective for the scores ``selected`` of the unperturbed input and the resolved ``targets``."""
        return self

    def compute(self, selected: torch.Tensor, targets: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
        """The explained value of each batch element (variants of input ``rows``)."""
        raise NotImplementedError

    def value(
        self,
        selected: torch.Tensor,
        targets: torch.Tensor,
        rows: torch.Tensor | None = None,
        initial_relevance: bool = False,
    ) -> torch.Tensor:
        """:py:meth:`compute`; ``initial_relevance``: LRP's backward pass starts with the value itself (the initial
        relevance ``f``), which reaches the scores ``y`` as the gradient ``df/dy`` (the relevance ``y * df/dy``; see the
        module's documentation: the model's output boundary passes gradients)."""
        value = self.compute(selected, targets, rows)
        return RelevanceToGradient.apply(value, self.fallback) if initial_relevance else value


class Logit(Objective):
    """The target's logit (score): the default."""

    #: a logit of exactly 0 passes no relevance (as any zero output, :py:class:`~zennit_attn.rules.RelevanceBoundary`)
    fallback = 0.0

    def compute(self, selected, targets, rows):
        return _gather(selected, targets)


class LogProbability(Objective):
    """The target's log-probability ``log softmax(y)_t`` (``explain(..., objective='log_probability')``), per row or
    per ``(position, token)`` pair (a whole answer: the sum of its tokens' log-probabilities).

    For LRP the logits receive ``y_i (delta_it - p_i)``, so the relevance sums to ``y_t - sum_i p_i y_i`` per token: the
    log-probability plus the prediction's entropy ``H(p)`` (``log p_t = y_t - sum_i p_i y_i - H(p)``), which no
    input gets (as a bias absorbs its share); see :py:class:`OutputFunction` on softmax outputs.
    """

    def compute(self, selected, targets, rows):
        return _gather(selected.log_softmax(-1), targets)


class LogOdds(Objective):
    """The target's log-odds ``log (p_t / (1 - p_t)) = y_t - log sum_{i != t} exp(y_i)`` (``explain(...,
    objective='log_odds')``; ContextCite's "logit-probability"), per row or per ``(position, token)`` pair (a whole
    answer: the sum over its tokens).

    For LRP the logits receive ``y_i (delta_it - q_i)`` with ``q`` the softmax over the other tokens (``q_t = 0``), so
    the relevance sums to ``y_t - sum_{i != t} q_i y_i`` per token: the target's logit against the expected logit of
    its competitors, the log-odds plus their entropy ``H(q)`` (absorbed as a bias). Unlike the log-probability, whose
    gradient ``delta_it - p_i`` vanishes as ``p_t`` approaches 1 (a token the context makes certain gets next to no
    relevance, and what remains is dominated by the tail of the distribution), the log-odds do not saturate: they grow
    without bound with the target's margin over its competitors.
    """

    def compute(self, selected, targets, rows):
        ids = targets.to(selected.device)[..., None]
        others = selected.scatter(-1, ids, float('-inf')).logsumexp(-1)
        return _gather(selected, targets) - others


class Contrast(Objective):
    """The target's logit minus the contrast token's: why the target rather than the contrast.

    Parameters
    ----------
    contrast: int, sequence of int, tensor or ``'runner-up'``
        The contrast token: one for all rows, one per row, or, with several ``(position, token)`` targets, one per
        pair (or ``[batch, pairs]``); :py:data:`RUNNER_UP`: at each explained position the highest-scoring token
        other than the target.
    """

    def __init__(self, contrast):
        if isinstance(contrast, str) and contrast != RUNNER_UP:
            raise ValueError(
                f'contrast {contrast!r} is text: give token ids (explain() turns a text into its one '
                f'token with tokenizer=), or {RUNNER_UP!r}'
            )
        if contrast is None:
            raise ValueError('Contrast needs a contrast token')
        self.spec = contrast

    def resolve(self, selected, targets):
        size = selected.shape[-1]
        if isinstance(self.spec, str):
            if size < 2:
                raise ValueError(f'contrast={RUNNER_UP!r} needs at least two outputs, the model has {size}')
            others = selected.detach().scatter(-1, targets.to(selected.device)[..., None], -float('inf'))
            ids = others.argmax(-1)
        else:
            ids = as_integers(self.spec, 'contrast').to(targets.device)
            if ids.dim() == 0 or ids.numel() == 1:
                ids = ids.reshape(()).expand(targets.shape)
            elif targets.dim() == 1 and ids.dim() == 1 and ids.numel() == targets.shape[0]:
                pass
            elif targets.dim() == 2 and ids.dim() == 1 and ids.numel() == targets.shape[1]:
                ids = ids[None].expand(targets.shape)
            elif ids.shape != targets.shape:
                what = (
                    f'{targets.shape[0]} rows' if targets.dim() == 1 else f'{targets.shape[1]} (position, token) pairs'
                )
                raise ValueError(
                    f'contrast needs one token for all rows or one per entry ({what}), got shape {tuple(ids.shape)}'
                )
            if bool(((ids < 0) | (ids >= size)).any()):
                raise ValueError(f'contrast {self.spec} is out of range: the explained output has {size} entries')
        same = ids.to(targets.device) == targets
        if bool(same.any()):
            rows = sorted(set(same.reshape(same.shape[0], -1).any(1).nonzero()[:, 0].tolist()))
            raise ValueError(
                f'the contrast token is the target itself in row(s) {rows} (id '
                f'{int(targets[same][0])}): nothing to contrast; choose another token'
            )
        resolved = Contrast(self.spec)
        resolved.contrast = ids.to(targets.device)
        return resolved

    def compute(self, selected, targets, rows):
        if self.contrast is None:
            raise RuntimeError('Contrast.resolve() must be called before its value is read')
        ids = self.contrast if rows is None else self.contrast[rows.to(self.contrast.device)]
        return _gather(selected, targets) - _gather(selected, ids)


class OutputFunction(Objective):
    """A scalar function of the scores at the explained position, as zennit's output functions: ``function``
    receives the ``[batch, outputs]`` scores (the logits of a language model at the explained position, the class
    scores of a classification head) and returns ``[batch]`` values, which are explained; it must be differentiable
    for the methods with a backward pass. For LRP the value is the initial relevance and the logits receive
    ``y_i df/dy_i`` (the Deep Taylor decomposition of ``f`` at the logits).

    Notes
    -----
    Softmax outputs and temperature (the paper, appendix A.2.4 "Impact of temperature scaling on the softmax rule",
    and Proposition 3.1): the paper explains logits, never the softmax output ("the softmax layer is always removed
    and LRP only applied to the logit outputs"). For a probability ``s_t = softmax(y / T)_t`` the relevance the
    logits receive here, ``y_i ds_t/dy_i = (y_i / T) s_t (delta_it - s_i)``, is the paper's softmax rule. When the
    softmax saturates (``s_t`` near 1: a confident model, or a low temperature ``T``) the derivative ``s_t (1 - s_t)``
    vanishes and the relevance with it: the bias term absorbs it and the explanation goes blank. The paper suggests a
    higher temperature when explaining a softmax output. A log-probability ``log softmax(y / T)_t`` has the gradient
    ``(delta_it - s_i) / T``, which saturates as well; its relevance sums to ``(y_t - sum_i s_i y_i) / T`` (the
    target's logit against the expected logit), not to the log-probability itself. For a logit or a difference of
    logits nothing of this applies: the relevance sums to the value (up to what biases absorb).
    """

    #: the dimensions of the scores the function receives: ``[batch, outputs]`` (subclasses may take more)
    dims = 2

    def __init__(self, function: Callable[[torch.Tensor], torch.Tensor]):
        if not callable(function):
            raise TypeError(f'the target function must be callable, got {type(function).__name__}')
        self.function = function

    @property
    def name(self) -> str:
        return getattr(self.function, '__name__', type(self.function).__name__)

    def compute(self, selected, targets, rows):
        if selected.dim() != self.dims:
            raise ValueError(
                f'the target function {self.name} takes scores of {self.dims} dimensions, got shape '
                f'{tuple(selected.shape)}: a target function explains one position per row and cannot be combined '
                'with several (position, token) pairs'
            )
        value = self.function(selected)
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f'the target function {self.name} must return a tensor of one value per row, got {type(value).__name__}'
            )
        if value.shape != selected.shape[:1]:
            raise ValueError(
                f'the target function {self.name} must return one value per row, shape '
                f'({selected.shape[0]},), got shape {tuple(value.shape)} for scores of shape '
                f'{tuple(selected.shape)}'
            )
        if not value.is_floating_point():
            raise ValueError(
                f'the target function {self.name} returned {value.dtype} values: it must return floating-point values'
            )
        return value

    def resolve(self, selected, targets):
        value = self.compute(selected, targets, None)
        if not bool(torch.isfinite(value).all()):
            bad = (~torch.isfinite(value.detach())).nonzero()[:, 0].tolist()
            raise ValueError(
                f'the target function {self.name} returned non-finite values (NaN or infinite) in '
                f'row(s) {bad}: {value.detach().tolist()}'
            )
        if selected.requires_grad and not value.requires_grad:
            raise ValueError(
                f'the target function {self.name} returned a value without gradient: it must compute '
                'with the scores it receives (no .detach(), .item() or numpy in between)'
            )
        return self


class MapFunction(OutputFunction):
    """A scalar function of a whole output map per row: ``function`` receives the model's ``[batch, ...]`` output of
    more than two dimensions after the batch (a semantic segmentation's ``[batch, classes, height, width]`` logits, a
    ``[batch, channels, height, width]`` reconstruction; an image model's ``[batch, height, width]`` depth map or
    ``[batch, queries, classes]`` detections without a position) and returns ``[batch]`` values, which are explained,
    e.g.
    ``lambda logits: logits[:, c].sum((-2, -1))`` (class ``c``'s score summed over the image) or
    ``lambda logits: (logits[:, c] * mask).sum((-2, -1))`` (over a region). Made by :py:func:`map_objective`.

    Parameters
    ----------
    function: callable
        ``[batch, ...]`` output to ``[batch]`` values.
    dims: int
        The dimensions of the output map, batch included.
    """

    def __init__(self, function: Callable[[torch.Tensor], torch.Tensor], dims: int):
        super().__init__(function)
        self.dims = dims


def map_objective(objective: Objective, shape: torch.Size, position, model_name: str) -> MapFunction:
    """The objective of an output map of ``shape`` (``[batch, ...]`` of more than three dimensions: one score per
    class and pixel, or per channel and pixel; of three, where an image model's output is explained as a whole: a
    depth map): only a function of the whole map (``explain(..., target=callable)``) says what of it is explained;
    ``model_name`` names the model in refusals.

    Raises
    ------
    ValueError
        For any other target (a class index, the argmax, a contrast, a named objective), and for a ``position`` (the
        map has none: index it in the function).
    """
    recipe = (
        'explain a function of the whole map, target=lambda scores: scores[:, c].sum((-2, -1)) for class c over the '
        'image, or (scores[:, c] * mask).sum((-2, -1)) over a region'
    )
    if not isinstance(objective, OutputFunction):
        raise ValueError(
            f'the output of {model_name} is a map of shape {tuple(shape)} (e.g. [batch, classes, height, width] of a '
            f'semantic segmentation), not one score per class: a class index or the argmax does not say which of its '
            f'{shape[1:].numel()} scores is explained; {recipe}'
        )
    if not default_position(position):
        raise ValueError(
            f'the output of {model_name} is a map of shape {tuple(shape)} without positions: position= does not '
            f'apply; {recipe}'
        )
    return MapFunction(objective.function, len(shape))


#: ``explain(..., objective=...)``: what is explained of the target's scores, by name: its logit (the default), its
#: log-probability or its log-odds (the logit of its probability).
OBJECTIVES = {'logit': Logit, 'log_probability': LogProbability, 'log_odds': LogOdds}


def objective_for(target, contrast=None, objective: str = 'logit') -> tuple[object, Objective]:
    """``(token_target, objective)`` of ``explain()``'s ``target``, ``contrast`` (token ids, not text) and
    ``objective``: a callable target becomes an :py:class:`OutputFunction` (its token target None, the argmax, for
    reference), a contrast a :py:class:`Contrast`, a named ``objective`` other than ``'logit'`` its class of
    :py:data:`OBJECTIVES` (:py:class:`LogProbability`, :py:class:`LogOdds`), else the :py:class:`Logit`.

    Raises
    ------
    ValueError
        For a contrast with a callable target, an ``objective`` not in :py:data:`OBJECTIVES`, or an objective other
        than the logit with a callable target or a contrast.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f'objective must be one of {", ".join(map(repr, OBJECTIVES))}, got {objective!r}')
    if objective != 'logit':
        if contrast is not None or (callable(target) and not isinstance(target, torch.Tensor)):
            raise ValueError(
                f"objective={objective!r} explains a function of the target's scores: it takes neither a contrast "
                'nor a target function (a function explains itself: return the value from it)'
            )
        return target, OBJECTIVES[objective]()
    if callable(target) and not isinstance(target, torch.Tensor):
        if contrast is not None:
            raise ValueError(
                'contrast= compares two tokens; with a target function the function itself is explained: '
                'compute the difference inside it'
            )
        return None, OutputFunction(target)
    if contrast is not None:
        return target, Contrast(contrast)
    return target, Logit()
