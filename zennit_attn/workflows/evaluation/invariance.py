"""Implementation invariance: two functionally identical models written differently must get the same relevance
(Sundararajan et al. 2017's axiom, which "When LRP Diverges from Leave-One-Out in Transformers", You et al.,
BlackboxNLP 2025, arXiv 2510.18810, shows AttnLRP's uniform product rule can break).

The rewrites of a Llama-style model (attention modules with ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj`` and a
``scaling``), each on a deep copy (the model itself and its classes are not changed), are :py:data:`REWRITES`:

- ``'scaled_query_key'`` (:py:func:`scaled_query_key`): the query projection times ``c``, the key projection times
  ``1 / c``: every score ``q . k`` is the same, so is the model;
- ``'folded_scaling'`` (:py:func:`folded_scaling`): the attention's scaling ``1 / sqrt(d)`` folded into the query
  projection, the attention run with scaling 1;
- ``'fused_projections'`` (:py:func:`fused_projections`): a ``LlamaForCausalLM`` rewritten as Transformers'
  ``Phi3ForCausalLM``, the same architecture with one fused query/key/value projection and one fused gate/up
  projection (weights concatenated), which the engine explains as another model;
- ``'repeated_key_value_heads'`` (:py:func:`repeated_key_value_heads`): a ``LlamaForCausalLM`` with grouped-query
  attention as the same model with one key/value head per query head (each shared head's projection repeated).

:py:func:`implementation_invariance` checks that each rewrite gives the same output (float64, ``atol``; a rewrite that
does not is refused) and reports, per method, the largest difference of the token relevance from the original's.

What to expect. zennit-attn computes LRP as gradient x input with modified gradients at the non-linear operations
only (the product rule's ``1 / N`` at each product of ``N`` input-dependent factors, the identity rule at
element-wise non-linearities, normalisers detached; CP-LRP detaches the softmax's inputs and the MLP's gate): linear
operations (projections, constant scalings, concatenation and slicing of fused projections) pass the plain gradient,
and the relevance at the input is a function of which products and non-linearities there are, not of how the linear
maps around them are written. All four rewrites change linear maps only (a product ``(c q) . (k / c)`` has the same
terms as ``q . k``), so AttnLRP and CP-LRP are invariant to them up to rounding, as input x gradient is under any
exact rewrite (it depends on the function alone). The paper's violation needs a product of three input-dependent
factors associated differently (``(x1 x2) x3`` against ``x1 (x2 x3)``: the uniform rule gives ``x1`` a quarter of the
relevance in one and a half in the other), which linear attention admits (``(Q K^T) V = Q (K^T V)``) and softmax
attention does not. Where such a product is written both ways, neither AttnLRP nor CP-LRP is invariant: both apply
the uniform rule to products other than the softmax's inputs and the MLP's gate (the tests reproduce the paper's
Figure 1, relevance ``(6, 6, 12)`` against ``(12, 6, 6)`` for ``x = (2, 3, 4)``, with both composites).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import transformers

from ...explain import explain
from ...results.explanation import TargetLike

__all__ = [
    'REWRITES',
    'INVARIANCE_METHODS',
    'Invariance',
    'attention_modules',
    'scaled_query_key',
    'folded_scaling',
    'fused_projections',
    'repeated_key_value_heads',
    'rewritten',
    'implementation_invariance',
]

#: The rewrites of :py:func:`implementation_invariance`, by name.
REWRITES = ('scaled_query_key', 'folded_scaling', 'fused_projections', 'repeated_key_value_heads')
#: The methods it compares by default.
INVARIANCE_METHODS = ('attnlrp', 'cplrp', 'attnlrp_late', 'input_x_gradient')
_PROJECTIONS = ('q_proj', 'k_proj', 'v_proj', 'o_proj')


@dataclass
class Invariance:
    """The relevance of one rewrite of a model against the original's.

    Attributes
    ----------
    rewrite: str
        The rewrite's name (:py:data:`REWRITES`).
    output_difference: float
        The largest absolute difference of the two models' output scores on the input.
    difference: dict
        Method -> the largest absolute difference of the token relevance.
    scale: dict
        Method -> the largest absolute token relevance of the original.
    rtol: float
        The relative tolerance of :py:attr:`invariant`.
    """

    rewrite: str
    output_difference: float
    difference: dict[str, float]
    scale: dict[str, float]
    rtol: float

    @property
    def invariant(self) -> dict[str, bool]:
        """Method -> whether the relevance is the same up to rounding (``difference <= rtol * scale``)."""
        return {method: self.difference[method] <= self.rtol * self.scale[method] for method in self.difference}


def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The Llama-style attention modules of ``model``: those with ``q_proj``, ``k_proj``, ``v_proj`` and ``o_proj``
    linear layers and a float ``scaling``.

    Raises
    ------
    TypeError
        If there is none, or one normalises its queries or keys (``q_norm``, ``k_norm``: a scaled query would be
        normalised back).
    """
    found = [
        module
        for module in model.modules()
        if all(isinstance(getattr(module, name, None), torch.nn.Linear) for name in _PROJECTIONS)
        and isinstance(getattr(module, 'scaling', None), float)
    ]
    if not found:
        raise TypeError(
            f'{type(model).__name__} has no Llama-style attention (q_proj, k_proj, v_proj, o_proj and a scaling): the '
            'rewrites of implementation_invariance() apply to Llama-style models'
        )
    normed = [type(module).__name__ for module in found if hasattr(module, 'q_norm') or hasattr(module, 'k_norm')]
    if normed:
        raise TypeError(
            f'{normed[0]} normalises its queries or keys (q_norm, k_norm), which undoes a scaled projection: the '
            'rewrites apply to attention without query/key normalisation (Llama, Mistral, Qwen2)'
        )
    return found


