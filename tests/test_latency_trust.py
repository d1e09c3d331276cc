"""Latency that can be trusted (issue 43, item 7): ONNX Runtime sessions that do not spin, the one rejection rule
(``zoo.eval.bench.untrusted``: load per CPU above 0.25 or IQR/median above 0.15), the re-take loop of
``remeasure``, ``max_abs_delta`` on every record, and ``pick_latency``/``data()`` never publishing an untrusted one.
Every answer is computed by hand from synthetic records; no time is asserted."""
from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch

import zoo
from zoo.eval import bench
from zoo.eval import profile
from zoo.eval import results as R
from zoo.eval.profile import Latency

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def real_limits(tmp_path, monkeypatch):
    """The rule's own limits (the suite turns them off in conftest.py) and a results database of the test's own."""
    monkeypatch.delenv('ZOO_BUSY_LOAD', raising=False)
    monkeypatch.delenv('ZOO_MAX_IQR_RATIO', raising=False)
    monkeypatch.setenv('ZOO_DB', str(tmp_path / 'results.db'))
    yield
    R.close_all()


def _rec(**kw):
    """A quiet record: load 0.2 on 2 CPUs (0.1 per CPU) before and after, IQR 1 ms of a 10 ms median (0.10)."""
    return {'median_ms': 10.0, 'iqr_ms': 1.0, 'load_1m': 0.2, 'load_1m_after': 0.2, 'cpus': 2, 'threads': 1,
            'duration_s': 2.0, **kw}


# ------------------------------------------------------------------------------------------------------ the rule
def test_the_rule_on_load_and_spread():
    assert bench.untrusted(_rec()) is None
    busy = bench.untrusted(_rec(load_1m=0.6))                       # 0.6 / 2 = 0.30 per CPU > 0.25
    assert busy.startswith('busy:') and 'load 0.30 per CPU before timing' in busy and 'IQR/median 0.10' in busy
    noisy = bench.untrusted(_rec(iqr_ms=1.6))                       # 1.6 / 10 = 0.16 > 0.15
    assert noisy.startswith('noisy:') and 'IQR/median 0.16' in noisy and 'load 0.10 per CPU' in noisy
    assert bench.untrusted(_rec(iqr_ms=1.4)) is None                # 0.14 at 0.1 per CPU
    assert bench.untrusted(_rec(load_1m=0.6, iqr_ms=1.6)).startswith('busy and noisy:')
    # exactly at a limit is trusted; just above is not
    assert bench.untrusted(_rec(load_1m=0.5, iqr_ms=1.5)) is None   # 0.25 per CPU, IQR/median 0.15
    assert bench.untrusted(_rec(load_1m=0.52)) is not None          # 0.26
    assert bench.untrusted(_rec(iqr_ms=1.51)) is not None           # 0.151
    # a figure nobody recorded (a record older than schema 4) cannot count against it; a NaN is no figure
    assert bench.untrusted({'median_ms': 2.5}) is None
    assert bench.untrusted(_rec(load_1m=float('nan'), cpus=None, iqr_ms=None)) is None


def test_the_load_after_timing_is_counted_less_the_timings_own_threads():
    # one thread busy for 60 s adds 1 - e^-1 = 0.632 to the 1-minute load: 1.0 after is (1.0 - 0.632) / 2 = 0.18
    assert bench.own_load(1, 60.0) == pytest.approx(1 - math.exp(-1))
    assert bench.untrusted(_rec(load_1m_after=1.0, duration_s=60.0)) is None
    # for 6 s it adds 1 - e^-0.1 = 0.095: (1.0 - 0.095) / 2 = 0.45 per CPU, someone else was running
    reason = bench.untrusted(_rec(load_1m_after=1.0, duration_s=6.0))
    assert reason.startswith('busy:') and '0.45 after' in reason
    assert bench.own_load(None, 5.0) == bench.own_load(2, None) == 0.0


def test_the_limits_can_be_set_for_a_machine_nobody_publishes_from(monkeypatch):
    monkeypatch.setenv('ZOO_BUSY_LOAD', 'inf')
    assert bench.untrusted(_rec(load_1m=6.0)) is None
    assert bench.untrusted(_rec(iqr_ms=1.6)) is not None            # the other limit still holds
    monkeypatch.setenv('ZOO_MAX_IQR_RATIO', 'lots')
    with pytest.raises(ValueError, match=r"\$ZOO_MAX_IQR_RATIO must be a number .* got 'lots'"):
        bench.untrusted(_rec())


