"""Reading the autograd graph that :py:mod:`~zennit_attn.canonizers.general` builds while the model runs.

The general mechanism decides some rules by what a tensor *is*, which the graph tells:

- a *gate* is (a view, selection, concatenation, shift by a constant or rescaling of) the output of an activation or a
  softmax: a constant factor of CP-LRP (Ali et al. 2022) where it enters a product (:py:func:`is_gate`);
- a *sink mass* is ``sigmoid(logsumexp(z) - s)``, the share of the real columns in the softmax of the scores ``z``
  extended by a sink logit ``s``: ``softmax([z, s])_i = softmax(z)_i * sigmoid(logsumexp(z) - s)``, so
  ``(softmax(z) @ V) * sigmoid(logsumexp(z) - s)`` is the attention ``softmax([z, s]) @ [V; 0]`` with a sink column
  whose value is zero. Its plain gradient is the softmax rule (Prop. 3.1) on the extended softmax
  (:py:class:`SinkMass`, :py:func:`sink_scores`, :py:func:`attention_scores`);
- a *log-softmax* is ``z - logsumexp(z)`` (:py:func:`is_log_softmax`) or ``log_softmax(z)``, and ``exp`` of it (after
  casts, views and selections: top-k routing in log space) is ``softmax(z)``: its plain gradient is the softmax rule
  (Prop. 3.1) and it is a gate like any softmax output (:py:class:`LogSoftmaxMark`, :py:func:`log_softmax_scores`,
  :py:class:`ExpLogSoftmax`).

The marks are identity autograd functions (:py:class:`LogSumExpMark`, :py:class:`SinkMass`, :py:class:`LogSoftmaxMark`,
:py:class:`ExpLogSoftmax`); :py:class:`SoftmaxInput` also gives a softmax's fully masked rows (NaN output) a zero
gradient.
"""
from __future__ import annotations

import re

import torch

#: Autograd nodes through which a gate passes unchanged in kind (one relevance-carrying input).
PASS_NODES = re.compile(
    r'(View|UnsafeView|Reshape\w*|Transpose|Permute|Expand|Squeeze\w*|Unsqueeze\w*|Slice|Select|Index|Gather|'
    r'ToCopy|Clone|Topk|Sort|Div|Mul|AsStrided|Split\w*|Unbind|IndexSelect|Repeat|MaskedFill|NativeDropout|'
    r'Alias|TBackward|Narrow|Sum|Mean|Max|Min|Amax|Amin|Kthvalue|Median|ConstantPadNd|Flip|Roll|_GradientMap)'
    r'Backward\d*$'
)
#: Autograd nodes that shift a tensor: a gate shifted by a constant (``sigmoid(x) + eps``) is one.
SHIFT_NODES = re.compile(r'(Add|Sub|Rsub)Backward\d*$')
#: Autograd nodes that join several tensors: a gate when every relevance-carrying part is one.
JOIN_NODES = re.compile(r'(Cat|Stack)Backward\d*$')
#: Autograd nodes of gate (activation), softmax and sink-mass outputs: the constant factors of CP-LRP.
GATE_NODES = re.compile(r'(_GateIdentity|Softmax|_SoftmaxTaylor|SinkMass|ExpLogSoftmax)Backward\d*$')
#: Autograd nodes between a ``logsumexp`` and the sigmoid of a sink mass (constants subtracted, casts, views).
_LSE_PATH = re.compile(r'(Sub|Add|ToCopy|View|Unsqueeze\w*|Squeeze\w*|Expand|Clone|Reshape\w*|Slice|Select|Index|'
                       r'Narrow|Alias)Backward\d*$')
#: Autograd nodes between a ``logsumexp(z)`` and its subtraction from ``z`` in a log-softmax (casts, views).
_LSE_VIEWS = re.compile(r'(ToCopy|View|Unsqueeze\w*|Squeeze\w*|Expand|Clone|Reshape\w*|Slice|Alias)Backward\d*$')
#: Autograd nodes between a log-softmax and its ``exp`` (casts, views, selections).
LOG_SOFTMAX_PATH = re.compile(r'(ToCopy|View|UnsafeView|Unsqueeze\w*|Squeeze\w*|Expand|Clone|Reshape\w*|Slice|Select|'
                              r'Index|IndexSelect|Gather|Topk|Sort|Narrow|Alias|Transpose|Permute|T|Split\w*|'
                              r'Unbind)Backward\d*$')
#: Autograd nodes between a softmax and the matrix product of the attention output.
_PRODUCT_NODES = re.compile(r'(Bmm|Mm|Matmul|Einsum)Backward\d*$')


def _inputs(node) -> list:
    return [next_node for next_node, _ in node.next_functions if next_node is not None]


def _gate(node, budget: int) -> bool:
    while node is not None and budget > 0:
        name = type(node).__name__
        if GATE_NODES.match(name):
            return True
        inputs = _inputs(node)
        if JOIN_NODES.match(name):
            return bool(inputs) and all(_gate(item, budget - 1) for item in inputs)
        if not (PASS_NODES.match(name) or (SHIFT_NODES.match(name) and len(inputs) == 1)):
            return False
        node, budget = (inputs[0] if inputs else None), budget - 1
    return False


