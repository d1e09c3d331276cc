"""The dense-task contract in the recipes (issue 44, item 2): a segmentation evaluation batch carries each image's
metadata and its file's mask, the head's loss (with ``class_weight``) serves every test mode, the metric scores the
prediction resized back to the file (mmseg's), ``zoo predict`` writes at the file's size, and one base
(``zoo.recipes.dense``) writes the validation grid of both tasks."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch import Trainer
from PIL import Image

FILE = (40, 56)  # (H, W) of every file: neither S x S nor S's aspect ratio
S = 32


@pytest.fixture
def folder_data(tmp_path):
    """Six image files of 40 x 56 with 3-class masks (blocks, so a resize moves class borders), split 3 / 3."""
    from zoo.datasets import FolderSegDataModule
    rng = np.random.default_rng(0)
    (tmp_path / 'imgs').mkdir()
    (tmp_path / 'masks').mkdir()
    for i in range(6):
        mask = np.zeros(FILE, np.uint8)
        y, x = rng.integers(3, 20, 2)
        mask[y:y + 17, x:x + 23] = 1
        mask[:, 50 - i:] = 2
        mask[0, :5] = 255  # unlabelled pixels count nowhere
        img = rng.integers(0, 256, (*FILE, 3), dtype=np.uint8)
        img[mask == 1] //= 3  # darker where class 1 is, so the classes differ in the image
        Image.fromarray(img).save(tmp_path / 'imgs' / f'{i}.png')
        Image.fromarray(mask).save(tmp_path / 'masks' / f'{i}.png')
    (tmp_path / 'classes.txt').write_text('sky\nroad\ncar\n')
    return FolderSegDataModule(str(tmp_path / 'imgs'), str(tmp_path / 'masks'), str(tmp_path / 'classes.txt'),
                               img_size=S, batch_size=2, val_fraction=0.5, augment=None)


def _trainer(root) -> Trainer:
    return Trainer(accelerator='cpu', devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, default_root_dir=str(root))


def _miou(conf: torch.Tensor) -> float:
    """mmseg's mIoU from a (truth, prediction) confusion matrix: classes with an empty union left out."""
    tp, union = conf.diag(), conf.sum(0) + conf.sum(1) - conf.diag()
    return (tp[union > 0] / union[union > 0]).mean().item()


def _confusion(pred: torch.Tensor, truth: torch.Tensor, n: int = 3) -> torch.Tensor:
    keep = truth != 255
    return torch.bincount(truth[keep] * n + pred[keep], minlength=n * n).reshape(n, n).double()


def test_segmentation_validates_in_the_files_pixels(folder_data, tmp_path):
    from zoo.recipes import Segmentation
    torch.manual_seed(0)
    system = Segmentation('semfpn_seg_tiny', num_classes=3, plot_images=2)
    [logged] = _trainer(tmp_path).validate(system, datamodule=folder_data, verbose=False)
    # by hand: the logits at the input (S x S), resized back to each file (bilinear, align_corners=False), argmax
    in_file, at_input = torch.zeros(3, 3, dtype=torch.float64), torch.zeros(3, 3, dtype=torch.float64)
    model = system.model.eval()
    with torch.no_grad():
        for x, targets in folder_data.val_dataloader():
            assert x.shape[-2:] == (S, S) and all(t['orig_size'] == FILE for t in targets)
            for lg, t in zip(model.logits(x), targets):
                up = F.interpolate(lg[None], size=FILE, mode='bilinear', align_corners=False)[0]  # (3, 40, 56)
                in_file += _confusion(up.argmax(0), t['file_mask'])
                at_input += _confusion(lg.argmax(0), t['mask'])
    assert in_file.sum() == 3 * (FILE[0] * FILE[1] - 5)  # every labelled pixel of the three files, once
    assert logged['val/miou'] == pytest.approx(_miou(in_file), abs=1e-6)
    assert logged['val/aacc'] == pytest.approx((in_file.diag().sum() / in_file.sum()).item(), abs=1e-6)
    assert abs(_miou(in_file) - _miou(at_input)) > 1e-4  # the old scoring (at S x S) is another number
    assert list((tmp_path / 'val_predictions').glob('epoch000-step0.png'))  # the grid, from the shared base


