"""Write ``fashion_mnist_samples.pt``: the few Fashion-MNIST images the notebooks use, so that they run anywhere.

Source: the Debian package ``dataset-fashion-mnist`` (``/usr/share/datasets/fashion-mnist``; Fashion-MNIST by
Zalando Research, MIT licence), read and split exactly as ``benchmarks/train_vit.py`` does:

- ``test_images``/``test_labels``: the first 16 images of the official test split (never seen in training or in
  the composite search of ``benchmarks/composite_search.py``);
- ``val_images``/``val_labels``: the first 16 images of the held-out validation split (5,000 training images
  that the model was not trained on; the composite search tunes on this split).

Images are stored as ``uint8`` ``[16, 1, 28, 28]`` (the notebooks divide by 255, as the training script does).

Usage (from the repository root, after ``apt-get install dataset-fashion-mnist``)::

    python notebooks/data/make_fashion_samples.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / 'benchmarks'))

from train_vit import CLASSES, load_fashion_mnist  # noqa: E402

COUNT = 16
OUT = Path(__file__).resolve().parent / 'fashion_mnist_samples.pt'


def main():
    samples = {'classes': list(CLASSES)}
    for split in ('test', 'val'):
        images, labels = load_fashion_mnist(split)
        samples[f'{split}_images'] = (images[:COUNT] * 255).round().to(torch.uint8).contiguous()
        samples[f'{split}_labels'] = labels[:COUNT].clone()
    torch.save(samples, OUT)
    print(f'wrote {OUT} ({OUT.stat().st_size} bytes)')


if __name__ == '__main__':
    main()
