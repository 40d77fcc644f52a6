"""Parity of zennit-attn's PA-LRP (``method='palrp'``) with the authors' implementation (Bakish et al. 2025).

The authors' code (github.com/YardenBakish/PE-AWARE-LRP, folder ``NLP``) is a fork of LXT with its own copy of
transformers' Llama (``lxt.models.llama_PE``), written for transformers 4.4x: it does not run next to transformers 5.
So the comparison has two steps in two environments:

1. ``reference``, in an environment with transformers 4.47 and the authors' ``NLP`` folder (``--palrp``; its ``lxt``
   imports ``tabulate`` and, for quantized layers, ``bitsandbytes``): for tiny random Llamas (float64, seeded, 1 and
   2 layers) the authors' PA-LRP of the top logit at the last position, as their demo computes it (one ``(cos, sin)``
   per layer passed as ``position_embeddings``, the relevance read as the gradient of the embeddings and of every
   ``cos`` and ``sin``), and their AttnLRP (no ``position_embeddings``: the positions detached); the weights and the
   relevance go to ``--out``. ``--stabilisers off`` sets every default ``epsilon`` of the authors' rules and functions
   (their linear layers' 1e-8, the attention-value product's 1e-6, the additions' and products' 1e-8) to 1e-300 in
   that process (:py:func:`_stabilisers_off`; zennit-attn's rules have no such stabilisers), to tell their share of
   the difference from the rest.
2. ``compare``, here: the same weights in transformers 5, :py:func:`zennit_attn.explain` with ``method='palrp'`` and
   ``'attnlrp'``: the position relevance against the authors' (their per-layer ``cos`` and ``sin`` summed, signed),
   the share the tokens give up to the positions (PA-LRP's tokens minus AttnLRP's) against theirs, and AttnLRP's
   tokens against theirs (the difference of the two implementations without positions); each as the largest
   difference over the authors' largest AttnLRP token relevance (the scale of the explanation), the authors' largest
   value in brackets.

Example::

    PYTHONPATH=/tmp/transformers-4.47 python benchmarks/palrp_parity.py reference --palrp ../PE-AWARE-LRP/NLP
    python benchmarks/palrp_parity.py compare
    PYTHONPATH=/tmp/transformers-4.47 python benchmarks/palrp_parity.py reference --palrp ../PE-AWARE-LRP/NLP \
        --stabilisers off
    python benchmarks/palrp_parity.py compare --stabilisers off
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
from pathlib import Path

import torch
import transformers

#: The input explained (ids of the tiny vocabulary).
IDS = torch.tensor([[5, 17, 3, 28, 9, 14, 22, 41, 7]])
#: The tiny Llama's configuration (besides the number of layers).
CONFIG = dict(
    vocab_size=50,
    hidden_size=32,
    intermediate_size=48,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    rms_norm_eps=1e-6,
)


def reference(args) -> None:
    """Step 1: the authors' PA-LRP and AttnLRP, written to ``--out``."""
    sys.path.insert(0, str(Path(args.palrp).resolve()))
    authors = importlib.import_module('lxt.models.llama_PE')
    if args.stabilisers == 'off':
        changed = _stabilisers_off([importlib.import_module('lxt.functional'), importlib.import_module('lxt.rules')])
        print(f"the authors' stabilisers set to {TINY:g}: {', '.join(changed)}")
    for layers in args.layers:
        torch.manual_seed(layers)
        config = transformers.LlamaConfig(**CONFIG, num_hidden_layers=layers)
        config._attn_implementation = 'eager'
        model = authors.LlamaForCausalLM(config).double().eval()
        for parameter in model.parameters():
            parameter.requires_grad_(False)
        authors.attnlrp.register(model)
        result = {'weights': {key.replace('.module.', '.'): value for key, value in model.state_dict().items()}}
        for positions in (True, False):
            embeddings = model.get_input_embeddings()(IDS).detach().requires_grad_()
            position_ids = torch.arange(0.0, IDS.shape[1], dtype=torch.float64, requires_grad=True)[None]
            tables = [model.get_input_pos_embeddings()(embeddings, position_ids) for _ in range(layers)]
            tables = [tuple(table.detach().requires_grad_() for table in pair) for pair in tables]
            extra = {'position_embeddings': tables} if positions else {}
            logits = model(inputs_embeds=embeddings, use_cache=False, **extra)['logits']
            top = logits[0, -1].max()
            top.backward(top)
            key = 'palrp' if positions else 'attnlrp'
            result[key] = embeddings.grad.sum(-1)[0]
            if positions:
                result['positions'] = sum(cos.grad.sum(-1)[0] + sin.grad.sum(-1)[0] for cos, sin in tables)
            result['target'] = int(logits[0, -1].argmax())
        torch.save(result, _reference_file(args, layers))
        print(f'{layers} layer(s): written')


