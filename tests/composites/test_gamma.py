"""The gamma composite and the relevance rules it uses (float64).

1. Gamma, z+ and alpha-beta (zennit's rules through the gradient-convention adapter) against naive formulas
   (appendix A.2.3, Eq. appendix-gamma-rule-general and appendix-zplus-rule), on Linear, on a patch-embedding
   Conv2d and on an upsampling ConvTranspose2d, exact to 1e-10.
2. The composite assigns each layer type its rule, every choice can be overridden, and a gamma rule on the fused
   ``qkv`` projection still sees the AttnLRP operand rule (hook order).
3. Conservation on a bias-free ViT: CP-LRP exact, AttnLRP exactly up to what the softmax rule absorbs, computed
   independently from the attention probabilities and the q/k relevance; on a bias-free LLaVA with gamma on the
   vision tower, CP-LRP misses the logit by what the stabilisers absorb, and by nothing else.
4. torchvision's ViT (``torch.nn.MultiheadAttention``, projections by ``F.linear``) equals timm's with the same
   weights where the projections' rule is the plain gradient; a projection rule that would not reach them is refused,
   as is one on EVA's ``qkv``, which EVA computes with ``F.linear`` on the module's parameters.
"""

from __future__ import annotations

import pytest
import torch
from zennit.core import ParamMod
from zennit.rules import AlphaBeta as ZennitAlphaBeta
from zennit.rules import Gamma as ZennitGamma
from zennit.rules import ZPlus as ZennitZPlus

from tests.models import (
    CLASSES,
    pixels,
    timm_twin,
    tiny_hf_vision,
    tiny_hf_vit,
    tiny_llava,
    tiny_timm_vit,
    tiny_torchvision_vit,
)
from tests.naive_rules import lrp, stabilize
from tests.numbers import assert_close
from tests.processors import image, llava_processor
from zennit_attn import explain
from zennit_attn.composites import AttnLRPGamma, CPLRPGamma
from zennit_attn.core.errors import UnsupportedModelError
from zennit_attn.methods.propagation import lrp_method
from zennit_attn.rules import AlphaBeta, ConstantGates, Epsilon, Gamma, RelevanceRule, Uniform, ZPlus
from zennit_attn.rules.relevance import modified_parameters

STAB = 1e-6


def contributions(weight, bias, x):
    """``z[b, i, j] = W_ji x_bi`` with the bias as an extra input ``i = n`` (x = 1)."""
    z = torch.einsum('ji,bi->bij', weight, x)
    return torch.cat([z, bias.expand(x.shape[0], 1, -1)], 1)


def naive_gamma(weight, bias, x, relevance, gamma):
    z = contributions(weight, bias, x)
    zj = z.sum(1, keepdim=True)
    positive = z + gamma * z.clamp(min=0)
    negative = z + gamma * z.clamp(max=0)
    numerator = torch.where(zj > 0, positive, negative)
    share = numerator / stabilize(numerator.sum(1, keepdim=True), STAB) * (zj != 0)
    return (share * relevance[:, None, :]).sum(2)[:, :-1]


def naive_zplus(weight, bias, x, relevance):
    z = contributions(weight, bias, x).clamp(min=0)
    return (z / stabilize(z.sum(1, keepdim=True), STAB) * relevance[:, None, :]).sum(2)[:, :-1]


def naive_alpha_beta(weight, bias, x, relevance, alpha, beta):
    z = contributions(weight, bias, x)
    positive, negative = z.clamp(min=0), z.clamp(max=0)
    share = alpha * positive / stabilize(positive.sum(1, keepdim=True), STAB) - beta * negative / stabilize(
        negative.sum(1, keepdim=True), STAB
    )
    return (share * relevance[:, None, :]).sum(2)[:, :-1]


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


@pytest.fixture
def linear_case():
    linear = torch.nn.Linear(6, 5).double()
    x = torch.randn(4, 6, dtype=torch.float64)
    x[0, 0] = 0.0
    return linear, x, torch.randn(4, 5, dtype=torch.float64)


