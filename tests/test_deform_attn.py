"""Pure-PyTorch deformable cross-attention (layers/deform_attn.py).

Compared outside the repository (not in CI, which has no network): with the same random weights, our
``DeformCrossAttention`` (official state dict loaded, all keys matched) gave outputs identical to
OpenGVLab/PIIP's ``MSDeformAttn`` (classification/ops, its CUDA call swapped for the ops' own
``ms_deform_attn_core_pytorch``; dim 192, 16 heads, 4 points, ratio 0.5): max abs difference 0.0 in float32
for 8x8 -> 24x24, 24x24 -> 8x8 and 7x7 -> 12x12 query -> value grids; the initial offset biases are equal.
Here the reference is an independent re-statement: a loop over heads and points with explicit
four-corner bilinear interpolation and zero padding.
"""
from __future__ import annotations

import math

import pytest
import torch

from zoo.layers.deform_attn import DeformCrossAttention, deform_attn_core, reference_points


def bilinear_zero_pad(img: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """img (C, H, W); x, y (N,) in [0, 1] image coordinates (0 = left/top edge). Returns (N, C).

    Cell (i, j) has its centre at ((j + 0.5) / W, (i + 0.5) / H); samples outside the grid read zero."""
    c, h, w = img.shape
    px, py = x * w - 0.5, y * h - 0.5  # pixel coordinates of the cell centres
    x0, y0 = torch.floor(px), torch.floor(py)
    out = torch.zeros(x.shape[0], c, dtype=img.dtype)
    for dx in (0, 1):
        for dy in (0, 1):
            xi, yi = x0 + dx, y0 + dy
            wgt = (1 - (px - xi).abs()) * (1 - (py - yi).abs())
            inside = (xi >= 0) & (xi < w) & (yi >= 0) & (yi < h)
            xi_c, yi_c = xi.clamp(0, w - 1).long(), yi.clamp(0, h - 1).long()
            vals = img[:, yi_c, xi_c].T  # (N, C)
            out += torch.where(inside[:, None], vals * wgt[:, None], torch.zeros_like(vals))
    return out


def loop_reference(attn: DeformCrossAttention, query, qgrid, value, vgrid):
    """Deformable attention written point by point, from the module's weights."""
    b, nq, _ = query.shape
    m, p = attn.num_heads, attn.num_points
    off = attn.sampling_offsets(query).view(b, nq, m, p, 2)
    logits = attn.attention_weights(query).view(b, nq, m, p)
    v = attn.value_proj(value)  # (B, Nv, Dv)
    dh = v.shape[-1] // m
    hq, wq = qgrid
    hv, wv = vgrid
    out = torch.zeros(b, nq, m * dh, dtype=query.dtype)
    for bi in range(b):
        for h in range(m):
            img = v[bi, :, h * dh:(h + 1) * dh].T.reshape(dh, hv, wv)
            w = torch.softmax(logits[bi, :, h], -1)  # (Nq, P)
            for q in range(nq):
                i, j = divmod(q, wq)
                rx, ry = (j + 0.5) / wq, (i + 0.5) / hq
                for pt in range(p):
                    x = rx + off[bi, q, h, pt, 0] / wv
                    y = ry + off[bi, q, h, pt, 1] / hv
                    s = bilinear_zero_pad(img, x.reshape(1), y.reshape(1))[0]
                    out[bi, q, h * dh:(h + 1) * dh] += w[q, pt] * s
    return attn.output_proj(out)


def _randomised(dim=32, dim_feat=24, heads=4, points=3, ratio=0.5, seed=0) -> DeformCrossAttention:
    torch.manual_seed(seed)
    attn = DeformCrossAttention(dim, dim_feat, num_heads=heads, num_points=points, ratio=ratio).double()
    with torch.no_grad():  # offsets of a few pixels (some land outside the grid), non-uniform weights
        attn.sampling_offsets.weight.normal_(0, 0.5)
        attn.sampling_offsets.bias.normal_(0, 1.5)
        attn.attention_weights.weight.normal_(0, 0.3)
        attn.attention_weights.bias.normal_(0, 0.3)
    return attn


@pytest.mark.parametrize('qgrid,vgrid', [((3, 4), (6, 8)), ((6, 5), (2, 3)), ((4, 4), (4, 4))])
def test_matches_loop_over_points(qgrid, vgrid):
    attn = _randomised()
    g = torch.Generator().manual_seed(1)
    query = torch.randn(2, qgrid[0] * qgrid[1], 32, generator=g, dtype=torch.float64)
    value = torch.randn(2, vgrid[0] * vgrid[1], 24, generator=g, dtype=torch.float64)
    ours = attn(query, qgrid, value, vgrid)
    ref = loop_reference(attn, query, qgrid, value, vgrid)
    assert ours.shape == (2, qgrid[0] * qgrid[1], 32)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-10)


def test_gradients_match_loop_over_points():
    attn = _randomised(seed=3)
    g = torch.Generator().manual_seed(2)
    query = torch.randn(1, 6, 32, generator=g, dtype=torch.float64, requires_grad=True)
    value = torch.randn(1, 12, 24, generator=g, dtype=torch.float64, requires_grad=True)
    gq, gv = torch.autograd.grad(attn(query, (2, 3), value, (3, 4)).square().sum(), (query, value))
    rq, rv = torch.autograd.grad(loop_reference(attn, query, (2, 3), value, (3, 4)).square().sum(), (query, value))
    torch.testing.assert_close(gq, rq)
    torch.testing.assert_close(gv, rv)


