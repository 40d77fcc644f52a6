"""Tests of zennit_attn.workflows.evaluation."""
