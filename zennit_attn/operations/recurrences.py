"""The recurrences of sequence mixers that are not softmax attention: selective state spaces (Mamba, Mamba-2) and gated
delta rules (gated delta nets, Kimi delta attention), declared with the role of each argument.

transformers computes the sequence mixing of these layers in one function per algorithm, the torch path of a kernel
(``mamba_selective_scan``, ``mamba2_chunk_scan``, ``torch_chunk_gated_delta_rule``, ...; the same names in every model
that uses the layer), called by the mixer module with the tensors the recurrence combines. Each such function is
declared here (:py:data:`RECURRENCES`) with the role of each of its arguments:

``values``
    the stream the recurrence carries from token to token: the output is linear in it once the other arguments are
    fixed (Mamba's ``x``, a delta rule's ``v``, a carried state);
``constants``
    the input-dependent discretisation, decay, selection and read-out terms (Mamba's ``dt``, ``A``, ``B``, ``C``; a
    delta rule's decay ``g``, write strength ``beta``, keys and queries). They act on the value path as gates do: as
    MambaLRP does (Rezaei Jafari et al., NeurIPS 2024, Sec. 4), they are constants of the relevance pass, so the
    relevance of the output flows to the values alone, and in exactly the share each value contributes to the output
    (the recurrence is linear in the values: Eq. 8 with epsilon -> 0 conserves it). Queries and keys of a delta rule
    are the read-out ``C`` and input ``B`` of Mamba-2's state-space duality (Dao & Gu 2024), held constant for the same
    reason; holding them constant also makes the relevance independent of the algorithm (a chunked and a recurrent
    evaluation of the same recurrence are the same linear function of the values);
``gates``
    multiplicative output gates (Mamba's ``y * silu(z)``): a product of relevance-carrying tensors, the composite's
    product rule (AttnLRP: the uniform rule, Prop. 3.2, MambaLRP's half rule).

While a declared function runs inside a mixer (:py:class:`MixerRun`), the classifying mode (:py:func:`held_constant`)
replaces each constant argument by its detached copy wherever the function (or a helper it calls)
first uses it, so that everything computed from the constants is constant; a relevance-carrying argument the
declaration does not name is refused, and so is a product of several relevance-carrying tensors inside a recurrence
without gates. Products inside a mixer's own code (a gated normalisation ``norm(y) * silu(z)``) get the composite's
product rule where the mixer ran a declared recurrence; a mixer that ran none is refused when it returns.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass, field

import torch

from .calls import Call, replaced, tensors_of
from .tracking import State

__all__ = [
    'Recurrence',
    'RECURRENCES',
    'GATES',
    'MixerRun',
    'recurrence',
    'recurrence_at',
    'held_constant',
    'term_use',
]


@dataclass(frozen=True)
class Recurrence:
    """One function that computes a recurrence of a sequence mixer.

    Attributes
    ----------
    name: str
        The function's name (its code's ``co_name``).
    layer: str
        The layer type that computes it, for messages and the documentation.
    values: tuple of str
        The arguments whose relevance the recurrence carries (the output is linear in them given the others).
    constants: tuple of str
        The arguments held constant in the relevance pass (discretisation, decay, selection, keys and queries).
    gates: tuple of str
        Multiplicative output gates: products with them get the composite's product rule.
    modules: tuple of str
        Prefixes of the names of the Python modules the function is defined in.
    """

    name: str
    layer: str
    values: tuple[str, ...]
    constants: tuple[str, ...]
    gates: tuple[str, ...] = ()
    modules: tuple[str, ...] = ('transformers.models.',)


#: Every declared recurrence, by function name.
RECURRENCES: dict[str, Recurrence] = {}


def recurrence(
    names: str,
    layer: str,
    values: str,
    constants: str,
    gates: str = '',
    modules: tuple[str, ...] = ('transformers.models.',),
) -> None:
    """Declare the functions ``names`` (separated by white space) as recurrences of ``layer`` with the arguments
    ``values``, ``constants`` and ``gates`` (each separated by white space), see :py:class:`Recurrence`."""
    for name in names.split():
        if name in RECURRENCES:
            raise ValueError(f'{name} is declared twice')
        RECURRENCES[name] = Recurrence(
            name, layer, tuple(values.split()), tuple(constants.split()), tuple(gates.split()), modules
        )


# ------------------------------------------------------------------------------------------------ selective scans
recurrence(
    'mamba_selective_scan',
    'Mamba selective scan (Mamba, Falcon-Mamba, Jamba, Zamba)',
    values='hidden_states',
    constants='dt A B C D delta_bias',
    gates='z',
)
recurrence(
    'mamba_selective_state_update',
    'Mamba selective scan, one step (Mamba, Falcon-Mamba, Jamba, Zamba)',
    values='state hidden_states',
    constants='dt A B C D dt_bias',
    gates='z',
)
recurrence(
    'mamba2_chunk_scan',
    'Mamba-2 state-space duality, chunked (Mamba-2, Bamba, Falcon-H1, Granite 4, Nemotron-H, Zamba2)',
    values='hidden_states initial_states',
    constants='dt A B C D dt_bias',
)
recurrence(
    'mamba2_selective_state_update',
    'Mamba-2 state-space duality, one step (Mamba-2, Bamba, Falcon-H1, Granite 4, Nemotron-H, Zamba2)',
    values='state hidden_states',
    constants='dt A B C D dt_bias',
    gates='z',
)

# ------------------------------------------------------------------------------------------------ delta rules
recurrence(
    'torch_chunk_gated_delta_rule torch_recurrent_gated_delta_rule',
    'gated delta rule (Qwen3-Next, Qwen3.5, OLMo hybrid, ...)',
    values='value initial_state',
    constants='query key g beta',
)
recurrence(
    'chunk_kimi_delta_attention recurrent_kimi_delta_attention',
    'Kimi delta attention (Kimi Linear, Bailing hybrid, GLM-5 Next)',
    values='value initial_state',
    constants='query key g beta',
)

# ----------------------------------------------------------------------------------------- gated linear recurrences
recurrence(
    '_rnn_scan',
    'RG-LRU linear recurrence (RecurrentGemma, Griffin)',
    values='hidden_states recurrent_states',
    constants='recurrent_gate reset',
    modules=('transformers.models.recurrent_gemma.',),
)

# ----------------------------------------------------------------------------------------- gated linear attention
recurrence(
    'rwkv_linear_attention_cpu',
    'RWKV-4 weighted key-value recurrence (RWKV)',
    values='value state',
    constants='time_decay time_first key',
)
recurrence(
    'mlstm_chunkwise_native_autograd mlstm_recurrent_sequence_native wrap_chunkwise_arbitrary_sequence_length '
    'wrap_chunkwise_pad_zeros',
    'xLSTM matrix memory, chunked and recurrent (xLSTM)',
    values='value c_initial',
    constants='query key igate fgate n_initial m_initial',
)
recurrence(
    'mlstm_recurrent_step_native',
    'xLSTM matrix memory, one step (xLSTM)',
    values='value cstate',
    constants='query key igate fgate nstate mstate',
)

#: Modules that compute only constants of a recurrence (by class name, with what they compute): they run without
#: rules (their inside, e.g. a softplus written as ``log(1 + exp(x))``, is not classified), and their outputs are
#: terms of a recurrence (see :py:func:`term_use`).
GATES = {
    'KimiLinearForgetGate': 'the decay g of Kimi delta attention (Kimi Linear)',
    'Glm5NextTextForgetGate': 'the decay g of Kimi delta attention (GLM-5 Next)',
}

#: Names of the frames at which a search for a recurrence stops: the call of another module.
_BOUNDARIES = frozenset({'_call_impl', '_wrapped_call_impl'})
#: How many frames a search for a recurrence looks at, at most.
_DEPTH = 32


def recurrence_at(frame) -> tuple[object, Recurrence | None]:
    """The innermost frame, from ``frame`` outwards to the module being run, of a declared recurrence, with its
    declaration; ``(None, None)`` if there is none."""
    for _ in range(_DEPTH):
        if frame is None:
            break
        code = frame.f_code
        if code.co_name in _BOUNDARIES:
            break
        declaration = RECURRENCES.get(code.co_name)
        if declaration is not None and frame.f_globals.get('__name__', '').startswith(declaration.modules):
            return frame, declaration
        frame = frame.f_back
    return None, None


@dataclass
class MixerRun:
    """A sequence mixer that is not softmax attention, being run (one per call of its forward).

    Attributes
    ----------
    name: str
        Its class name.
    recurrences: set of str
        The declared recurrences it ran.
    frames: dict
        The frames of the recurrences being run, by id: ``(frame, {id(constant): (constant, detached copy)},
        {id(constant): detached copy})`` (the constants kept alive, so that their ids are not reused while the frame
        runs).
    current: Recurrence or None
        The recurrence in which the operation being classified runs.
    product: tuple or None
        ``(operation, module path)`` of its first product of relevance-carrying tensors outside a recurrence.
    softmax: bool
        Whether a softmax output was a factor of one of its products (``softmax(q k^T) @ v``): softmax attention.
    """

    name: str
    recurrences: set = field(default_factory=set)
    frames: dict = field(default_factory=dict)
    current: Recurrence | None = None
    product: tuple | None = None
    softmax: bool = False

    def absorb(self, inner: MixerRun) -> None:
        """Take over what a mixer run inside this one did (its recurrences, its first product, its softmax)."""
        self.recurrences |= inner.recurrences
        self.product = self.product or inner.product
        self.softmax = self.softmax or inner.softmax


def held_constant(state: State, args, kwargs, carrying: list[torch.Tensor]):
    """``args``, ``kwargs`` and ``carrying`` of an operation inside a mixer, with the constants of the recurrence it
    runs in (if any) replaced by their detached copies (called by the classifying mode's ``__torch_function__``: the
    frame two up is the code that called the operation)."""
    run = state.runs[-1]
    frame, declaration = recurrence_at(sys._getframe(2))
    run.current = declaration
    if frame is None:
        return args, kwargs, carrying
    run.recurrences.add(declaration.name)
    entry = run.frames.get(id(frame))
    if entry is None:
        constants = _constants_of(state, frame, declaration)
        entry = run.frames[id(frame)] = (frame, constants, {key: pair[1] for key, pair in constants.items()})
    detached = entry[2]
    if not any(id(tensor) in detached for tensor in carrying):
        return args, kwargs, carrying
    args, kwargs = replaced(args, detached), {key: replaced(value, detached) for key, value in kwargs.items()}
    return args, kwargs, [tensor for tensor in carrying if id(tensor) not in detached]


def term_use(call: Call, state: State):
    """An operation on terms of a recurrence (decays and gates: exponentials inside a sequence mixer, outputs of
    :py:data:`GATES`, custom autograd functions of terms) outside a declared recurrence (which detaches them first):
    computed from terms only, a term itself (not classified: its relevance is never asked for; an operation that
    keeps terms, its declaration's ``keeps``); a factor of a product (a divisor) of other relevance-carrying tensors,
    a constant, and the product one of the mixer's own (which must run a declared recurrence); anything else is
    refused."""
    terms = [mark is not None and mark.term is not None for mark in call.marks]
    origin = next(mark.term for mark, term in zip(call.marks, terms) if term)
    entry = call.entry
    if all(terms) and entry is not None and 'term' in entry.keeps:
        output = call.run()
        state.mark_term(output, origin)
        call.note = 'a function of terms of a recurrence: a term (constant)'
        return output
    rule = entry.rule if entry is not None else None
    numerator = call.args[0] if call.args else None
    others = [tensor for tensor, term in zip(call.carrying, terms) if not term]
    division = rule == 'division' and any(tensor is numerator for tensor in others)
    if others and state.runs and (rule == 'product' or division):
        constants = {id(tensor): tensor.detach() for tensor, term in zip(call.carrying, terms) if term}
        inner = call.without(constants, held=True)
        run = state.runs[-1]
        run.product = run.product or (call.name, state.module_path())
        output = state.dispatch(inner, state)
        call.note = f'the terms of a recurrence constant; {inner.note or "linear"}'
        return output
    path, _, what = origin
    state.refuse(
        call.name,
        f'a use of {what}, a term of a recurrence (a decay or gate), other than in computing terms, as a constant '
        'factor or as a constant of a declared recurrence',
        path=path,
    )


def _constants_of(state: State, frame, declaration: Recurrence) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """The relevance-carrying constant arguments of the recurrence running in ``frame`` (read when its first
    operation runs), with their detached copies; a relevance-carrying argument without a role is refused."""
    code, local = frame.f_code, frame.f_locals
    count = code.co_argcount + code.co_kwonlyargcount
    arguments = {name: local.get(name) for name in code.co_varnames[:count]}
    if code.co_flags & inspect.CO_VARARGS:
        arguments.update({f'*{index}': value for index, value in enumerate(local[code.co_varnames[count]])})
        count += 1
    if code.co_flags & inspect.CO_VARKEYWORDS:
        arguments.update({f'**{key}': value for key, value in local[code.co_varnames[count]].items()})
    roles = set(declaration.values) | set(declaration.gates)
    constants, carried = {}, set()
    for name, value in arguments.items():
        tensors = [tensor for tensor in tensors_of(value, []) if tensor.requires_grad]
        if not tensors:
            continue
        if name in declaration.constants:
            constants.update({id(tensor): (tensor, tensor.detach()) for tensor in tensors})
            continue
        carried.update(id(tensor) for tensor in tensors)
        if name not in roles:
            state.refuse(
                declaration.name,
                f'a recurrence ({declaration.layer}) with the relevance-carrying argument {name!r}, which its '
                'declaration gives no role',
                hint='Declare the role of the argument (zennit_attn.operations.recurrences), or report the model.',
            )
    if carried & constants.keys():
        state.refuse(
            declaration.name,
            f'a recurrence ({declaration.layer}) given one tensor both as a value or gate and as a constant',
        )
    return constants
