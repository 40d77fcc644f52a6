"""``explain()``: token relevance of a Hugging Face model's prediction in one call."""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from zennit.core import Composite

from .rules import RelevanceBoundary

#: An output index, one per row, or several ``(position, token)`` pairs explained together.
TargetLike = int | Sequence[int] | Sequence[tuple[int, int]] | torch.Tensor | None


@dataclass
class Explanation:
    """What :py:func:`explain` returns.

    Attributes
    ----------
    relevance: torch.Tensor
        ``[batch, seq]`` relevance per input token: the relevance of its word embedding vector summed over the
        hidden dimension (position and segment embeddings do not count toward it). 0 at padding.
    embedding_relevance: torch.Tensor or None
        ``[batch, seq, hidden]`` relevance of the word embedding vectors (None for methods that give only
        per-token scores).
    target: torch.Tensor
        ``[batch]`` the explained output index (vocabulary token, class or hidden unit).
    logit: torch.Tensor
        ``[batch]`` the explained output value; for LRP it is the initial relevance.
    position: torch.Tensor or None
        ``[batch]`` the explained sequence position, None for 2-D outputs (classification heads).
    input_ids: torch.Tensor
        ``[batch, seq]`` the explained input.
    attention_mask: torch.Tensor or None
        The attention mask that was used.
    decoder_relevance, decoder_embedding_relevance, decoder_input_ids: torch.Tensor or None
        For encoder-decoder models, the same for the decoder tokens (``relevance`` is the encoder's); the
        explained position is a decoder position.

    When several ``(position, token)`` pairs are explained at once, ``target``, ``position`` and ``logit`` are
    ``[batch, pairs]`` and the relevance is that of their sum.
    """
    relevance: torch.Tensor
    embedding_relevance: torch.Tensor | None
    target: torch.Tensor
    logit: torch.Tensor
    position: torch.Tensor | None
    input_ids: torch.Tensor
    attention_mask: torch.Tensor | None = None
    decoder_relevance: torch.Tensor | None = None
    decoder_embedding_relevance: torch.Tensor | None = None
    decoder_input_ids: torch.Tensor | None = None

    def tokens(self, tokenizer, row: int = 0) -> list[str]:
        """The input tokens of ``row`` as strings, one per position."""
        return [tokenizer.decode([int(token)]) for token in self.input_ids[row]]

    def top(self, k: int, tokenizer=None, row: int = 0) -> list[tuple[int, float, str | None]]:
        """The ``k`` most relevant positions of ``row`` as ``(position, relevance, token)``; padding excluded."""
        relevance = self.relevance[row].float()
        if self.attention_mask is not None:
            relevance = relevance.masked_fill(self.attention_mask[row] == 0, float('-inf'))
        count = relevance.shape[0] if self.attention_mask is None else int((self.attention_mask[row] != 0).sum())
        values, indices = relevance.topk(min(k, count))
        return [
            (int(index), float(value), None if tokenizer is None else tokenizer.decode([int(self.input_ids[row, index])]))
            for value, index in zip(values, indices)
        ]


def _check_inputs(input_ids, attention_mask, name: str = 'input_ids'):
    input_ids = torch.as_tensor(input_ids)
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2 or input_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f'{name} must be an integer tensor [batch, seq], got {input_ids.dtype} {tuple(input_ids.shape)}')
    if input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise ValueError(f'Nothing to explain: {name} has shape {tuple(input_ids.shape)}')
    if attention_mask is not None:
        attention_mask = torch.as_tensor(attention_mask, device=input_ids.device)
        if attention_mask.dim() == 1:
            attention_mask = attention_mask[None]
        if attention_mask.shape != input_ids.shape:
            raise ValueError(f'attention mask {tuple(attention_mask.shape)} does not match {name} {tuple(input_ids.shape)}')
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
    if left_padded and 'position_ids' not in kwargs and 'position_ids' in parameters:
        if not _is_causal(model):
            raise ValueError(
                f'{type(model).__name__} is not causal and would give left-padded rows shifted positions: '
                'pad on the right, or pass position_ids'
            )
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


