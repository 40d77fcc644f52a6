"""timm's vision architectures beyond the ViT: tiny random models (pretrained=False), float64, every bias, running
mean, position table and class token set to zero, so that CP-LRP conserves the explained logit exactly (1e-8), under
the epsilon composite and under the gamma composite with exact stabilisers; the architectures no rule covers are
refused by name.

Found by a sweep over 51 timm architectures (docs: Models): XCiT and EfficientFormer lost relevance to torch's CPU
backward of ``batch_norm`` (a wrong gradient for a batch of one whose gradient is channels-last with a batch stride
other than ``C H W``: CP-LRP relevance / logit 0.13 and 0.17), and Twins and FastViT crashed in the backward pass of
the gamma rules and of the identity rule (an output the model changes in place after the module: ``x +=
cnn_feat_token``, ``out = scale_out + 0; out += rc(x)``); gMLP was refused for the name of timm's ``MlpMixer`` class
(taken for a sequence mixer like Mamba's), its spatial gating unit a product of values.
"""

from __future__ import annotations

import pytest
import torch

from zennit_attn import explain
from zennit_attn.composites import CPLRPEpsilon, CPLRPGamma
from zennit_attn.core.errors import UnsupportedModelError
from zennit_attn.rules import Gamma

pytestmark = pytest.mark.slow
timm = pytest.importorskip('timm')

#: ``name -> (keyword arguments of a tiny model, image side)``
ARCHITECTURES = {
    'xcit_nano_12_p16_224': (
        dict(img_size=32, patch_size=8, depth=2, embed_dim=32, num_heads=2, cls_attn_layers=1),
        32,
    ),
    'efficientformer_l1': (dict(depths=(1, 1, 1, 1)), 224),
    'twins_svt_small': (dict(img_size=64, depths=(1, 1, 1, 1)), 64),
    'fastvit_t8': (dict(layers=(1, 1, 1, 1)), 32),
    'swin_tiny_patch4_window7_224': (
        dict(img_size=64, window_size=4, depths=(1, 2, 1, 1), embed_dim=32, num_heads=(1, 2, 2, 2)),
        64,
    ),
    'convnext_atto': (dict(depths=(1, 1, 1, 1)), 32),
    'levit_128s': (dict(img_size=64, depth=(1, 1, 1)), 64),
    'maxvit_rmlp_nano_rw_256': (dict(img_size=64), 64),
    'gmlp_ti16_224': (dict(img_size=32), 32),
    'cait_xxs24_224': (dict(img_size=32, patch_size=8, depth=2, embed_dim=32, num_heads=2, depth_token_only=1), 32),
}
#: ``name -> (keyword arguments, image side, what the refusal names)``
REFUSED = {
    'efficientvit_b0': (dict(), 32, 'linear attention'),
    'sequencer2d_s': (dict(layers=(1, 1, 1, 1)), 32, "lstm in '"),
}
#: The gamma composite with stabilisers that absorb nothing (CP-LRP's attention, exact).
EXACT_GAMMA = dict(
    conv=Gamma(0.25, stabilizer=1e-15), linear=Gamma(0.05, stabilizer=1e-15), attention_in=None, attention_out=None
)
#: Names of the constants of the models (biases aside) that the test sets to zero.
CONSTANTS = ('pos_emb', 'cls_token', 'dist_token', 'relative_position_bias_table', 'rel_pos', 'attn_bias')


def tiny(name: str, kwargs: dict, side: int) -> tuple[torch.nn.Module, torch.Tensor]:
    """The tiny model of ``name`` without constants, and one image."""
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, num_classes=5, **kwargs).double().eval()
    with torch.no_grad():
        for parameter_name, parameter in model.named_parameters():
            if parameter_name.endswith('bias') or any(key in parameter_name for key in CONSTANTS):
                parameter.zero_()
        for module in model.modules():
            if getattr(module, 'running_mean', None) is not None:
                module.running_mean.zero_()
                module.running_var.fill_(1.0)
        x = torch.randn(1, 3, side, side, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        if not bool(model(x).any()):  # timm starts some heads at zero (the MLP-Mixer family): the last linear layer
            head = [module for module in model.modules() if isinstance(module, torch.nn.Linear)][-1]
            head.weight.normal_(0, 0.02, generator=torch.Generator().manual_seed(2))
    return model, x


@pytest.mark.parametrize('composite', [CPLRPEpsilon, lambda: CPLRPGamma(**EXACT_GAMMA)], ids=['epsilon', 'gamma'])
@pytest.mark.parametrize('name', sorted(ARCHITECTURES))
def test_cp_lrp_conserves(name, composite):
    model, x = tiny(name, *ARCHITECTURES[name])
    with torch.no_grad():
        target = int(model(x).argmax())
    explanation = explain(model, x, target=target, composite=composite())
    torch.testing.assert_close(explanation.relevance.sum(), explanation.logit[0], rtol=1e-8, atol=1e-12)
    assert float(explanation.relevance.abs().sum()) > 0


@pytest.mark.parametrize('name', sorted(REFUSED))
def test_refused_by_name(name):
    kwargs, side, named = REFUSED[name]
    model, x = tiny(name, kwargs, side)
    with pytest.raises(UnsupportedModelError, match=named):
        explain(model, x, target=0, composite=CPLRPEpsilon())
