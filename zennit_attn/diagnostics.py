"""Where relevance goes: the relevance sum at every layer boundary of a model against the explained logit."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .explain import TargetLike, attribute


@dataclass
class ConservationReport:
    """Relevance sums at the layer boundaries, from the output down to the input.

    Attributes
    ----------
    logit: torch.Tensor
        ``[batch]`` the explained logit (the initial relevance).
    names: list of str
        Boundary names, output first: ``output of <layer path>``, ``input of <first layer>``, ``word embeddings``,
        ``other embeddings`` (position / segment embeddings, where the model has them).
    sums: torch.Tensor
        ``[len(names), batch]`` relevance summed over positions and hidden units at each boundary.
    """
    logit: torch.Tensor
    names: list[str]
    sums: torch.Tensor

    @property
    def fractions(self) -> torch.Tensor:
        """``sums / logit``: 1 where all relevance is conserved."""
        return self.sums / self.logit

    @property
    def input_fraction(self) -> torch.Tensor:
        """``[batch]`` fraction of the logit that reaches the input (word + other embeddings)."""
        return self.sums[-2:].sum(0) / self.logit

    def __str__(self) -> str:
        lines = [f'{"boundary":<40} {"relevance":>12} {"of logit":>9} {"leak":>10}',
                 f'{"logit":<40} {float(self.logit[0]):>12.5f} {1:>9.4f}']
        previous = float(self.logit[0])
        for index, name in enumerate(self.names):
            value = float(self.sums[index, 0])
            leak = '' if name == 'other embeddings' else f'{previous - value:>10.5f}'
            lines.append(f'{name:<40} {value:>12.5f} {value / float(self.logit[0]):>9.4f} {leak}')
            if name != 'word embeddings':
                previous = value
        return '\n'.join(lines)


def layer_stack(model: torch.nn.Module) -> tuple[str, torch.nn.ModuleList]:
    """The model's sequence of transformer blocks: its longest ``ModuleList`` of modules of one class."""
    candidates = [
        (name, module) for name, module in model.named_modules()
        if isinstance(module, torch.nn.ModuleList) and len(module) and len({type(child) for child in module}) == 1
    ]
    if not candidates:
        raise TypeError(f'{type(model).__name__} has no ModuleList of transformer blocks')
    return max(candidates, key=lambda item: len(item[1]))


class _Probe:
    """Collect ``sum(x * g)`` per batch row of a tensor during the backward pass."""
    def __init__(self, watched: list):
        self.value = None
        self.watched = watched

    def watch(self, tensor):
        if isinstance(tensor, (tuple, list)):
            tensor = tensor[0]
        if not (isinstance(tensor, torch.Tensor) and tensor.requires_grad):
            return
        detached = tensor.detach()

        def hook(grad):
            value = (detached.double() * grad.double()).flatten(1).sum(1)
            self.value = value if self.value is None else self.value + value

        tensor.register_hook(hook)
        self.watched.append(tensor)


def conservation(
    model: torch.nn.Module,
    input_ids,
    target: TargetLike = None,
    position=-1,
    attention_mask=None,
    composite=None,
    model_kwargs: dict | None = None,
    decoder_input_ids=None,
) -> ConservationReport:
    """Explain like :py:func:`~zennit_attn.explain` and report the relevance sum at every layer boundary.

    With the AttnLRP rules, relevance leaks only through biases (linear layers, LayerNorm), the hidden bias of
    the softmax rule (Prop. 3.1) and the epsilon stabilisers; the report shows how much leaks at each block.
    Arguments are those of :py:func:`~zennit_attn.explain`.
    """
    stack_name, stack = layer_stack(model)
    word_embeddings = model.get_input_embeddings()
    probes: dict[str, _Probe] = {}

    def observe(modified, watched):
        handles = []
        for index, block in enumerate(stack):
            probe = probes.setdefault(f'output of {stack_name}.{index}', _Probe(watched))
            handles.append(block.register_forward_hook(lambda module, input, output, probe=probe: probe.watch(output)))
        first = probes.setdefault(f'input of {stack_name}.0', _Probe(watched))
        handles.append(stack[0].register_forward_pre_hook(lambda module, args, probe=first: probe.watch(args[0] if args else None)))
        others = probes.setdefault('other embeddings', _Probe(watched))
        for module in modified.modules():
            if isinstance(module, torch.nn.Embedding) and module is not word_embeddings:
                handles.append(module.register_forward_hook(lambda module, input, output: others.watch(output)))
        return handles

    explanation = attribute(model, input_ids, target, position, attention_mask, composite, observe, model_kwargs,
                            decoder_input_ids)
    batch = explanation.logit.shape[0]
    zeros = torch.zeros(batch, dtype=torch.float64)
    names = [f'output of {stack_name}.{index}' for index in reversed(range(len(stack)))]
    names += [f'input of {stack_name}.0']
    sums = [probes[name].value if probes[name].value is not None else zeros for name in names]
    names += ['word embeddings', 'other embeddings']
    sums += [explanation.relevance.double().sum(1), probes['other embeddings'].value
             if probes['other embeddings'].value is not None else zeros]
    return ConservationReport(logit=explanation.logit.double(), names=names, sums=torch.stack([s.cpu() for s in sums]))
