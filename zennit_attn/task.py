"""What one explanation request is: the checked model and input, how the model is called on (perturbed) inputs, which
logit of each row is explained, and what comes back (:py:class:`Explanation`, :py:class:`ImageExplanation`).

Every attribution method of :py:mod:`zennit_attn.methods` works on a :py:class:`Task`, so that all methods explain
exactly the same logit. The modality decides only how inputs are embedded and read: :py:class:`TokenTask` explains
the word embeddings of a language model (relevance per token), :py:class:`ImageTask` the pixels of an image
classifier (relevance per pixel); :py:func:`make_task` picks one by the model.
"""
from __future__ import annotations

import inspect
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Sequence

import torch

from .composites import AttnLRPEpsilon, AttnLRPGamma, CPLRPEpsilon, CPLRPGamma, refuse_compiled
from .layers import output_scores
from .render import views
from .render.image import save_image_explanation
from .render.layout import ScaleLike

__all__ = [
    'TargetLike', 'Explanation', 'ImageExplanation', 'Task', 'TokenTask', 'ImageTask', 'make_task', 'is_causal',
    'is_image_model', 'output_scores', 'check_model', 'split_encoding',
]

#: An output index, one per row, or several ``(position, token)`` pairs explained together.
TargetLike = int | Sequence[int] | Sequence[tuple[int, int]] | torch.Tensor | None


@dataclass
class Explanation:
    """What :py:func:`~zennit_attn.explain` returns for a language model.

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
    method: str
        The attribution method's name.
    tokenizer: object or None
        The tokenizer given to :py:func:`~zennit_attn.explain` (None if none was), used by :py:meth:`tokens`,
        :py:meth:`show`, :py:meth:`to_html` and :py:meth:`save` when they are not given one; not compared and not
        shown in ``repr``.
    latent: zennit_attn.latent.Latent or None
        Latent relevance recorded with ``explain(..., latent=...)`` (``explanation.latent['mlp']`` etc., see
        :py:mod:`zennit_attn.latent`); None otherwise. Not compared and not shown in ``repr``.

    Notes
    -----
    When several ``(position, token)`` pairs are explained at once, ``target``, ``position`` and ``logit`` are
    ``[batch, pairs]`` and the relevance is that of their sum.

    The heatmap methods show tokens as the tokenizer writes them (:py:func:`zennit_attn.render.tokens.token_texts`),
    optionally merged into words (``words=True``, relevance summed), padding left out, encoder and decoder tokens
    for encoder-decoder models; colours come from one diverging map centred at 0
    (:py:func:`zennit_attn.render.colors.relevance_to_rgb`). ``scale`` is None (each heatmap its own largest absolute
    relevance), ``'shared'`` (one scale for all rows drawn together) or a number, e.g.
    :py:func:`zennit_attn.render.shared_scale` of several explanations.
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
    method: str = 'attnlrp'
    tokenizer: object = field(default=None, repr=False, compare=False)
    latent: object = field(default=None, repr=False, compare=False)

    def tokens(self, tokenizer=None, row: int = 0, words: bool = False) -> list[str]:
        """The tokens of ``row`` as the tokenizer writes them (``'Ġ'``, ``'▁'`` and byte fallbacks decoded), padding
        removed; for encoder-decoder models the encoder tokens, then the decoder tokens.

        Parameters
        ----------
        tokenizer: optional
            Default: the one given to :py:func:`~zennit_attn.explain`.
        row: int
            The batch row (negative counts from the end).
        words: bool
            Merge tokens into words.

        Returns
        -------
        list of str
        """
        return views.explanation_tokens(self, tokenizer, row, words)

    def top(self, k: int, tokenizer=None, row: int = 0) -> list[tuple[int, float, str | None]]:
        """The ``k`` most relevant positions of ``row`` as ``(position, relevance, token)``; padding excluded. The
        token is decoded with ``tokenizer`` (default: the stored one), None without either."""
        tokenizer = tokenizer if tokenizer is not None else self.tokenizer
        relevance = self.relevance[row].float()
        if self.attention_mask is not None:
            relevance = relevance.masked_fill(self.attention_mask[row] == 0, float('-inf'))
        count = relevance.shape[0] if self.attention_mask is None else int((self.attention_mask[row] != 0).sum())
        values, indices = relevance.topk(min(k, count))
        return [
            (int(index), float(value), None if tokenizer is None else tokenizer.decode([int(self.input_ids[row, index])]))
            for value, index in zip(values, indices)
        ]

    def heatmaps(self, rows=None, words: bool = False, tokenizer=None) -> list:
        """The :py:class:`~zennit_attn.render.layout.Heatmap` of each of ``rows`` (default all), what every format
        draws (scales not yet resolved)."""
        return views.explanation_heatmaps(self, rows, words, tokenizer)

    def show(self, row: int = 0, words: bool = False, scale: ScaleLike = None, color: bool | None = None,
             tokenizer=None, stream: IO | None = None) -> None:
        """Print the heatmap of ``row``: coloured token boxes on a terminal (24-bit colour unless ``NO_COLOR`` is
        set), ``token[relevance]`` otherwise.

        Parameters
        ----------
        row: int
        words: bool
            Merge tokens into words (relevance summed).
        scale: None, 'shared' or float
            Relevance of full colour; default the row's largest absolute relevance.
        color: bool, optional
            Force colour on (True) or off (False).
        tokenizer: optional
            Default: the stored one.
        stream: file-like, optional
            Default ``sys.stdout``.
        """
        views.show_heatmaps(self.heatmaps([row], words, tokenizer), scale, color, stream)

    def to_html(self, rows=None, words: bool = False, scale: ScaleLike = None, tokenizer=None) -> str:
        """A standalone HTML page (inline style, no scripts) with one heatmap per row (default all rows).

        Parameters
        ----------
        rows: int, sequence of int or None
        words: bool
        scale: None, 'shared' or float
            ``'shared'`` gives all rows one colour scale.
        tokenizer: optional

        Returns
        -------
        str
        """
        return views.heatmaps_html(self.heatmaps(rows, words, tokenizer), scale,
                                   title=f'Token relevance ({self.method})')

    def _repr_html_(self) -> str | None:
        """Jupyter's rich display: the heatmaps of all rows as an HTML fragment (needs the stored tokenizer)."""
        if self.tokenizer is None:
            return None  # Jupyter falls back to the repr
        return views.heatmaps_html(self.heatmaps(), standalone=False)

    def save(self, path: str | os.PathLike, row: int | None = 0, words: bool = False, scale: ScaleLike = None,
             tokenizer=None, **options) -> Path:
        """Write the heatmap of ``row`` (None: all rows) in the format of the suffix of ``path``.

        ``.html`` (standalone page), ``.png``, ``.svg``, ``.pdf`` (matplotlib figures; options ``width`` in inches,
        ``font_size``, ``dpi``, ``colorbar``), ``.tex`` (a LaTeX snippet of colour boxes for ``\\input``, needing
        ``\\usepackage{xcolor}``; ``document=True`` writes a complete document instead). Missing folders are made.

        Parameters
        ----------
        path: str or os.PathLike
        row: int or None
        words: bool
        scale: None, 'shared' or float
        tokenizer: optional
        **options
            Options of the format (above).

        Returns
        -------
        pathlib.Path

        Raises
        ------
        ValueError
            For a suffix other than the five.
        OSError
            Where ``path`` cannot be written.
        """
        views.check_output(path)
        return views.save_heatmaps(self.heatmaps(None if row is None else [row], words, tokenizer), path, scale,
                                   title=f'Token relevance ({self.method})', **options)


