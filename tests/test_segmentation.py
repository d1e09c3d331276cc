"""Semantic segmentation (issue 28): Semantic FPN and UperNet heads on several backbones, their loss and
prediction, whole and sliding-window inference, the mIoU metric against a hand computation, the official models'
parameter counts, the poly schedule and ONNX export."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import zoo
from zoo.layers.segment import FPN, SegHead, SemFPNHead, UperNetHead


# ------------------------------------------------------------------------------------------------ shapes
@pytest.mark.parametrize('name, backbone, size', [
    ('semfpn_seg', 'poolformer_tiny', (64, 96)),
    ('semfpn_seg', 'resnet_tiny', (32, 48)),           # CIFAR stem: strides 1/2/4/8, logits at full resolution
    ('upernet_seg', 'piip_tiny', (64, 128)),          # PIIP's branch images must stay multiples of 16
    ('upernet_seg', 'mamba_yolo_tiny', (64, 96)),     # three levels (8/16/32): logits at 1/8
])
def test_heads_give_logits_at_the_finest_level_and_labels_at_the_input(name, backbone, size):
    torch.manual_seed(0)
    kw = dict(channels=16, aux_channels=8) if name == 'upernet_seg' else dict(neck_channels=16, channels=16)
    model = zoo.create(name, backbone=backbone, num_classes=5, **kw)
    x = torch.randn(2, 3, *size)
    raw = model.train().forward_raw(x)
    s0 = model.strides[0]
    assert raw[0].shape == (2, 5, size[0] // s0, size[1] // s0)
    if name == 'upernet_seg':  # the auxiliary FCN head on level 2, in training only
        assert len(raw) == 2 and raw[1].shape == (2, 5, size[0] // model.strides[2], size[1] // model.strides[2])
    model.eval()
    with torch.no_grad():
        labels = model(x)
        assert labels.shape == (2, *size) and labels.dtype == torch.long and int(labels.max()) < 5
        assert len(model.forward_raw(x)) == 1  # no auxiliary head at evaluation
        files = model(x, [{'orig_size': (37, 53)}, {'orig_size': (size[0] * 2, size[1] * 2)}])
    assert files[0]['mask'].shape == (37, 53) and files[1]['mask'].shape == (size[0] * 2, size[1] * 2)


def test_whole_image_inference_pads_to_the_stride_and_slide_with_one_window_equals_it():
    torch.manual_seed(0)
    model = zoo.create('semfpn_seg_tiny').eval()
    x = torch.randn(1, 3, 50, 70)  # not a multiple of 32: padded, then the logits are cut back
    with torch.no_grad():
        whole = model.logits(x)
        assert whole.shape == (1, 3, 50, 70)
        model.crop_size, model.stride = (64, 96), (32, 32)  # one window covers the image
        assert torch.allclose(model.logits(x, 'slide'), whole, atol=1e-6)
        model.crop_size, model.stride = (32, 32), (16, 24)  # overlapping windows: averaged where they overlap
        slide = model.logits(x, 'slide')
    assert slide.shape == whole.shape and torch.isfinite(slide).all() and not torch.allclose(slide, whole)


def test_decode_cuts_padding_and_resizes_to_the_file():
    logits = torch.zeros(1, 2, 8, 8)
    logits[0, 1, :6, :4] = 1.0  # class 1 on the left half of the content (6 x 8 of the file x 2), padding below
    [out] = SegHead.decode(logits, [{'orig_size': (3, 4), 'scale': (2.0, 2.0), 'pad': (0, 0)}])
    assert out['mask'].shape == (3, 4)
    assert out['mask'][:, :2].eq(1).all() and out['mask'][:, 2:].eq(0).all()


# ---------------------------------------------------------------------------------------------------- loss
def test_loss_ignores_255_and_weighs_the_auxiliary_head():
    torch.manual_seed(0)
    head = UperNetHead((8, 8, 16, 16), 3, (4, 8, 16, 32), channels=8, aux_channels=8).train()
    maps = [torch.randn(2, c, 32 // s * 4, 32 // s * 4) for c, s in zip((8, 8, 16, 16), (4, 8, 16, 32))]
    out = head(maps)
    masks = torch.randint(0, 3, (2, 32, 32))
    masks[:, :10] = 255
    total, parts = head.loss(out, masks)
    up = F.interpolate(out[0], size=(32, 32), mode='bilinear', align_corners=False)
    keep = masks != 255
    by_hand = F.cross_entropy(up.permute(0, 2, 3, 1)[keep], masks[keep])  # only the labelled pixels
    assert torch.allclose(parts['ce'], by_hand, atol=1e-6)
    assert torch.allclose(total, parts['ce'] + 0.4 * parts['aux'], atol=1e-6)
    # ignored pixels carry no gradient to the logits
    logits = torch.randn(2, 3, 32, 32, requires_grad=True)
    SemFPNHead((8,), 3, (4,), channels=8).loss([logits], masks)[0].backward()
    assert logits.grad[:, :, :10].abs().max() == 0 and logits.grad[:, :, 10:].abs().max() > 0
    # an image without a labelled pixel: zero loss, still differentiable; a class out of range: a clear error
    empty = SemFPNHead((8,), 3, (4,), channels=8).loss([logits], torch.full((2, 32, 32), 255))[0]
    assert empty.item() == 0 and empty.requires_grad
    with pytest.raises(ValueError, match='class 7 >= num_classes=3'):
        head.loss(out, torch.full((2, 32, 32), 7))



def test_class_weight_is_the_weighted_mean_over_labelled_pixels():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 16, 16)
    masks = torch.randint(0, 3, (2, 16, 16))
    masks[:, :4] = 255
    w = (0.2, 1.0, 3.0)
    loss = SemFPNHead((8,), 3, (1,), channels=8, class_weight=w).loss([logits], masks)[0]
    keep = masks != 255
    per_pixel = F.cross_entropy(logits.permute(0, 2, 3, 1)[keep], masks[keep], reduction='none')
    weights = torch.tensor(w)[masks[keep]]
    assert torch.allclose(loss, (weights * per_pixel).sum() / weights.sum(), atol=1e-6)
    assert not torch.allclose(loss, SemFPNHead((8,), 3, (1,), channels=8).loss([logits], masks)[0])
    with pytest.raises(ValueError, match='one weight >= 0 per class'):
        SemFPNHead((8,), 3, (1,), channels=8, class_weight=(1.0, 2.0))

# -------------------------------------------------------------------------------------------------- metric
def test_miou_sums_over_the_split_ignores_255_and_skips_absent_classes():
    from zoo.recipes.segmentation import SegmentationMetric
    # 4 classes; class 3 never appears (neither truth nor prediction); class 2 is predicted but never true.
    t1 = torch.tensor([[0, 0, 1, 1], [0, 255, 1, 1]])
    p1 = torch.tensor([[0, 1, 1, 1], [2, 0, 1, 0]])  # the 255 pixel's prediction (0) must not count
    t2 = torch.tensor([[1, 1, 1, 1]])
    p2 = torch.tensor([[1, 1, 0, 2]])
    metric = SegmentationMetric(4)
    metric.update(p1, t1)
    metric.update(p2, t2)
    out = metric.compute()
    # by hand over the split's 11 labelled pixels:
    # class 0: truth at 3 pixels, predicted right at 1; predicted 0 at 3 pixels  -> I 1, U 3 + 3 - 1 = 5
    # class 1: truth at 8 pixels, right at 5 (3 in image 1, 2 in image 2); predicted 1 at 6 -> I 5, U 8 + 6 - 5 = 9
    # class 2: truth nowhere, predicted at 2 pixels -> I 0, U 2 (counts as 0); accuracy undefined
    # class 3: nowhere -> no IoU, no accuracy
    iou = [1 / 5, 5 / 9, 0.0]
    assert torch.allclose(out['iou'][:3], torch.tensor(iou, dtype=torch.float64))
    assert math.isnan(out['iou'][3]) and math.isnan(out['acc'][2]) and math.isnan(out['acc'][3])
    assert out['miou'].item() == pytest.approx(sum(iou) / 3)
    assert out['macc'].item() == pytest.approx((1 / 3 + 5 / 8) / 2)
    assert out['aacc'].item() == pytest.approx(6 / 11)
    # per image then averaged (what torchmetrics' MeanIoU does) would differ: image 2 alone has class-1 IoU 1/2
    per_image_1 = [1 / 4, 3 / 5, 0.0]  # image 1: class 0 I 1 U 4; class 1 I 3 U 5; class 2 I 0 U 1
    assert out['miou'].item() != pytest.approx((sum(per_image_1) / 3 + (2 / 4 + 0 + 0) / 3) / 2)


# ------------------------------------------------------------------------------------ full-size counts
def _conv_bn(cin: int, cout: int, k: int) -> int:
    """mmseg's ConvModule with BN: a conv without bias and BatchNorm's weight and bias."""
    return cin * cout * k * k + 2 * cout


def test_official_semfpn_poolformer_s12_parameter_count_and_cpu_forward_at_512():
    """The official segmentation model of sail-sg/poolformer (configs/sem_fpn/PoolFormer/fpn_poolformer_s12_ade20k_
    40k.py on mmseg v0.19's fpn_r50 base), counted module by module from mmseg's definitions (mmseg cannot run
    here): backbone = PoolFormer-S12 without its head and final norm (11,915,176 - 1000 x 512 - 1000 - 2 x 512)
    plus the fork_feat norm on each output (2 x (64 + 128 + 320 + 512)); FPN neck (``out_channels=256``,
    ``norm_cfg=None``: convs with bias) = four 1x1 laterals and four 3x3 outputs; FPNHead (``channels=128``, BN)
    = log2(stride / 4) 3x3 ConvModules per level (at least one) + the 1x1 classifier to 150 classes."""
    dims = (64, 128, 320, 512)
    backbone = 11_915_176 - (512 * 1000 + 1000) - 2 * 512 + 2 * sum(dims)
    neck = sum(c * 256 + 256 for c in dims) + 4 * (256 * 256 * 9 + 256)
    head = sum(_conv_bn(256, 128, 3) + (n - 1) * _conv_bn(128, 128, 3) for n in (1, 1, 2, 3)) + 128 * 150 + 150
    with torch.device('meta'):
        model = zoo.create('semfpn_poolformer_s12')
    count = lambda m: sum(p.numel() for p in m.parameters())
    assert (count(model.backbone), count(model.neck), count(model.head)) == (backbone, neck, head)
    assert count(model) == backbone + neck + head == zoo.model_info('semfpn_poolformer_s12').params == 15_669_846
    assert zoo.model_info('semfpn_poolformer_s12').ade20k_miou == 37.2
    torch.manual_seed(0)
    model = zoo.create('semfpn_poolformer_s12').eval()  # the full-size model runs on the CPU at 512 px
    with torch.no_grad():
        raw = model.forward_raw(torch.randn(1, 3, 512, 512))
        assert raw[0].shape == (1, 150, 128, 128) and torch.isfinite(raw[0]).all()
        assert model.head.predict(raw).shape == (1, 512, 512)


def test_upernet_piip_tsb_parameter_count_and_forward_shape_at_512():
    """PIIP-TSB's dense backbone (zoo's piip_tsb features_only: 175,043,715, the official detection backbone's count,
    tests/test_piip.py) + mmseg v0.27's UPerHead and FCNHead as PIIP's ADE20K configs set them on the upernet_r50
    base (in_channels 4 x 768, channels 512, pool scales 1/2/3/6; auxiliary on level 2, 256 channels, one conv; 150
    classes), counted from mmseg's module definitions. PIIP releases no TSB segmentation config, so this is the
    count of that composition, not of a released checkpoint."""
    d, c, k = 768, 512, 150
    uper = (4 * _conv_bn(d, c, 1) + _conv_bn(d + 4 * c, c, 3) + 3 * _conv_bn(d, c, 1) + 3 * _conv_bn(c, c, 3)
            + _conv_bn(4 * c, c, 3) + c * k + k)
    fcn = _conv_bn(d, 256, 3) + 256 * k + k
    with torch.device('meta'):
        model = zoo.create('upernet_piip_tsb')
        out = model.train().forward_raw(torch.empty(2, 3, 512, 512))  # BatchNorm trains on more than one value
    count = lambda m: sum(p.numel() for p in m.parameters())
    assert count(model.backbone) == 175_043_715 and count(model.head) == uper + fcn
    assert count(model) == zoo.model_info('upernet_piip_tsb').params
    assert out[0].shape == (2, 150, 128, 128) and out[1].shape == (2, 150, 32, 32)


# ------------------------------------------------------------------------------------------ schedule, neck
def test_warmup_poly_follows_mmseg():
    from zoo.recipes.optim import WarmupPoly
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    sched = WarmupPoly(opt, power=1.0, warmup_steps=10, warmup_ratio=1e-6)
    sched.total = 100
    assert sched.factor(0) == pytest.approx(1e-6) and sched.factor(50) == pytest.approx(0.5)
    assert sched.factor(5) == pytest.approx(0.95 * (1 - 0.5 * (1 - 1e-6)))
    assert sched.factor(100) == 0 and sched.factor(150) == 0


def test_fpn_neck_is_top_down_nearest():
    torch.manual_seed(0)
    fpn = FPN((4, 4), out_channels=4)
    a, b = torch.randn(1, 4, 8, 8), torch.randn(1, 4, 4, 4)
    lat_b = fpn.lateral_convs[1](b)
    expected = fpn.fpn_convs[0](fpn.lateral_convs[0](a) + lat_b.repeat_interleave(2, 2).repeat_interleave(2, 3))
    assert torch.allclose(fpn([a, b])[0], expected, atol=1e-6)


# ---------------------------------------------------------------------------------------------------- export
def test_segmenter_exports_to_onnx_and_runs_in_onnxruntime(tmp_path):
    pytest.importorskip('onnx')
    ort = pytest.importorskip('onnxruntime')
    torch.manual_seed(0)
    for mode, size in (('whole', (64, 64)), ('slide', (64, 96))):  # slide: two 64 x 64 windows, stride 32
        model = zoo.create('semfpn_seg_tiny', test_mode=mode, crop_size=64, stride=32).eval()
        x = torch.randn(1, 3, *size)
        path = tmp_path / f'seg_{mode}.onnx'
        torch.onnx.export(model, (x,), str(path), dynamo=True)
        session = ort.InferenceSession(str(path))
        [got] = session.run(None, {session.get_inputs()[0].name: x.numpy()})
        with torch.no_grad():
            assert torch.equal(torch.as_tensor(got), model(x)), mode


# ----------------------------------------------------------------------------------------- learning, predict
def test_semantic_fpn_fits_a_batch_of_shapes_seg(one_thread):
    """The head, its loss and the argmax learn: 40 steps on one batch of shapes_seg take mIoU far above chance."""
    from zoo.datasets import ShapesSegDataModule
    from zoo.recipes.segmentation import SegmentationMetric
    torch.manual_seed(0)
    dm = ShapesSegDataModule(img_size=64, batch_size=4, num_samples=20, min_px=16, max_px=40, augment=None)
    dm.setup('fit')
    x, targets = next(iter(dm.val_dataloader()))  # evaluation batches: one target dict per image
    masks = torch.stack([t['mask'] for t in targets])  # (B, S, S)
    model = zoo.create('semfpn_seg_tiny', num_classes=dm.num_classes)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

    def miou() -> float:
        metric = SegmentationMetric(dm.num_classes)
        with torch.no_grad():
            metric.update(model.eval()(x), masks)
        return metric.compute()['miou'].item()

    before = miou()
    losses = []
    for _ in range(40):
        loss, _ = model.train().head.loss(model.forward_raw(x), masks)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    after = miou()
    assert losses[-1] < 0.5 * losses[0] and after > max(0.5, before + 0.3), (before, after, losses[::10])


def test_predict_writes_palette_label_pngs_at_file_size_and_overlays(runs):
    import yaml
    from PIL import Image

    from zoo.recipes.main import main
    cfg = {'seed_everything': 0,
           'trainer': {'accelerator': 'cpu', 'devices': 1, 'max_epochs': 1, 'limit_train_batches': 1,
                       'limit_val_batches': 1, 'enable_progress_bar': False, 'enable_model_summary': False},
           'model': {'class_path': 'zoo.recipes.Segmentation', 'init_args': {'name': 'semfpn_seg_tiny'}},
           'data': {'class_path': 'zoo.datasets.ShapesSegDataModule',
                    'init_args': {'img_size': 64, 'batch_size': 2, 'num_samples': 24, 'min_px': 12, 'max_px': 32}}}
    path = runs.parent / 'seg.yaml'
    path.write_text(yaml.safe_dump(cfg))
    assert main(['fit', '-c', str(path), '--db', 'none']) == 0
    [fit_run] = [p for p in (runs / 'seg').iterdir() if p.is_dir() and not p.is_symlink()]
    assert list((fit_run / 'val_predictions').glob('epoch000-*.png'))  # the per-validation grid
    assert main(['predict', '-c', str(path), '--db', 'none', '--ckpt_path', 'last']) == 0
    pred_run = max(p for p in (runs / 'seg').iterdir() if p.is_dir() and not p.is_symlink())
    labels = sorted((pred_run / 'predictions').glob('*.png'))
    overlays = sorted((pred_run / 'overlays').glob('*.png'))
    assert len(labels) == len(overlays) == 1  # 24 samples: 1 for test
    label = Image.open(labels[0])
    assert label.mode == 'P' and label.size == (64, 64) and max(label.getdata()) < 7
    assert Image.open(overlays[0]).size == (128, 64)  # ground truth | prediction


def _trunk_growth(lr: float, weight_decay: float, warmup: int = 0, steps: int = 12, model_args: dict | None = None
                  ) -> float:
    """How much the std of semfpn_seg's coarsest backbone map grows over ``steps`` AdamW steps on shapes_seg, the lr
    warmed up linearly over ``warmup`` steps (``optim.scheduler``, the recipe's warm-up cosine)."""
    from zoo.datasets import ShapesSegDataModule
    from zoo.recipes import optim
    torch.manual_seed(0)
    dm = ShapesSegDataModule(img_size=64, batch_size=4, num_samples=20, augment=None)
    dm.setup('fit')
    x, targets = next(iter(dm.val_dataloader()))  # evaluation batches: one target dict per image
    masks = torch.stack([t['mask'] for t in targets])  # (B, S, S)
    model = zoo.create('semfpn_seg', num_classes=dm.num_classes, **(model_args or {}))
    opt = torch.optim.AdamW(optim.param_groups(model, weight_decay), lr=lr)
    schedule = optim.scheduler(opt, total=1000, warmup=warmup)

    def scale() -> float:
        with torch.no_grad():
            return list(model.backbone(x))[-1].std().item()

    before = scale()
    for _ in range(steps):
        loss, _ = model.train().head.loss(model.forward_raw(x), masks)
        opt.zero_grad()
        loss.backward()
        opt.step()
        schedule.step()
    return scale() / before


def test_cpu_recipe_lr_keeps_the_poolformer_trunk_bounded(one_thread):
    """PoolFormer's trunk (stem, downsampling convs, residual sums) has no normalisation: at AdamW lr 4e-3 without
    warm-up (the CPU recipe's first setting) its maps grow by orders of magnitude within a few steps and the
    backbone stops learning; the shipped recipe's lr and warm-up keep them at their scale past the warm-up."""
    from pathlib import Path

    import yaml
    cfg = yaml.safe_load((Path(__file__).parents[1] / 'recipes/configs/segmentation/'
                          'semfpn_poolformer_tiny_shapes_seg.yaml').read_text())
    system = cfg['model']['init_args']
    args = system['optimizer']['init_args']
    warmup = system['lr_scheduler']['init_args']['warmup_steps']
    model_args = system.get('model_args')
    shipped = _trunk_growth(args['lr'], args['weight_decay'], warmup, steps=warmup + 20, model_args=model_args)
    too_high = _trunk_growth(4e-3, args['weight_decay'])
    assert shipped < 10 and too_high > 50, (shipped, too_high)  # measured: 1.5 (lr 2e-3, 100 warm-up) and 170
