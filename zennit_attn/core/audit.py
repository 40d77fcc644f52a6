"""The audit of the engine: nothing between a model's output and its explained inputs that the engine did not see.

The engine explains what passes through its classifying mode (:py:mod:`zennit_attn.operations`): every torch
operation on tensors that carry relevance gets its rule there. What is computed outside the mode would get its plain
gradient, silently: code compiled by TorchScript (``torch.jit.script``, ``torch.jit.trace``), functions transformed
by ``torch.vmap``, blocks run under ``torch.utils.checkpoint`` (run again in the backward pass outside the mode), code
under ``torch._C.DisableTorchFunction``, the zennit hooks of another composite, a tensor changed in place where the
engine does not see it (``torch.no_grad()``, ``x.detach()``), a tensor that requires a gradient without being a
registered parameter (it would be taken for a relevance-carrying factor).

:py:class:`Audit` therefore keeps, for one forward of the model, the autograd nodes that the engine produced or
sanctioned, each with the version of its tensor at the time:

- the outputs of every operation the mode classified (the nodes a rule creates inside an operation are not checked:
  the operation's output stands for them), and the tensors it changed in place;
- the outputs of the modules whose rules replace their inside (activations, LayerNorm and RMSNorm, the gate modules
  of recurrences, quantized layers of bitsandbytes), and of the rules of modules (:py:func:`sanction`);
- the explained inputs: the tensors the model is called with, tensors made leaves inside the forward
  (``requires_grad_()``, where a caller reads relevance), and the outputs of the relevance boundary's autograd
  function wherever the model meets them (:py:data:`INPUTS`: the token tables' lookups of
  :py:mod:`zennit_attn.inputs.lookups`).

Every operation the mode classifies checks that each relevance-carrying operand is one of these, unchanged since
(:py:meth:`Audit.refusal`), and so does every module whose inside is left to its rule, for its inputs, and the model
for its outputs; by induction, the graph between the output and the explained inputs consists of nodes the engine
produced or sanctioned. Anything else is refused by name
(:py:class:`~zennit_attn.core.errors.UnsupportedModelError`, :py:func:`unexplained`). The audit costs a dictionary
lookup per operand and one entry per output: it is linear in the number of classified operations.

Not seen by the audit: hooks registered directly on autograd nodes (``tensor.grad_fn.register_hook``) inside the
forward; a gradient hook registered on a tensor with ``tensor.register_hook`` inside the forward is checked when it
runs (:py:func:`guarded_hook`).
"""

from __future__ import annotations

import contextvars

import torch

from .errors import UnsupportedModelError

__all__ = [
    'Audit',
    'INPUTS',
    'CHECKPOINT_HOOK',
    'AUDITED_METADATA',
    'AUDITED_GETTERS',
    'DATA',
    'sanction',
    'unexplained',
    'guarded_hook',
]

#: The audit of the forward being run (in this thread and task), for the rules of modules (:py:func:`sanction`).
_CURRENT: contextvars.ContextVar[Audit | None] = contextvars.ContextVar('zennit_attn_audit', default=None)

#: The engine's autograd functions whose outputs are explained inputs wherever the model meets them: the relevance
#: boundary (:py:func:`zennit_attn.rules.boundary.input_relevance`), which turns the gradient into the relevance
#: of the tensor before it. Declared by the module that defines them.
INPUTS: set[type] = set()

#: The qualified name of the function that torch's non-reentrant ``torch.utils.checkpoint`` packs saved tensors with
#: (``torch.utils.checkpoint._checkpoint_hook``): its block is recomputed in the backward pass.
CHECKPOINT_HOOK = '_checkpoint_hook.__init__.<locals>.pack_hook'


