"""AttnLRP and CP-LRP as inseq attribution methods ``'attnlrp'`` and ``'cplrp'`` (``pip install zennit-attn[inseq]``).

Importing this module registers them through inseq's own registry (inseq finds every subclass of its
``FeatureAttribution`` by its ``method_name``); nothing of inseq is patched::

    import inseq
    import zennit_attn.integrations.inseq  # registers 'attnlrp' and 'cplrp'

    model = inseq.load_model(hf_model, 'attnlrp', tokenizer=tokenizer)
    out = model.attribute('The ice bear lives in the', attributed_fn='logit')
    out.show()

Each generation step explains the logit of the next token over its prefix with
:py:class:`zennit_attn.integrations.captum.AttnLRP` (:py:class:`~zennit_attn.integrations.captum.CPLRP`), so step ``i``
holds ``explain(model, prefix_i, target=token_i).relevance`` (inseq stores attributions in float32). LRP explains the
logit (its initial relevance), so ``attributed_fn='logit'`` must be given; inseq's default, the probability, is
refused. Decoder-only models; encoder-decoder models are refused (use :py:func:`zennit_attn.explain` with
``decoder_input_ids``).
"""

from __future__ import annotations

from typing import Any

from zennit.core import Composite

try:
    from inseq.attr.feat import FeatureAttribution
    from inseq.attr.step_functions import get_step_function
    from inseq.data import FeatureAttributionStepOutput
except ImportError as error:  # the extra, named: a bare "No module named 'inseq'" does not say what to install
    raise ImportError(
        "zennit_attn.integrations.inseq needs inseq: pip install 'zennit-attn[inseq]' (or pip install inseq)"
    ) from error

from .captum import CPLRP, AttnLRP

__all__ = ['AttnLRPAttribution', 'CPLRPAttribution']

#: arguments of captum's gradient methods that LRP has no use for
_CAPTUM_ONLY = (
    'baselines',
    'n_steps',
    'method',
    'internal_batch_size',
    'return_convergence_delta',
    'multiply_by_inputs',
    'position',
    'target',
    'additional_forward_args',
)


class AttnLRPAttribution(FeatureAttribution):
    """inseq method ``'attnlrp'``: AttnLRP of the logit of each generated token over its prefix.

    Parameters
    ----------
    attribution_model
        inseq's attribution model (inseq passes it: ``inseq.load_model(model, 'attnlrp')``); decoder-only.
    composite: zennit.core.Composite, optional
        The LRP composite (default that of the method), e.g. ``inseq.load_model(model, 'attnlrp',
        composite=AttnLRPEpsilon(epsilon=1e-6))``.
    """

    method_name = 'attnlrp'
    adapter = AttnLRP

    def __init__(self, attribution_model, composite: Composite | None = None, **kwargs):
        """See the class's parameters; ``kwargs`` go to inseq's ``hook``. Encoder-decoder models are refused
        (``TypeError``)."""
        super().__init__(attribution_model, hook_to_model=False)
        if attribution_model.is_encoder_decoder:
            raise TypeError(
                f"inseq's {self.method_name!r} explains decoder-only models; "
                f'{type(attribution_model.model).__name__} is an encoder-decoder model: use '
                'zennit_attn.explain(model, input_ids, decoder_input_ids=...)'
            )
        self.attribute_batch_ids = True  # token ids in, nothing replaced in the model
        self.forward_batch_embeds = False
        self.hook(**kwargs)
        self.method = self.adapter(attribution_model.model, composite=composite)

    def get_attribution_args(self, **kwargs) -> tuple[dict[str, Any], dict[str, Any]]:
        """Refuse captum arguments LRP does not take (inseq would only warn that they are unused)."""
        refused = sorted(set(kwargs) & set(_CAPTUM_ONLY))
        if refused:
            raise TypeError(
                f"inseq's {self.method_name!r} takes no argument(s) {refused}: LRP explains the "
                'logit of each generated token in one backward pass, without baselines or steps'
            )
        return {}, dict(kwargs)

    def attribute_step(
        self, attribute_fn_main_args: dict[str, Any], attribution_args: dict[str, Any] | None = None
    ) -> FeatureAttributionStepOutput:
        """Relevance per prefix token (``[batch, prefix]``) of the logit of the next target token; ``attribution_args``
        (default none) go to the adapter's ``attribute``."""
        input_ids, target_ids, attributed_fn, attention_mask = attribute_fn_main_args['additional_forward_args'][:4]
        if attributed_fn is not get_step_function('logit'):
            raise ValueError(
                f"inseq's {self.method_name!r} explains the logit, the initial relevance of LRP; "
                f'attributed_fn={getattr(attributed_fn, "__name__", attributed_fn)!r} is not the '
                "logit: pass attributed_fn='logit' to attribute()"
            )
        relevance = self.method.attribute(
            input_ids, target=target_ids.reshape(-1), attention_mask=attention_mask, **(attribution_args or {})
        )
        return FeatureAttributionStepOutput(target_attributions=relevance.sum(-1), step_scores={})


class CPLRPAttribution(AttnLRPAttribution):
    """inseq method ``'cplrp'``: CP-LRP of the logit of each generated token over its prefix; see
    :py:class:`AttnLRPAttribution`."""

    method_name = 'cplrp'
    adapter = CPLRP