@dataclass
class ImageExplanation:
    """What :py:func:`~zennit_attn.explain` returns for an image classifier.

    Attributes
    ----------
    relevance: torch.Tensor
        ``[batch, height, width]`` relevance per pixel (summed over channels).
    pixel_relevance: torch.Tensor
        ``[batch, channels, height, width]`` relevance per pixel and channel.
    target: torch.Tensor
        ``[batch]`` the explained class.
    logit: torch.Tensor
        ``[batch]`` the explained logit; for LRP the initial relevance.
    pixels: torch.Tensor
        ``[batch, channels, height, width]`` the explained input.
    method: str
        The attribution method's name.
    latent: zennit_attn.latent.Latent or None
        Latent relevance recorded with ``explain(..., latent=...)``; None otherwise.
    """
    relevance: torch.Tensor
    pixel_relevance: torch.Tensor
    target: torch.Tensor
    logit: torch.Tensor
    pixels: torch.Tensor
    method: str = 'attnlrp'
    latent: object = field(default=None, repr=False, compare=False)

    def save(self, path: str | os.PathLike, row: int = 0, **options) -> tuple[Path, Path]:
        """Write the heatmap of ``row`` to ``path`` (a ``.png``) and its overlay on the image to
        ``<stem>_overlay.png`` beside it (:py:func:`zennit_attn.render.image.save_image_explanation`).

        Parameters
        ----------
        path: str or os.PathLike
            A ``.png`` file name.
        row: int
        **options
            ``cmap``, ``level``, ``scale`` (integer upscaling), ``vmax`` (relevance of full colour), and for the
            overlay ``alpha``, ``mean``, ``std``.

        Returns
        -------
        tuple of pathlib.Path
            ``(heatmap, overlay)``.
        """
        return save_image_explanation(self, path, views.check_row(row, self.relevance.shape[0]), **options)


# --------------------------------------------------------------------------------------------------- model checks
def is_causal(model: torch.nn.Module) -> bool:
    """Whether ``model`` has causal (decoder) self-attention: each position sees only the positions before it."""
    return any(getattr(module, 'is_causal', False) is True for module in model.modules())


