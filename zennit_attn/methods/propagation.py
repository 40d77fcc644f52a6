"""The LRP methods ``'attnlrp'``, ``'cplrp'``, ``'palrp'`` and ``'attnlrp_late'``: LRP
(:py:func:`~zennit_attn.methods.lrp.attribute`) with the composite a user passes, or by default the one of the paper
for the task's modality (for ``'attnlrp_late'``: :py:class:`~zennit_attn.composites.AttnLRPLateEpsilon`)."""

from __future__ import annotations

from zennit.core import Composite

from ..composites import (
    AttnLRPComposite,
    AttnLRPEpsilon,
    AttnLRPGamma,
    AttnLRPLateEpsilon,
    CPLRPEpsilon,
    CPLRPGamma,
)
from ..inputs.task import ImageTask, Task
from ..rules import ConstantGates, ProductRule, Uniform
from .lrp import attribute

__all__ = ['attnlrp', 'cplrp', 'palrp', 'attnlrp_late', 'METHOD_RULES', 'check_composite', 'lrp_method', 'method_of']

#: The product rule each LRP method names (the paper's distinction between AttnLRP and CP-LRP: relevance through the
#: attention probabilities and gates, or none): a zennit-attn composite that applies the other method's rule is
#: refused under this method's name.
METHOD_RULES: dict[str, type[ProductRule]] = {'attnlrp': Uniform, 'cplrp': ConstantGates}


def lrp_method(composite: Composite) -> str:
    """The LRP method of ``composite``: the one it names (:py:attr:`~zennit_attn.composites.AttnLRPComposite.method`,
    ``'attnlrp_late'`` for :py:class:`~zennit_attn.composites.AttnLRPLateEpsilon`), else the one whose product rule
    (:py:data:`METHOD_RULES`) it applies: ``'cplrp'`` for a composite with
    :py:class:`~zennit_attn.rules.ConstantGates`, else ``'attnlrp'`` (for composites of other rules, too:
    :py:func:`check_composite` takes them under either name)."""
    if not isinstance(composite, AttnLRPComposite):
        return 'attnlrp'
    if composite.method is not None:
        return composite.method
    rules = composite.product_rules()
    return next((name for name, cls in METHOD_RULES.items() if any(isinstance(rule, cls) for rule in rules)), 'attnlrp')


def method_of(method: str | None, composite: Composite | None) -> str:
    """The method a call runs: ``method`` where it is given, else the LRP method of ``composite``
    (:py:func:`lrp_method`: ``explain(model, ids, composite=CPLRPEpsilon())`` runs CP-LRP), else ``'attnlrp'``."""
    if method is not None:
        return method
    return 'attnlrp' if composite is None else lrp_method(composite)


def check_composite(composite: Composite, method: str) -> None:
    """Refuse a zennit-attn composite whose product rules (:py:meth:`~zennit_attn.composites.AttnLRPComposite.
    product_rules`) include another LRP method's (:py:data:`METHOD_RULES`): ``explain(method='cplrp',
    composite=AttnLRPEpsilon())`` would return AttnLRP's relevance labelled ``'cplrp'``. Composites with other rules
    (RelP's, a user's own, zennit's composites) are taken as they are. A composite that names its method
    (:py:attr:`~zennit_attn.composites.AttnLRPComposite.method`: :py:class:`~zennit_attn.composites.AttnLRPLateEpsilon`)
    is refused under any other.

    Raises
    ------
    ValueError
        Naming the method, the composite and its rule, and what to do.
    """
    if not isinstance(composite, AttnLRPComposite):
        return
    if composite.method is not None and composite.method != method:
        raise ValueError(
            f'method={method!r} and composite={type(composite).__name__}() conflict: the composite gives the relevance '
            f'of {composite.method!r}; pass method={composite.method!r} with this composite, or leave composite= out '
            f"for {method!r}'s own"
        )
    own = METHOD_RULES[method]
    for rule in composite.product_rules():
        other = next(
            (name for name, cls in METHOD_RULES.items() if isinstance(rule, cls) and not isinstance(rule, own)), None
        )
        if other is not None:
            raise ValueError(
                f'method={method!r} and composite={type(composite).__name__}() conflict: the composite applies '
                f'{type(rule).__name__}, the product rule of {other!r}, so its relevance is not {method!r}; pass '
                f"method={other!r} with this composite, or leave composite= out for {method!r}'s own"
            )


