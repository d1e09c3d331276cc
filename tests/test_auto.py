"""``zoo.optimize(model, 'auto')`` (issue 45 item 3): the fastest float32 runtime whose outputs equal eager's,
measured once and cached per architecture, input, CPU, threads and library versions. The choice logic is tested
on stand-in runtimes whose speed and correctness are set by hand; the real path on ResNet-tiny. No time is
asserted beyond "a module that sleeps 20 ms is slower than one that does not"."""
from __future__ import annotations

import json
import time

import pytest
import torch
from torch import nn

import zoo
from zoo import _auto


class _Slow(nn.Module):
    def __init__(self, model, sleep_s=0.0, shift=0.0):
        super().__init__()
        self.model, self.sleep_s, self.shift = model, sleep_s, shift

    def forward(self, x):
        time.sleep(self.sleep_s)
        return self.model(x) + self.shift


def _stand_ins(model, built):
    def build(rt):
        built.append(rt)
        if rt == 'openvino':
            raise RuntimeError('cannot run this graph')
        return {'eager': _Slow(model, 0.02), 'compile': _Slow(model), 'onnxruntime': _Slow(model, 0.0, shift=1.0)}[rt]
    return build


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv('ZOO_CACHE', str(tmp_path / 'cache'))
    return tmp_path / 'cache' / 'auto_runtime.json'


def test_auto_takes_the_fastest_correct_runtime_and_caches_the_choice(cache, capsys):
    torch.manual_seed(0)
    model, x = nn.Linear(8, 4).eval(), torch.randn(2, 8)
    built = []
    net = _auto.choose(model, x, _stand_ins(model, built))
    # compile is fast and right; onnxruntime is as fast but wrong (+1 everywhere); openvino failed to build
    assert net.auto['runtime'] == 'compile' and not net.auto['cached']
    assert set(net.auto['wrong']) == {'onnxruntime'} and set(net.auto['failed']) == {'openvino'}
    assert net.auto['median_ms']['eager'] > net.auto['median_ms']['compile']
    assert 'onnxruntime' not in net.auto['median_ms']            # a wrong runtime is not even timed
    err = capsys.readouterr().err
    assert 'auto chose compile for Linear (2, 8)' in err and 'onnxruntime rejected' in err and 'openvino failed' in err
    [key] = json.loads(cache.read_text())
    assert json.loads(key)['input'] == [[2, 8], 'torch.float32'] and json.loads(key)['cpu']
    # the second call builds the cached choice alone
    built.clear()
    again = _auto.choose(model, x, _stand_ins(model, built))
    assert built == ['compile'] and again.auto['cached'] and 'cached choice' in capsys.readouterr().err
    # another input shape, or the same architecture with other weights: the key is shape-, not value-dependent
    assert _auto.cache_key(model, torch.randn(4, 8)) != key
    assert _auto.cache_key(nn.Linear(8, 4), x) == key
    # a cache a crash left half-written is measured again, not an error
    cache.write_text('{"trunc')
    built.clear()
    assert _auto.choose(model, x, _stand_ins(model, built)).auto['runtime'] == 'compile' and len(built) == 4


def test_auto_refuses_what_it_cannot_choose(cache):
    model, x = nn.Linear(8, 4).eval(), torch.randn(2, 8)
    with pytest.raises(ValueError, match='auto chooses among eager, compile, onnxruntime, openvino; got foo'):
        _auto.choose(model, x, lambda rt: model, candidates=('foo',))
    with pytest.raises(ValueError, match="no runtime ran Linear with eager's outputs"):
        _auto.choose(model, x, lambda rt: _Slow(model, shift=1.0), candidates=('compile',))
    with pytest.raises(ValueError, match="'auto' chooses among the float32 runtimes"):
        zoo.optimize(zoo.create('resnet_tiny', num_classes=10), 'auto', dtype=torch.bfloat16)


def test_optimize_auto_on_a_real_model_runs_a_measured_runtime(cache):
    torch.manual_seed(0)
    model = zoo.create('resnet_tiny', num_classes=10).eval()
    x = torch.randn(2, 3, 32, 32)
    net = zoo.optimize(model, 'auto', x)
    assert net.auto['runtime'] in _auto.CANDIDATES and set(net.auto['median_ms']) <= set(_auto.CANDIDATES)
    with torch.no_grad():
        assert torch.allclose(net(x), model(x), atol=1e-3, rtol=1e-3)
    assert json.loads(cache.read_text())