def is_image_model(model: torch.nn.Module) -> bool:
    """Whether ``model`` takes pixels (Hugging Face ``main_input_name == 'pixel_values'``, or no word embedding
    table: timm models) rather than token ids."""
    main_input = getattr(model, 'main_input_name', None)
    if main_input is not None:
        return main_input == 'pixel_values'
    getter = getattr(model, 'get_input_embeddings', None)
    return not (callable(getter) and isinstance(getter(), torch.nn.Embedding))


def check_model(model: torch.nn.Module) -> None:
    """Refuse what would give a wrong or no explanation: a model that is not a module, a compiled model (its hooks
    are bypassed), any submodule in training mode (active dropout), parameters on the ``meta`` device, or
    :py:func:`torch.inference_mode` (no gradients can be recorded)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f'model must be a torch.nn.Module, got {type(model).__name__}')
    if torch.is_inference_mode_enabled():
        raise RuntimeError('explain() computes gradients, which torch.inference_mode() forbids: call it outside '
                           'the inference_mode block (torch.no_grad() around it is fine)')
    refuse_compiled(model)
    training = next((name for name, module in model.named_modules() if module.training), None)
    if training is not None:
        where = 'the model' if training == '' else f'submodule {training!r}'
        raise ValueError(f'{where} of {type(model).__name__} is in training mode (dropout would make every call '
                         'differ): call model.eval() before explaining')
    offloaded = _offloaded_modules(model)
    meta = next((name for name, tensor in [*model.named_parameters(), *model.named_buffers()]
                 if tensor.is_meta and name.rpartition('.')[0] not in offloaded), None)
    if meta is not None:
        raise ValueError(f'{type(model).__name__} has tensors on the meta device (e.g. {meta!r}): load its weights '
                         '(from_pretrained without device="meta", or model.to_empty() plus loading a state dict)')


def _offloaded_modules(model: torch.nn.Module) -> set[str]:
    """Names of the modules whose weights ``accelerate`` offloads (CPU or disk offload of a ``device_map``): an
    offloading hook (``_hf_hook`` with ``offload=True``, also inside a ``SequentialHook``) on the module or an
    ancestor loads them for each forward, so they are on the meta device in between."""
    def offloads(hook) -> bool:
        return bool(getattr(hook, 'offload', False)) or any(offloads(inner) for inner in getattr(hook, 'hooks', ()))

    names, covered = set(), []
    for name, module in model.named_modules():
        if offloads(getattr(module, '_hf_hook', None)):
            covered.append(name)
        if any(name == prefix or name.startswith(prefix + '.') or prefix == '' for prefix in covered):
            names.add(name)
    return names


def _integer(value, name: str) -> int:
    """``value`` as an int if it is an integer (Python, numpy or a 0-d integer tensor), else a ValueError."""
    if isinstance(value, torch.Tensor) and value.dim() == 0 and not value.is_floating_point():
        return int(value)
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    raise ValueError(f'{name} must be an integer, got {value!r} ({type(value).__name__})')


def _integers(value, name: str) -> torch.Tensor | None:
    """``value`` (int, sequence or tensor of integers, None) as a long tensor; floats are refused, not truncated."""
    if value is None:
        return None
    if isinstance(value, (numbers.Number, torch.Tensor)) and torch.as_tensor(value).dim() == 0:
        return torch.tensor(_integer(value, name))
    tensor = torch.as_tensor(value)
    if tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool:
        raise ValueError(f'{name} must hold integers, got {tensor.dtype} values {value!r}')
    return tensor.long()


def _pairs(target) -> torch.Tensor | None:
    """``[pairs, 2]`` (position, token) if ``target`` names several pairs, else None."""
    if target is None or isinstance(target, (numbers.Number, str)):
        return None
    if isinstance(target, torch.Tensor):
        return _integers(target, 'target') if target.dim() == 2 and target.shape[1] == 2 else None
    items = list(target)
    if items and all(isinstance(item, (tuple, list)) and len(item) == 2 for item in items):
        return _integers(items, 'target (position, token) pairs')
    return None


def _positions(scores: torch.Tensor, position, mask) -> torch.Tensor | None:
    if scores.dim() == 2:
        return None
    batch, seq = scores.shape[:2]
    if position is None or (isinstance(position, int) and position == -1 and mask is not None):
        if mask is None:
            return torch.full((batch,), seq - 1, device=scores.device)
        order = torch.arange(seq, device=scores.device)
        return ((mask != 0) * (order + 1)).argmax(-1)
    positions = _integers(position, 'position').to(scores.device)
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
    targets = _integers(target, 'target').to(selected.device)
    if selected.dim() == 2:
        targets = targets.flatten()
        if targets.numel() == 1:
            targets = targets.expand(batch)
        if targets.numel() != batch:
            raise ValueError(f'target needs one entry per row ({batch}), got {targets.numel()}')
    if bool(((targets < 0) | (targets >= size)).any()):
        raise ValueError(f'target {target} is out of range: the explained output has {size} entries')
    return targets


# ------------------------------------------------------------------------------------------------------------ tasks
class Task:
    """One explanation request: the model, its checked input (:py:attr:`inputs`, where relevance is read) and, once
    resolved, which output of each row is explained.

    Methods run the model on (perturbed, batched) inputs with :py:meth:`forward` and read the explained logit of every
    batch element with :py:meth:`select`. Subclasses define the modality: how the input is embedded, how the model
    is called, what a token is and how the result is packaged.
    """
    #: LRP composites by method name, for this modality
    composites: dict[str, type] = {}

    def __init__(self, model: torch.nn.Module, model_kwargs: dict | None = None):
        check_model(model)
        self.model = model
        self.model_kwargs = dict(model_kwargs or {})
        self.positions: torch.Tensor | None = None
        self.targets: torch.Tensor | None = None
        #: sorted positions whose logits the model computes (``logits_to_keep``), None for all
        self.kept: torch.Tensor | None = None
        #: ``[batch, ...]`` detached input at which relevance is read
        self.inputs: torch.Tensor

    @property
    def batch(self) -> int:
        return self.inputs.shape[0]

    @property
    def output_mask(self) -> torch.Tensor | None:
        """Mask of the sequence whose outputs are explained."""
        return None

    # ------------------------------------------------------------------------------------------ running the model
    def base_kwargs(self) -> dict:
        """The model's keyword arguments besides the input."""
        return dict(self.model_kwargs)

    def call_kwargs(self, rows: torch.Tensor | None = None) -> dict:
        """:py:meth:`base_kwargs`, repeated for batch elements that are variants of input ``rows``."""
        kwargs = self.base_kwargs()
        if rows is not None:
            kwargs = {key: value[rows] if isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == self.batch
                      else value for key, value in kwargs.items()}
        return kwargs

    def run(self, inputs: torch.Tensor, rows: torch.Tensor | None = None, model: torch.nn.Module | None = None,
            **extra):
        """The raw output of ``model`` (default the task's model) on ``inputs``; ``rows[i]`` names the input row that
        batch element ``i`` is a variant of (default: identity)."""
        raise NotImplementedError

    def forward(self, inputs: torch.Tensor, rows: torch.Tensor | None = None, model: torch.nn.Module | None = None,
                **extra) -> torch.Tensor:
        """The scores (logits, or last hidden state) of :py:meth:`run`."""
        return output_scores(self.run(inputs, rows, model, **extra))

    def keep_logits(self, position=-1, target: TargetLike = None) -> dict:
        """Keyword arguments that restrict the model's output to the explained positions (none by default)."""
        return {}

    def lrp_leaves(self) -> tuple[list[torch.Tensor], dict]:
        """``(leaves, extra)``: the tensors to read relevance at (first the input) and the keyword arguments that
        pass the others to the model."""
        return [self.inputs.clone().requires_grad_(True)], {}

    # ------------------------------------------------------------------------------------------ the explained logit
    def _all_positions(self, scores: torch.Tensor) -> torch.Tensor:
        return scores

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
            return self.resolve(self.forward(self.inputs), position, target)

    # ------------------------------------------------------------------------------------------ tokens and features
    def tokens(self) -> int:
        """Number of tokens the model's attention runs over."""
        raise NotImplementedError

    def attributable_tokens(self) -> torch.Tensor:
        """``[batch, tokens]`` True for the tokens that token-level methods (AtMan) attribute."""
        raise NotImplementedError

    def token_relevance(self, relevance: torch.Tensor) -> torch.Tensor:
        """``[batch, tokens]`` relevance per token -> relevance in the shape :py:meth:`finish` takes."""
        raise NotImplementedError

    def attention_row(self, matrices: torch.Tensor) -> torch.Tensor:
        """``[batch, ..., tokens, tokens]`` -> ``[batch, ..., tokens]``: the row(s) of the token(s) whose output is
        explained (rollout and Grad-CAM read it)."""
        raise NotImplementedError

    def feature_mask(self) -> torch.Tensor:
        """``[1, *inputs.shape[1:]]`` the index of the feature each input entry belongs to (KernelSHAP's
        coalitions: one feature per token, or per image patch)."""
        raise NotImplementedError

    def feature_relevance(self, relevance: torch.Tensor) -> torch.Tensor:
        """``[batch, features]`` relevance per feature of :py:meth:`feature_mask` -> the shape :py:meth:`finish`
        takes."""
        raise NotImplementedError

    # ------------------------------------------------------------------------------------------ the result
    def finish(self, relevance: torch.Tensor, logit: torch.Tensor, method: str,
               decoder_relevance: torch.Tensor | None = None):
        """Check that the result is finite and package it as the modality's explanation."""
        tensors = [logit, relevance] + ([] if decoder_relevance is None else [decoder_relevance])
        if not all(bool(torch.isfinite(tensor).all()) for tensor in tensors):
            raise FloatingPointError(
                f'{method} on {type(self.model).__name__} produced a non-finite explained logit or relevance (logit '
                f'{logit.detach().flatten()[:8].tolist()}): {self.non_finite_hint()}'
            )
        return self.package(relevance.detach(), logit.detach(), method,
                            None if decoder_relevance is None else decoder_relevance.detach())

    def non_finite_hint(self) -> str:
        """The likely cause of a non-finite result."""
        bad = next((name for name, tensor in self.model.named_parameters() if not bool(torch.isfinite(tensor).all())),
                   None)
        if bad is not None:
            return f'the model parameter {bad!r} has NaN or infinite entries'
        dtype = self.inputs.dtype
        if torch.finfo(dtype).bits < 32:
            return f'{dtype} overflowed inside the model: explain in float32 or bfloat16'
        return 'the model itself returns a non-finite output for this input'

    def package(self, relevance, logit, method, decoder_relevance):
        raise NotImplementedError


