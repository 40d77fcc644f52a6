"""The LRP methods ``'attnlrp'``, ``'cplrp'`` and ``'palrp'``: LRP (:py:func:`~zennit_attn.methods.lrp.attribute`) with
the composite a user passes, or by default the one of the paper for the task's modality."""

from __future__ import annotations

from zennit.core import Composite

from ..composites import AttnLRPComposite, AttnLRPEpsilon, AttnLRPGamma, CPLRPEpsilon, CPLRPGamma
from ..inputs.task import ImageTask, Task
from ..rules import ConstantGates, ProductRule, Uniform
from .lrp import attribute

__all__ = ['attnlrp', 'cplrp', 'palrp', 'METHOD_RULES', 'check_composite', 'lrp_method', 'method_of']

#: The product rule each LRP method names (the paper's distinction between AttnLRP and CP-LRP: relevance through the
#: attention probabilities and gates, or none): a zennit-attn composite that applies the other method's rule is
#: refused under this method's name.
METHOD_RULES: dict[str, type[ProductRule]] = {'attnlrp': Uniform, 'cplrp': ConstantGates}


def lrp_method(composite: Composite) -> str:
    """The LRP method whose product rule (:py:data:`METHOD_RULES`) ``composite`` applies: ``'cplrp'`` for a
    composite with :py:class:`~zennit_attn.rules.ConstantGates`, else ``'attnlrp'`` (for composites of other
    rules, too: :py:func:`check_composite` takes them under either name)."""
    rules = composite.product_rules() if isinstance(composite, AttnLRPComposite) else ()
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
    (RelP's, a user's own, zennit's composites) are taken as they are.

    Raises
    ------
    ValueError
        Naming the method, the composite and its rule, and what to do.
    """
    if not isinstance(composite, AttnLRPComposite):
        return
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
    inputs of the explanation, by default :py:class:`~zennit_attn.composites.AttnLRPEpsilon` with
    ``positions=True``; the explanation's ``position_relevance`` holds the positions' relevance. Cost: one forward
    and one backward pass.

    Raises
    ------
    ValueError
        For a composite without ``positions=True``, or a model without a position encoding PA-LRP knows.
    """
    if composite is None:
        composite = AttnLRPEpsilon(positions=True)
    if not getattr(composite, 'positions', False):
        raise ValueError(
            f"method='palrp' reads the relevance of the positions: {type(composite).__name__}() needs positions=True "
            "(or leave composite= out for PA-LRP's own)"
        )
    check_composite(composite, 'attnlrp')
    return attribute(task, position, target, composite, 'palrp')
