"""``explain()``: token relevance of a Hugging Face model's prediction in one call."""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from zennit.core import Composite

TargetLike = int | Sequence[int] | torch.Tensor | None


@dataclass
class Explanation:
    """What :py:func:`explain` returns.

    Attributes
    ----------
    relevance: torch.Tensor
        ``[batch, seq]`` relevance per input token: the relevance of its word embedding vector summed over the
        hidden dimension (position and segment embeddings do not count toward it). 0 at padding.
    embedding_relevance: torch.Tensor
        ``[batch, seq, hidden]`` relevance of the word embedding vectors.
    target: torch.Tensor
        ``[batch]`` the explained output index (vocabulary token, class or hidden unit).
    logit: torch.Tensor
        ``[batch]`` the explained output value; it is the initial relevance.
    position: torch.Tensor or None
        ``[batch]`` the explained sequence position, None for 2-D outputs (classification heads).
    input_ids: torch.Tensor
        ``[batch, seq]`` the explained input.
    attention_mask: torch.Tensor or None
        The attention mask that was used.
    """
    relevance: torch.Tensor
    embedding_relevance: torch.Tensor
    target: torch.Tensor
    logit: torch.Tensor
    position: torch.Tensor | None
    input_ids: torch.Tensor
    attention_mask: torch.Tensor | None = None

    def tokens(self, tokenizer, row: int = 0) -> list[str]:
        """The input tokens of ``row`` as strings (padding dropped only from nothing: all positions)."""
        return [tokenizer.decode([int(token)]) for token in self.input_ids[row]]

    def top(self, k: int, tokenizer=None, row: int = 0) -> list[tuple[int, float, str | None]]:
        """The ``k`` most relevant positions of ``row`` as ``(position, relevance, token)``."""
        values, indices = self.relevance[row].float().topk(min(k, self.relevance.shape[1]))
        return [
            (int(index), float(value), None if tokenizer is None else tokenizer.decode([int(self.input_ids[row, index])]))
            for value, index in zip(values, indices)
        ]


def _check_inputs(input_ids, attention_mask):
    input_ids = torch.as_tensor(input_ids)
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2 or input_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f'input_ids must be an integer tensor [batch, seq], got {input_ids.dtype} {tuple(input_ids.shape)}')
    if input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise ValueError(f'Nothing to explain: input_ids has shape {tuple(input_ids.shape)}')
    if attention_mask is not None:
        attention_mask = torch.as_tensor(attention_mask, device=input_ids.device)
        if attention_mask.dim() == 1:
            attention_mask = attention_mask[None]
        if attention_mask.shape != input_ids.shape:
            raise ValueError(f'attention_mask {tuple(attention_mask.shape)} does not match input_ids {tuple(input_ids.shape)}')
        if not bool((attention_mask != 0).any(1).all()):
            raise ValueError('A row of attention_mask masks every token: nothing to explain in it')
    return input_ids, attention_mask


def _is_causal(model: torch.nn.Module) -> bool:
    return any(getattr(module, 'is_causal', False) is True for module in model.modules())


def _model_kwargs(model, attention_mask, extra: dict) -> dict:
    parameters = inspect.signature(model.forward).parameters
    kwargs = dict(extra)
    if 'use_cache' in parameters:
        kwargs.setdefault('use_cache', False)
    if attention_mask is None:
        return kwargs
    kwargs['attention_mask'] = attention_mask
    left_padded = bool((attention_mask[:, 0] == 0).any())
    if left_padded and 'position_ids' not in kwargs:
        if not _is_causal(model):
            raise ValueError(
                f'{type(model).__name__} is not causal and would give left-padded rows shifted positions: '
                'pad on the right, or pass position_ids'
            )
        if 'position_ids' in parameters:
            kwargs['position_ids'] = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    return kwargs


def _scores(output) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    for field in ('logits', 'last_hidden_state'):
        value = output.get(field) if hasattr(output, 'get') else None
        if value is not None:
            return value
    if isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise TypeError(f'Cannot find logits or last_hidden_state in the model output {type(output).__name__}')


def _positions(scores: torch.Tensor, position, attention_mask) -> torch.Tensor | None:
    if scores.dim() == 2:
        return None
    batch, seq = scores.shape[:2]
    if position is None or (isinstance(position, int) and position == -1 and attention_mask is not None):
        if attention_mask is None:
            return torch.full((batch,), seq - 1, device=scores.device)
        order = torch.arange(seq, device=scores.device)
        return ((attention_mask != 0) * (order + 1)).argmax(-1)
    positions = torch.as_tensor(position, device=scores.device).long().flatten()
    if positions.numel() == 1:
        positions = positions.expand(batch)
    if positions.numel() != batch:
        raise ValueError(f'position needs one entry per row ({batch}), got {positions.numel()}')
    if bool(((positions < -seq) | (positions >= seq)).any()):
        raise ValueError(f'position {position} is out of range for sequence length {seq}')
    positions = positions % seq
    if attention_mask is not None:
        rows = torch.arange(batch, device=scores.device)
        padded = (attention_mask[rows, positions] == 0).nonzero().flatten().tolist()
        if padded:
            raise ValueError(f'position {position} is a padding token in row(s) {padded}')
    return positions


