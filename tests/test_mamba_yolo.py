"""Mamba-YOLO: the cross scan, SS2D against a direction-by-direction re-statement, block shapes and
parameter counts, the T / B / L counts of the shipped configs, outputs, init, ConvBN modes, weighted conv.

Parameter counts (whole models and per layer of T) are those counted on the official implementation's
shipped yamls (HZAI-ZJNU/Mamba-YOLO, nc = 80), recorded in /work/shared/references/mamba_yolo.md."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import zoo
from zoo.layers import mamba as M
from zoo.layers.convbn import ConvBN, set_mode
from zoo.layers.selective_scan import selective_scan_ref
from zoo.layers.weighted_conv import WeightedConv2d


def _count(m):
    return sum(p.numel() for p in m.parameters())


# ------------------------------------------------------------------------------------------- cross scan


def test_cross_scan_directions_and_merge_is_four_x():
    x = torch.randn(2, 3, 4, 5)                                   # non-square on purpose
    xs = M.cross_scan(x)
    assert xs.shape == (2, 4, 3, 20)
    rows = torch.stack([x[:, :, i, j] for i in range(4) for j in range(5)], -1)   # row-major visit
    cols = torch.stack([x[:, :, i, j] for j in range(5) for i in range(4)], -1)   # column-major visit
    assert torch.equal(xs[:, 0], rows) and torch.equal(xs[:, 1], cols)
    assert torch.equal(xs[:, 2], rows.flip(-1)) and torch.equal(xs[:, 3], cols.flip(-1))
    assert torch.equal(M.cross_merge(xs.view(2, 4, 3, 4, 5)), 4 * x.flatten(2))


def test_ss2d_equals_a_direction_by_direction_restatement():
    """Each direction scanned on its own with the reference loop, un-permuted by explicit index lists,
    summed, LayerNorm'd: equals SS2D.scan (float64, both scans)."""
    torch.manual_seed(0)
    m = M.SS2D(4, d_state=3).double()
    with torch.no_grad():
        m.A_logs.normal_()
    b, d, h, w = 2, m.d_inner, 3, 4
    x = torch.randn(b, d, h, w, dtype=torch.float64)
    orders = [[(i, j) for i in range(h) for j in range(w)], [(i, j) for j in range(w) for i in range(h)]]
    orders += [o[::-1] for o in orders]
    total = torch.zeros(b, d, h, w, dtype=torch.float64)
    for k, order in enumerate(orders):
        seq = torch.stack([x[:, :, i, j] for i, j in order], -1)                    # (B, D, L)
        dbl = torch.einsum('bdl,cd->bcl', seq, m.x_proj_weight[k])
        dt, B, C = dbl.split([m.dt_rank, m.d_state, m.d_state], 1)
        dt = torch.einsum('brl,dr->bdl', dt, m.dt_projs_weight[k])
        sl = slice(k * d, (k + 1) * d)
        y = selective_scan_ref(seq, dt, -m.A_logs[sl].exp(), B, C, m.Ds[sl], m.dt_projs_bias[k], True)
        for pos, (i, j) in enumerate(order):
            total[:, :, i, j] += y[:, :, pos]
    expected = m.out_norm(total.permute(0, 2, 3, 1))                                 # (B, H, W, D)
    for method in ('chunked', 'sequential'):
        m.scan_method, m.chunk_size = method, 4
        assert torch.allclose(m.scan(x), expected, atol=1e-10)


# ----------------------------------------------------------------------------------------------- blocks


def test_block_shapes():
    x = torch.randn(2, 16, 8, 6)
    assert M.SS2D(16)(x).shape == x.shape
    assert M.VSSBlock(16, 24)(x).shape == (2, 24, 8, 6)
    assert M.XSSBlock(16, 24, n=2)(x).shape == (2, 24, 8, 6)
    assert isinstance(M.XSSBlock(16, 16).proj, nn.Identity) and not isinstance(M.VSSBlock(16, 16).proj, nn.Identity)
    assert M.LSBlock(16)(x).shape == x.shape
    assert M.RGBlock(16, 64, 8)(x).shape == (2, 8, 8, 6)
    assert M.SimpleStem(3, 16)(torch.randn(2, 3, 32, 24)).shape == (2, 16, 8, 6)
    assert M.VisionClueMerge(16, 32)(x).shape == (2, 32, 4, 3)
    with pytest.raises(ValueError, match='even height and width'):
        M.VisionClueMerge(16, 32)(torch.randn(1, 16, 5, 6))


def test_space_to_depth_order():
    x = torch.arange(16.).view(1, 1, 4, 4)
    y = M.space_to_depth(x)
    assert y[0, :, 0, 0].tolist() == [0., 4., 1., 5.]   # (0,0), (1,0), (0,1), (1,1)


@pytest.mark.parametrize('c', [32, 64, 128, 96])
def test_ss2d_parameter_formula(c):
    r = math.ceil(c / 16)
    expected = 4 * c * c + 20 * c + 4 * (r + 32) * 2 * c + 4 * 2 * c * r + 4 * 2 * c + 4 * 2 * c * 16 \
        + 4 * 2 * c + 4 * c + 2 * c * c
    assert _count(M.SS2D(c)) == expected


