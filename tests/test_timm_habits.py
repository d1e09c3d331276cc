"""What people coming from timm expect (issue 15, item 10; issue 9, token ids): ``pretrained_cfg``,
``pretrained=`` and timm's vs the official PoolFormer head; clear errors for out-of-vocabulary token ids."""
from __future__ import annotations

import warnings

import pytest
import timm
import timm.data
import torch
from torch import nn

import zoo

from conftest import example_input

TINY = zoo.list_models(tiny=True)
FULL = zoo.list_models(tiny=False)
IMAGE_KEYS = ('input_size', 'interpolation', 'mean', 'std', 'crop_pct', 'num_classes')


def _check_cfg(model, name, expected_input):
    cfg = model.pretrained_cfg
    assert model.default_cfg is cfg, 'default_cfg must alias pretrained_cfg (as in timm)'
    assert cfg['architecture'] == name
    assert timm.data.resolve_model_data_config(model)['input_size'] == tuple(expected_input)
    if zoo.model_info(name).task == 'language_modeling':
        assert cfg['num_classes'] == cfg['vocab_size'] == model.vocab_size
        return
    missing = [k for k in IMAGE_KEYS if k not in cfg]
    assert not missing, f'{name}: pretrained_cfg lacks {missing}'
    c = expected_input[0]
    assert len(cfg['mean']) == len(cfg['std']) == c


@pytest.mark.parametrize('name', TINY)
def test_tiny_pretrained_cfg_gives_the_input_the_model_takes(name):
    model = zoo.create(name).eval()
    x = example_input(name)
    _check_cfg(model, name, x.shape[1:])
    with torch.no_grad():
        model(x)  # the size timm resolves is one the model accepts


@pytest.mark.parametrize('name', FULL)
def test_full_size_pretrained_cfg_on_meta(name):
    with torch.device('meta'):
        model = zoo.create(name)
    _check_cfg(model, name, zoo.model_info(name).input_size)


def test_pretrained_cfg_follows_the_build_arguments():
    """Not the registry default but what the model was built with: img_size, in_chans, num_classes."""
    m = zoo.create('stripmlp_tiny', img_size=64, in_chans=1, num_classes=4)
    cfg = timm.data.resolve_model_data_config(m)
    assert cfg['input_size'] == (1, 64, 64) and len(cfg['mean']) == 1
    assert m.pretrained_cfg['num_classes'] == 4
    m(torch.randn(1, 1, 64, 64))
    with pytest.raises(ValueError):
        m(torch.randn(1, 1, 32, 32))  # fixed-size model: the registry's 32 would be wrong
    assert zoo.create('tnt_tiny').pretrained_cfg['mean'] == (0.5, 0.5, 0.5)  # family override (timm's TNT cfg)
    assert zoo.create('poolformer_s12', num_classes=0).pretrained_cfg['crop_pct'] == 0.9
    assert zoo.create('dncnn_tiny').pretrained_cfg['std'] == (1.0,)  # denoiser: [0, 1] images, not normalised
    # timm's transform pipeline built from the cfg yields the built size
    t = timm.data.create_transform(**timm.data.resolve_model_data_config(zoo.create('resnet_tiny')))
    from PIL import Image
    assert t(Image.new('RGB', (50, 40))).shape == (3, 32, 32)


def test_pretrained_passes_through_to_timm(monkeypatch):
    calls = []

    def fake_create_model(name, **kw):
        calls.append((name, kw))
        return nn.Linear(2, 2)
    monkeypatch.setattr(timm, 'create_model', fake_create_model)
    zoo.create('timm/resnet18', pretrained=True, num_classes=3)
    zoo.create('timm/resnet18')
    assert calls == [('resnet18', {'pretrained': True, 'num_classes': 3}), ('resnet18', {'pretrained': False})]


def test_pretrained_true_for_a_zoo_model_is_a_clear_error():
    with pytest.raises(ValueError, match='ships no pretrained weights') as e:
        zoo.create('resnet_tiny', pretrained=True)
    msg = str(e.value)
    assert '\n' not in msg and 'checkpoint=' in msg
    with pytest.raises(ValueError, match=r"timm/poolformer_s12', pretrained=True"):  # the timm equivalent
        zoo.create('poolformer_s12', pretrained=True)
    assert isinstance(zoo.create('resnet_tiny', pretrained=False), nn.Module)  # timm's default is harmless


# ---- timm's vs the official PoolFormer head -----------------------------------------------------------------

def _timm_poolformer_tiny() -> nn.Module:
    """timm's own MetaFormer with poolformer_s12's settings (timm.models.metaformer.poolformer_s12) at the
    size of zoo's poolformer_tiny, random weights perturbed so every norm differs from its init."""
    from timm.models.metaformer import GroupNorm1, MetaFormer
    torch.manual_seed(0)
    m = MetaFormer(depths=(1, 1, 2, 1), dims=(16, 32, 64, 96), downsample_norm=None, mlp_act=nn.GELU,
                   mlp_bias=True, norm_layers=GroupNorm1, layer_scale_init_values=1e-5,
                   res_scale_init_values=None, use_mlp_head=False, num_classes=5).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return m


# 64x64: the last map is 2x2. At 32x32 it is 1x1 and the two heads coincide, so the test could not fail.
X = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))


