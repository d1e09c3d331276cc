"""Bad command-line input: one line on stderr (with close matches), exit code 2, nothing written to disk.
And a normal run is quiet: no advertisements, no warnings about our own set-up, no unmeasured FLOPs."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import one_error_line
from zoo.recipes.main import DEMO, main

ROOT = Path(__file__).resolve().parents[1]
CONFIG = str(ROOT / DEMO)


@pytest.mark.parametrize('args, expected', [
    # a misspelt block inside --model.model_args: the registry's message, with its close match
    (['--model.model_args', '{token_mixer: poolng}'], "Did you mean 'pooling'"),
    # an unknown option: the close option names
    (['--trainer.max_epohcs', '2'], 'did you mean --trainer.max_epochs'),
    # an unknown argument of the system
    (['--model.label_smothing', '0.1'], 'did you mean label_smoothing?'),
    # a string where an int is expected (YAML quotes make '10' a string)
    (['--model.num_classes', "'10'"], "--model.num_classes expects int, got '10'"),
    (['--trainer.max_epochs', 'two'], '--trainer.max_epochs expects int, got two'),
    # a DataModule class that does not exist
    (['--data', 'zoo.datasets.DigitDataModule'], 'did you mean DigitsDataModule'),
])
def test_bad_fit_arguments(args, expected, runs, capfd, tmp_path, monkeypatch):
    db = tmp_path / 'results.db'
    monkeypatch.setenv('ZOO_DB', str(db))
    assert main(['fit', '-c', CONFIG, *args, '--trainer.fast_dev_run', '1']) == 2
    line = one_error_line(capfd)
    assert line.startswith('zoo fit: error: ') and expected in line, line
    assert not runs.exists() and not db.exists()  # no run folder (nor the runs root), no database


@pytest.mark.parametrize('content', [os.urandom(3000), b'', b'\x80\x04K\x01.'])
def test_garbage_checkpoint(content, runs, capfd, tmp_path):
    ckpt = tmp_path / 'garbage.ckpt'
    ckpt.write_bytes(content)
    assert main(['test', '-c', CONFIG, '--ckpt_path', str(ckpt)]) == 2
    line = one_error_line(capfd)
    assert 'is not a readable Lightning checkpoint' in line or 'is not a Lightning checkpoint' in line, line
    assert 'weights_only' not in line  # torch's advice to unpickle an untrusted file is not repeated
    assert ckpt.read_bytes() == content and not runs.exists()


def test_no_recipe(runs, capfd):
    assert main(['test']) == 2
    assert 'a recipe gives both: -c recipes/configs/<family>/<name>.yaml' in one_error_line(capfd)


def test_condensing_never_fails(monkeypatch):
    """A report shaped in a way the condenser did not foresee still gives one line, with all its words."""
    from zoo.recipes import errors

    def unforeseen(text, parser):
        raise IndexError('unforeseen')
    monkeypatch.setattr(errors, '_one_line_error', unforeseen)
    assert errors.one_line_error('Parser key "model":\n  something new\n') == 'Parser key "model": something new'


@pytest.mark.parametrize('argv, expected', [
    (['lst'], "unknown command 'lst'; did you mean list?"),
    (['list', '--famly', 'metaformer'], 'zoo list: error: unknown option --famly; did you mean --family?'),
    (['sweep', 'recipes/sweeps/poolformer_digits.py', '--n-trails', '2'], 'did you mean --n-trials'),
    (['--vrsion'], 'did you mean --version?'),
])
def test_bad_commands_and_options(argv, expected, capfd):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert expected in one_error_line(capfd)


def test_info_of_timm_models(capsys):
    assert main(['info', 'timm/resnet18']) == 0
    info = json.loads(capsys.readouterr().out)
    assert info['params'] == 11_689_512  # torchvision's resnet18 too
    assert info['pretrained_cfg']['input_size'] == [3, 224, 224] and info['pretrained_cfg']['num_classes'] == 1000
    assert main(['info', 'timm/resnt18']) == 2
    assert 'did you mean timm/resnet18' in capsys.readouterr().err


def test_a_run_is_quiet(runs, capfd, tmp_path, monkeypatch):
    """No litlogger advertisement, no Lightning warnings about our own callbacks/set-up, no deprecation
    notes, no "Total FLOPs: 0" (Lightning counts FLOPs only with an example input): the summary has params.
    A recorded run measures its network's peak activation with torch.profiler, whose kineto printed its start,
    its stop and "ERROR: ... gpuGetDeviceCount failed" on a machine without a GPU at the end of every fit."""
    monkeypatch.setenv('ZOO_DB', str(tmp_path / 'results.db'))
    monkeypatch.delenv('KINETO_LOG_LEVEL', raising=False)
    assert main(['fit', '-c', CONFIG, '--trainer.max_epochs', '1', '--trainer.limit_train_batches', '2',
                 '--trainer.limit_val_batches', '1', '--trainer.log_every_n_steps', '1',
                 '--trainer.enable_progress_bar', 'false']) == 0
    out, err = capfd.readouterr()
    for noise in ('litlogger', 'FLOPs', 'deprecated', 'Deprecation', 'Warning', 'ckpt_path=None', 'Seed set',
                  'stepping batches', 'USDT', 'gpuGetDeviceCount'):
        assert noise not in out + err, noise
    assert 'MetaFormer' in out and 'params: 232 K' in out


# --------------------------------------------------------------------------------- issue 24: what slipped through
DET = ROOT / 'recipes' / 'configs' / 'detection' / 'yolo_det_tiny_shapes_det_128.yaml'
FAST = ['--trainer.fast_dev_run', '1', '--trainer.enable_progress_bar', 'false']


def _write_yolo(root: Path, labels_folder: str = 'labels') -> Path:
    """A two-image YOLO dataset (train and val); ``labels_folder`` misnamed to test the missing labels."""
    import torch
    from torchvision.io import write_png

    for split in ('train', 'val'):
        (root / 'images' / split).mkdir(parents=True)
        (root / labels_folder / split).mkdir(parents=True)
        for i in range(2):
            write_png(torch.randint(0, 255, (3, 48, 80), dtype=torch.uint8), str(root / 'images' / split / f'{i}.png'))
            (root / labels_folder / split / f'{i}.txt').write_text('0 0.5 0.5 0.25 0.5\n')
    data = root / 'data.yaml'
    data.write_text(f'path: {root}\ntrain: images/train\nval: images/val\nnames: [a, b]\n')
    return data


def _yolo_args(data: Path) -> list[str]:
    return ['-c', str(DET), '--data', 'zoo.datasets.YoloDetectionDataModule', '--data.data', str(data),
            '--data.img_size', '64', '--data.batch_size', '2', *FAST]


def _data_error_line(capfd) -> str:
    """The one error line of a run stopped by its data: found when the trainer sets the data up, so Lightning's
    own INFO lines about the run's options may come first; no traceback."""
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith('INFO: ')]
    assert len(lines) == 1 and 'Traceback' not in err, err
    return lines[0]


