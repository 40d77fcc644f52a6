"""AttnLRP and CP-LRP as captum attribution methods.

:py:class:`AttnLRP` and :py:class:`CPLRP` are captum ``Attribution`` objects for Hugging Face language models: on
their own (``AttnLRP(model).attribute(input_ids, target=token)``, relevance of the word embeddings, as captum's layer
methods return it) and inside captum's :py:class:`captum.attr.LLMGradientAttribution`, so that captum users get
AttnLRP with captum's :py:class:`~captum.attr.LLMAttributionResult` (``seq_attr``, ``token_attr`` and its plots)::

    from captum.attr import LLMGradientAttribution, TextTokenInput
    from zennit_attn.integrations.captum import AttnLRP

    llm_attr = LLMGradientAttribution(AttnLRP(model), tokenizer)
    result = llm_attr.attribute(TextTokenInput('The Eiffel Tower is located in the city of', tokenizer),
                                target=' Paris')
    result.plot_token_attr()

Both run :py:data:`zennit_attn.methods.registry.METHODS` (``'attnlrp'``, ``'cplrp'``) on the same task as
:py:func:`~zennit_attn.explain`, so their numbers are those of ``explain()``: the relevance of each target token is
``explain(model, prefix_ids, target=token).relevance`` with the prefix the prompt and the target tokens before it.
What is explained is the target token's **logit**, the initial relevance of LRP (the paper's setting), not the
log-probability that captum's gradient methods explain in ``LLMGradientAttribution``.

They subclass captum's :py:class:`~captum.attr.LayerGradientXActivation` at the word-embedding layer (LRP is a
modified gradient times the input, and ``LLMGradientAttribution`` accepts this family of methods); nothing of captum
is patched. Captum arguments that have no meaning for LRP (``baselines``, ``n_steps``, ...) are refused.
"""

from __future__ import annotations

import numbers
from typing import Any

import torch
from zennit.core import Composite

try:
    from captum.attr import InterpretableInput, LayerGradientXActivation
except ImportError as error:  # the extra, named: a bare "No module named 'captum'" does not say what to install
    raise ImportError(
        "zennit_attn.integrations.captum needs captum: pip install 'zennit-attn[captum]' (or pip install captum)"
    ) from error

from ..core.modules import forward_parameters
from ..inputs.checks import is_image_model
from ..inputs.task import TokenTask
from ..methods.registry import METHODS

__all__ = ['AttnLRP', 'CPLRP', 'LRPAttribution']


def _token_target(target):
    """``target`` if it names token ids (an int, a list of ints, one per row, or an integer tensor), else a
    TypeError that says what to pass."""
    if target is None or (isinstance(target, numbers.Integral) and not isinstance(target, bool)):
        return target
    if isinstance(target, torch.Tensor) and not (
        target.is_floating_point() or target.is_complex() or target.dtype == torch.bool
    ):
        return target
    if (
        isinstance(target, list)
        and target
        and all(isinstance(item, numbers.Integral) and not isinstance(item, bool) for item in target)
    ):
        return target
    if isinstance(target, str):
        raise TypeError(
            f'target must be a token id, got the text {target!r}: pass its id '
            '(tokenizer.encode(text, add_special_tokens=False)), or explain text targets with '
            'captum.attr.LLMGradientAttribution(AttnLRP(model), tokenizer).attribute(TextTokenInput(...), '
            'target=text)'
        )
    if isinstance(target, tuple) or (
        isinstance(target, list) and any(isinstance(item, (tuple, list)) for item in target)
    ):
        raise TypeError(
            f"target must be a token id (or one per row), got {target!r}: captum's tuple targets index "
            'an output tensor; AttnLRP explains the logit of token target at position= (default -1, '
            'the last token): pass target=token and position=index'
        )
    raise TypeError(
        f'target must be a token id, a list of token ids (one per row) or an integer tensor, got '
        f'{type(target).__name__} {target!r}'
    )


