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
        y = m.head.decode(m.forward_raw(x))  # dense boxes and scores before NMS
        dets = m(x)                          # eval mode: detections per image
    assert y.shape == (2, 4 + 5, 8 * 12 + 4 * 6 + 2 * 3) and len(dets) == 2
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
        assert torch.allclose(a.forward_raw(x)[0], b.forward_raw(x)[0], atol=1e-4)


def test_trains_with_the_detection_loss():
    torch.manual_seed(0)
    m = zoo.create('mamba_yolo_tiny').train()
    loss_fn = m.head.loss
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
        ref = m.forward_raw(x)[0]
    counts = set_mode(m, 'tune')
    assert counts['blocks'] > 0 and counts['other_bn'] == 0 and counts['traced_pairs'] == 0
    m.train()                                      # tune mode is sticky: running statistics stay in use
    tuned = m(x)
    m.eval()
    with torch.no_grad():
        assert torch.allclose(m.forward_raw(x)[0], ref, atol=1e-4)
    assert all(t.requires_grad for t in tuned)
    set_mode(m, 'deploy')
    assert not any(isinstance(mod, nn.BatchNorm2d) for mod in m.modules())
    with torch.no_grad():
        assert torch.allclose(m.forward_raw(x)[0], ref, atol=1e-4)
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


# ----------------------------------------------------------------------------------- official checkpoints
# tests/reference_mamba_yolo.py re-states the official detector with its module names, so its state dict is in
# the official layout. On the development machine it equals the real official ``DetectionModel``
# (HZAI-ZJNU/Mamba-YOLO, the ultralytics fork, its CUDA scan answered by the official ``selective_scan_ref``):
# same keys in the same order and shapes for T / B / L, outputs to float rounding (see docs/fidelity.md).

def _reference(cfg=None, tiny=False, seed=0):
    from test_fidelity import randomize
    from reference_mamba_yolo import CONFIGS, DetectionModel
    widths, depths, n = CONFIGS[cfg] if cfg else ((16, 32, 48, 64), (1, 1, 1, 1), 1)
    return randomize(DetectionModel(widths, depths, n, nc=3 if tiny else 80), seed)


def _outputs(model, x):
    """Eval outputs with boxes as the official head gives them (xywh), and the raw maps."""
    from torchvision.ops import box_convert
    with torch.no_grad():
        if hasattr(model, 'sources'):  # the official re-statement: (y, maps) in eval mode
            y, maps = model(x)
        else:  # ours: the head's dense decode of the raw maps, boxes xyxy
            maps = model.forward_raw(x)
            y = model.head.decode(maps)
    if not hasattr(model, 'sources'):  # ours: xyxy
        y = torch.cat([box_convert(y[:, :4].transpose(1, 2), 'xyxy', 'cxcywh').transpose(1, 2), y[:, 4:]], 1)
    return y, maps


def _assert_same_outputs(ours, ref, x):
    from test_fidelity import assert_close
    (y, maps), (y_ref, maps_ref) = _outputs(ours.eval(), x), _outputs(ref.eval(), x)
    assert_close(y, y_ref)
    for a, b in zip(maps, maps_ref):
        assert_close(a, b)


@pytest.mark.parametrize('name', ['mamba_yolo_t', 'mamba_yolo_b', 'mamba_yolo_l'])
def test_official_layout_maps_onto_ours_key_for_key(name):
    """T / B / L on the meta device: the official keys (re-statement, = the real official layout, checked outside
    CI) remap onto ours with every key and shape matched, and ``to_official`` gives them back."""
    from reference_mamba_yolo import CONFIGS, DetectionModel
    with torch.device('meta'):
        ours = zoo.create(name)
        official = DetectionModel(*CONFIGS[name[-1]]).state_dict()
    own = ours.state_dict()
    mapped = ours.remap_checkpoint(official)
    assert set(mapped) == set(own) and all(mapped[k].shape == own[k].shape for k in own)
    assert set(ours.to_official()) == set(official)
    assert ours.remap_checkpoint({k[len('model.'):]: v for k, v in official.items()}).keys() == mapped.keys()