def test_block_parameter_counts_of_the_reference():
    assert _count(M.VSSBlock(32, 32)) == 33_692
    assert _count(M.SS2D(32)) == 20_736 and _count(M.LSBlock(32)) == 2_496 and _count(M.RGBlock(32, 128)) == 9_212
    assert M.RGBlock(32, 128).fc2.in_channels == 85                      # int(2 * 4C / 3)
    assert _count(M.XSSBlock(384, 128)) == 388_604
    assert _count(M.SimpleStem(3, 32)) == 5_136 and _count(M.VisionClueMerge(32, 64)) == 8_384


def test_ss2d_init_and_no_weight_decay():
    m = M.SS2D(32)
    assert torch.equal(m.A_logs, torch.zeros(4 * 64, 16)) and torch.equal(m.Ds, torch.ones(256))
    assert m.dt_rank == 2 and m.no_weight_decay() == {'A_logs', 'Ds'}


# ------------------------------------------------------------------------------------------------ models

T_LAYERS = [  # (module path in our model, official layer index, params); stage 3's blocks are 2.1 .. 2.3
    ('backbone.stem', 0, 5_136), ('backbone.stages.0', 1, 33_692), ('backbone.stages.1.0', 2, 8_384),
    ('backbone.stages.1.1', 3, 104_184), ('backbone.stages.2.0', 4, 33_152),
    ('backbone.stages.2.1+2+3', 5, 1_067_892), ('backbone.stages.3.0', 6, 131_840), ('backbone.stages.3.1', 7, 1_301_496),
    ('backbone.sppf', 8, 164_608), ('neck.td4', 11, 388_604), ('neck.td3', 14, 112_312), ('neck.down3', 15, 36_992),
    ('neck.bu4', 17, 364_028), ('neck.down4', 18, 147_712), ('neck.bu5', 20, 1_334_008), ('head', 21, 897_664),
]


def _sub(model, path):
    if '+' not in path:
        return [model.get_submodule(path)]
    stage, _, blocks = path.rpartition('.')
    return [model.get_submodule(f'{stage}.{i}') for i in blocks.split('+')]


def test_mamba_yolo_t_per_layer_counts():
    with torch.device('meta'):
        m = zoo.create('mamba_yolo_t')
    for path, idx, n in T_LAYERS:
        got = sum(_count(s) for s in _sub(m, path))
        assert got == n, f'layer {idx} ({path}): {got:,} != {n:,}'
    assert sum(n for *_, n in T_LAYERS) == _count(m) == 6_131_704


@pytest.mark.parametrize('name,total,ap', [('mamba_yolo_t', 6_131_704, 44.5), ('mamba_yolo_b', 21_828_000, 49.1),
                                           ('mamba_yolo_l', 57_631_024, 52.1)])
def test_shipped_config_counts(name, total, ap):
    with torch.device('meta'):
        m = zoo.create(name)
    assert _count(m) == total                                        # as the official code prints it
    trainable = sum(p.numel() for p in m.parameters() if p.requires_grad)
    assert trainable == total - 16 == zoo.model_info(name).params    # the DFL's 16 weights are fixed
    info = zoo.model_info(name)
    assert info.task == 'detection' and info.tiny == 'mamba_yolo_tiny'
    assert info.coco_ap == zoo.mamba_yolo.PUBLISHED_COCO[name]['ap'] == ap   # the official README's COCO AP


def test_train_and_eval_outputs_non_square():
    torch.manual_seed(0)
    m = zoo.create('mamba_yolo_tiny', num_classes=5).train()
    x = torch.randn(2, 3, 64, 96)
    maps = m(x)
    assert [tuple(t.shape) for t in maps] == [(2, 69, 8, 12), (2, 69, 4, 6), (2, 69, 2, 3)]
    m.eval()
    with torch.no_grad():
        y, maps = m(x)
    assert y.shape == (2, 4 + 5, 8 * 12 + 4 * 6 + 2 * 3)
    assert ((y[:, 4:] >= 0) & (y[:, 4:] <= 1)).all()
    with pytest.raises(ValueError, match='divisible by 32'):
        m(torch.randn(1, 3, 64, 80))


def test_backbone_alone_features_only():
    f = zoo.create('mamba_yolo_tiny', features_only=True).eval()
    assert [(i['num_chs'], i['reduction']) for i in f.feature_info] == [(32, 8), (48, 16), (64, 32)]
    with torch.no_grad():
        feats = f(torch.randn(1, 3, 64, 128))
    assert [tuple(t.shape) for t in feats] == [(1, 32, 8, 16), (1, 48, 4, 8), (1, 64, 2, 4)]
    with pytest.raises(ValueError, match='divisible by 32'):
        f(torch.randn(1, 3, 48, 64))
    with pytest.raises(TypeError, match='unknown argument'):
        zoo.create('mamba_yolo_tiny', features_only=True, num_heads=3)
    with torch.device('meta'):
        t = zoo.create('mamba_yolo_t', features_only=True)
    assert [i['num_chs'] for i in t.feature_info] == [64, 128, 256]