def _check_ids(input_ids, attention_mask, name: str = 'input_ids'):
    if isinstance(input_ids, str) or (isinstance(input_ids, (list, tuple)) and input_ids
                                      and isinstance(input_ids[0], str)):
        raise TypeError(f'{name} must be token ids, got text: pass the tokenizer, explain(model, text, '
                        "tokenizer=tokenizer), or tokenize it first, explain(model, tokenizer(text, "
                        "return_tensors='pt'))")
    input_ids = torch.as_tensor(input_ids)
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2 or input_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f'{name} must be an integer tensor [batch, seq], got {input_ids.dtype} '
                         f'{tuple(input_ids.shape)}')
    if input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise ValueError(f'Nothing to explain: {name} has shape {tuple(input_ids.shape)}')
    if attention_mask is not None:
        attention_mask = torch.as_tensor(attention_mask, device=input_ids.device)
        if attention_mask.dim() == 1:
            attention_mask = attention_mask[None]
        if attention_mask.shape != input_ids.shape:
            raise ValueError(f'attention mask {tuple(attention_mask.shape)} does not match {name} '
                             f'{tuple(input_ids.shape)}')
        if not bool((attention_mask != 0).any(1).all()):
            raise ValueError('A row of attention_mask masks every token: nothing to explain in it')
    return input_ids, attention_mask


