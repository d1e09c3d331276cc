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


@needs_onednn
@pytest.mark.parametrize('channels_last', [False, True])
def test_conv_mlp_with_its_residual_fused_equals_the_plain_block(channels_last):
    """ConvMlp (PoolFormer's MLP) through the door: GELU fused into fc1, ``residual + scale * fc2(h)`` as fc2's
    binary post-op, in inference; the same function as the plain modules (and with autograd, the plain ones)."""
    from zoo.layers.mlp import ConvMlp

    torch.manual_seed(0)
    mlp = ConvMlp(8, 32).eval()
    x, res, scale = torch.randn(2, 8, 5, 6), torch.randn(2, 8, 5, 6), torch.randn(8)
    if channels_last:
        x, res = x.contiguous(memory_format=torch.channels_last), res.contiguous(memory_format=torch.channels_last)
    plain = mlp.fc2(F.gelu(mlp.fc1(x)))
    with torch.inference_mode():
        _close(mlp(x), plain)
        _close(mlp(x, residual=res, scale=scale), res + scale.view(1, -1, 1, 1) * plain)
        _close(mlp(x, residual=res), res + plain)
    _close(mlp(x, residual=res, scale=scale).detach(), (res + scale.view(1, -1, 1, 1) * plain).detach())


@needs_onednn
@pytest.mark.parametrize('failure', ['wrong', 'error'])
def test_a_kernel_that_fails_its_first_use_self_test_warns_once_and_falls_back(failure, monkeypatch):
    """The first oneDNN call of each kind is checked against the plain ops; a wrong result or an error warns once
    and that kind runs the plain ops from then on (the other kinds are unaffected)."""
    import warnings

    from zoo.layers import onednn

    monkeypatch.setattr(onednn, '_CHECKED', {})
    real = torch.ops.mkldnn._linear_pointwise

    def broken(*args):
        if failure == 'error':
            raise RuntimeError('unsupported')
        return real(*args) + 1

    monkeypatch.setattr(torch.ops.mkldnn, '_linear_pointwise', broken)
    torch.manual_seed(0)
    layer, x = nn.Linear(8, 4).eval(), torch.randn(3, 8)
    with torch.inference_mode():
        with pytest.warns(RuntimeWarning, match='oneDNN linear kernel does not compute'):
            y = linear(x, layer)
        assert torch.equal(y, F.linear(x, layer.weight, layer.bias))
        with warnings.catch_warnings():
            warnings.simplefilter('error')  # no second warning
            assert torch.equal(linear(x, layer), F.linear(x, layer.weight, layer.bias))
        assert onednn._CHECKED == {('linear', torch.float32): False}
        conv = nn.Conv2d(4, 4, 1).eval()
        conv_bn_act(torch.randn(1, 4, 3, 3), conv, gelu=True)  # another kind: still checked and used
    assert onednn._CHECKED == {('linear', torch.float32): False, ('conv+gelu', torch.float32): True}


@needs_onednn
def test_a_kernel_that_passes_is_checked_once(monkeypatch):
    from zoo.layers import onednn

    monkeypatch.setattr(onednn, '_CHECKED', {})
    layer, x = nn.Linear(8, 4).eval(), torch.randn(3, 8)
    with torch.inference_mode():
        linear(x, layer, gelu=True)
    assert onednn._CHECKED['linear+gelu', torch.float32] is True


def test_jit_trace_records_the_plain_ops():
    from zoo.layers.mlp import ConvMlp

    mlp = ConvMlp(8, 16).eval()
    x = torch.randn(1, 8, 4, 4).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        traced = torch.jit.trace(mlp, x)
    assert 'mkldnn' not in str(traced.inlined_graph)
    with torch.no_grad():
        _close(traced(x), mlp(x))


@pytest.mark.parametrize('name', ['poolformer_tiny', 'tnt_tiny', 'raftmlp_tiny', 'stripmlp_tiny'])
def test_macs_do_not_depend_on_which_parameters_are_frozen(name):
    """count_macs sees the plain ops whatever requires_grad says (issue 24: a frozen PoolFormer backbone took the
    fused oneDNN MLP, which FlopCounterMode cannot count)."""
    from zoo.eval.profile import count_macs

    import zoo

    model = zoo.create(name, num_classes=5)
    unfrozen = count_macs(model, (3, 32, 32), batch_size=2)
    for p in model.parameters():
        p.requires_grad_(False)
    assert count_macs(model, (3, 32, 32), batch_size=2) == unfrozen
    for n, p in model.named_parameters():
        p.requires_grad_(n.startswith('head'))  # FineTuner(freeze_backbone=True): only the head trains
    assert count_macs(model, (3, 32, 32), batch_size=2) == unfrozen
    assert unfrozen > 0


def test_flop_counter_sees_the_plain_ops_in_inference_mode():
    """FlopCounterMode (a dispatch mode) gets the plain ops even without autograd, where oneDNN would run."""
    from torch.utils.flop_counter import FlopCounterMode

    import zoo

    model = zoo.create('poolformer_tiny', num_classes=5).eval()
    x = torch.randn(2, 3, 32, 32)
    with FlopCounterMode(display=False) as grad_counter:
        model(x)
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        model(x)
    assert counter.get_total_flops() == grad_counter.get_total_flops() > 0


def test_the_self_test_follows_the_dtype(monkeypatch):
    """bfloat16 rounds at 2^-8: two correct kernels differ by ~0.6 % there, which the float32 tolerance (1e-4)
    called a wrong kernel, and the fallback then held for float32 too. Now the tolerance is 4 eps of the dtype
    and the verdict is kept per dtype."""
    from zoo.layers import onednn

    monkeypatch.setattr(onednn, '_CHECKED', {})
    plain = torch.linspace(-1, 1, 64, dtype=torch.bfloat16)
    rounded = plain * (1 + 2 ** -8)                                    # one bfloat16 rounding step off
    assert onednn._close(rounded, plain) and not onednn._close(rounded.float(), plain.float() * 1.01)
    assert not onednn._close(plain * 1.1, plain)                       # a wrong kernel is still caught
    with pytest.warns(RuntimeWarning, match='does not compute'):
        onednn._checked('probe', lambda: plain * 2, lambda: plain, torch.bfloat16)
    assert onednn._checked('probe', lambda: plain.float() * (1 + 1e-6), lambda: plain.float(), torch.float32) is not None
    assert onednn._CHECKED == {('probe', torch.bfloat16): False, ('probe', torch.float32): True}
