"""Latency against resolution (issue 45, item 4): the fitted scaling exponent, ``zoo bench --img-size A B ...``
(every size timed interleaved, one latency row each, sizes a model cannot take skipped with the reason), and ONNX
export with a dynamic height and width (``zoo export --dynamic-size``), one test per kind of family: convolutions
(VGG), pooling token mixers (PoolFormer), a resolution-keeping denoiser (DnCNN), and fixed-grid models (TNT),
which are refused in one line. No wall-clock figure is asserted."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import zoo
from zoo.eval import bench
from zoo.eval import results as R
from zoo.recipes.main import main


pytestmark = pytest.mark.usefixtures('zoo_db')  # conftest: a results database per test


def test_scaling_fit_recovers_the_exponent_of_a_power_law():
    pixels = [64 ** 2, 128 ** 2, 224 ** 2, 384 ** 2]
    fit = bench.scaling_fit(pixels, [0.02 * p ** 1.5 for p in pixels])
    assert fit['exponent'] == pytest.approx(1.5) and fit['r2'] == pytest.approx(1.0) and fit['n'] == 4
    # a latency that stops growing (a fixed overhead at small sizes) bends the line: the fit says so in R^2
    bent = bench.scaling_fit(pixels, [5.0, 5.5, 20.0, 60.0])
    slope = np.polyfit(np.log(pixels), np.log([5.0, 5.5, 20.0, 60.0]), 1)[0]
    assert bent['exponent'] == pytest.approx(slope) and 0.0 < bent['r2'] < 0.99
    assert bench.scaling_fit([4096, 4096], [1.0, 2.0]) == {'exponent': None, 'r2': None, 'n': 2}
    with pytest.raises(ValueError, match='one latency per pixel count'):
        bench.scaling_fit([1, 2], [1.0])


def test_bench_times_every_size_interleaved_and_skips_what_a_model_cannot_take(zoo_db, capsys):
    assert main(['bench', 'resnet_tiny', 'tnt_tiny', '--img-size', '32', '48', '--repeats', '2', '--warmup', '0',
                 '--time', '0', '--threads', '1', '--db', str(zoo_db), '--json']) == 0
    out, err = capsys.readouterr()
    # TNT's position embeddings are built for 32x32: skipped at 48 with the reason, measured at 32
    assert 'tnt_tiny skipped at 48x48: fixed input size 32x32' in err
    lat = R.latency()
    assert sorted(zip(lat.model, lat.input_shape)) == [('resnet_tiny', '3x32x32'), ('resnet_tiny', '3x48x48'),
                                                      ('tnt_tiny', '3x32x32')]
    assert (lat.repeats == 2).all() and (lat.device == 'cpu').all()
    assert 'latency ~ pixels^k' in out
    fits = json.loads(out[out.index('{\n'):])['scaling']
    assert [(f['model'], f['sizes'], f['n']) for f in fits] == [('resnet_tiny', '32x32 48x48', 2)]
    medians = dict(zip(lat.input_shape[lat.model == 'resnet_tiny'], lat.median_ms[lat.model == 'resnet_tiny']))
    want = math.log(medians['3x48x48'] / medians['3x32x32']) / math.log(48 ** 2 / 32 ** 2)
    assert fits[0]['exponent'] == pytest.approx(want)       # two points: the line through them


def test_a_size_the_model_refuses_is_skipped_with_its_own_error():
    model = zoo.create('vgg_tiny').eval()
    assert bench.size_problem(model, (3, 32, 32)) is None
    assert bench.size_problem(model, (3, 4, 4)) == 'ValueError: VGG needs inputs of at least 8x8, got 4x4'
    assert 'fixed input size' in bench.size_problem(zoo.create('tnt_tiny'), (3, 64, 64))
    with pytest.raises(ValueError, match='one --img-size'):
        bench.run(['resnet_tiny'], vs='resnet_tiny', img_size=[32, 64])


def _ort(path):
    import onnxruntime as ort
    sess = ort.InferenceSession(str(path), providers=['CPUExecutionProvider'])
    return lambda x: sess.run(None, {'input': x.numpy()})[0]


@pytest.mark.parametrize('name, in_chans', [('vgg_tiny', 3), ('poolformer_tiny', 3)])
def test_a_dynamic_size_export_runs_at_other_sizes(name, in_chans, tmp_path):
    """Convolutions and pooling token mixers: one file, any multiple of the stride, the eager output."""
    torch.manual_seed(0)
    model = zoo.create(name).eval()
    path = zoo.export(model, tmp_path / f'{name}.onnx', torch.randn(2, in_chans, 32, 32), dynamic_size=True)
    run = _ort(path)
    stride = zoo._runtime.size_stride(model)
    for h, w in ((2 * stride, 3 * stride), (3 * stride, 2 * stride)):   # sizes the export itself did not check
        x = torch.randn(3, in_chans, h, w)
        with torch.no_grad():
            torch.testing.assert_close(torch.from_numpy(run(x)), model(x), rtol=1e-3, atol=1e-4)


def test_zoo_export_dynamic_size_of_a_denoiser_and_its_card(tmp_path, capsys):
    out = tmp_path / 'dncnn.onnx'
    assert main(['export', 'dncnn_tiny', '--random-init', '--dynamic-size', '--out', str(out)]) == 0
    card = json.loads(out.with_name(out.name + '.json').read_text())['input']
    assert card['shape'] == ['batch', 1, 'height', 'width'] and card['dynamic_size'] and card['size_multiple'] == 1
    torch.manual_seed(0)
    model = zoo.create('dncnn_tiny').eval()                  # --random-init --seed 0 rebuilds the same weights
    x = torch.randn(1, 1, 21, 37)                            # stride 1: any size
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(_ort(out)(x)), model(x), rtol=1e-3, atol=1e-4)


def test_a_fixed_grid_model_is_refused_in_one_line(tmp_path, capsys):
    out = tmp_path / 'tnt.onnx'
    assert main(['export', 'tnt_tiny', '--random-init', '--dynamic-size', '--out', str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert 'tnt_tiny has a fixed input size (32x32' in err[-1] and 'without --dynamic-size' in err[-1]
    assert not out.exists() and not out.with_name(out.name + '.json').exists()
    with pytest.raises(ValueError, match='multiples of the model\'s stride 8'):
        zoo.export(zoo.create('resnet_tiny'), tmp_path / 'r.onnx', torch.randn(2, 3, 36, 36), dynamic_size=True)
