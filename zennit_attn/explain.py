"""``explain()``: relevance per input token (or pixel) of a model's prediction in one call."""
from __future__ import annotations

import inspect
from typing import Sequence

import torch
from zennit.core import Composite

from .methods import METHODS
from .task import Explanation, ImageExplanation, TargetLike, make_task

__all__ = ['explain', 'Explanation', 'ImageExplanation', 'TargetLike']


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
    input_ids: tensor, sequence of int or BatchEncoding
        ``[batch, seq]`` (or ``[seq]``) token ids, or what the tokenizer returns (its ``attention_mask`` and other
        fields are used). For an image classifier: ``[batch, channels, height, width]`` (or ``[channels, height,
        width]``) floating-point pixels as the model takes them.
    target: int, sequence of int, sequence of (int, int), tensor or None
        Output index to explain, one for all rows or one per row; None explains the argmax. A sequence of
        ``(position, token)`` pairs explains the sum of those logits (e.g. a whole generated answer) in one
        backward pass; ``position`` is then ignored.
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
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        hint = ('; configure LRP through composite=' if 'composite' in accepted else '')
        raise TypeError(f'{method} takes no parameter(s) {unknown}; it takes {accepted or "none"}{hint}')
    task = make_task(model, input_ids, position, attention_mask, model_kwargs, decoder_input_ids)
    return function(task, position=position, target=target, **params)
