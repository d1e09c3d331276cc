"""Canon layer: closed form, causality, parameters, initialisation, decoding (issue 7)."""
from __future__ import annotations

import pytest
import torch

import zoo
from zoo.layers.canon import Canon, ShortConv, parse_canon_set


def closed_form(h, w, residual=True):
    """h + sum_i w_i * h_{t-i}, zero padding before t = 0; w: (m, k) with w[:, -1] the current-token tap."""
    b, t, m = h.shape
    k = w.shape[1]
    out = torch.zeros_like(h)
    for i in range(k):                     # tap i looks back i tokens and uses weight[:, k-1-i]
        shifted = torch.cat([h.new_zeros(b, i, m), h[:, :t - i]], 1) if i else h
        out += w[:, k - 1 - i] * shifted
    return h + out if residual else out


@pytest.mark.parametrize('k', [2, 3, 4, 5, 6])
@pytest.mark.parametrize('residual', [True, False])
def test_closed_form_tap_order_and_zero_padding(k, residual):
    torch.manual_seed(k)
    layer = Canon(8, k, residual=residual)
    h = torch.randn(3, 11, 8)
    w = layer.conv.weight[:, 0, :]                                        # (m, k)
    assert torch.allclose(layer(h), closed_form(h, w, residual), atol=1e-6)
    # first output only sees h_0: tap weight[:, -1] multiplies the current token
    expect0 = h[:, 0] * (1 + w[:, -1]) if residual else h[:, 0] * w[:, -1]
    assert torch.allclose(layer(h)[:, 0], expect0, atol=1e-6)


def test_causality_receptive_field_is_exactly_kernel():
    torch.manual_seed(0)
    layer = Canon(6)
    h = torch.randn(2, 16, 6)
    s = 7
    h2 = h.clone()
    h2[:, s] += 1.0
    y, y2 = layer(h), layer(h2)
    assert torch.equal(y[:, :s], y2[:, :s])                               # bit-identical before s
    changed = (y - y2).abs().amax((0, 2))
    assert (changed[s:s + 4] > 0).all()                                   # s .. s+3 see the change
    assert torch.equal(y[:, s + 4:], y2[:, s + 4:])                       # and nothing after


def test_zero_weights_identity_or_zero_and_param_count():
    layer = Canon(10)
    assert sum(p.numel() for p in layer.parameters()) == 4 * 10
    assert layer.conv.bias is None and layer.conv.groups == 10
    torch.nn.init.zeros_(layer.conv.weight)
    h = torch.randn(2, 5, 10)
    assert torch.equal(layer(h), h)
    layer.residual = False
    assert torch.equal(layer(h), torch.zeros_like(h))


def test_kernel_size_validation():
    for bad in (1, 7, 4.0):
        with pytest.raises(ValueError, match='2..6'):
            Canon(4, bad)
    with pytest.raises(ValueError, match=r'\(B, T, 4\)'):
        Canon(4)(torch.randn(2, 5, 3))


def test_default_init_std_and_survives_model_init():
    torch.manual_seed(0)
    w = Canon(4096).conv.weight
    assert w.abs().max() <= 0.5 and abs(w.std().item() - 0.5 / 3 ** 0.5) < 0.01   # U(-0.5, 0.5): std 0.2887
    model = zoo.create('llama_tiny', canon='ABCD', dim=64, num_heads=4)
    canon_w = torch.cat([m.conv.weight.flatten() for m in model.modules() if isinstance(m, Canon)])
    linear_w = torch.cat([m.weight.flatten() for m in model.modules() if isinstance(m, torch.nn.Linear)])
    assert abs(canon_w.std().item() - 0.2887) < 0.02
    assert abs(linear_w.std().item() - 0.02) < 0.002                      # the global small init ran


@pytest.mark.parametrize('residual,activation', [(True, False), (False, True)])
def test_step_decoding_equals_forward(residual, activation):
    torch.manual_seed(0)
    layer = Canon(5, 4, residual, activation)
    h = torch.randn(2, 9, 5)
    cache = layer.init_cache(2)
    steps = []
    for t in range(9):
        y, cache = layer.step(h[:, t], cache)
        steps.append(y)
    assert cache.shape == (2, 5, 4)
    assert torch.allclose(torch.stack(steps, 1), layer(h), atol=1e-6)


@pytest.mark.parametrize('k', [2, 4, 6])
def test_extend_prefill_then_steps_equals_forward_and_step(k):
    """``extend`` continues a sequence by any number of tokens: prefill 5, a chunk of 3, then single tokens
    (which must match ``step``) give the full forward; its cache is the last k inputs, oldest first."""
    torch.manual_seed(k)
    layer = Canon(5, k, activation=True)
    h = torch.randn(2, 12, 5)
    y0, cache = layer.extend(h[:, :5])
    y1, cache = layer.extend(h[:, 5:8], cache)
    outs = [y0, y1]
    for t in range(8, 12):
        step_y, step_cache = layer.step(h[:, t], cache)
        y, cache = layer.extend(h[:, t:t + 1], cache)
        assert torch.allclose(y[:, 0], step_y, atol=1e-6) and torch.equal(cache, step_cache)
        outs.append(y)
    assert torch.allclose(torch.cat(outs, 1), layer(h), atol=1e-6)
    assert torch.equal(cache, h[:, -k:].transpose(1, 2))
    with pytest.raises(ValueError, match=r'\(B, T, 5\)'):
        layer.extend(h[:, 0])


def test_short_conv_is_silu_without_residual():
    torch.manual_seed(0)
    layer = ShortConv(4)
    h = torch.randn(1, 6, 4)
    assert torch.allclose(layer(h), torch.nn.functional.silu(closed_form(h, layer.conv.weight[:, 0], False)), atol=1e-6)


def test_parse_canon_set():
    assert parse_canon_set('DCBA') == 'ABCD' and parse_canon_set('') == '' and parse_canon_set(None) == ''
    for bad in ('E', 'AA', 'abcd'):
        with pytest.raises(ValueError, match="subset of 'ABCD'"):
            parse_canon_set(bad)
