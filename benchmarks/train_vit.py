"""Train a small timm ViT on Fashion-MNIST: the real evaluation model of the ViT benchmarks.

No pretrained ViT can be downloaded here, so this script trains one in a few minutes on 2 CPU cores.

Data
----
Debian package ``dataset-fashion-mnist`` (``apt-get install dataset-fashion-mnist``):
``/usr/share/datasets/fashion-mnist/{train,t10k}-{images,labels}-*.gz`` (idx format, 60,000 training and 10,000
test images of 28 x 28 grey pixels, 10 classes). Splits, fixed by :py:data:`SEED`:

- ``train``: 55,000 of the 60,000 training images (a seeded permutation), used for training;
- ``val``: the other 5,000 training images, held out: the composite search (``composite_search.py``) tunes on it;
- ``test``: the 10,000 official test images: accuracy and the reported faithfulness.

Pixels are fed as they are (floats in [0, 1], background 0, one channel): the input relevance is the pixel
relevance, and the perturbation baseline 0 is the background colour.

Model
-----
``timm.models.vision_transformer.VisionTransformer`` with 28 x 28 input, patch 7 (4 x 4 = 16 patches + class token),
width 64, depth 4, 4 heads, MLP ratio 2, learned position embedding, class-token pooling, 10 classes (about 0.14 M
parameters, 0.6 MB as float32). AdamW (lr 2e-3, weight decay 0.05), batch 128, cosine schedule with 1 warm-up
epoch, 3 epochs, one CPU thread (two threads are much slower on a shared 2-core machine), random horizontal flips;
seeded (``torch.manual_seed``).

Usage::

    python benchmarks/train_vit.py                 # train, write docs/results/vit/fashion_vit.pt and .json
    python benchmarks/train_vit.py --epochs 1      # quicker, less accurate

Other scripts call :py:func:`load_model`, which trains on first use when the weights file is missing.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

SEED = 0
DATA = Path('/usr/share/datasets/fashion-mnist')
RESULTS = Path(__file__).resolve().parents[1] / 'docs' / 'results' / 'vit'
WEIGHTS = RESULTS / 'fashion_vit.pt'
CLASSES = ('T-shirt/top', 'Trouser', 'Pullover', 'Dress', 'Coat', 'Sandal', 'Shirt', 'Sneaker', 'Bag', 'Ankle boot')
#: the architecture (timm VisionTransformer keyword arguments)
ARCHITECTURE = dict(
    img_size=28,
    patch_size=7,
    in_chans=1,
    num_classes=10,
    embed_dim=64,
    depth=4,
    num_heads=4,
    mlp_ratio=2.0,
    qkv_bias=True,
    class_token=True,
    global_pool='token',
)
VALIDATION = 5000


def _read_idx(path: Path) -> np.ndarray:
    with gzip.open(path, 'rb') as handle:
        data = handle.read()
    dims = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], 'big') for i in range(dims))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load_fashion_mnist(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(images [n, 1, 28, 28] float32 in [0, 1], labels [n] int64)`` of ``split`` ('train', 'val' or 'test')."""
    if not DATA.exists():
        raise FileNotFoundError(f'{DATA} is missing: apt-get update && apt-get install -y dataset-fashion-mnist')
    prefix = 't10k' if split == 'test' else 'train'
    images = _read_idx(DATA / f'{prefix}-images-idx3-ubyte.gz')
    labels = _read_idx(DATA / f'{prefix}-labels-idx1-ubyte.gz')
    images = torch.from_numpy(images.copy()).float().div_(255).unsqueeze(1)
    labels = torch.from_numpy(labels.copy()).long()
    if split == 'test':
        return images, labels
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(SEED))
    index = order[:VALIDATION] if split == 'val' else order[VALIDATION:]
    if split not in ('train', 'val'):
        raise ValueError(f'unknown split {split!r}')
    return images[index], labels[index]


def build_model() -> torch.nn.Module:
    """The untrained architecture."""
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(**ARCHITECTURE)


def load_model(path: Path = WEIGHTS, train_if_missing: bool = True) -> torch.nn.Module:
    """The trained model in eval mode; trains it first (a few minutes) if ``path`` does not exist."""
    if not path.exists():
        if not train_if_missing:
            raise FileNotFoundError(path)
        train(path=path)
    model = build_model()
    model.load_state_dict(torch.load(path, map_location='cpu', weights_only=True))
    return model.eval()


@torch.no_grad()
def accuracy(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, batch: int = 1000) -> float:
    model.eval()
    correct = sum(
        int((model(images[i : i + batch]).argmax(-1) == labels[i : i + batch]).sum())
        for i in range(0, len(labels), batch)
    )
    return correct / len(labels)


def train(epochs: int = 3, batch_size: int = 128, lr: float = 2e-3, path: Path = WEIGHTS, threads: int = 1) -> dict:
    torch.manual_seed(SEED)
    torch.set_num_threads(threads)
    images, labels = load_fashion_mnist('train')
    val_images, val_labels = load_fashion_mnist('val')
    test_images, test_labels = load_fashion_mnist('test')
    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05)
    steps_per_epoch = math.ceil(len(labels) / batch_size)
    total, warmup = epochs * steps_per_epoch, steps_per_epoch

    def schedule(step):
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    generator = torch.Generator().manual_seed(SEED)
    start = time.time()
    for epoch in range(epochs):
        model.train()
        order = torch.randperm(len(labels), generator=generator)
        running = 0.0
        for step in range(steps_per_epoch):
            index = order[step * batch_size : (step + 1) * batch_size]
            x, y = images[index], labels[index]
            flip = torch.rand(len(index), generator=generator) < 0.5
            x = torch.where(flip[:, None, None, None], x.flip(-1), x)
            loss = torch.nn.functional.cross_entropy(model(x), y, label_smoothing=0.1)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            running += float(loss.detach())
        val = accuracy(model, val_images, val_labels)
        print(
            f'epoch {epoch + 1}/{epochs}: loss {running / steps_per_epoch:.4f}, val accuracy {val:.4f}, '
            f'{time.time() - start:.0f} s',
            flush=True,
        )
    model.eval()
    result = {
        'architecture': ARCHITECTURE,
        'epochs': epochs,
        'batch_size': batch_size,
        'lr': lr,
        'seed': SEED,
        'parameters': sum(p.numel() for p in model.parameters()),
        'val_accuracy': accuracy(model, val_images, val_labels),
        'test_accuracy': accuracy(model, test_images, test_labels),
        'train_seconds': round(time.time() - start, 1),
        'torch': torch.__version__,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), path)
    path.with_suffix('.json').write_text(json.dumps(result, indent=2) + '\n')
    print(json.dumps(result, indent=2))
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--epochs', type=int, default=3)
    parser.add_argument('--batch-size', type=int, default=128)
    parser.add_argument('--lr', type=float, default=2e-3)
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--out', type=Path, default=WEIGHTS)
    args = parser.parse_args()
    train(args.epochs, args.batch_size, args.lr, args.out, args.threads)


if __name__ == '__main__':
    main()