def compare(args) -> None:
    """Step 2: zennit-attn on the same weights against the authors' relevance."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    explain = importlib.import_module('zennit_attn').explain
    print(
        '| layers | positions | tokens given up to the positions | AttnLRP tokens |  (largest difference, and in '
        "brackets the authors' largest value, over the authors' largest AttnLRP token relevance)"
    )
    print('|---|---|---|---|')
    for layers in args.layers:
        found = torch.load(_reference_file(args, layers), weights_only=False)
        config = transformers.LlamaConfig(**CONFIG, num_hidden_layers=layers, attn_implementation='eager')
        model = transformers.LlamaForCausalLM(config).double().eval()
        model.load_state_dict(found['weights'])
        palrp = explain(model, IDS, target=found['target'], method='palrp')
        attnlrp = explain(model, IDS, target=found['target'], method='attnlrp')

        scale = found['attnlrp'].abs().max()
        cells = [
            _relative(palrp.position_relevance[0], found['positions'], scale),
            _relative(palrp.relevance[0] - attnlrp.relevance[0], found['palrp'] - found['attnlrp'], scale),
            _relative(attnlrp.relevance[0], found['attnlrp'], scale),
        ]
        print(f'| {layers} | ' + ' | '.join(cells) + ' |')


#: The stabiliser the authors' rules get with ``--stabilisers off``.
TINY = 1e-300


def _stabilisers_off(modules: list) -> list[str]:
    """Set the default ``epsilon`` of every function, and of every class's ``__init__`` and ``forward``, of the
    authors' ``modules`` to :data:`TINY` (in this process only: the reference step's). Returns their names."""
    changed = []
    for module in modules:
        for name, value in vars(module).items():
            functions = [value] if inspect.isfunction(value) else []
            if inspect.isclass(value) and value.__module__ == module.__name__:
                functions = [vars(value)[key] for key in ('__init__', 'forward') if key in vars(value)]
            for function in functions:
                function = getattr(function, '__func__', function)  # a staticmethod's function
                parameters = [p for p in inspect.signature(function).parameters.values() if p.default is not p.empty]
                if any(parameter.name == 'epsilon' for parameter in parameters):
                    function.__defaults__ = tuple(
                        TINY if parameter.name == 'epsilon' else parameter.default for parameter in parameters
                    )
                    changed.append(f'{name}.{function.__name__}' if inspect.isclass(value) else name)
    return changed


def _reference_file(args, layers: int) -> Path:
    """The file of the authors' relevance for ``layers`` layers (with ``--stabilisers off``: its own file)."""
    return Path(args.out) / f'palrp_reference_{layers}{"_stabilisers_off" if args.stabilisers == "off" else ""}.pt'


def _relative(ours: torch.Tensor, theirs: torch.Tensor, scale: torch.Tensor) -> str:
    """The largest difference of ``ours`` and ``theirs``, and in brackets the largest of ``theirs``, over ``scale``."""
    return f'{float((ours - theirs).abs().max() / scale):.1e} ({float(theirs.abs().max() / scale):.1e})'


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('step', choices=('reference', 'compare'))
    parser.add_argument('--palrp', help="the authors' NLP folder (step reference)")
    parser.add_argument('--layers', type=int, nargs='+', default=[1, 2])
    parser.add_argument('--out', default='.', help='folder of the reference files (default: here)')
    parser.add_argument(
        '--stabilisers',
        choices=('authors', 'off'),
        default='authors',
        help="the authors' epsilon stabilisers as they are (default) or set to 1e-300",
    )
    args = parser.parse_args(argv)
    (reference if args.step == 'reference' else compare)(args)


if __name__ == '__main__':
    main()