def _positions(scores: torch.Tensor, position, mask) -> torch.Tensor | None:
    if scores.dim() == 2:
        return None
    batch, seq = scores.shape[:2]
    if position is None or (isinstance(position, int) and position == -1 and mask is not None):
        if mask is None:
            return torch.full((batch,), seq - 1, device=scores.device)
        order = torch.arange(seq, device=scores.device)
        return ((mask != 0) * (order + 1)).argmax(-1)
    positions = torch.as_tensor(position, device=scores.device).long()
    if positions.dim() < 2:
        positions = positions.flatten()
        if positions.numel() == 1:
            positions = positions.expand(batch)
        if positions.numel() != batch:
            raise ValueError(f'position needs one entry per row ({batch}), got {positions.numel()}')
    if bool(((positions < -seq) | (positions >= seq)).any()):
        raise ValueError(f'position {position} is out of range for sequence length {seq}')
    positions = positions % seq
    if mask is not None:
        rows = torch.arange(batch, device=scores.device).view(-1, *([1] * (positions.dim() - 1)))
        padded = sorted(set((mask[rows, positions] == 0).nonzero()[:, 0].tolist()))
        if padded:
            raise ValueError(f'position {position} is a padding token in row(s) {padded}')
    return positions


def _targets(target, selected: torch.Tensor) -> torch.Tensor:
    batch, size = selected.shape[0], selected.shape[-1]
    if target is None:
        return selected.detach().argmax(-1)
    targets = torch.as_tensor(target, device=selected.device).long()
    if selected.dim() == 2:
        targets = targets.flatten()
        if targets.numel() == 1:
            targets = targets.expand(batch)
        if targets.numel() != batch:
            raise ValueError(f'target needs one entry per row ({batch}), got {targets.numel()}')
    if bool(((targets < 0) | (targets >= size)).any()):
        raise ValueError(f'target {target} is out of range: the explained output has {size} entries')
    return targets


def _pairs(target) -> torch.Tensor | None:
    """``[pairs, 2]`` (position, token) if ``target`` names several pairs, else None."""
    if target is None or isinstance(target, int):
        return None
    if isinstance(target, torch.Tensor):
        return target.long() if target.dim() == 2 and target.shape[1] == 2 else None
    items = list(target)
    if items and all(isinstance(item, (tuple, list)) and len(item) == 2 for item in items):
        return torch.tensor(items, dtype=torch.long)
    return None


