"""``zoo bench`` and the latency protocol: time-bounded interleaved timing, token ids for language models,
and the re-measurement of every network of a results database (``zoo bench --db URL`` without names).
No wall-clock figure is asserted: only counts, shapes, dtypes and what gets recorded."""
from __future__ import annotations

import time

import pytest
import torch

import zoo
from zoo.eval import bench
from zoo.eval import results as R
from zoo.eval.profile import benchmark, example_input, interleave
from zoo.recipes.main import main


pytestmark = pytest.mark.usefixtures('zoo_db')  # conftest: a results database per test


def test_interleave_repeats_budget_and_cap():
    calls = []
    fns = {'a': lambda: calls.append('a'), 'b': lambda: calls.append('b')}
    t = interleave(fns, repeats=4, warmup=2, settle=0)             # no budget: exactly 4 rounds after 2 warm-ups
    assert [len(v) for v in t.values()] == [4, 4] and calls[:4] == ['a', 'b', 'a', 'b'] and len(calls) == 12
    calls.clear()                                                  # several functions: one settling call before each
    t = interleave(fns, repeats=2, warmup=0)
    assert [len(v) for v in t.values()] == [2, 2] and calls == ['a', 'a', 'b', 'b'] * 2
    calls.clear()
    interleave({'a': fns['a']}, repeats=3, warmup=0)               # alone: nothing to settle from
    assert calls == ['a'] * 3
    t = interleave(fns, repeats=3, warmup=0, budget_s=60.0, max_repeats=50)   # budget left: up to the cap
    assert [len(v) for v in t.values()] == [50, 50]
    slow = {'s': lambda: time.sleep(0.02)}                         # each round outlasts the budget: the minimum
    assert len(interleave(slow, repeats=3, warmup=0, budget_s=0.001, max_repeats=50)['s']) == 3


def test_a_latency_records_its_protocol_and_the_load():
    lat = benchmark({'lin': torch.nn.Linear(8, 2)}, input_size=(8,), repeats=5, warmup=2)['lin'].as_dict()
    assert lat['repeats'] == 5 and lat['warmup'] == 2 and lat['input_size'] == (8,)
    assert lat['load_1m'] is not None and lat['load_1m_after'] is not None and lat['cpus'] >= 1
    assert lat['duration_s'] > 0 and lat['iqr_ms'] >= 0


def test_language_models_get_token_ids():
    """issue 15: `zoo bench llama_tiny` fed images to a language model (a (1, 32) float tensor)."""
    net = zoo.create('llama_tiny')
    x = example_input(net, (32,), 3, 'language_modeling')
    assert x.shape == (3, 32) and x.dtype == torch.long and 0 <= int(x.min()) and int(x.max()) < net.vocab_size
    assert example_input(net, (32,), 1).dtype == torch.long         # told apart by its vocab_size, too
    assert example_input(torch.nn.Conv2d(3, 4, 3), (3, 8, 8), 2).dtype == torch.float32
    rows = bench.run(['llama_tiny', 'mamba2_tiny'], repeats=2, warmup=1, budget_s=0)
    assert [r['input_size'] for r in rows] == [(32,), (32,)] and all(r['macs'] > 0 for r in rows)
    assert main(['bench', 'llama_tiny', '--repeats', '2', '--warmup', '1', '--time', '0']) == 0


def _record(db, mixer, seed, size=(1, 16, 16), latency=True):
    """A finished run as a zoo system records it: its network spec (name, creation arguments, input size)."""
    net = zoo.create('metaformer_tiny', token_mixer=mixer, num_classes=10, in_chans=1)
    fp = R.fingerprint(net)
    spec = {'name': 'metaformer_tiny', 'kwargs': {'token_mixer': mixer, 'num_classes': 10, 'in_chans': 1},
            'input_size': list(size)}
    rid = db.start_run('metaformer_tiny', task='classification', dataset='digits', seed=seed, arch_fingerprint=fp,
                       hparams={'name': 'metaformer_tiny', 'model_args': {'token_mixer': mixer}, 'network': spec},
                       block_choices={'token_mixer': mixer})
    db.log_metrics(rid, {'val/acc1': 0.9}, final=True)
    db.finish_run(rid)
    if latency:
        db.add_latency('metaformer_tiny', 50.0, input_shape='x'.join(map(str, size)), batch_size=1, run_id=rid,
                       arch_fingerprint=fp, source='fit', load_1m=6.0, cpus=2, threads=1)
    return rid, fp


