"""Every registered model: tiny variants run the whole contract; full-size variants match their
published parameter counts (built on the meta device) and MACs."""
from __future__ import annotations

import pytest
import torch

import zoo
from zoo.eval.profile import count_macs

from conftest import NUM_CLASSES, example_input, model_output

TINY = zoo.list_models(tiny=True)
FULL = zoo.list_models(tiny=False)
TINY_CLS = [n for n in TINY if zoo.model_info(n).task == 'classification']


def test_every_family_has_a_tiny_variant():
    for fam in zoo.families():
        names = zoo.list_models(family=fam)
        tiny = {zoo.model_info(n).tiny for n in names} - {None}
        assert tiny, f'family {fam} names no tiny variant'
        for t in tiny:
            assert zoo.model_info(t).is_tiny, f'{t} (tiny variant of {fam}) must be registered and end in _tiny'


@pytest.mark.parametrize('name', FULL)
def test_full_size_parameter_count(name):
    info = zoo.model_info(name)
    assert info.params is not None, f'{name}: register the published parameter count'
    with torch.device('meta'):
        model = zoo.create(name)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert trainable == info.params


@pytest.mark.parametrize('name', [n for n in FULL if zoo.model_info(n).macs and
                                  zoo.model_info(n).task == 'classification'])
def test_full_size_macs_within_2_percent(name):
    info = zoo.model_info(name)
    with torch.device('meta'):
        model = zoo.create(name)
    macs = count_macs(model, info.input_size)
    assert abs(macs - info.macs) / info.macs < 0.02, f'{name}: counted {macs:,} vs published {info.macs:,}'


@pytest.mark.parametrize('name', TINY)
def test_tiny_forward_backward_every_param_gets_grad(name):
    torch.manual_seed(0)
    kw = {'num_classes': NUM_CLASSES} if zoo.model_info(name).task == 'classification' else {}
    model = zoo.create(name, **kw).train()
    x = example_input(name)
    out = model_output(model, x)
    if zoo.model_info(name).task == 'classification':
        assert out.shape == (2, NUM_CLASSES)
    assert torch.isfinite(out).all()
    out.float().square().mean().backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, f'{name}: no gradient for {missing[:5]}'


@pytest.mark.parametrize('name', TINY)
def test_tiny_state_dict_round_trip_and_seeded_determinism(name, tmp_ckpt):
    torch.manual_seed(1)
    a = zoo.create(name).eval()
    torch.manual_seed(1)
    b = zoo.create(name).eval()
    x = example_input(name)
    with torch.no_grad():
        assert torch.equal(model_output(a, x), model_output(b, x)), 'same seed must give the same model'
    torch.save(a.state_dict(), tmp_ckpt)
    torch.manual_seed(2)
    c = zoo.create(name, checkpoint=tmp_ckpt).eval()
    with torch.no_grad():
        assert torch.allclose(model_output(a, x), model_output(c, x), atol=1e-6)


@pytest.mark.parametrize('name', TINY_CLS)
def test_tiny_classification_contract(name):
    model = zoo.create(name, num_classes=NUM_CLASSES).eval()
    x = example_input(name)
    with torch.no_grad():
        feats = model.forward_features(x)
        pre = model.forward_head(feats, pre_logits=True)
        logits = model.forward_head(feats)
        assert torch.allclose(logits, model(x), atol=1e-5)
    assert pre.shape == (2, model.head_hidden_size)
    assert logits.shape == (2, NUM_CLASSES)
    model.reset_classifier(3)
    with torch.no_grad():
        assert model(x).shape == (2, 3)


@pytest.mark.parametrize('name', [n for n in TINY_CLS if 'features' in zoo.model_info(n).capabilities])
def test_tiny_features_only(name):
    model = zoo.create(name, features_only=True).eval()
    x = example_input(name)
    with torch.no_grad():
        feats = model(x)
    assert isinstance(feats, (list, tuple)) and len(feats) == len(model.feature_info)
    for f, info in zip(feats, model.feature_info):
        assert f.shape[1] == info['num_chs']
        assert f.shape[-1] == x.shape[-1] // info['reduction'] or info['reduction'] > x.shape[-1]


@pytest.mark.parametrize('name', TINY_CLS)
def test_tiny_rejects_wrong_channels(name):
    model = zoo.create(name).eval()
    x = example_input(name)
    bad = torch.randn(2, x.shape[1] + 1, *x.shape[2:])
    with pytest.raises(ValueError, match='channels'):
        model(bad)


@pytest.mark.parametrize('name', TINY_CLS)
def test_tiny_declares_the_classifier_contract(name):
    """Declared once on ClassifierBase with defaults, fulfilled by every family (ResNet and VGG included):
    no_weight_decay() names real parameters, remap_checkpoint keeps our own layout, classifier_prefix names
    the final linear layer, features_only works (every classifier has the 'features' capability)."""
    model = zoo.create(name, num_classes=NUM_CLASSES)
    assert isinstance(model, zoo.ClassifierBase)
    params = dict(model.named_parameters())
    assert set(model.no_weight_decay()) <= set(params)
    sd = model.state_dict()
    assert model.remap_checkpoint(dict(sd)).keys() == sd.keys()
    for prefix in zoo.classifier_prefix(model):  # one, or one per branch (PIIP)
        head = model.get_submodule(prefix)
        assert isinstance(head, torch.nn.Linear) and head.out_features == NUM_CLASSES
    assert 'features' in zoo.model_info(name).capabilities