def _check_vocabulary(input_ids: torch.Tensor, embedding: torch.nn.Module, name: str) -> None:
    size = getattr(embedding, 'num_embeddings', None)
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or (size is not None and high >= size):
        raise ValueError(f'{name} holds ids from {low} to {high}, but the vocabulary of {type(embedding).__name__} '
                         f'has {size} entries (0 to {size - 1}): was it tokenized for another model?')


def _check_length(model: torch.nn.Module, length: int, name: str) -> None:
    config = getattr(model, 'config', None)
    config = getattr(config, 'text_config', None) or config
    limit = getattr(config, 'max_position_embeddings', None) or getattr(config, 'n_positions', None)
    if isinstance(limit, int) and length > limit:
        raise ValueError(f'{name} has {length} positions, more than the {limit} {type(model).__name__} was built for '
                         '(config.max_position_embeddings): shorten the input, e.g. keep its last '
                         f'{limit} tokens')


def split_encoding(input_ids, attention_mask=None, model_kwargs: dict | None = None) -> tuple[object, object, dict]:
    """``(input_ids, attention_mask, model_kwargs)`` from what a tokenizer returns (a ``BatchEncoding`` or a dict with
    ``input_ids``): its ``attention_mask`` unless one is given (a different one is refused) and its other fields
    (``token_type_ids``, ...) as model arguments. Other inputs are returned as they are."""
    model_kwargs = dict(model_kwargs or {})
    if not isinstance(input_ids, Mapping):
        return input_ids, attention_mask, model_kwargs
    encoding = dict(input_ids)
    if 'input_ids' not in encoding:
        raise ValueError(f'the input mapping has no input_ids (keys: {sorted(encoding)})')
    input_ids = encoding.pop('input_ids')
    mask = encoding.pop('attention_mask', None)
    if attention_mask is not None and mask is not None and not torch.equal(
            torch.as_tensor(attention_mask), torch.as_tensor(mask)):
        raise ValueError('attention_mask was given twice (argument and input mapping) with different values')
    for key, value in encoding.items():
        model_kwargs.setdefault(key, value)
    return input_ids, mask if attention_mask is None else attention_mask, model_kwargs


