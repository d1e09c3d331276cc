"""zoo.create, the registries' errors, timm and mmengine interop, and checkpoint loading."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import zoo
from reference_poolformer import OfficialPoolFormer


def test_list_models_patterns_and_natural_sort():
    names = zoo.list_models('poolformer_s*')
    assert names == ['poolformer_s12', 'poolformer_s24', 'poolformer_s36']
    assert 'poolformer_tiny' in zoo.list_models(tiny=True)
    assert zoo.list_models(family='poolformer', tiny=False) == ['poolformer_m36', 'poolformer_m48', 'poolformer_s12',
                                                                'poolformer_s24', 'poolformer_s36']


def test_model_info_record():
    info = zoo.model_info('poolformer_s12')
    assert info.family == 'poolformer' and info.task == 'classification'
    assert info.params == 11_915_176 and info.tiny == 'poolformer_tiny'
    assert 'arXiv 2111.11418' in info.paper and 'sail-sg/poolformer' in info.repo
    assert info.as_dict()['input_size'] == (3, 224, 224)


def test_create_num_classes_and_drops_none():
    m = zoo.create('poolformer_tiny', num_classes=10, in_chans=None, drop_path_rate=None)
    assert m.head.fc.out_features == 10


def test_misspelt_model_lists_close_matches():
    with pytest.raises(KeyError, match='poolformer_s12'):
        zoo.create('poolformer_s121')
    with pytest.raises(KeyError, match='poolformer_s12'):
        zoo.model_info('poolfromer_s12')


def test_unknown_override_names_model_and_accepted_args():
    with pytest.raises(TypeError, match=r'poolformer_tiny got unknown argument\(s\) tokn_mixer.*accepts:.*token_mixer'):
        zoo.create('poolformer_tiny', tokn_mixer='pooling')


@pytest.mark.parametrize('mixer', zoo.layers.list_layers('token_mixer'))
def test_metaformer_takes_every_registered_token_mixer(mixer):
    m = zoo.create('metaformer_tiny', num_classes=5, token_mixer=mixer)
    y = m(torch.randn(2, 3, 32, 32))
    assert y.shape == (2, 5)
    y.sum().backward()


def test_metaformer_per_stage_mixers_and_norms():
    m = zoo.create('metaformer_tiny', token_mixer=['pooling', 'pooling', 'attention', 'attention'],
                   norm_layer=['groupnorm1', 'groupnorm1', 'layernorm2d', 'layernorm2d'])
    assert type(m.stages[2].blocks[0].token_mixer).__name__ == 'Attention'
    assert m(torch.randn(1, 3, 32, 32)).shape == (1, 1000)
    with pytest.raises(ValueError, match='3 entries but the model has 4 stages'):
        zoo.create('metaformer_tiny', token_mixer=['pooling'] * 3)


def test_metaformer_s12_attention_full_size_on_meta():
    with torch.device('meta'):
        m = zoo.create('metaformer_s12', token_mixer='attention')
        y = m(torch.zeros(1, 3, 224, 224))
    assert y.shape == (1, 1000)


def test_input_too_small_is_a_clear_error():
    with pytest.raises(ValueError, match='at least'):
        zoo.create('poolformer_tiny')(torch.randn(1, 3, 2, 2))


def test_any_input_size_works():
    m = zoo.create('poolformer_tiny', num_classes=3).eval()
    assert m(torch.randn(1, 3, 48, 40)).shape == (1, 3)


def test_timm_prefix_builds_timm_models():
    m = zoo.create('timm/resnet18', num_classes=4).eval()
    assert m(torch.randn(1, 3, 32, 32)).shape == (1, 4)
    with pytest.raises(KeyError, match='timm has no model'):
        zoo.create('timm/not_a_model_xyz')


def test_mmengine_registry_builds_zoo_models():
    from mmengine.registry import MODELS
    m = MODELS.build(dict(type='zoo.poolformer_tiny', num_classes=6))
    assert type(m).__name__ == 'MetaFormer' and m.num_classes == 6


def _perturbed(model):
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():  # make layer scales and norms matter
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return model


def test_timm_weights_reproduce_timm_logits(tmp_path):
    import timm
    ref = _perturbed(timm.create_model('poolformer_s12', num_classes=10)).eval()
    path = tmp_path / 'timm_poolformer_s12.pth'
    torch.save(ref.state_dict(), path)
    ours = zoo.create('poolformer_s12', num_classes=10, checkpoint=path, timm_head=True).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.allclose(ours(x), ref(x), atol=1e-4, rtol=1e-4)
        # With the official head the same weights give a different function (the documented head order), so
        # forcing it warns; without timm_head=, zoo.create picks timm's head from the file (test_timm_habits.py).
        with pytest.warns(UserWarning, match='built with timm_head=False'):
            official_head = zoo.create('poolformer_s12', num_classes=10, checkpoint=path, timm_head=False).eval()
        assert (official_head(x) - ref(x)).abs().max() > 1e-3
        picked = zoo.create('poolformer_s12', num_classes=10, checkpoint=path).eval()
        assert torch.allclose(picked(x), ref(x), atol=1e-4, rtol=1e-4)


def test_official_weights_reproduce_official_logits(tmp_path):
    ref = _perturbed(OfficialPoolFormer(num_classes=10)).eval()
    path = tmp_path / 'official_s12.pth'
    torch.save({'state_dict': ref.state_dict()}, path)
    ours = zoo.create('poolformer_s12', num_classes=10, checkpoint=path).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.allclose(ours(x), ref(x), atol=1e-4, rtol=1e-4)
        feats = ref.patch_embed(x)
        for m in ref.network:
            feats = m(feats)
        scale = feats.abs().max()
        assert (ours.forward_features(x) - feats).abs().max() <= 1e-5 * scale, 'features differ beyond float error'



def test_safetensors_checkpoint(tmp_path):
    from safetensors.torch import save_file
    a = zoo.create('poolformer_tiny', num_classes=3).eval()
    path = tmp_path / 'w.safetensors'
    save_file({k: v.contiguous() for k, v in a.state_dict().items()}, str(path))
    b = zoo.create('poolformer_tiny', num_classes=3, checkpoint=path).eval()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(a(x), b(x), atol=1e-6)


def test_new_head_when_num_classes_differs(tmp_path):
    a = zoo.create('poolformer_tiny', num_classes=3)
    torch.save(a.state_dict(), tmp_path / 'a.pth')
    with pytest.warns(UserWarning, match='different number of classes'):
        b = zoo.create('poolformer_tiny', num_classes=5, checkpoint=tmp_path / 'a.pth')
    assert torch.equal(a.stem.conv.weight, b.stem.conv.weight)


def test_mismatched_checkpoint_lists_first_mismatches(tmp_path):
    torch.save(zoo.create('poolformer_tiny').state_dict(), tmp_path / 'tiny.pth')
    with pytest.raises(ValueError, match=r'does not fit poolformer_s12:(.|\n)*shape mismatches: stem.conv.weight'):
        zoo.create('poolformer_s12', checkpoint=tmp_path / 'tiny.pth')
    (tmp_path / 'junk.pth').write_bytes(b'not a checkpoint')
    with pytest.raises(ValueError, match='could not read checkpoint'):
        zoo.create('poolformer_tiny', checkpoint=tmp_path / 'junk.pth')
    with pytest.raises(FileNotFoundError, match='checkpoint not found'):
        zoo.create('poolformer_tiny', checkpoint=tmp_path / 'missing.pth')


def test_import_zoo_stays_light():
    code = ('import sys, zoo, zoo.layers; heavy = [m for m in ("lightning", "pytorch_lightning", "optuna", '
            '"torch._dynamo", "timm", "mmengine", "torchvision.datasets", "sqlalchemy") if m in sys.modules]; '
            'print(heavy); sys.exit(1 if heavy else 0)')
    res = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True)
    assert res.returncode == 0, f'import zoo pulled in {res.stdout.strip()} {res.stderr[-500:]}'


def test_fast_inference_path_equals_autograd_path():
    torch.manual_seed(0)
    m = _perturbed(zoo.create('poolformer_tiny', num_classes=5)).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        fast = m(x)  # oneDNN where available (zoo.layers.onednn), the MLP residual fused
    slow = m(x)  # grad enabled: the plain autograd path
    assert torch.allclose(fast, slow, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------- num_classes
_TINY = zoo.list_models(tiny=True)


def _takes_num_classes(name: str) -> bool:
    return zoo.model_info(name).task in ('classification', 'detection', 'segmentation')


@pytest.mark.parametrize('name, kwargs', [('poolformer_tiny', {'in_chans': '1'}), ('llama_tiny', {'vocab_size': '10'}),
                                          ('poolformer_tiny', {'drop_path_rate': '0.1'})])
def test_numbers_given_as_text_are_one_line_errors(name, kwargs):
    """A number quoted in YAML or passed as text names the argument (torch's own error is about something else)."""
    [(arg, value)] = kwargs.items()
    with pytest.raises(TypeError, match=rf"{arg} must be an? (int|float), got str '{value}'"):
        zoo.create(name, **kwargs)


@pytest.mark.parametrize('name', _TINY)
def test_num_classes_is_checked_in_one_place_for_every_family(name):
    """Negative counts and non-integers are one-line errors; 0 means no head (timm's convention)."""
    if not _takes_num_classes(name):  # language models, denoisers: not a classifier argument at all
        with pytest.raises(TypeError, match='unknown argument'):
            zoo.create(name, num_classes=3)
        return
    with pytest.raises(ValueError, match=r'num_classes must be >= 0 \(0 = no classifier head\), got -3'):
        zoo.create(name, num_classes=-3)
    for bad in ('10', 2.0, True):
        with pytest.raises(TypeError, match='num_classes must be an int >= 0'):
            zoo.create(name, num_classes=bad)
    if zoo.model_info(name).task in ('detection', 'segmentation'):  # without classes there is nothing to predict
        with pytest.raises(ValueError, match='num_classes'):
            zoo.create(name, num_classes=0)
        return
    m = zoo.create(name, num_classes=0).eval()
    x = torch.randn(2, *zoo.model_info(name).input_size)
    with torch.no_grad():
        assert m(x).shape == (2, m.num_features), 'num_classes=0 must return the pooled features (no head)'
    assert not [k for k, v in m.state_dict().items() if v.numel() == 0], 'no zero-sized classifier left behind'


# ------------------------------------------------------------------------------- torchvision weights
def _random_bn_stats(model):
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):  # non-trivial statistics, so a swapped bn would show
                m.running_mean.copy_(torch.randn(m.num_features, generator=g))
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.weight.copy_(torch.randn(m.num_features, generator=g))
                m.bias.copy_(torch.randn(m.num_features, generator=g))
    return model.eval()


