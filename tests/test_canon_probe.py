"""The CPU reproduction script of the Canon probes (experiments/canon_probe.py): data cache, runs, table."""
import argparse
import json

import pytest
import torch

from zoo.datasets.synthetic import make_task
from zoo.datasets.synthetic_data import SyntheticWindows
from experiments import canon_probe


def _args(**kw):
    base = dict(N=8, K=4, dim=16, heads=2, depth=2, context=96, steps=4, batch=2, lr=2e-3, warmup=2,
                eval_every=2, eval_windows=4, eval_k=None, cache=None, threads=1)
    return argparse.Namespace(**{**base, **kw})


def test_cached_windows_equal_the_generator_and_are_reused(tmp_path):
    ds = SyntheticWindows(make_task('depo1_mini', N=8, K=4), 96, 5, seed=3)
    data = canon_probe.cached_windows(ds, tmp_path)
    for i in range(ds.size):
        for key, value in ds[i].items():
            assert torch.equal(data[key][i].long(), value), key
    files = list(tmp_path.iterdir())
    assert len(files) == 1 and 'seed3_n5' in files[0].name
    files[0].write_bytes(b'')                     # a second call must read the file, not regenerate
    with pytest.raises(Exception):
        canon_probe.cached_windows(ds, tmp_path)


def test_cached_and_streamed_batches_agree(tmp_path):
    ds = SyntheticWindows(make_task('copy', N=6), 14, 6, seed=0)
    streamed = list(canon_probe.train_batches(ds, 4, None))
    cached = list(canon_probe.train_batches(ds, 4, tmp_path))
    assert [b['input'].shape for b in cached] == [(4, 14), (2, 14)]
    for a, b in zip(streamed, cached):
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_depo_run_records_setting_and_per_k_accuracy(tmp_path, one_thread):
    res = canon_probe.run('depo', 'NoPE+Canon', canon_probe.VARIANTS['depo']['NoPE+Canon'], 0,
                          _args(eval_k=[4, 2, 1], cache=tmp_path))
    assert set(res['final']) == {'token_acc', 'acc_k1', 'acc_k2', 'acc_k4'}
    assert [c[0] for c in res['curve']] == [2, 4]
    assert res['model_args'] == dict(dim=16, depth=2, num_heads=2, rope_dim=0, canon='ABCD')
    assert res['context'] == 96 and res['batch'] == 2 and len(res['load']) == 2
    json.dumps(res)                               # one JSON line per run


def test_table_groups_by_setting_with_t_interval(tmp_path):
    def rec(seed, acc, dim=64):
        return dict(task='depo', N=16, K=4, variant='RoPE', seed=seed, steps=100, batch=16, lr=3e-3, context=256,
                    model_args=dict(dim=dim, depth=2, num_heads=2), params=10, final={'acc_k4': acc})
    rows = [rec(0, 0.1), rec(1, 0.2), rec(2, 0.3), rec(0, 0.5, dim=32)]
    path = tmp_path / 'runs.jsonl'
    path.write_text(''.join(json.dumps(r) + '\n' for r in rows))
    lines = canon_probe.table(path).splitlines()[2:]
    assert len(lines) == 2                        # d64 (3 seeds) and d32 (1 seed) are separate rows
    d64 = next(line for line in lines if 'd64' in line).split(' | ')
    assert d64[7:11] == ['0,1,2', 'acc_k4', '20.0', '±24.8']     # 10 * t(0.975, 2) / sqrt(3) = 24.8
    assert 'T256 B16 lr0.003' in d64[4]