class LRPAttribution(LayerGradientXActivation):
    """An LRP method of :py:data:`zennit_attn.methods.registry.METHODS` as a captum layer attribution at the word
    embeddings of a Hugging Face language model. Use :py:class:`AttnLRP` or :py:class:`CPLRP`.

    Parameters
    ----------
    model: torch.nn.Module
        A Hugging Face language model in eval mode (``...ForCausalLM``, ``...ForSequenceClassification``,
        ``...ForMaskedLM`` or a base model), as :py:func:`~zennit_attn.explain` takes it.
    composite: zennit.core.Composite, optional
        The LRP composite (default: that of the method, :py:class:`~zennit_attn.composites.AttnLRPEpsilon` or
        :py:class:`~zennit_attn.composites.CPLRPEpsilon`).

    Raises
    ------
    TypeError
        For a model that is not a language model with word embeddings (image classifiers: use
        :py:func:`~zennit_attn.explain`), or a composite that is not a zennit composite.
    ValueError
        For a composite with PA-LRP's positions (``positions=True``): not an attribution of the word embeddings.
    """

    #: the name of the method in :py:data:`zennit_attn.methods.registry.METHODS`
    method: str = ''

    def __init__(self, model: torch.nn.Module, composite: Composite | None = None):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(
                f'{type(self).__name__} explains a torch.nn.Module (a Hugging Face language model), got '
                f'{type(model).__name__}'
            )
        embedding = model.get_input_embeddings() if hasattr(model, 'get_input_embeddings') else None
        if not isinstance(embedding, torch.nn.Module):
            raise TypeError(
                f'{type(self).__name__} needs a language model with word embeddings '
                f'(get_input_embeddings()); {type(model).__name__} has none'
            )
        if is_image_model(model):
            raise TypeError(
                f'{type(self).__name__} explains language models at their word embeddings; '
                f'{type(model).__name__} classifies images: use zennit_attn.explain(model, pixels)'
            )
        if getattr(composite, 'positions', False):
            raise ValueError(
                f"{type(self).__name__} attributes the word embeddings: PA-LRP's positions (a composite with "
                "positions=True) have no place there, and the tokens' share it leaves them is not "
                f"{self.method}'s; use zennit_attn.explain(model, ids, method='palrp') for positions and tokens"
            )
        self.params = METHODS[self.method].check({} if composite is None else {'composite': composite})
        super().__init__(model, embedding, multiply_by_inputs=True)
        #: the explained model (``forward_func`` is replaced by ``LLMGradientAttribution``'s wrapper of it)
        self.model = model

    def attribute(
        self,
        inputs,
        target=None,
        additional_forward_args: Any = None,
        attribute_to_layer_input: bool = False,
        *,
        position: int = -1,
        attention_mask: torch.Tensor | None = None,
        **unsupported,
    ) -> torch.Tensor:
        """Relevance of the word embeddings for the logit of token ``target`` at ``position``.

        Parameters
        ----------
        inputs: torch.Tensor (or a tuple of one)
            ``[batch, seq]`` (or ``[seq]``) token ids, or ``[batch, seq, hidden]`` word embeddings as
            ``model.get_input_embeddings()`` returns them (relevance is then that of these embeddings). Inside
            ``LLMGradientAttribution``: captum's interpretable tensor of the ``TextTokenInput``.
        target: int, list of int, integer tensor or None
            The token (one for all rows or one per row) whose logit is explained; None: the argmax. Inside
            ``LLMGradientAttribution`` the target tokens are captum's (its ``target=``), each explained after the
            prompt and the target tokens before it.
        additional_forward_args: tuple, optional
            Further positional arguments of ``model.forward`` after ``input_ids`` (``attention_mask``, ...), as for
            any captum method.
        attribute_to_layer_input: bool
            Must be False: the word-embedding layer's input is token ids, which carry no relevance.
        position: int
            The explained position; -1 (default): the last non-padding token of each row.
        attention_mask: torch.Tensor, optional
            ``[batch, seq]`` the attention mask by name (beyond captum's arguments), for a caller that holds it apart
            from the model's positional arguments: ``additional_forward_args`` are the arguments of ``model.forward``
            in its order, where the second is ``attention_mask`` for most models but the cache for GPT-2, Falcon and
            Bloom and ``position_ids`` for RecurrentGemma (inseq's steps pass it so).

        Returns
        -------
        torch.Tensor
            ``[batch, seq, hidden]`` relevance of the word embeddings (``.sum(-1)`` is ``explain().relevance``).

        Raises
        ------
        TypeError
            For captum arguments LRP does not take (``baselines``: LRP needs no reference input), a target that is
            not a token id, or inputs that are neither ids nor embeddings.
        ValueError
            For ``attribute_to_layer_input=True`` and bad input (see :py:mod:`zennit_attn.inputs.checks`).
        """
        name = type(self).__name__
        if unsupported:
            why = (
                ' LRP needs no baseline: it distributes the explained logit itself in one backward pass '
                "(captum's LayerIntegratedGradients is the method with baselines)."
                if 'baselines' in unsupported
                else ''
            )
            raise TypeError(
                f'{name}.attribute() takes no argument(s) {sorted(unsupported)}; it takes inputs, '
                f'target, additional_forward_args and position.{why}'
            )
        if attribute_to_layer_input:
            raise ValueError(
                f'{name} attributes to the word embeddings (the output of the embedding layer); its '
                'input is token ids, which carry no relevance: attribute_to_layer_input must be False'
            )
        if isinstance(inputs, tuple):
            if len(inputs) != 1:
                raise TypeError(f'{name} takes one input tensor (ids or word embeddings), got a tuple of {len(inputs)}')
            inputs = inputs[0]
        if not isinstance(inputs, torch.Tensor):
            raise TypeError(
                f'{name} takes a tensor of token ids [batch, seq] or word embeddings [batch, seq, '
                f'hidden], got {type(inputs).__name__}'
            )
        if self.forward_func is not self.model:
            return self._attribute_llm(inputs, target, additional_forward_args, position)
        kwargs = self._forward_kwargs(additional_forward_args)
        if attention_mask is not None and 'attention_mask' in kwargs:
            raise TypeError(f'{name}.attribute() got the attention mask twice: by name and in additional_forward_args')
        attention_mask = kwargs.pop('attention_mask', attention_mask)
        decoder_input_ids = kwargs.pop('decoder_input_ids', None)
        return self._relevance(inputs, _token_target(target), position, attention_mask, kwargs, decoder_input_ids)

    def _forward_kwargs(self, additional_forward_args) -> dict:
        """captum's ``additional_forward_args`` as keyword arguments of ``model.forward`` (after its input)."""
        if additional_forward_args is None:
            return {}
        args = additional_forward_args if isinstance(additional_forward_args, tuple) else (additional_forward_args,)
        names = list(forward_parameters(self.model))[1:]
        if len(args) > len(names):
            raise TypeError(
                f'{len(args)} additional_forward_args, but {type(self.model).__name__}.forward takes '
                f'{len(names)} arguments after its input'
            )
        kwargs = {key: value for key, value in zip(names, args) if value is not None}
        if 'inputs_embeds' in kwargs:
            raise TypeError('pass word embeddings as inputs, not as an additional_forward_arg')
        return kwargs

    def _attribute_llm(self, inputs: torch.Tensor, target, additional_forward_args, position) -> torch.Tensor:
        """The call of captum's ``LLMGradientAttribution``: explain target token ``index`` after the prompt and the
        target tokens before it."""
        name = type(self).__name__
        args = additional_forward_args
        if not (
            isinstance(args, tuple)
            and len(args) == 3
            and isinstance(args[0], InterpretableInput)
            and isinstance(args[1], torch.Tensor)
            and isinstance(args[2], int)
        ):
            raise TypeError(
                f"{name}.forward_func was replaced by something other than the model; only captum's "
                'LLMGradientAttribution does that (it passes (input, target_tokens, index) as '
                'additional_forward_args). Explain the model itself: AttnLRP(model).attribute(...)'
            )
        if target is not None or position != -1:
            raise TypeError(
                f'{name} inside LLMGradientAttribution explains the target tokens that '
                'LLMGradientAttribution.attribute(inp, target=...) is given, each at the end of its '
                'prefix: target= and position= are not taken here'
            )
        inp, target_tokens, index = args
        if target_tokens.is_floating_point() or target_tokens.dim() != 1:
            raise TypeError(
                f'the target tokens must be a 1-D tensor of token ids, got {target_tokens.dtype} '
                f'{tuple(target_tokens.shape)}'
            )
        ids = inp.to_model_input(inputs)
        if not isinstance(ids, torch.Tensor):
            raise TypeError(
                f'{name} explains text inputs given as token ids (captum TextTokenInput); '
                f'{type(inp).__name__} gives {type(ids).__name__}'
            )
        ids = ids.to(self.model.device if hasattr(self.model, 'device') else inputs.device)
        if index:
            ids = torch.cat([ids, target_tokens[:index].to(ids)[None].expand(ids.shape[0], -1)], 1)
        return self._relevance(ids, int(target_tokens[index]), -1, None, {}, None)

    def _relevance(
        self, inputs: torch.Tensor, target, position, attention_mask, model_kwargs: dict, decoder_input_ids
    ) -> torch.Tensor:
        """``[batch, seq, hidden]`` relevance of :py:data:`METHODS` ``[self.method]`` on the task of ``inputs``."""
        embeddings = None
        if inputs.is_floating_point():
            if inputs.dim() == 2:
                inputs = inputs[None]
            hidden = self.layer.weight.shape[-1] if hasattr(self.layer, 'weight') else inputs.shape[-1]
            if inputs.dim() != 3 or inputs.shape[-1] != hidden:
                raise ValueError(f'word embeddings must be [batch, seq, {hidden}], got {tuple(inputs.shape)}')
            embeddings = inputs.detach()
            # the task's ids only give the shape: relevance is read at the given embeddings
            inputs = torch.zeros(inputs.shape[:2], dtype=torch.long, device=inputs.device)
        task = TokenTask(self.model, inputs, attention_mask, model_kwargs, decoder_input_ids)
        if task.lookups is not None and task.lookups.tables:
            raise ValueError(
                f'{type(self.model).__name__} looks its token ids up in {task.lookups.tables[0][0]!r} '
                'besides the word embeddings: that relevance has no place in an attribution of the '
                'embeddings; use zennit_attn.explain (its relevance per token includes it)'
            )
        if embeddings is not None:
            if task.lookups is not None:
                raise ValueError(
                    f'{type(self.model).__name__} is explained on its token ids ({task.ids_reason}): '
                    'pass token ids (captum TextTokenInput), not embeddings'
                )
            task.inputs = embeddings
        explanation = METHODS[self.method](task, position=position, target=target, **self.params)
        return explanation.embedding_relevance

    def has_convergence_delta(self) -> bool:
        """LRP reports no convergence delta (see :py:func:`zennit_attn.conservation` for its conservation)."""
        return False


class AttnLRP(LRPAttribution):
    """AttnLRP (Achtibat et al., ICML 2024), ``explain(..., method='attnlrp')``, as a captum attribution method;
    see :py:class:`LRPAttribution` and the module documentation."""

    method = 'attnlrp'


class CPLRP(LRPAttribution):
    """CP-LRP (Ali et al. 2022), ``explain(..., method='cplrp')``, as a captum attribution method; see
    :py:class:`LRPAttribution` and the module documentation."""

    method = 'cplrp'