def attnlrp(task: Task, position=-1, target=None, composite: Composite | None = None):
    """AttnLRP (the paper's method): LRP with ``composite``, by default
    :py:class:`~zennit_attn.composites.AttnLRPEpsilon` for language models and
    :py:class:`~zennit_attn.composites.AttnLRPGamma` (the paper's ViT composite) for vision transformers.
    Cost: one forward and one backward pass."""
    if composite is None:
        composite = AttnLRPGamma() if isinstance(task, ImageTask) else AttnLRPEpsilon()
    check_composite(composite, 'attnlrp')
    return attribute(task, position, target, composite, 'attnlrp')


def cplrp(task: Task, position=-1, target=None, composite: Composite | None = None):
    """CP-LRP (Ali et al. 2022): LRP with the attention probabilities and gates constant, by default
    :py:class:`~zennit_attn.composites.CPLRPEpsilon` (language models) or
    :py:class:`~zennit_attn.composites.CPLRPGamma` (vision transformers). Cost: one forward and one backward
    pass."""
    if composite is None:
        composite = CPLRPGamma() if isinstance(task, ImageTask) else CPLRPEpsilon()
    check_composite(composite, 'cplrp')
    return attribute(task, position, target, composite, 'cplrp')


def palrp(task: Task, position=-1, target=None, composite: Composite | None = None):
    """PA-LRP (Bakish et al. 2025, :py:mod:`zennit_attn.rules.positions`): AttnLRP with the position encodings as
    inputs of the explanation, by default AttnLRP's composite (:py:class:`~zennit_attn.composites.AttnLRPEpsilon`, for
    vision transformers :py:class:`~zennit_attn.composites.AttnLRPGamma`) with ``positions=True``; the explanation's
    ``position_relevance`` holds the positions' relevance. Cost: one forward and one backward pass.

    Raises
    ------
    ValueError
        For a composite without ``positions=True``, or a model without a position encoding PA-LRP knows.
    """
    if composite is None:
        composite = AttnLRPGamma(positions=True) if isinstance(task, ImageTask) else AttnLRPEpsilon(positions=True)
    if not getattr(composite, 'positions', False):
        raise ValueError(
            f"method='palrp' reads the relevance of the positions: {type(composite).__name__}() needs positions=True "
            "(or leave composite= out for PA-LRP's own)"
        )
    check_composite(composite, 'attnlrp')
    return attribute(task, position, target, composite, 'palrp')


def attnlrp_late(task: Task, position=-1, target=None, composite: Composite | None = None):
    """AttnLRP with the attention probabilities constant in the later half of the blocks
    (:py:class:`~zennit_attn.composites.AttnLRPLateEpsilon`, after You et al. 2025, arXiv 2510.18810): the relevance
    of the later blocks flows through the attention values only. Cost: one forward and one backward pass.

    Raises
    ------
    ValueError
        For a vision transformer without ``composite=`` (the variant is measured on language models; pass
        ``AttnLRPLateEpsilon()`` to have it with the epsilon rule), or a composite that is not an
        ``AttnLRPLateEpsilon``.
    """
    if composite is None:
        if isinstance(task, ImageTask):
            raise ValueError(
                "method='attnlrp_late' is measured on language models, whose composite is the epsilon one; a vision "
                "transformer's default is the paper's gamma composite (method='attnlrp'): pass "
                'composite=AttnLRPLateEpsilon() to explain it with the epsilon rule and constant attention in its '
                'later blocks'
            )
        composite = AttnLRPLateEpsilon()
    if getattr(composite, 'method', None) != 'attnlrp_late':
        raise ValueError(
            f"method='attnlrp_late' needs an AttnLRPLateEpsilon composite (its rules by depth), got "
            f'{type(composite).__name__}(); leave composite= out, or pass AttnLRPLateEpsilon(start=...)'
        )
    return attribute(task, position, target, composite, 'attnlrp_late')
