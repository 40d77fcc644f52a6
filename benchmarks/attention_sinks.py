"""How much relevance the first token takes (an attention sink): ``Explanation.first_token_share``, ``|R_first| /
sum |R|``, under AttnLRP for the model's own next-token prediction at the last position of Wikipedia lead sentences.

Models: SmolLM2-135M-Instruct (a real 30-layer Llama, ``zennit_attn.pretrained.load_smollm2``), as its tokenizer
gives the text (no beginning-of-sequence token) and with its bos token (``<|im_start|>`` in the GGUF file) put in
front; and randomly initialised models shaped like Qwen2.5-0.5B and Gemma-3-1B (their
widths, heads, head sizes, normalisations; ``--layers`` layers instead of 24/26, seeded). On random weights the
share says little (there is no learnt sink); it is a check of what the architecture alone does.

Prints a Markdown table (share mean, median, min, max over the sentences, and the mean of ``1 / tokens``, the share
of a token if relevance were spread evenly), the command and the machine's load average.

Example (the table of docs/results.md)::

    python benchmarks/attention_sinks.py --sentences 20
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import transformers

from zennit_attn import explain
from zennit_attn.latent.corpus import wikipedia_leads
from zennit_attn.pretrained import load_smollm2


def random_model(kind: str, vocab: int, layers: int, seed: int):
    """A random causal LM shaped like Qwen2.5-0.5B (``'qwen2.5'``) or Gemma-3-1B (``'gemma3'``) with ``layers``
    layers."""
    torch.manual_seed(seed)
    if kind == 'qwen2.5':
        config = transformers.Qwen2Config(
            vocab_size=vocab,
            hidden_size=896,
            intermediate_size=4864,
            num_hidden_layers=layers,
            num_attention_heads=14,
            num_key_value_heads=2,
            rope_theta=1e6,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            max_position_embeddings=4096,
        )
        return transformers.Qwen2ForCausalLM(config).eval()
    config = transformers.Gemma3TextConfig(
        vocab_size=vocab,
        hidden_size=1152,
        intermediate_size=6912,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=256,
        query_pre_attn_scalar=256,
        sliding_window=512,
        rms_norm_eps=1e-6,
        max_position_embeddings=4096,
    )
    return transformers.Gemma3ForCausalLM(config).eval()


def shares(model, tokenizer, sentences, bos: int | None = None) -> tuple[list[float], list[int]]:
    """The first token's share and the token count of each sentence's explanation."""
    values, lengths = [], []
    for sentence in sentences:
        ids = tokenizer(sentence).input_ids
        ids = ([bos] if bos is not None else []) + ids
        explanation = explain(model, torch.tensor([ids]))
        values.append(float(explanation.first_token_share[0]))
        lengths.append(len(ids))
    return values, lengths


def row(name: str, values: list[float], lengths: list[int]) -> str:
    uniform = statistics.mean(1 / length for length in lengths)
    return (
        f'| {name} | {len(values)} | {statistics.mean(lengths):.1f} | {statistics.mean(values):.3f} | '
        f'{statistics.median(values):.3f} | {min(values):.3f} | {max(values):.3f} | {uniform:.3f} |'
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--sentences', type=int, default=20, help='Wikipedia lead sentences (default 20)')
    parser.add_argument('--layers', type=int, default=4, help='layers of the random models (default 4)')
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    sentences = list(wikipedia_leads(limit=args.sentences, sentences=True, min_chars=40))
    start = time.perf_counter()
    model, tokenizer = load_smollm2()
    lines = [
        '| model | sentences | mean tokens | share mean | median | min | max | mean 1/tokens |',
        '|---|---|---|---|---|---|---|---|',
    ]
    lines.append(row('SmolLM2-135M (trained), text only', *shares(model, tokenizer, sentences)))
    lines.append(
        row(
            f'SmolLM2-135M (trained), {tokenizer.bos_token} first',
            *shares(model, tokenizer, sentences, tokenizer.bos_token_id),
        )
    )
    print('\n'.join(lines), flush=True)
    vocab = len(tokenizer)
    for kind, name in (('qwen2.5', 'Qwen2.5-0.5B-shaped'), ('gemma3', 'Gemma-3-1B-shaped')):
        random = random_model(kind, vocab, args.layers, args.seed)
        lines.append(row(f'{name}, random, {args.layers} layers', *shares(random, tokenizer, sentences)))
        print(lines[-1], flush=True)
    print()
    print('\n'.join(lines))
    print(
        f'\ncommand: python benchmarks/attention_sinks.py {" ".join(sys.argv[1:] if argv is None else argv)}; '
        f'{time.perf_counter() - start:.0f} s; load average {", ".join(f"{v:.2f}" for v in os.getloadavg())} '
        f'on {os.cpu_count()} cores; torch {torch.__version__}, transformers {transformers.__version__}'
    )


if __name__ == '__main__':
    main()