def test_waiting_for_the_load_to_fall_is_bounded(monkeypatch):
    loads, slept = iter([2.0, 2.0, 0.2, 0.2]), []
    monkeypatch.setattr(profile, 'load_average', lambda: next(loads))
    monkeypatch.setattr(bench.os, 'cpu_count', lambda: 2)
    assert bench.wait_for_quiet(slept.append) == pytest.approx(0.1) and slept == [bench.QUIET_POLL_S] * 2
    slept.clear()
    monkeypatch.setattr(profile, 'load_average', lambda: 2.0)       # it never falls: three polls, then on
    assert bench.wait_for_quiet(slept.append, limit_s=3 * bench.QUIET_POLL_S) == 1.0 and len(slept) == 3


# -------------------------------------------------------------------------------------------- the re-take loop
def _recorded(db):
    """A finished run of metaformer_tiny on 1x16x16 digits, with the network spec zoo systems record."""
    net = zoo.create('metaformer_tiny', token_mixer='pooling', num_classes=10, in_chans=1)
    spec = {'name': 'metaformer_tiny', 'kwargs': {'token_mixer': 'pooling', 'num_classes': 10, 'in_chans': 1},
            'input_size': [1, 16, 16]}
    rid = db.start_run('metaformer_tiny', task='classification', dataset='digits', seed=0,
                       arch_fingerprint=R.fingerprint(net), hparams={'network': spec})
    db.log_metrics(rid, {'val/acc1': 0.9}, final=True)
    db.finish_run(rid)
    return rid, R.fingerprint(net)


def _fake_timer(spreads):
    """``profile.benchmark`` giving each call's records the next IQR/median of ``spreads`` (at load 0.1 per CPU):
    times [1, 1, 1+s, 1+s] have median 1 + s/2 and IQR s."""
    calls = []

    def timer(models, batch_size=1, **_):
        s = spreads[min(len(calls), len(spreads) - 1)]
        calls.append(sorted(models))
        return {k: Latency(k, batch_size, (1, 16, 16), threads=1, load_1m=0.2, load_1m_after=0.2, cpus=2,
                           duration_s=1.0, times_ms=[1.0, 1.0, 1.0 + s, 1.0 + s]) for k in models}
    return timer, calls


@pytest.mark.parametrize('spreads, rows_expected', [((2.0, 0.0), 1), ((2.0,), 0)])
def test_an_untrusted_record_is_timed_again_and_never_published(monkeypatch, spreads, rows_expected):
    db = R.open_db()
    _, fp = _recorded(db)
    timer, calls = _fake_timer(spreads)
    monkeypatch.setattr(bench, 'benchmark', timer)
    monkeypatch.setattr(profile, 'load_average', lambda: 0.0)
    slept, failures, warned = [], [], []
    rows = bench.remeasure(db, failures=failures, warn=warned.append, sleep=slept.append, attempts=3)
    assert not slept                                                # quiet: no waiting
    if rows_expected:          # noisy (IQR 2 of a 2 ms median: 1.0), then quiet: one row after two attempts
        assert len(calls) == 2 and len(rows) == 1 and not failures
        assert rows[0]['iqr_ms'] == 0.0 and rows[0]['max_abs_delta'] == 0.0 and rows[0]['arch_fingerprint'] == fp
    else:                      # noisy at every attempt: a failure, no row
        assert len(calls) == 3 and rows == []
        (f,) = failures
        assert (f['runtime'], f['batch_size'], f['arch_fingerprint']) == ('eager', 1, fp)
        assert f['error'].startswith('untrusted: noisy: ') and 'IQR/median 1.00' in f['error']
        assert 'load 0.10 per CPU' in f['error'] and '(3 attempts)' in f['error']
        assert any('untrusted' in w for w in warned)
        assert bench.record(rows, db=db, failures=failures) == 0
        assert db.latency().empty and db.latency_failures().error.str.startswith('untrusted:').all()