def _untouched(runs: Path, db: Path) -> None:
    assert not runs.exists() and not db.exists()  # no run folder (nor the runs root), no database


@pytest.mark.parametrize('case, expected', [
    ('labels_misnamed', 'none of the 2 train images has a label file; looked in'),
    ('bad_yaml', "data.yaml: not valid YAML (line 3, column 6: expected ',' or ']'"),
])
def test_bad_yolo_folders(case, expected, runs, capfd, tmp_path, monkeypatch):
    db = tmp_path / 'results.db'
    monkeypatch.setenv('ZOO_DB', str(db))
    data = _write_yolo(tmp_path / 'yolo', 'label' if case == 'labels_misnamed' else 'labels')
    if case == 'bad_yaml':
        data.write_text('path: x\ntrain: [images/train\nnames: [a]\n')
    assert main(['fit', *_yolo_args(data)]) == 2
    line = _data_error_line(capfd)
    assert expected in line, line
    if case == 'labels_misnamed':
        assert str(tmp_path / 'yolo' / 'labels' / 'train') in line  # the folder it looked in
    _untouched(runs, db)


@pytest.mark.parametrize('split', ['train', 'val'])
def test_invalid_coco_json_names_the_file(split, runs, capfd, tmp_path, monkeypatch):
    db = tmp_path / 'results.db'
    monkeypatch.setenv('ZOO_DB', str(db))
    import torch
    from torchvision.io import write_png

    (tmp_path / 'coco' / 'annotations').mkdir(parents=True)
    good = {'images': [{'id': 1, 'file_name': '0.png', 'height': 48, 'width': 80}],
            'annotations': [{'id': 1, 'image_id': 1, 'category_id': 1, 'bbox': [1, 1, 10, 10]}],
            'categories': [{'id': 1, 'name': 'a'}]}
    for s in ('train', 'val'):
        (tmp_path / 'coco' / s).mkdir()
        write_png(torch.zeros(3, 48, 80, dtype=torch.uint8), str(tmp_path / 'coco' / s / '0.png'))
        text = '{"images": [' if s == split else json.dumps(good)
        (tmp_path / 'coco' / 'annotations' / f'instances_{s}.json').write_text(text)
    args = ['-c', str(DET), '--data', 'zoo.datasets.CocoDetectionDataModule', '--data.root', str(tmp_path / 'coco'),
            '--data.img_size', '64', *FAST]
    assert main(['fit', *args]) == 2
    line = _data_error_line(capfd)
    assert f'instances_{split}.json: not valid JSON (line 1' in line, line
    _untouched(runs, db)


