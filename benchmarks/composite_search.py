"""Composite grid search for the Fashion-MNIST ViT (``--modality vit``, the default) or SmolLM2-135M-Instruct
(``--modality text``), and the held-out faithfulness of the result next to the paper's default and the baselines.

Text (``--modality text``): the search space :data:`zennit_attn.workflows.evaluation.search.TEXT_GRID` (epsilon values
and gamma on the MLP / LM-head linears and on the attention projections; 24 composites, one of them the paper's default
for language models, ``AttnLRPEpsilon()``) is scored by the token faithfulness of ``benchmarks/faithfulness.py``
(whole word embeddings set to 0, 16 flipping steps, ``A_LeRF - A_MoRF`` of the predicted next token's logit, mean
over ``--val-articles`` validation articles: the articles of the seeded Wikipedia sample that follow the first
``--test-articles``). The best composite, ``AttnLRPEpsilon()`` and ``CPLRPEpsilon()`` are then compared on the first
``--test-articles`` articles (never used in the search; the first ones of the faithfulness study), flipping and
insertion. Outputs in ``docs/results/text_search/``: ``search.csv`` / ``search.md`` (ranked),
``test_faithfulness.csv`` / ``.md``, ``search_meta.json``.

Vision (the default):

1. Search (validation split): every combination of the rule options below per layer type
   (:py:func:`zennit_attn.workflows.evaluation.search.composite_search`) is scored by the pixel faithfulness (flipping
   single pixels to 0, :data:`STEPS` steps, ``A_LeRF - A_MoRF`` of the predicted class's logit, mean over
   :data:`VAL_IMAGES` images of the held-out validation split of ``train_vit.py``). Output:
   ``docs/results/vit/search.csv`` and ``search.md`` (ranked), and the best composite printed as Python.
2. Test (first :data:`TEST_IMAGES` images of the official test split, never used in the search): the same metric
   for the best composite, the paper's default composite (``AttnLRPGamma()``), epsilon everywhere, CP-LRP with the
   gamma composite (``CPLRPGamma()``), CP-LRP with epsilon, and the image baselines (input x gradient, Integrated
   Gradients, SmoothGrad, attention rollout, gradient x attention rollout, Grad-CAM, random). Output:
   ``docs/results/vit/test_faithfulness.csv`` / ``.md`` and overlays of a few test images in
   ``docs/results/vit/heatmaps/``.

Usage::

    nice -n 10 python benchmarks/composite_search.py            # about 20-25 minutes on a shared 2-core CPU
    python benchmarks/composite_search.py --quick               # tiny grid and few images: a smoke test
    python benchmarks/composite_search.py --modality text       # about 20 minutes on 2 free CPU cores
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import faithfulness as study  # noqa: E402  (the language model and the article sample of the faithfulness study)
import train_vit  # noqa: E402

from zennit_attn import explain  # noqa: E402
from zennit_attn.composites import AttnLRPEpsilon, AttnLRPGamma, CPLRPEpsilon, CPLRPGamma  # noqa: E402
from zennit_attn.core.modules import output_scores  # noqa: E402
from zennit_attn.methods.propagation import lrp_method  # noqa: E402
from zennit_attn.rules import ConstantGates, Epsilon, Uniform  # noqa: E402
from zennit_attn.workflows.evaluation import Faithfulness, explanation_curves, image_curves  # noqa: E402
from zennit_attn.workflows.evaluation.search import TEXT_GRID, composite_search, faithfulness_objective  # noqa: E402

STEPS = 16
VAL_IMAGES = 200
TEST_IMAGES = 500
#: 5 * 6 * 2 * 2 * 2 = 240 composites (about 5 s each for 200 images on one shared CPU core)
GRID = {
    'conv': ['Epsilon(1e-06)', 'Gamma(0.1)', 'Gamma(0.25)', 'Gamma(0.5)', 'ZPlus()'],
    'linear': ['Epsilon(1e-06)', 'Gamma(0.01)', 'Gamma(0.05)', 'Gamma(0.25)', 'ZPlus()', 'AlphaBeta(2.0, 1.0)'],
    'attention_in': ['Epsilon(1e-06)', 'Gamma(0.05)'],
    'attention_out': ['Epsilon(1e-06)', 'Gamma(0.05)'],
    'product': ['Uniform()', 'ConstantGates()'],
}
QUICK_GRID = {
    'conv': ['Epsilon(1e-06)', 'Gamma(0.25)'],
    'linear': ['Epsilon(1e-06)', 'Gamma(0.05)'],
    'product': ['Uniform()', 'ConstantGates()'],
}
RESULTS = train_vit.RESULTS
TEXT_RESULTS = Path(__file__).resolve().parents[1] / 'docs' / 'results' / 'text_search'


def epsilon_everywhere(product=Uniform, positions: bool = False):
    eps = Epsilon(1e-6)
    return AttnLRPGamma(
        conv=eps, linear=eps, attention_in=eps, attention_out=eps, product=product(), positions=positions
    )


def test_methods(best_composite):
    """``name -> (method, composite or None, params)`` of the test comparison."""
    return {
        'AttnLRP, best composite of the search': (lrp_method(best_composite), best_composite, {}),
        'AttnLRP, paper default AttnLRPGamma()': ('attnlrp', AttnLRPGamma(), {}),
        'AttnLRP, epsilon everywhere': ('attnlrp', epsilon_everywhere(), {}),
        'gamma-CP-LRP, CPLRPGamma()': ('cplrp', CPLRPGamma(), {}),
        'CP-LRP, epsilon everywhere': ('cplrp', epsilon_everywhere(ConstantGates), {}),
        'Input x Gradient': ('input_x_gradient', None, {}),
        'Integrated Gradients (20 steps)': ('integrated_gradients', None, {}),
        'SmoothGrad (sigma 0.1, 20 samples)': ('smoothgrad', None, {}),
        'Attention rollout': ('attention_rollout', None, {}),
        'Grad x attention rollout': ('grad_attention_rollout', None, {}),
        'Grad-CAM (last layer)': ('gradcam', None, {}),
        'Random': ('random', None, {}),
    }


def evaluate(model, pixels, targets, name, method, composite, params, chunk=100):
    start = time.time()
    relevance = []
    for i in range(0, len(pixels), chunk):
        relevance.append(
            explain(
                model,
                pixels[i : i + chunk],
                target=targets[i : i + chunk],
                composite=composite,
                method=method,
                **params,
            ).relevance
        )
    seconds = time.time() - start
    curves = image_curves(
        model, pixels, torch.cat(relevance), targets, STEPS, 'flipping', batch_size=512, progress=False
    )
    summary = Faithfulness.of(curves)
    return {
        'method': name,
        'score': summary.score,
        'sem': summary.sem,
        'area_morf': summary.area_morf,
        'area_lerf': summary.area_lerf,
        'explain_seconds': round(seconds, 2),
    }, torch.cat(relevance)


def markdown(rows, columns):
    lines = ['| ' + ' | '.join(columns) + ' |', '|' + '|'.join('---' for _ in columns) + '|']
    for row in rows:
        lines.append(
            '| ' + ' | '.join(f'{row[c]:.4f}' if isinstance(row[c], float) else str(row[c]) for c in columns) + ' |'
        )
    return '\n'.join(lines) + '\n'


def evaluate_text(model, ids, composite, method, chunk=10):
    """Flipping and insertion summaries of ``explain(model, ids, composite=...)`` (``chunk`` articles per call)."""
    start = time.time()
    explanations = [
        explain(model, ids[i : i + chunk], composite=composite, method=method) for i in range(0, len(ids), chunk)
    ]
    seconds = time.time() - start
    curves = [
        row
        for explanation in explanations
        for row in explanation_curves(
            model, explanation, STEPS, ('flipping', 'insertion'), batch_size=512, progress=False
        )
    ]
    return {mode: Faithfulness.of([row[mode] for row in curves]) for mode in ('flipping', 'insertion')}, seconds


def text_main(args):
    """The language-model search (see the module documentation)."""
    out = args.out if args.out != RESULTS else TEXT_RESULTS
    out.mkdir(parents=True, exist_ok=True)
    load_start = os.getloadavg()
    model, tokenizer = study.load_model(argparse.Namespace(model_dir=None, gguf_file=None, device='cpu'))
    test = study.sample_articles(None, tokenizer, args.test_articles, args.context, seed=0)
    val = study.sample_articles(None, tokenizer, args.val_articles, args.context, seed=0, skip=args.test_articles)
    test_ids = torch.tensor([ids for _, ids in test])
    val_ids = torch.tensor([ids for _, ids in val])

    start = time.time()
    result = composite_search(
        model, val_ids, grid=TEXT_GRID, objective=faithfulness_objective(steps=STEPS, batch_size=512)
    )
    search_seconds = time.time() - start
    result.write(out / 'search')
    print(result.to_markdown())
    print(f'search: {len(result.rows)} composites on {len(val)} validation articles in {search_seconds:.0f} s')
    print('Best composite:\n' + result.best_code())

    compared = {
        'AttnLRP, best composite of the search': (result.best_method(), result.best_composite()),
        'AttnLRP, paper default AttnLRPEpsilon()': ('attnlrp', AttnLRPEpsilon()),
        'CP-LRP, CPLRPEpsilon()': ('cplrp', CPLRPEpsilon()),
    }
    rows = []
    for name, (method, composite) in compared.items():
        summaries, seconds = evaluate_text(model, test_ids, composite, method)
        row = {'method': name, 'explain_seconds': round(seconds, 2)}
        for mode, summary in summaries.items():
            row.update({f'{mode}_score': summary.score, f'{mode}_sem': summary.sem})
        rows.append(row)
        print(
            f'{name:<42} flipping {row["flipping_score"]:.3f} +- {row["flipping_sem"]:.3f}, insertion '
            f'{row["insertion_score"]:.3f} +- {row["insertion_sem"]:.3f}',
            flush=True,
        )
    columns = ['method', 'flipping_score', 'flipping_sem', 'insertion_score', 'insertion_sem', 'explain_seconds']
    with (out / 'test_faithfulness.csv').open('w', newline='') as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    load_end = os.getloadavg()
    (out / 'test_faithfulness.md').write_text(
        f'Token faithfulness of SmolLM2-135M-Instruct on the first {len(test)} articles of the seeded Wikipedia '
        f'sample (never used in the search; the first articles of `benchmarks/faithfulness.py`), their first '
        f"{args.context} tokens, the predicted next token's logit, {STEPS} steps, word embeddings set to 0 "
        '(flipping, score A_LeRF - A_MoRF) or restored from 0 (insertion, A_MoRF - A_LeRF); mean +- standard error '
        'over articles, larger is better. The search ranked the '
        f'{len(result.rows)} composites of `TEXT_GRID` by flipping on {len(val)} validation articles (the '
        f'following articles of the sample) in {search_seconds:.0f} s. Load average (1, 5, 15 min): '
        f'{", ".join(f"{v:.2f}" for v in load_start)} at the start, {", ".join(f"{v:.2f}" for v in load_end)} at '
        'the end.\n\n'
        + markdown(rows, columns)
        + '\nBest composite of the search (validation articles):\n\n```python\n'
        + result.best_code()
        + '\n```\n'
    )
    (out / 'search_meta.json').write_text(
        json.dumps(
            {
                'validation_articles': len(val),
                'test_articles': len(test),
                'context': args.context,
                'steps': STEPS,
                'composites': len(result.rows),
                'search_seconds': round(search_seconds, 1),
                'grid': TEXT_GRID,
                'best': result.best.labels(),
                'threads': torch.get_num_threads(),
            },
            indent=2,
        )
        + '\n'
    )


def main():
    global STEPS
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--modality', choices=('vit', 'text'), default='vit')
    parser.add_argument('--quick', action='store_true', help='vit: tiny grid, 20 validation and 40 test images')
    parser.add_argument('--val-images', type=int, default=VAL_IMAGES)
    parser.add_argument('--test-images', type=int, default=TEST_IMAGES)
    parser.add_argument('--val-articles', type=int, default=12, help='text: validation articles of the search')
    parser.add_argument('--test-articles', type=int, default=50, help='text: held-out articles of the comparison')
    parser.add_argument('--context', type=int, default=64, help='text: tokens per article')
    parser.add_argument('--steps', type=int, default=STEPS)
    parser.add_argument('--threads', type=int, default=None, help='torch threads (default: 1 for vit, all for text)')
    parser.add_argument('--out', type=Path, default=RESULTS)
    args = parser.parse_args()
    STEPS = args.steps
    if args.threads or args.modality == 'vit':
        torch.set_num_threads(args.threads or 1)
    if args.modality == 'text':
        text_main(args)
        return
    val_count, test_count = (20, 40) if args.quick else (args.val_images, args.test_images)
    grid = QUICK_GRID if args.quick else GRID
    out = args.out / 'quick' if args.quick else args.out
    out.mkdir(parents=True, exist_ok=True)

    model = train_vit.load_model()
    val_pixels = train_vit.load_fashion_mnist('val')[0][:val_count]
    test_pixels, test_labels = train_vit.load_fashion_mnist('test')
    test_pixels, test_labels = test_pixels[:test_count], test_labels[:test_count]
    with torch.no_grad():
        val_targets = output_scores(model(val_pixels)).argmax(-1)
        test_targets = output_scores(model(test_pixels)).argmax(-1)

    start = time.time()
    result = composite_search(
        model, val_pixels, val_targets, grid=grid, objective=faithfulness_objective(steps=STEPS, batch_size=512)
    )
    search_seconds = time.time() - start
    result.write(out / 'search')
    print(result.to_markdown(limit=15))
    print(f'search: {len(result.rows)} composites on {val_count} validation images in {search_seconds:.0f} s')
    print('Best composite:\n' + result.best_code())

    rows, relevances = [], {}
    for name, (method, composite, params) in test_methods(result.best_composite()).items():
        row, relevance = evaluate(model, test_pixels, test_targets, name, method, composite, params)
        rows.append(row)
        relevances[name] = relevance
        print(f'{name:<42} {row["score"]:.4f} +- {row["sem"]:.4f}', flush=True)
    accuracy = float((test_targets == test_labels).float().mean())
    write_vit_results(out, rows, result, accuracy, test_count)
    (out / 'search_meta.json').write_text(
        json.dumps(
            {
                'validation_images': val_count,
                'test_images': test_count,
                'steps': STEPS,
                'composites': len(result.rows),
                'search_seconds': round(search_seconds, 1),
                'grid': grid,
                'best': result.best.labels(),
                'threads': args.threads,
            },
            indent=2,
        )
        + '\n'
    )
    save_vit_heatmaps(out, test_pixels, relevances)


def write_vit_results(out: Path, rows: list[dict], result, accuracy: float, test_count: int) -> None:
    """``test_faithfulness.csv`` and ``.md``: the pixel flipping score of every method on the test images, and the
    best composite of the search."""
    columns = ['method', 'score', 'sem', 'area_morf', 'area_lerf', 'explain_seconds']
    with (out / 'test_faithfulness.csv').open('w', newline='') as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    (out / 'test_faithfulness.md').write_text(
        f'Pixel flipping on the first {test_count} Fashion-MNIST test images (model accuracy on them: '
        f'{accuracy:.4f}), {STEPS} steps, single pixels set to 0, logit of the predicted class; score = A_LeRF - '
        f'A_MoRF (mean +- standard error over images; larger is better).\n\n'
        + markdown(rows, columns)
        + '\nBest composite of the search (validation split):\n\n```python\n'
        + result.best_code()
        + '\n```\n'
    )


def save_vit_heatmaps(out: Path, test_pixels: torch.Tensor, relevances: dict) -> None:
    """``heatmaps/``: a sheet of the first 6 test images with the heatmaps of six methods, and the overlays of the
    paper's default composite on the first 3."""
    from PIL import Image

    from zennit_attn.results.render.image import heatmap, overlay

    shown = [
        'AttnLRP, best composite of the search',
        'AttnLRP, paper default AttnLRPGamma()',
        'AttnLRP, epsilon everywhere',
        'gamma-CP-LRP, CPLRPGamma()',
        'Integrated Gradients (20 steps)',
        'Grad x attention rollout',
    ]
    scale, count = 4, 6
    size = 28 * scale
    sheet = Image.new('RGB', (size * (len(shown) + 1), size * count), 'white')
    for row in range(count):
        sheet.paste(overlay(test_pixels[row], torch.zeros(28, 28), scale=scale), (0, row * size))
        for column, name in enumerate(shown, 1):
            sheet.paste(heatmap(relevances[name][row], scale=scale), (column * size, row * size))
    (out / 'heatmaps').mkdir(exist_ok=True)
    sheet.save(out / 'heatmaps' / 'test_heatmaps.png')
    for row in range(3):
        overlay(test_pixels[row], relevances[shown[1]][row], scale=scale).save(
            out / 'heatmaps' / f'test{row}_attnlrp_gamma_overlay.png'
        )
    (out / 'heatmaps' / 'README.md').write_text(
        'test_heatmaps.png: rows = the first 6 test images; columns = input, then '
        + ', '.join(shown)
        + ' (red positive, blue negative, each heatmap scaled to its largest absolute value).\n'
    )


if __name__ == '__main__':
    main()