def test_official_state_dict_of_mamba_yolo_t_reproduces_the_official_detector(tmp_path):
    """A full-size official T state dict (``DetectionModel.state_dict()``, random weights, BN statistics too)
    through ``zoo.create('mamba_yolo_t', checkpoint=...)``, no other argument: the eval outputs (boxes converted
    to xywh) and raw maps equal the re-statement's.

    Outside CI, the real official ``DetectionModel`` of T / B / L (its scan answered by the official
    ``selective_scan_ref``), random weights, through ``zoo.create(name, checkpoint=...)`` from its state dict and
    from the released-format .pt its own code wrote (trainer checkpoint + ``strip_optimizer``), 64x64 and 64x96,
    batch 2: boxes and scores max |diff| <= 7.6e-6 of |y| <= 92 (<= 8.3e-8 relative), raw maps <= 9.5e-7 of ~2
    (<= 4.9e-7 relative), train-mode maps <= 7.2e-7. This re-statement against the same official models: the
    same keys, in the same order, and shapes for T / B / L; y <= 7.6e-6, maps <= 8.3e-7."""
    ref = _reference('t', seed=1)
    torch.save(ref.state_dict(), tmp_path / 'official.pth')
    ours = zoo.create('mamba_yolo_t', checkpoint=tmp_path / 'official.pth')
    _assert_same_outputs(ours, ref, torch.rand(1, 3, 64, 64))


