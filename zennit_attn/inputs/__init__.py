"""Requests and inputs: from what a user passes (ids, texts, chats, images with a processor, targets, contrasts) to
a :py:class:`~zennit_attn.inputs.task.Task`, the model run that every method explains."""