#: Operations of the rule ``metadata`` (:py:mod:`~zennit_attn.operations.registry`) that the audit looks at
#: (:py:meth:`Audit.metadata`): gradient hooks registered inside the forward (:py:func:`guarded_hook`) and tensors made
#: leaves inside it (``x.detach().requires_grad_()``: an input whose relevance the caller reads).
AUDITED_METADATA = frozenset({'register_hook', 'requires_grad'})
#: ``x.data``'s getter: an alias whose changes in place neither autograd nor the audit sees.
DATA = torch.Tensor.data.__get__
#: Getters of properties of tensors (operation ``get``) that the audit looks at: views (``x.T``, ``x.mT``, ...),
#: audited as operations, and :py:data:`DATA`.
AUDITED_GETTERS = frozenset(
    {DATA} | {getattr(torch.Tensor, name).__get__ for name in ('T', 'mT', 'H', 'mH', 'real', 'imag')}
)


def _tensors(value, found: list) -> list:
    """The tensors in ``value`` (a tensor, or lists, tuples and dicts of them), appended to ``found``."""
    if isinstance(value, torch.Tensor):
        found.append(value)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _tensors(item, found)
    elif isinstance(value, dict):
        for item in value.values():
            _tensors(item, found)
    return found


#: ``(pack, unpack)`` of the innermost ``saved_tensors_hooks`` being run, or None (its argument: whether to ignore the
#: hooks while tracing, False)
_top_saved_tensors_hooks = torch._C._autograd._top_saved_tensors_default_hooks


def _saved_tensors_pack():
    """The pack function of the innermost ``saved_tensors_hooks`` being run, or None."""
    hooks = _top_saved_tensors_hooks(False)
    return None if hooks is None else hooks[0]


