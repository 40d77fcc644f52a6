"""Parity of zennit-attn's relevance for transformers' Mamba with MambaLRP's own implementation.

MambaLRP (Rezaei Jafari, Montavon, Müller, Eberle, NeurIPS 2024) is not on PyPI: pass a checkout of its repository
(github.com/FarnoushRJ/MambaLRP, whose ``mamba_lrp`` package wraps transformers' ``MambaMixer``; it imports
``einops``, give a folder that holds it with ``--path`` too if it is not installed). For ``--models`` tiny random
``MambaForCausalLM`` models (float64, seeded) and a random input each, the token relevance of the predicted next
token by :py:func:`zennit_attn.explain` (AttnLRP) is compared with MambaLRP's (its ``ModifiedMambaForCausalLM`` on
the same model, relevance = input x gradient at the embeddings): the largest absolute difference relative to the
largest relevance, and the sums against the logit. MambaLRP computes its scan in float32 (``.float()``) and
stabilises its identity rule with 1e-6, so the two agree to about 1e-6, not to float64's rounding.

Example::

    python benchmarks/mambalrp_parity.py --mambalrp ../MambaLRP --path /tmp/deps
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import torch
import transformers

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zennit_attn import explain  # noqa: E402


def tiny_mamba(seed: int) -> transformers.MambaForCausalLM:
    torch.manual_seed(seed)
    config = transformers.MambaConfig(
        vocab_size=64, hidden_size=32, state_size=8, num_hidden_layers=3, conv_kernel=4, expand=2, time_step_rank=4
    )
    return transformers.MambaForCausalLM(config).double().eval()


def compare(model, reference_class, seed: int, length: int) -> dict[str, float]:
    """Relevance of both implementations for one random input."""
    ids = torch.randint(0, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        logits = model(ids).logits
    target = int(logits[0, -1].argmax())
    ours = torch.as_tensor(explain(model, ids, target=target).relevance).flatten()
    reference_model = reference_class(model, is_fast_forward_available=False)
    embeddings = model.backbone.embeddings(ids).detach().requires_grad_(True)
    reference_model(inputs_embeds=embeddings, use_cache=False)[0, -1, target].backward()
    reference = (embeddings * embeddings.grad).sum(-1)[0].detach()
    return dict(
        relative_difference=float((ours - reference).abs().max() / reference.abs().max()),
        logit=float(logits[0, -1, target]),
        zennit_attn_sum=float(ours.sum()),
        mambalrp_sum=float(reference.sum()),
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--mambalrp', required=True, help='a checkout of the MambaLRP repository')
    parser.add_argument('--path', action='append', default=[], help='more folders to import from (einops)')
    parser.add_argument('--models', type=int, default=5)
    parser.add_argument('--length', type=int, default=16)
    args = parser.parse_args(argv)
    sys.path[:0] = [args.mambalrp, *args.path]
    reference_class = importlib.import_module('mamba_lrp.model.mamba_huggingface').ModifiedMambaForCausalLM

    worst = 0.0
    for seed in range(args.models):
        row = compare(tiny_mamba(seed), reference_class, seed, args.length)
        worst = max(worst, row['relative_difference'])
        print(f'model {seed}: ' + ', '.join(f'{key} {value:.6g}' for key, value in row.items()))
    print(f'largest relative difference over {args.models} models: {worst:.3g}')


if __name__ == '__main__':
    main()