@pytest.mark.parametrize('depths,n', [((1, 1, 1, 1), 1), ((2, 1, 3, 2), 2)])
def test_official_state_dict_reproduces_the_official_detector_at_tiny_size(tmp_path, depths, n):
    """Both layouts of a stage (one VSSBlock: ``model.<i>.``; several: ``model.<i>.<j>.``, as L) and of the
    neck (one or two SS2D per XSSBlock), at CPU size; train-mode maps too."""
    from reference_mamba_yolo import DetectionModel
    from test_fidelity import randomize
    ref = randomize(DetectionModel((16, 32, 48, 64), depths, n, nc=3), seed=2)
    torch.save(ref.state_dict(), tmp_path / 'official.pth')
    ours = zoo.create('mamba_yolo_tiny', depths=depths, neck_depth=n, checkpoint=tmp_path / 'official.pth')
    x = torch.rand(2, 3, 64, 64)
    _assert_same_outputs(ours, ref, x)
    ours.train(), ref.train()
    for m in [*ours.modules(), *ref.modules()]:
        if isinstance(m, nn.BatchNorm2d):
            m.eval()  # the same function in both: running statistics
    with torch.no_grad():
        for a, b in zip(ours(x), ref(x)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_the_backbone_alone_loads_an_official_checkpoint(tmp_path):
    ref = _reference(tiny=True, seed=3)
    torch.save(ref.state_dict(), tmp_path / 'official.pth')
    full = zoo.create('mamba_yolo_tiny', checkpoint=tmp_path / 'official.pth').eval()
    backbone = zoo.create('mamba_yolo_tiny', features_only=True, checkpoint=tmp_path / 'official.pth').eval()
    torch.save(full.state_dict(), tmp_path / 'zoo.pth')  # and from a zoo detector's checkpoint
    again = zoo.create('mamba_yolo_tiny', features_only=True, checkpoint=tmp_path / 'zoo.pth').eval()
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        for a, b, c in zip(backbone(x), full.backbone(x), again(x)):
            assert torch.equal(a, b) and torch.equal(a, c)


# -- the released .pt: a pickled ultralytics model, read without ultralytics -----------------------------------

_ULTRALYTICS = {  # where ultralytics keeps the classes of a pickled Mamba-YOLO (the fork's module paths)
    'DetectionModel': 'ultralytics.nn.tasks', 'Conv': 'ultralytics.nn.modules.conv',
    'Concat': 'ultralytics.nn.modules.conv', 'SPPF': 'ultralytics.nn.modules.block', 'DFL': 'ultralytics.nn.modules.block',
    'Detect': 'ultralytics.nn.modules.head', 'LayerNorm2d': 'ultralytics.nn.modules.common_utils_mbyolo',
    **{c: 'ultralytics.nn.modules.mamba_yolo' for c in ('SS2D', 'RGBlock', 'LSBlock', 'XSSBlock', 'VSSBlock',
                                                        'SimpleStem', 'VisionClueMerge')}}


class IterableSimpleNamespace:  # ultralytics keeps its settings on the model (``model.args``) as one of these
    def __init__(self, **kw):
        self.__dict__.update(kw)


def _save_as_ultralytics(path, ckpt: dict) -> None:
    """``torch.save`` with the re-statement's classes posing as ultralytics' (module paths as in a real file),
    importable only while saving: the reader must do without them."""
    import sys
    import types
    import reference_mamba_yolo as ref
    classes = {name: getattr(ref, name) for name in _ULTRALYTICS} | {'IterableSimpleNamespace': IterableSimpleNamespace}
    where = _ULTRALYTICS | {'IterableSimpleNamespace': 'ultralytics.utils'}
    saved = {name: (cls.__module__, cls.__qualname__) for name, cls in classes.items()}
    fake = {}
    try:
        for name, cls in classes.items():
            module = fake.setdefault(where[name], types.ModuleType(where[name]))
            setattr(module, name, cls)
            cls.__module__ = where[name]
        for where_to in list(fake):  # and the packages above them, for pickle's import of each class's module
            parts = where_to.split('.')
            for i in range(1, len(parts)):
                fake.setdefault('.'.join(parts[:i]), types.ModuleType('.'.join(parts[:i])))
        sys.modules.update(fake)
        torch.save(ckpt, path)
    finally:
        for name, cls in classes.items():
            cls.__module__, cls.__qualname__ = saved[name]
        for m in fake:
            sys.modules.pop(m, None)


@pytest.mark.parametrize('layout', ['released', 'last'])
def test_released_pt_file_loads_without_ultralytics(tmp_path, layout):
    """The released format: ``torch.save`` of a dict holding the whole pickled ``DetectionModel`` in fp16 under
    ``'model'`` (``strip_optimizer``'s best.pt) or under ``'ema'`` with ``'model': None`` (a trainer's last.pt),
    with the settings namespace, train args and metadata beside it. ``zoo.create(name, checkpoint=file)`` reads
    it with no ultralytics module importable and reproduces the model (fp16 weights). Outside CI the same on
    files the official code wrote (``save_model`` + ``strip_optimizer`` of the fork): T / B / L, see
    docs/fidelity.md."""
    import sys
    ref = _reference(tiny=True, seed=4)
    ref.args = IterableSimpleNamespace(imgsz=640, box=7.5)
    model = ref.half()
    ckpt = dict(epoch=-1, best_fitness=None, model=model, ema=None, updates=None, optimizer=None,
                train_args={'imgsz': 640, 'data': 'coco.yaml'}, date='2024-06-01T00:00:00', version='8.2.29')
    if layout == 'last':
        ckpt.update(model=None, ema=model, optimizer={'state': {}, 'param_groups': [{'lr': 0.01, 'params': [0]}]})
    _save_as_ultralytics(tmp_path / 'best.pt', ckpt)
    assert not any(m.startswith('ultralytics') for m in sys.modules)
    with pytest.raises(Exception):
        torch.load(tmp_path / 'best.pt', weights_only=True)  # what the reader has to do without
    ours = zoo.create('mamba_yolo_tiny', checkpoint=tmp_path / 'best.pt')
    assert not any(m.startswith('ultralytics') for m in sys.modules)
    _assert_same_outputs(ours, ref.float(), torch.rand(1, 3, 64, 64))


def test_pickled_objects_are_read_as_data_never_run(tmp_path):
    """Whatever a file asks the unpickler to call (here ``os.makedirs``, through ``__reduce__``) becomes an inert
    stand-in: nothing from the file runs. The same file through plain pickle does run it (the test can fail)."""
    import io
    import os
    import pickle
    import zipfile
    target = tmp_path / 'made_by_the_file'

    class Payload:
        def __reduce__(self):
            return os.makedirs, (str(target),)

    torch.save({'note': Payload(), 'model': {'w': torch.ones(2)}}, tmp_path / 'ckpt.pth')
    sd = zoo.read_state_dict(tmp_path / 'ckpt.pth')
    assert not target.exists() and list(sd) == ['w'] and torch.equal(sd['w'], torch.ones(2))
    from zoo._factory import PickledObject, read_pickled_objects
    note = read_pickled_objects(tmp_path / 'ckpt.pth')['note']
    assert isinstance(note, PickledObject) and note.pickled_args == (str(target),) and not target.exists()
    with zipfile.ZipFile(tmp_path / 'ckpt.pth') as z:
        data = z.read(next(n for n in z.namelist() if n.endswith('data.pkl')))

    class Plain(pickle.Unpickler):
        def persistent_load(self, pid):
            return None
    with pytest.raises(AttributeError):  # the tensors cannot be rebuilt without storages, but the payload ran
        Plain(io.BytesIO(data)).load()
    assert target.exists()


def test_pickled_file_without_weights_is_refused(tmp_path):
    torch.save({'args': IterableSimpleNamespace(lr=0.1)}, tmp_path / 'args.pt')
    with pytest.raises(ValueError, match='does not hold a state dict of tensors'):
        zoo.create('mamba_yolo_tiny', checkpoint=tmp_path / 'args.pt')
