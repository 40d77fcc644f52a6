"""``python -m zennit_attn``: run the demo (same options as ``python -m zennit_attn.demo``)."""
import sys

from .demo import main

sys.exit(main())