@pytest.mark.parametrize('gamma', [0.0, 0.05, 0.25, 3.0])
def test_gamma_linear(linear_case, gamma):
    """R_i = sum_j (z_ij + gamma z_ij^+-) / (z_j + gamma sum_k z_kj^+-) R_j, the sign by z_j's."""
    linear, x, relevance = linear_case
    actual = lrp(linear, Gamma(gamma), x, relevance)
    assert_close(actual, naive_gamma(linear.weight, linear.bias, x, relevance, gamma))
    assert actual[0, 0] == 0


@pytest.mark.parametrize('bias', [True, False])
@pytest.mark.parametrize('gamma', [0.0, 0.05, 0.25, 3.0])
def test_gamma_closed_form_is_zennits(gamma, bias):
    """The closed form of the gamma rule on ``torch.nn.Linear`` equals zennit's Gamma run through the adapter (the
    module once per modifier), also on inputs with more dimensions, exact zeros and outputs of both signs."""
    linear = torch.nn.Linear(6, 5, bias=bias).double()
    x = torch.randn(2, 3, 6, dtype=torch.float64)
    x[0, 0, :2] = 0.0
    relevance = torch.randn(2, 3, 5, dtype=torch.float64)
    output = linear(x).detach()
    closed = Gamma(gamma).relevance(linear, x, output, relevance)
    zennit = RelevanceRule(ZennitGamma(gamma=gamma, stabilizer=STAB)).relevance(linear, x, output, relevance)
    torch.testing.assert_close(closed, zennit, rtol=1e-12, atol=1e-14)
    assert (closed[0, 0, :2] == 0).all()


def test_gamma_zero_is_epsilon(linear_case):
    linear, x, relevance = linear_case
    assert_close(lrp(linear, Gamma(0.0), x, relevance), lrp(linear, Epsilon(STAB), x, relevance))


def test_gamma_conserves_without_bias(linear_case):
    linear, x, relevance = linear_case
    torch.nn.init.zeros_(linear.bias)
    actual = lrp(linear, Gamma(0.25, stabilizer=1e-15), x, relevance)
    torch.testing.assert_close(actual.sum(1), relevance.sum(1), rtol=1e-10, atol=0)


def test_zplus_and_alpha_beta_linear(linear_case):
    linear, x, relevance = linear_case
    assert_close(lrp(linear, ZPlus(), x, relevance), naive_zplus(linear.weight, linear.bias, x, relevance))
    assert_close(
        lrp(linear, AlphaBeta(2.0, 1.0), x, relevance),
        naive_alpha_beta(linear.weight, linear.bias, x, relevance, 2.0, 1.0),
    )


#: The relevance rules of zennit and their closed forms
RULES_AND_NAIVE = [
    (Gamma(0.25), lambda w, b, x, r: naive_gamma(w, b, x, r, 0.25)),
    (ZPlus(), naive_zplus),
    (AlphaBeta(2.0, 1.0), lambda w, b, x, r: naive_alpha_beta(w, b, x, r, 2.0, 1.0)),
]


@pytest.mark.parametrize('rule, naive', RULES_AND_NAIVE)
def test_rules_on_patch_embedding_conv(rule, naive):
    """A Conv2d with kernel = stride is a linear layer on the flattened patches."""
    conv = torch.nn.Conv2d(3, 5, kernel_size=2, stride=2).double()
    x = torch.randn(2, 3, 4, 4, dtype=torch.float64)
    relevance = torch.randn(2, 5, 2, 2, dtype=torch.float64)
    actual = lrp(conv, rule, x, relevance)
    patches = torch.nn.functional.unfold(x, 2, stride=2).transpose(1, 2).reshape(-1, 12)  # [b * 4, 12]
    flat_relevance = relevance.flatten(2).transpose(1, 2).reshape(-1, 5)
    expected = naive(conv.weight.reshape(5, 12), conv.bias, patches, flat_relevance)
    expected = torch.nn.functional.fold(expected.reshape(2, 4, 12).transpose(1, 2), (4, 4), 2, stride=2)
    assert_close(actual, expected)