# ------------------------------------------------------------------------------------------- max |delta| from eager
def test_every_record_keeps_its_max_abs_delta_from_eager(monkeypatch, one_thread):
    monkeypatch.setenv('ZOO_BUSY_LOAD', 'inf')         # real timings on a shared machine: only delta is tested here
    monkeypatch.setenv('ZOO_MAX_IQR_RATIO', 'inf')
    db = R.open_db()
    rid, fp = _recorded(db)
    rows = bench.remeasure(db, runtimes=('eager', 'onnxruntime'), repeats=2, warmup=1, budget_s=0, threads=1)
    delta = {r['runtime']: r['max_abs_delta'] for r in rows}
    assert delta['eager'] == 0.0
    assert isinstance(delta['onnxruntime'], float) and 0.0 <= delta['onnxruntime'] < 1e-3
    assert bench.record(rows, db=db) == 2
    stored = dict(zip(db.latency().runtime, db.latency().max_abs_delta))
    assert stored == pytest.approx(delta)
    df = R.data(db=db)
    assert df.latency_onnxruntime_delta.tolist() == pytest.approx([delta['onnxruntime']])
    assert df.latency_eager_delta.tolist() == [0.0] and df.latency_eager_b16_delta.isna().all()
    # zoo bench of a model by name: its eager float32 rows are the reference themselves
    (row,) = bench.run(['metaformer_tiny'], repeats=2, warmup=1, budget_s=0)
    assert row['max_abs_delta'] == 0.0


def test_ort_sessions_do_not_spin():
    net = zoo.optimize(torch.nn.Linear(4, 3).eval(), 'onnxruntime', torch.randn(2, 4))
    opts = net.session.get_session_options()
    assert opts.get_session_config_entry('session.intra_op.allow_spinning') == '0'
    assert opts.get_session_config_entry('session.inter_op.allow_spinning') == '0'


# ----------------------------------------------------------------------------------------------- what is published
def test_pick_latency_and_data_skip_untrusted_records():
    db = R.open_db()
    rid, fp = _recorded(db)
    kw = dict(input_shape='1x16x16', batch_size=1, arch_fingerprint=fp, threads=1, cpus=2, repeats=50)
    db.add_latency('metaformer_tiny', 1.0, source='bench', load_1m=1.0, iqr_ms=0.05, **kw)    # 0.5 per CPU
    db.add_latency('metaformer_tiny', 1.1, source='bench', load_1m=0.1, iqr_ms=0.3, **kw)     # IQR/median 0.27
    quiet = db.add_latency('metaformer_tiny', 1.4, source='fit', run_id=rid, load_1m=0.3, iqr_ms=0.14, **kw)
    db.add_latency('metaformer_tiny', 2.0, source='bench', load_1m=0.2, iqr_ms=0.1, runtime='onnxruntime',
                   max_abs_delta=3e-6, **{**kw, 'batch_size': 16})
    lat = db.latency()
    assert R.pick_latency(lat[lat.batch_size == 1])['id'] == quiet   # bench records come first, but both are untrusted
    row = R.data(db=db).iloc[0]
    assert (row.latency_eager_ms, row.latency_eager_iqr_ms, row.latency_eager_load, row.latency_eager_delta) == (
        1.4, 0.14, 0.15, 0.0)
    assert (row.latency_onnxruntime_b16_ms, row.latency_onnxruntime_b16_iqr_ms, row.latency_onnxruntime_b16_load,
            row.latency_onnxruntime_b16_delta) == (2.0, 0.1, 0.1, 3e-6)
    cols = list(R.data(db=db).columns)   # each record's figures beside its median
    i = cols.index('latency_onnxruntime_b16_ms')
    assert cols[i:i + 4] == ['latency_onnxruntime_b16_ms', 'latency_onnxruntime_b16_iqr_ms',
                             'latency_onnxruntime_b16_load', 'latency_onnxruntime_b16_delta']
    assert R.pick_latency(lat[(lat.batch_size == 1) & (lat.id != quiet)]) is None   # never a loaded one instead


def test_the_committed_benchmark_database_opens_with_the_new_column(tmp_path):
    db_path = tmp_path / 'paper_blocks.db'
    shutil.copyfile(ROOT / 'benchmarks' / 'paper_blocks.db', db_path)     # the committed file stays as it is
    db = R.open_db(str(db_path))
    assert db.schema_version() == R.SCHEMA_VERSION == 8
    lat = db.latency()
    old = lat[lat.measured_at.astype(str) < '2026-12-01']                # taken before schema 7 existed
    assert len(old) and old.max_abs_delta.isna().all()                    # nobody compared the old records
    new = lat[(lat.measured_at.astype(str) >= '2026-12-01') & (lat.source == 'bench')]
    assert len(new) and new.max_abs_delta.notna().all()                   # every zoo bench record since has it
    assert 'latency_eager_delta' in R.data(db=db).columns
