"""``python -m zennit_attn``: the ``zennit-attn`` command line (``python -m zennit_attn demo`` runs the demo)."""

import sys

from .cli import main

sys.exit(main())