class Audit:
    """The autograd nodes that the engine produced or sanctioned in one forward of a model, and its explained input
    leaves (see the module's description). Open from the start of the model's forward to its end
    (:py:meth:`close`); closed, it checks and records nothing (the recomputation of a checkpointed block in the
    backward pass)."""

    def __init__(self, model: torch.nn.Module | None = None, open: bool = True):
        #: the model being explained (its TorchScript modules are named in refusals)
        self.model = model
        #: the autograd nodes produced or sanctioned (held, so that their identity stays theirs while the audit runs),
        #: with the version of their tensor then (a change in place that the engine did not see changes it)
        self.known: dict = {}
        #: the explained inputs that are leaves, by id, with their versions (held)
        self.leaves: dict[int, tuple[torch.Tensor, int]] = {}
        #: the pack functions of checkpoints the engine runs (:py:mod:`zennit_attn.canonizers.checkpointing`)
        self.checkpoints: set = set()
        #: the pack function of the saved-tensor hooks around the model's call (the caller's own)
        self.outer = _saved_tensors_pack()
        #: whether it checks and records (from the start of the model's forward to its end)
        self.open = open
        self.token: contextvars.Token | None = None

    def enter(self, inputs) -> None:
        """Start the audit of a forward called with ``inputs`` (its arguments: tensors, or lists, tuples and dicts of
        them), which become the explained inputs."""
        for tensor in _tensors(inputs, []):
            self.admit(tensor)
        self.token = _CURRENT.set(self)

    def close(self) -> None:
        """End the audit (at the end of the model's forward, also after an exception): it forgets what it held."""
        self.open = False
        self.known, self.leaves, self.checkpoints = {}, {}, set()
        if self.token is not None:
            _CURRENT.reset(self.token)
            self.token = None

    def admit(self, tensor: torch.Tensor) -> None:
        """Make ``tensor`` (if it requires a gradient) an explained input: the graph behind it is not the model's."""
        if not (isinstance(tensor, torch.Tensor) and tensor.requires_grad):
            return
        if tensor.grad_fn is None:
            self.leaves[id(tensor)] = (tensor, tensor._version)
        else:
            self.known[tensor.grad_fn] = tensor._version

    def knows(self, tensor: torch.Tensor) -> bool:
        """Whether the relevance-carrying ``tensor`` was produced or sanctioned by the engine, or is an explained
        input, and has not been changed in place since but by operations the engine saw."""
        node = tensor.grad_fn
        if node is None:
            leaf = self.leaves.get(id(tensor))
            return leaf is not None and leaf[0] is tensor and leaf[1] == tensor._version
        version = self.known.get(node)
        if version is not None:
            return version == tensor._version
        if getattr(type(node), '_forward_cls', None) in INPUTS:
            return True
        # a view whose node torch made anew (as_strided of its base) after its base was changed in place
        base = tensor._base
        if base is not None and type(node).__name__.startswith('AsStridedBackward') and self.knows(base):
            inputs = node.next_functions
            if inputs and inputs[0][0] is base.grad_fn:
                self.known[node] = tensor._version
                return True
        return False

    def refusal(self, tensors, role: str = 'an operand') -> tuple[str, str] | None:
        """``(what, hint)`` of a refusal (:py:func:`unexplained`, ``role``) of the first of the relevance-carrying
        ``tensors`` that the engine did not produce or sanction (or that was changed in place since, out of its
        sight), or that is of a tensor subclass with a ``__torch_function__`` of its own (whose operations the mode
        does not see), or of torch's checkpoint being run (not the engine's: its code would be run again in the
        backward pass outside the mode); None if there is none (also once closed)."""
        if not self.open:
            return None
        known = self.known
        for tensor in tensors:
            if known.get(tensor.grad_fn) != tensor._version or type(tensor) is not torch.Tensor:  # not the common case
                refusal = self._refusal(tensor, role)
                if refusal is not None:
                    return refusal
        hooks = _top_saved_tensors_hooks(False)
        if hooks is not None and hooks[0] is not self.outer and hooks[0] not in self.checkpoints:
            if getattr(hooks[0], '__qualname__', '') == CHECKPOINT_HOOK:
                return _CHECKPOINT
        return None

    def _refusal(self, tensor: torch.Tensor, role: str) -> tuple[str, str] | None:
        """:py:meth:`refusal` of one tensor that is not a plain tensor known at its version."""
        if not tensor.requires_grad or (self.knows(tensor) and not _own_function(tensor)):
            return None
        if not _own_function(tensor) and (tensor.grad_fn in self.known or id(tensor) in self.leaves):
            return f'{role} {_CHANGED[0]}', _CHANGED[1]
        return unexplained(tensor, self.model, role)

    def record(self, output) -> None:
        """Record the autograd nodes of the relevance-carrying tensors of ``output`` (a tensor, or lists and tuples of
        them) as produced by the engine, with their versions."""
        if not self.open:
            return
        if isinstance(output, torch.Tensor):
            node = output.grad_fn
            if node is not None:
                self.known[node] = output._version
            return
        for tensor in _tensors(output, []):
            if tensor.grad_fn is not None:
                self.known[tensor.grad_fn] = tensor._version

    def record_changed(self, tensors) -> None:
        """Record the nodes of ``tensors`` and of their bases after an operation that changed them in place (a write
        into a tensor or into a view of one)."""
        if not self.open:
            return
        for tensor in tensors:
            for changed in (tensor, tensor._base):
                if changed is not None and changed.grad_fn is not None:
                    self.known[changed.grad_fn] = changed._version

    def metadata(self, canonizer, name: str, func, args, kwargs):
        """Run an operation of :py:data:`AUDITED_METADATA` or a getter of :py:data:`AUDITED_GETTERS` that
        ``canonizer`` (the engine: its ``refuse`` and ``opaque``) met in the mode: a gradient hook registered inside
        the forward is guarded against changing the gradient (the rules of modules run outside the mode:
        :py:class:`~zennit_attn.rules.base.GradientRule`); a leaf made inside the forward (``requires_grad_()``) is
        an explained input; a property that returns a view of a relevance-carrying tensor (``x.T``) is audited as an
        operation, and ``x.data`` of one is refused (not inside an opaque module, which is audited as a whole)."""
        if name == 'register_hook':
            args = (args[0], guarded_hook(args[1] if len(args) > 1 else kwargs.pop('hook')))
            return func(*args, **kwargs)
        if name == 'requires_grad':
            output = func(*args, **kwargs)
            self.admit(output)
            return output
        if canonizer.opaque and torch.is_grad_enabled():
            return func(*args, **kwargs)
        if func == DATA and args[0].requires_grad:
            canonizer.refuse(
                'data',
                'x.data of a relevance-carrying tensor (an alias whose changes in place neither autograd nor '
                'zennit-attn sees)',
                hint='Use x.detach() (whose changes in place zennit-attn sees and refuses), or report the model.',
            )
        output = func(*args, **kwargs)
        if isinstance(output, torch.Tensor) and output.grad_fn is not None:
            refusal = self.refusal(_tensors(args, []))
            if refusal is not None:
                canonizer.refuse(name, *refusal)
            self.record(output)
        return output

    def checkpointing(self) -> None:
        """Accept the checkpoint being entered now (the engine's own: its recomputation is classified as the
        forward was)."""
        pack = _saved_tensors_pack()
        if pack is not None:
            self.checkpoints.add(pack)