@pytest.mark.parametrize('rule, naive', RULES_AND_NAIVE)
def test_rules_on_transposed_conv(rule, naive):
    """A ConvTranspose2d with kernel = stride (a segmentation decoder's upsampling) is a linear layer from each input
    pixel's channels to its own output patch: weight ``[out * k * k, in]``, the bias repeated over the patch."""
    conv = torch.nn.ConvTranspose2d(3, 5, kernel_size=2, stride=2).double()
    x = torch.randn(2, 3, 2, 2, dtype=torch.float64)
    relevance = torch.randn(2, 5, 4, 4, dtype=torch.float64)
    actual = lrp(conv, rule, x, relevance)
    weight = conv.weight.permute(1, 2, 3, 0).reshape(20, 3)  # [out, a, b, in] -> rows o * 4 + a * 2 + b
    bias = conv.bias.repeat_interleave(4)
    pixels_in = x.permute(0, 2, 3, 1).reshape(-1, 3)  # [b * 4 pixels, in]
    patch_relevance = relevance.reshape(2, 5, 2, 2, 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(-1, 20)
    expected = naive(weight, bias, pixels_in, patch_relevance).reshape(2, 2, 2, 3).permute(0, 3, 1, 2)
    assert_close(actual, expected)


def test_rule_adapter_needs_a_zennit_rule():
    with pytest.raises(TypeError, match='BasicHook'):
        RelevanceRule(Epsilon(0.1))
    with pytest.raises(ValueError):
        Gamma(-1.0)
    assert repr(Gamma(0.25)) == 'Gamma(0.25)' and repr(AlphaBeta()) == 'AlphaBeta(2.0, 1.0)'


@pytest.mark.parametrize(
    'rule',
    [ZennitGamma(0.25), ZennitGamma(0.5, zero_params=['bias']), ZennitZPlus(), ZennitAlphaBeta(2.0, 1.0)],
    ids=['gamma', 'gamma-zero-bias', 'zplus', 'alpha-beta'],
)
def test_modified_parameters_are_zennits(rule):
    """The adapter computes each of the rule's modified parameters (its ``param_keys``, ``zero_params``, the
    modifier ``modifier(param, name)``) as zennit's own ``ParamMod`` context sets them, on a copy of the layer (zennit
    1.0's context leaves new parameter objects behind), and leaves the layer itself as it was."""
    linear = torch.nn.Linear(5, 4).double()
    parameters = [(name, id(parameter), parameter.detach().clone()) for name, parameter in linear.named_parameters()]
    for param_mod in rule.param_modifiers:
        param_mod = ParamMod.ensure(param_mod)
        ours = modified_parameters(param_mod, linear)
        copy = torch.nn.Linear(5, 4).double()
        copy.load_state_dict(linear.state_dict())
        with param_mod(copy) as modified:
            theirs = {name: parameter.detach().clone() for name, parameter in modified.named_parameters()}
        assert set(ours) == set(theirs)
        for name in ours:
            assert torch.equal(ours[name], theirs[name]), name
    assert [(name, id(parameter)) for name, parameter in linear.named_parameters()] == [
        (name, identity) for name, identity, _ in parameters
    ]
    assert all(torch.equal(getattr(linear, name), value) for name, _, value in parameters)


# ------------------------------------------------------------------------------------------------- composite
@pytest.mark.parametrize('builder', [tiny_timm_vit, tiny_hf_vit], ids=['timm', 'hf'])
def test_layer_types(builder):
    model = builder()
    composite = AttnLRPGamma()
    composite.register(model)
    try:
        kinds = {
            name: composite.layer_type(module)
            for name, module in model.named_modules()
            if composite.layer_type(module) is not None
        }
    finally:
        composite.remove()
    if builder is tiny_timm_vit:
        assert kinds['patch_embed.proj'] == 'conv'
        assert kinds['blocks.0.attn.qkv'] == 'attention_in'
        assert kinds['blocks.1.attn.proj'] == 'attention_out'
        assert kinds['blocks.0.mlp.fc1'] == kinds['blocks.0.mlp.fc2'] == kinds['head'] == 'linear'
    else:
        assert kinds['vit.embeddings.patch_embeddings.projection'] == 'conv'
        assert {kinds[f'vit.layers.0.attention.{p}'] for p in ('q_proj', 'k_proj', 'v_proj')} == {'attention_in'}
        assert kinds['vit.layers.0.attention.o_proj'] == 'attention_out'
        assert kinds['vit.layers.0.mlp.fc1'] == kinds['classifier'] == 'linear'
    assert sorted(set(kinds.values())) == ['attention_in', 'attention_out', 'conv', 'linear']


def test_rules_are_assigned_and_overridable():
    model = tiny_timm_vit()
    composite = AttnLRPGamma(conv=ZPlus(), linear=None, attention_out=Gamma(0.5), product=ConstantGates())
    with composite.context(model):
        hooks = {type(hook).__name__ for hook in composite.hook_refs}
        assert composite.operation_canonizer.product_rule == ConstantGates()
    assert {'ZPlus', 'Gamma', 'Epsilon', 'RelevanceBoundary'} <= hooks
    assert composite.rules['linear'] is None
    assert composite.product == ConstantGates()
    assert AttnLRPGamma().product == Uniform() and CPLRPGamma().product == ConstantGates()
    assert repr(AttnLRPGamma()).startswith('AttnLRPGamma(conv=Gamma(0.25), linear=Gamma(0.05)')
    x = pixels()
    base = explain(model, x, composite=AttnLRPGamma())
    for override in (
        {'conv': ZPlus()},
        {'linear': Gamma(0.5)},
        {'attention_in': Gamma(0.25)},
        {'attention_out': Gamma(0.25)},
        {'product': ConstantGates()},
    ):
        composite = AttnLRPGamma(**override)
        other = explain(model, x, target=base.target, method=lrp_method(composite), composite=composite)
        assert (other.pixel_relevance - base.pixel_relevance).abs().max() > 1e-4 * base.pixel_relevance.abs().max(), (
            override
        )
    with pytest.raises(TypeError):
        AttnLRPGamma(conv='Gamma(0.25)')


def test_zennit_rules_are_converted():
    """A zennit relevance rule passed as is (``zennit.rules.Gamma``, which passes relevance where the composite's
    rules pass a modified gradient) acts as the library's adapter of it: the same relevance as ``Gamma`` (before, the
    relevance it passed on was read as a gradient: 43146 against a logit of -0.007 on this ViT), and the module's
    parameters stay the module's."""
    model = tiny_timm_vit(zero_bias=True, pos_embed='none')
    parameters = [(name, id(parameter)) for name, parameter in model.named_parameters()]
    x = pixels()
    ours = explain(model, x, target=0, method='cplrp', composite=CPLRPGamma(linear=Gamma(0.05)))
    composite = CPLRPGamma(linear=ZennitGamma(gamma=0.05))
    assert isinstance(composite.rules['linear'], RelevanceRule)
    assert repr(composite.rules['linear']) == 'RelevanceRule(zennit.rules.Gamma(...))'
    theirs = explain(model, x, target=0, method='cplrp', composite=composite)
    torch.testing.assert_close(theirs.relevance, ours.relevance, rtol=1e-10, atol=1e-12)
    assert [(name, id(parameter)) for name, parameter in model.named_parameters()] == parameters


def test_gamma_on_fused_qkv_keeps_the_product_rule():
    """Gamma(0) on the fused qkv equals epsilon (same stabiliser) only if the products' shares (1/4, 1/4, 1/2) still
    apply behind it, for either product rule."""
    model = tiny_timm_vit()
    x = pixels()
    for product in (Uniform(), ConstantGates()):
        method = lrp_method(AttnLRPGamma(product=product))
        reference = explain(
            model, x, method=method, composite=AttnLRPGamma(attention_in=Epsilon(STAB), product=product)
        )
        gamma = explain(
            model,
            x,
            target=reference.target,
            method=method,
            composite=AttnLRPGamma(attention_in=Gamma(0.0), product=product),
        )
        torch.testing.assert_close(gamma.pixel_relevance, reference.pixel_relevance, rtol=1e-9, atol=1e-12)


def _softmax_absorbed(model, x, composite):
    """Run by hand with timm's explicit attention: ``(pixel relevance sum, logit, relevance absorbed by the
    softmax rule)``; the absorbed part is ``sum R(A) - sum R(q) - sum R(k)``, with ``R(A)``, half of the relevance
    of ``A V`` (uniform rule), read as ``A * dA`` and ``R(q), R(k)`` read at the raw ``qkv`` output."""
    for module in model.modules():
        if hasattr(module, 'fused_attn'):
            module.fused_attn = False
    attentions, query_key = [], []
    handles = []
    for block in model.blocks:
        handles.append(block.attn.attn_drop.register_forward_hook(lambda m, i, o: attentions.append(o)))

        def watch(module, input, output):
            detached = output.detach()
            width = detached.shape[-1] // 3 * 2
            output.register_hook(
                lambda grad: query_key.append(float((detached[..., :width] * grad[..., :width]).sum()))
            )

        handles.append(block.attn.qkv.register_forward_hook(watch))
    try:
        x = x.clone().requires_grad_()
        with composite.context(model) as modified:
            logits = modified(x)
            for attention in attentions:
                attention.retain_grad()
            logit = logits[:, 0]
            logit.backward(logit.detach())
    finally:
        for handle in handles:
            handle.remove()
    attention_relevance = sum(float((a.detach() * a.grad).sum()) for a in attentions)
    return float(x.grad.sum()), float(logit.detach().sum()), attention_relevance - sum(query_key)


def test_conservation_bias_free_vit():
    """CP-LRP: the logit exactly; AttnLRP: the logit minus what the softmax rule absorbs, exactly."""
    model = tiny_timm_vit(zero_bias=True, pos_embed='none')  # class token zeroed: no relevance absorbed there
    x = pixels()
    exact = dict(
        conv=Gamma(0.25, stabilizer=1e-15), linear=Gamma(0.05, stabilizer=1e-15), attention_in=None, attention_out=None
    )
    cp = explain(model, x, target=0, method='cplrp', composite=CPLRPGamma(**exact))
    torch.testing.assert_close(cp.relevance.sum((1, 2)), cp.logit, rtol=1e-8, atol=0)

    total, logit, absorbed = _softmax_absorbed(model, x, AttnLRPGamma(**exact))
    assert abs(absorbed) > 1e-4 * abs(logit)
    assert total == pytest.approx(logit - absorbed, rel=1e-8, abs=1e-10)
    attn = explain(model, x, target=0, composite=AttnLRPGamma(**exact))
    assert float(attn.relevance.sum()) == pytest.approx(total, rel=1e-10)
    assert CLASSES == 3


def test_vision_tower_gap_is_what_the_stabilisers_absorb():
    """``CPLRPGamma(within='vision')`` on a bias-free float64 LLaVA: text + pixel relevance misses the logit by what
    the stabilisers absorb (docs/how-to/vision-language.md), the gamma rules' (``Gamma(..., stabilizer=1e-6)`` on the
    patch embedding and the MLPs) and the epsilon rule's on the attention projections (``Epsilon(1e-6)``), and by
    nothing else: 0 without them, not 0 with the defaults, the sum of the two kinds' gaps (to the product of two
    absorbed fractions), and 10 times the stabilisers give 10 times the gap (it is first order in them)."""
    model, processor = tiny_llava(zero_bias=True), llava_processor()
    text = '<image>The ice bear lives'

    def gap(gamma_stabilizer=1e-6, epsilon=1e-6, composite=None):
        attention = Epsilon(epsilon) if epsilon else None
        composite = composite or CPLRPGamma(
            within='vision',
            conv=Gamma(0.25, stabilizer=gamma_stabilizer),
            linear=Gamma(0.05, stabilizer=gamma_stabilizer),
            attention_in=attention,
            attention_out=attention,
        )
        exp = explain(model, text, images=[image()], processor=processor, method='cplrp', composite=composite)
        return float(exp.relevance.sum()) + float(exp.pixel_relevance.sum()) - float(exp.logit), float(exp.logit)

    default, logit = gap(composite=CPLRPGamma(within='vision'))
    assert gap() == (default, logit)  # the defaults spelled out
    assert abs(default) > 1e-7 * abs(logit)  # measured 2.2e-7 of a logit of 0.31
    assert abs(gap(gamma_stabilizer=1e-30, epsilon=0.0)[0]) <= 1e-12 * abs(logit)
    gamma_only, epsilon_only = gap(epsilon=0.0)[0], gap(gamma_stabilizer=1e-30)[0]
    assert gamma_only != 0 and epsilon_only != 0
    assert default == pytest.approx(gamma_only + epsilon_only, rel=1e-4)
    assert gap(gamma_stabilizer=1e-5, epsilon=1e-5)[0] == pytest.approx(10 * default, rel=1e-3)


def test_multihead_attention_projections_get_what_is_declared_or_a_refusal():
    """torchvision's ViT computes its attention projections with ``F.linear`` on the parameters of its
    ``torch.nn.MultiheadAttention``, which no rule of a module reaches. Its relevance equals that of the timm ViT with
    the same weights (two implementations of one function) where the composite gives the projections the plain
    gradient, and the default ``Epsilon(1e-6)`` stands in for it; a rule that would change them is refused, and the
    model is left as it was."""
    torchvision_vit = tiny_torchvision_vit()
    twin = timm_twin(torchvision_vit)
    x = pixels()
    assert_close(torchvision_vit(x), twin(x), tol=1e-12)
    target = torchvision_vit(x).argmax(-1)
    plain = {'attention_in': None, 'attention_out': None}
    expected = explain(twin, x, target=target, composite=AttnLRPGamma(**plain)).relevance
    for composite in (AttnLRPGamma(), AttnLRPGamma(**plain)):
        relevance = explain(torchvision_vit, x, target=target, composite=composite).relevance
        assert_close(relevance, expected, tol=1e-12)
    assert float(expected.abs().sum()) > 1e-3
    with_default = explain(twin, x, target=target, composite=AttnLRPGamma()).relevance
    assert float((with_default - expected).abs().max()) > 0  # the stabiliser is a rule of its own on timm's modules
    for rules in ({'attention_in': Gamma(0.25)}, {'attention_out': Epsilon(0.1)}, {'attention_in': ZennitGamma(0.1)}):
        with pytest.raises(UnsupportedModelError, match=r'MultiheadAttention .*would not be applied'):
            explain(torchvision_vit, x, target=target, composite=AttnLRPGamma(**rules))
        assert all(not module._forward_hooks and not module._forward_pre_hooks for module in torchvision_vit.modules())
        assert all(parameter.requires_grad for parameter in torchvision_vit.parameters())
        explain(twin, x, target=target, composite=AttnLRPGamma(**rules))  # timm calls its projection modules


def test_a_layer_computed_without_its_module_is_refused_where_its_rule_would_not_apply():
    """EVA-02 (timm) computes its attention's ``qkv`` as ``F.linear(x, self.qkv.weight, qkv_bias)`` and never calls
    the ``qkv`` module: a rule other than the plain gradient's stand-in on it is refused in the forward pass, naming the
    layer (before, ``attention_in=Gamma(0.5)`` and ``Epsilon(10)`` gave exactly the default's relevance), and the model
    is left as it was; the default ``Epsilon(1e-6)``, for which the plain gradient stands in, explains it, and so does
    a gamma rule on its MLPs, which it calls."""
    from timm.models.eva import Eva  # timm is optional (the vision extra)

    torch.manual_seed(0)
    eva = Eva(img_size=8, patch_size=4, num_classes=3, embed_dim=16, depth=2, num_heads=2, use_rot_pos_emb=True)
    eva = eva.double().eval()
    x = pixels()
    assert float(explain(eva, x, target=1, composite=AttnLRPGamma()).relevance.abs().sum()) > 0
    for rules in ({'attention_in': Gamma(0.5)}, {'attention_in': Epsilon(10.0)}):
        with pytest.raises(UnsupportedModelError, match=r"parameters of 'blocks.0.attn.qkv' \(Linear\) outside"):
            explain(eva, x, target=1, composite=AttnLRPGamma(**rules))
        assert all(not module._forward_hooks and not module._forward_pre_hooks for module in eva.modules())
        assert all(parameter.requires_grad for parameter in eva.parameters())


class _ChangedInPlace(torch.nn.Module):
    """A linear layer whose output the model changes in place (Twins' ``x += cnn_feat_token``) or not, and the sum of
    an activation's output and 0 changed in place (FastViT's ``out = scale_out + identity_out`` with no identity
    branch, then ``out += rc(x)``) or the activation's output added to."""

    def __init__(self, in_place: bool):
        super().__init__()
        torch.manual_seed(0)
        self.in_place = in_place
        self.first, self.second = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
        self.act, self.head = torch.nn.GELU(), torch.nn.Linear(4, 3)

    def forward(self, x):
        h = self.first(x)
        if self.in_place:
            h += x
            out = self.act(h) + 0
            out += self.second(x)
        else:
            h = h + x
            out = self.act(h) + self.second(x)
        return self.head(out)


@pytest.mark.parametrize('composite', [AttnLRPGamma, CPLRPGamma], ids=lambda composite: composite.__name__)
def test_outputs_changed_in_place_keep_their_rules(composite):
    """A gamma rule's layer whose output the model changes in place, and an activation's output plus 0 changed in
    place, get the relevance of the same model written without the changes (1e-12); before, torch's backward pass
    refused the saved output's new version (Twins and FastViT under the gamma composites)."""
    x = torch.randn(2, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    relevance = []
    for in_place in (True, False):
        leaf = x.clone().requires_grad_(True)
        with composite().context(_ChangedInPlace(in_place).double().eval()) as modified:
            modified(leaf)[:, 0].sum().backward()
        relevance.append(leaf.grad)
    torch.testing.assert_close(relevance[0], relevance[1], rtol=0, atol=1e-12)
    assert float(relevance[1].abs().sum()) > 0


def test_gamma_refuses_a_weight_standardised_convolution():
    """BiT's convolutions standardise whatever weight they are given, so the gamma rule's re-run with ``w + gamma
    w^+`` lost the sign of its modification: a tiny BiT got pixel relevance of 1e15 for logits of 0.16, without a
    word. The rule refuses a module whose output does not double with its weight; the epsilon rule explains it (CP-LRP
    conserves, float64, no constants)."""
    model, x = tiny_hf_vision('BitForImageClassification')
    with pytest.raises(UnsupportedModelError, match='WeightStandardizedConv2d computes its output from a transformed'):
        explain(model, x, target=1)
    explanation = explain(model, x, target=1, composite=CPLRPGamma(conv=Epsilon()))
    relevance = explanation.relevance.sum((1, 2))
    assert torch.allclose(relevance, explanation.logit, rtol=1e-4) and float(relevance.abs().max()) < 10