def test_abbreviated_options_are_refused(runs, capfd):
    assert main(['fit', '-c', CONFIG, '--trainer.max_epoch', '1', *FAST]) == 2
    line = one_error_line(capfd)
    assert 'unknown option --trainer.max_epoch; did you mean --trainer.max_epochs' in line, line


def test_shipped_recipes_by_name_from_any_folder(runs, capfd, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not the checkout
    for name in ('detection/yolo_det_tiny_shapes_det_128', 'yolo_det_tiny_shapes_det_128',
                 'recipes/configs/detection/yolo_det_tiny_shapes_det_128.yaml'):
        assert main(['fit', '-c', name, '--print_config']) == 0, name
        assert 'yolo_det_tiny' in capfd.readouterr().out
    assert main(['fit', '-c', 'detection/yolo_det_tiny_shapes_det', '--print_config']) == 2
    line = one_error_line(capfd)
    assert 'no shipped recipe is named so; did you mean detection/yolo_det_tiny_shapes_det_128' in line, line
    assert main(['list', '--recipes', 'detection/yolo*']) == 0
    assert 'detection/yolo_det_tiny_shapes_det_128' in capfd.readouterr().out


def test_yolo_det_gets_its_size_and_strides():
    """A backbone whose weights depend on the input grid gets the training size from the system; a backbone
    whose last levels are finer than 8/16/32 is refused with the argument that fixes it."""
    import torch

    from zoo.recipes import Detection

    system = Detection('yolo_det', model_args={'backbone': 'stripmlp_tiny'}, num_classes=3, img_size=64)
    system.model.eval()
    y = system.model.head.decode(system.model.forward_raw(torch.randn(1, 3, 64, 64)))
    assert y.shape == (1, 4 + 3, (8 * 8 + 4 * 4 + 2 * 2))
    with pytest.raises(ValueError, match="strides 2/4/8.*backbone_kwargs=\\{'stem': 'imagenet'\\}"):
        Detection('yolo_det', model_args={'backbone': 'resnet_tiny'}, num_classes=3, img_size=64)
    Detection('yolo_det', model_args={'backbone': 'resnet_tiny', 'backbone_kwargs': {'stem': 'imagenet'}},
              num_classes=3, img_size=64)  # ResNet takes no img_size: not passed to it


def test_piip_size_error_names_the_real_argument():
    import torch

    import zoo

    model = zoo.create('piip_tiny')
    with pytest.raises(ValueError, match=r'build it with img_sizes=\(64, 96, 128\)') as e:
        model(torch.randn(1, 3, 128, 128))
    fixed = eval(str(e.value).split('build it with img_sizes=')[1].split(' or ')[0])  # the advice works
    assert zoo.create('piip_tiny', img_sizes=fixed)(torch.randn(1, 3, 128, 128)).shape == (1, 1000)


def test_detection_predict_draws_on_the_file(runs, tmp_path, monkeypatch):
    """Predictions are drawn on each original file (its own size, no letterbox bars); predict_conf 0.001 keeps
    every detection up to max_det for COCOeval."""
    import torch
    from torchvision.io import decode_image

    monkeypatch.setenv('ZOO_RECORD_LATENCY', '0')
    data = _write_yolo(tmp_path / 'yolo')
    args = _yolo_args(data)[:-len(FAST)] + ['--trainer.enable_progress_bar', 'false', '--db', 'none']
    assert main(['fit', *args, '--trainer.max_epochs', '1', '--trainer.limit_val_batches', '0']) == 0
    assert main(['predict', *args, '--ckpt_path', 'last', '--model.predict_conf', '0.001']) == 0
    pred = max(p for p in (runs / DET.stem).iterdir() if p.is_dir() and not p.is_symlink())
    pngs = sorted((pred / 'predictions').glob('*.png'))
    assert len(pngs) == 2 and all(decode_image(str(p)).shape == (3, 48, 80) for p in pngs)
    dets = json.loads((pred / 'predictions.json').read_text())
    per_image = torch.bincount(torch.tensor([d['image_id'] for d in dets]))
    assert len(dets) > 2 and int(per_image.max()) <= 300 and min(d['score'] for d in dets) >= 0.001


# ------------------------------------------------------------------------------------- runtimes (issue 26)
@pytest.mark.parametrize('argv, expected', [
    (['bench', 'resnet_tiny', '--runtime', 'eager,tensorrt'], "unknown runtime 'tensorrt'; expected a comma-separated "
                                                              'list of eager, compile, onnxruntime, openvino'),
    (['bench', 'resnet_tiny', '--runtime', 'onnxruntime', '--mode', 'train'], 'only the eager runtime runs'),
    (['export'], 'give a model NAME or -c CONFIG'),
    (['export', 'resnet_tiny', '-c', CONFIG], 'not both'),
    (['export', 'resnet_tiny', '--ckpt_path', 'best'], 'give -c CONFIG'),
    (['export', 'resnet_tiny', '--ckpt_path', '/nonexistent/x.ckpt'], 'no such file'),
    (['export', '-c', CONFIG, '--ckpt_path', 'best'], 'no run of'),
    (['export', 'resnet_tny'], 'resnet_tiny'),
    (['export', 'resnet_tiny', '--nms'], "--nms puts a detector's decode and NMS in the graph; resnet_tiny is a "
                                         'classification model'),
    (['profile', 'resnet_tny'], 'resnet_tiny'),
    (['profile', 'resnet_tiny', '--runtime', 'tvm'], "unknown runtime 'tvm'"),
    (['test', '-c', CONFIG, '--runtime', 'tensorrt'], "--runtime 'tensorrt' is not one of"),
    (['fit', '-c', CONFIG, '--runtime', 'onnxruntime'], '--runtime is for zoo test'),
])
def test_bad_runtime_arguments(argv, expected, runs, capfd, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    line = one_error_line(capfd)
    assert line.startswith(f'zoo {argv[0]}: error: ') and expected in line, line
    assert not runs.exists() and list(tmp_path.iterdir()) == []            # nothing written


@pytest.mark.parametrize('argv', [['export', 'resnet_tiny', '--format', 'tflite'],
                                  ['results', '--runtime', 'tensorrt']])
def test_bad_runtime_choices(argv, capfd):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    line = one_error_line(capfd)
    assert 'is not one of' in line, line


@pytest.mark.parametrize('argv, expected', [
    (['bench', 'resnet_tiny', '--batch-size', '1', '0'], 'argument --batch-size: expected an integer >= 1, got 0'),
    (['bench', 'resnet_tiny', '--img-size', '-4'], 'argument --img-size: expected an integer >= 1, got -4'),
    (['bench', 'resnet_tiny', '--threads', '0'], 'argument --threads: expected an integer >= 1, got 0'),
    (['bench', 'resnet_tiny', '--time', '-1'], 'argument --time: expected a number >= 0, got -1'),
    (['profile', 'resnet_tiny', '--batch-size', 'two'], "argument --batch-size: expected an integer >= 1, got 'two'"),
    (['profile', 'resnet_tiny', '--warmup', '-1'], 'argument --warmup: expected an integer >= 0, got -1'),
    (['export', 'resnet_tiny', '--img-size', '0'], 'argument --img-size: expected an integer >= 1, got 0'),
    (['results', '--threads', '0'], 'argument --threads: expected an integer >= 1, got 0'),
    (['benchmark', 'run', 'paper_blocks', '--workers', '0'], 'argument --workers: expected an integer >= 1, got 0'),
])
def test_counts_and_sizes_below_their_minimum(argv, expected, capfd, tmp_path, monkeypatch):
    """A batch size, image size, thread count or repeat count that cannot be (once tracebacks from torch, or an
    export silently at the default size for --img-size 0) stops at parsing with one line, exit 2."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    line = one_error_line(capfd)
    assert line.startswith(f'zoo {argv[0]}: error: ') and expected in line, line
    assert list(tmp_path.iterdir()) == []