def _own_function(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is of a subclass with a ``__torch_function__`` of its own (not ``torch.Tensor``'s, not
    disabled as ``torch.nn.Parameter``'s is)."""
    cls = type(tensor)
    if cls is torch.Tensor or cls is torch.nn.Parameter:
        return False
    function = getattr(cls.__torch_function__, '__func__', cls.__torch_function__)
    return function not in (torch.Tensor.__torch_function__.__func__, torch._C._disabled_torch_function_impl)


def current() -> Audit | None:
    """The open audit of the forward being run, or None."""
    audit = _CURRENT.get()
    return audit if audit is not None and audit.open else None


def sanction(result, *sources) -> None:
    """Record ``result`` (the output of a rule of a module: a tensor, or lists and tuples of them) as produced by the
    engine, where each relevance-carrying tensor of ``sources`` (what the rule computed it from) is known to the audit
    of the forward being run; nothing outside a forward."""
    audit = current()
    if audit is None:
        return
    with torch._C.DisableTorchFunction():  # from hooks inside the mode: its reads are not the model's
        if all(audit.knows(tensor) for tensor in _tensors(sources, []) if tensor.requires_grad):
            audit.record(result)


_CHANGED = (
    'changed in place after the engine saw it, by an operation it did not see (through an alias without gradients: '
    'x.detach() or x.data, or under torch.no_grad()): the backward pass would not know the change',
    'Make the change with gradients on the tensor itself (x.mul_(2) or x = x * 2), not through an alias.',
)

_CHECKPOINT = (
    'an operation run under torch.utils.checkpoint with use_reentrant=False (the checkpointed code is run again in '
    "the backward pass outside the engine, without the rules: torch raises CheckpointError, or the rules' gradients "
    'are lost)',
    'Call the model without checkpointing inside the context (e.g. model.gradient_checkpointing_disable(), or a flag '
    'of your model); explain(..., checkpointing=True) checkpoints the transformer blocks with the rules applied.',
)

#: What a refusal says of tensors recognised by the autograd function that computed them (its qualified class name):
#: ``(what, hint)``, ``what`` following the role of the tensor (``'an operand'``).
_FUNCTIONS = {
    'torch.utils.checkpoint.CheckpointFunction': (
        'computed by torch.utils.checkpoint with use_reentrant=True (the checkpointed code runs without gradients and '
        'is run again in the backward pass, outside the engine: it would get its plain gradient)',
        _CHECKPOINT[1],
    ),
    'zennit.core.Identity': (
        'hooked by a zennit rule (zennit.core.Hook), registered by another composite or mapped without RelevanceRule: '
        'it passes relevance where the rules of this composite pass their modified gradient',
        'Register one composite at a time (leave the context of the other composite, or call its remove()); to map '
        "one of zennit's relevance rules in a zennit-attn composite, wrap it: RelevanceRule(rule) "
        '(zennit_attn.rules; docs: Rules).',
    ),
}


def unexplained(
    tensor: torch.Tensor, model: torch.nn.Module | None = None, role: str = 'an operand'
) -> tuple[str, str]:
    """``(what, hint)`` of a refusal of the relevance-carrying ``tensor`` (``role``: how it is used, ``'an operand'``,
    ``'an input'``, ``'an output'``) that the audit does not know (:py:meth:`Audit.refusal`): what computed it, as far
    as its autograd graph tells, and what to do; ``model``: the model being explained (its TorchScript modules are
    named)."""
    if _own_function(tensor):
        return (
            f'{role} of the subclass {type(tensor).__qualname__} with a __torch_function__ of its own (its '
            'operations run outside the engine)',
            'Explain the model on plain tensors (x.as_subclass(torch.Tensor)), or report the model.',
        )
    if tensor.grad_fn is None:
        return (
            f'{role} of shape {list(tensor.shape)} that requires a gradient but is neither an input of the model nor '
            'computed from one (a leaf: a parameter the model does not register, e.g. held in a Python list or set '
            'as a plain attribute, or a tensor made before the forward and handed to the model by a hook): it would '
            'be taken for a relevance-carrying tensor',
            'Register a parameter (nn.Parameter as a module attribute, nn.ParameterList: the engine freezes registered '
            'parameters for the time of the context), or make the tensor a constant (requires_grad_(False)); to read '
            'relevance at a tensor a hook hands the model, make it a leaf inside the forward '
            '(output.detach().requires_grad_() in the hook).',
        )
    function = _function_of(tensor.grad_fn)
    if function is not None:
        what, hint = _FUNCTIONS[function]
        return f'{role} {what}', hint
    forward = getattr(type(tensor.grad_fn), '_forward_cls', None)
    if forward is not None:
        return (
            f'{role} computed by the custom autograd function {forward.__module__}.{forward.__qualname__} (a kernel, '
            'whose backward pass the engine does not know)',
            "Compute it with torch operations inside the context (the function's forward as plain PyTorch), or "
            'report the model.',
        )
    scripted = _scripted_modules(model)
    where = f' (TorchScript modules of this model: {", ".join(scripted[:3])})' if scripted else ''
    return (
        f'{role} computed outside the engine (its autograd node {type(tensor.grad_fn).__name__} was made by no '
        'operation the engine classified: code compiled by TorchScript (torch.jit.script, torch.jit.trace), a '
        'function transformed by torch.vmap or torch.func, code under torch._C.DisableTorchFunction, or a forward '
        f'pre-hook that changed the input of a module whose inside its rule replaces){where}; it would get its plain '
        'gradient',
        'Run that code as plain PyTorch inside the context (the module or function without torch.jit, the function '
        'of torch.vmap on the batched tensors, a pre-hook registered before the composite), or report the model.',
    )


def _function_of(node, depth: int = 4) -> str | None:
    """The qualified name of the autograd function of ``node``, or of the first node within ``depth`` single steps
    behind it, that :py:data:`_FUNCTIONS` names; else None."""
    for _ in range(depth):
        if node is None:
            return None
        forward = getattr(type(node), '_forward_cls', None)
        name = None if forward is None else f'{forward.__module__}.{forward.__qualname__}'
        if name in _FUNCTIONS:
            return name
        inputs = [item for item, _ in node.next_functions if item is not None]
        if len(inputs) != 1:
            return None
        node = inputs[0]
    return None


def _scripted_modules(model: torch.nn.Module | None) -> list[str]:
    """The outermost TorchScript modules of ``model`` (their paths; not the submodules of a scripted one)."""
    if model is None:
        return []
    if _scripted(model):
        return ['the model']
    found: list[str] = []
    for path, module in model.named_modules():
        if _scripted(module) and not any(path.startswith(f'{outer}.') for outer in found):
            found.append(path)
    return [repr(path) for path in found]


def _scripted(module: torch.nn.Module) -> bool:
    return isinstance(module, torch.jit.ScriptModule)


def guarded_hook(hook):
    """``hook`` (a gradient hook registered on a tensor inside the model's forward), refusing in the backward pass a
    change of the gradient: the gradient is the rules' (relevance / value), which a hook would change behind them.
    Hooks that read the gradient (latent recording) return None."""

    def guarded(grad):
        result = hook(grad)
        if result is None or result is grad or torch.equal(result, grad):
            return result
        raise UnsupportedModelError(
            'zennit-attn cannot explain a model that changes a gradient with a hook registered inside its forward '
            "(tensor.register_hook): the gradient there is the rules' modified gradient, which the hook would "
            "change behind them. Remove the hook, or register it on the model's inputs or outputs outside the "
            'model, where it changes what you ask for.'
        )

    return guarded
