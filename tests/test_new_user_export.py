"""`zoo export` as a new user meets it (issue 42: defects 5 and 7 and the export rough edges), through the command
line: the card of a trained run records that run's config, its class names, its preprocessing and its outputs in
the task's own words; the graph's names are the card's; `--nms` on a segmenter is one line; a bare NAME is refused
without `--random-init`, which is seeded and reproducible; slow steps say what they do and how long they took."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from zoo_cli import error_line, tree, zoo, zoo_in_process

import zoo as zoo_lib

onnx = pytest.importorskip('onnx', reason="the export extra: pip install 'zoo[export]'")
ort = pytest.importorskip('onnxruntime', reason="the export extra: pip install 'zoo[export]'")

# one pytest-xdist worker runs the file: the module fixtures below train once
pytestmark = pytest.mark.xdist_group('test_new_user_export')

QUIET = ['--trainer.enable_progress_bar', 'false', '--db', 'none', '--trainer.max_epochs', '1',
         '--trainer.limit_train_batches', '2', '--trainer.limit_val_batches', '1']
DET = 'detection/yolo_det_tiny_shapes_det_128'
# a segmentation recipe as a user writes one (the shipped ones train a 3.2 M model): 600 samples, 12 epochs
SEG_RECIPE = '''
seed_everything: 0
trainer: {accelerator: cpu, devices: 1, max_epochs: 12, deterministic: false}
model:
  class_path: zoo.recipes.Segmentation
  init_args: {name: semfpn_seg_tiny}
data:
  class_path: zoo.datasets.ShapesSegDataModule
  init_args: {img_size: 64, batch_size: 4, num_samples: 600, num_workers: 0}
'''


def _graph_names(path) -> tuple[list[str], list[str], list]:
    """The ONNX graph's input names, output names and the first dimension of every input and output."""
    graph = onnx.load(str(path)).graph
    dims = [v.type.tensor_type.shape.dim[0] for v in [*graph.input, *graph.output]]
    return [v.name for v in graph.input], [v.name for v in graph.output], [d.dim_param or d.dim_value for d in dims]


def _assert_graph_matches_card(path, card):
    inputs, outputs, batch = _graph_names(path)
    assert inputs == [card['input']['name']] == ['input']
    assert outputs == [o['name'] for o in card['outputs']]
    assert card['input']['shape'][0] == 'batch' and all(o['shape'][0] == 'batch' for o in card['outputs'])
    assert batch == ['batch'] * len(batch), batch          # not the exporter's symbol (s77)


