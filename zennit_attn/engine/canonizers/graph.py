"""Reading the autograd graph that :py:mod:`~zennit_attn.engine.canonizers.classifier` builds while the model runs.

The engine decides some rules by what a tensor *is*, which the graph tells:

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

#: Autograd nodes that keep a gate one where every relevance-carrying input is a gate: views, selections, casts,
#: rescalings and shifts by constants, sums and means, and joins (``cat``, ``stack``, scatters and index puts into a
#: constant tensor, ``where``): a sum of two softmax outputs or a routing weight scattered into a dense matrix is a
#: gate, a product or sum of a gate and another relevance-carrying tensor is not.
PASS_NODES = re.compile(
    r'(View|UnsafeView|Reshape\w*|Transpose|Permute|Expand|Squeeze\w*|Unsqueeze\w*|Slice|Select|Index|Gather|'
    r'ToCopy|Clone|Topk|Sort|Div|Mul|AsStrided|Split\w*|Unbind|IndexSelect|Repeat|MaskedFill|NativeDropout|'
    r'Alias|T|Narrow|Sum|Mean|Max|Min|Amax|Amin|Kthvalue|Median|ConstantPadNd|Flip|Roll|_GradientMap|'
    r'Add|Sub|Rsub|Neg|Cat|Stack|Scatter\w*|IndexPut\w*|IndexAdd|IndexCopy|IndexFill|MaskedScatter|Where|NanToNum|'
    r'Copy)Backward\d*$|^(CopySlices|CopyBackwards)$'
)
#: Autograd nodes of activation outputs (the identity rule's) and of softmax outputs (softmaxes, sink masses, the
#: exponential of a log-softmax): the gates, constant factors of CP-LRP.
ACTIVATION_GATES = re.compile(r'_GateIdentityBackward\d*$')
SOFTMAX_GATES = re.compile(r'(Softmax|SinkMass|ExpLogSoftmax)Backward\d*$')
#: Autograd nodes between a ``logsumexp`` and the sigmoid of a sink mass (constants subtracted, casts, views).
_LSE_PATH = re.compile(
    r'(Sub|Add|ToCopy|View|Unsqueeze\w*|Squeeze\w*|Expand|Clone|Reshape\w*|Slice|Select|Index|'
    r'Narrow|Alias)Backward\d*$'
)
#: Autograd nodes between a ``logsumexp(z)`` and its subtraction from ``z`` in a log-softmax (casts, views).
_LSE_VIEWS = re.compile(r'(ToCopy|View|Unsqueeze\w*|Squeeze\w*|Expand|Clone|Reshape\w*|Slice|Alias)Backward\d*$')
#: Autograd nodes between a log-softmax and its ``exp`` (casts, views, selections).
LOG_SOFTMAX_PATH = re.compile(
    r'(ToCopy|View|UnsafeView|Unsqueeze\w*|Squeeze\w*|Expand|Clone|Reshape\w*|Slice|Select|'
    r'Index|IndexSelect|Gather|Topk|Sort|Narrow|Alias|Transpose|Permute|T|Split\w*|'
    r'Unbind)Backward\d*$'
)
#: Autograd nodes between a softmax and the matrix product of the attention output.
_PRODUCT_NODES = re.compile(r'(Bmm|Mm|Matmul|Einsum)Backward\d*$')
#: Autograd nodes of casts and views: a tensor normalised by ``g(x)`` may be a cast or view of ``x``.
_CAST_NODES = re.compile(r'(ToCopy|View|UnsafeView|Reshape\w*|Expand|Unsqueeze\w*|Squeeze\w*|Clone|Alias)Backward\d*$')
#: Autograd nodes between a contraction ``k^T v`` and its use (views, casts, rescalings, cumulative sums).
_CONTRACTION_PATH = re.compile(
    r'(ToCopy|View|UnsafeView|Reshape\w*|Expand|Unsqueeze\w*|Squeeze\w*|Clone|Alias|Transpose|'
    r'Permute|T|Cumsum|Sum|Mul|Div|Slice|Select|Tril|Triu|MaskedFill|_GradientMap)'
    r'Backward\d*$'
)
#: Autograd nodes of centring and shifting (``x - mean(x)``): a normalised tensor may be centred first.
_CENTRING_NODES = re.compile(r'(Sub|Add)Backward\d*$')


def _inputs(node) -> list:
    return [next_node for next_node, _ in node.next_functions if next_node is not None]


def _gate_kind(node, budget: int, memo: dict) -> str | None:
    """``'activation'``, ``'softmax'`` or None for the autograd ``node`` (see :py:func:`gate_kind`); ``memo`` holds
    the nodes decided (a chain of renormalisations joins the same nodes many times)."""
    if node is None or budget <= 0:
        return None
    if node in memo:
        return memo[node]
    name = type(node).__name__
    kind = None
    if ACTIVATION_GATES.match(name):
        kind = 'activation'
    elif SOFTMAX_GATES.match(name):
        kind = 'softmax'
    elif PASS_NODES.match(name):
        kinds = {_gate_kind(item, budget - 1, memo) for item in _inputs(node)}
        kind = None if not kinds or None in kinds else ('softmax' if kinds == {'softmax'} else 'activation')
    memo[node] = kind
    return kind


def gate_kind(tensor: torch.Tensor) -> str | None:
    """``'softmax'`` if ``tensor`` is (a view, selection, rescaling, shift by a constant, sum or join of) the outputs
    of softmaxes, ``'activation'`` if of activations (or of both), else None: the gates of CP-LRP."""
    return _gate_kind(tensor.grad_fn, 128, {})  # Sinkhorn normalisations of a softmax: 2 nodes per iteration


def is_gate(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is (a view, selection, rescaling, shift by a constant, sum or join of) the outputs of
    activations, softmaxes or sink masses (:py:func:`gate_kind`)."""
    return gate_kind(tensor) is not None