def is_gate(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is (a view, selection, concatenation, shift by a constant or rescaling of) the output of an
    activation, a softmax or a sink mass."""
    return _gate(tensor.grad_fn, 128)  # Sinkhorn normalisations of a softmax: 2 nodes per iteration


class LogSumExpMark(torch.autograd.Function):
    """Identity with the plain gradient: marks the output of ``logsumexp(z)`` in the graph and keeps the autograd node
    of ``z`` (``scores``, see :py:func:`lse_scores`) and the dimensions it reduced (``dims``)."""
    @staticmethod
    def forward(ctx, input, scores, dims=()):
        """A copy of ``input``; ``scores``: the autograd node of the logits it was computed from; ``dims``: the
        (non-negative) dimensions of the logits it reduced."""
        ctx.scores, ctx.dims = scores, tuple(dims)
        return input.clone()

    @staticmethod
    def backward(ctx, grad_output):
        """The plain gradient."""
        return grad_output, None, None


class SinkMass(LogSumExpMark):
    """Identity with the plain gradient: marks ``sigmoid(logsumexp(z) - s)``, the mass of the real columns of a
    softmax extended by a sink logit (a gate: a part of the softmax, Prop. 3.1), and keeps the node of ``z``."""


class LogSoftmaxMark(LogSumExpMark):
    """Identity with the plain gradient: marks a log-softmax ``z - logsumexp(z)`` (or ``log_softmax(z)``), which
    has no rule of its own: only its ``exp``, a softmax, is used (:py:func:`log_softmax_scores`)."""


class ExpLogSoftmax(LogSumExpMark):
    """Identity with the plain gradient: marks ``exp`` of a (selected) log-softmax of ``z``, which is (a selection of)
    ``softmax(z)``: the plain gradient of ``exp(z - logsumexp(z))`` is the softmax's, the softmax rule (Prop. 3.1), and
    the output is a gate (:py:func:`is_gate`)."""


def scores_node(tensor: torch.Tensor):
    """The autograd node that computed ``tensor``, casts skipped (the scores of a softmax, a logsumexp)."""
    return _skip_casts(tensor.grad_fn)


def _marked(node, mark: str, path: re.Pattern, budget: int = 16):
    """The node named ``mark`` reached from ``node`` through single-input nodes matching ``path``, else None."""
    while node is not None and budget > 0:
        name = type(node).__name__
        if name == mark:
            return node
        inputs = _inputs(node)
        if not path.match(name) or len(inputs) != 1:
            return None
        node, budget = inputs[0], budget - 1
    return None


def lse_scores(tensor: torch.Tensor):
    """The autograd node of the scores ``z`` if ``tensor`` is ``logsumexp(z)`` shifted by constants (cast, viewed),
    else None."""
    node = _marked(tensor.grad_fn, 'LogSumExpMarkBackward', _LSE_PATH)
    return None if node is None else node.scores


def is_log_softmax(logits: torch.Tensor, lse: torch.Tensor) -> bool:
    """Whether ``logits - lse`` is the log-softmax ``z - logsumexp(z)``: ``lse`` is the logsumexp of ``logits`` (up to
    casts) over some dimensions, kept (or unsqueezed back) so that it broadcasts along exactly those, viewed or cast."""
    node = _marked(lse.grad_fn, 'LogSumExpMarkBackward', _LSE_VIEWS)
    if node is None or not isinstance(logits, torch.Tensor) or scores_node(logits) is not node.scores:
        return False
    reduced = tuple(1 if index in node.dims else size for index, size in enumerate(logits.shape))
    padded = (1,) * (logits.dim() - lse.dim()) + tuple(lse.shape)
    return padded in (reduced, tuple(logits.shape))


def log_softmax_scores(tensor: torch.Tensor):
    """The autograd node of the scores ``z`` if ``tensor`` is (a cast, view or selection of) a log-softmax of ``z``
    (a :py:class:`LogSoftmaxMark`), else None."""
    node = _marked(tensor.grad_fn, 'LogSoftmaxMarkBackward', LOG_SOFTMAX_PATH)
    return None if node is None else node.scores


def sink_scores(tensor: torch.Tensor):
    """The autograd node of the scores ``z`` if ``tensor`` is (a view or cast of) a :py:class:`SinkMass`, else
    None."""
    node = _marked(tensor.grad_fn, 'SinkMassBackward', PASS_NODES)
    return None if node is None else node.scores


def attention_scores(tensor: torch.Tensor) -> list:
    """The autograd nodes of the scores ``z`` of every softmax whose output enters the matrix product that computed
    ``tensor`` (through views and casts)."""
    node = tensor.grad_fn
    for _ in range(16):
        if node is None or _PRODUCT_NODES.match(type(node).__name__):
            break
        if not PASS_NODES.match(type(node).__name__) or len(_inputs(node)) != 1:
            return []
        node = _inputs(node)[0]
    found = []
    for operand in _inputs(node) if node is not None else []:
        for _ in range(16):
            name = type(operand).__name__
            if re.match(r'SoftmaxBackward\d*$', name):
                found.append(_skip_casts(_inputs(operand)[0]) if _inputs(operand) else None)
                break
            if not PASS_NODES.match(name) or len(_inputs(operand)) != 1:
                break
            operand = _inputs(operand)[0]
    return found


class SoftmaxInput(torch.autograd.Function):
    """The input of a softmax, unchanged; backward: the gradient, zero in the rows where the softmax's output
    (``ctx.output``, set after the softmax ran) is NaN (rows of ``-inf`` logits, which models replace by a constant:
    no relevance flows through them)."""
    @staticmethod
    def forward(ctx, input):
        """``input`` unchanged; the softmax's output is set on the node afterwards."""
        ctx.output = None
        return input.view_as(input)

    @staticmethod
    def backward(ctx, grad_output):
        """The gradient, zero in the rows where the softmax's output is NaN."""
        if ctx.output is None:
            return grad_output
        return torch.where(torch.isnan(ctx.output), 0.0, grad_output)


def _skip_casts(node):
    while node is not None and type(node).__name__.startswith(('ToCopyBackward', 'SoftmaxInputBackward')) and \
            _inputs(node):
        node = _inputs(node)[0]
    return node
