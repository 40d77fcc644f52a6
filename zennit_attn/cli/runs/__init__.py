"""The run step of each command of :py:mod:`zennit_attn.cli`, one module per command, named as the command's own
module: imported (with torch, transformers and the rest of the library) only when the command runs, by the command's
``run`` (:py:func:`zennit_attn.cli.library.heavy`), after its arguments were checked."""
