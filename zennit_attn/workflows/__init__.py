"""Workflows built on :py:func:`~zennit_attn.explain`: generated answers, datasets, the conservation report and
the evaluation of explanations (faithfulness, plausibility, the composite search)."""
