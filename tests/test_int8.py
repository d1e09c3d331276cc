"""INT8 runtimes (issue 45 item 1): ``zoo.optimize(model, 'onnxruntime-int8' | 'openvino-int8', calibration=...)``,
``zoo test --runtime onnxruntime-int8`` (accuracy after quantization recorded beside the float run) and
``zoo export -c CONFIG --int8``. Tiny models; no time is asserted (docs/runtimes.md has the figures)."""
from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
import torch

import zoo
from zoo._quantize import QUANTIZED_OPS, float_modules, float_nodes, int8_fraction, quantize_onnx
from zoo._runtime import _frozen, _graph_module, _onnx_program, example_input, output_names
from zoo.recipes.main import main

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / 'recipes' / 'configs' / 'poolformer' / 'poolformer_tiny_digits_15e.yaml'
QUIET = ['--trainer.enable_progress_bar', 'false', '--trainer.enable_model_summary', 'false']


def _float_graph(model, path: Path, x: torch.Tensor) -> Path:
    with _frozen(model):
        _onnx_program(_graph_module(model), x, names=output_names(model)).save(str(path))
    return path


def _weight_is_quantized(graph: onnx.GraphProto) -> dict[str, bool]:
    dq = {o for n in graph.node if n.op_type == 'DequantizeLinear' for o in n.output}
    return {n.name: n.input[1] in dq for n in graph.node if n.op_type in QUANTIZED_OPS}


def test_quantize_onnx_keeps_the_classifier_and_the_first_conv_in_float(tmp_path):
    """Every Conv / Gemm of ResNet-tiny gets int8 weights (a DequantizeLinear feeding its weight) except the
    classifier ``fc`` and the stem's convolution, found by the module path the exporter writes per node."""
    torch.manual_seed(0)
    model = zoo.create('resnet_tiny', num_classes=10).eval()
    src = _float_graph(model, tmp_path / 'f.onnx', example_input(model, batch_size=2))
    keep = float_modules(model)
    assert keep == ('fc', 'stem.0.conv')
    assert sorted(float_nodes(src, keep)) == ['node_conv2d', 'node_linear']
    calib = [example_input(model, batch_size=4) for _ in range(2)]
    dst = quantize_onnx(src, tmp_path / 'q.onnx', calib, keep_float=keep)
    quantized = _weight_is_quantized(onnx.load(str(dst)).graph)
    assert {k for k, v in quantized.items() if not v} == {'node_conv2d', 'node_linear'}
    assert int8_fraction(dst) == (len(quantized) - 2, len(quantized)) and len(quantized) > 10
    # kept nothing in float: every weighted node quantized
    every = quantize_onnx(src, tmp_path / 'all.onnx', [example_input(model, batch_size=4)], keep_float=())
    assert int8_fraction(every) == (len(quantized), len(quantized))


@pytest.mark.parametrize('runtime', ['onnxruntime-int8', 'openvino-int8'])
def test_optimize_int8_runs_close_to_float_and_refuses_a_missing_calibration(runtime):
    torch.manual_seed(0)
    model = zoo.create('resnet_tiny', num_classes=10).eval()
    calib = [example_input(model, batch_size=8) for _ in range(4)]
    x = example_input(model, batch_size=8)
    with torch.no_grad():
        ref = model(x)
    got = zoo.optimize(model, runtime, x, calibration=calib)(x)
    assert got.shape == ref.shape and got.dtype == torch.float32
    err = (got - ref).abs().max() / ref.abs().max()
    assert 0 < err < 0.1          # quantized (not the float graph), and close to it
    with pytest.raises(ValueError, match='needs calibration=: a few batches of real inputs'):
        zoo.optimize(model, runtime, x)
    with pytest.raises(ValueError, match='calibration and int8_only are for the int8 runtimes'):
        zoo.optimize(model, 'onnxruntime', x, calibration=calib)
    with pytest.raises(ValueError, match='calibration is empty'):
        zoo.optimize(model, runtime, x, calibration=[])


def test_a_detector_quantizes_its_network_and_keeps_its_head_and_prediction_in_float():
    """A dense model's graph is its network wrapped (``model.`` paths): the head's convolutions stay float, and
    the eager decode and NMS run on the int8 network's maps."""
    torch.manual_seed(0)
    det = zoo.create('yolo_det_tiny', num_classes=3).eval()
    keep = float_modules(det, _graph_module(det))
    assert 'model.head' in keep
    x = example_input(det, (3, 64, 64), 2)
    net = zoo.optimize(det, 'onnxruntime-int8', x, calibration=[example_input(det, (3, 64, 64), 4)])
    maps, ref = net.forward_raw(x), det.forward_raw(x)
    assert [m.shape for m in maps] == [r.shape for r in ref]
    dets = net(x)
    assert len(dets) == 2 and set(dets[0]) >= {'boxes', 'scores', 'labels'}


