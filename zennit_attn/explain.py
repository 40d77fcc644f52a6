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


def attribute(
    model: torch.nn.Module,
    input_ids,
    target: TargetLike = None,
    position: int | Sequence[int] | torch.Tensor | None = -1,
    attention_mask=None,
    composite: Composite | None = None,
    observe: Callable[[torch.nn.Module, list], list] | None = None,
    **model_kwargs,
) -> Explanation:
    """:py:func:`explain` with a hook for diagnostics.

    ``observe(model, watched)`` is called inside the composite's context before the forward pass and returns
    handles (with ``remove()``) that are removed after the backward pass; tensors it appends to ``watched``
    during the forward pass are added to the backward pass's inputs, so that their gradient hooks run even
    where they do not lead to the input embeddings.
    """
    from .composites import AttnLRPEpsilon

    if model.training:
        raise ValueError(
            f'{type(model).__name__} is in training mode (dropout active): call model.eval() before explaining'
        )
    input_ids, attention_mask = _check_inputs(input_ids, attention_mask)
    composite = AttnLRPEpsilon() if composite is None else composite
    embedding_module = model.get_input_embeddings()
    if embedding_module is None:
        raise TypeError(f'{type(model).__name__} has no input embeddings (get_input_embeddings() is None)')
    kwargs = _model_kwargs(model, attention_mask, model_kwargs)
    with torch.enable_grad():
        embeddings = embedding_module(input_ids).detach().requires_grad_(True)
        with composite.context(model) as modified:
            watched = []
            handles = observe(modified, watched) if observe is not None else []
            try:
                scores = _scores(modified(inputs_embeds=embeddings, **kwargs))
                positions = _positions(scores, position, attention_mask)
                selected = scores if positions is None else scores[torch.arange(len(positions)), positions]
                targets = _targets(target, selected)
                logit = selected.gather(1, targets[:, None])[:, 0]
                relevance = torch.autograd.grad(
                    logit, [embeddings, *watched], grad_outputs=logit.detach(), allow_unused=True
                )[0]
            finally:
                for handle in handles:
                    handle.remove()
    if torch.finfo(relevance.dtype).bits < 32:
        relevance = relevance.float()
    return Explanation(
        relevance=relevance.sum(-1),
        embedding_relevance=relevance,
        target=targets,
        logit=logit.detach(),
        position=positions,
        input_ids=input_ids,
        attention_mask=attention_mask,
    )


def explain(
    model: torch.nn.Module,
    input_ids,
    target: TargetLike = None,
    position: int | Sequence[int] | torch.Tensor | None = -1,
    attention_mask=None,
    composite: Composite | None = None,
    **model_kwargs,
) -> Explanation:
    """Explain a Hugging Face model's output with AttnLRP: relevance per input token.

    The explained quantity is the logit (no softmax); its value is the initial relevance, so the token
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
        Default :py:class:`~zennit_attn.composites.AttnLRPEpsilon`; :py:class:`~zennit_attn.composites.CPLRPEpsilon`
        for the CP-LRP baseline.
    **model_kwargs
        Passed on to the model's forward (e.g. ``token_type_ids``).

    Returns
    -------
    Explanation
    """
    return attribute(model, input_ids, target, position, attention_mask, composite, **model_kwargs)
