"""zoo.layers.onednn: oneDNN's linear and convolution (GELU fused, BN folded) compute the plain modules' function."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from zoo.layers.onednn import conv_bn_act, linear, onednn_enabled

needs_onednn = pytest.mark.skipif(not onednn_enabled(), reason='PyTorch built without oneDNN')


def _close(a, b):
    assert (a - b).abs().max().item() <= 1e-5 * b.abs().max().item() + 1e-7


@needs_onednn
@pytest.mark.parametrize('bias', [True, False])
@pytest.mark.parametrize('gelu', [True, False])
def test_linear_equals_f_linear_in_inference_and_with_autograd(bias, gelu):
    torch.manual_seed(0)
    layer = nn.Linear(24, 40, bias=bias)
    x = torch.randn(3, 7, 5, 24).transpose(1, 2)  # not contiguous
    plain = lambda t: F.gelu(layer(t)) if gelu else layer(t)  # noqa: E731
    with torch.inference_mode():
        _close(linear(x, layer, gelu=gelu), plain(x))
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    g = torch.randn(3, 5, 7, 40)
    (linear(xa, layer, gelu=gelu) * g).sum().backward()
    fast = [xa.grad] + [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    (plain(xb) * g).sum().backward()
    for a, b in zip(fast, [xb.grad] + [p.grad for p in layer.parameters()]):
        _close(a, b)


@needs_onednn
@pytest.mark.parametrize('channels_last', [False, True])
def test_conv_bn_gelu_folds_the_batch_norm(channels_last):
    torch.manual_seed(0)
    for conv in (nn.Conv2d(8, 6, 1), nn.Conv2d(8, 8, (1, 3), padding=(0, 1), groups=4), nn.Conv2d(8, 6, 1, bias=False)):
        bn = nn.BatchNorm2d(conv.out_channels)
        with torch.no_grad():
            bn.running_mean.normal_()
            bn.running_var.uniform_(0.5, 2)
            bn.weight.normal_()
            bn.bias.normal_()
        bn.eval()
        x = torch.randn(2, 8, 5, 6)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.inference_mode():
            _close(conv_bn_act(x, conv, bn, gelu=True), F.gelu(bn(conv(x))))
            _close(conv_bn_act(x, conv), conv(x))
        _close(conv_bn_act(x, conv, bn, gelu=True).detach(), F.gelu(bn(conv(x))).detach())  # autograd: the modules


def test_counters_and_zoo_onednn_0_see_the_plain_linear(monkeypatch):
    from torch.utils.flop_counter import FlopCounterMode
    layer, x = nn.Linear(16, 32), torch.randn(10, 16)
    for grad in (True, False):
        with torch.set_grad_enabled(grad), FlopCounterMode(display=False) as counter:
            linear(x, layer, gelu=True)
        assert counter.get_total_flops() == 2 * 10 * 16 * 32
    monkeypatch.setenv('ZOO_ONEDNN', '0')
    assert not onednn_enabled()
    with torch.inference_mode():
        assert torch.equal(linear(x, layer, gelu=True), F.gelu(layer(x)))


@needs_onednn
def test_prepared_weights_follow_every_change_of_the_weights():
    """In eval mode conv_bn_act and linear keep oneDNN-reordered (BN-folded) weights between calls; the output must
    still follow in-place edits, load_state_dict, BN statistics, a new input shape and .to(), and the cache must
    stay out of state dicts, deepcopy and pickling."""
    import copy
    import io

    from zoo.layers.onednn import _PREPARED, clear_prepared

    torch.manual_seed(0)
    conv, bn, fc = nn.Conv2d(8, 8, (1, 3), padding=(0, 1), groups=2), nn.BatchNorm2d(8), nn.Linear(8, 5)
    for m in (conv, bn, fc):
        m.eval()
    x = torch.randn(2, 8, 4, 6).contiguous(memory_format=torch.channels_last)

    def check(inp=x):
        with torch.inference_mode():
            _close(conv_bn_act(inp, conv, bn, gelu=True), F.gelu(bn(conv(inp))))
            _close(linear(inp.permute(0, 2, 3, 1), fc), fc(inp.permute(0, 2, 3, 1)))

    check()
    assert conv in _PREPARED and fc in _PREPARED
    with torch.no_grad():
        conv.weight.mul_(-2)
        bn.running_var.add_(3)
        fc.bias.add_(1)
    check()
    conv.load_state_dict({k: torch.randn_like(v) for k, v in conv.state_dict().items()})
    fc.load_state_dict({k: torch.randn_like(v) for k, v in fc.state_dict().items()})
    check()
    check(torch.randn(1, 8, 4, 6))  # another batch size (the conv weights were reordered for the input shape)
    conv.double().float()  # new tensors
    check()
    conv.weight.data.mul_(3)  # bypasses the version counter: stale until cleared
    clear_prepared()
    check()
    assert set(conv.state_dict()) == {'weight', 'bias'}
    copy.deepcopy(conv)
    torch.save(conv, io.BytesIO())
    conv.train()  # weights change every step in training mode: nothing is kept
    clear_prepared()
    with torch.inference_mode():
        conv_bn_act(x, conv, bn)
    assert conv not in _PREPARED