def normalises(normaliser: torch.Tensor, other: torch.Tensor, budget: int = 64) -> bool:
    """Whether ``normaliser`` (a function ``g`` of relevance-carrying tensors) is computed from ``other``: ``other``
    itself, or what ``other`` is a cast, view, centring or shift of (``(x - mean(x)) * rsqrt(var(x))``), is among the
    first ``budget`` autograd nodes that ``normaliser`` was computed from. Then ``other * g`` is a normalisation
    ``x / g'(x)`` (Prop. 3.4)."""
    targets, node = set(), other.grad_fn
    for _ in range(16):
        if node is None:
            break
        targets.add(node)
        inputs = _inputs(node)
        if _CENTRING_NODES.match(type(node).__name__):
            targets.update(inputs)
            break
        if not _CAST_NODES.match(type(node).__name__) or len(inputs) != 1:
            break
        node = inputs[0]
    queue, seen = [normaliser.grad_fn], set()
    while queue and len(seen) < budget:
        node = queue.pop(0)
        if node is None or node in seen:
            continue
        if node in targets:
            return True
        seen.add(node)
        queue.extend(_inputs(node))
    return False


def is_outer_product(first: torch.Tensor, second: torch.Tensor) -> bool:
    """Whether the element-wise product of ``first`` and ``second`` has more elements than either (a broadcast outer
    product ``k[..., :, None] * v[..., None, :]``, not an element-wise product or a broadcast scale)."""
    size = torch.Size(torch.broadcast_shapes(first.shape, second.shape)).numel()
    return size > max(first.numel(), second.numel())


def reaches(tensor: torch.Tensor, nodes: set, budget: int = 16) -> bool:
    """Whether one of the autograd ``nodes`` computed ``tensor`` (through views, casts, rescalings, masks and
    cumulative sums): a contraction ``k^T v`` that the engine recorded, used in ``q (k^T v)``."""
    node = tensor.grad_fn
    for _ in range(budget):
        if node is None:
            return False
        if node in nodes:
            return True
        inputs = _inputs(node)
        if len(inputs) != 1 or not _CONTRACTION_PATH.match(type(node).__name__):
            return False
        node = inputs[0]
    return False


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
    """The input of a softmax, unchanged; backward: the gradient, zero in the rows where the softmax's output is NaN
    (rows of ``-inf`` logits, which models replace by a constant: no relevance flows through them). The node's
    ``nan_rows`` (set after the softmax ran: a boolean mask that broadcasts along the softmax's dimension) says
    which."""

    @staticmethod
    def forward(ctx, input):
        """``input`` unchanged; the mask of NaN rows is set on the node afterwards."""
        ctx.nan_rows = None
        return input.view_as(input)

    @staticmethod
    def backward(ctx, grad_output):
        """The gradient, zero in the rows where the softmax's output is NaN."""
        if ctx.nan_rows is None:
            return grad_output
        return torch.where(ctx.nan_rows, 0.0, grad_output)


def _skip_casts(node):
    while (
        node is not None
        and type(node).__name__.startswith(('ToCopyBackward', 'SoftmaxInputBackward'))
        and _inputs(node)
    ):
        node = _inputs(node)[0]
    return node
