"""``explain()``: relevance per input token (or pixel) of a model's prediction in one call."""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
from typing import Sequence

import torch
from transformers import BatchEncoding
from zennit.core import Composite

from .checkpointing import checkpointed
from .latent.sites import Neuron
from .latent.targets import explain_latent
from .methods import BACKWARD_METHODS, METHODS
from .task import Explanation, ImageExplanation, TargetLike, make_task

__all__ = ['explain', 'encode_texts', 'Explanation', 'ImageExplanation', 'TargetLike']


def _is_texts(value) -> bool:
    """A text, a list of texts, or an empty list (which :py:func:`encode_texts` refuses with a clear message)."""
    return isinstance(value, str) or (isinstance(value, (list, tuple)) and (
        not value or any(isinstance(item, str) for item in value)))


def encode_texts(tokenizer, texts) -> BatchEncoding:
    """Tokenise a text, or a list of texts padded to one length, as :py:func:`explain` does.

    A list is padded on the tokenizer's ``padding_side`` with its pad token, or, for tokenizers without one (GPT-2,
    Llama), with its end-of-sequence token, as Hugging Face users do with ``tokenizer.pad_token =
    tokenizer.eos_token`` (the tokenizer itself is not changed). Padding is masked by the ``attention_mask`` and gets
    no relevance, so the pad id does not matter.

    Parameters
    ----------
    tokenizer
        A Hugging Face tokenizer.
    texts: str or sequence of str

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
        pad = getattr(tokenizer, 'eos_token_id', None)
        if pad is None:
            raise ValueError('the tokenizer has no pad token and no end-of-sequence token to pad the texts with: set '
                             'one (tokenizer.pad_token = ...) or explain the texts one at a time')
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
    method: str = 'attnlrp',
    model_kwargs: dict | None = None,
    decoder_input_ids=None,
    tokenizer=None,
    checkpointing: bool = False,
    latent=None,
    latent_reduce: str | None = None,
    condition=None,
    **params,
) -> Explanation | ImageExplanation:
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
    input_ids: tensor, sequence of int, BatchEncoding, str or list of str
        ``[batch, seq]`` (or ``[seq]``) token ids, or what the tokenizer returns (its ``attention_mask`` and other
        fields are used), or, with ``tokenizer``, a text or a list of texts (tokenised by :py:func:`encode_texts`:
        a list is padded, with the end-of-sequence token where the tokenizer has no pad token). For an image
        classifier: ``[batch, channels, height, width]`` (or ``[channels, height, width]``) floating-point pixels as
        the model takes them.
    target: int, sequence of int, sequence of (int, int), tensor or None
        Output index to explain, one for all rows or one per row; None explains the argmax. A sequence of
        ``(position, token)`` pairs explains the sum of those logits (e.g. a whole generated answer) in one
        backward pass; ``position`` is then ignored. A :py:class:`~zennit_attn.latent.Neuron` explains the neuron's
        activation at ``position`` instead of a logit (for LRP the activation is the initial relevance;
        ``explanation.logit`` holds it).
    position: int, sequence of int, tensor or None
        For 3-D outputs, the sequence position to explain (a decoder position for encoder-decoder models).
        -1 (default) or None: the last non-padding token of each row. Ignored for 2-D outputs (classification
        heads); refused for image classifiers.
    attention_mask: tensor, optional
        ``[batch, seq]`` 1 for tokens, 0 for padding (left or right; left padding of a causal model gets
        matching ``position_ids``).
    composite: zennit.core.Composite, optional
        For the LRP methods: default :py:class:`~zennit_attn.composites.AttnLRPEpsilon` (language models) or
        :py:class:`~zennit_attn.composites.AttnLRPGamma` (vision transformers) for ``'attnlrp'``, and their
        CP-LRP counterparts for ``'cplrp'``.
    method: str
        A key of :py:data:`zennit_attn.methods.METHODS`: ``'attnlrp'`` (default), ``'cplrp'``, ``'input_x_gradient'``,
        ``'integrated_gradients'``, ``'smoothgrad'``, ``'attention_rollout'``, ``'grad_attention_rollout'``,
        ``'gradcam'``, ``'atman'``, ``'kernelshap'``, ``'random'``.
    model_kwargs: dict, optional
        Passed on to the model's forward (e.g. ``token_type_ids``, ``decoder_attention_mask``).
    decoder_input_ids: tensor, optional
        For encoder-decoder models (T5): the decoder input, default the decoder start token. Relevance is
        returned for encoder and decoder tokens.
    tokenizer: optional
        The model's Hugging Face tokenizer: needed for text input, and stored on the explanation
        (``explanation.tokenizer``) for :py:meth:`~zennit_attn.Explanation.show`, ``to_html``, ``save`` and
        ``tokens``.
    checkpointing: bool
        Recompute each transformer block in the backward pass instead of keeping its activations (non-reentrant
        :py:func:`torch.utils.checkpoint.checkpoint` per block, see :py:mod:`zennit_attn.checkpointing`): the same
        relevance, with saved activations growing with layers x sequence x hidden instead of with all activations,
        for about one more forward pass. For the methods with a backward pass (:py:data:`~zennit_attn.methods.
        BACKWARD_METHODS`); refused for the others and for ``condition=`` and :py:class:`~zennit_attn.latent.Neuron`
        targets. With ``latent=`` the recorded sites' activations are kept as well.
    latent: str or sequence of str, optional
        Also record latent relevance in the same backward pass (paper section 3.5), at sites of
        :py:data:`zennit_attn.latent.SITES` (``'mlp'``, ``'attention'``, ``'residual'``, ``'query'``, ``'key'``,
        ``'value'``), into ``explanation.latent`` (:py:class:`zennit_attn.latent.Latent`); ``exp.relevance`` is
        unchanged. For ``'attnlrp'``, ``'cplrp'`` and ``'input_x_gradient'``.
    latent_reduce: None or 'sum'
        ``'sum'`` keeps only the sum over positions of the latent relevance (long inputs).
    condition: Neuron or list, optional
        Conditional relevance (CRP): the input relevance that flows through the given neurons only; a list of
        conditions (each a :py:class:`~zennit_attn.latent.Neuron` or a list of Neurons of one site and layer) gives
        one row per input row and condition (row ``r * conditions + c``), ``logit`` holding the relevance each
        condition receives; ``latent`` is then that of the input rows (the unconditional pass). Costs one more
        forward and backward pass (all conditions of one site and layer batched). See
        :py:mod:`zennit_attn.latent.targets`.
    **params
        Hyperparameters of the method (see its documentation in :py:mod:`zennit_attn.methods`).

    Returns
    -------
    Explanation or ImageExplanation
    """
    if not isinstance(method, str) or method not in METHODS:
        raise ValueError(f'Unknown method {method!r}; known: {", ".join(METHODS)}')
    function = METHODS[method]
    accepted = [name for name in inspect.signature(function).parameters if name not in ('task', 'position', 'target')]
    if composite is not None:
        if 'composite' not in accepted:
            raise ValueError(f'composite= applies to the LRP methods (attnlrp, cplrp), not to {method!r}')
        params['composite'] = composite
    if not isinstance(checkpointing, bool):
        raise TypeError(f'checkpointing must be True or False, got {checkpointing!r}')
    if checkpointing and method not in BACKWARD_METHODS:
        raise ValueError(f'checkpointing=True saves memory of a backward pass, which {method!r} does not do; it '
                         f'applies to {", ".join(BACKWARD_METHODS)}')
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        hint = ('; configure LRP through composite=' if 'composite' in accepted else '')
        raise TypeError(f'{method} takes no parameter(s) {unknown}; it takes {accepted or "none"}{hint}')
    if tokenizer is not None and _is_texts(input_ids):
        input_ids = encode_texts(tokenizer, input_ids)
    task = make_task(model, input_ids, position, attention_mask, model_kwargs, decoder_input_ids)
    latent_request = latent is not None or condition is not None or latent_reduce is not None
    if checkpointing and (condition is not None or isinstance(target, Neuron)):
        raise ValueError('condition= and Neuron targets start the backward pass inside the model, at tensors that '
                         'checkpointing=True recomputes: use one or the other (latent= works with checkpointing)')
    with checkpointed(task.model) if checkpointing else contextlib.nullcontext():
        if latent_request or isinstance(target, Neuron):
            explanation = explain_latent(function, method, task, position, target, params, latent, latent_reduce,
                                         condition)
        else:
            explanation = function(task, position=position, target=target, **params)
    if tokenizer is not None and isinstance(explanation, Explanation):
        explanation = dataclasses.replace(explanation, tokenizer=tokenizer)
    return explanation