def test_slide_mode_loss_honours_class_weight(folder_data):
    from zoo.recipes import Segmentation
    torch.manual_seed(0)
    weight = (0.2, 1.0, 3.0)
    system = Segmentation('semfpn_seg_tiny', num_classes=3, model_args={
        'test_mode': 'slide', 'crop_size': 32, 'stride': 16, 'head_kwargs': {'class_weight': weight}})
    folder_data.setup('validate')
    x, targets = next(iter(folder_data.val_dataloader()))
    model = system.model.eval()
    masks = torch.stack([t['mask'] for t in targets])
    with torch.no_grad():
        loss, predictions, logits = system.infer(model, x, targets)
        assert model.test_mode == 'slide' and logits.shape == (2, 3, S, S)
        assert [p['mask'].shape for p in predictions] == [FILE, FILE]
        by_hand = F.cross_entropy(model.logits(x), masks, weight=torch.tensor(weight), ignore_index=255)
        assert loss == pytest.approx(by_hand.item(), abs=1e-6)
        model.head.class_weight = None
        unweighted, _, _ = system.infer(model, x, targets)
    assert abs(loss.item() - unweighted.item()) > 1e-4  # the weights change the loss in slide mode too


def test_predict_writes_label_pngs_at_the_files_size(folder_data, tmp_path):
    from zoo.recipes import Segmentation
    torch.manual_seed(0)
    system = Segmentation('semfpn_seg_tiny', num_classes=3)
    trainer = Trainer(accelerator='cpu', devices=1, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, callbacks=[system.prediction_writer(tmp_path / 'run')])
    trainer.predict(system, datamodule=folder_data, return_predictions=False)
    labels = sorted((tmp_path / 'run' / 'predictions').glob('*.png'))
    assert len(labels) == 3 and all(Image.open(p).size == FILE[::-1] for p in labels)  # (W, H): the file's
    overlays = sorted((tmp_path / 'run' / 'overlays').glob('*.png'))
    assert [Image.open(p).size for p in overlays] == [(2 * FILE[1], FILE[0])] * 3  # ground truth | prediction
    # the written classes are the head's prediction in file pixels
    model = system.model.eval()
    x, targets = next(iter(folder_data.predict_dataloader()))
    with torch.no_grad():
        first = model(x, targets)[0]['mask']
    name = Path(folder_data.test_set.meta(0)['name']).stem  # the mask file's name: predictions/<stem>.png
    assert torch.equal(torch.as_tensor(np.array(Image.open(tmp_path / 'run' / 'predictions' / f'{name}.png')),
                                       dtype=torch.long), first)


def test_detection_grid_comes_from_the_shared_base(tmp_path):
    pytest.importorskip('faster_coco_eval')
    from zoo.datasets import ShapesDetDataModule
    from zoo.recipes import Detection
    from zoo.recipes.dense import DenseSystem
    torch.manual_seed(0)
    dm = ShapesDetDataModule(img_size=64, num_samples=20, batch_size=2, min_px=8, max_px=24)
    system = Detection('yolo_det_tiny', num_classes=dm.num_classes, plot_images=2)
    assert isinstance(system, DenseSystem)
    [logged] = _trainer(tmp_path).validate(system, datamodule=dm, verbose=False)
    assert 0 <= logged['val/map'] <= 1 and 'val/map50' in logged and 'val/loss' in logged
    [grid] = (tmp_path / 'val_predictions').glob('epoch000-step0.png')
    assert Image.open(grid).size[0] > 2 * 64  # two images' truth | prediction pairs side by side