def test_bench_db_remeasures_every_recorded_network(zoo_db, capsys):
    db = R.open_db()
    _, fp_pool = _record(db, 'pooling', 0)
    _record(db, 'pooling', 1)                                        # a second seed: same network, measured once
    _, fp_attn = _record(db, 'attention', 0)
    _, fp_id = _record(db, 'identity', 0, size=(1, 12, 12), latency=False)  # recorded with ZOO_RECORD_LATENCY=0
    rid = db.start_run('metaformer_tiny', task='classification', dataset='digits', arch_fingerprint='0' * 16,
                       hparams={'network': {'name': 'metaformer_tiny', 'kwargs': {'token_mixer': 'raft'}}})
    db.log_metrics(rid, {'val/acc1': 0.5}, final=True)   # its spec does not build the recorded network
    db.finish_run(rid)
    old = db.start_run('metaformer_tiny', task='classification', dataset='digits', arch_fingerprint='1' * 16)
    db.log_metrics(old, {'val/acc1': 0.5}, final=True)  # recorded without a spec (before systems recorded one)
    db.finish_run(old)
    assert main(['bench', '--db', str(zoo_db), '--repeats', '2', '--warmup', '1', '--time', '0', '--threads', '1']) == 0
    err = capsys.readouterr().err
    assert 'skipped metaformer_tiny (run 5)' in err and 'not the recorded network' in err and '3 latency rows' in err
    assert 'skipped metaformer_tiny (run 6): it recorded no network spec' in err
    new = R.latency(source='bench').set_index('arch_fingerprint')
    assert sorted(new.index) == sorted([fp_pool, fp_attn, fp_id])
    # the shape the runs trained at: the one their spec records
    assert new.input_shape.to_dict() == {fp_pool: '1x16x16', fp_attn: '1x16x16', fp_id: '1x12x12'}
    assert (new.threads == 1).all() and new.load_1m.notna().all() and (new.repeats == 2).all()
    board = R.leaderboard('classification', 'digits', threads=1).set_index('model_args')
    assert board.loc['token_mixer=pooling'].latency_source == 'bench'
    assert board.loc['token_mixer=attention'].latency_id in set(new.id)
    # filters, and a clear line when nothing matches or nothing is named
    assert main(['bench', '--db', str(zoo_db), '--dataset', 'cifar10', '--time', '0']) == 2
    assert 'no finished run' in capsys.readouterr().err
    assert main(['bench']) == 2 and 'name the models' in capsys.readouterr().err
    assert main(['bench', 'poolformer_tiny', '--dataset', 'digits']) == 2
    assert main(['bench', '--db', str(zoo_db.parent / 'missing.db')]) == 2
    assert not (zoo_db.parent / 'missing.db').exists()


def test_bench_db_measures_the_recorded_networks_in_other_runtimes(zoo_db, capsys):
    """``zoo bench --db`` takes ``--runtime`` and ``--batch-size`` (it refused them: from the command line a board
    of ``zoo results --runtime onnxruntime`` could not get a latency, and it showed the column blank without a
    word; now it says which command fills it)."""
    db = R.open_db()
    _, fp = _record(db, 'pooling', 0, latency=False)
    assert main(['results', '--runtime', 'onnxruntime']) == 0
    out, err = capsys.readouterr()
    assert 'no onnxruntime latency recorded for the classification runs' in err
    assert f'`zoo bench --db {zoo_db} --runtime onnxruntime`' in err     # a command that runs as it is
    assert main(['bench', '--db', str(zoo_db), '--runtime', 'eager,onnxruntime', '--batch-size', '1', '2',
                 '--repeats', '2', '--warmup', '1', '--time', '0', '--threads', '1']) == 0
    out, err = capsys.readouterr()
    assert '4 latency rows' in err and 'onnxruntime' in out             # the table has a runtime column
    new = R.latency(source='bench')
    assert sorted(zip(new.runtime, new.batch_size)) == [('eager', 1), ('eager', 2), ('onnxruntime', 1),
                                                        ('onnxruntime', 2)]
    assert (new.arch_fingerprint == fp).all() and (new.input_shape == '1x16x16').all()
    board = R.leaderboard('classification', 'digits', threads=1, runtime='onnxruntime')
    assert board.latency_runtime.tolist() == ['onnxruntime'] and board.latency_ms.notna().all()
    assert main(['results', '--runtime', 'onnxruntime']) == 0 and 'no onnxruntime latency' not in capsys.readouterr().err
    assert main(['bench', '--db', str(zoo_db), '--dtype', 'bfloat16']) == 2
    assert '--vs/--img-size/--num-classes/--dtype/--mode/--device need model names' in capsys.readouterr().err