class TokenTask(Task):
    """A language model explained at its word embeddings (relevance per token).

    For encoder-decoder models the inputs are the encoder's embeddings; the decoder's
    (:py:attr:`decoder_embeddings`) are passed along unchanged and are an extra leaf for LRP.

    Parameters
    ----------
    model, input_ids, attention_mask, model_kwargs, decoder_input_ids
        As for :py:func:`~zennit_attn.explain`; ``input_ids`` may also be the tokenizer's ``BatchEncoding`` (or a
        dict with ``input_ids``), whose ``attention_mask`` and other fields are used.
    """
    composites = {'attnlrp': AttnLRPEpsilon, 'cplrp': CPLRPEpsilon}

    def __init__(self, model: torch.nn.Module, input_ids, attention_mask=None, model_kwargs: dict | None = None,
                 decoder_input_ids=None):
        input_ids, attention_mask, model_kwargs = split_encoding(input_ids, attention_mask, model_kwargs)
        super().__init__(model, model_kwargs)
        self.input_ids, self.attention_mask = _check_ids(input_ids, attention_mask)
        embedding_module = model.get_input_embeddings() if hasattr(model, 'get_input_embeddings') else None
        if not isinstance(embedding_module, torch.nn.Module):
            raise TypeError(f'{type(model).__name__} has no input embeddings (get_input_embeddings() is None)')
        _check_vocabulary(self.input_ids, embedding_module, 'input_ids')
        with torch.no_grad():
            #: ``[batch, seq, hidden]`` word embeddings of the input (detached)
            self.inputs = embedding_module(self.input_ids).detach()
        self.decoder_input_ids = self.decoder_embeddings = None
        self._output_mask = self.attention_mask
        if getattr(getattr(model, 'config', None), 'is_encoder_decoder', False):
            if decoder_input_ids is None:
                start = model.config.decoder_start_token_id
                decoder_input_ids = torch.full((self.batch, 1), start, device=self.input_ids.device)
            decoder_mask = self.model_kwargs.get('decoder_attention_mask')
            self.decoder_input_ids, self._output_mask = _check_ids(decoder_input_ids, decoder_mask, 'decoder_input_ids')
            if self.decoder_input_ids.shape[0] != self.batch:
                raise ValueError('decoder_input_ids must have as many rows as input_ids')
            decoder_embedding = model.get_decoder().get_input_embeddings() or embedding_module
            _check_vocabulary(self.decoder_input_ids, decoder_embedding, 'decoder_input_ids')
            with torch.no_grad():
                self.decoder_embeddings = decoder_embedding(self.decoder_input_ids).detach()
        elif decoder_input_ids is not None:
            raise ValueError(f'{type(model).__name__} is not an encoder-decoder model: decoder_input_ids is not used')
        _check_length(model, self.input_ids.shape[1], 'input_ids')
        self._set_model_kwargs()

    @property
    def embeddings(self) -> torch.Tensor:
        """``[batch, seq, hidden]`` the word embeddings of the input (the task's inputs)."""
        return self.inputs

    @property
    def output_mask(self) -> torch.Tensor | None:
        return self._output_mask

    def _set_model_kwargs(self) -> None:
        parameters = inspect.signature(self.model.forward).parameters
        kwargs = self.model_kwargs
        if 'use_cache' in parameters:
            kwargs.setdefault('use_cache', False)
        mask = self.attention_mask
        if mask is None:
            return
        kwargs['attention_mask'] = mask
        left_padded = bool((mask[:, 0] == 0).any())
        if left_padded and 'position_ids' not in kwargs and 'position_ids' in parameters:
            if not is_causal(self.model):
                raise ValueError(
                    f'{type(self.model).__name__} is not causal and would give left-padded rows shifted positions: '
                    'pad on the right, or pass position_ids'
                )
            kwargs['position_ids'] = (mask.long().cumsum(-1) - 1).clamp(min=0)

    def base_kwargs(self) -> dict:
        kwargs = dict(self.model_kwargs)
        if self.decoder_embeddings is not None:
            kwargs['decoder_inputs_embeds'] = self.decoder_embeddings
        return kwargs

    def run(self, inputs, rows=None, model=None, **extra):
        kwargs = self.call_kwargs(rows)
        kwargs.update(extra)
        return (self.model if model is None else model)(inputs_embeds=inputs, **kwargs)

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

    def lrp_leaves(self) -> tuple[list[torch.Tensor], dict]:
        leaves, extra = super().lrp_leaves()
        if self.decoder_embeddings is not None:
            leaves.append(self.decoder_embeddings.clone().requires_grad_(True))
            extra['decoder_inputs_embeds'] = leaves[1]
        return leaves, extra

    def tokens(self) -> int:
        return self.input_ids.shape[1]

    def attributable_tokens(self) -> torch.Tensor:
        valid = torch.ones(self.input_ids.shape, dtype=torch.bool, device=self.inputs.device)
        if self.attention_mask is not None:
            valid &= self.attention_mask.to(valid.device) != 0
        if self.positions is not None and self.decoder_embeddings is None and is_causal(self.model):
            last = self.positions if self.positions.dim() == 1 else self.positions.amax(1)
            valid &= torch.arange(self.tokens(), device=valid.device) <= last.to(valid.device)[:, None]
        return valid

    def token_relevance(self, relevance: torch.Tensor) -> torch.Tensor:
        return relevance

    def query_positions(self) -> torch.Tensor:
        """The query position whose attention row is read: the explained position (for several pairs, the last);
        for 2-D outputs (classification heads) the last non-padding token of causal models and the first token of
        encoders."""
        device = self.inputs.device
        if self.positions is not None:
            return self.positions if self.positions.dim() == 1 else self.positions.amax(1)
        if not is_causal(self.model):
            return torch.zeros(self.batch, dtype=torch.long, device=device)
        return _positions(torch.empty(self.batch, self.tokens(), 0, device=device), None, self.attention_mask)

    def attention_row(self, matrices: torch.Tensor) -> torch.Tensor:
        positions = self.query_positions().to(matrices.device)
        index = torch.arange(matrices.shape[0], device=matrices.device)
        return matrices.movedim(-2, 1)[index, positions]

    def feature_mask(self) -> torch.Tensor:
        seq, hidden = self.inputs.shape[1:]
        return torch.arange(seq, device=self.inputs.device)[None, :, None].expand(1, seq, hidden)

    def feature_relevance(self, relevance: torch.Tensor) -> torch.Tensor:
        return relevance

    def package(self, relevance, logit, method, decoder_relevance) -> Explanation:
        """Zero padding positions and package ``[batch, seq, hidden]`` (or ``[batch, seq]``) relevance."""
        def per_token(relevance, mask):
            if relevance is None:
                return None, None
            if torch.finfo(relevance.dtype).bits < 32:
                relevance = relevance.float()
            if mask is not None:
                mask = (mask != 0).to(relevance.device, relevance.dtype)
                relevance = relevance * (mask[..., None] if relevance.dim() == 3 else mask)
            return (relevance.sum(-1), relevance) if relevance.dim() == 3 else (relevance, None)

        tokens, embedding = per_token(relevance, self.attention_mask)
        decoder_mask = self._output_mask if self.decoder_embeddings is not None else None
        decoder, decoder_embedding = per_token(decoder_relevance, decoder_mask)
        return Explanation(
            relevance=tokens, embedding_relevance=embedding, target=self.targets, logit=logit,
            position=self.positions, input_ids=self.input_ids, attention_mask=self.attention_mask,
            decoder_relevance=decoder, decoder_embedding_relevance=decoder_embedding,
            decoder_input_ids=self.decoder_input_ids, method=method,
        )

    def non_finite_hint(self) -> str:
        hint = super().non_finite_hint()
        implementation = getattr(getattr(self.model, 'config', None), '_attn_implementation', None)
        if (hint.startswith('the model itself') and self.inputs.dtype == torch.float64
                and implementation == 'eager' and self.attention_mask is not None
                and bool((self.attention_mask == 0).any())):
            return ('with padding, float64 eager attention in transformers returns NaN logits (a fully masked row): '
                    'use float32 or attn_implementation="sdpa"')
        return hint


