"""Which non-linearities separate LRP from leave-one-out: the drops of leave-one-out with parts of the model held at
their values on the unperturbed input (all-MiniLM-L6-v2, SmolLM2-135M-Instruct).

Leave-one-out by zeroing (:py:func:`zennit_attn.workflows.evaluation.token_drops`, ``'zeroed'``) measures the change
of the explained value when a token's word embedding is set to 0, the whole model recomputed. LRP's rules are
linearisations at the unperturbed input: AttnLRP and CP-LRP hold the scale of every LayerNorm constant (Prop. 3.4),
CP-LRP also the attention probabilities and the ratio ``f(x) / x`` of each activation (GELU, SiLU). With all three
held, the model is linear in the word embeddings and the drop of zeroing a token is CP-LRP's relevance of it, exactly
(on a model without biases; the biases are constants either way); the question is which of them, recomputed, moves
the drops away from the relevance. This script computes the drops of the model with a chosen set of parts held (a
:py:class:`Held` torch function mode on an eager copy of the model: ``F.layer_norm`` divides by the standard
deviation it had on the unperturbed input, ``torch.rsqrt`` of an RMSNorm returns its unperturbed value, ``F.softmax``
the unperturbed probabilities, ``F.gelu`` and ``F.silu`` multiply their input by the unperturbed ratio), for every
token, and scores AttnLRP's and CP-LRP's relevance against each set by Spearman's and Pearson's correlation, with the
drop of one special token beside them: MiniLM's [SEP] (the token whose relevance decides AttnLRP's gaps there,
``benchmarks/minilm_special_tokens.py``), SmolLM2's first token (its attention sink).

The inputs and explained values are those of the leave-one-out benchmark (``benchmarks/leave_one_out.py``, float64):
MiniLM ``[CLS]`` + 30 tokens of an article + ``[SEP]``, the [CLS] token's last hidden state projected onto the unit
sentence embedding of the title (:py:func:`leave_one_out.minilm_samples`); SmolLM2 the first 32 tokens of an
article, the logit of the predicted next token. Run alone::

    python benchmarks/held_leave_one_out.py --model minilm --articles 100 --threads 2
    python benchmarks/held_leave_one_out.py --model smollm2 --articles 100 --threads 2
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from tqdm.auto import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.faithfulness import sample_articles  # noqa: E402
from benchmarks.leave_one_out import minilm_samples  # noqa: E402
from benchmarks.minilm_special_tokens import sample_arguments, written  # noqa: E402
from zennit_attn import explain  # noqa: E402
from zennit_attn.pretrained import load_minilm, load_smollm2  # noqa: E402
from zennit_attn.workflows.evaluation import mean_sem  # noqa: E402
from zennit_attn.workflows.statistics import pearson, spearman  # noqa: E402

#: the parts a :py:class:`Held` mode can hold: the embedding LayerNorm's scale (MiniLM), the scales of the other
#: normalisations (the blocks' LayerNorms or RMSNorms, SmolLM2's final RMSNorm), the attention probabilities, the
#: activations' ratios
PARTS = ('embedding norm', 'block norms', 'attention', 'activations')
#: the sets of held parts scored: name -> parts
HELD = {
    'nothing held (leave-one-out)': (),
    'everything held (CP-LRP linear model)': PARTS,
    'all but the block norms': ('embedding norm', 'attention', 'activations'),
    'all but the embedding norm': ('block norms', 'attention', 'activations'),
    'all but the attention': ('embedding norm', 'block norms', 'activations'),
    'all but the activations': ('embedding norm', 'block norms', 'attention'),
    'only the block norms': ('block norms',),
}
METHODS = {'attnlrp': 'AttnLRP', 'cplrp': 'CP-LRP'}
#: the functions a :py:class:`Held` mode records and holds, by what they compute
FUNCTIONS = {
    F.layer_norm: 'layer_norm',
    torch.rsqrt: 'rsqrt',
    torch.Tensor.rsqrt: 'rsqrt',
    F.softmax: 'softmax',
    torch.softmax: 'softmax',
    torch.Tensor.softmax: 'softmax',
    F.gelu: 'activation',
    F.silu: 'activation',
}


class Held(TorchFunctionMode):
    """Records the LayerNorm scales, RMSNorm inverse scales, softmax outputs and activations of one forward pass
    (``record``), and holds the parts in ``parts`` at those values in later passes: the ``i``-th call of each function
    in a pass is matched with the ``i``-th recorded one (the model's calls are the same in every pass). A LayerNorm is
    the embedding norm where it is the first normalisation of the pass. An activation is held as CP-LRP holds it: its
    ratio ``f(x) / x`` (the identity rule) where its output is a value (``gated`` False: MiniLM's MLP), its output
    where that gates a value (``gated``: SmolLM2's ``silu(g) * u``, the gate a constant of the product)."""

    def __init__(self, parts=(), gated: bool = False):
        super().__init__()
        self.parts, self.recording, self.gated = frozenset(parts), True, gated
        self.recorded: dict[str, list] = {'layer_norm': [], 'rsqrt': [], 'softmax': [], 'activation': []}
        self.calls = dict.fromkeys(self.recorded, 0)

    def replay(self, parts) -> Held:
        """The same records, holding ``parts`` (a new pass: the call counts start again)."""
        held = Held(parts, self.gated)
        held.recorded, held.recording = self.recorded, False
        return held

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = FUNCTIONS.get(func)
        if name is None:
            return func(*args, **kwargs)
        index = self.calls[name]
        self.calls[name] += 1
        if name == 'layer_norm':
            return self._layer_norm(index, *args, **kwargs)
        output = func(*args, **kwargs)
        ratio = name == 'activation' and not self.gated
        if self.recording:
            self.recorded[name].append(output / args[0] if ratio else output)
            return output
        held = {'rsqrt': 'block norms', 'softmax': 'attention', 'activation': 'activations'}[name]
        if held not in self.parts:
            return output
        recorded = self.recorded[name][index]
        return args[0] * recorded if ratio else recorded.to(output.dtype)

    def _layer_norm(self, index, input, normalized_shape, weight=None, bias=None, eps=1e-5):
        centred = input - input.mean(-1, keepdim=True)
        scale = torch.sqrt(input.var(-1, keepdim=True, unbiased=False) + eps)
        if self.recording:
            self.recorded['layer_norm'].append(scale)
        elif ('embedding norm' if index == 0 else 'block norms') in self.parts:
            scale = self.recorded['layer_norm'][index]
        output = centred / scale
        return output * weight + bias if weight is not None else output


def held_drops(model, ids: torch.Tensor, value, gated: bool, sets) -> dict[str, list[float]]:
    """Per set of :py:data:`HELD` named in ``sets``, the drop of the explained value (``value(model, embeddings)``)
    when each token's word embedding is set to 0, with those parts held at the unperturbed input's (``model``: eager
    attention; ``gated``: see :py:class:`Held`)."""
    words = model.get_input_embeddings()(ids).detach()
    recorder = Held(gated=gated)
    with torch.no_grad():
        with recorder:
            base = value(model, words)
        drops = {}
        for name in sets:
            parts, values = HELD[name], []
            for position in range(ids.shape[1]):
                zeroed = words.clone()
                zeroed[0, position] = 0
                with recorder.replay(parts):
                    values.append(base - value(model, zeroed))
            drops[name] = values
    return drops


def _rounded(values: list[float]) -> list[float]:
    """``values`` to 7 decimals (the file's size)."""
    return [round(value, 7) for value in values]


def samples(model_name: str, model, tokenizer, args) -> list[tuple[str, torch.Tensor, dict, Callable]]:
    """``(article, ids, options of explain, value(model, embeddings))`` of the leave-one-out benchmark's inputs."""
    if model_name == 'minilm':
        found = []
        for title, ids, options in minilm_samples(model, tokenizer, args.data, args.articles, args.context, args.seed):

            def value(model, embeddings, target=options['target']):
                return target(model(inputs_embeds=embeddings).last_hidden_state[:, 0]).item()

            found.append((title, ids, options, value))
        return found
    found = []
    for title, ids in sample_articles(args.data, tokenizer, args.articles, args.context, args.seed):
        ids = torch.tensor([ids])
        with torch.no_grad():
            token = int(model(ids).logits[0, -1].argmax())

        def value(model, embeddings, token=token):
            return model(inputs_embeds=embeddings, use_cache=False).logits[0, -1, token].item()

        found.append((title, ids, {'target': token}, value))
    return found


def run(args) -> dict:
    model, tokenizer = load_minilm(torch.float64) if args.model == 'minilm' else load_smollm2()
    model = model.double()
    eager = copy.deepcopy(model)  # F.softmax of the attention probabilities (SDPA computes them inside)
    eager.set_attn_implementation('eager')
    # SmolLM2 normalises no embeddings: holding all but that norm is holding everything
    sets = [name for name in HELD if args.model == 'minilm' or name != 'all but the embedding norm']
    rows = []
    for title, ids, options, value in tqdm(
        samples(args.model, model, tokenizer, args), desc='articles', mininterval=10
    ):
        relevance = {method: explain(model, ids, method=method, **options).relevance[0] for method in METHODS}
        drops = held_drops(eager, ids, value, args.model == 'smollm2', sets)
        rows.append(
            {
                'article': title,
                'relevance': {method: _rounded(values.tolist()) for method, values in relevance.items()},
                'drops': {name: _rounded(values) for name, values in drops.items()},
            }
        )
    return {'model': args.model, 'special': SPECIAL[args.model], 'sets': sets, 'rows': rows}


#: the special token reported per model: (its position, its name)
SPECIAL = {'minilm': (-1, '[SEP]'), 'smollm2': (0, 'the first token')}


def report(result: dict, header: str) -> list[str]:
    rows = result['rows']
    position, special = result.get('special', SPECIAL['minilm'])
    lines = [
        header,
        '',
        f'{len(rows)} articles; per set of held parts: the drop of zeroing {special} (mean +- standard error) and the '
        "correlation of each method's relevance with the drops of all the tokens (mean over the articles)",
        '',
        f'| held at the unperturbed input | {special} drop | '
        + ' | '.join(f'{label} Spearman | {label} Pearson' for label in METHODS.values())
        + ' |',
        '|---|---|' + '---|---|' * len(METHODS),
    ]
    for name in result.get('sets', HELD):
        diverged = sum(not all(math.isfinite(drop) for drop in row['drops'][name]) for row in rows)
        if diverged:  # a gated product recomputed with the norms held grows without bound (SmolLM2)
            lines.append(f'| {name} | diverges on {diverged} of {len(rows)} articles |' + ' |' * 2 * len(METHODS))
            continue
        mean, sem = mean_sem([row['drops'][name][position] for row in rows])
        cells = [f'{mean:+.3f} +- {sem:.3f}']
        for method in METHODS:
            pairs = [(torch.tensor(row['relevance'][method]), torch.tensor(row['drops'][name])) for row in rows]
            for measure in (spearman, pearson):
                mean, sem = mean_sem([float(measure(relevance, drops)) for relevance, drops in pairs])
                cells.append(f'{mean:+.3f} +- {sem:.3f}')
        lines.append(f'| {name} | ' + ' | '.join(cells) + ' |')
    lines.append('')
    for method, label in METHODS.items():
        mean, sem = mean_sem([row['relevance'][method][position] for row in rows])
        lines.append(f'{label} relevance of {special}: {mean:+.3f} +- {sem:.3f}.')
    return lines


#: the models: option -> (name in the report, file name)
MODELS = {
    'minilm': ('all-MiniLM-L6-v2', 'held_leave_one_out'),
    'smollm2': ('SmolLM2-135M-Instruct', 'held_leave_one_out_smollm2'),
}


def arguments() -> argparse.ArgumentParser:
    parser = sample_arguments(argparse.ArgumentParser(description=__doc__.split('\n\n')[0]))
    parser.add_argument('--model', choices=tuple(MODELS), default='minilm')
    return parser


def main(argv=None) -> None:
    args = arguments().parse_args(argv)
    torch.set_num_threads(args.threads)
    since = (time.time(), os.getloadavg()[0])
    result = run(args)
    name, stem = MODELS[args.model]
    title = f'Leave-one-out with parts of {name} held (float64)'
    written(args, argv, 'held_leave_one_out.py', title, stem, result, report, since)


if __name__ == '__main__':
    main()