def test_a_busy_or_noisy_measurement_is_flagged(capsys, monkeypatch):
    """The table alone let a figure taken under load, or on a host whose other guests steal the cores (no trace in
    the load average, only in the spread), pass for a quiet one: ``zoo bench`` now says so in one line."""
    quiet = {'model': 'a', 'label': 'a [eager]', 'batch_size': 1, 'median_ms': 10.0, 'iqr_ms': 0.5, 'load_1m': 0.3,
             'cpus': 2}
    assert bench.noise_warning([quiet]) is None
    spread = {**quiet, 'label': 'b [compile]', 'batch_size': 16, 'iqr_ms': 2.3}
    line = bench.noise_warning([quiet, spread])
    assert 'IQR above 10% of the median in 1 of 2 rows (largest 23%: b [compile], batch 16)' in line
    assert 'load' not in line and 'quiet machine' in line
    busy = bench.noise_warning([{**quiet, 'load_1m': 1.5}])
    assert '1-minute load 1.50 on 2 CPUs before timing' in busy and 'IQR' not in busy
    rows = [{**quiet, 'params': 1, 'macs': 1, 'input_size': (8,), 'threads': 1, 'repeats': 2, 'throughput': 1.0}]
    monkeypatch.setattr(bench, 'run', lambda *a, **k: [{**rows[0], 'iqr_ms': 5.0}])
    assert main(['bench', 'poolformer_tiny']) == 0
    assert 'zoo bench: a busy or noisy machine' in capsys.readouterr().err

    # The load that counts is the one when the command started: compiling and exporting (25 s of two threads for
    # RaftMLP-S) raised the load before timing to 0.81 on a quiet machine, and every compiled bench was "busy".
    from zoo.eval import profile
    monkeypatch.setattr(bench, 'run', lambda *a, **k: [{**rows[0], 'load_1m': 0.81}])
    for start, busy in ((0.2, False), (0.9, True)):
        monkeypatch.setattr(profile, 'load_average', lambda: start)
        assert main(['bench', 'poolformer_tiny']) == 0
        out = capsys.readouterr()
        assert ('1-minute load 0.90 on 2 CPUs when it started' in out.err) == busy, out.err
        assert f'load {start:.2f} on 2 CPUs at the start, 0.81 before timing' in out.out


def test_the_after_training_record_feeds_token_ids_to_a_language_model():
    """The recording logger takes one sample's shape like ``zoo bench``: (context,) token ids for a language model
    (the data module's context length), an image for the rest, the registry's without a data module."""
    from types import SimpleNamespace

    from zoo.recipes.recording import ResultsLogger

    size = ResultsLogger._input_size
    lm = SimpleNamespace(model_name='llama_tiny', task=None)
    assert size(SimpleNamespace(datamodule=SimpleNamespace(context_length=130)), lm) == (130,)
    assert size(SimpleNamespace(datamodule=None), lm) == tuple(zoo.model_info('llama_tiny').input_size)
    img = SimpleNamespace(model_name='poolformer_tiny', task=None)
    assert size(SimpleNamespace(datamodule=SimpleNamespace(img_size=16, in_chans=1)), img) == (1, 16, 16)




def test_runtimes_of_a_dense_model_are_compared_on_its_network_maps():
    """A detector's output after NMS can be empty (random weights) or differ in count, which made bench's max |Δ|
    column 0 or blank for detectors: runtimes are compared on the network's maps instead."""
    model = zoo.create('yolo_det_tiny').eval()
    x = example_input(model, (3, 64, 64), 1)
    _, out, _ = bench._prepare(model, 'eager', x, torch.bfloat16, None)      # autocast: a real difference
    with torch.no_grad():
        raw = model.forward_raw(x)
    assert isinstance(out, (list, tuple)) and [o.shape for o in out] == [r.shape for r in raw]
    assert 0 < bench._max_diff(out, raw) < 1
