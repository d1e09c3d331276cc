"""Every registered block: its kind's shape contract, gradients to every parameter, no NaN."""
from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

import zoo
from zoo import layers

RECORDS = layers.records()


def _build(rec):
    return rec.cls(**rec.example)


def _expected_shape(rec, x, module):
    b = x.shape[0]
    if rec.kind in ('token_mixer', 'block', 'norm', 'act', 'sequence_mixer', 'canon'):
        return x.shape
    if rec.kind == 'channel_mixer':
        out = rec.example.get('out_features') or rec.example['in_features']
        return (*x.shape[:-1], out) if rec.layout == 'nlc' else (b, out, *x.shape[2:])
    if rec.kind == 'head':
        return (b, rec.example['num_classes'])
    return None  # stem, downsample, conv: checked below by channels


DENSE = ('neck', 'dense_head')  # lists of maps in and out


@pytest.mark.parametrize('rec', [r for r in RECORDS if r.kind in DENSE], ids=lambda r: f'{r.kind}/{r.name}')
def test_dense_block_contract(rec):
    """Necks keep the number of levels and their strides, with ``out_channels``; dense heads give one raw output
    per level (segmentation heads: the class logits at the finest level); gradients reach every parameter."""
    assert rec.example_input and all(isinstance(s, tuple) for s in rec.example_input), rec.name
    torch.manual_seed(0)
    module = _build(rec)
    xs = [torch.randn(*shape, requires_grad=True) for shape in rec.example_input]
    ys = module(xs)
    if getattr(module, 'fused', False):  # a segmentation head: class logits at the finest level (+ auxiliary)
        assert ys[0].shape == (xs[0].shape[0], module.num_classes, *xs[0].shape[-2:])
    else:
        assert len(ys) == len(xs)
        for x, y, c in zip(xs, ys, getattr(module, 'out_channels', [None] * len(xs))):
            assert y.shape[0] == x.shape[0] and y.shape[-2:] == x.shape[-2:] and (c is None or y.shape[1] == c)
    sum((y.float() ** 2).mean() for y in ys).backward()
    for n, p in module.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and torch.isfinite(p.grad).all(), f'{rec.kind}/{rec.name}: {n}'


@pytest.mark.parametrize('rec', [r for r in RECORDS if r.kind not in DENSE], ids=lambda r: f'{r.kind}/{r.name}')
def test_block_contract(rec):
    assert rec.example_input, f'{rec.kind}/{rec.name} must declare example_input for the tests'
    torch.manual_seed(0)
    module = _build(rec)
    x = torch.randn(*rec.example_input, requires_grad=True)
    y = module(x)
    y = y[0] if isinstance(y, tuple) else y
    expected = _expected_shape(rec, x, module)
    if expected is not None:
        assert tuple(y.shape) == tuple(expected)
    else:
        out_chs = rec.example.get('out_chs') or rec.example.get('out_channels')
        assert y.shape[0] == x.shape[0] and (out_chs is None or y.shape[1] == out_chs)
    assert torch.isfinite(y).all()
    (y.float() ** 2).mean().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    for n, p in module.named_parameters():
        if p.requires_grad:
            assert p.grad is not None, f'{rec.kind}/{rec.name}: parameter {n} got no gradient'
            assert torch.isfinite(p.grad).all()


def test_get_resolves_names_classes_and_partials():
    cls = layers.get('token_mixer', 'pooling')
    assert cls is layers.token_mixers.Pooling
    assert layers.get('token_mixer', cls) is cls
    part = functools.partial(cls, pool_size=5)
    assert layers.get('token_mixer', part) is part
    assert layers.get('norm', None) is None
    assert layers.name_of('token_mixer', part) == 'pooling'


def test_unknown_block_lists_close_matches():
    with pytest.raises(KeyError, match="pooling"):
        layers.get('token_mixer', 'poolng')
    with pytest.raises(ValueError, match='expected one of'):
        layers.get('mixer', 'pooling')


def test_list_layers():
    assert 'pooling' in layers.list_layers('token_mixer')
    assert 'token_mixer/pooling' in layers.list_layers()
    assert layers.list_layers('norm', 'group*') == ['groupnorm1']


def test_register_rejects_a_second_class_under_one_name():
    with pytest.raises(ValueError, match='already registered'):
        @layers.register('token_mixer', 'pooling')
        class Other(nn.Module):
            pass


def test_pooling_is_avgpool_minus_identity_without_padding_counts():
    x = torch.randn(1, 4, 5, 5)
    y = layers.token_mixers.Pooling(4)(x)
    # corner: mean of the 2x2 in-bounds window (count_include_pad=False), minus x
    assert torch.allclose(y[0, :, 0, 0], x[0, :, :2, :2].mean((1, 2)) - x[0, :, 0, 0], atol=1e-6)
    center = x[0, :, 1:4, 1:4].mean((1, 2)) - x[0, :, 2, 2]
    assert torch.allclose(y[0, :, 2, 2], center, atol=1e-6)


def test_groupnorm1_normalises_over_chw_not_channels():
    x = torch.randn(2, 8, 4, 4)
    gn, ln = layers.norm.GroupNorm1(8), layers.norm.LayerNorm2d(8)
    y = gn(x)
    assert torch.allclose(y.mean((1, 2, 3)), torch.zeros(2), atol=1e-5)
    assert not torch.allclose(y, ln(x), atol=1e-3)
    assert sum(p.numel() for p in gn.parameters()) == sum(p.numel() for p in ln.parameters())


def test_fused_mlp_inference_equals_training_path():
    torch.manual_seed(0)
    mlp = layers.mlp.ConvMlp(16, 64).eval()
    x = torch.randn(2, 16, 9, 9).contiguous(memory_format=torch.channels_last)
    ref = mlp.fc2(mlp.act(mlp.fc1(x)))
    with torch.inference_mode():
        fast = mlp(x)
    assert torch.allclose(fast, ref, atol=1e-5)