@pytest.fixture(scope='module')
def seg_run(tmp_path_factory):
    """A segmentation recipe trained as a new user tries it: fewer samples (24) and one short epoch (in this
    process: the tests are about what the export of the run writes)."""
    cwd = tmp_path_factory.mktemp('seg')
    (cwd / 'tiny_seg.yaml').write_text(SEG_RECIPE)
    proc = zoo_in_process('fit', '-c', 'tiny_seg.yaml', '--data.num_samples', '24', *QUIET, cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return cwd


@pytest.fixture(scope='module')
def det_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp('det')
    proc = zoo_in_process('fit', '-c', DET, '--data.num_samples', '40', '--data.img_size', '64',
                          '--data.batch_size', '8', *QUIET, cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return cwd


def test_segmentation_card_records_the_run_its_classes_preprocessing_and_logits(seg_run):
    """Defect 5: the card held the recipe file's config (600 samples, 12 epochs), no class names, and
    described a segmenter's output in a detector's words; the graph named its batch s77 and its output otherwise."""
    proc = zoo_in_process('export', '-c', 'tiny_seg.yaml', '--ckpt_path', 'best', '--out', 'seg.onnx', cwd=seg_run)
    assert proc.returncode == 0, proc.stderr[-3000:]
    card = json.loads((seg_run / 'seg.onnx.json').read_text())
    [run] = [p for p in (seg_run / 'runs' / 'tiny_seg').iterdir() if not p.is_symlink()]
    assert card['run'] == str(run) and card['config_file'].endswith('config.yaml')
    assert card['config']['data']['init_args']['num_samples'] == 24           # the run's, not the recipe's 600
    assert card['config']['trainer']['max_epochs'] == 1                       # not 12
    assert card['class_names'] == ['background', 'circle', 'triangle', 'square', 'star', 'cross', 'ring']
    prep = card['preprocessing']
    assert prep['kind'] == 'resize' and prep['size'] == [64, 64]
    assert prep['mean'] == pytest.approx([0.485, 0.456, 0.406]) and card['mean'] == prep['mean']
    [logits] = card['outputs']
    assert logits['name'] == 'logits' and logits['shape'] == ['batch', 7, 16, 16]
    assert logits['what'].startswith('segmentation logits (batch, num_classes, H, W)')
    assert 'argmax' in logits['to_labels'] and "file's H x W" in logits['to_labels']
    assert 'decode and NMS' not in json.dumps(card['outputs'])
    _assert_graph_matches_card(seg_run / 'seg.onnx', card)

    # the card's to_labels on the graph's logits gives the labels zoo gives for a 48 x 80 file
    import torch.nn.functional as F
    from zoo.recipes.export import _from_lightning

    net, _ = _from_lightning(Path(card['checkpoint']), None, None)
    x = torch.randn(1, 3, 64, 64)
    [logits] = ort.InferenceSession(str(seg_run / 'seg.onnx')).run(['logits'], {'input': x.numpy()})
    resize = lambda t, size: F.interpolate(t, size=size, mode='bilinear', align_corners=False)
    labels = resize(resize(torch.from_numpy(logits), (64, 64)), (48, 80)).argmax(1)[0]
    with torch.no_grad():
        expected = net.eval()(x, [{'orig_size': (48, 80)}])[0]['mask']
    assert labels.shape == expected.shape and (labels == expected).float().mean() > 0.99


def test_nms_on_a_segmenter_is_one_line_and_writes_nothing(seg_run):
    """Defect 7: `--nms` on a segmentation recipe ended in "AttributeError: 'list' object has no attribute
    'argmax'"."""
    before = tree(seg_run)
    proc = zoo('export', '-c', 'tiny_seg.yaml', '--nms', '--out', 'nms.onnx', cwd=seg_run)
    assert proc.returncode == 2
    assert error_line(proc) == ("zoo export: error: --nms puts a detector's decode and NMS in the graph; "
                                'semfpn_seg_tiny is a segmentation model')
    assert tree(seg_run) == before


def test_detection_card_has_class_names_and_the_letterbox(det_run):
    """Defect 5: class_names was null and no preprocessing said how to map boxes back to the file's pixels."""
    proc = zoo_in_process('export', '-c', DET, '--ckpt_path', 'best', '--out', 'det.onnx', cwd=det_run)
    assert proc.returncode == 0, proc.stderr[-3000:]
    card = json.loads((det_run / 'det.onnx.json').read_text())
    assert card['class_names'] == ['circle', 'triangle', 'square', 'star', 'cross', 'ring']
    assert card['config']['data']['init_args']['num_samples'] == 40           # the run's, not the recipe's 600
    prep = card['preprocessing']
    assert prep['kind'] == 'letterbox' and prep['size'] == [64, 64] and prep['pad_value'] == 114
    assert prep['mean'] is None and card['mean'] is None                     # the detector takes 0..1, no ImageNet
    assert 'x_file = (x - left) / (w / W)' in prep['to_file_pixels']
    assert [o['name'] for o in card['outputs']] == ['stride8', 'stride16', 'stride32']
    assert card['outputs'][0]['shape'] == ['batch', 4 * 16 + 6, 8, 8]
    _assert_graph_matches_card(det_run / 'det.onnx', card)

    proc = zoo_in_process('export', '-c', DET, '--nms', '--out', 'deploy.onnx', cwd=det_run)
    assert proc.returncode == 0, proc.stderr[-3000:]
    card = json.loads((det_run / 'deploy.onnx.json').read_text())
    [out] = card['outputs']
    assert out['name'] == 'detections' and out['shape'] == ['batch', 300, 6] and 'to_file_pixels' in out['what']
    _assert_graph_matches_card(det_run / 'deploy.onnx', card)


def test_graph_names_its_input_output_and_batch_as_the_card(tmp_path):
    """The graph named its batch dimension s77 and its output linear while the card said batch and logits."""
    torch.save(zoo_lib.create('resnet_tiny').state_dict(), tmp_path / 'w.pth')
    proc = zoo_in_process('export', 'resnet_tiny', '--ckpt_path', 'w.pth', '--out', 'r.onnx', cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _graph_names(tmp_path / 'r.onnx') == (['input'], ['logits'], ['batch', 'batch'])
    card = json.loads((tmp_path / 'r.onnx.json').read_text())
    assert card['outputs'] == [{'name': 'logits', 'shape': ['batch', 1000], 'what': 'class logits (softmax for '
                                'probabilities), one per class_names entry'}]


def test_a_bare_name_needs_weights_or_random_init(tmp_path):
    """`zoo export resnet_tiny` silently exported a random initialisation nobody could rebuild."""
    proc = zoo('export', 'resnet_tiny', cwd=tmp_path)
    assert proc.returncode == 2
    line = error_line(proc)
    assert line.startswith('zoo export: error: resnet_tiny has no trained weights to export: give --ckpt_path FILE')
    assert '--random-init' in line and tree(tmp_path) == set()


def test_random_init_is_seeded_reproducible_and_named_as_the_card_says(tmp_path):
    """--random-init warns, records its seed, and `torch.manual_seed(seed); zoo.create(name)` rebuilds the
    exported weights; the export says what it does and how long it took (it printed nothing for 18 s)."""
    proc = zoo('export', 'resnet_tiny', '--random-init', '--seed', '3', '--out', 'r.onnx', cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    assert any(ln.startswith('zoo export: warning: resnet_tiny has random weights (--random-init): '
                             'torch.manual_seed(3)') for ln in lines), proc.stderr
    assert 'zoo export: exporting resnet_tiny to ONNX (dynamo) ...' in lines
    assert any(re.fullmatch(r'zoo export: exporting resnet_tiny to ONNX \(dynamo\) \.\.\. done in \d+\.\d s', ln)
               for ln in lines), proc.stderr
    card = json.loads((tmp_path / 'r.onnx.json').read_text())
    assert card['model']['weights'] == 'random-init' and card['model']['seed'] == 3
    assert card['outputs'][0]['name'] == 'logits' and card['preprocessing']['size'] == [32, 32]
    _assert_graph_matches_card(tmp_path / 'r.onnx', card)

    torch.manual_seed(card['model']['seed'])
    model = zoo_lib.create(card['model']['name'], **card['model']['kwargs']).eval()
    x = torch.randn(3, *card['input']['shape'][1:])
    got = ort.InferenceSession(str(tmp_path / 'r.onnx')).run(['logits'], {'input': x.numpy()})[0]
    with torch.no_grad():
        assert torch.allclose(torch.from_numpy(got), model(x), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize('argv, expected', [
    (['resnet_tiny', '--seed', '1'], '--seed seeds the weights of --random-init: pass --random-init too'),
    (['-c', DET, '--random-init'], '--random-init exports a NAME\'s seeded initialisation; it takes no -c CONFIG'),
])
def test_random_init_and_seed_misused(argv, expected, tmp_path):
    proc = zoo('export', *argv, cwd=tmp_path)
    assert proc.returncode == 2 and expected in error_line(proc) and tree(tmp_path) == set()


def test_bench_says_it_exports_and_how_long_it_took(tmp_path):
    """zoo.optimize exported for ONNX Runtime silently inside `zoo bench --runtime` (seconds to minutes)."""
    proc = zoo('bench', 'resnet_tiny', '--runtime', 'eager,onnxruntime', '--img-size', '32', '--repeats', '1',
               '--warmup', '0', '--time', '0', cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    assert 'zoo: exporting resnet_tiny to ONNX for onnxruntime ...' in lines, proc.stderr
    assert any(re.fullmatch(r'zoo: exporting resnet_tiny to ONNX for onnxruntime \.\.\. done in \d+\.\d s', ln)
               for ln in lines), proc.stderr
