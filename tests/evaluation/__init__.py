"""Tests of zennit_attn.evaluation."""
