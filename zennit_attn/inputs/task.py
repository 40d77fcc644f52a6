"""What one explanation request is: the checked model and input, how the model is called on (perturbed) inputs, what
its run is read as (:py:class:`Readout`) and which value of each row is explained.

Every attribution method of :py:mod:`zennit_attn.methods.registry` works on a :py:class:`Task`, so that all methods
explain exactly the same value. The modality decides only how inputs are embedded and read: :py:class:`TokenTask`
explains the word embeddings of a language model (relevance per token), :py:class:`ImageTask` the pixels of an image
classifier (relevance per pixel); :py:func:`make_task` picks one by the model. The input checks are those of
:py:mod:`zennit_attn.inputs.checks` (what they find out about the model is kept between calls while the model stays the
same: :py:class:`~zennit_attn.inputs.checks.ModelFacts`); the results are the classes of
:py:mod:`zennit_attn.results.explanation`.

What a run of the model is read as is the task's :py:class:`Readout`: by default the model's output scores (logits,
or the last hidden state of a base model); :py:mod:`zennit_attn.latent.targets` gives a task a readout of a tensor
inside the model instead (a neuron's activation, a linear target), with :py:meth:`Task.with_readout`.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Mapping

import torch
from transformers import PreTrainedModel

from ..core.devices import input_device, to_device
from ..core.errors import UnsupportedModelError
from ..core.modules import (
    decoder_word_embeddings,
    forward_parameters,
    is_encoder_decoder,
    language_model_head,
    logits_to_keep,
    output_scores,
    path_of,
    within,
    without_cache,
    word_embeddings,
)
from ..core.quantization import cpu_packing_held
from ..results.explanation import Explanation, ImageExplanation, TargetLike
from .checks import (
    bitsandbytes_layers,
    check_embeddings_run,
    check_ids,
    check_input_kind,
    check_left_padding,
    check_length,
    check_model,
    check_output_rows,
    check_pad_ids,
    check_right_padding,
    check_vocabulary,
    check_word_embeddings,
    default_position,
    explained_positions,
    image_channels,
    is_causal,
    is_image_model,
    split_encoding,
    takes_video,
    target_indices,
    target_pairs,
)
from .choices import Choices
from .lookups import TokenLookups, id_tables, needs_ids
from .objectives import Contrast, Logit, Objective, OutputFunction, map_objective

__all__ = ['Readout', 'OutputField', 'Task', 'TokenTask', 'ImageTask', 'make_task']


class Readout:
    """What a task's :py:meth:`Task.forward` returns from a run of the model: here the model's output scores
    (:py:func:`zennit_attn.core.modules.output_scores`: logits, or the last hidden state of a base model).

    A subclass reads something else of the same run (:py:class:`zennit_attn.latent.targets.LatentTarget`: a
    neuron's activation or a linear target at a site inside the model); a task holds one readout
    (``Task.readout``, replaced with :py:meth:`Task.with_readout`).
    """

    #: Whether the scores are the model's output, so that the model may compute them at the explained positions
    #: only (:py:meth:`TokenTask.keep_logits`), and the objective converts the initial relevance of its value (a
    #: readout inside the model converts its scores itself).
    model_output: bool = True

    def read(
        self,
        task: Task,
        inputs: torch.Tensor,
        rows: torch.Tensor | None = None,
        model: torch.nn.Module | None = None,
        initial_relevance: bool = False,
        **extra,
    ) -> torch.Tensor:
        """The scores of one run of ``model`` (default the task's) on ``inputs`` (:py:meth:`Task.run`).

        ``initial_relevance``: the backward pass from these scores starts with the initial relevance (the explained
        value) instead of a gradient, as LRP's does (:py:func:`zennit_attn.methods.lrp.attribute`); the model's own
        output needs no conversion (the objective converts the value,
        :py:class:`~zennit_attn.inputs.objectives.RelevanceToGradient`, and the composite's
        :py:class:`~zennit_attn.rules.RelevanceBoundary` passes gradients at the outputs,
        :py:func:`~zennit_attn.rules.boundary.gradient_outputs`)."""
        return output_scores(task.run(inputs, rows, model, **extra))

    def capturing(self, task: Task) -> contextlib.AbstractContextManager:
        """A context for the time of one method's run on ``task`` (hooks the readout needs); none here."""
        return contextlib.nullcontext()


class OutputField(Readout):
    """The field ``name`` of the model's output instead of the one :py:func:`~zennit_attn.core.modules.output_scores`
    picks: ``start_logits`` or ``end_logits`` of a question-answering head (two scores per position, explained as a
    classifier's: the target is the position), ``pooler_output``, ``logits_per_image``.

    Parameters
    ----------
    name: str
        The field (a key of a Hugging Face model output, or an attribute of the output).
    """

    def __init__(self, name: str):
        if not isinstance(name, str) or not name:
            raise TypeError(f'output must name a field of the model output (a string), got {name!r}')
        self.name = name

    def read(self, task, inputs, rows=None, model=None, initial_relevance=False, **extra) -> torch.Tensor:
        """The field of one run of ``model`` (default the task's) on ``inputs``.

        Raises
        ------
        ValueError
            Where the output has no tensor of that name, naming the fields it has.
        """
        output = task.run(inputs, rows, model, **extra)
        value = output.get(self.name) if hasattr(output, 'get') else getattr(output, self.name, None)
        if not isinstance(value, torch.Tensor):
            fields = (
                [key for key, item in output.items() if isinstance(item, torch.Tensor)]
                if hasattr(output, 'items')
                else []
            )
            raise ValueError(
                f'the output of {type(task.model).__name__} ({type(output).__name__}) has no tensor {self.name!r}'
                + (f'; its tensors: {", ".join(fields)}' if fields else '')
            )
        return value


def _as_rows(scores: torch.Tensor) -> torch.Tensor:
    """``scores`` with one value per row (``[batch]``: a regression or reward head) as ``[batch, 1]``, the one score
    of each row; others as they are."""
    return scores[:, None] if scores.dim() == 1 else scores


#: Side in pixels of the squares an image is cut into where the model has no patches (:py:meth:`ImageTask.grid`): a
#: ViT-B/16's patch.
FALLBACK_PATCH = 16


# ------------------------------------------------------------------------------------------------------------ tasks
class Task:
    """One explanation request: the model, its checked input (:py:attr:`inputs`, where relevance is read) and, once
    resolved, which output of each row is explained.

    Methods run the model on (perturbed, batched) inputs with :py:meth:`forward` and read the explained logit of every
    batch element with :py:meth:`select`. Subclasses define the modality: how the input is embedded, how the model
    is called, what a token is and how the result is packaged.
    """

    def __init__(self, model: torch.nn.Module, model_kwargs: dict | None = None):
        #: the model's modules (``list(model.named_modules())``): the one walk over them of the call
        self.modules = list(model.named_modules())
        #: what is known about the model (:py:class:`~zennit_attn.inputs.checks.ModelFacts`: found once per model)
        self.facts = check_model(model, self.modules)
        self.model = model
        #: where the model computes (:py:func:`~zennit_attn.core.devices.input_device`): the inputs go there
        self.device = input_device(model)
        self.model_kwargs = to_device(dict(model_kwargs or {}), self.device)
        if isinstance(model, PreTrainedModel) and getattr(model.config, 'return_dict', True) is False:
            # the output's fields by name: a tuple's first element is read as the scores (a question-answering
            # head's start logits, where its output object is refused for holding two scores per position)
            self.model_kwargs.setdefault('return_dict', True)
        #: what :py:meth:`forward` reads of a run of the model
        self.readout: Readout = Readout()
        #: what :py:meth:`select` explains of the scores at the explained positions (resolved by :py:meth:`resolve`)
        self.objective: Objective = Logit()
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
            kwargs = {
                key: value[rows]
                if isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == self.batch
                else value
                for key, value in kwargs.items()
            }
        return kwargs

    def run(
        self, inputs: torch.Tensor, rows: torch.Tensor | None = None, model: torch.nn.Module | None = None, **extra
    ):
        """The raw output of ``model`` (default the task's model) on ``inputs``; ``rows[i]`` names the input row that
        batch element ``i`` is a variant of (default: identity)."""
        raise NotImplementedError

    def forward(
        self, inputs: torch.Tensor, rows: torch.Tensor | None = None, model: torch.nn.Module | None = None, **extra
    ) -> torch.Tensor:
        """The scores of :py:meth:`run` as the :py:attr:`readout` reads them (by default the logits, or the last
        hidden state); bitsandbytes' packing of 4-bit weights for CPU inference held off (the perturbed passes of the
        evaluations run without gradients, where it would round the model's scales and change it)."""
        with cpu_packing_held(bitsandbytes_layers(self.model, self.facts, self.modules)):
            return self.readout.read(self, inputs, rows, model, **extra)

    def lrp_forward(self, inputs: torch.Tensor, model: torch.nn.Module, **extra) -> torch.Tensor:
        """:py:meth:`forward` for a backward pass that starts with the initial relevance (LRP,
        :py:func:`zennit_attn.methods.lrp.attribute`) through ``model``, the model inside a composite's context."""
        return self.readout.read(self, inputs, None, model, initial_relevance=True, **extra)

    def capturing(self) -> contextlib.AbstractContextManager:
        """The context a method runs in (entered before any composite's): what the :py:attr:`readout` hooks."""
        return self.readout.capturing(self)

    def with_readout(self, readout: Readout) -> Task:
        """A copy of this task (same model, input and checks) whose :py:meth:`forward` reads ``readout``."""
        if not isinstance(readout, Readout):
            raise TypeError(f'readout must be a zennit_attn.inputs.task.Readout, got {type(readout).__name__}')
        task = copy.copy(self)
        task.readout = readout
        return task

    def with_objective(self, objective: Objective) -> Task:
        """A copy of this task whose :py:meth:`select` explains ``objective``
        (:py:mod:`zennit_attn.inputs.objectives`: a contrast, a function of the scores) instead of the target's
        logit."""
        if not isinstance(objective, Objective):
            raise TypeError(
                f'objective must be a zennit_attn.inputs.objectives.Objective, got {type(objective).__name__}'
            )
        task = copy.copy(self)
        task.objective = objective
        return task

    def keep_logits(self, position=-1, target: TargetLike = None) -> dict:
        """Keyword arguments that restrict the model's output to the explained positions (none by default)."""
        return {}

    def lrp_leaves(self) -> tuple[list[torch.Tensor], dict]:
        """``(leaves, extra)``: the tensors to read relevance at (first the input) and the keyword arguments that
        pass the others to the model."""
        return [self.inputs.clone().requires_grad_(True)], {}

    def lookup_leaves(self) -> list[torch.Tensor]:
        """Leaves the last :py:meth:`lrp_forward` made inside the model (:py:meth:`TokenTask.lookup_leaves`)."""
        return []

    # ------------------------------------------------------------------------------------------ the explained logit
    def _all_positions(self, scores: torch.Tensor) -> torch.Tensor:
        return scores

    def resolve(
        self, scores: torch.Tensor, position=-1, target: TargetLike = None, initial_relevance: bool = False
    ) -> torch.Tensor:
        """Fix the explained position and target of every row (and the :py:attr:`objective`) from the model's
        ``scores`` on the unperturbed input, and return the explained values (``[batch]``, or ``[batch, pairs]`` for
        several pairs); ``initial_relevance`` as for :py:meth:`select`."""
        check_output_rows(scores, self.batch, type(self.model).__name__)
        scores = _as_rows(scores)
        if scores.dim() > 3:  # a map per row (segmentation, reconstruction): a function of the whole map is explained
            return self._resolve_map(scores, position, initial_relevance)
        pairs = target_pairs(target)
        if pairs is not None:
            if scores.dim() != 3:
                raise ValueError('(position, token) pairs need an output per position; this model has one per row')
            position, target = pairs[:, 0].expand(self.batch, -1), pairs[:, 1].expand(self.batch, -1)
        self.positions = explained_positions(self._all_positions(scores), position, self.output_mask)
        selected = self._rows_of(scores, None)  # the scores at the explained positions (once: indexing costs)
        self.targets = target_indices(target, selected)
        self.objective = self.objective.resolve(selected, self.targets)
        return self._value(selected, None, reduce=False, initial_relevance=initial_relevance)

    def _resolve_map(self, scores: torch.Tensor, position, initial_relevance: bool) -> torch.Tensor:
        """:py:meth:`resolve` of an output explained as a whole (a map per row): the objective a function of it
        (:py:func:`~zennit_attn.inputs.objectives.map_objective`), no position, no class (targets -1)."""
        self.objective = map_objective(self.objective, scores.shape, position, type(self.model).__name__)
        self.positions, self.targets = None, torch.full((self.batch,), -1, device=scores.device)
        self.objective = self.objective.resolve(scores, self.targets)
        return self._value(scores, None, reduce=False, initial_relevance=initial_relevance)

    def select(
        self,
        scores: torch.Tensor,
        rows: torch.Tensor | None = None,
        reduce: bool = True,
        initial_relevance: bool = False,
    ) -> torch.Tensor:
        """The explained value (:py:attr:`objective`, by default the target's logit) of every batch element of
        ``scores`` (variants of input ``rows``), ``[batch]``; with several pairs their sum, or ``[batch, pairs]`` if
        not ``reduce``. ``initial_relevance``: LRP's backward pass starts at the value with the value itself (the
        initial relevance, :py:meth:`zennit_attn.inputs.objectives.Objective.value`)."""
        if self.targets is None:
            raise RuntimeError('Task.resolve() must be called before select()')
        return self._value(self._rows_of(scores, rows), rows, reduce, initial_relevance)

    def _value(
        self, selected: torch.Tensor, rows: torch.Tensor | None, reduce: bool, initial_relevance: bool
    ) -> torch.Tensor:
        """:py:meth:`select` of the scores at the explained positions, ``selected``."""
        targets = self.targets if rows is None else self.targets[rows]
        targets = targets.to(selected.device)
        # a readout inside the model converts its scores itself (:py:class:`~zennit_attn.latent.targets.LatentTarget`)
        values = self.objective.value(selected, targets, rows, initial_relevance and self.readout.model_output)
        return values.sum(1) if reduce and values.dim() == 2 else values

    def _rows_of(self, scores, rows):
        """The scores of each batch element (variants of input ``rows``) at its explained position(s)."""
        scores = _as_rows(scores)
        if self.positions is None:
            return scores
        positions = (self.positions if rows is None else self.positions[rows]).to(scores.device)
        if self.kept is not None:
            if positions.dim() == 1 and len(self.kept) == 1 and scores.shape[1] == 1:
                return scores[:, 0]  # one position kept (logits_to_keep): each row's, as indexing would give it
            positions = torch.searchsorted(self.kept.to(scores.device), positions)
        index = torch.arange(scores.shape[0], device=scores.device).view(-1, *([1] * (positions.dim() - 1)))
        return scores[index, positions]

    def resolve_plain(self, position=-1, target: TargetLike = None) -> torch.Tensor:
        """:py:meth:`resolve` from a plain forward pass without gradients (bitsandbytes' packing of 4-bit weights for
        CPU inference held off, also where a task's :py:meth:`forward` is its own: the gradient passes after it go
        through them)."""
        with torch.no_grad(), cpu_packing_held(bitsandbytes_layers(self.model, self.facts, self.modules)):
            return self.resolve(self.forward(self.inputs), position, target)

    # ------------------------------------------------------------------------------------------ tokens and features
    def token_count(self) -> int:
        """Number of tokens the model's attention runs over."""
        raise NotImplementedError

    def attributable_tokens(self) -> torch.Tensor:
        """``[batch, tokens]`` True for the tokens that token-level methods (AtMan) attribute."""
        raise NotImplementedError

    def check_token_layout(self, what: str) -> None:
        """Refuse ``what`` (a method that reads the model's own sequences: its attention maps, its keys, its
        positions) where the explained tokens are not laid out as the model's sequences; here they are."""

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

    def attributable_features(self) -> torch.Tensor | None:
        """``[batch, features]`` True for the features of :py:meth:`feature_mask` that can change the explained value
        (after :py:meth:`resolve`), None where every feature can."""
        return None

    # ------------------------------------------------------------------------------------------ the result
    def finish(
        self, relevance: torch.Tensor, logit: torch.Tensor, method: str, decoder_relevance: torch.Tensor | None = None
    ):
        """Check that the result is finite and package it as the modality's explanation."""
        tensors = [logit, relevance] + ([] if decoder_relevance is None else [decoder_relevance])
        if not all(bool(torch.isfinite(tensor).all()) for tensor in tensors):
            raise FloatingPointError(
                f'{method} on {type(self.model).__name__} produced a non-finite explained logit or relevance (logit '
                f'{logit.detach().flatten()[:8].tolist()}): {self.non_finite_hint()}'
            )
        return self.package(
            relevance.detach(),
            logit.detach(),
            method,
            None if decoder_relevance is None else decoder_relevance.detach(),
        )

    def non_finite_hint(self) -> str:
        """The likely cause of a non-finite result."""
        bad = next(
            (name for name, tensor in self.model.named_parameters() if not bool(torch.isfinite(tensor).all())), None
        )
        if bad is not None:
            return f'the model parameter {bad!r} has NaN or infinite entries'
        dtype = self.inputs.dtype
        if torch.finfo(dtype).bits < 32:
            return f'{dtype} overflowed inside the model: explain in float32 or bfloat16'
        return 'the model itself returns a non-finite output for this input'

    def package(self, relevance, logit, method, decoder_relevance):
        raise NotImplementedError

    def position_sequence(self, name: str) -> str:
        """The sequence whose positions the position encoding at the module path ``name`` encodes (PA-LRP,
        :py:meth:`~zennit_attn.rules.positions.PositionInputs.per_position`): here the input's, ``'input'``."""
        return 'input'

    def add_position_relevance(self, relevances: dict[str, torch.Tensor], kinds: frozenset[str]) -> None:
        """The ``{sequence: [batch, positions]}`` relevance of the position encodings (PA-LRP,
        :py:mod:`zennit_attn.rules.positions`; sequences by :py:meth:`position_sequence`) of ``kinds`` (those of
        :py:data:`~zennit_attn.rules.positions.POSITION_ENCODINGS` that ran), packaged by :py:meth:`package`; read for
        token inputs and vision transformers.

        Raises
        ------
        ValueError
            Here: the modality does not read it.
        """
        raise ValueError(
            f"PA-LRP's position relevance is read per input token; {type(self).__name__} explains another input: "
            'explain without positions=True'
        )


class TokenTask(Task):
    """A language model explained at its word embeddings (relevance per token).

    For encoder-decoder models the inputs are the encoder's embeddings; the decoder's
    (:py:attr:`decoder_embeddings`) are passed along unchanged and are an extra leaf for LRP. A model that needs its
    ids (:py:func:`~zennit_attn.inputs.lookups.needs_ids`) is run on them, with :py:attr:`lookups` (other token tables).

    Parameters
    ----------
    model, input_ids, attention_mask, model_kwargs, decoder_input_ids
        As for :py:func:`~zennit_attn.explain`; ``input_ids`` may also be the tokenizer's ``BatchEncoding`` (or a
        dict with ``input_ids``), whose ``attention_mask`` and other fields are used.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        input_ids,
        attention_mask=None,
        model_kwargs: dict | None = None,
        decoder_input_ids=None,
    ):
        input_ids, attention_mask, model_kwargs = split_encoding(input_ids, attention_mask, model_kwargs)
        super().__init__(model, model_kwargs)
        #: the choices of a multiple-choice head, explained one after another (None for other models)
        self.choices = Choices.of(model, input_ids)
        if self.choices is not None:
            mask = None if attention_mask is None else torch.as_tensor(attention_mask)
            input_ids, attention_mask = self.choices.flatten(torch.as_tensor(input_ids)), self.choices.flatten(mask)
            self.model_kwargs = {key: self.choices.flatten(value) for key, value in self.model_kwargs.items()}
        self.input_ids, self.attention_mask = check_ids(input_ids, attention_mask, device=self.device)
        embedding_module = self.word_embeddings(model)
        check_word_embeddings(model, embedding_module)
        check_vocabulary(self.input_ids, embedding_module, 'input_ids')
        with torch.no_grad():
            embedded = embedding_module(self.input_ids)
        if not isinstance(embedded, torch.Tensor):
            raise UnsupportedModelError(
                f'the word embedding module of {type(model).__name__} ({type(embedding_module).__name__}) returns a '
                f'{type(embedded).__name__}, not a tensor of embeddings (integer-only quantization: I-BERT keeps a '
                'scaling factor beside them): zennit-attn reads the relevance of tokens at their embeddings'
            )
        #: ``[batch, seq, hidden]`` word embeddings of the input (detached)
        self.inputs = embedded.detach()
        # the other tables of the ids (one run of the model, if any, once per model: a fact of the model)
        tables = id_tables(model, embedding_module, self.facts)
        #: why the model is run on its ids (None: on the embeddings)
        self.ids_reason = needs_ids(model, embedding_module, tables, self.facts)
        if self.ids_reason is None:
            check_embeddings_run(model, self.facts)
        elif self.choices is not None:
            raise UnsupportedModelError(
                f'{type(model).__name__} scores choices and must be run on its ids ({self.ids_reason}): zennit-attn '
                'explains the choices of a multiple-choice head on their embeddings only'
            )
        self.lookups = None if self.ids_reason is None else TokenLookups(model, embedding_module, tables)
        self._lookup_relevance: torch.Tensor | None = None
        self._position_relevance: torch.Tensor | None = None
        self._decoder_position_relevance: torch.Tensor | None = None
        self.decoder_input_ids = self.decoder_embeddings = None
        self._output_mask = self.attention_mask
        if is_encoder_decoder(model):
            self._set_decoder_inputs(decoder_input_ids, decoder_word_embeddings(model) or embedding_module)
        elif decoder_input_ids is not None:
            raise ValueError(f'{type(model).__name__} is not an encoder-decoder model: decoder_input_ids is not used')
        check_length(model, self.input_ids.shape[1] if self.choices is None else self.choices.length, 'input_ids')
        #: whether ``position_ids`` are the ones :py:meth:`_set_model_kwargs` sets for left-padded rows (the token
        #: count before each token), not the caller's: a model with positions of its own computes them instead
        #: (Qwen2-VL's multimodal ones, :py:class:`~zennit_attn.inputs.vision_language.tasks.VisionLanguageTask`)
        self.padded_positions = False
        self._set_model_kwargs()

    def _set_decoder_inputs(self, decoder_input_ids, embedding: torch.nn.Module) -> None:
        """The decoder's ids, mask and embeddings (by ``embedding``) of an encoder-decoder model: ``decoder_input_ids``,
        or the decoder start token alone for a generating model (its first step), whose logits are explained.

        Raises
        ------
        ValueError
            Without ``decoder_input_ids``, for a model without a language-model head (a question-answering or
            classification head, which computes its decoder input from ``input_ids`` shifted right, as it was
            trained) or without a decoder start token.
        """
        model = self.model
        if decoder_input_ids is None and language_model_head(model) is None:
            raise ValueError(
                f'{type(model).__name__} computes its decoder input from input_ids (shifted right) where none is '
                'given, as its head was trained; zennit-attn starts a decoder at its start token only for generating '
                'models: pass decoder_input_ids= (the input shifted right, as the model makes it)'
            )
        if decoder_input_ids is None:
            start = getattr(model.config, 'decoder_start_token_id', None)
            if not isinstance(start, int):
                raise ValueError(
                    f'{type(model).__name__} has no decoder_start_token_id in its configuration: pass '
                    'decoder_input_ids= (the first decoder tokens, e.g. its bos or eos token id)'
                )
            decoder_input_ids = torch.full((self.batch, 1), start, device=self.input_ids.device)
        decoder_mask = self.model_kwargs.get('decoder_attention_mask')
        self.decoder_input_ids, self._output_mask = check_ids(
            decoder_input_ids, decoder_mask, 'decoder_input_ids', self.device
        )
        if self.decoder_input_ids.shape[0] != self.batch:
            raise ValueError('decoder_input_ids must have as many rows as input_ids')
        check_vocabulary(self.decoder_input_ids, embedding, 'decoder_input_ids')
        with torch.no_grad():
            self.decoder_embeddings = embedding(self.decoder_input_ids).detach()

    @staticmethod
    def word_embeddings(model: torch.nn.Module) -> torch.nn.Module | None:
        """The module that embeds ``input_ids`` (:py:func:`~zennit_attn.core.modules.word_embeddings`:
        ``model.get_input_embeddings()``, or that of the Hugging Face model inside a model of one's own), None where
        there is none (also where transformers cannot tell it: CANINE embeds characters by hashing)."""
        return word_embeddings(model)

    @property
    def embeddings(self) -> torch.Tensor:
        """``[batch, seq, hidden]`` the word embeddings of the input (the task's inputs)."""
        return self.inputs

    @property
    def output_mask(self) -> torch.Tensor | None:
        return self._output_mask

    def _set_model_kwargs(self) -> None:
        parameters = forward_parameters(self.model)
        kwargs = self.model_kwargs
        for key, value in without_cache(self.model).items():
            kwargs.setdefault(key, value)
        mask = self.attention_mask
        if mask is None:
            return
        kwargs['attention_mask'] = mask
        sequences = mask if self.choices is None else self.choices.sequences(mask)  # the model's own sequences
        left_padded = bool((sequences[:, 0] == 0).any())
        if left_padded and 'position_ids' not in kwargs and 'position_ids' in parameters:
            if not is_causal(self.model, self.facts):
                raise ValueError(
                    f'{type(self.model).__name__} is not causal (or cannot be run on token ids alone to '
                    'tell) and would give left-padded rows shifted positions: pad on the right, or pass '
                    'position_ids'
                )
            kwargs['position_ids'] = (sequences.long().cumsum(-1) - 1).clamp(min=0).reshape(mask.shape)
            self.padded_positions = True
        check_left_padding(self.model, sequences, self.facts)
        check_right_padding(self.model, sequences, self.facts)
        check_pad_ids(self.model, self.input_ids, mask, self.facts)

    def base_kwargs(self) -> dict:
        kwargs = dict(self.model_kwargs)
        if self.decoder_embeddings is not None:
            kwargs['decoder_inputs_embeds'] = self.decoder_embeddings
        return kwargs

    def run(self, inputs, rows=None, model=None, copy: bool = True, **extra):
        """:py:meth:`Task.run`; ``copy``: run the model on copies of the embeddings, as a model may change them in
        place (CTRL scales ``inputs_embeds``, GIT adds to them: a leaf refuses it, the task's input would change).
        An LRP run needs none (:py:meth:`lrp_forward`): the relevance boundary's input side copies
        (:py:func:`~zennit_attn.rules.boundary.input_relevance`)."""
        kwargs = self.call_kwargs(rows)
        kwargs.update(extra)
        model = self.model if model is None else model
        fixed = inputs is self.inputs
        if copy:
            inputs = inputs.clone()
            if isinstance(kwargs.get('decoder_inputs_embeds'), torch.Tensor):
                kwargs['decoder_inputs_embeds'] = kwargs['decoder_inputs_embeds'].clone()
        if self.choices is not None:  # the model's [batch, choices, seq] layout
            inputs = self.choices.unflatten(inputs)
            kwargs = {key: self.choices.unflatten(value) for key, value in kwargs.items()}
        if self.lookups is None:
            try:
                return model(inputs_embeds=inputs, **kwargs)
            except NotImplementedError as error:  # transformers' encoder-decoder classifiers read their ids
                if 'embeddings' not in str(error) and 'inputs_embeds' not in str(error):
                    raise
                raise UnsupportedModelError(
                    f'{type(self.model).__name__} cannot be run on embeddings ({error}), where zennit-attn reads the '
                    'relevance of the tokens of an encoder-decoder model: it does not explain this model'
                ) from error
        ids = (self.input_ids if rows is None else self.input_ids[rows]).to(inputs.device)
        with self.lookups.substituting(ids, inputs, fixed=fixed):
            return model(input_ids=ids, **kwargs)

    def lrp_forward(self, inputs: torch.Tensor, model: torch.nn.Module, **extra) -> torch.Tensor:
        """On a model run on its ids, an LRP run of its lookups
        (:py:meth:`~zennit_attn.inputs.lookups.TokenLookups.record`): the embeddings' gradient becomes their relevance,
        other tables' lookups leaves (:py:meth:`lookup_leaves`)."""
        if self.lookups is not None:
            self.lookups.record()
        return super().lrp_forward(inputs, model, copy=False, **extra)

    def lookup_leaves(self) -> list[torch.Tensor]:
        """The other token tables' lookups in the last :py:meth:`lrp_forward` (for :py:meth:`add_lookup_relevance`)."""
        return [] if self.lookups is None else self.lookups.recorded()

    def add_lookup_relevance(self, relevances: list[torch.Tensor]) -> None:
        """The relevance of :py:meth:`lookup_leaves`, added to the tokens' by :py:meth:`package`."""
        self._lookup_relevance = TokenLookups.token_relevance(relevances)

    def position_sequence(self, name: str) -> str:
        """:py:meth:`Task.position_sequence`: of an encoder-decoder model ``'encoder'`` for the encodings inside its
        encoder (``model.get_encoder()``), ``'decoder'`` for the others; ``'input'`` for other models."""
        if self.decoder_embeddings is None:
            return 'input'
        return 'encoder' if self.inside(name, self.model.get_encoder()) else 'decoder'

    def inside(self, name: str, module: torch.nn.Module) -> bool:
        """Whether the module path ``name`` is ``module``'s, or that of a module inside it."""
        path = path_of(module, self.modules)
        return path is not None and within(name, path)

    def add_position_relevance(self, relevances: dict[str, torch.Tensor], kinds: frozenset[str]) -> None:
        """:py:meth:`Task.add_position_relevance`: one relevance per token of the input, or of an encoder-decoder
        model's encoder and decoder inputs (0 for a sequence without a position encoding).

        Raises
        ------
        ValueError
            For another shape, or for a table held as a parameter (kind ``'held'``): a vision tower's (the text's
            encodings of a model with both are refused when registered), never the text's.
        """
        if 'held' in kinds:
            raise ValueError(
                f"{type(self.model).__name__}'s position encodings are tables held as parameters, a vision tower's: "
                'PA-LRP reads them for images explained alone (a vision transformer), not for the tokens of a text; '
                'explain without positions=True'
            )
        shapes = {'input': (self.batch, self.input_ids.shape[1])}
        if self.decoder_embeddings is not None:
            shapes = {'encoder': shapes['input'], 'decoder': tuple(self.decoder_embeddings.shape[:2])}
        for sequence, relevance in relevances.items():
            if sequence not in shapes:
                raise ValueError(
                    f"PA-LRP read position encodings of {type(self.model).__name__}'s {sequence} (a vision tower's "
                    "positions beside the text's): it reads the positions of the explained tokens only, and their "
                    "share of the relevance would be missing from the text's; explain without positions=True"
                )
            if tuple(relevance.shape) != shapes[sequence]:
                rows, tokens = shapes[sequence]
                raise ValueError(
                    f'the position encodings of the {sequence} gave relevance of shape {list(relevance.shape)} for '
                    f'{rows} row(s) of {tokens} tokens: PA-LRP reads one relevance per input position'
                )
        found = {
            sequence: relevances[sequence] if sequence in relevances else self.inputs.new_zeros(shape)
            for sequence, shape in shapes.items()
        }
        self._position_relevance = found.get('input', found.get('encoder'))
        self._decoder_position_relevance = found.get('decoder')

    def keep_logits(self, position=-1, target: TargetLike = None) -> dict:
        """Restrict the model's language-model head to the explained positions: ``{'logits_to_keep': positions}``
        for models with a language-model head (``get_output_embeddings()``) whose forward takes ``logits_to_keep``
        (Hugging Face ``...ForCausalLM``), ``{}`` otherwise (a sequence classifier that takes it, BioGPT's, would pool
        the score of a position it no longer has).

        The head's output at other positions does not reach the explained logits, so the relevance is unchanged;
        the head's forward and backward (a third of the FLOPs of a small Llama) and the ``[batch, seq, vocab]``
        logits with their gradient are skipped."""
        if (
            not self.readout.model_output
            or self.decoder_embeddings is not None
            or 'logits_to_keep' in self.model_kwargs
            or 'logits_to_keep' not in forward_parameters(self.model)
            or language_model_head(self.model) is None
        ):
            return {}
        pairs = target_pairs(target)
        shape = torch.empty(self.batch, self.input_ids.shape[1], 0, device=self.input_ids.device)
        positions = explained_positions(
            shape, position if pairs is None else pairs[:, 0].expand(self.batch, -1), self.output_mask
        )
        self.kept = torch.unique(positions)  # sorted
        return {'logits_to_keep': logits_to_keep(self.kept, self.input_ids.shape[1])}

    def _all_positions(self, scores: torch.Tensor) -> torch.Tensor:
        """``scores`` with a sequence dimension as long as the explained tokens (only its shape is used).

        Raises
        ------
        UnsupportedModelError
            Where the explained output (the model's, or a site's activations for a Neuron target) has another
            number of positions than the input has tokens (GIT's image tokens in front of the text, for a model
            without ``logits_to_keep``; CPM-Ant's prompt in front of its blocks' positions): a position of the input
            would name another row of the output.
        """
        tokens = (self.input_ids if self.decoder_embeddings is None else self.decoder_input_ids).shape[1]
        if self.kept is not None:
            return scores.new_empty(scores.shape[0], tokens, 0)
        if scores.dim() == 3 and scores.shape[1] != tokens:
            raise UnsupportedModelError(
                f'the explained output of {type(self.model).__name__} has {scores.shape[1]} positions for an input of '
                f"{tokens} tokens (positions of its own beside the input's: image tokens or a prompt in front, further "
                'streams): zennit-attn cannot tell which position belongs to which token'
            )
        return scores

    def lrp_leaves(self) -> tuple[list[torch.Tensor], dict]:
        leaves, extra = super().lrp_leaves()
        if self.decoder_embeddings is not None:
            leaves.append(self.decoder_embeddings.clone().requires_grad_(True))
            extra['decoder_inputs_embeds'] = leaves[1]
        return leaves, extra

    def token_count(self) -> int:
        return self.input_ids.shape[1]

    def attributable_tokens(self) -> torch.Tensor:
        valid = torch.ones(self.input_ids.shape, dtype=torch.bool, device=self.inputs.device)
        if self.attention_mask is not None:
            valid &= self.attention_mask.to(valid.device) != 0
        if self.positions is not None and self.decoder_embeddings is None and is_causal(self.model):
            last = self.positions if self.positions.dim() == 1 else self.positions.amax(1)
            valid &= torch.arange(self.token_count(), device=valid.device) <= last.to(valid.device)[:, None]
        if self.choices is not None and self.targets is not None and isinstance(self.objective, (Logit, Contrast)):
            # a choice's score reads that choice's tokens only: the other choices cannot change a logit or a contrast
            read = torch.zeros(self.batch, self.choices.count, dtype=torch.bool, device=valid.device)
            rows = torch.arange(self.batch, device=valid.device)
            read[rows, self.targets.to(valid.device)] = True
            if self.objective.contrast is not None:
                read[rows, self.objective.contrast.to(valid.device)] = True
            valid &= read.repeat_interleave(self.choices.length, 1)
        return valid

    def token_relevance(self, relevance: torch.Tensor) -> torch.Tensor:
        return relevance

    def check_token_layout(self, what: str) -> None:
        """:py:meth:`Task.check_token_layout`: a multiple-choice head's choices are explained as one sequence
        (:py:mod:`zennit_attn.inputs.choices`), the model runs them as sequences of their own.

        Raises
        ------
        NotImplementedError
            For a multiple-choice head."""
        if self.choices is not None:
            raise NotImplementedError(
                f'{what} reads the sequences of {type(self.model).__name__}, which runs every choice as a sequence of '
                f'its own while zennit-attn explains the choices as one: use attnlrp, cplrp, input_x_gradient, '
                'integrated_gradients, smoothgrad or kernelshap'
            )

    def query_positions(self) -> torch.Tensor:
        """The query position whose attention row is read: the explained position (for several pairs, the last);
        for 2-D outputs (classification heads) the last non-padding token of causal models and the first token of
        encoders."""
        device = self.inputs.device
        if self.positions is not None:
            return self.positions if self.positions.dim() == 1 else self.positions.amax(1)
        if not is_causal(self.model):
            return torch.zeros(self.batch, dtype=torch.long, device=device)
        return explained_positions(
            torch.empty(self.batch, self.token_count(), 0, device=device), None, self.attention_mask
        )

    def attention_row(self, matrices: torch.Tensor) -> torch.Tensor:
        positions = self.query_positions().to(matrices.device)
        index = torch.arange(matrices.shape[0], device=matrices.device)
        return matrices.movedim(-2, 1)[index, positions]

    def feature_mask(self) -> torch.Tensor:
        seq, hidden = self.inputs.shape[1:]
        return torch.arange(seq, device=self.inputs.device)[None, :, None].expand(1, seq, hidden)

    def feature_relevance(self, relevance: torch.Tensor) -> torch.Tensor:
        return relevance

    def attributable_features(self) -> torch.Tensor:
        """:py:meth:`attributable_tokens`: a feature is a token."""
        return self.attributable_tokens()

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
        if self._lookup_relevance is not None:  # the other token tables' lookups (a model run on its ids)
            tokens, self._lookup_relevance = tokens + per_token(self._lookup_relevance, self.attention_mask)[0], None
        positions, self._position_relevance = per_token(self._position_relevance, self.attention_mask)[0], None
        decoder_mask = self._output_mask if self.decoder_embeddings is not None else None
        decoder, decoder_embedding = per_token(decoder_relevance, decoder_mask)
        decoder_positions, self._decoder_position_relevance = (
            per_token(self._decoder_position_relevance, decoder_mask)[0],
            None,
        )
        return Explanation(
            relevance=tokens,
            embedding_relevance=embedding,
            target=self.targets,
            logit=logit,
            position=self.positions,
            input_ids=self.input_ids,
            attention_mask=self.attention_mask,
            decoder_relevance=decoder,
            decoder_embedding_relevance=decoder_embedding,
            decoder_input_ids=self.decoder_input_ids,
            decoder_attention_mask=decoder_mask,
            method=method,
            contrast=self.objective.contrast,
            objective=self.objective,
            position_relevance=positions,
            decoder_position_relevance=decoder_positions,
            choices=None if self.choices is None else self.choices.count,
        )

    def non_finite_hint(self) -> str:
        hint = super().non_finite_hint()
        implementation = getattr(getattr(self.model, 'config', None), '_attn_implementation', None)
        if (
            hint.startswith('the model itself')
            and self.inputs.dtype == torch.float64
            and implementation == 'eager'
            and self.attention_mask is not None
            and bool((self.attention_mask == 0).any())
        ):
            return (
                'with padding, float64 eager attention in transformers returns NaN logits (a fully masked row): '
                'use float32 or attn_implementation="sdpa"'
            )
        return hint


#: Names of the parameters of Hugging Face's vision embeddings that each put one token before the patches (the class
#: token: ``cls_token``, CLIP's ``class_embedding``, VideoPrism's ``cls_emb``; DeiT's ``distillation_token``).
PREFIX_TOKEN_PARAMETERS = ('cls_token', 'class_embedding', 'cls_emb', 'distillation_token')
#: Hugging Face's classifiers whose head reads more prefix tokens than the class token, and how many (the others
#: read ``sequence_output[:, 0]``): DeiT's with the teacher's head averages the class and the distillation token's.
TOKEN_HEADS = {'DeiTForImageClassificationWithTeacher': 2}


class ImageTask(Task):
    """An image model explained at its pixels (relevance per pixel and channel): a classifier, a segmentation or
    depth map (a function of it), a detector's object query, a video classifier (per frame).

    Parameters
    ----------
    model: torch.nn.Module
        A timm, torchvision or Hugging Face image model (``ViTForImageClassification``, ...), in eval mode.
    pixels: torch.Tensor
        ``[batch, channels, height, width]`` (or ``[channels, height, width]``) floating-point input as the model
        takes it (normalised); ``[batch, frames, channels, height, width]`` for a model that takes videos
        (:py:func:`~zennit_attn.inputs.checks.takes_video`).
    model_kwargs: dict, optional
        Further keyword arguments of the model's forward (e.g. ``interpolate_pos_encoding``).
    """

    def __init__(self, model: torch.nn.Module, pixels, model_kwargs: dict | None = None):
        super().__init__(model, model_kwargs)
        if isinstance(pixels, (str, Mapping)):
            raise TypeError(
                f'{type(model).__name__} takes pixels: pass a float tensor [batch, channels, height, '
                f'width], got {type(pixels).__name__}'
            )
        pixels = torch.as_tensor(pixels, device=self.device)
        channels = image_channels(model)
        #: whether the input is a video, ``[batch, frames, channels, height, width]`` (a model with ``num_frames``)
        self.video = pixels.dim() == 5 and takes_video(model)
        if pixels.dim() == 3 and channels in (None, pixels.shape[0]):
            pixels = pixels[None]
        layout = pixels.shape[2] if self.video else pixels.shape[1] if pixels.dim() == 4 else None
        if layout is None or layout != (channels or layout):
            raise ValueError(
                f'pixels must be [batch, channels, height, width] (or [channels, height, width])'
                f'{"" if channels is None else f" with the {channels} channels {type(model).__name__} takes"}, got '
                f'shape {tuple(pixels.shape)}: other layouts (flattened patches, as SigLIP 2 takes them with '
                'spatial_shapes; the frames of a video, [batch, frames, channels, height, width], for a model that '
                'does not take videos) are not supported'
            )
        if not pixels.is_floating_point():
            raise ValueError(
                f'pixels must be floating point as the model takes them, got {pixels.dtype}: convert '
                "and normalise the image first (e.g. the model's own transform, or x.float() / 255)"
            )
        if not bool(torch.isfinite(pixels).all()):
            bad = (~torch.isfinite(pixels)).flatten(1).any(1).nonzero()[:, 0].tolist()
            raise ValueError(f'pixels of row(s) {bad} are NaN or infinite: a faulty image or normalisation')
        self.inputs = pixels.detach()
        self._position_relevance: torch.Tensor | None = None

    @property
    def pixels(self) -> torch.Tensor:
        return self.inputs

    def resolve(self, scores, position=-1, target=None, initial_relevance=False):
        """:py:meth:`Task.resolve`; ``position`` names the explained output of a model with one per position (a
        detector's object queries, a backbone's tokens), which it must name: no position of such an output stands for
        the image; without a position, a function of the whole output (``target=callable``) is explained, as for a
        map of more dimensions (a depth map ``[batch, height, width]``, all queries of a detector). A classifier's
        scores have no position.

        Raises
        ------
        ValueError
            For a ``position`` with one output per row, and for neither a position nor a function with outputs per
            position (of the model's output; a readout inside the model has its own positions)."""
        given = not default_position(position)
        name = type(self.model).__name__
        if scores.dim() <= 2 and given:
            raise ValueError(f'{name} gives one output per image: position does not apply to it')
        if scores.dim() == 3 and not given and self.readout.model_output and target_pairs(target) is None:
            if isinstance(self.objective, OutputFunction):
                return self._resolve_map(scores, position, initial_relevance)
            raise ValueError(
                f'{name} gives outputs per position (shape {tuple(scores.shape)}: the object queries of a detector, '
                'the tokens of a backbone, the rows of a depth map): name the one to explain with position= (e.g. the '
                'query of a detected box), or explain a function of the whole output with target=callable'
            )
        return super().resolve(scores, position, target, initial_relevance)

    def run(self, inputs, rows=None, model=None, **extra):
        kwargs = self.call_kwargs(rows)
        kwargs.update(extra)
        return (self.model if model is None else model)(inputs, **kwargs)

    @property
    def timm_model(self) -> torch.nn.Module:
        """The timm model: the explained model itself, or the one Hugging Face's ``TimmWrapper`` holds."""
        return getattr(self.model, 'timm_model', self.model)

    def prefix_tokens(self) -> int:
        """Number of tokens before the patch tokens (class, distillation, register tokens): timm's
        ``num_prefix_tokens`` (also inside Hugging Face's ``TimmWrapper``), else one per parameter of
        :py:data:`PREFIX_TOKEN_PARAMETERS` the model holds (Hugging Face's ViT and BEiT a class token, DeiT a class
        and a distillation token, SigLIP and Swin none) and the registers."""
        if hasattr(self.timm_model, 'num_prefix_tokens'):
            return int(self.timm_model.num_prefix_tokens)
        held = {name.rsplit('.', 1)[-1] for name, _ in self.model.named_parameters()}
        return sum(name in held for name in PREFIX_TOKEN_PARAMETERS) + self._registers()

    def _registers(self) -> int:
        """Number of register tokens among the prefix tokens (timm's ``num_reg_tokens``, Hugging Face's
        ``config.num_register_tokens``): no head reads them."""
        registers = getattr(self.timm_model, 'num_reg_tokens', None)
        if registers is None:
            registers = getattr(getattr(self.model, 'config', None), 'num_register_tokens', None)
        return int(registers or 0)

    def grid(self) -> tuple[int, int]:
        """``(rows, columns)`` of the patch grid: the model's patches (its configuration's ``patch_size``, timm's
        ``patch_embed``), else squares of :py:data:`FALLBACK_PATCH` pixels (a convolutional network, SegFormer: the
        features of KernelSHAP; the attention-map methods and AtMan refuse such a model by its maps or keys)."""
        if self.video:
            raise TypeError(
                f'the methods that perturb or read image patches (KernelSHAP, AtMan, rollout, Grad-CAM) are not '
                f'implemented for videos ({type(self.model).__name__}: tubelets of frames); use attnlrp, cplrp or a '
                'gradient method'
            )
        height, width = self.inputs.shape[2:]
        config = getattr(self.model, 'config', None)
        size = getattr(config, 'patch_size', None)
        if size is None:  # a classifier over a vision-language model's vision tower (CLIP's, SigLIP's)
            size = getattr(getattr(config, 'vision_config', None), 'patch_size', None)
        if size is None:
            size = getattr(getattr(self.model, 'patch_embed', None), 'patch_size', None)
        if size is None:
            size = FALLBACK_PATCH
        size = (size, size) if isinstance(size, int) else tuple(size)
        return max(height // size[0], 1), max(width // size[1], 1)

    def token_count(self) -> int:
        rows, columns = self.grid()
        return self.prefix_tokens() + rows * columns

    def attributable_tokens(self) -> torch.Tensor:
        valid = torch.ones(self.batch, self.token_count(), dtype=torch.bool, device=self.inputs.device)
        valid[:, : self.prefix_tokens()] = False  # the class token and its kind have no pixels
        return valid

    def token_relevance(self, relevance: torch.Tensor) -> torch.Tensor:
        """``[batch, tokens]`` -> ``[batch, channels, height, width]``: each patch token's value spread evenly over
        the pixels and channels of its patch (the prefix tokens dropped)."""
        batch, channels, height, width = self.inputs.shape
        rows, columns = self.grid()
        patches = relevance[:, self.prefix_tokens() :]
        if patches.shape[1] != rows * columns:
            raise ValueError(f'{patches.shape[1]} patch tokens do not form the {rows} x {columns} grid')
        grid = patches.reshape(batch, 1, rows, columns).to(self.inputs.dtype)
        spread = torch.nn.functional.interpolate(grid, size=(height, width), mode='nearest')
        return spread.expand(batch, channels, height, width) / (channels * (height // rows) * (width // columns))

    def attention_row(self, matrices: torch.Tensor) -> torch.Tensor:
        """The mean row of the pooled tokens: the prefix tokens but the registers (class token; DeiT's class and
        distillation tokens) for token pooling, else the patch tokens (average pooling: timm's ``global_pool='avg'``,
        Hugging Face's ``config.use_mean_pooling``, BEiT's default)."""
        prefix = self.prefix_tokens()
        mean = getattr(getattr(self.model, 'config', None), 'use_mean_pooling', False)
        if prefix > 0 and getattr(self.timm_model, 'global_pool', 'avg' if mean else 'token') == 'token':
            return matrices[..., : self.pooled_tokens(), :].mean(-2)
        return matrices[..., prefix:, :].mean(-2)

    def pooled_tokens(self) -> int:
        """Number of prefix tokens a head that pools tokens reads: timm's class (and distillation) tokens, its prefix
        but the registers; Hugging Face's class token, or the tokens of :py:data:`TOKEN_HEADS`."""
        if hasattr(self.timm_model, 'num_prefix_tokens'):
            return self.prefix_tokens() - self._registers()
        return TOKEN_HEADS.get(type(self.model).__name__, 1)

    def add_position_relevance(self, relevances: dict[str, torch.Tensor], kinds: frozenset[str]) -> None:
        """The ``[batch, positions]`` relevance of a vision transformer's position table (PA-LRP,
        :py:mod:`zennit_attn.rules.positions`), as ``[batch, tokens]`` (:py:meth:`token_count`: the prefix tokens, then
        the patches row by row). The table has a position for every token, or for the patches alone (timm's
        ``no_embed_class``), or for the class token and the patches (DINOv2's registers are added after the
        positions); tokens without a position get 0.

        Raises
        ------
        ValueError
            For positions that are none of these (a table interpolated to another grid than the one :py:meth:`grid`
            reads from the model's patch size, the stages of a pyramid).
        """
        relevance = relevances['input']
        rows, columns = self.grid()
        self._check_table_grid(relevance.shape[1], rows, columns)
        lead = self._table_layouts(rows * columns)
        if relevance.shape[0] != self.batch or relevance.shape[1] not in lead:
            raise ValueError(
                f'the position table gave relevance of shape {list(relevance.shape)} for {self.batch} image(s) of '
                f'{self.prefix_tokens()} prefix token(s) and {rows} x {columns} patches: PA-LRP reads one relevance '
                'per token of the image'
            )
        taken = lead[relevance.shape[1]]
        without = relevance.new_zeros(self.batch, self.prefix_tokens() - taken)  # the prefix tokens without a position
        self._position_relevance = torch.cat([relevance[:, :taken], without, relevance[:, taken:]], 1)

    def _table_layouts(self, patches: int) -> dict[int, int]:
        """The layouts of a position table over ``patches`` patches: its number of positions -> how many of them the
        prefix tokens take, before the patches' (all prefix tokens, none, or all but the registers)."""
        prefix, registers = self.prefix_tokens(), self._registers()
        return {patches + prefix: prefix, patches: 0, patches + prefix - registers: prefix - registers}

    def _check_table_grid(self, positions: int, rows: int, columns: int) -> None:
        """Refuse a table of ``positions`` positions that is not over the image's ``rows`` x ``columns`` patches: an
        image timm pads to whole patches (``dynamic_img_pad``), a table the model interpolated to the image's grid
        (:py:meth:`table_grid`)."""
        feature_size = getattr(getattr(self.timm_model, 'patch_embed', None), 'dynamic_feat_size', None)
        padded = tuple(feature_size(tuple(self.inputs.shape[-2:]))) if callable(feature_size) else (rows, columns)
        if padded != (rows, columns):
            raise ValueError(
                f'the model pads the image of {self.inputs.shape[-2]} x {self.inputs.shape[-1]} pixels to '
                f'{padded[0]} x {padded[1]} patches (dynamic_img_pad), whose position relevance has no pixels of its '
                'own to spread over; explain an image of whole patches'
            )
        table = self.table_grid()
        if table is not None and table != (rows, columns) and positions in self._table_layouts(table[0] * table[1]):
            raise ValueError(
                f'the position table holds a grid of {table[0]} x {table[1]} patches, the image has {rows} x '
                f'{columns} patches: the model interpolated its table to the image (interpolate_pos_encoding, '
                "dynamic_img_size, DINOv2), and the table's positions are not the image's; PA-LRP reads them at the "
                'size the table was made for, explain an image of that size'
            )

    def table_grid(self) -> tuple[int, int] | None:
        """``(rows, columns)`` of the patch grid a vision transformer's position table was made for (timm's
        ``patch_embed.grid_size``, else the configuration's ``image_size`` over its ``patch_size``), None where the
        model tells none: a model that interpolates its table to another image's grid holds positions of this one."""
        grid = getattr(getattr(self.timm_model, 'patch_embed', None), 'grid_size', None)
        if grid is not None:
            return tuple(int(size) for size in grid)
        config = getattr(self.model, 'config', None)
        if getattr(config, 'image_size', None) is None:  # a classifier over a vision-language model's vision tower
            config = getattr(config, 'vision_config', None)
        image, patch = getattr(config, 'image_size', None), getattr(config, 'patch_size', None)
        if not isinstance(image, (int, tuple, list)) or not isinstance(patch, (int, tuple, list)):
            return None
        image = (image, image) if isinstance(image, int) else tuple(image)
        patch = (patch, patch) if isinstance(patch, int) else tuple(patch)
        return image[0] // patch[0], image[1] // patch[1]

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
        positions, self._position_relevance = self._position_relevance, None
        if positions is not None:
            positions = positions.to(relevance.dtype)
        return ImageExplanation(
            relevance=relevance.sum(2 if self.video else 1),  # over the channels
            pixel_relevance=relevance,
            target=self.targets,
            logit=logit,
            pixels=self.inputs,
            method=method,
            position=self.positions,
            contrast=self.objective.contrast,
            objective=self.objective,
            position_relevance=positions,
            position_pixel_relevance=None if positions is None else self.token_relevance(positions),
        )


def _token_input(inputs) -> bool:
    """Whether ``inputs`` are token ids: a tokenizer's mapping, or ``[batch, seq]`` (or ``[seq]``) integers as a tensor
    or lists (integer images have more dimensions)."""
    if isinstance(inputs, Mapping):
        return 'input_ids' in inputs
    if isinstance(inputs, torch.Tensor):
        return inputs.dim() <= 2 and not inputs.is_floating_point() and not inputs.is_complex()
    depth = 0
    while isinstance(inputs, (list, tuple)) and inputs and depth <= 2:
        inputs, depth = inputs[0], depth + 1
    return depth <= 2 and isinstance(inputs, int) and not isinstance(inputs, bool)


def make_task(
    model: torch.nn.Module,
    inputs,
    position=-1,
    attention_mask=None,
    model_kwargs: dict | None = None,
    decoder_input_ids=None,
) -> Task:
    """The :py:class:`TokenTask` or :py:class:`ImageTask` for ``model``; arguments an image model cannot use are
    refused (``position`` once its output is known, :py:meth:`ImageTask.resolve`)."""
    if isinstance(model, torch.nn.Module) and is_image_model(model):
        if 'decoder_input_ids' in forward_parameters(model):  # a decoder of text (DETR's decoder reads queries)
            raise UnsupportedModelError(
                f'{type(model).__name__} reads images with its encoder and writes text with its decoder (TrOCR, '
                'Donut, ViT-GPT2): zennit-attn explains image classifiers, vision-language models whose language '
                'model reads the image, and text encoder-decoders, not image encoder-decoders'
            )
        if _token_input(inputs) and getattr(model, 'main_input_name', None) is None:
            raise TypeError(
                f'{type(model).__name__} was given token ids, but zennit-attn finds no word embedding table in it: '
                'neither get_input_embeddings() of its own nor one Hugging Face model inside it whose table it could '
                'take (none, or several with different tables, as in a model of two towers); give the model a '
                'get_input_embeddings() that returns the embedding of the explained tokens'
            )
        unused = [
            name
            for name, used in (
                ('attention_mask', attention_mask is not None),
                ('decoder_input_ids', decoder_input_ids is not None),
            )
            if used
        ]
        if unused:
            raise ValueError(f'{type(model).__name__} takes images: {", ".join(unused)} do not apply to it')
        return ImageTask(model, inputs, model_kwargs)
    check_input_kind(model, inputs)
    return TokenTask(model, inputs, attention_mask, model_kwargs, decoder_input_ids)