class ImageTask(Task):
    """An image classifier explained at its pixels (relevance per pixel and channel).

    Parameters
    ----------
    model: torch.nn.Module
        A timm ``VisionTransformer``/DeiT or a Hugging Face ``ViTForImageClassification`` (any image classifier for
        the gradient methods) in eval mode.
    pixels: torch.Tensor
        ``[batch, channels, height, width]`` (or ``[channels, height, width]``) floating-point input as the model
        takes it (normalised).
    model_kwargs: dict, optional
        Further keyword arguments of the model's forward (e.g. ``interpolate_pos_encoding``).
    """
    composites = {'attnlrp': AttnLRPGamma, 'cplrp': CPLRPGamma}

    def __init__(self, model: torch.nn.Module, pixels, model_kwargs: dict | None = None):
        super().__init__(model, model_kwargs)
        if isinstance(pixels, (str, Mapping)):
            raise TypeError(f'{type(model).__name__} takes pixels: pass a float tensor [batch, channels, height, '
                            f'width], got {type(pixels).__name__}')
        pixels = torch.as_tensor(pixels)
        if pixels.dim() == 3:
            pixels = pixels[None]
        if pixels.dim() != 4:
            raise ValueError(f'pixels must be [batch, channels, height, width] (or [channels, height, width]), got '
                             f'shape {tuple(pixels.shape)}')
        if not pixels.is_floating_point():
            raise ValueError(f'pixels must be floating point as the model takes them, got {pixels.dtype}: convert '
                             'and normalise the image first (e.g. the model\'s own transform, or x.float() / 255)')
        if not bool(torch.isfinite(pixels).all()):
            bad = (~torch.isfinite(pixels)).flatten(1).any(1).nonzero()[:, 0].tolist()
            raise ValueError(f'pixels of row(s) {bad} are NaN or infinite: a faulty image or normalisation')
        self.inputs = pixels.detach()

    @property
    def pixels(self) -> torch.Tensor:
        return self.inputs

    def run(self, inputs, rows=None, model=None, **extra):
        kwargs = self.call_kwargs(rows)
        kwargs.update(extra)
        return (self.model if model is None else model)(inputs, **kwargs)

    def prefix_tokens(self) -> int:
        """Number of tokens before the patch tokens (class, distillation, register tokens)."""
        if hasattr(self.model, 'num_prefix_tokens'):
            return int(self.model.num_prefix_tokens)
        return 1  # Hugging Face ViT: the class token

    def grid(self) -> tuple[int, int]:
        """``(rows, columns)`` of the patch grid."""
        height, width = self.inputs.shape[2:]
        size = getattr(getattr(self.model, 'config', None), 'patch_size', None)
        if size is None:
            size = getattr(getattr(self.model, 'patch_embed', None), 'patch_size', None)
        if size is None:
            raise TypeError(f'cannot tell the patch size of {type(self.model).__name__}')
        size = (size, size) if isinstance(size, int) else tuple(size)
        return height // size[0], width // size[1]

    def tokens(self) -> int:
        rows, columns = self.grid()
        return self.prefix_tokens() + rows * columns

    def attributable_tokens(self) -> torch.Tensor:
        valid = torch.ones(self.batch, self.tokens(), dtype=torch.bool, device=self.inputs.device)
        valid[:, :self.prefix_tokens()] = False  # the class token and its kind have no pixels
        return valid

    def token_relevance(self, relevance: torch.Tensor) -> torch.Tensor:
        """``[batch, tokens]`` -> ``[batch, channels, height, width]``: each patch token's value spread evenly over
        the pixels and channels of its patch (the prefix tokens dropped)."""
        batch, channels, height, width = self.inputs.shape
        rows, columns = self.grid()
        patches = relevance[:, self.prefix_tokens():]
        if patches.shape[1] != rows * columns:
            raise ValueError(f'{patches.shape[1]} patch tokens do not form the {rows} x {columns} grid')
        grid = patches.reshape(batch, 1, rows, columns).to(self.inputs.dtype)
        spread = torch.nn.functional.interpolate(grid, size=(height, width), mode='nearest')
        return spread.expand(batch, channels, height, width) / (channels * (height // rows) * (width // columns))

    def attention_row(self, matrices: torch.Tensor) -> torch.Tensor:
        """The mean row of the pooled tokens: the prefix tokens (class token; DeiT's class and distillation tokens)
        for token pooling, else the patch tokens (average pooling)."""
        prefix = self.prefix_tokens()
        if prefix > 0 and getattr(self.model, 'global_pool', 'token') == 'token':
            return matrices[..., :prefix, :].mean(-2)
        return matrices[..., prefix:, :].mean(-2)

    def feature_mask(self) -> torch.Tensor:
        rows, columns = self.grid()
        _, channels, height, width = self.inputs.shape
        index = torch.arange(rows * columns, device=self.inputs.device).reshape(1, 1, rows, columns).float()
        index = torch.nn.functional.interpolate(index, size=(height, width), mode='nearest').long()
        return index.expand(1, channels, height, width)

    def feature_relevance(self, relevance: torch.Tensor) -> torch.Tensor:
        prefix = relevance.new_zeros(relevance.shape[0], self.prefix_tokens())
        return self.token_relevance(torch.cat([prefix, relevance], 1))

    def package(self, relevance, logit, method, decoder_relevance) -> ImageExplanation:
        if torch.finfo(relevance.dtype).bits < 32:
            relevance = relevance.float()
        return ImageExplanation(relevance=relevance.sum(1), pixel_relevance=relevance, target=self.targets,
                                logit=logit, pixels=self.inputs, method=method)


def make_task(model: torch.nn.Module, inputs, position=-1, attention_mask=None, model_kwargs: dict | None = None,
              decoder_input_ids=None) -> Task:
    """The :py:class:`TokenTask` or :py:class:`ImageTask` for ``model``; arguments an image model cannot use are
    refused."""
    if isinstance(model, torch.nn.Module) and is_image_model(model):
        unused = [name for name, used in (
            ('position', not (position is None or (isinstance(position, int) and position == -1))),
            ('attention_mask', attention_mask is not None), ('decoder_input_ids', decoder_input_ids is not None))
            if used]
        if unused:
            raise ValueError(f'{type(model).__name__} classifies images: {", ".join(unused)} do not apply to it')
        return ImageTask(model, inputs, model_kwargs)
    return TokenTask(model, inputs, attention_mask, model_kwargs, decoder_input_ids)

