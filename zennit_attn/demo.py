"""``python -m zennit_attn.demo`` (``make demo``): the same as ``zennit-attn demo``
(:py:mod:`zennit_attn.cli.demo`), which explains why SmolLM2-135M-Instruct predicts " Paris" and writes
``heatmap.html``."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from .cli import main as cli_main

__all__ = ['main']


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``zennit-attn demo`` with the options ``argv`` (default: the command line); returns the exit status."""
    return cli_main(['demo', *(sys.argv[1:] if argv is None else argv)])


if __name__ == '__main__':
    sys.exit(main())
