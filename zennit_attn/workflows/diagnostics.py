"""Where relevance goes: the relevance sum at every layer boundary of a model against the explained logit."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from zennit.core import Composite

from ..composites import AttnLRPEpsilon
from ..core.blocks import block_stacks
from ..core.modules import decoder_word_embeddings, is_encoder_decoder
from ..inputs.checks import is_image_model, split_encoding
from ..inputs.task import TokenTask
from ..methods.lrp import attribute
from ..results.explanation import TargetLike
from ..rules.positions import position_encodings

#: The rows of a :py:class:`ConservationReport` at the input, in their order: the word embeddings, the others, and
#: PA-LRP's positions.
INPUT_ROWS = ('word embeddings', 'other embeddings', 'positions')


@dataclass
class ConservationReport:
    """Relevance sums at the layer boundaries, from the output down to the input.

    Attributes
    ----------
    logit: torch.Tensor
        ``[batch]`` the explained logit (the initial relevance; the sum for several pairs).
    names: list of str
        Boundary names, output first: ``output of <block path>`` for every block of each stack (for
        encoder-decoder models the decoder's, then the encoder's), ``input of <first block>``, then
        ``word embeddings`` (all input tokens, encoder and decoder) and ``other embeddings`` (position /
        segment embeddings, where the model has them), and with PA-LRP's positions (a composite with
        ``positions=True``, :py:mod:`zennit_attn.rules.positions`) ``positions`` (the position encodings' relevance,
        rotary ones included, an encoder-decoder's encoder and decoder positions together; position tables are
        counted there, not among the other embeddings).
    sums: torch.Tensor
        ``[len(names), batch]`` relevance summed over positions and hidden units at each boundary; NaN at a block
        boundary the forward pass did not reach (a vision tower's blocks on a text input). A model whose blocks the
        forward pass runs without their module call (SqueezeBERT calls ``layer.forward(...)``, which runs no hook) is
        refused (ValueError), as no boundary of it can be read.

    For encoder-decoder models a decoder boundary carries only the relevance that has not yet been handed to
    the encoder through cross-attention, so decoder rows are not comparable with the logit on their own.
    """

    logit: torch.Tensor
    names: list[str]
    sums: torch.Tensor

    @property
    def fractions(self) -> torch.Tensor:
        """``sums / logit``: 1 where all relevance is conserved."""
        return self.sums / self.logit

    @property
    def input_fraction(self) -> torch.Tensor:
        """``[batch]`` fraction of the logit that reaches the input (word and other embeddings, positions)."""
        rows = [index for index, name in enumerate(self.names) if name in INPUT_ROWS]
        return self.sums[rows].sum(0) / self.logit

    def __str__(self) -> str:
        lines = [
            f'{"boundary":<40} {"relevance":>12} {"of logit":>9} {"leak":>10}',
            f'{"logit":<40} {float(self.logit[0]):>12.5f} {1:>9.4f}',
        ]
        previous = float(self.logit[0])
        for index, name in enumerate(self.names):
            value = float(self.sums[index, 0])
            leak = '' if name in INPUT_ROWS[1:] else f'{previous - value:>10.5f}'
            lines.append(f'{name:<40} {value:>12.5f} {value / float(self.logit[0]):>9.4f} {leak}')
            if name != 'word embeddings' and not math.isnan(value):
                previous = value
        return '\n'.join(lines)


class _Probe:
    """Collect ``sum(x * g)`` of the tensors it watches during the backward pass (one explained row)."""

    def __init__(self, watched: list):
        self.value = torch.zeros((), dtype=torch.float64)
        self.watched = watched
        #: whether the forward pass reached the boundary (its hook ran)
        self.reached = False

    def watch(self, tensor):
        self.reached = True
        if isinstance(tensor, (tuple, list)):
            tensor = tensor[0]
        if not (isinstance(tensor, torch.Tensor) and tensor.requires_grad):
            return
        detached = tensor.detach()

        def hook(grad):
            self.value = self.value + (detached.double() * grad.double()).sum().cpu()

        tensor.register_hook(hook)
        self.watched.append(tensor)


def conservation(
    model: torch.nn.Module,
    input_ids,
    target: TargetLike = None,
    position=-1,
    attention_mask=None,
    composite: Composite | None = None,
    model_kwargs: dict | None = None,
    decoder_input_ids=None,
) -> ConservationReport:
    """Explain like :py:func:`~zennit_attn.explain` and report the relevance sum at every layer boundary.

    With the AttnLRP rules, relevance leaks only through biases (linear layers, LayerNorm), the hidden bias of
    the softmax rule (Prop. 3.1) and the epsilon stabilisers; the report shows how much leaks at each block.
    Arguments are those of :py:func:`~zennit_attn.explain` with ``method='attnlrp'``: ``composite`` defaults to
    :py:class:`~zennit_attn.composites.AttnLRPEpsilon`. Rows are explained one at a time, so that embeddings
    shared by all rows (position embeddings) are reported per row. Language models only: an image model is refused
    (TypeError).
    """
    if is_image_model(model):
        raise TypeError(
            f'conservation() reports the layer boundaries of language models; {type(model).__name__} takes pixels: '
            'compare explain(model, pixels).pixel_relevance.sum((1, 2, 3)) with its .logit'
        )
    composite = AttnLRPEpsilon() if composite is None else composite
    input_ids, attention_mask, model_kwargs = split_encoding(input_ids, attention_mask, model_kwargs)
    input_ids = torch.as_tensor(input_ids)
    input_ids = input_ids[None] if input_ids.dim() == 1 else input_ids
    rows = [
        _conservation_row(
            model, input_ids, row, target, position, attention_mask, composite, model_kwargs, decoder_input_ids
        )
        for row in range(input_ids.shape[0])
    ]
    names = rows[0][1]
    return ConservationReport(
        logit=torch.stack([row[0] for row in rows]), names=names, sums=torch.stack([row[2] for row in rows], 1)
    )


def _select_row(value, row: int, batch: int):
    """Row ``row`` of a per-row argument (tensor or sequence with one entry per row), else the value itself."""
    if isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == batch and batch > 1:
        return value[row : row + 1]
    if (
        isinstance(value, (list, tuple))
        and len(value) == batch
        and batch > 1
        and not (value and isinstance(value[0], (tuple, list)))
    ):
        return value[row]
    return value


def _conservation_row(
    model, input_ids, row, target, position, attention_mask, composite, model_kwargs, decoder_input_ids
):
    """``(logit, boundary names, sums)`` of row ``row`` explained alone: the relevance at every layer boundary, then
    at the word embeddings and at the other embeddings."""
    pick = functools.partial(_select_row, row=row, batch=input_ids.shape[0])
    positions = getattr(composite, 'positions', False)
    boundaries = _Boundaries(model, position_encodings(model.named_modules()) if positions else [])
    task = TokenTask(
        model,
        input_ids[row : row + 1],
        pick(attention_mask),
        {key: pick(value) for key, value in (model_kwargs or {}).items()},
        pick(decoder_input_ids),
    )
    explanation = attribute(task, pick(position), pick(target), composite, observe=boundaries.observe)
    words = explanation.relevance.double().sum()
    if explanation.decoder_relevance is not None:
        words = words + explanation.decoder_relevance.double().sum()
    probes = [boundaries.probes[name] for name in boundaries.names]
    if not any(probe.reached for probe in probes):
        paths = ', '.join(repr(path) for path, _ in boundaries.stacks[::-1])
        raise ValueError(
            f'conservation(): the forward pass of {type(model).__name__} ran none of its transformer blocks ({paths}) '
            'through their module call (the hooks on them never ran: the model calls block.forward(...) directly, '
            "as SqueezeBERT's encoder does), so no layer boundary can be read; compare explain(...).relevance.sum() "
            'with its .logit instead'
        )
    # a boundary the forward pass did not reach (a vision tower on a text input) holds no relevance to report: NaN
    sums = [probe.value if probe.reached else torch.tensor(math.nan, dtype=torch.float64) for probe in probes]
    sums += [words.cpu(), boundaries.probes['other embeddings'].value]
    if explanation.position_relevance is not None:  # PA-LRP: the encoder's and the decoder's positions
        positions = explanation.position_relevance.double().sum()
        if explanation.decoder_position_relevance is not None:
            positions = positions + explanation.decoder_position_relevance.double().sum()
        sums.append(positions.cpu())
    logit = explanation.logit.double().sum().cpu()
    return logit, boundaries.names + list(INPUT_ROWS[: len(sums) - len(boundaries.names)]), torch.stack(sums)


class _Boundaries:
    """The layer boundaries of a model whose relevance :py:func:`conservation` reports for one explained row: the
    output of every block and the input of each stack's first block (output side first: for encoder-decoder models
    the decoder's, then the encoder's), and the embeddings other than the word embeddings. :py:meth:`observe` hooks
    a :py:class:`_Probe` at each of them in the model of the composite's context."""

    def __init__(self, model: torch.nn.Module, positions: list | None = None):
        self.stacks = block_stacks(model)[::-1]  # output side first: the decoder's, then the encoder's
        #: ``id(block) -> its module path`` (a block of nested lists, Funnel's ``funnel.encoder.blocks.2.3``, is not
        #: ``{stack}.{index}``)
        self.paths = {id(module): name for name, module in model.named_modules()}
        #: the position encodings that are inputs of the explanation (PA-LRP): not watched as other embeddings
        self.positions = {module for _, module, _ in positions or []}
        self.word_embeddings = {model.get_input_embeddings()}
        if is_encoder_decoder(model):
            self.word_embeddings.add(decoder_word_embeddings(model))
        self.hidden = model.get_input_embeddings().embedding_dim
        self.probes: dict[str, _Probe] = {}
        #: boundary names, output first
        self.names = []
        for _, stack in self.stacks:
            self.names += [f'output of {self.paths[id(block)]}' for block in reversed(stack)]
            self.names.append(f'input of {self.paths[id(stack[0])]}')

    def observe(self, modified: torch.nn.Module, watched: list) -> list:
        """Hook the probes into ``modified`` (the ``observe`` of :py:func:`~zennit_attn.methods.lrp.attribute`); the
        tensors they watch are appended to ``watched``. Returns the hook handles."""
        handles = []
        for _, stack in self.stacks:
            handles += self._watch_stack(stack, watched)
        others = self.probes.setdefault('other embeddings', _Probe(watched))

        def watch_embedding(module, input, output):
            # position / segment embeddings: one vector per token; not e.g. T5's relative attention bias. The engine
            # freezes the parameters: the looked-up vectors are made a leaf, whose relevance is read
            if output.dim() == 3 and output.shape[-1] == self.hidden:
                leaf = output.detach().requires_grad_()
                others.watch(leaf)
                return leaf
            return None

        for module in modified.modules():
            if isinstance(module, torch.nn.Embedding) and module not in self.word_embeddings | self.positions:
                handles.append(module.register_forward_hook(watch_embedding))
        return handles

    def _watch_stack(self, stack: list, watched: list) -> list:
        """Probes at the output of every block of ``stack`` and at the input of its first block."""
        handles = []
        for block in stack:
            probe = self.probes.setdefault(f'output of {self.paths[id(block)]}', _Probe(watched))
            handles.append(block.register_forward_hook(lambda module, input, output, probe=probe: probe.watch(output)))
        first = self.probes.setdefault(f'input of {self.paths[id(stack[0])]}', _Probe(watched))
        handles.append(
            stack[0].register_forward_pre_hook(lambda module, args, probe=first: probe.watch(args[0] if args else None))
        )
        return handles
