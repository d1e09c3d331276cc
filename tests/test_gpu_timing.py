"""The CUDA timing path of ``zoo bench --device cuda`` (issue 45, item 6), tested on the CPU through its
device-independent parts: the clock chosen by device, nvidia-smi's answer read into the row, the one-line refusal
on a machine without CUDA, the GPU columns of schema 8, and a leaderboard that keeps devices and GPUs apart as it
keeps CPUs apart. One test needs a GPU and runs only where there is one."""
from __future__ import annotations

import pytest
import torch

from zoo._timing import call_timer, interleave, parse_nvidia_smi
from zoo.eval import bench
from zoo.eval import results as R
from zoo.recipes.main import main


pytestmark = pytest.mark.usefixtures('zoo_db')  # conftest: a results database per test


def test_the_clock_is_chosen_by_device():
    calls = []
    cpu = call_timer('cpu')
    ms = cpu(lambda: calls.append(1))
    assert calls == [1] and isinstance(ms, float) and ms >= 0.0
    # the CUDA clock is built without touching a GPU (it synchronizes and records events only when it times)
    assert call_timer('cuda').__name__ == 'cuda_time' and call_timer('cuda:1').__name__ == 'cuda_time'
    assert cpu.__name__ == 'cpu_time'
    with pytest.raises(ValueError, match="no timer for device 'meta'"):
        call_timer('meta')
    times = interleave({'a': lambda: None, 'b': lambda: None}, repeats=3, warmup=0, device='cpu')
    assert {k: len(v) for k, v in times.items()} == {'a': 3, 'b': 3}


def test_nvidia_smi_answers_are_read_into_the_row():
    assert parse_nvidia_smi('550.54.15, 1410, 1410, 1215\n') == {
        'gpu_driver': '550.54.15', 'gpu_clocks': {'sm_mhz': 1410, 'max_sm_mhz': 1410, 'mem_mhz': 1215}}
    # a throttled or virtual GPU reports [N/A] for what it does not know; nothing is made up
    assert parse_nvidia_smi('535.104.05, [N/A], 1980, [Not Supported]') == {
        'gpu_driver': '535.104.05', 'gpu_clocks': {'sm_mhz': None, 'max_sm_mhz': 1980, 'mem_mhz': None}}
    assert parse_nvidia_smi('') == {'gpu_driver': None,
                                    'gpu_clocks': {'sm_mhz': None, 'max_sm_mhz': None, 'mem_mhz': None}}


def test_cuda_without_a_gpu_is_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    assert main(['bench', 'resnet_tiny', '--device', 'cuda', '--time', '0']) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and '--device cuda needs a CUDA GPU' in err[0]
    assert main(['bench', 'resnet_tiny', '--device', 'tpu', '--time', '0']) == 2
    assert "unknown device 'tpu'" in capsys.readouterr().err
    assert bench.check_device('cpu') == 'cpu'
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 1)
    with pytest.raises(ValueError, match='onnxruntime run'):        # zoo's ONNX sessions run on the CPU
        bench.check_device('cuda', ('eager', 'onnxruntime'))
    with pytest.raises(ValueError, match='cuda:0 to cuda:0'):
        bench.check_device('cuda:3')
    assert bench.check_device('cuda', ('eager', 'compile')) == 'cuda'


def _gpu_row(db, rid, ms, gpu, **kw):
    return db.add_latency('net_a', ms, input_shape=(3, 32, 32), batch_size=1, device='cuda', run_id=rid,
                          source='bench', gpu_name=gpu, gpu_driver='550.54.15', peak_mem_mb=41.5,
                          gpu_clocks={'sm_mhz': 1410, 'max_sm_mhz': 1410, 'mem_mhz': 1215}, **kw)


def test_the_leaderboard_keeps_devices_and_gpus_apart():
    db = R.open_db()
    rid = db.start_run('net_a', task='classification', dataset='digits', seed=0)
    db.log_metrics(rid, {'val/acc1': 0.9}, final=True)
    db.finish_run(rid)
    db.add_latency('net_a', 5.0, input_shape=(3, 32, 32), batch_size=1, run_id=rid, source='bench')
    _gpu_row(db, rid, 0.5, 'NVIDIA A100-SXM4-80GB')
    _gpu_row(db, rid, 0.3, 'NVIDIA H100 80GB HBM3')
    _gpu_row(db, rid, 0.4, 'NVIDIA H100 80GB HBM3')
    lat = db.latency()
    gpu = lat[lat.device == 'cuda']
    assert gpu.peak_mem_mb.tolist() == [41.5] * 3 and gpu.gpu_clocks.iloc[0]['sm_mhz'] == 1410
    assert lat[lat.device == 'cpu'].gpu_name.isna().all()
    cpu_board = R.leaderboard('classification')
    assert cpu_board.latency_ms.tolist() == [5.0]                 # never a GPU figure on the CPU board
    assert R.data(db=db).latency_eager_ms.tolist() == [5.0]      # nor in data()'s CPU latency columns
    board = R.leaderboard('classification', device='cuda')        # the GPU most records were taken on
    assert board.attrs['cpu'] == 'NVIDIA H100 80GB HBM3' and board.latency_cpu.tolist() == ['NVIDIA H100 80GB HBM3']
    assert board.latency_ms.iloc[0] in (0.3, 0.4)
    a100 = R.leaderboard('classification', device='cuda', cpu='a100')
    assert a100.latency_ms.tolist() == [0.5]
    assert main(['results', '--device', 'cuda', '--cpu', 'A100', '--format', 'csv']) == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason='times on a CUDA GPU; none here')
def test_bench_on_a_gpu_records_the_gpu():
    rows = bench.run(['resnet_tiny'], img_size=32, repeats=3, warmup=1, budget_s=0, device='cuda', dtype='float16')
    (row,) = rows
    assert row['device'] == 'cuda' and row['gpu_name'] and row['peak_mem_mb'] > 0 and row['dtype'] == 'float16'
    assert bench.record(rows) == 1 and R.latency().gpu_name.tolist() == [row['gpu_name']]