def test_timm_checkpoint_selects_timm_head(tmp_path):
    t = _timm_poolformer_tiny()
    torch.save(t.state_dict(), tmp_path / 'timm.pth')
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        z = zoo.create('poolformer_tiny', num_classes=5, checkpoint=tmp_path / 'timm.pth').eval()
    assert z.timm_head
    with torch.no_grad():
        ref = t(X)
        assert torch.allclose(z(X), ref, atol=1e-5)
        # the official head with the same weights is a different function: the choice matters
        wrong = zoo.create('poolformer_tiny', num_classes=5, timm_head=False).eval()
        wrong.load_state_dict(t.state_dict())
        assert (wrong(X) - ref).abs().max() > 1e-2
    # also inside a Lightning-style checkpoint ({'state_dict': {'model.<key>': ...}})
    sd = t.state_dict()
    wrapped = type(sd)(('model.' + k, v) for k, v in sd.items())
    wrapped._metadata = type(sd._metadata)(('model' + ('.' + k if k else ''), v) for k, v in sd._metadata.items())
    torch.save({'state_dict': wrapped}, tmp_path / 'lightning.ckpt')
    assert zoo.create('poolformer_tiny', num_classes=5, checkpoint=tmp_path / 'lightning.ckpt').timm_head


def test_contradicting_or_unknown_head_warns(tmp_path):
    t = _timm_poolformer_tiny()
    torch.save(t.state_dict(), tmp_path / 'timm.pth')
    with pytest.warns(UserWarning, match='built with timm_head=False'):
        zoo.create('poolformer_tiny', num_classes=5, timm_head=False, checkpoint=tmp_path / 'timm.pth')
    from safetensors.torch import save_file
    save_file(t.state_dict(), str(tmp_path / 'timm.safetensors'))  # no module list: the file cannot tell
    with pytest.warns(UserWarning, match='cannot tell'):
        z = zoo.create('poolformer_tiny', num_classes=5, checkpoint=tmp_path / 'timm.safetensors')
    assert not z.timm_head
    with warnings.catch_warnings():  # the caller chose: no warning
        warnings.simplefilter('error')
        z = zoo.create('poolformer_tiny', num_classes=5, timm_head=True,
                       checkpoint=tmp_path / 'timm.safetensors').eval()
    with torch.no_grad():
        assert torch.allclose(z(X), t(X), atol=1e-5)


@pytest.mark.parametrize('timm_head', [False, True])
def test_zoo_checkpoint_round_trip_keeps_its_head_silently(tmp_path, timm_head):
    torch.manual_seed(3)
    a = zoo.create('poolformer_tiny', num_classes=5, timm_head=timm_head).eval()
    torch.save(a.state_dict(), tmp_path / 'zoo.pth')
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        b = zoo.create('poolformer_tiny', num_classes=5, timm_head=timm_head, checkpoint=tmp_path / 'zoo.pth')
        c = zoo.create('poolformer_tiny', num_classes=5, checkpoint=tmp_path / 'zoo.pth')
    assert b.timm_head == timm_head and c.timm_head == False  # noqa: E712 (a zoo file does not say its head)
    with torch.no_grad():
        assert torch.equal(a(X), b.eval()(X))


def test_official_layout_into_timm_head_warns(tmp_path):
    """An official-layout state dict (``network.*``, via the inverse of ``_remap_official``) is the official
    head: a model the caller built with timm's head gets a warning; without the choice, the official head."""
    z = zoo.create('poolformer_tiny', num_classes=5)
    official = {}
    for k, v in z.state_dict().items():
        p = k.split('.')
        if p[0] == 'stem':
            k = 'patch_embed.proj.' + p[-1]
        elif p[0] == 'stages' and p[2] == 'blocks':
            rest = '.'.join(p[5:]) if p[4].startswith('layer_scale') else '.'.join(p[4:])
            name = p[4].replace('layer_scale1', 'layer_scale_1').replace('layer_scale2', 'layer_scale_2')
            k = f'network.{2 * int(p[1])}.{p[3]}.' + (name if p[4].startswith('layer_scale') else rest)
        elif p[0] == 'stages' and p[2] == 'downsample':
            k = f'network.{2 * int(p[1]) - 1}.proj.{p[-1]}'
        elif p[:2] == ['head', 'norm']:
            k = 'norm.' + p[-1]
        elif p[:2] == ['head', 'fc']:
            k = 'head.' + p[-1]
        official[k] = v
    torch.save(official, tmp_path / 'official.pth')
    with pytest.warns(UserWarning, match='official head'):
        zoo.create('poolformer_tiny', num_classes=5, timm_head=True, checkpoint=tmp_path / 'official.pth')
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        m = zoo.create('poolformer_tiny', num_classes=5, checkpoint=tmp_path / 'official.pth').eval()
    assert not m.timm_head
    with torch.no_grad():
        assert torch.equal(m(X), z.eval()(X))


# ---- token ids outside the vocabulary (issue 9) --------------------------------------------------------------

@pytest.mark.parametrize('name', zoo.list_models(task='language_modeling', tiny=True))
def test_out_of_vocabulary_token_ids_are_a_clear_error(name):
    m = zoo.create(name)
    v = m.vocab_size
    for bad in (v, v + 5, -1):
        with pytest.raises(ValueError, match=rf'token id {bad} is outside the vocabulary of size {v}') as e:
            m(torch.tensor([[0, 1, bad]]))
        assert '\n' not in str(e.value)
    assert m(torch.tensor([[0, v - 1]])).shape == (1, 2, v)
