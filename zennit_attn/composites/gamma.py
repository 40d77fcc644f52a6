"""The AttnLRP composites for vision transformers: gamma rule on linear and convolution layers (appendix A.2.3, B).

The paper's proposed composite for ViTs (appendix B, table "Proposed composite for the AttnLRP and CP-LRP methods
used for the Vision Transformer"):

======================================  ======================
layer type                              rule
======================================  ======================
Convolution (patch embedding)           Gamma(gamma=0.25)
Linear (MLP, head: outside attention)   Gamma(gamma=0.05)
LinearInputProjection (q, k, v)         Epsilon
LinearOutputProjection (attention out)  Epsilon
======================================  ======================

and everything else as :py:class:`~zennit_attn.composites.AttnLRPEpsilon` (identity rule on GELU and LayerNorm's
normalisation, AttnLRP's rules in attention) or :py:class:`~zennit_attn.composites.CPLRPEpsilon` (attention
probabilities constant). Every choice can be replaced per layer type.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from zennit.core import BasicHook, Hook

from ..canonizers import OperationCanonizer
from ..core.blocks import VISION_TOWER_NAMES, attention_linears, vision_towers
from ..core.errors import UnsupportedModelError
from ..core.kinds import CONVOLUTIONS, LINEARS
from ..core.modules import Modules
from ..core.quantization import UnsupportedQuantizationError, quantization_of
from ..rules import FUNCTIONAL_EPSILON, ConstantGates, Epsilon, Gamma, ProductRule, RelevanceRule, plain_stands_for
from .attnlrp import AttnLRPComposite


def attention_projections(
    model: torch.nn.Module,
    outputs: Mapping[str, str] | None = None,
) -> tuple[set[int], set[int]]:
    """``(ids of attention input projections, ids of attention output projections)`` in ``model``, from its module
    tree (:py:func:`~zennit_attn.core.blocks.attention_linears`: the linear layers inside attention
    modules, the output projection by its name or its parent's class).

    Input projections compute the queries, keys and values (timm's fused ``qkv``, Hugging Face's
    ``q_proj``/``k_proj``/``v_proj``, GPT-2's ``c_attn``), output projections take the attention output (timm's
    ``proj``, Hugging Face's ``o_proj``). The module tree is read rather than a forward pass run, since a composite is
    registered inside the contexts of other hooks and the vision tower of a vision-language model does not run on a
    text input; on every family of the former family table the result equals the table's (tested).

    Parameters
    ----------
    model: torch.nn.Module
    outputs: mapping, optional
        ``attention class name -> child``: these children are output projections (and not input projections),
        whatever the module tree suggests.
    """
    inputs, outs = ({id(model.get_submodule(name)) for name in names} for names in attention_linears(model))
    named = {
        id(getattr(module, child))
        for module in model.modules()
        if (child := (outputs or {}).get(type(module).__name__)) is not None
        and isinstance(getattr(module, child, None), LINEARS)
    }
    return inputs - named, outs | named


#: The attention projections a rule of :py:class:`AttnLRPGamma` names, in words.
PROJECTIONS = {'attention_in': 'query, key and value projections', 'attention_out': 'output projection'}


class AttnLRPGamma(AttnLRPComposite):
    """AttnLRP for vision transformers with the paper's proposed composite (appendix B) as default.

    Drop-in for zennit users::

        with Gradient(model=vit, composite=AttnLRPGamma()) as attributor:
            output, relevance = attributor(pixels, one_hot)   # relevance: [batch, channels, height, width]

    Each layer type's rule is a constructor argument; pass a rule instance (it is copied for every module) or
    None for no rule (the plain gradient, i.e. the epsilon rule with epsilon -> 0). A zennit relevance rule (a
    ``zennit.core.BasicHook`` such as ``zennit.rules.Gamma``, which passes relevance where these rules pass a modified
    gradient) is wrapped in :py:class:`~zennit_attn.rules.RelevanceRule`, which converts at the module's
    boundary.

    Parameters
    ----------
    conv: Hook or None
        Convolutions (the patch embedding); default ``Gamma(0.25)``.
    linear: Hook or None
        Linear layers outside attention (MLP, classification head); default ``Gamma(0.05)``.
    attention_in: Hook or None
        The query, key and value projections (timm's fused ``qkv``); default ``Epsilon(1e-6)``.
    attention_out: Hook or None
        The attention output projection (timm's ``proj``, Hugging Face's ``o_proj``); default ``Epsilon(1e-6)``.
    product: ProductRule or None
        The product rule (how relevance passes the products of attention and so the softmax): default the class's,
        :py:class:`~zennit_attn.rules.Uniform` (AttnLRP, Prop. 3.1-3.3);
        :py:class:`~zennit_attn.rules.ConstantGates` is CP-LRP (no relevance through the softmax).
    attention_outputs: mapping, optional
        ``attention class name -> output projection child``, for attention modules whose output projection the module
        tree does not tell (:py:func:`attention_projections`).
    epsilon: float
        Stabiliser of the epsilon rule on the linear layers outside ``within``.
    canonizers: sequence, optional
        As for :py:class:`~zennit_attn.composites.AttnLRPComposite`.
    within: str or sequence of str, optional
        Where the rules above apply: None (default) the whole model; ``'vision'`` the vision towers of a
        vision-language or image-text model (:py:func:`~zennit_attn.core.blocks.vision_towers`), so that
        the language model keeps :py:class:`~zennit_attn.composites.AttnLRPEpsilon`'s rules; or module names
        (e.g. ``'model.vision_tower'``). Modules outside get the epsilon composite's rules and the class's product
        rule.
    overrides: mapping of str to rule, optional
        The rules of single operations instead of the engine's, as for
        :py:class:`~zennit_attn.composites.AttnLRPComposite`.
    positions: bool
        PA-LRP's positions (the position encodings as explained inputs), as for
        :py:class:`~zennit_attn.composites.AttnLRPComposite`.

    Raises
    ------
    ValueError
        At registration, if ``within`` names a module the model does not have, or ``'vision'`` finds no vision tower.
    UnsupportedModelError
        At registration, if the model has a :py:class:`torch.nn.MultiheadAttention` (torchvision's ViT, OpenCLIP) and
        ``attention_in`` or ``attention_out`` is a rule other than None or an epsilon rule of a stabiliser up to
        :py:data:`~zennit_attn.rules.FUNCTIONAL_EPSILON`: that module computes its projections with ``F.linear`` on
        its parameters, which no rule of a module reaches (they get the plain gradient; with the default
        ``Epsilon(1e-6)`` the relevance differs from a model that calls its projection modules by that stabiliser's
        effect, measured 2.4e-6 of a sum of 0.048 on a tiny ViT in float64). In the forward pass, where the model
        computes with the parameters of a layer whose rule is another (EVA's ``F.linear(x, qkv.weight, qkv_bias)``)
        without calling the layer (:py:meth:`~zennit_attn.canonizers.OperationCanonizer.guard_layers`).
    """

    def __init__(
        self,
        conv: Hook | None = Gamma(0.25),
        linear: Hook | None = Gamma(0.05),
        attention_in: Hook | None = Epsilon(1e-6),
        attention_out: Hook | None = Epsilon(1e-6),
        product: ProductRule | None = None,
        attention_outputs: Mapping[str, str] | None = None,
        epsilon: float = 0.0,
        canonizers: Sequence | None = None,
        within: str | Sequence[str] | None = None,
        overrides: Mapping | None = None,
        positions: bool = False,
    ):
        if product is not None and not isinstance(product, ProductRule):
            raise TypeError(f'product= needs a ProductRule (Uniform(), ConstantGates()) or None, got {product!r}')
        #: the product rule inside ``within`` (everywhere for None)
        self.product = type(self).product_rule if product is None else product
        self.rules = {
            'conv': conv,
            'linear': linear,
            'attention_in': attention_in,
            'attention_out': attention_out,
        }
        self.rules = {
            kind: RelevanceRule(rule) if isinstance(rule, BasicHook) else rule for kind, rule in self.rules.items()
        }
        for kind, rule in self.rules.items():
            if rule is not None and not isinstance(rule, Hook):
                raise TypeError(f'{kind}= needs a zennit Hook (rule) instance or None, got {type(rule).__name__}')
        self.attention_outputs = attention_outputs
        names = [within] if isinstance(within, str) else within
        if within is not None and not (
            isinstance(names, (list, tuple)) and names and all(isinstance(name, str) for name in names)
        ):
            raise TypeError(f"within= takes a module name, a list of them or 'vision', got {within!r}")
        self.within = within
        self._attention_in: set[int] = set()
        self._attention_out: set[int] = set()
        self._scope: set[int] | None = None
        self._roots: list[torch.nn.Module] = []
        super().__init__(epsilon=epsilon, canonizers=canonizers, overrides=overrides, positions=positions)

    def register(self, module: torch.nn.Module, modules: Modules | None = None) -> None:
        modules = list(module.named_modules()) if modules is None else modules
        self.refuse_registered(module, modules)
        self._attention_in, self._attention_out = attention_projections(module, self.attention_outputs)
        self._roots = [] if self.within is None else self._roots_within(module, modules)
        self._scope = None if self.within is None else {id(inner) for root in self._roots for inner in root.modules()}
        self._refuse_functional_projections(module, modules)
        super().register(module, modules)

    def _refuse_functional_projections(self, model: torch.nn.Module, modules: Modules) -> None:
        """Refuse an attention projection rule that would not be applied (see Raises)."""
        found = [
            name
            for name, module in modules
            if isinstance(module, torch.nn.MultiheadAttention) and (self._scope is None or id(module) in self._scope)
        ]
        if not found:
            return
        for kind, what in PROJECTIONS.items():
            rule = self.rules[kind]
            if not plain_stands_for(rule):
                raise UnsupportedModelError(
                    f'{type(model).__name__} computes the {what} of its torch.nn.MultiheadAttention {found[0]!r} with '
                    f"F.linear on the module's parameters (it never calls its out_proj module), which no rule of a "
                    f'module reaches: {kind}={rule_repr(rule)} would not be applied (they get the plain gradient). '
                    f'Pass {kind}=None (what they get) or Epsilon() with epsilon <= {FUNCTIONAL_EPSILON}, or explain '
                    'a model whose attention calls its projection modules (timm, Hugging Face)'
                )

    def product_rules(self) -> tuple[ProductRule, ...]:
        """:py:attr:`product` (of the whole model, or inside ``within``, with the class's product rule outside)."""
        return (self.product,) if self.within is None else (self.product, self.product_rule)

    def engine(self, module: torch.nn.Module) -> OperationCanonizer:
        """The engine with :py:attr:`product` as the product rule: of the whole model, or inside ``within`` (the
        class's product rule outside)."""
        activation = None if self.activation_rule is None else self.activation_rule()
        if self.within is None:
            return OperationCanonizer(self.product, activation, overrides=self.overrides)
        scopes = [(root, self.product) for root in self._roots]
        return OperationCanonizer(self.product_rule, activation, scopes=scopes, overrides=self.overrides)

    def _roots_within(self, model: torch.nn.Module, modules: Modules) -> list[torch.nn.Module]:
        """The modules that ``within`` names (``modules``: the model's walk)."""
        names = (
            vision_towers(model)
            if self.within == 'vision'
            else [self.within]
            if isinstance(self.within, str)
            else list(self.within)
        )
        if not names:
            raise ValueError(
                f"within='vision': {type(model).__name__} has no vision tower (a child named one of "
                f'{sorted(VISION_TOWER_NAMES)} or a *Vision*Model class); name the modules instead'
            )
        named = dict(modules)
        missing = [name for name in names if name not in named]
        if missing:
            raise ValueError(f'within= names modules that {type(model).__name__} does not have: {missing}')
        return [named[name] for name in names]

    def layer_type(self, module: torch.nn.Module) -> str | None:
        """``'conv'``, ``'linear'``, ``'attention_in'``, ``'attention_out'`` or None (other)."""
        if self._scope is not None and id(module) not in self._scope:
            return None
        if isinstance(module, CONVOLUTIONS):
            return 'conv'
        if id(module) in self._attention_in:
            return 'attention_in'
        if id(module) in self._attention_out:
            return 'attention_out'
        if isinstance(module, LINEARS):
            return 'linear'
        return None

    def inline_rule(self, module: torch.nn.Module) -> Hook | None:
        """The rule of a linear map that ``module`` computes with its own parameters (see
        :py:meth:`~zennit_attn.composites.AttnLRPComposite.inline_rule`): inside ``within``, the ``linear`` rule (the
        ``attention_in`` rule for a :py:class:`torch.nn.MultiheadAttention`'s input projection, whose rule is checked
        at registration), outside it the epsilon composite's."""
        if self._scope is not None and id(module) not in self._scope:
            return super().inline_rule(module)
        if isinstance(module, torch.nn.MultiheadAttention):
            return self.rules['attention_in']
        return self.rules['linear']

    def mapping(self, ctx: dict, name: str, module: torch.nn.Module) -> Hook | None:
        kind = None if name == '' else self.layer_type(module)
        if kind is None:
            return super().mapping(ctx, name, module)
        rule = self.rules[kind]
        if isinstance(rule, RelevanceRule) and quantization_of(module) is not None:
            raise UnsupportedQuantizationError(
                f'{type(rule).__name__} (the {kind!r} rule) recomputes {name!r} with modified weights, which the '
                f'{quantization_of(module)} layer {type(module).__name__} does not hold in floating point: dequantize '
                f'the model first, or pass {kind}=Epsilon() to {type(self).__name__}'
            )
        return None if rule is None else rule.copy()

    def __repr__(self) -> str:
        arguments = ', '.join(f'{kind}={rule_repr(rule)}' for kind, rule in self.rules.items())
        arguments += f', product={self.product!r}'
        if self.within is not None:
            arguments += f', within={self.within!r}'
        return f'{type(self).__name__}({arguments})'


def rule_repr(rule: Hook | None) -> str:
    """A rule (or None) as the Python that builds it: its own ``repr`` where its class has one, else
    ``Epsilon(<epsilon>)`` or ``<class name>()``.

    Parameters
    ----------
    rule: zennit.core.Hook or None

    Returns
    -------
    str
    """
    if rule is None or type(rule).__repr__ is not object.__repr__:
        return repr(rule)
    if isinstance(rule, Epsilon):
        return f'Epsilon({rule.epsilon!r})'
    return f'{type(rule).__name__}()'


class CPLRPGamma(AttnLRPGamma):
    """gamma-CP-LRP (appendix A.2.3, B): :py:class:`AttnLRPGamma` with the attention probabilities (and gates of
    gated MLPs) constant, as in CP-LRP (Ali et al. 2022). Same defaults and arguments; ``product`` defaults to
    :py:class:`~zennit_attn.rules.ConstantGates`."""

    product_rule = ConstantGates()