def test_zoo_test_records_accuracy_after_int8_beside_float_and_export_int8_writes_a_calibrated_graph(
        runs, tmp_path, capsys, monkeypatch):
    """``zoo test --runtime onnxruntime-int8`` calibrates on the recipe's training images and records its
    accuracy in the results database beside the eager run's (another config key: never pooled as seeds);
    ``zoo export -c CONFIG --int8`` writes the QDQ graph, its card saying how it was quantized."""
    import onnxruntime as ort

    from zoo.eval import results as R

    db = tmp_path / 'results.db'
    monkeypatch.setenv('ZOO_DB', str(db))
    train = ['--model.name', 'resnet_tiny', '--model.model_args', '{}', '--trainer.max_epochs=1',
             '--trainer.limit_train_batches=4', '--trainer.limit_val_batches=2', '--trainer.limit_test_batches=3',
             *QUIET]
    assert main(['fit', '-c', str(DEMO), *train]) == 0
    for runtime in ([], ['--runtime', 'onnxruntime-int8']):
        assert main(['test', '-c', str(DEMO), '--ckpt_path', 'best', *train, *runtime]) == 0
    tests = R.runs(db=str(db), stage='test').set_index('runtime')
    assert sorted(tests.index) == ['eager', 'onnxruntime-int8']
    assert tests.loc['onnxruntime-int8', 'test/acc1'] == pytest.approx(tests.loc['eager', 'test/acc1'], abs=0.1)
    assert tests.loc['onnxruntime-int8', 'config_key'] != tests.loc['eager', 'config_key']
    R.close_all()

    [ckpt] = {p.resolve() for p in runs.glob('*/*/checkpoints/best-*.ckpt')}
    out = tmp_path / 'int8' / 'net.onnx'
    out.parent.mkdir()
    # the checkpoint's run config names its data: the calibration images are that recipe's training split
    assert main(['export', 'resnet_tiny', '--ckpt_path', str(ckpt), '--int8', '--out', str(out)]) == 0
    card = json.loads(out.with_name('net.onnx.json').read_text())
    assert card['int8']['calibration_split'] == 'train' and card['int8']['calibration_images'] >= 64
    assert card['int8']['quantized_nodes'] == card['int8']['weighted_nodes'] - 2
    assert sorted(p.name for p in out.parent.iterdir()) == ['net.onnx', 'net.onnx.json']  # no float file left
    x = torch.randn(3, 1, 32, 32)
    assert ort.InferenceSession(str(out)).run(None, {'input': x.numpy()})[0].shape == (3, 10)
    # an int8 export needs a recipe's data and ONNX
    capsys.readouterr()
    assert main(['export', 'resnet_tiny', '--random-init', '--int8', '--out', str(tmp_path / 'n.onnx')]) == 2
    assert "--int8 calibrates on the training images of a recipe" in capsys.readouterr().err
    assert main(['export', 'resnet_tiny', '--ckpt_path', str(ckpt), '--int8', '--format', 'pt2',
                 '--out', str(tmp_path / 'n.pt2')]) == 2
    assert '--int8 writes an ONNX Runtime int8 (QDQ) graph: use --format onnx' in capsys.readouterr().err
    assert not (tmp_path / 'n.onnx').exists() and not (tmp_path / 'n.pt2').exists()


def test_a_bias_the_export_shares_between_two_convolutions_quantizes_to_a_valid_graph(tmp_path):
    """The export deduplicates equal initializers, so two convolutions with zero biases share one; ORT's
    quantizer then defined a quantized bias twice: an invalid graph ("Duplicate definition of name (val_687)"),
    met on the trained Strip-MLP of benchmarks/int8_accuracy.py (not reproduced on a network this small). Each
    quantized node gets its own copy first (``_unshare_initializers``), and the graph still computes the same."""
    import onnxruntime as ort

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Conv2d(4, 4, 3),
                              torch.nn.ReLU(), torch.nn.Conv2d(4, 4, 3)).eval()
    for conv in (net[0], net[2], net[4]):
        torch.nn.init.zeros_(conv.bias)
    x = torch.randn(2, 3, 16, 16)
    src = _float_graph(net, tmp_path / 'f.onnx', x)
    g = onnx.load(str(src)).graph
    biases = [n.input[2] for n in g.node if n.op_type == 'Conv']
    assert len(set(biases)) < len(biases)                     # the premise: the float graph shares a bias
    from zoo._quantize import _unshare_initializers
    own = tmp_path / 'own.onnx'
    own.write_bytes(src.read_bytes())
    _unshare_initializers(own)
    g = onnx.load(str(own)).graph
    biases = [n.input[2] for n in g.node if n.op_type == 'Conv']
    assert len(set(biases)) == len(biases) == 3 and {i.name for i in g.initializer} >= set(biases)
    dst = quantize_onnx(src, tmp_path / 'q.onnx', [torch.randn(4, 3, 16, 16)])
    got = ort.InferenceSession(str(dst)).run(None, {'input': x.numpy()})[0]
    with torch.no_grad():
        assert torch.allclose(torch.from_numpy(got), net(x), atol=0.05)