class Task:
    """One explanation request: the checked inputs, the model's keyword arguments and, once resolved, which
    output (position, target) of each row is explained.

    Attribution methods use it to run the model on (perturbed, batched) input embeddings and read the
    explained logit of every batch element, so that all methods explain exactly the same quantity. For
    encoder-decoder models the input embeddings are the encoder's; the decoder's (:py:attr:`decoder_embeddings`)
    are passed along unchanged unless given.

    Parameters
    ----------
    model, input_ids, attention_mask, model_kwargs, decoder_input_ids
        As for :py:func:`explain`.
    """
    def __init__(self, model: torch.nn.Module, input_ids, attention_mask=None, model_kwargs: dict | None = None,
                 decoder_input_ids=None):
        if model.training:
            raise ValueError(
                f'{type(model).__name__} is in training mode (dropout active): call model.eval() before explaining'
            )
        self.model = model
        self.input_ids, self.attention_mask = _check_inputs(input_ids, attention_mask)
        embedding_module = model.get_input_embeddings()
        if embedding_module is None:
            raise TypeError(f'{type(model).__name__} has no input embeddings (get_input_embeddings() is None)')
        model_kwargs = dict(model_kwargs or {})
        with torch.no_grad():
            #: ``[batch, seq, hidden]`` word embeddings of the input (detached)
            self.embeddings = embedding_module(self.input_ids).detach()
        self.decoder_input_ids = self.decoder_embeddings = None
        #: mask of the sequence whose outputs are explained
        self.output_mask = self.attention_mask
        if getattr(getattr(model, 'config', None), 'is_encoder_decoder', False):
            if decoder_input_ids is None:
                start = model.config.decoder_start_token_id
                decoder_input_ids = torch.full((self.batch, 1), start, device=self.input_ids.device)
            decoder_mask = model_kwargs.get('decoder_attention_mask')
            self.decoder_input_ids, self.output_mask = _check_inputs(decoder_input_ids, decoder_mask,
                                                                      'decoder_input_ids')
            if self.decoder_input_ids.shape[0] != self.batch:
                raise ValueError('decoder_input_ids must have as many rows as input_ids')
            decoder_embedding = model.get_decoder().get_input_embeddings() or embedding_module
            with torch.no_grad():
                self.decoder_embeddings = decoder_embedding(self.decoder_input_ids).detach()
        elif decoder_input_ids is not None:
            raise ValueError(f'{type(model).__name__} is not an encoder-decoder model: decoder_input_ids is not used')
        self.model_kwargs = _model_kwargs(model, self.attention_mask, model_kwargs)
        self.positions: torch.Tensor | None = None
        self.targets: torch.Tensor | None = None
        #: sorted positions whose logits the model computes (``logits_to_keep``), None for all
        self.kept: torch.Tensor | None = None

    @property
    def batch(self) -> int:
        return self.input_ids.shape[0]

    def keep_logits(self, position=-1, target: TargetLike = None) -> dict:
        """Restrict the model's language-model head to the explained positions: ``{'logits_to_keep': positions}``
        for models whose forward takes ``logits_to_keep`` (Hugging Face ``...ForCausalLM``), ``{}`` otherwise.

        The head's output at other positions does not reach the explained logits, so the relevance is unchanged;
        the head's forward and backward (a third of the FLOPs of a small Llama) and the ``[batch, seq, vocab]``
        logits with their gradient are skipped."""
        if (self.decoder_embeddings is not None or 'logits_to_keep' in self.model_kwargs
                or 'logits_to_keep' not in inspect.signature(self.model.forward).parameters):
            return {}
        pairs = _pairs(target)
        shape = torch.empty(self.batch, self.input_ids.shape[1], 0, device=self.input_ids.device)
        positions = _positions(shape, position if pairs is None else pairs[:, 0].expand(self.batch, -1),
                               self.output_mask)
        self.kept = torch.unique(positions)  # sorted
        return {'logits_to_keep': self.kept}

    def _all_positions(self, scores: torch.Tensor) -> torch.Tensor:
        """``scores`` with a sequence dimension as long as the input's (only its shape is used)."""
        if self.kept is None:
            return scores
        return scores.new_empty(scores.shape[0], self.input_ids.shape[1], 0)

    def forward(self, inputs_embeds: torch.Tensor, rows: torch.Tensor | None = None,
                model: torch.nn.Module | None = None, **extra) -> torch.Tensor:
        """Run ``model`` (default the task's model) on ``inputs_embeds`` and return its logits (or last hidden
        state). ``rows[i]`` names the input row that batch element ``i`` is a variant of (default: identity);
        the model's per-row keyword arguments (attention mask, position ids, decoder embeddings) are repeated
        accordingly."""
        kwargs = dict(self.model_kwargs)
        if self.decoder_embeddings is not None:
            kwargs['decoder_inputs_embeds'] = self.decoder_embeddings
        if rows is not None:
            kwargs = {key: value[rows] if isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == self.batch
                      else value for key, value in kwargs.items()}
        kwargs.update(extra)
        return _scores((self.model if model is None else model)(inputs_embeds=inputs_embeds, **kwargs))

    def resolve(self, scores: torch.Tensor, position=-1, target: TargetLike = None) -> torch.Tensor:
        """Fix the explained position and target of every row from the model's ``scores`` on the unperturbed
        input, and return the explained logits (``[batch]``, or ``[batch, pairs]`` for several pairs)."""
        pairs = _pairs(target)
        if pairs is not None:
            if scores.dim() != 3:
                raise ValueError('(position, token) pairs need an output per position; this model has one per row')
            self.positions = _positions(self._all_positions(scores), pairs[:, 0].expand(self.batch, -1),
                                        self.output_mask)
            self.targets = _targets(pairs[:, 1].expand(self.batch, -1), scores)
        else:
            self.positions = _positions(self._all_positions(scores), position, self.output_mask)
            self.targets = _targets(target, self._rows_of(scores, None))
        return self.select(scores, reduce=False)

    def select(self, scores: torch.Tensor, rows: torch.Tensor | None = None, reduce: bool = True) -> torch.Tensor:
        """The explained logit of every batch element of ``scores`` (variants of input ``rows``), ``[batch]``;
        with several pairs their sum, or ``[batch, pairs]`` if not ``reduce``."""
        if self.targets is None:
            raise RuntimeError('Task.resolve() must be called before select()')
        targets = self.targets if rows is None else self.targets[rows]
        targets = targets.to(scores.device)
        selected = self._rows_of(scores, rows)
        if targets.dim() == 1:
            return selected.gather(-1, targets[:, None])[:, 0]
        values = selected.gather(-1, targets[..., None])[..., 0]
        return values.sum(1) if reduce else values

    def _rows_of(self, scores, rows):
        if self.positions is None:
            return scores
        positions = (self.positions if rows is None else self.positions[rows]).to(scores.device)
        if self.kept is not None:
            positions = torch.searchsorted(self.kept.to(scores.device), positions)
        index = torch.arange(scores.shape[0], device=scores.device).view(-1, *([1] * (positions.dim() - 1)))
        return scores[index, positions]

    def resolve_plain(self, position=-1, target: TargetLike = None) -> torch.Tensor:
        """:py:meth:`resolve` from a plain forward pass without gradients."""
        with torch.no_grad():
            return self.resolve(self.forward(self.embeddings), position, target)

    def explanation(self, embedding_relevance: torch.Tensor, logit: torch.Tensor,
                    decoder_relevance: torch.Tensor | None = None) -> Explanation:
        """Package ``[batch, seq, hidden]`` (or ``[batch, seq]``) relevance as an :py:class:`Explanation`."""
        def per_token(relevance):
            if relevance is None:
                return None, None
            if torch.finfo(relevance.dtype).bits < 32:
                relevance = relevance.float()
            return (relevance.sum(-1), relevance) if relevance.dim() == 3 else (relevance, None)

        relevance, embedding_relevance = per_token(embedding_relevance)
        decoder, decoder_embedding = per_token(decoder_relevance)
        return Explanation(
            relevance=relevance,
            embedding_relevance=embedding_relevance,
            target=self.targets,
            logit=logit.detach(),
            position=self.positions,
            input_ids=self.input_ids,
            attention_mask=self.attention_mask,
            decoder_relevance=decoder,
            decoder_embedding_relevance=decoder_embedding,
            decoder_input_ids=self.decoder_input_ids,
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
    decoder_input_ids=None,
) -> Explanation:
    """LRP with ``composite`` (default :py:class:`~zennit_attn.composites.AttnLRPEpsilon`) in one forward and
    one backward pass; :py:func:`explain` with ``method='attnlrp'`` or ``'cplrp'``.

    ``observe(model, watched)`` is a hook for diagnostics: it is called inside the composite's context before
    the forward pass and returns handles (with ``remove()``) that are removed after the backward pass; tensors
    it appends to ``watched`` during the forward pass are added to the backward pass's inputs, so that their
    gradient hooks run even where they do not lead to the input embeddings.
    """
    from .composites import AttnLRPEpsilon

    task = Task(model, input_ids, attention_mask, model_kwargs, decoder_input_ids)
    composite = AttnLRPEpsilon() if composite is None else composite
    with torch.enable_grad():
        leaves = [task.embeddings.clone().requires_grad_(True)]
        extra = task.keep_logits(position, target)
        if task.decoder_embeddings is not None:
            leaves.append(task.decoder_embeddings.clone().requires_grad_(True))
            extra['decoder_inputs_embeds'] = leaves[1]
        with composite.context(model) as modified:
            if not any(isinstance(hook, RelevanceBoundary) for hook in getattr(composite, 'hook_refs', ())):
                raise TypeError(
                    f'{type(composite).__name__} registered no RelevanceBoundary on the model: explain() reads '
                    'relevance at the input embeddings, which needs the boundary of the zennit-attn composites '
                    '(or a composite that maps the root module to zennit_attn.rules.RelevanceBoundary)'
                )
            watched = []
            handles = observe(modified, watched) if observe is not None else []
            try:
                logit = task.resolve(task.forward(leaves[0], model=modified, **extra), position, target)
                relevance = torch.autograd.grad(
                    logit, [*leaves, *watched], grad_outputs=logit.detach(), allow_unused=True
                )[:len(leaves)]
            finally:
                for handle in handles:
                    handle.remove()
    if not all(bool(torch.isfinite(tensor).all()) for tensor in (logit, *relevance)):
        raise FloatingPointError(
            f'{type(model).__name__} produced a non-finite explained logit or relevance (logit {logit.tolist()}); '
            'with padding in float64 eager attention transformers itself returns NaN logits: use float32 or SDPA'
        )
    return task.explanation(*relevance[:1], logit, *relevance[1:])