def _targets(target: TargetLike, selected: torch.Tensor) -> torch.Tensor:
    batch, size = selected.shape
    if target is None:
        return selected.detach().argmax(-1)
    targets = torch.as_tensor(target, device=selected.device).long().flatten()
    if targets.numel() == 1:
        targets = targets.expand(batch)
    if targets.numel() != batch:
        raise ValueError(f'target needs one entry per row ({batch}), got {targets.numel()}')
    if bool(((targets < 0) | (targets >= size)).any()):
        raise ValueError(f'target {target} is out of range: the explained output has {size} entries')
    return targets


class Task:
    """One explanation request: the checked inputs, the model's keyword arguments and, once resolved, which
    output (position, target) of each row is explained.

    Attribution methods use it to run the model on (perturbed, batched) input embeddings and read the
    explained logit of every batch element, so that all methods explain exactly the same quantity.

    Parameters
    ----------
    model, input_ids, attention_mask, model_kwargs
        As for :py:func:`explain`.
    """
    def __init__(self, model: torch.nn.Module, input_ids, attention_mask=None, model_kwargs: dict | None = None):
        if model.training:
            raise ValueError(
                f'{type(model).__name__} is in training mode (dropout active): call model.eval() before explaining'
            )
        self.model = model
        self.input_ids, self.attention_mask = _check_inputs(input_ids, attention_mask)
        embedding_module = model.get_input_embeddings()
        if embedding_module is None:
            raise TypeError(f'{type(model).__name__} has no input embeddings (get_input_embeddings() is None)')
        with torch.no_grad():
            #: ``[batch, seq, hidden]`` word embeddings of the input (detached)
            self.embeddings = embedding_module(self.input_ids).detach()
        self.model_kwargs = _model_kwargs(model, self.attention_mask, model_kwargs or {})
        self.positions: torch.Tensor | None = None
        self.targets: torch.Tensor | None = None

    @property
    def batch(self) -> int:
        return self.input_ids.shape[0]

    def forward(self, inputs_embeds: torch.Tensor, rows: torch.Tensor | None = None,
                model: torch.nn.Module | None = None, **extra) -> torch.Tensor:
        """Run ``model`` (default the task's model) on ``inputs_embeds`` and return its logits (or last hidden
        state). ``rows[i]`` names the input row that batch element ``i`` is a variant of (default: identity);
        the model's per-row keyword arguments (attention mask, position ids) are repeated accordingly."""
        kwargs = dict(self.model_kwargs)
        if rows is not None:
            kwargs = {key: value[rows] if isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == self.batch
                      else value for key, value in kwargs.items()}
        kwargs.update(extra)
        return _scores((self.model if model is None else model)(inputs_embeds=inputs_embeds, **kwargs))

    def resolve(self, scores: torch.Tensor, position=-1, target: TargetLike = None) -> torch.Tensor:
        """Fix the explained position and target of every row from the model's ``scores`` on the unperturbed
        input, and return the explained logits ``[batch]``."""
        self.positions = _positions(scores, position, self.attention_mask)
        self.targets = _targets(target, self._rows_of(scores, None))
        return self.select(scores)

    def select(self, scores: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The explained logit of every batch element of ``scores`` (variants of input ``rows``)."""
        if self.targets is None:
            raise RuntimeError('Task.resolve() must be called before select()')
        targets = self.targets if rows is None else self.targets[rows]
        return self._rows_of(scores, rows).gather(1, targets[:, None].to(scores.device))[:, 0]

    def _rows_of(self, scores, rows):
        if self.positions is None:
            return scores
        positions = self.positions if rows is None else self.positions[rows]
        return scores[torch.arange(scores.shape[0], device=scores.device), positions.to(scores.device)]

    def resolve_plain(self, position=-1, target: TargetLike = None) -> torch.Tensor:
        """:py:meth:`resolve` from a plain forward pass without gradients."""
        with torch.no_grad():
            return self.resolve(self.forward(self.embeddings), position, target)

    def explanation(self, embedding_relevance: torch.Tensor, logit: torch.Tensor) -> Explanation:
        """Package ``[batch, seq, hidden]`` (or ``[batch, seq]``) relevance as an :py:class:`Explanation`."""
        if torch.finfo(embedding_relevance.dtype).bits < 32:
            embedding_relevance = embedding_relevance.float()
        relevance = embedding_relevance.sum(-1) if embedding_relevance.dim() == 3 else embedding_relevance
        return Explanation(
            relevance=relevance,
            embedding_relevance=embedding_relevance if embedding_relevance.dim() == 3 else None,
            target=self.targets,
            logit=logit.detach(),
            position=self.positions,
            input_ids=self.input_ids,
            attention_mask=self.attention_mask,
        )


def attribute(
    model: torch.nn.Module,
    input_ids,
    target: TargetLike = None,
    position: int | Sequence[int] | torch.Tensor | None = -1,
    attention_mask=None,
    composite: Composite | None = None,
    observe: Callable[[torch.nn.Module, list], list] | None = None,
    model_kwargs: dict | None = None,
) -> Explanation:
    """LRP with ``composite`` (default :py:class:`~zennit_attn.composites.AttnLRPEpsilon`) in one forward and
    one backward pass; :py:func:`explain` with ``method='attnlrp'`` or ``'cplrp'``.

    ``observe(model, watched)`` is a hook for diagnostics: it is called inside the composite's context before
    the forward pass and returns handles (with ``remove()``) that are removed after the backward pass; tensors
    it appends to ``watched`` during the forward pass are added to the backward pass's inputs, so that their
    gradient hooks run even where they do not lead to the input embeddings.
    """
    from .composites import AttnLRPEpsilon

    task = Task(model, input_ids, attention_mask, model_kwargs)
    composite = AttnLRPEpsilon() if composite is None else composite
    with torch.enable_grad():
        embeddings = task.embeddings.clone().requires_grad_(True)
        with composite.context(model) as modified:
            watched = []
            handles = observe(modified, watched) if observe is not None else []
            try:
                logit = task.resolve(task.forward(embeddings, model=modified), position, target)
                relevance = torch.autograd.grad(
                    logit, [embeddings, *watched], grad_outputs=logit.detach(), allow_unused=True
                )[0]
            finally:
                for handle in handles:
                    handle.remove()
    return task.explanation(relevance, logit)


def explain(
    model: torch.nn.Module,
    input_ids,
    target: TargetLike = None,
    position: int | Sequence[int] | torch.Tensor | None = -1,
    attention_mask=None,
    composite: Composite | None = None,
    method: str = 'attnlrp',
    model_kwargs: dict | None = None,
    **params,
) -> Explanation:
    """Explain a Hugging Face model's output: relevance per input token, by AttnLRP or a baseline method.

    The explained quantity is the logit (no softmax). For LRP its value is the initial relevance, so the token
    relevances sum to the logit minus what biases and the softmax rule absorb (see :py:func:`conservation`).

    Parameters
    ----------
    model: torch.nn.Module
        A Hugging Face model in eval mode: ``...ForCausalLM``, ``...ForSequenceClassification``,
        ``...ForMaskedLM`` or a base model (whose ``last_hidden_state`` is explained, ``target`` naming a
        hidden unit).
    input_ids: tensor or sequence of int
        ``[batch, seq]`` (or ``[seq]``) token ids.
    target: int, sequence of int, tensor or None
        Output index to explain, one for all rows or one per row; None explains the argmax.
    position: int, sequence of int, tensor or None
        For 3-D outputs, the sequence position to explain. -1 (default) or None: the last non-padding token of
        each row. Ignored for 2-D outputs (classification heads).
    attention_mask: tensor, optional
        ``[batch, seq]`` 1 for tokens, 0 for padding (left or right; left padding of a causal model gets
        matching ``position_ids``).
    composite: zennit.core.Composite, optional
        For the LRP methods: default :py:class:`~zennit_attn.composites.AttnLRPEpsilon` for ``'attnlrp'`` and
        :py:class:`~zennit_attn.composites.CPLRPEpsilon` for ``'cplrp'``.
    method: str
        ``'attnlrp'`` (default), ``'cplrp'``, or a baseline of :py:data:`zennit_attn.methods.METHODS`.
    model_kwargs: dict, optional
        Passed on to the model's forward (e.g. ``token_type_ids``).
    **params
        Hyperparameters of the method (see its documentation).

    Returns
    -------
    Explanation
    """
    from .composites import CPLRPEpsilon

    if method in ('attnlrp', 'cplrp'):
        if params:
            raise TypeError(f'LRP takes no parameters {sorted(params)}; configure it through composite=')
        if composite is None and method == 'cplrp':
            composite = CPLRPEpsilon()
        return attribute(model, input_ids, target, position, attention_mask, composite, model_kwargs=model_kwargs)
    from .methods import METHODS

    if method not in METHODS:
        raise ValueError(f'Unknown method {method!r}; known: attnlrp, cplrp, {", ".join(sorted(METHODS))}')
    if composite is not None:
        raise ValueError(f'composite= applies to the LRP methods, not to {method!r}')
    task = Task(model, input_ids, attention_mask, model_kwargs)
    return METHODS[method](task, position=position, target=target, **params)
