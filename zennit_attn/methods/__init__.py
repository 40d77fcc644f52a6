"""The attribution methods: the registry (:py:mod:`~zennit_attn.methods.registry`), LRP
(:py:mod:`~zennit_attn.methods.lrp`) and the baselines, and what they read of attention
(:py:mod:`~zennit_attn.methods.attention`)."""