def test_official_init_facts():
    m = zoo.create('mamba_yolo_tiny')
    bns = [mod for mod in m.modules() if isinstance(mod, nn.BatchNorm2d)]
    assert bns and all(bn.eps == 1e-3 and bn.momentum == 0.03 for bn in bns)
    ss = [mod for mod in m.modules() if isinstance(mod, M.SS2D)]
    assert all(torch.equal(s.A_logs, torch.zeros_like(s.A_logs)) and torch.equal(s.Ds, torch.ones_like(s.Ds))
               for s in ss)
    assert {n for n in m.no_weight_decay()} and all(n.endswith(('A_logs', 'Ds')) for n in m.no_weight_decay())


def test_scan_methods_give_the_same_model_output():
    torch.manual_seed(0)
    a = zoo.create('mamba_yolo_tiny', scan_method='sequential').eval()
    b = zoo.create('mamba_yolo_tiny', chunk_size=8).eval()
    b.load_state_dict(a.state_dict())
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert torch.allclose(a(x)[0], b(x)[0], atol=1e-4)


def test_trains_with_the_detection_loss():
    from zoo.detection import DetectionLoss
    torch.manual_seed(0)
    m = zoo.create('mamba_yolo_tiny').train()
    loss_fn = DetectionLoss(m.head)
    x = torch.randn(2, 3, 64, 64)
    targets = [{'boxes': torch.tensor([[8., 8., 40., 40.]]), 'labels': torch.tensor([1])},
               {'boxes': torch.tensor([[20., 10., 60., 30.]]), 'labels': torch.tensor([2])}]
    loss, parts = loss_fn(m(x), targets)
    loss.backward()
    assert torch.isfinite(loss) and set(parts) == {'box', 'cls', 'dfl'}
    missing = [n for n, p in m.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing


# ------------------------------------------------------------------------------------------ composability


def test_convbn_modes_tune_and_deploy_match_eval():
    torch.manual_seed(0)
    m = zoo.create('mamba_yolo_tiny').train()
    with torch.no_grad():
        for _ in range(2):
            m(torch.randn(2, 3, 64, 64))          # non-trivial running statistics
    x = torch.randn(1, 3, 64, 64)
    m.eval()
    with torch.no_grad():
        ref = m(x)[0]
    counts = set_mode(m, 'tune')
    assert counts['blocks'] > 0 and counts['other_bn'] == 0 and counts['traced_pairs'] == 0
    m.train()                                      # tune mode is sticky: running statistics stay in use
    tuned = m(x)
    m.eval()
    with torch.no_grad():
        assert torch.allclose(m(x)[0], ref, atol=1e-4)
    assert all(t.requires_grad for t in tuned)
    set_mode(m, 'deploy')
    assert not any(isinstance(mod, nn.BatchNorm2d) for mod in m.modules())
    with torch.no_grad():
        assert torch.allclose(m(x)[0], ref, atol=1e-4)
    built = zoo.create('mamba_yolo_tiny', convbn_mode='tune')
    assert all(b.mode == 'tune' for b in built.modules() if isinstance(b, ConvBN))


def test_weighted_conv_replaces_the_3x3_convs():
    std = zoo.create('mamba_yolo_tiny')
    w = zoo.create('mamba_yolo_tiny', conv_layer='weighted', den=[0.7])
    weighted = [mod for mod in w.modules() if isinstance(mod, WeightedConv2d)]
    k3 = [mod for mod in std.modules() if isinstance(mod, nn.Conv2d) and mod.kernel_size == (3, 3)]
    assert len(weighted) == len(k3) > 0
    assert all(mod.kernel_size == (1, 1) for mod in w.modules()
               if isinstance(mod, nn.Conv2d) and not isinstance(mod, WeightedConv2d))
    assert _count(w) == _count(std)
    w.train()
    sum(t.float().square().mean() for t in w(torch.randn(1, 3, 64, 64))).backward()


# ----------------------------------------------------------------------------------- SS2D as a mixer


def test_metaformer_tiny_with_ss2d_forward_backward():
    torch.manual_seed(0)
    m = zoo.create('metaformer_tiny', token_mixer='ss2d', num_classes=3).train()
    assert any(isinstance(mod, M.SS2D) for mod in m.modules())
    x = torch.randn(2, *zoo.model_info('metaformer_tiny').input_size)
    out = m(x)
    assert out.shape == (2, 3)
    out.square().mean().backward()
    missing = [n for n, p in m.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing


def test_metaformer_s12_builds_with_ss2d():
    with torch.device('meta'):
        m = zoo.create('metaformer_s12', token_mixer='ss2d')
    assert sum(isinstance(mod, M.SS2D) for mod in m.modules()) == 12
