"""PA-LRP's positions on a vision transformer: the pixel-flipping benchmark of the Fashion-MNIST ViT.

The model, the images and the metric are those of ``benchmarks/composite_search.py`` (``docs/results/vit``): the timm
ViT trained by ``benchmarks/train_vit.py`` (28 x 28 grey pixels, patch 7: 16 patches and the class token, a learned
position table), the first ``--images`` official test images, their predicted class, single pixels set to 0 (the
background) in ``--steps`` steps, ``A_LeRF - A_MoRF`` of the logit per image (larger is better). Each image is
explained once per composite by PA-LRP (``positions=True``: the table is an input of the explanation,
:py:mod:`zennit_attn.rules.positions`; one image at a time) and its relevance variants are scored on the same curves:

- ``pixels``: the pixel relevance, PA-LRP's and AttnLRP's alike (the table takes what the constant absorbed; the
  patches keep theirs);
- ``pixels + positions``: plus each patch's position relevance spread evenly over its pixels (``with_positions()``);
- ``pixels + abs(positions)``: plus the magnitude instead, as the authors' vision demo adds its position map.

For the paper's ViT composite (``AttnLRPGamma``) and for epsilon everywhere (the best composite of the search there).
Mean +- standard error over the images, each variant's mean difference to the pixels of its composite on the same
images (paired, +- its standard error), the seconds of one explanation and the load average, printed and written to
``--out`` (``positions.md``; with ``--patch-size 7``, the model's patches flipped whole, ``positions_patch7.md``). Run
alone::

    python benchmarks/vit_positions.py --images 500
    python benchmarks/vit_positions.py --images 500 --patch-size 7
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / 'benchmarks'))

import train_vit  # noqa: E402
from composite_search import epsilon_everywhere  # noqa: E402

from zennit_attn import explain  # noqa: E402
from zennit_attn.composites import AttnLRPGamma  # noqa: E402
from zennit_attn.core.modules import output_scores  # noqa: E402
from zennit_attn.workflows.evaluation import image_curves, mean_sem  # noqa: E402

#: name -> the composite of PA-LRP (with ``positions=True``)
COMPOSITES = {
    'AttnLRPGamma() (the paper default)': lambda: AttnLRPGamma(positions=True),
    'epsilon everywhere (best of the search)': lambda: epsilon_everywhere(positions=True),
}


#: variant -> ``[batch, H, W]`` relevance of an explanation
VARIANTS = {
    'pixels': lambda explanation: explanation.relevance,
    'pixels + positions': lambda explanation: explanation.with_positions().relevance,
    'pixels + abs(positions)': lambda explanation: (
        explanation.relevance + explanation.position_pixel_relevance.abs().sum(1)
    ),
}


def relevance_of(model, images, targets, composite) -> tuple[dict[str, torch.Tensor], float]:
    """``variant -> [images, H, W]`` relevance of PA-LRP with ``composite`` (one image at a time), and the seconds of
    one explanation."""
    found = {name: [] for name in VARIANTS}
    start = time.perf_counter()
    for image, target in zip(tqdm(images, desc='explain', leave=False), targets):
        explanation = explain(model, image[None], target=int(target), method='palrp', composite=composite())
        for name, variant in VARIANTS.items():
            found[name].append(variant(explanation))
    seconds = (time.perf_counter() - start) / len(images)
    return {name: torch.cat(values) for name, values in found.items()}, seconds


def scores(model, images, relevance, targets, steps, patch_size) -> list[float]:
    curves = image_curves(
        model, images, relevance, targets, steps, 'flipping', patch_size=patch_size, batch_size=512, progress=False
    )
    return [curve.score for curve in curves]


def table(results: dict) -> list[str]:
    lines = [
        '| composite | relevance per pixel | flipping score | minus the pixels, paired | higher on | s / image |',
        '|---|---|---|---|---|---|',
    ]
    for composite, (by_variant, seconds) in results.items():
        base = by_variant['pixels']
        for name, values in by_variant.items():
            mean, sem = mean_sem(values)
            paired = (
                '' if name == 'pixels' else '{:+.4f} +- {:.4f}'.format(*mean_sem([a - b for a, b in zip(values, base)]))
            )
            higher = '' if name == 'pixels' else f'{sum(a > b for a, b in zip(values, base))} of {len(values)}'
            lines.append(f'| {composite} | {name} | {mean:.4f} +- {sem:.4f} | {paired} | {higher} | {seconds:.3f} |')
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--images', type=int, default=500)
    parser.add_argument('--steps', type=int, default=16)
    parser.add_argument(
        '--patch-size', type=int, default=1, help="pixels flipped together: 1 (default), 7 (the model's patches)"
    )
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--out', type=Path, default=train_vit.RESULTS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    load = os.getloadavg()
    model = train_vit.load_model()
    images = train_vit.load_fashion_mnist('test')[0][: args.images]
    with torch.no_grad():
        targets = output_scores(model(images)).argmax(-1)
    results = {}
    for name, composite in COMPOSITES.items():
        relevance, seconds = relevance_of(model, images, targets, composite)
        found = {
            variant: scores(model, images, values, targets, args.steps, args.patch_size)
            for variant, values in relevance.items()
        }
        results[name] = (found, seconds)
    lines = [
        f'Pixel flipping on the first {args.images} Fashion-MNIST test images, {args.steps} steps, squares of '
        f'{args.patch_size} x {args.patch_size} pixels (ranked by their relevance summed) set to 0, logit of the '
        'predicted class; score = A_LeRF - A_MoRF (mean +- standard error over the images).',
        '',
        *table(results),
        '',
        f'Command: `python benchmarks/vit_positions.py {shlex.join(argv if argv is not None else sys.argv[1:])}`; '
        f'{args.threads} thread(s); load average (1, 5, 15 min) {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} -> '
        '{:.2f}, {:.2f}, {:.2f}.'.format(*os.getloadavg()),
    ]
    print('\n'.join(lines))
    name = 'positions.md' if args.patch_size == 1 else f'positions_patch{args.patch_size}.md'
    (args.out / name).write_text('# PA-LRP on the Fashion-MNIST ViT\n\n' + '\n'.join(lines) + '\n')


if __name__ == '__main__':
    main()
