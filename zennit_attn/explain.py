"""``explain()``: relevance per input token (or pixel) of a model's prediction in one call."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence

import torch
from transformers import BatchEncoding
from zennit.core import Composite

from .canonizers.checkpointing import checkpointed
from .core.blocks import block_stacks
from .core.modules import is_encoder_decoder
from .inputs.chat import encode_chat, is_conversation
from .inputs.checks import default_position, model_pad_token, token_ids
from .inputs.objectives import RUNNER_UP, objective_for
from .inputs.task import OutputField, make_task
from .inputs.vision_language import (
    encode_multimodal,
    has_pixels,
    is_similarity_model,
    make_multimodal_task,
    text_length,
)
from .latent.sites import Neuron
from .latent.targets import explain_latent
from .methods.propagation import method_of
from .methods.registry import METHODS, check_params
from .results.explanation import Explanation, ImageExplanation, MultimodalExplanation, TargetLike

__all__ = ['explain', 'encode_texts']


def _is_texts(value) -> bool:
    """A text, a list of texts, or an empty list (which :py:func:`encode_texts` refuses with a clear message)."""
    return isinstance(value, str) or (
        isinstance(value, (list, tuple)) and (not value or any(isinstance(item, str) for item in value))
    )


def encode_texts(tokenizer, texts, pad_token_id: int | None = None) -> BatchEncoding:
    """Tokenise a text, or a list of texts padded to one length, as :py:func:`explain` does.

    A list is padded on the tokenizer's ``padding_side`` with its pad token, or, for tokenizers without one (GPT-2,
    Llama), with ``pad_token_id`` (the model's pad token, which :py:func:`explain` passes) or else the end-of-sequence
    token, as Hugging Face users do with ``tokenizer.pad_token = tokenizer.eos_token`` (the tokenizer itself is not
    changed). Padding is masked by the ``attention_mask`` and gets no relevance; the pad id matters only to a model
    that finds its padding in the ids by its pad token (a decoder's sequence classifier scores the last token that is
    not it), for which padding with another id is refused (:py:func:`~zennit_attn.inputs.checks.check_pad_ids`).

    Parameters
    ----------
    tokenizer
        A Hugging Face tokenizer.
    texts: str or sequence of str
    pad_token_id: int, optional
        The id to pad with where the tokenizer has no pad token (default: its end-of-sequence token).

    Returns
    -------
    BatchEncoding
        ``input_ids`` and ``attention_mask`` as ``[batch, seq]`` tensors (and whatever else the tokenizer returns).

    Raises
    ------
    ValueError
        For no texts, a text that gives no tokens, or a list to pad with a tokenizer that has neither a pad nor an
        end-of-sequence token.
    """
    if not callable(tokenizer):
        raise TypeError(f'tokenizer must be a Hugging Face tokenizer, got {type(tokenizer).__name__}')
    if isinstance(texts, str):
        encoding = tokenizer(texts, return_tensors='pt')
        if encoding['input_ids'].shape[-1] == 0:
            raise ValueError(f'the text {texts!r} gives no tokens: nothing to explain')
        return encoding
    texts = list(texts)
    if not texts:
        raise ValueError('the list of texts is empty: nothing to explain')
    bad = [index for index, text in enumerate(texts) if not isinstance(text, str)]
    if bad:
        raise TypeError(f'texts must all be str; item {bad[0]} is {type(texts[bad[0]]).__name__}')
    if getattr(tokenizer, 'pad_token_id', None) is not None:
        encoding = tokenizer(texts, return_tensors='pt', padding=True)
        lengths = encoding['attention_mask'].sum(-1).tolist()
    else:
        pad = pad_token_id if pad_token_id is not None else getattr(tokenizer, 'eos_token_id', None)
        if pad is None:
            raise ValueError(
                'the tokenizer has no pad token and no end-of-sequence token to pad the texts with: set '
                'one (tokenizer.pad_token = ...) or explain the texts one at a time'
            )
        encoded = tokenizer(texts)['input_ids']
        lengths = [len(ids) for ids in encoded]
        width = max(lengths)
        left = getattr(tokenizer, 'padding_side', 'right') == 'left'
        ids = torch.full((len(texts), width), int(pad), dtype=torch.long)
        mask = torch.zeros(len(texts), width, dtype=torch.long)
        for row, row_ids in enumerate(encoded):
            span = slice(width - len(row_ids), width) if left else slice(0, len(row_ids))
            ids[row, span] = torch.tensor(row_ids, dtype=torch.long)
            mask[row, span] = 1
        encoding = BatchEncoding({'input_ids': ids, 'attention_mask': mask})
    empty = [index for index, length in enumerate(lengths) if length == 0]
    if empty:
        raise ValueError(f'text {empty[0]} ({texts[empty[0]]!r}) gives no tokens: nothing to explain in it')
    return encoding


def explain(
    model: torch.nn.Module,
    input_ids,
    target: TargetLike = None,
    position: int | Sequence[int] | torch.Tensor | None = -1,
    attention_mask=None,
    composite: Composite | None = None,
    method: str | None = None,
    model_kwargs: dict | None = None,
    decoder_input_ids=None,
    tokenizer=None,
    checkpointing: bool = False,
    latent=None,
    latent_reduce: str | None = None,
    condition=None,
    contrast=None,
    images=None,
    processor=None,
    objective: str = 'logit',
    output: str | None = None,
    **params,
) -> Explanation | ImageExplanation | MultimodalExplanation:
    """Explain a model's output: relevance per input token (language models) or pixel (vision transformers), by
    AttnLRP or a baseline method.

    The explained quantity is the logit (no softmax). For LRP its value is the initial relevance, so the token
    relevances sum to the logit minus what biases and the softmax rule absorb (see
    :py:func:`~zennit_attn.conservation`).

    Parameters
    ----------
    model: torch.nn.Module
        In eval mode: a Hugging Face ``...ForCausalLM``, ``...ForSequenceClassification``, ``...ForMaskedLM``,
        ``...ForConditionalGeneration`` or a base model (whose ``last_hidden_state`` is explained, ``target`` naming
        a hidden unit); or an image classifier (timm ``VisionTransformer``/DeiT, Hugging Face
        ``ViTForImageClassification``).
    input_ids: tensor, sequence of int, BatchEncoding, str, list of str or list of dict
        ``[batch, seq]`` (or ``[seq]``) token ids (``[batch, choices, seq]`` for a multiple-choice head, explained as
        one sequence of the choices: :py:mod:`zennit_attn.inputs.choices`), or what the tokenizer returns (its
        ``attention_mask`` and other fields are used), or, with ``tokenizer``, a text or a list of texts (tokenised
        by :py:func:`encode_texts`: a list is padded, with the end-of-sequence token where the tokenizer has no pad
        token), or a conversation for a chat model:
        ``[{'role': 'user', 'content': ...}, {'role': 'assistant', 'content': ...}]``, rendered by the tokenizer's
        chat template (:py:mod:`zennit_attn.inputs.chat`). Ending with the assistant's answer, the
        answer is explained (the sum of its tokens' logits, as ``target=`` its ``(position, token)`` pairs); ending
        with another turn, the next-token prediction after the template's generation prompt. The template's tokens
        keep their relevance; ``explanation.template`` marks them and the heatmaps leave them out unless
        ``template=True``. For an image
        classifier: ``[batch, channels, height, width]`` (or ``[channels, height, width]``) floating-point pixels as
        the model takes them.
    target: int, str, sequence of int, sequence of (int, int), tensor, callable or None
        Output index to explain, one for all rows or one per row; None explains the argmax. With ``tokenizer``, a
        token's text (e.g. ``' Paris'``, which must encode to exactly one token). A sequence of
        ``(position, token)`` pairs explains the sum of those logits (e.g. a whole generated answer) in one
        backward pass; ``position`` is then ignored. A :py:class:`~zennit_attn.latent.Neuron` explains the neuron's
        activation at ``position`` instead of a logit (for LRP the activation is the initial relevance;
        ``explanation.logit`` holds it). A callable (like zennit's output functions) explains a function of the
        scores: it receives the ``[batch, outputs]`` scores at the explained position (the logits; a
        classification head's class scores) and returns ``[batch]`` values, e.g. ``lambda logits: (logits /
        2.0).log_softmax(-1)[:, token]`` for a log-probability at temperature 2, or ``logits[:, ids].sum(-1)`` for a
        class of tokens; for LRP its value is the initial relevance. See
        :py:class:`~zennit_attn.inputs.objectives.OutputFunction` for the paper's notes on explaining softmax outputs
        and temperature (appendix A.2.4): explaining the logit (the default) does not saturate, a probability does.
        An output map per row (a semantic segmentation's ``[batch, classes, height, width]`` logits) is explained
        only through a callable, which receives the whole map
        (:py:class:`~zennit_attn.inputs.objectives.MapFunction`: ``lambda logits: logits[:, c].sum((-2, -1))``).
    position: int, sequence of int, tensor or None
        For 3-D outputs, the sequence position to explain (a decoder position for encoder-decoder models, the object
        query of a detector). -1 (default) or None: the last non-padding token of each row, and a negative position
        counts back from it (-2: the token before it, also in a right-padded row); with a ``tokenizer``
        that has a mask token held once by every row, that token (a masked language model's prediction, not its
        last token ``[SEP]``); an image model with outputs per position (a detector's queries) needs it named.
        Ignored for 2-D outputs of text models (classification heads); refused for image classifiers.
    attention_mask: tensor, optional
        ``[batch, seq]`` 1 for tokens, 0 for padding (left or right; left padding of a causal model gets
        matching ``position_ids``).
    composite: zennit.core.Composite, optional
        For the LRP methods: default :py:class:`~zennit_attn.composites.AttnLRPEpsilon` (language models) or
        :py:class:`~zennit_attn.composites.AttnLRPGamma` (vision transformers) for ``'attnlrp'``, and their
        CP-LRP counterparts for ``'cplrp'``. Without ``method=`` the composite's own method runs
        (:py:func:`~zennit_attn.methods.propagation.method_of`: CP-LRP for ``CPLRPEpsilon()``); a zennit-attn
        composite that applies the other method's product rule than the ``method`` given is refused
        (:py:func:`~zennit_attn.methods.propagation.check_composite`).
    method: str, optional
        A key of :py:data:`zennit_attn.methods.registry.METHODS`: ``'attnlrp'`` (default without ``composite=``),
        ``'cplrp'``, ``'palrp'`` (PA-LRP: AttnLRP with the position encodings as inputs, their relevance in
        ``explanation.position_relevance``, :py:mod:`zennit_attn.rules.positions`), ``'attnlrp_late'`` (AttnLRP with
        the attention probabilities constant in the later half of the blocks,
        :py:class:`~zennit_attn.composites.AttnLRPLateEpsilon`),
        ``'input_x_gradient'``, ``'integrated_gradients'``, ``'smoothgrad'``, ``'attention_rollout'``,
        ``'grad_attention_rollout'``, ``'gradcam'``, ``'atman'``, ``'kernelshap'``, ``'random'``.
    model_kwargs: dict, optional
        Passed on to the model's forward (e.g. ``token_type_ids``, ``decoder_attention_mask``).
    decoder_input_ids: tensor, optional
        For encoder-decoder models (T5): the decoder input, default the decoder start token for a generating model
        (``...ForConditionalGeneration``); a question-answering or classification head needs it (the input shifted
        right, as its forward makes it from ``input_ids``). Relevance is returned for encoder and decoder tokens.
    tokenizer: optional
        The model's Hugging Face tokenizer: needed for text input, and stored on the explanation
        (``explanation.tokenizer``) for :py:meth:`~zennit_attn.Explanation.show`, ``to_html``, ``save`` and
        ``tokens``.
    checkpointing: bool
        Recompute each transformer block in the backward pass instead of keeping its activations (non-reentrant
        :py:func:`torch.utils.checkpoint.checkpoint` per block, see :py:mod:`zennit_attn.canonizers.checkpointing`): the
        same relevance, with saved activations growing with layers x sequence x hidden instead of with all activations,
        for about one more forward pass. For the methods with a backward pass (``METHODS[name].backward``, see
        :py:class:`~zennit_attn.methods.registry.Method`); refused for the others and for ``condition=`` and
        :py:class:`~zennit_attn.latent.Neuron` targets. With ``latent=`` the recorded sites' activations are kept as
        well.
    latent: str or sequence of str, optional
        Also record latent relevance in the same backward pass (paper section 3.5), at sites of
        :py:data:`zennit_attn.latent.SITES` (``'mlp'``, ``'attention'``, ``'residual'``, ``'query'``, ``'key'``,
        ``'value'``), into ``explanation.latent`` (:py:class:`zennit_attn.latent.Latent`); ``exp.relevance`` is
        unchanged. For the methods of one forward and one backward pass (``METHODS[name].latent``: ``'attnlrp'``,
        ``'cplrp'`` and ``'input_x_gradient'``).
    latent_reduce: None or 'sum'
        ``'sum'`` keeps only the sum over positions of the latent relevance (long inputs).
    condition: Neuron or list, optional
        Conditional relevance (CRP): the input relevance that flows through the given neurons only; a list of
        conditions (each a :py:class:`~zennit_attn.latent.Neuron` or a list of Neurons of one site and layer) gives
        one row per input row and condition (row ``r * conditions + c``), ``logit`` holding the relevance each
        condition receives; ``latent`` is then that of the input rows (the unconditional pass). Costs one more
        forward and backward pass (all conditions of one site and layer batched). See
        :py:mod:`zennit_attn.latent.targets`.
    contrast: int, str, sequence, tensor or 'runner-up', optional
        Explain the target's logit minus the contrast token's ("why ' Paris' rather than ' London'?") in one
        backward pass: a token id (or, with ``tokenizer``, a one-token text) for all rows, one per row, or one per
        ``(position, token)`` pair; ``'runner-up'``: the most likely token other than the target at each explained
        position. Relevance is linear in the initial relevance, so for LRP, Input x Gradient and the other linear
        methods it is the target's relevance minus the contrast's (with images, the pixels' too).
        ``explanation.contrast`` holds the contrast tokens, ``explanation.logit`` the difference. Not with a
        callable or Neuron target.
    images: image or list of images, optional
        With ``processor``: explain a vision-language model (LLaVA, Qwen2-VL) or an image-text similarity model
        (CLIP) on text and images at once (:py:mod:`zennit_attn.inputs.vision_language`). ``input_ids`` is then the text
        (one text holding the processor's image token once per image; for CLIP one text or several, each paired
        with the image or with its own image). The result is a
        :py:class:`~zennit_attn.results.explanation.MultimodalExplanation`: relevance per text token and per pixel of
        each image (and per patch); for LRP the text and image relevance of a row sum to its explained logit minus what
        biases absorb. CLIP rows explain their own (text, image) similarity score (no ``target`` or ``contrast``),
        each exactly as the pair alone: SigLIP's texts, whose last position it pools, are padded to the length it
        was trained with (64 tokens), alone as in a batch, and their pads keep their relevance. LRP methods only;
        ``contrast`` and ``checkpointing`` work as for text, ``latent``, ``latent_reduce``, ``condition`` and Neuron
        targets are refused (latent sites are read in one stack of blocks; these models run two).
    processor: optional
        The model's Hugging Face processor (``AutoProcessor.from_pretrained(path)``): turns the text and images
        into ``input_ids``, ``pixel_values`` and the model's further fields, passed to the model except what is not
        an input of the explained forward pass (a loss's ``labels``, fields the forward does not take:
        :py:func:`~zennit_attn.inputs.vision_language.inputs.model_inputs`); a processor that is not the model's is
        refused, naming both (:py:func:`~zennit_attn.inputs.vision_language.inputs.check_processor`). Its tokenizer is
        stored on the explanation. Instead of the text and ``images``, ``input_ids`` may be what the processor
        returned (a mapping with ``pixel_values``, e.g. from ``processor.apply_chat_template(..., tokenize=True,
        return_dict=True)``, or a prefix of a generated answer, as :py:func:`~zennit_attn.explain_generation` passes
        it): it is used as it is (every field passed to the model) and explained as with images; ``processor`` is
        then optional (it gives the tokenizer and the image normalisation of the overlays; without it,
        ``tokenizer=`` may give the tokenizer).
    objective: str
        What is explained of the target's scores (:py:data:`~zennit_attn.inputs.objectives.OBJECTIVES`):
        ``'logit'`` (default), ``'log_probability'``, the target's log-softmax (of every ``(position, token)`` pair:
        a whole answer's log-probability, as context attribution measures it,
        :py:func:`~zennit_attn.workflows.sources.explain_sources`; for LRP its relevance sums to the log-probability
        plus the prediction's entropy and vanishes as the probability approaches 1,
        :py:class:`~zennit_attn.inputs.objectives.LogProbability`), or ``'log_odds'``, ``log(p / (1 - p))``, which
        does not saturate (:py:class:`~zennit_attn.inputs.objectives.LogOdds`). Language models' text only; not with
        ``contrast``, a callable or a Neuron target.
    output: str, optional
        The field of the model's output to explain (:py:class:`~zennit_attn.inputs.task.OutputField`) where it is not
        ``logits`` (else ``last_hidden_state``): ``'start_logits'`` or ``'end_logits'`` of a question-answering head,
        whose scores per position are explained as a classifier's (``target`` the position, default the highest);
        ``'pooler_output'``; a detector's ``'pred_boxes'`` (``position`` the query, ``target`` the coordinate). Not
        with ``images=`` (vision-language models).
    **params
        Hyperparameters of the method (see its documentation in :py:mod:`zennit_attn.methods.registry`), checked by
        :py:func:`~zennit_attn.methods.registry.check_params` before the model is run.

    Returns
    -------
    Explanation, ImageExplanation or MultimodalExplanation

    Raises
    ------
    ValueError
        For an unknown method, a parameter value out of its range, ``composite=`` for a method that is not LRP or
        one that applies another LRP method's product rule,
        ``checkpointing=True`` for a method without a backward pass, and bad input (see
        :py:mod:`zennit_attn.inputs.checks`).
    TypeError
        For a parameter the method does not take.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            f'model must be a torch.nn.Module (a Hugging Face model, a timm model or a module of your own), got '
            f'{type(model).__name__}: a pipeline holds its model as .model'
        )
    method = method_of(method, composite)
    entry, params = _checked_method(method, composite, checkpointing, params)
    if _with_images(input_ids, images, processor):
        if output is not None:
            raise ValueError(f'output={output!r} is for models explained at their text or pixels alone')
        if objective != 'logit':
            raise ValueError(f'objective={objective!r} is for text: text and images explain the logit')
        text_arguments = dict(
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            tokenizer=tokenizer,
            checkpointing=checkpointing,
            latent=latent,
            latent_reduce=latent_reduce,
            condition=condition,
            contrast=contrast,
        )
        return _explain_multimodal(
            model, input_ids, images, processor, target, position, method, entry, params, model_kwargs, text_arguments
        )
    input_ids, target, chat = _text_input(model, input_ids, target, tokenizer)
    position = _masked_position(model, input_ids, position, tokenizer)
    _check_inside_target(target, objective, contrast, condition, checkpointing)
    target, objective = _objective(tokenizer, target, contrast, objective)
    task = make_task(model, input_ids, position, attention_mask, model_kwargs, decoder_input_ids)
    task = task.with_objective(objective)
    if output is not None:
        task = task.with_readout(OutputField(output))
    latent_request = _LatentRequest(latent, latent_reduce, condition)
    explanation = _run(entry, task, position, target, params, latent_request, checkpointing)
    return _with_text(explanation, tokenizer, chat)


def _checked_method(method: str, composite, checkpointing, params: dict) -> tuple:
    """``(entry, params)``: the method's registry entry and its checked parameters (``composite`` among them), after
    refusing an unknown method, a parameter it does not take or out of its range, and ``checkpointing=`` that it does
    not support (:py:func:`_check_checkpointing`)."""
    if composite is not None:
        params['composite'] = composite
    params = check_params(method, params)
    entry = METHODS[method]
    _check_checkpointing(checkpointing, method, entry)
    return entry, params


def _with_images(input_ids, images, processor) -> bool:
    """Whether :py:func:`explain` explains text and images (``images=``, ``processor=`` or a processor's output with
    ``pixel_values``)."""
    return images is not None or processor is not None or has_pixels(input_ids)


def _check_inside_target(target, objective: str, contrast, condition, checkpointing: bool) -> None:
    """Refuse what does not combine with a backward pass that starts inside the model: a Neuron target with an
    objective other than the logit or with ``contrast=``, and a Neuron target or ``condition=`` with
    ``checkpointing=True``."""
    if isinstance(target, Neuron) and objective != 'logit':
        raise ValueError(f'objective={objective!r} is a function of the logits; a Neuron target explains an activation')
    if isinstance(target, Neuron) and contrast is not None:
        raise ValueError(
            'contrast= compares two output tokens; a Neuron target explains an activation inside the '
            'model: leave out contrast=, or explain a token target'
        )
    if checkpointing and (condition is not None or isinstance(target, Neuron)):
        raise ValueError(
            'condition= and Neuron targets start the backward pass inside the model, at tensors that '
            'checkpointing=True recomputes: use one or the other (latent= works with checkpointing)'
        )


@dataclasses.dataclass(frozen=True)
class _LatentRequest:
    """``latent=``, ``latent_reduce=`` and ``condition=`` of :py:func:`explain`."""

    sites: object = None
    reduce: str | None = None
    condition: object = None

    @property
    def asked(self) -> bool:
        return self.sites is not None or self.reduce is not None or self.condition is not None


def _run(entry, task, position, target, params: dict, latent: _LatentRequest, checkpointing: bool):
    """The method on the task (with per-block checkpointing if asked): through
    :py:func:`~zennit_attn.latent.targets.explain_latent` for latent relevance, conditions and Neuron targets."""
    with checkpointed(task.model) if checkpointing else contextlib.nullcontext():
        if latent.asked or isinstance(target, Neuron):
            return explain_latent(entry, task, position, target, params, latent.sites, latent.reduce, latent.condition)
        return entry.function(task, position=position, target=target, **params)


def _with_text(explanation, tokenizer, chat):
    """The explanation with the tokenizer stored (for its tokens and views) and a chat template's tokens marked."""
    if tokenizer is not None and isinstance(explanation, Explanation):
        explanation = dataclasses.replace(explanation, tokenizer=tokenizer)
    if chat is not None:
        explanation = dataclasses.replace(explanation, template=chat.template.to(explanation.input_ids.device))
    return explanation


def _check_checkpointing(checkpointing, method: str, entry) -> None:
    """Refuse ``checkpointing=`` that is not a bool, or True for a method without a backward pass."""
    if not isinstance(checkpointing, bool):
        raise TypeError(f'checkpointing must be True or False, got {checkpointing!r}')
    if checkpointing and not entry.backward:
        raise ValueError(
            f'checkpointing=True saves memory of a backward pass, which {method!r} does not do; it '
            f'applies to {", ".join(name for name, other in METHODS.items() if other.backward)}'
        )


def _text_input(model, input_ids, target, tokenizer) -> tuple:
    """``(input_ids, target, chat)`` of :py:func:`explain` on a language model: a conversation rendered by the chat
    template (``chat`` its :py:func:`~zennit_attn.inputs.chat.encode_chat`; an answer that ends it becomes the
    target), texts tokenised by :py:func:`encode_texts` (padded with the model's pad token where the tokenizer has
    none), anything else as it is (``chat`` None)."""
    if is_conversation(input_ids):
        chat = encode_chat(tokenizer, input_ids)
        if chat.answer:
            if target is not None:
                raise ValueError(
                    "the conversation ends with the assistant's answer, which is explained: leave out "
                    "target=, or leave out the answer's turn to explain a next token of your choice"
                )
            target = chat.answer
        return chat.input_ids, target, chat
    if tokenizer is not None and _is_texts(input_ids):
        return encode_texts(tokenizer, input_ids, model_pad_token(model)), target, None
    return input_ids, target, None


def _masked_position(model, input_ids, position, tokenizer):
    """``position``, where it is the default (-1, None), as each row's mask token if ``tokenizer`` has one and every
    row holds it exactly once: a masked language model is explained at the prediction it makes there, not at its last
    token (``[SEP]``). Encoder-decoder models (whose position is a decoder position) and other inputs keep it."""
    mask_id = getattr(tokenizer, 'mask_token_id', None)
    if mask_id is None or not default_position(position):
        return position
    if is_encoder_decoder(model):
        return position
    ids = input_ids.get('input_ids') if isinstance(input_ids, (dict, BatchEncoding)) else input_ids
    if isinstance(ids, (list, tuple)):
        try:
            ids = torch.as_tensor(ids)
        except (TypeError, ValueError, RuntimeError):  # ragged or not numbers: checked later
            return position
    if not isinstance(ids, torch.Tensor) or ids.dim() not in (1, 2) or ids.is_floating_point():
        return position
    hits = (ids if ids.dim() == 2 else ids[None]) == mask_id
    if not bool((hits.sum(1) == 1).all()):
        return position
    return hits.int().argmax(1)


def _objective(tokenizer, target, contrast, objective: str = 'logit') -> tuple:
    """``(target, objective)``: ``target`` and ``contrast`` as token ids (a one-token text with ``tokenizer``;
    ``'runner-up'`` stays), and the objective they explain (:py:func:`~zennit_attn.inputs.objectives.objective_for`)."""
    target = token_ids(tokenizer, target, 'target')
    if not (isinstance(contrast, str) and contrast == RUNNER_UP):
        contrast = token_ids(tokenizer, contrast, 'contrast')
    return objective_for(target, contrast, objective)


def _explain_multimodal(
    model, text, images, processor, target, position, method, entry, params, model_kwargs, text_arguments: dict
) -> MultimodalExplanation:
    """:py:func:`explain` on text and images (see its ``images`` and ``processor``), or on what the processor
    returned for them (a mapping with ``pixel_values``).

    ``contrast=`` and ``checkpointing=`` work as for text (a vision-language model's contrast is linear in the
    initial relevance, pixels included; checkpointing recomputes the blocks of the vision tower and of the language
    model); the arguments that do not apply are refused, each with its reason."""
    encoded = has_pixels(text)
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f'model must be a torch.nn.Module, got {type(model).__name__}')
    similarity = is_similarity_model(model)
    _refuse_with_images(model, processor, encoded, target, text_arguments)
    contrast = text_arguments['contrast']
    if similarity and (target is not None or contrast is not None):
        raise ValueError(
            f"{type(model).__name__} scores (text, image) pairs: each row explains its own pair's similarity score; "
            f'leave out {"target=" if target is not None else "contrast="} (to compare two pairs, '
            'explain both and subtract the explanations: the relevance is linear in the score)'
        )
    if not entry.lrp:
        raise ValueError(
            f'explain() with images runs the LRP methods (attnlrp, cplrp), which give text and pixel '
            f'relevance in one backward pass; {method!r} is not one'
        )
    if encoded:
        if images is not None:
            raise ValueError(
                "the input already holds pixel_values (the processor's output): leave out images=, or "
                'pass the text with images='
            )
        encoding = text
    else:
        encoding = encode_multimodal(processor, text, images, similarity, text_length(model) if similarity else None)
    task = make_multimodal_task(model, encoding, model_kwargs, processor)
    tokenizer = processor.tokenizer if processor is not None else text_arguments['tokenizer']
    target, objective = _objective(tokenizer, target, contrast)
    task = task.with_objective(objective)
    with checkpointed(model) if text_arguments['checkpointing'] else contextlib.nullcontext():
        explanation = entry.function(task, position=position, target=target, **params)
    return dataclasses.replace(explanation, tokenizer=tokenizer)


def _refuse_with_images(model, processor, encoded: bool, target, text_arguments: dict) -> None:
    """Refuse the arguments of :py:func:`explain` that do not apply with images, each with its reason: the
    attention mask, decoder inputs and a tokenizer (the processor makes the inputs; a tokenizer is taken only for
    a processor's output given without the processor), and latent relevance or a Neuron target (read in one stack of
    blocks, where these models run two)."""
    reasons = {
        'attention_mask': "the processor makes the attention mask (to give your own, pass the processor's output "
        'with it as input_ids)',
        'decoder_input_ids': 'it explains decoder-only vision-language models and similarity models, whose text is '
        'the whole input',
        'tokenizer': "the processor's tokenizer is the one that encodes the text (processor.tokenizer)",
    }
    for key, reason in reasons.items():
        value = text_arguments[key]
        if key == 'tokenizer' and encoded and processor is None:
            continue  # the tokenizer of a processor's output, for the explanation's tokens
        if value is not None:
            raise ValueError(f'{key}= does not apply to explain() with images: {reason}; leave it out')
    latent = [key for key in ('latent', 'latent_reduce', 'condition') if text_arguments[key] is not None]
    if latent or isinstance(target, Neuron):
        paths = ', '.join(repr(path) for path, _ in block_stacks(model))
        asked = ', '.join(f'{key}=' for key in latent) or 'a Neuron target'
        raise ValueError(
            f'{asked} with images: latent relevance is read at the sites of one stack of transformer '
            f"blocks (zennit_attn.latent), and with pixel inputs {type(model).__name__} runs the vision tower's "
            f"blocks and the text model's (its stacks: {paths}); explain the text alone (tokenizer=) for the "
            'latent relevance of a language model, or leave it out'
        )
