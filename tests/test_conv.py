"""Weighted convolution and ConvBN modes: closed-form checks, Eval/Tune/Deploy equivalence, mmengine
reference, set_mode on torchvision, host parameter counts, the denoising recipe."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import zoo
from zoo.layers.convbn import ConvBN, set_mode
from zoo.layers.weighted_conv import WeightedConv1d, WeightedConv2d, WeightedConv3d, density_mask


def test_phi_closed_form_and_bad_den():
    d = 0.7
    expected = torch.tensor([[d * d, d, d * d], [d, 1, d], [d * d, d, d * d]])
    assert torch.allclose(density_mask([d], 2), expected)
    phi7 = density_mask([0.25, 0.15, 0.55], 2)
    assert torch.equal(phi7, phi7.T) and phi7[3, 3] == 1
    assert density_mask([0.5], 3).shape == (3, 3, 3) and density_mask([0.5], 1).tolist() == [0.5, 1, 0.5]
    with pytest.raises(ValueError, match='needs den with 1 value'):
        WeightedConv2d(2, 2, 3, den=[0.5, 0.5])
    with pytest.raises(ValueError, match='odd isotropic'):
        WeightedConv2d(2, 2, (3, 5))
    with pytest.raises(ValueError, match='odd isotropic'):
        WeightedConv2d(2, 2, 4)


@pytest.mark.parametrize('kw', [dict(), dict(stride=2, padding=1), dict(dilation=2, padding=2, groups=4)])
def test_den_ones_is_nn_conv2d_exactly(kw):
    torch.manual_seed(0)
    ref = nn.Conv2d(4, 8, 3, **kw)
    w = WeightedConv2d(4, 8, 3, **kw)
    w.load_state_dict(ref.state_dict(), strict=False)
    x = torch.randn(2, 4, 9, 9)
    assert torch.equal(w(x), ref(x))
    assert sum(p.numel() for p in w.parameters()) == sum(p.numel() for p in ref.parameters())


@pytest.mark.parametrize('cls,fn,shape', [(WeightedConv1d, F.conv1d, (2, 3, 11)), (WeightedConv2d, F.conv2d, (2, 3, 9, 9)),
                                          (WeightedConv3d, F.conv3d, (2, 3, 5, 5, 5))])
def test_output_and_weight_gradient_are_phi_times_standard(cls, fn, shape):
    torch.manual_seed(0)
    conv = cls(3, 4, 5, padding=2, den=[0.3, 1.2])
    x = torch.randn(shape)
    y = conv(x)
    assert torch.equal(y, fn(x, conv.weight * conv.Phi, conv.bias, padding=2))
    y.square().sum().backward()
    w_eff = (conv.weight * conv.Phi).detach().requires_grad_()
    fn(x, w_eff, conv.bias.detach(), padding=2).square().sum().backward()
    assert torch.allclose(conv.weight.grad, conv.Phi * w_eff.grad, rtol=1e-5, atol=1e-6)


def test_weighted_matches_unfold_formulation():
    torch.manual_seed(0)
    conv = WeightedConv2d(3, 5, 3, padding=1, bias=False, den=[0.6])
    x = torch.randn(2, 3, 6, 6)
    cols = F.unfold(x, 3, padding=1)  # (B, Cin*9, L)
    k = (conv.weight * conv.Phi).flatten(1)  # (Cout, Cin*9)
    ref = torch.einsum('ok,bkl->bol', k, cols).reshape(2, 5, 6, 6)
    assert torch.allclose(conv(x), ref, atol=1e-5)


def _official_fixed_layout(cout, cin, k, den, ndim=2, bias=False, seed=0):
    """A state dict in the official ``wConv{1,2,3}d`` layout (cammarasana123/weightedConvolution2.0 ``wConv.py``):
    ``weight``, optional ``bias``, the whole 1-D profile ``alfa = [den, 1, reversed(den)]`` and its outer power
    ``Phi``, written here from that description."""
    g = torch.Generator().manual_seed(seed)
    d = torch.tensor(den, dtype=torch.float32)
    alfa = torch.cat([d, torch.ones(1), d.flip(0)])
    phi = alfa if ndim == 1 else torch.einsum('i,j->ij', alfa, alfa) if ndim == 2 else \
        torch.einsum('i,j,k->ijk', alfa, alfa, alfa)
    sd = {'weight': torch.randn(cout, cin, *(k,) * ndim, generator=g), 'alfa': alfa, 'Phi': phi}
    if bias:
        sd['bias'] = torch.randn(cout, generator=g)
    return sd


@pytest.mark.parametrize('cls,fn,ndim', [(WeightedConv1d, F.conv1d, 1), (WeightedConv2d, F.conv2d, 2),
                                         (WeightedConv3d, F.conv3d, 3)])
@pytest.mark.parametrize('bias', [False, True])
def test_official_state_dict_loads(cls, fn, ndim, bias):
    """The official layer computes conv(x, weight * Phi, bias, padding=1) with its buffers alfa and Phi.

    Checked once against the official layers themselves (weightedConvolution2.0 @ 7ee7e21, run in /tmp):
    wConv1d/2d/3d state dicts loaded into ours built with ``padding=1`` gave max |delta| 0.0 (k = 3 and 7, with
    and without bias), ours loaded into theirs (den -> alfa) 0.0, and the trainable wConv2d (7x7) 0.0."""
    den = [0.25, 0.15, 0.55] if ndim == 2 else [0.4]
    k = 2 * len(den) + 1
    sd = _official_fixed_layout(6, 3, k, den, ndim, bias)
    conv = cls(3, 6, k, padding=1, bias=bias)   # the official defaults: padding 1, no bias
    conv.load_state_dict(sd)
    assert conv.den.tolist() == pytest.approx(den) and torch.equal(conv.Phi, sd['Phi'])
    x = torch.randn(2, 3, *(7,) * ndim)
    assert torch.equal(conv(x), fn(x, sd['weight'] * sd['Phi'], sd.get('bias'), padding=1))
    # the trainable variant (wConv_Trainable.py) stores den as a parameter and no Phi: both load either way
    trainable = cls(3, 6, k, padding=1, bias=bias, trainable_den=True)
    trainable.load_state_dict(sd)
    assert torch.allclose(trainable(x), conv(x))
    fixed = cls(3, 6, k, padding=1, bias=bias)
    fixed.load_state_dict({kk: v for kk, v in trainable.state_dict().items()})
    assert torch.equal(fixed.Phi, conv.Phi)


def test_official_state_dict_with_a_bad_profile_is_an_error():
    sd = _official_fixed_layout(4, 2, 3, [0.5])
    sd['alfa'] = torch.tensor([0.5, 1.0, 0.7])  # not symmetric
    with pytest.raises(RuntimeError, match=r'alfa must be the symmetric profile'):
        WeightedConv2d(2, 4, 3, padding=1, bias=False).load_state_dict(sd)


def test_defaults_differ_from_official_as_documented():
    """nn.Conv2d's defaults (padding 0, bias) rather than the official layer's (padding 1, no bias)."""
    conv = WeightedConv2d(2, 4, 3, den=[0.5])
    assert conv.padding == (0, 0) and conv.bias is not None
    assert conv(torch.randn(1, 2, 5, 5)).shape == (1, 4, 3, 3)   # unpadded, like nn.Conv2d


def test_trainable_density_gets_gradient():
    conv = WeightedConv2d(2, 3, 5, padding=2, den=[0.5, 0.9], trainable_den=True)
    assert {n for n, _ in conv.named_parameters()} == {'weight', 'bias', 'den'}
    conv(torch.randn(2, 2, 7, 7)).square().mean().backward()
    assert conv.den.grad is not None and conv.den.grad.abs().sum() > 0


def _randomize_bn(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.running_mean.copy_(torch.rand(m.num_features, generator=g) - 0.5)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            if m.affine:
                m.weight.data.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.data.copy_(torch.rand(m.num_features, generator=g) - 0.5)
    return model


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize('kw', [dict(), dict(bias=True, stride=2, groups=2), dict(conv_layer=nn.Conv1d),
                                dict(conv_layer=nn.Conv3d), dict(conv_layer=lambda *a, **k: WeightedConv2d(*a, den=[0.6], **k))])
def test_convbn_tune_and_deploy_match_eval(kw):
    torch.manual_seed(0)
    ref = _randomize_bn(ConvBN(4, 6, 3, padding=1, **kw), 1)
    ndim = ref.conv.weight.ndim - 2
    x = torch.randn(2, 4, *(7,) * ndim)
    blocks = {m: copy.deepcopy(ref).set_mode(m) for m in ('eval', 'tune')}
    out, grads, xgrads = {}, {}, {}
    for mode, b in blocks.items():
        b.train()  # modes are sticky: model.train() does not bring batch statistics back
        xi = x.clone().requires_grad_()
        out[mode] = b(xi)
        (out[mode] * torch.linspace(-1, 1, out[mode].numel()).view_as(out[mode])).sum().backward()
        grads[mode], xgrads[mode] = _grads(b), xi.grad
    assert torch.allclose(out['tune'], out['eval'], atol=2e-5, rtol=1e-5)
    assert torch.allclose(xgrads['tune'], xgrads['eval'], atol=1e-5, rtol=1e-4)
    assert grads['tune'].keys() == grads['eval'].keys() and {'conv.weight', 'bn.weight', 'bn.bias'} <= grads['eval'].keys()
    for n in grads['eval']:
        scale = grads['eval'][n].abs().max()
        assert (grads['tune'][n] - grads['eval'][n]).abs().max() <= 1e-4 * scale + 1e-6, n
    for mode, b in blocks.items():  # frozen statistics
        assert torch.equal(b.bn.running_mean, ref.bn.running_mean) and torch.equal(b.bn.running_var, ref.bn.running_var)
    dep = copy.deepcopy(ref).set_mode('deploy')
    assert isinstance(dep.bn, nn.Identity)
    assert torch.allclose(dep(x), out['eval'].detach(), atol=2e-5, rtol=1e-5)
    with pytest.raises(ValueError, match='deploy'):
        dep.set_mode('tune')


def test_convbn_train_mode_uses_batch_statistics():
    b = ConvBN(3, 4, 3, padding=1).train()
    ref = nn.Sequential(copy.deepcopy(b.conv), copy.deepcopy(b.bn)).train()
    x = torch.randn(4, 3, 6, 6)
    assert torch.allclose(b(x), ref(x), atol=1e-6)
    assert torch.allclose(b.bn.running_mean, ref[1].running_mean)
    with pytest.raises(ValueError, match='expected one of'):
        b.set_mode('fast')


def test_set_mode_finds_every_pair_in_torchvision_resnet50():
    tv = pytest.importorskip('torchvision')
    model = tv.models.resnet50(weights=None)
    n_bn = sum(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert set_mode(model, 'tune') == {'blocks': 0, 'traced_pairs': n_bn, 'other_bn': 0} and n_bn == 53


def _tiny_tv_net():
    """A torchvision-style net with a stem, a residual, a reused conv, a BN on a non-conv input, affine=False."""
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
            self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8, affine=False)
            self.shared = nn.Conv2d(8, 8, 1)
            self.bn3 = nn.BatchNorm2d(8)
            self.pool, self.bn_pool = nn.AvgPool2d(2), nn.BatchNorm2d(8)
            self.fc = nn.Linear(8, 5)

        def forward(self, x):
            x = torch.relu(self.bn1(self.conv1(x)))
            x = torch.relu(self.bn2(self.conv2(x)) + x)
            y = self.shared(x)
            x = self.bn3(self.shared(y)) + y  # the conv is called twice: not foldable
            x = self.bn_pool(self.pool(x))  # BN after a non-conv
            return self.fc(x.mean((2, 3)))
    return Net()


def test_set_mode_traced_pairs_match_eval_and_mmengine():
    from mmengine.model.efficient_conv_bn_eval import turn_on_efficient_conv_bn_eval_for_single_model
    torch.manual_seed(0)
    base = _randomize_bn(_tiny_tv_net())
    x = torch.randn(2, 3, 8, 8)
    ev = copy.deepcopy(base).eval()
    tune = copy.deepcopy(base)
    keys = list(tune.state_dict())
    assert set_mode(tune, 'tune') == {'blocks': 0, 'traced_pairs': 2, 'other_bn': 2}
    assert list(tune.state_dict()) == keys
    mm = copy.deepcopy(base).eval()
    turn_on_efficient_conv_bn_eval_for_single_model(mm)
    outs = {}
    for name, m in (('eval', ev), ('tune', tune), ('mmengine', mm)):
        m.eval()
        out = m(x)
        out.square().sum().backward()
        outs[name] = (out.detach(), _grads(m))
    for name in ('tune', 'mmengine'):
        assert torch.allclose(outs[name][0], outs['eval'][0], atol=2e-5, rtol=1e-5)
        for n, g in outs['eval'][1].items():
            assert torch.allclose(outs[name][1][n], g, atol=1e-4 * g.abs().max() + 1e-7), (name, n)
    dep = copy.deepcopy(base).eval()
    set_mode(dep, 'deploy')
    assert isinstance(dep.bn1, nn.Identity) and isinstance(dep.bn3, nn.BatchNorm2d)
    assert torch.allclose(dep(x), outs['eval'][0], atol=2e-5)
    exported = torch.export.export(dep, (x,))
    assert torch.allclose(exported.module()(x), outs['eval'][0], atol=2e-5)


def test_tune_mode_keeps_fewer_activation_bytes():
    from benchmarks.convbn_bench import saved_bytes
    torch.manual_seed(0)
    model = zoo.create('resnet_tiny', num_classes=10)
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    set_mode(model, 'eval')
    ev = saved_bytes(model, x, y)
    set_mode(model, 'tune')
    assert saved_bytes(model, x, y) < 0.7 * ev


@pytest.mark.parametrize('name,tv_name', [('resnet18', 'resnet18'), ('resnet50', 'resnet50'), ('vgg11', 'vgg11'),
                                          ('vgg16_bn', 'vgg16_bn')])
def test_host_counts_equal_torchvision_for_both_convs(name, tv_name):
    tv = pytest.importorskip('torchvision')
    with torch.device('meta'):
        ref = sum(p.numel() for p in getattr(tv.models, tv_name)().parameters())
        std = sum(p.numel() for p in zoo.create(name).parameters())
        w = zoo.create(name, conv_layer='weighted', den=[0.7])
    assert std == ref == sum(p.numel() for p in w.parameters())
    assert any(isinstance(m, WeightedConv2d) for m in w.modules())


def test_weighted_host_den_one_equals_standard_host():
    torch.manual_seed(0)
    std = zoo.create('resnet_tiny', num_classes=5).eval()
    torch.manual_seed(0)
    w = zoo.create('resnet_tiny', num_classes=5, conv_layer='weighted', den=[1.0]).eval()
    w.load_state_dict(std.state_dict(), strict=False)
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(w(x), std(x))
    with pytest.raises(ValueError, match="conv_layer='weighted'"):
        zoo.create('resnet_tiny', den=[0.7])


def test_dncnn_predicts_the_noise_residually():
    m = zoo.create('dncnn_tiny').eval()
    x = torch.rand(1, 1, 16, 16)
    assert torch.allclose(m(x), x - m.predict_noise(x))
    assert sum(p.numel() for p in zoo.create('dncnn', conv_layer='weighted', den=[0.7]).parameters()) == 556_096


def test_denoising_recipe_psnr_goes_up():
    pytest.importorskip('lightning')
    from lightning.pytorch import Trainer, seed_everything

    from zoo.datasets import PhotoPatchesDataModule
    from zoo.recipes.denoising import Denoiser
    seed_everything(0)
    data = PhotoPatchesDataModule(patch_size=24, batch_size=16, patches_per_epoch=16 * 25, max_side=96)
    system = Denoiser('dncnn_tiny', model_args={'conv_layer': 'weighted', 'den': [0.7]}, sigma=25,
                      optimizer=lambda p: torch.optim.Adam(p, lr=3e-3))
    assert system.block_choices == {'conv_layer': 'weighted', 'den': '[0.7]'} and system.model_name == 'dncnn_tiny'
    kw = dict(accelerator='cpu', logger=False, enable_checkpointing=False, enable_progress_bar=False,
              enable_model_summary=False)
    before = Trainer(**kw).validate(system, datamodule=data, verbose=False)[0]['val/psnr']
    Trainer(max_epochs=1, num_sanity_val_steps=0, **kw).fit(system, datamodule=data)
    after = Trainer(**kw).validate(system, datamodule=data, verbose=False)[0]['val/psnr']
    assert after > before + 1.0, (before, after)


def test_photo_datamodule_shapes_and_bad_input():
    from zoo.datasets import PhotoPatchesDataModule
    data = PhotoPatchesDataModule(patch_size=16, batch_size=4, patches_per_epoch=8, max_side=64)
    data.setup('fit')
    batch = next(iter(data.train_dataloader()))
    assert batch.shape == (4, 1, 16, 16) and 0 <= batch.min() and batch.max() <= 1
    assert [tuple(im.shape[:1]) for im in data.val_set.images] == [(1,)] * 3
    with pytest.raises(ValueError, match='both training and held-out'):
        PhotoPatchesDataModule(train_images=['camera'], held_out_images=['camera'])
    with pytest.raises(ValueError, match='larger than'):
        PhotoPatchesDataModule(patch_size=100, max_side=64).setup('fit')