def test_torchvision_resnet18_weights_reproduce_torchvision_logits(tmp_path):
    import torchvision
    torch.manual_seed(0)
    ref = _random_bn_stats(torchvision.models.resnet18())
    torch.save(ref.state_dict(), tmp_path / 'tv.pth')
    ours = zoo.create('resnet18', checkpoint=tmp_path / 'tv.pth').eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.allclose(ours(x), ref(x), atol=1e-5, rtol=1e-5)
    # the same weights start a weighted-conv fine-tune (den/Phi come from the model, not the checkpoint)
    w = zoo.create('resnet18', conv_layer='weighted', den=[1.0], checkpoint=tmp_path / 'tv.pth').eval()
    with torch.no_grad():
        assert torch.allclose(w(x), ref(x), atol=1e-5, rtol=1e-5)


def test_torchvision_resnet50_keys_and_shapes_all_map():
    """Full-size key coverage on the meta device (no memory, no compute): every torchvision key maps onto ours."""
    import torchvision
    with torch.device('meta'):
        ref, ours = torchvision.models.resnet50(), zoo.create('resnet50')
    mapped = ours.remap_checkpoint(ref.state_dict())
    own = ours.state_dict()
    assert sorted(mapped) == sorted(own)
    assert all(mapped[k].shape == own[k].shape for k in own)


@pytest.mark.parametrize('batch_norm', [False, True])
def test_torchvision_vgg_weights_reproduce_torchvision_logits(tmp_path, batch_norm):
    """torchvision's VGG class with a small configuration (its own make_layers; the first classifier layer
    narrowed to the 64-channel grid), so the test stays small; the key layout is torchvision's."""
    from torchvision.models.vgg import VGG, make_layers
    torch.manual_seed(0)
    cfg = [16, 'M', 32, 'M', 64, 64, 'M']
    ref = VGG(make_layers(cfg, batch_norm=batch_norm), num_classes=10)
    ref.classifier[0] = torch.nn.Linear(64 * 7 * 7, 4096)
    ref = _random_bn_stats(ref)
    torch.save(ref.state_dict(), tmp_path / 'tv.pth')
    ours = zoo.create('vgg11', cfg=tuple(cfg), batch_norm=batch_norm, num_classes=10,
                      checkpoint=tmp_path / 'tv.pth').eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(ours(x), ref(x), atol=1e-5, rtol=1e-5)