def test_identity_gather_with_zero_offsets_on_equal_grids():
    """Zero offsets and query grid == value grid: every point samples its own cell centre exactly."""
    g = torch.Generator().manual_seed(0)
    b, m, p, dh, grid = 2, 4, 3, 5, (5, 7)
    n = grid[0] * grid[1]
    value = torch.randn(b, n, m, dh, generator=g)
    loc = reference_points(grid)[None, :, None, None, :].expand(b, n, m, p, 2)
    weights = torch.softmax(torch.randn(b, n, m, p, generator=g), -1)
    out = deform_attn_core(value, grid, loc, weights)
    torch.testing.assert_close(out, value.reshape(b, n, m * dh), rtol=1e-6, atol=1e-6)


def test_official_initialisation():
    attn = DeformCrossAttention(192, num_heads=16, num_points=4, ratio=0.5)
    assert attn.value_proj.out_features == 96 and attn.output_proj.in_features == 96
    assert torch.count_nonzero(attn.sampling_offsets.weight) == 0
    assert torch.count_nonzero(attn.attention_weights.weight) == 0
    assert torch.count_nonzero(attn.attention_weights.bias) == 0
    bias = attn.sampling_offsets.bias.view(16, 4, 2)
    for h in range(16):
        theta = 2 * math.pi * h / 16
        d = torch.tensor([math.cos(theta), math.sin(theta)])
        d = d / d.abs().max()
        for pt in range(4):
            torch.testing.assert_close(bias[h, pt], d * (pt + 1))
    # every head's largest offset component is exactly the point index + 1 (on the square of that radius)
    torch.testing.assert_close(bias.abs().amax(-1), torch.arange(1., 5.).expand(16, 4))


def test_rejects_bad_shapes():
    with pytest.raises(ValueError, match='must divide'):
        DeformCrossAttention(40, num_heads=16, ratio=0.5)
    attn = DeformCrossAttention(32, num_heads=4)
    with pytest.raises(ValueError, match='query_grid'):
        attn(torch.randn(1, 5, 32), (2, 3), torch.randn(1, 4, 32), (2, 2))
    with pytest.raises(ValueError, match='value_grid'):
        attn(torch.randn(1, 6, 32), (2, 3), torch.randn(1, 5, 32), (2, 2))


def test_compiled_sampling_is_one_grid_sample_operator_with_eager_values_and_gradients():
    """Under torch.compile the sampling is ``torch.ops.zoo.grid_sample`` (inductor's own grid_sample, fused with
    the softmax and the weighted sum, made PIIP-TSB slower compiled than eager); outputs and gradients equal eager,
    and the operator passes torch.library.opcheck (fake shapes, autograd registration, schema)."""
    from torch._inductor.utils import run_and_get_code
    from zoo.layers.deform_attn import _grid_sample_op

    g = torch.Generator().manual_seed(0)
    value, grid = torch.randn(3, 4, 5, 6, generator=g), torch.rand(3, 7, 2, 2, generator=g) * 2.4 - 1.2
    torch.library.opcheck(_grid_sample_op, (value.requires_grad_(), grid.requires_grad_()))

    attn = DeformCrossAttention(32, num_heads=4, num_points=3)
    torch.nn.init.normal_(attn.sampling_offsets.weight, std=0.5)  # off the init's lattice: real interpolation
    query = torch.randn(2, 12, 32, generator=g, requires_grad=True)
    val = torch.randn(2, 20, 32, generator=g, requires_grad=True)

    def run(f):
        out = f(query, val)
        return (out, *torch.autograd.grad(out.square().sum(), (query, val)))

    def fn(q, v):
        return attn(q, (3, 4), v, (4, 5))

    compiled = torch.compile(fn, backend='inductor', fullgraph=True)
    for a, b in zip(run(compiled), run(fn)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    _, codes = run_and_get_code(compiled, query, val)
    assert any('torch.ops.zoo.grid_sample' in code for code in codes)


def test_compiled_sampling_under_bfloat16_autocast_matches_eager_autocast():
    """bfloat16 autocast (``zoo bench --dtype bfloat16``): the sampling operator runs in float32 as eager's
    grid_sample does (its autocast rule), so compiled and eager agree to bfloat16 rounding."""
    g = torch.Generator().manual_seed(1)
    attn = DeformCrossAttention(32, num_heads=4, num_points=3).eval()
    torch.nn.init.normal_(attn.sampling_offsets.weight, std=0.5)
    query, val = torch.randn(2, 12, 32, generator=g), torch.randn(2, 20, 32, generator=g)

    def fn(q, v):
        with torch.autocast('cpu', dtype=torch.bfloat16):
            return attn(q, (3, 4), v, (4, 5))

    with torch.no_grad():
        eager, compiled = fn(query, val), torch.compile(fn, backend='inductor', fullgraph=True)(query, val)
    assert torch.isfinite(compiled).all()
    torch.testing.assert_close(compiled.float(), eager.float(), rtol=2e-2, atol=2e-2)