def _scale(linear: torch.nn.Linear, factor: float) -> None:
    with torch.no_grad():
        linear.weight.mul_(factor)
        if linear.bias is not None:
            linear.bias.mul_(factor)


def scaled_query_key(model: torch.nn.Module, factor: float = 2.0) -> torch.nn.Module:
    """A deep copy of ``model`` whose query projections are multiplied by ``factor`` and key projections by
    ``1 / factor`` (weights and biases; rotary embeddings are linear in the query and key, so every score is the
    same)."""
    if not factor or not float(factor) == float(factor):
        raise ValueError(f'factor must be a non-zero number, got {factor!r}')
    rewritten = copy.deepcopy(model)
    for module in attention_modules(rewritten):
        _scale(module.q_proj, factor)
        _scale(module.k_proj, 1 / factor)
    return rewritten


def folded_scaling(model: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of ``model`` whose attention scaling is folded into the query projections (multiplied by it) and
    set to 1 on each attention module of the copy."""
    rewritten = copy.deepcopy(model)
    for module in attention_modules(rewritten):
        _scale(module.q_proj, module.scaling)
        module.scaling = 1.0
    return rewritten


def fused_projections(model: torch.nn.Module) -> torch.nn.Module:
    """``model``, a ``LlamaForCausalLM``, as an equivalent ``Phi3ForCausalLM`` (fused ``qkv_proj`` and
    ``gate_up_proj``, the same weights concatenated; the same attention implementation, dtype and device).

    Raises
    ------
    TypeError
        If ``model`` is not a ``LlamaForCausalLM``, or has what Phi-3 does not (biases of the projections, another
        head dimension than ``hidden_size / heads``, scaled rotary embeddings).
    """
    if type(model) is not transformers.LlamaForCausalLM:
        raise TypeError(
            f'fused_projections rewrites a LlamaForCausalLM as a Phi3ForCausalLM, got {type(model).__name__}: '
            "leave out 'fused_projections'"
        )
    config = model.config
    rope = dict(config.rope_parameters or {})
    unsupported = [
        reason
        for reason, present in (
            ('biases of the projections', config.attention_bias or config.mlp_bias),
            (
                'a head dimension other than hidden_size / heads',
                config.head_dim * config.num_attention_heads != config.hidden_size,
            ),
            (f'rotary embeddings of type {rope.get("rope_type")!r}', rope.get('rope_type', 'default') != 'default'),
        )
        if present
    ]
    if unsupported:
        raise TypeError(f'fused_projections: Phi-3 has no equivalent of {", ".join(unsupported)} of this model')
    fused = transformers.Phi3Config(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        hidden_act=config.hidden_act,
        max_position_embeddings=config.max_position_embeddings,
        original_max_position_embeddings=config.max_position_embeddings,
        rms_norm_eps=config.rms_norm_eps,
        tie_word_embeddings=config.tie_word_embeddings,
        rope_parameters={**rope, 'partial_rotary_factor': 1.0},
        pad_token_id=config.pad_token_id,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attention_dropout=0.0,
    )
    parameter = next(model.parameters())
    rewritten = transformers.Phi3ForCausalLM(fused).to(parameter.dtype).to(parameter.device).eval()
    rewritten.config._attn_implementation = config._attn_implementation
    state = model.state_dict()
    weights = {}
    for name, value in state.items():
        prefix, _, rest = name.rpartition('.self_attn.')
        if rest in ('q_proj.weight', 'k_proj.weight', 'v_proj.weight'):
            if rest == 'q_proj.weight':
                parts = [state[f'{prefix}.self_attn.{key}_proj.weight'] for key in 'qkv']
                weights[f'{prefix}.self_attn.qkv_proj.weight'] = torch.cat(parts)
            continue
        prefix, _, rest = name.rpartition('.mlp.')
        if rest in ('gate_proj.weight', 'up_proj.weight'):
            if rest == 'gate_proj.weight':
                parts = [state[f'{prefix}.mlp.{key}_proj.weight'] for key in ('gate', 'up')]
                weights[f'{prefix}.mlp.gate_up_proj.weight'] = torch.cat(parts)
            continue
        weights[name] = value
    rewritten.load_state_dict(weights, strict=True)
    return rewritten


def repeated_key_value_heads(model: torch.nn.Module) -> torch.nn.Module:
    """``model``, a ``LlamaForCausalLM`` with grouped-query attention (fewer key/value heads than query heads), as the
    same model with one key/value head per query head: the key and value projections of each shared head repeated for
    every query head of its group (as Transformers' ``repeat_kv`` repeats their outputs).

    Raises
    ------
    TypeError
        If ``model`` is not a ``LlamaForCausalLM``, or already has one key/value head per query head.
    """
    if type(model) is not transformers.LlamaForCausalLM:
        raise TypeError(
            f'repeated_key_value_heads rewrites a LlamaForCausalLM, got {type(model).__name__}: leave out '
            "'repeated_key_value_heads'"
        )
    config = copy.deepcopy(model.config)
    groups = config.num_attention_heads // config.num_key_value_heads
    if groups == 1:
        raise TypeError(
            f'{type(model).__name__} has one key/value head per query head already: there is nothing to repeat; '
            "leave out 'repeated_key_value_heads'"
        )
    config.num_key_value_heads = config.num_attention_heads
    parameter = next(model.parameters())
    rewritten = transformers.LlamaForCausalLM(config).to(parameter.dtype).to(parameter.device).eval()
    weights = {}
    for name, value in model.state_dict().items():
        if name.rpartition('.self_attn.')[2] in ('k_proj.weight', 'k_proj.bias', 'v_proj.weight', 'v_proj.bias'):
            heads = value.reshape(model.config.num_key_value_heads, -1, *value.shape[1:])
            value = heads.repeat_interleave(groups, 0).reshape(-1, *value.shape[1:])
        weights[name] = value
    rewritten.load_state_dict(weights, strict=True)
    return rewritten


def rewritten(model: torch.nn.Module, rewrite: str, factor: float = 2.0) -> torch.nn.Module:
    """The rewrite ``rewrite`` (:py:data:`REWRITES`) of ``model``; ``factor`` of ``'scaled_query_key'``."""
    if rewrite == 'scaled_query_key':
        return scaled_query_key(model, factor)
    if rewrite == 'folded_scaling':
        return folded_scaling(model)
    if rewrite == 'fused_projections':
        return fused_projections(model)
    if rewrite == 'repeated_key_value_heads':
        return repeated_key_value_heads(model)
    raise ValueError(f'unknown rewrite {rewrite!r}; known: {REWRITES}')


def _scores(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        output = model(input_ids=input_ids)
    return output.logits if hasattr(output, 'logits') else output.last_hidden_state


def implementation_invariance(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    methods: Sequence[str] = INVARIANCE_METHODS,
    rewrites: Sequence[str] = REWRITES,
    target: TargetLike = None,
    factor: float = 2.0,
    atol: float = 1e-10,
    rtol: float = 1e-9,
) -> list[Invariance]:
    """The relevance of every rewrite of ``model`` against the original's, per method.

    Parameters
    ----------
    model: torch.nn.Module
        A float64 Llama-style language model in eval mode (see :py:func:`attention_modules`).
    input_ids: torch.Tensor
        ``[batch, seq]`` token ids (no padding).
    methods: sequence of str
        Methods of :py:func:`~zennit_attn.explain` (default AttnLRP, CP-LRP and input x gradient).
    rewrites: sequence of str
        Items of :py:data:`REWRITES`.
    target: optional
        What is explained (default: the original model's prediction at the last position, for every rewrite).
    factor: float
        The ``c`` of ``'scaled_query_key'``.
    atol: float
        The largest difference of the output scores a rewrite may have (it must be exact).
    rtol: float
        :py:attr:`Invariance.invariant`: the largest relevance difference, relative to the largest relevance, that
        counts as rounding.

    Returns
    -------
    list of Invariance
        One per rewrite, in order.

    Raises
    ------
    ValueError
        If the model is not float64 (rounding would hide or fake differences: ``model.double()``), for an unknown
        rewrite, or if a rewrite changes the output by more than ``atol``.
    """
    if next(model.parameters()).dtype != torch.float64:
        raise ValueError(
            'implementation_invariance compares relevance to rounding: pass a float64 model (model.double())'
        )
    input_ids = torch.as_tensor(input_ids)
    input_ids = input_ids[None] if input_ids.dim() == 1 else input_ids
    reference = _scores(model, input_ids)
    if target is None:
        target = reference[:, -1].argmax(-1)
    originals = {method: explain(model, input_ids, target=target, method=method) for method in methods}
    results = []
    for rewrite in rewrites:
        other = rewritten(model, rewrite, factor)
        output_difference = float((_scores(other, input_ids) - reference).abs().max())
        if not output_difference <= atol:
            raise ValueError(
                f'the rewrite {rewrite!r} of {type(model).__name__} changes its output by {output_difference:.3g} '
                f'(> atol={atol}): it is not an exact rewrite of this model'
            )
        difference, scale = {}, {}
        for method, original in originals.items():
            relevance = explain(other, input_ids, target=target, method=method).relevance
            difference[method] = float((relevance - original.relevance).abs().max())
            scale[method] = float(original.relevance.abs().max())
        results.append(Invariance(rewrite, output_difference, difference, scale, rtol))
    return results