def explain(
    model: torch.nn.Module,
    input_ids,
    target: TargetLike = None,
    position: int | Sequence[int] | torch.Tensor | None = -1,
    attention_mask=None,
    composite: Composite | None = None,
    method: str = 'attnlrp',
    model_kwargs: dict | None = None,
    decoder_input_ids=None,
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
    target: int, sequence of int, sequence of (int, int), tensor or None
        Output index to explain, one for all rows or one per row; None explains the argmax. A sequence of
        ``(position, token)`` pairs explains the sum of those logits (e.g. a whole generated answer) in one
        backward pass; ``position`` is then ignored.
    position: int, sequence of int, tensor or None
        For 3-D outputs, the sequence position to explain (a decoder position for encoder-decoder models).
        -1 (default) or None: the last non-padding token of each row. Ignored for 2-D outputs (classification
        heads).
    attention_mask: tensor, optional
        ``[batch, seq]`` 1 for tokens, 0 for padding (left or right; left padding of a causal model gets
        matching ``position_ids``).
    composite: zennit.core.Composite, optional
        For the LRP methods: default :py:class:`~zennit_attn.composites.AttnLRPEpsilon` for ``'attnlrp'`` and
        :py:class:`~zennit_attn.composites.CPLRPEpsilon` for ``'cplrp'``.
    method: str
        ``'attnlrp'`` (default), ``'cplrp'``, or a baseline of :py:data:`zennit_attn.methods.METHODS`.
    model_kwargs: dict, optional
        Passed on to the model's forward (e.g. ``token_type_ids``, ``decoder_attention_mask``).
    decoder_input_ids: tensor, optional
        For encoder-decoder models (T5): the decoder input, default the decoder start token. Relevance is
        returned for encoder and decoder tokens.
    **params
        Hyperparameters of the method (see its documentation).

    Returns
    -------
    Explanation
    """
    if isinstance(input_ids, torch.Tensor) and input_ids.is_floating_point() and input_ids.dim() == 4:
        from .images import explain_image  # pixels [batch, channels, height, width]: an ImageExplanation
        return explain_image(model, input_ids, target=target, composite=composite, method=method, **params)
    from .composites import CPLRPEpsilon

    if method in ('attnlrp', 'cplrp'):
        if params:
            raise TypeError(f'LRP takes no parameters {sorted(params)}; configure it through composite=')
        if composite is None and method == 'cplrp':
            composite = CPLRPEpsilon()
        return attribute(model, input_ids, target, position, attention_mask, composite, model_kwargs=model_kwargs,
                         decoder_input_ids=decoder_input_ids)
    from .methods import METHODS

    if method not in METHODS:
        raise ValueError(f'Unknown method {method!r}; known: attnlrp, cplrp, {", ".join(sorted(METHODS))}')
    if composite is not None:
        raise ValueError(f'composite= applies to the LRP methods, not to {method!r}')
    task = Task(model, input_ids, attention_mask, model_kwargs, decoder_input_ids)
    return METHODS[method](task, position=position, target=target, **params)