@pytest.mark.parametrize('runtime', ['onnxruntime-int8', 'openvino-int8', 'auto'])
def test_denoising_refuses_a_one_size_graph_runtime(runtime):
    """A denoiser is tested on whole images of their own sizes: an exported graph (int8, or the one 'auto' may
    choose at one size) has one, so the system says so instead of failing on the second image's size."""
    from zoo.recipes.denoising import Denoiser
    with pytest.raises(ValueError, match=f'--runtime {runtime} runs an ONNX graph of one image size'):
        Denoiser('dncnn', runtime=runtime)


def test_every_list_of_runtime_names_is_zoo_runtimes():
    """The runtimes are named in three places that cannot import torch's side (the results store, the CLI's
    parser): each is ``zoo.RUNTIMES``."""
    from zoo.eval.results.schema import LATENCY_RUNTIMES
    from zoo.recipes.main import RUNTIME_NAMES
    assert tuple(LATENCY_RUNTIMES) == tuple(RUNTIME_NAMES) == tuple(zoo.RUNTIMES)


def test_one_block_kind_at_a_time_quantizes_exactly_that_kinds_layers(tmp_path):
    """Per-block sensitivity (issue 45, item 2): with ``only`` accepting the channel mixers' module paths, the int8
    graph of PoolFormer-tiny has int8 weights on exactly the channel mixers' convolutions (10 of its 15 weighted
    nodes: ``weighted_kinds`` counts them from the modules), the downsampling convolutions, stem and classifier left
    float; ``zoo.optimize(..., int8_only=)`` passes model-relative paths."""
    from zoo.eval.breakdown import _owner, kind_map, weighted_kinds

    torch.manual_seed(0)
    model = zoo.create('poolformer_tiny', num_classes=10).eval()
    kinds = kind_map(model)
    assert weighted_kinds(model) == {'channel_mixer': 10, 'downsample': 3}   # stem conv and head fc stay float
    src = _float_graph(model, tmp_path / 'f.onnx', example_input(model, batch_size=2))
    only = lambda path: kinds.get(_owner(path, kinds)) == 'channel_mixer'  # noqa: E731
    dst = quantize_onnx(src, tmp_path / 'q.onnx', [example_input(model, batch_size=4)],
                        keep_float=float_modules(model), only=only)
    quantized = _weight_is_quantized(onnx.load(str(dst)).graph)
    assert sum(quantized.values()) == 10 and len(quantized) == 15
    assert sorted(float_nodes(src, (), only)) == sorted(k for k, v in quantized.items() if not v)
    with pytest.raises(ValueError, match='calibration and int8_only are for the int8 runtimes'):
        zoo.optimize(model, 'onnxruntime', int8_only=only)


def test_int8_sensitivity_rows_and_zoo_profile_int8(capsys):
    """ResNet-tiny owns only convolutions outside its stem and classifier, so quantizing the ``conv`` kind alone is
    the whole int8 network: the same logits. Each variant is scored by ``evaluate`` and timed; the CLI prints the
    table."""
    from zoo.eval.breakdown import int8_sensitivity

    torch.manual_seed(0)
    model = zoo.create('resnet_tiny', num_classes=10).eval()
    x = example_input(model, batch_size=4)
    seen = []
    rows = int8_sensitivity(model, x, [x], evaluate=lambda net: seen.append(net) or float(len(seen)),
                            repeats=1, warmup=0)
    by = {r['variant']: r for r in rows}
    assert list(by) == ['float32', 'all', 'conv'] and len(seen) == 3
    assert by['conv']['layers'] == 11 and by['float32']['max_abs_delta'] == 0.0
    assert by['all']['max_abs_delta'] > 0 and by['conv']['max_abs_delta'] == pytest.approx(by['all']['max_abs_delta'])
    assert by['all']['delta'] == 1.0 and by['float32']['speedup'] == 1.0
    assert main(['profile', 'resnet_tiny', '--int8', '--img-size', '32', '--repeats', '1', '--warmup', '0']) == 0
    out = capsys.readouterr().out
    assert '| resnet_tiny | conv | 11 |' in out and 'speed, not accuracy' in out
