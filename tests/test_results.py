"""The results database: schema and migrations, bad input, crash detection, concurrency, fingerprints,
queries, leaderboard, Pareto plot, the CLI, and the Lightning recording callback."""
from __future__ import annotations

import json
import os
import socket
import time
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa
import torch

from zoo.recipes.main import main
from zoo.eval import results as R

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def zoo_db(tmp_path, monkeypatch):
    """Every test gets its own database file; nothing is written into the checkout."""
    path = tmp_path / 'results.db'
    monkeypatch.setenv('ZOO_DB', str(path))
    monkeypatch.setenv('ZOO_RECORD_LATENCY', '1')
    yield path
    R.close_all()


def _describe(engine) -> dict:
    insp = sa.inspect(engine)
    return {t: (sorted((c['name'], str(c['type']), c['nullable']) for c in insp.get_columns(t)),
                sorted(i['name'] for i in insp.get_indexes(t)),
                sorted((tuple(f['constrained_columns']), f['referred_table'], f['options'].get('ondelete'))
                       for f in insp.get_foreign_keys(t)))
            for t in insp.get_table_names()}


def _run(db, model='net_a', acc=0.9, seed=0, status='finished', dataset='digits', **kw):
    rid = db.start_run(model, task='classification', dataset=dataset, seed=seed, hparams={'lr': 0.01}, **kw)
    db.log_metrics(rid, {'val/acc1': acc - 0.1, 'train/loss': 1.0}, epoch=0)
    db.log_metrics(rid, {'val/acc1': acc}, final=True)
    db.finish_run(rid, status)
    return rid


# ----------------------------------------------------------------------------------------- schema, migrations
def test_fresh_schema_equals_the_declared_tables(zoo_db, tmp_path):
    db = R.open_db()
    assert db.schema_version() == R.SCHEMA_VERSION
    reference = sa.create_engine(f'sqlite:///{tmp_path / "reference.db"}')
    R.metadata.create_all(reference)
    assert _describe(db.engine) == _describe(reference)     # the migration path builds exactly the declared schema


@pytest.mark.parametrize('version', range(1, R.SCHEMA_VERSION))
def test_an_older_file_is_migrated_and_keeps_its_rows(zoo_db, version):
    from alembic.migration import MigrationContext
    from alembic.operations import Operations

    engine = sa.create_engine(f'sqlite:///{zoo_db}')
    with engine.begin() as conn:            # a store written by an earlier release
        R.schema_table.create(conn)
        op = Operations(MigrationContext.configure(conn))
        for migration in R.MIGRATIONS[:version]:
            migration(op)
        conn.execute(R.schema_table.insert().values(id=1, version=version, updated_at=R.utcnow()))
        conn.exec_driver_sql("INSERT INTO zoo_runs (uid, model, status, started_at, seed, heartbeat_at, host, pid) "
                             "VALUES ('old', 'net_old', 'finished', '2026-01-01 00:00:00', 3, "
                             "'2026-01-01 00:00:00', 'elsewhere', 1)")
        conn.exec_driver_sql("INSERT INTO zoo_runs (uid, model, status, started_at, heartbeat_at, host, pid) "
                             "VALUES ('live', 'net_live', 'running', :t, :t, 'elsewhere', 1)",
                             {'t': str(R.utcnow() - __import__('datetime').timedelta(hours=1))})
        conn.exec_driver_sql("INSERT INTO zoo_metrics (run_id, name, value, final) VALUES (1, 'val/acc1', 0.5, 1)")
        conn.exec_driver_sql("INSERT INTO zoo_latency (model, input_shape, batch_size, device, median_ms, "
                             "measured_at) VALUES ('net_old', '3x8x8', 1, 'cpu', 2.5, '2026-01-01 00:00:00')")
        if version >= 5:         # a release with schema 5 wrote these; the migration to 5 fills them in older rows
            conn.exec_driver_sql("UPDATE zoo_latency SET runtime = 'eager', dtype = 'float32', cpu_model = 'unknown'")
    cols = [c['name'] for c in sa.inspect(engine).get_columns('zoo_runs')]
    assert ('heartbeat_s' in cols) == (version >= 3) and ('arch_fingerprint' in cols) == (version >= 2)
    lat_cols = [c['name'] for c in sa.inspect(engine).get_columns('zoo_latency')]
    assert ('source' in lat_cols) == (version >= 4) and ('runtime' in lat_cols) == (version >= 5)
    assert ('zoo_latency_failures' in sa.inspect(engine).get_table_names()) == (version >= 6)
    assert ('max_abs_delta' in lat_cols) == (version >= 7) and 'gpu_name' not in lat_cols   # 7's and 8's
    engine.dispose()

    db = R.open_db()
    assert db.schema_version() == R.SCHEMA_VERSION == 8
    reference = sa.create_engine(f'sqlite:///{zoo_db.parent / "reference.db"}')
    R.metadata.create_all(reference)
    assert _describe(db.engine) == _describe(reference)
    old = db.runs(model='net_old')
    assert old.seed.tolist() == [3] and old['val/acc1'].tolist() == [0.5] and old.heartbeat_s.isna().all()
    old_lat = db.latency(model='net_old')
    assert old_lat.median_ms.tolist() == [2.5] and old_lat.source.isna().all() and old_lat.load_1m.isna().all()
    assert (old_lat.runtime.tolist(), old_lat.dtype.tolist(), old_lat.cpu_model.tolist()) == (
        ['eager'], ['float32'], ['unknown'])
    # the old latency row still serves the leaderboard, marked as having no recorded conditions
    row = R.leaderboard(db=db).iloc[0]
    assert (row.latency_ms, row.latency_source, row.latency_load) == (2.5, 'unrecorded', None)
    # a run from before the heartbeat interval existed keeps the 24 h rule: one hour of silence is not a crash
    assert db.runs(model='net_live').status.tolist() == ['running']
    rid = db.start_run('net_new', arch_fingerprint='abc', study_name='s', trial_number=0, heartbeat_s=30.0)
    assert db.runs(id=rid)[['study_name', 'heartbeat_s']].values.tolist() == [['s', 30.0]]


def test_a_newer_schema_is_refused_and_left_untouched(zoo_db):
    R.open_db()
    R.close_all()
    engine = sa.create_engine(f'sqlite:///{zoo_db}')
    with engine.begin() as conn:
        conn.execute(R.schema_table.update().values(version=R.SCHEMA_VERSION + 1))
    engine.dispose()
    before = zoo_db.read_bytes()
    with pytest.raises(R.ResultsDBError, match='newer than this zoo'):
        R.ResultsDB(str(zoo_db))
    assert zoo_db.read_bytes() == before


def test_a_file_that_is_not_a_database_is_a_clear_error_and_kept(zoo_db):
    zoo_db.write_bytes(b'my thesis notes, not a database\n' * 200)
    before = zoo_db.read_bytes()
    with pytest.raises(R.ResultsDBError, match='not a SQLite database'):
        R.ResultsDB(str(zoo_db))
    assert zoo_db.read_bytes() == before
    assert main(['results', '--db', str(zoo_db)]) == 2


def test_a_corrupt_database_file_is_a_clear_error_and_kept(zoo_db):
    db = R.ResultsDB(str(zoo_db))
    _run(db)
    db.close()
    data = bytearray(zoo_db.read_bytes())
    data[120:400] = bytes(range(256)) + bytes(24)          # the schema page, overwritten past the 100-byte header
    data[4096:8192] = b'\xff' * 4096
    zoo_db.write_bytes(bytes(data))
    with pytest.raises(R.ResultsDBError, match='not a SQLite database \\(or it is corrupt\\).*left untouched'):
        R.ResultsDB(str(zoo_db))
    assert zoo_db.read_bytes() == bytes(data)


def test_an_unreachable_server_is_a_clear_error():
    with pytest.raises(R.ResultsDBError, match='cannot open results database'):
        R.ResultsDB('postgresql+psycopg://zoo:secret@127.0.0.1:9/zoo?connect_timeout=2')
    with pytest.raises(R.ResultsDBError, match='cannot use results database URL'):
        R.ResultsDB('nosuchdialect://x/y')


def test_unknown_columns_and_fields_are_clear_errors():
    db = R.open_db()
    _run(db)
    with pytest.raises(R.ResultsDBError, match="unknown column 'colour'"):
        R.runs(colour='red')
    with pytest.raises(R.ResultsDBError, match=r"unknown column\(s\) \['nope'\]"):
        R.runs(columns=['model', 'nope'])
    with pytest.raises(R.ResultsDBError, match='unknown run field'):
        db.start_run('x', colour='red')
    with pytest.raises(R.ResultsDBError, match='unknown status'):
        db.finish_run(1, 'exploded')
    assert R.runs(columns=['model', 'val/acc1']).values.tolist() == [['net_a', 0.9]]


def test_disabled_store():
    assert R.resolve_url('none') is None
    with pytest.raises(R.ResultsDBError, match='disabled'):
        R.open_db('none')


# ------------------------------------------------------------------------------------- statuses, crash, concurrency
def test_failed_and_pruned_runs_are_kept():
    db = R.open_db()
    for st in ('finished', 'failed', 'pruned'):
        _run(db, status=st)
    df = R.runs()
    assert sorted(df.status) == ['failed', 'finished', 'pruned']
    assert (df.wall_s >= 0).all() and df.ended_at.notna().all()
    board = R.leaderboard('classification', 'digits')
    assert board.run_ids.tolist() == ['1']           # only the finished run ranks; the others stay queryable


def test_a_killed_run_is_marked_crashed_when_the_store_is_next_opened(zoo_db):
    code = ('import os, signal\nfrom zoo.eval import results as R\n'
            'rid = R.open_db().start_run("victim", seed=0)\nprint(rid, flush=True)\nos.kill(os.getpid(), signal.SIGKILL)\n')
    proc = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, 'ZOO_DB': str(zoo_db)})
    assert proc.returncode == -9, proc.stderr
    alive = R.ResultsDB(str(zoo_db)).start_run('alive')      # this process's own run must stay 'running'
    db = R.ResultsDB(str(zoo_db))
    df = db.runs().set_index('model')
    assert df.loc['victim', 'status'] == 'crashed' and df.loc['victim', 'pid'] != os.getpid()
    assert 'killed' in df.loc['victim', 'error']
    assert df.loc['alive', 'status'] == 'running' and alive


def test_a_killed_but_unreaped_process_on_this_host_is_crashed(zoo_db):
    """A SIGKILLed run whose parent died too waits as a zombie until init reaps it (a container's init may never):
    it is dead all the same (``zoo benchmark run`` after a power-cut kill of the runner relies on it)."""
    import signal
    import subprocess
    db = R.open_db()
    proc = subprocess.Popen(['sleep', '60'])
    with open(f'/proc/{proc.pid}/stat') as f:  # the kernel's start time: the store tells a recycled pid by it
        started = f.read().rsplit(')', 1)[1].split()[19]
    db.start_run('zombie', host=socket.gethostname(), pid=proc.pid, proc_start=started)
    os.kill(proc.pid, signal.SIGKILL)
    try:
        for _ in range(100):                   # until the kernel has made it a zombie (not reaped: no wait yet)
            with open(f'/proc/{proc.pid}/stat') as f:
                if f.read().rsplit(')', 1)[1].split()[0] == 'Z':
                    break
            time.sleep(0.05)
        assert db.mark_crashed() == 1
    finally:
        proc.wait()
    assert db.runs().set_index('model').status['zombie'] == 'crashed'


def test_a_run_elsewhere_is_crashed_once_its_heartbeat_is_stale(zoo_db):
    import datetime as dt
    db = R.open_db()
    now = R.utcnow()

    def run(name, host, ago, heartbeat_s, pid=1):
        rid = db.start_run(name, host=host, pid=pid, heartbeat_s=heartbeat_s)
        db.update_run(rid, heartbeat_at=now - ago)
        return rid

    run('stale', 'other-host', dt.timedelta(minutes=6), 60.0)             # 5 beats of 60 s missed
    run('fresh', 'other-host', dt.timedelta(minutes=4), 60.0)
    run('fast_stale', 'other-host', dt.timedelta(minutes=3), 1.0)         # 2 min floor (clock skew) passed
    run('fast_fresh', 'other-host', dt.timedelta(seconds=90), 1.0)
    run('legacy_fresh', 'other-host', dt.timedelta(hours=23), None)       # no interval recorded: 24 h rule
    run('legacy_stale', 'other-host', dt.timedelta(hours=25), None)
    run('here_alive', socket.gethostname(), dt.timedelta(hours=30), 1.0, pid=os.getpid())  # pid decides here
    assert db.mark_crashed() == 3
    status = db.runs().set_index('model').status.to_dict()
    assert status == {'stale': 'crashed', 'fresh': 'running', 'fast_stale': 'crashed', 'fast_fresh': 'running',
                      'legacy_fresh': 'running', 'legacy_stale': 'crashed', 'here_alive': 'running'}
    assert R.ResultsDB.stale_after(60) == dt.timedelta(minutes=5) and R.ResultsDB.stale_after(None) == R.STALE_AFTER


def test_the_heartbeat_thread_refreshes_a_running_run_and_stops(zoo_db, monkeypatch):
    import time
    db = R.open_db()
    rid = db.start_run('beating')
    db.update_run(rid, heartbeat_at=R.utcnow() - __import__('datetime').timedelta(hours=1))
    before = db.runs(id=rid).heartbeat_at.iloc[0]
    hb = db.start_heartbeat(rid, 0.02)
    deadline = time.time() + 30
    while hb.beats < 3 and time.time() < deadline:
        time.sleep(0.01)
    assert hb.beats >= 3 and db.runs(id=rid).heartbeat_s.tolist() == [0.02]
    assert db.runs(id=rid).heartbeat_at.iloc[0] > before
    hb.stop()
    assert not hb._thread.is_alive()
    db.finish_run(rid)
    assert db.heartbeat(rid) is False                 # an ended run is never refreshed again
    monkeypatch.setenv('ZOO_HEARTBEAT_S', 'often')
    with pytest.raises(R.ResultsDBError, match='ZOO_HEARTBEAT_S must be a positive number'):
        db.start_heartbeat(db.start_run('x'))
    with pytest.raises(R.ResultsDBError, match='positive'):
        db.start_heartbeat(db.start_run('y'), 0)


def test_four_processes_recording_at_once_lose_nothing(zoo_db):
    code = ('import sys\nfrom zoo.eval import results as R\ndb = R.open_db()\nw = int(sys.argv[1])\n'
            'for i in range(15):\n'
            '    rid = db.start_run(f"w{w}", seed=i, dataset="digits", task="classification")\n'
            '    db.log_metrics(rid, {"val/acc1": i / 15, "val/loss": 1.0}, epoch=0)\n'
            '    db.log_metrics(rid, {"val/acc1": i / 15}, final=True)\n'
            '    db.add_latency(f"w{w}", 1.0 + i, input_shape=(3, 8, 8), batch_size=1, run_id=rid)\n'
            '    db.finish_run(rid)\n')
    R.open_db()         # create the schema first, so the workers race on rows, not on DDL
    procs = [subprocess.Popen([sys.executable, '-c', code, str(w)], cwd=ROOT, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, 'ZOO_DB': str(zoo_db)}) for w in range(4)]
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read()
    df = R.runs()
    assert len(df) == 60 and (df.status == 'finished').all()
    assert df.groupby('model').size().tolist() == [15] * 4
    assert len(R.metrics()) == 60 * 3 and len(R.latency()) == 60


# ------------------------------------------------------------------------------------------------- fingerprints
def test_fingerprint_recognises_two_names_for_the_same_network():
    import zoo
    with torch.device('meta'):          # shapes only: full-size models cost nothing
        a = zoo.create('poolformer_s12')
        b = zoo.create('metaformer_s12', token_mixer='pooling')
        c = zoo.create('metaformer_s12', token_mixer='identity')
        d = zoo.create('poolformer_s12', num_classes=10)
    assert R.fingerprint(a) == R.fingerprint(b)
    assert len({R.fingerprint(a), R.fingerprint(c), R.fingerprint(d)}) == 3
    db = R.open_db()
    _run(db, 'poolformer_s12', arch_fingerprint=R.fingerprint(a))
    db.add_latency('metaformer_s12', 40.0, input_shape=(3, 224, 224), batch_size=1, arch_fingerprint=R.fingerprint(b))
    assert db.aliases('poolformer_s12') == ['metaformer_s12', 'poolformer_s12']
    board = R.leaderboard('classification', 'digits')
    assert board.latency_ms.tolist() == [40.0] and board.aliases.tolist() == ['metaformer_s12']


# -------------------------------------------------------------------------------------- leaderboard and plots
@pytest.fixture
def fixture_db():
    """Four models, some with several seeds, one failed run, latency for each."""
    db = R.open_db()
    spec = {'fast': ([0.80, 0.82, 0.84], 2.0), 'slow_good': ([0.90, 0.91, 0.92, 0.93], 8.0),
            'slow_bad': ([0.70], 9.0), 'mid': ([0.86, 0.88], 4.0)}
    for model, (accs, lat) in spec.items():
        for seed, acc in enumerate(accs):
            _run(db, model, acc, seed, block_choices={'token_mixer': 'pooling'}, params=1000 * len(model))
        db.add_latency(model, lat, input_shape=(3, 32, 32), batch_size=1, params=1000 * len(model), macs=5_000_000)
        db.add_latency(model, lat * 10, input_shape=(3, 32, 32), batch_size=16)      # not latency: ignored
    _run(db, 'fast', 0.99, 7, status='failed', block_choices={'token_mixer': 'pooling'})
    _run(db, 'fast', 0.5, 0, dataset='cifar10', block_choices={'token_mixer': 'pooling'})
    # a worse configuration of 'mid' (other lr, same blocks): the board keeps the better one
    rid = db.start_run('mid', task='classification', dataset='digits', seed=0, hparams={'lr': 1.0},
                       block_choices={'token_mixer': 'pooling'})
    db.log_metrics(rid, {'val/acc1': 0.1}, final=True)
    db.finish_run(rid)
    return db


def test_leaderboard_best_per_model_with_t_interval_from_three_seeds(fixture_db):
    from scipy import stats

    board = R.leaderboard('classification', 'digits', 'val/acc1')
    assert board.model.tolist() == ['slow_good', 'mid', 'fast', 'slow_bad']
    b = board.set_index('model')
    row = b.loc['slow_good']
    accs = np.array([0.90, 0.91, 0.92, 0.93])
    half = stats.t.ppf(0.975, 3) * accs.std(ddof=1) / 2           # Student-t, 3 degrees of freedom, sqrt(4) = 2
    assert row.n_seeds == 4 and row['mean'] == pytest.approx(0.915) and row.interval_note == ''
    assert (row.ci_low, row.ci_high) == (pytest.approx(0.915 - half), pytest.approx(0.915 + half))
    assert row.iqm == pytest.approx(0.915) and row.latency_ms == 8.0
    # two seeds: no interval (a 95 % interval of two values would be their range), the values instead
    assert b.loc['mid'].ci_low is None and b.loc['mid'].interval_note == 'n=2, too few for an interval'
    assert b.loc['mid']['values'] == '0.86, 0.88'
    assert b.loc['slow_bad'].ci_low is None and b.loc['slow_bad'].interval_note == 'n=1, no interval'
    assert b.loc['fast'].ci_low is not None                                    # three seeds: an interval
    assert b.loc['fast', 'mean'] == pytest.approx(0.82)                         # the failed 0.99 is not counted
    assert R.leaderboard('classification', 'cifar10').model.tolist() == ['fast']
    assert R.leaderboard(model='slow*').model.tolist() == ['slow_good', 'slow_bad']
    with pytest.raises(R.ResultsDBError, match="no final metric 'val/psnr'"):
        R.leaderboard('classification', 'digits', 'val/psnr')
    with pytest.raises(R.ResultsDBError, match="no run has task 'denoising'"):   # said, rather than an empty board
        R.leaderboard('denoising')


def test_leaderboard_rows_per_model_arguments_with_their_budget():
    """MetaFormer with two token mixers is two rows; each shows its epoch budget and the steps it took.
    Within one row the better configuration (here: the better learning rate) is kept."""
    db = R.open_db()

    def run(mixer, acc, seed, lr=0.01, epochs=15, max_steps=-1):
        rid = db.start_run('metaformer_tiny', task='classification', dataset='digits', seed=seed,
                           hparams={'name': 'metaformer_tiny', 'lr': lr, 'model_args': {'token_mixer': mixer}},
                           block_choices={'token_mixer': mixer}, max_epochs=epochs,
                           config={'trainer': {'max_epochs': epochs, 'max_steps': max_steps}})
        db.log_metrics(rid, {'val/acc1': acc}, epoch=epochs - 1, step=epochs * 40)
        db.log_metrics(rid, {'val/acc1': acc}, epoch=epochs - 1, step=epochs * 40, final=True)
        db.finish_run(rid)

    for seed in range(3):
        run('pooling', 0.90 + 0.01 * seed, seed)
        run('attention', 0.93 + 0.01 * seed, seed, epochs=30, max_steps=1000)
        run('attention', 0.50, seed, lr=1.0)                                   # a worse lr: not shown
    board = R.leaderboard('classification', 'digits')
    assert board.model.tolist() == ['metaformer_tiny', 'metaformer_tiny']
    assert board.model_args.tolist() == ['token_mixer=attention', 'token_mixer=pooling']
    assert board.budget.tolist() == ['30 ep / 1000 steps', '15 ep'] and board.steps.tolist() == [1200, 600]
    assert board.n_seeds.tolist() == [3, 3] and board['mean'].tolist() == pytest.approx([0.94, 0.91])
    out = R.format_board(board)
    assert 'token_mixer=attention' in out and '30 ep / 1000 steps' in out and 'Student-t' in out


def _lat(db, model, ms, fp=None, **kw):
    return db.add_latency(model, ms, input_shape=kw.pop('shape', (3, 32, 32)), batch_size=kw.pop('bs', 1),
                          arch_fingerprint=fp, threads=kw.pop('threads', 2), cpus=2, **kw)


def test_leaderboard_uses_the_most_trusted_latency_record():
    """zoo bench before after-training records, then the lowest load per CPU; other fingerprints, batch
    sizes, train-mode and compiled rows never count; the record's IQR travels with it."""
    db = R.open_db()
    rid = _run(db, 'net', 0.9, arch_fingerprint='fp_net')
    _lat(db, 'net', 21.6, 'fp_net', run_id=rid, source='fit', load_1m=0.1, iqr_ms=9.0, repeats=20)
    _lat(db, 'net', 1.50, 'fp_net', source='bench', load_1m=3.0, iqr_ms=0.4, repeats=200)
    best = _lat(db, 'net', 1.13, 'fp_net', source='bench', load_1m=0.4, iqr_ms=0.05, repeats=300)
    _lat(db, 'net', 0.10, 'fp_net', source='bench', load_1m=0.0, bs=16)              # batch 16
    _lat(db, 'net', 0.20, 'fp_net', source='bench', load_1m=0.0, mode='train')       # training step
    _lat(db, 'net', 0.30, 'fp_net', source='bench', load_1m=0.0, compiled=True)      # compiled
    _lat(db, 'net', 0.40, 'fp_other', source='bench', load_1m=0.0)                   # another architecture
    _lat(db, 'net', 0.50, 'fp_net', source='bench', load_1m=0.0, shape=(3, 224, 224))  # not the trained shape
    row = R.leaderboard('classification', 'digits').iloc[0]
    assert (row.latency_id, row.latency_ms, row.latency_iqr_ms) == (best, 1.13, 0.05)
    assert (row.latency_source, row.latency_load, row.latency_threads, row.latency_shape) == ('bench', 0.4, 2, '3x32x32')
    out = R.format_board(R.leaderboard('classification', 'digits'))
    assert 'bench, 2 thr, load 0.40' in out and '0.05' in out

    # without bench records the after-training record is used; the board's thread count is the one most
    # rows have a record at, unless asked
    other = _run(db, 'other', 0.8, arch_fingerprint='fp_other2')
    _lat(db, 'other', 3.0, 'fp_other2', run_id=other, source='fit', load_1m=1.0, threads=1)
    _lat(db, 'other', 2.0, 'fp_other2', run_id=other, source='fit', load_1m=1.0, threads=2)
    board = R.leaderboard('classification', 'digits').set_index('model')
    assert board.attrs['threads'] == 2 and board.loc['other'].latency_ms == 2.0
    assert R.leaderboard('classification', 'digits', threads=1).set_index('model').loc['other'].latency_ms == 3.0


def _v4_store(path):
    """A results file exactly as schema version 4 wrote it, with three latency rows of one model."""
    from alembic.migration import MigrationContext
    from alembic.operations import Operations

    engine = sa.create_engine(f'sqlite:///{path}')
    with engine.begin() as conn:
        R.schema_table.create(conn)
        op = Operations(MigrationContext.configure(conn))
        for migration in R.MIGRATIONS[:4]:
            migration(op)
        conn.execute(R.schema_table.insert().values(id=1, version=4, updated_at=R.utcnow()))
        for ms, dtype, compiled in ((2.0, None, None), (1.0, None, 1), (3.0, 'bfloat16', 0)):
            conn.execute(sa.text("INSERT INTO zoo_latency (model, input_shape, batch_size, device, median_ms, dtype, "
                                 "compiled, measured_at, source, threads, cpus) VALUES ('net', '3x32x32', 1, 'cpu', "
                                 ":ms, :dtype, :compiled, '2026-01-01 00:00:00', 'bench', 2, 2)"),
                         {'ms': ms, 'dtype': dtype, 'compiled': compiled})
    engine.dispose()


# another machine's CPU: a name no real CPU has, so that a partial match of it is one whatever runs the test
# (it was 'Intel Xeon Platinum 8480', and 'xeon' then also matched an Intel Xeon host's own CPU)
OTHER_CPU = 'Fictitious Test CPU 8480'


def test_a_v4_store_upgrades_to_runtime_and_cpu_keys_and_boards_never_mix_cpus(zoo_db, capsys):
    _v4_store(zoo_db)
    db = R.open_db()
    assert db.schema_version() == R.SCHEMA_VERSION
    old = db.latency().sort_values('median_ms')
    assert old.runtime.tolist() == ['compile', 'eager', 'eager']            # compiled rows were torch.compile
    assert old.dtype.tolist() == ['float32', 'float32', 'bfloat16'] and set(old.cpu_model) == {R.UNKNOWN_CPU}
    assert old.isa.isna().all() and old.versions.isna().all()

    # new rows carry this machine's CPU, ISA flags and versions unless given
    from zoo.eval.profile import ISA_FLAGS, machine
    here = machine()
    assert here['cpu_model'] and set(here['isa']) <= set(ISA_FLAGS)
    rid = _run(db, 'net', 0.9)
    _lat(db, 'net', 5.0, source='bench', runtime='onnxruntime')
    mine = db.latency(id=_lat(db, 'net', 4.0, source='bench')).iloc[0]
    assert (mine.runtime, mine.cpu_model, list(mine.isa)) == ('eager', here['cpu_model'], here['isa'])
    assert mine.versions['torch'] == torch.__version__ and 'zoo' in mine.versions
    for ms, load in ((9.0, 0.1), (9.5, 1.0)):                          # the quieter record wins
        _lat(db, 'other', ms, source='bench', cpu_model=OTHER_CPU, load_1m=load)
    _run(db, 'other', 0.8)
    with pytest.raises(R.ResultsDBError, match='unknown runtime'):
        _lat(db, 'net', 1.0, runtime='tensorrt')

    # the CPU most records of the board were measured on; then a chosen one; never a mix
    board = R.leaderboard('classification', 'digits').set_index('model')
    assert board.attrs['cpu'] in (R.UNKNOWN_CPU, OTHER_CPU)
    rows = board.latency_cpu.dropna()
    assert rows.nunique() == 1 and (rows == board.attrs['cpu']).all()
    other = R.leaderboard('classification', 'digits', cpu='fictitious test').set_index('model')  # part of a name
    assert other.attrs['cpu'] == OTHER_CPU and other.loc['other'].latency_ms == 9.0
    assert other.loc['net'].latency_ms is None                           # not measured there: no number, no mix
    here_board = R.leaderboard('classification', 'digits', cpu=here['cpu_model']).set_index('model')
    assert here_board.loc['net'].latency_ms == 4.0 and here_board.loc['other'].latency_ms is None
    unknown = R.leaderboard('classification', 'digits', cpu='unknown').set_index('model')
    assert unknown.loc['net'].latency_ms == 2.0                          # the eager float32 upgrade row
    assert R.leaderboard('classification', 'digits', runtime='compile', cpu='unknown').loc[0].latency_ms == 1.0
    ort = R.leaderboard('classification', 'digits', runtime='onnxruntime').set_index('model')
    assert ort.loc['net'].latency_ms == 5.0 and ort.loc['net'].latency_runtime == 'onnxruntime'
    assert rid and 'onnxruntime on' in R.format_board(ort.reset_index())

    # the command line: --runtime and --cpu; bad values are one line with the choices, exit 2
    assert main(['results', '--runtime', 'compile', '--cpu', 'unknown', '--format', 'json']) == 0
    got = {r['model']: r['latency_ms'] for r in json.loads(capsys.readouterr().out)}
    assert got == {'net': 1.0, 'other': None}
    assert main(['results', '--cpu', 'epyc-9999']) == 2
    err = capsys.readouterr().err.strip()
    assert err.count('\n') == 0 and 'recorded CPUs' in err and OTHER_CPU in err
    with pytest.raises(SystemExit) as e:
        main(['results', '--runtime', 'tensorrt'])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count('\n') == 0 and 'eager, compile, onnxruntime, openvino' in err


def test_pareto_front_and_plot(fixture_db, tmp_path):
    board = R.leaderboard('classification', 'digits')
    front = R.pareto_front(board.latency_ms, board['mean'])
    assert [board.model[i] for i in front] == ['fast', 'mid', 'slow_good']
    assert R.pareto_front([1, 2, 3], [0.1, 0.2, 0.05], higher_is_better=False) == [0, 2]
    out = tmp_path / 'pareto.png'
    fig = R.plot_pareto(board, out)
    assert out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    labels = [t.get_text().replace('\n', ' ') for t in fig.axes[0].texts]  # long labels wrap
    assert sorted(labels) == sorted(['fast (token_mixer=pooling)', 'slow_good (token_mixer=pooling)',
                                     'mid (token_mixer=pooling), n=2', 'slow_bad (token_mixer=pooling), n=1'])
    ax = fig.axes[0]
    assert 'IQR' in ax.get_xlabel() and 't-interval' in ax.get_ylabel()


def test_bootstrap_and_iqm():
    lo, hi = R.bootstrap_ci([1.0, 2.0, 3.0, 4.0])
    assert 1.0 <= lo < 2.5 < hi <= 4.0
    assert R.bootstrap_ci([1.0]) != R.bootstrap_ci([1.0])   # NaNs
    assert R.iqm([0, 1, 2, 3, 4, 5, 6, 100]) == pytest.approx(3.5)


# ------------------------------------------------------------------------ aggregate over tasks (stratified bootstrap)
def _multi_task_db(scores: dict):
    """scores: {model: {dataset: [one final val/acc1 per seed]}}."""
    db = R.open_db()
    for model, per_task in scores.items():
        for dataset, accs in per_task.items():
            for seed, acc in enumerate(accs):
                _run(db, model, acc, seed, dataset=dataset)
    return db


def test_aggregate_iqm_and_mean_by_hand():
    # pooled over two tasks: 1..8, whose IQM is the mean of the middle half (3, 4, 5, 6) = 4.5
    _multi_task_db({'a': {'t1': [1, 2, 3, 8], 't2': [4, 5, 6, 7]},
                    'b': {'t1': [0, 0, 0, 0], 't2': [0, 0, 0, 100]}})
    agg = R.aggregate(higher_is_better=True).set_index('model')
    assert agg.loc['a', 'iqm'] == pytest.approx(4.5) and agg.loc['a', 'mean'] == pytest.approx(4.5)
    assert agg.loc['b', 'iqm'] == pytest.approx(0.0) and agg.loc['b', 'mean'] == pytest.approx(12.5)  # IQM ignores 100
    assert agg.loc['a', 'n_tasks'] == 2 and agg.loc['a', 'n_runs'] == 8 and agg.loc['a', 'runs_per_task'] == '4'
    assert agg.index.tolist() == ['a', 'b'] and agg.attrs['tasks'] == ['classification/t1', 'classification/t2']
    assert agg.loc['a', 'iqm_low'] <= 4.5 <= agg.loc['a', 'iqm_high']


def test_stratified_bootstrap_never_mixes_strata():
    import numpy as np
    counts = []

    def from_b(x):                      # how many of each replicate's runs came from stratum b (valued 1000)
        counts.append((x >= 1000).sum(axis=1))
        return x.mean(axis=1)

    R.stratified_bootstrap([np.zeros(3), np.full(5, 1000.0)], from_b, n_boot=500)
    assert (counts[0] == 5).all()       # every replicate: exactly b's 5 runs, never more or fewer
    # two constant tasks: resampling within each leaves the pooled mean fixed, so the interval is a point
    # (an unstratified bootstrap would swing between 0 and 1)
    assert R.stratified_bootstrap([[0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]], lambda x: x.mean(axis=1)) == (0.5, 0.5)
    assert np.isnan(R.stratified_bootstrap([[0.0, 1.0], [1.0]], lambda x: x.mean(axis=1))[0])   # a single run


def test_aggregate_interval_contains_the_truth_and_shrinks_with_more_seeds():
    import numpy as np
    rng = np.random.default_rng(0)
    # two tasks centred on 0.6 and 0.8: the pooled distribution is symmetric about 0.7, so mean = IQM = 0.7
    widths = {}
    for n in (5, 40):
        R.close_all()
        _multi_task_db({f'seeds{n}': {'t1': rng.normal(0.6, 0.05, n).tolist(), 't2': rng.normal(0.8, 0.05, n).tolist()}})
        row = R.aggregate(model=f'seeds{n}').iloc[0]
        for stat in ('iqm', 'mean'):
            assert row[f'{stat}_low'] < 0.7 < row[f'{stat}_high'], (n, stat, row)
        widths[n] = row.iqm_high - row.iqm_low
    assert widths[40] < widths[5] / 2               # ~1/sqrt(n): eight times the seeds, under half the width


def test_aggregate_rows_per_model_arguments():
    """As on the leaderboard, two token mixers of one model are two rows, never pooled into one."""
    db = R.open_db()
    for mixer, base in (('pooling', 0.5), ('attention', 0.8)):
        for dataset in ('t1', 't2'):
            for seed in range(3):
                _run(db, 'metaformer_tiny', base + 0.01 * seed, seed, dataset=dataset,
                     block_choices={'token_mixer': mixer})
    agg = R.aggregate()
    assert agg.model_args.tolist() == ['token_mixer=attention', 'token_mixer=pooling']
    assert agg['mean'].tolist() == pytest.approx([0.81, 0.51]) and agg.n_runs.tolist() == [6, 6]
    assert 'token_mixer=attention' in R.format_aggregate(agg)


def test_aggregate_too_few_runs_common_tasks_and_bad_input(capsys):
    _multi_task_db({'one_seed': {'t1': [0.5], 't2': [0.6]}, 'three': {'t1': [0.5, 0.6, 0.7], 't2': [0.6, 0.7, 0.8]},
                    'elsewhere': {'t3': [0.9, 0.9]}})
    with pytest.raises(R.ResultsDBError, match='no task in common'):
        R.aggregate()
    agg = R.aggregate(model='[ot]*').set_index('model')            # one_seed and three: t1, t2 in common
    assert agg.loc['one_seed'].iqm_low != agg.loc['one_seed'].iqm_low       # NaN: nothing to resample
    assert 'single run' in agg.loc['one_seed', 'note'] and agg.loc['three', 'note'] == ''
    two = R.aggregate(common=False).set_index('model').loc['elsewhere']
    assert two.n_tasks == 1 and two.iqm_low != two.iqm_low and 'n=2 runs, too few for an interval' in two.note
    norm = R.aggregate(model='three', normalize={'classification/t1': (0.5, 1.0), 'classification/t2': (0.6, 1.0)})
    assert norm.iloc[0]['mean'] == pytest.approx(np.mean([0, 0.2, 0.4, 0, 0.25, 0.5]))
    with pytest.raises(R.ResultsDBError, match='normalize has no'):
        R.aggregate(model='three', normalize={'classification/t1': (0, 1)})
    with pytest.raises(R.ResultsDBError, match="unknown column"):
        R.aggregate(by='colour')
    with pytest.raises(R.ResultsDBError, match="no final metric 'val/psnr'"):
        R.aggregate('val/psnr')
    assert main(['results', '--aggregate', '--model', '[ot]*']) == 0
    cap = capsys.readouterr()
    assert 'three' in cap.out and 'IQM 95% CI' in cap.out and 'stratified bootstrap' in cap.out
    assert 'too few runs' in cap.err
    assert main(['results', '--aggregate', '--model', 'three', '--format', 'csv']) == 0
    assert capsys.readouterr().out.startswith('model,model_args,n_tasks,n_runs,runs_per_task,iqm,iqm_low,iqm_high')
    assert main(['results', '--aggregate']) == 2                              # no common task: one-line error
    assert 'no task in common' in capsys.readouterr().err


def test_cli_results_formats_and_plot(fixture_db, tmp_path, capsys):
    assert main(['results', '--task', 'classification', '--dataset', 'digits']) == 0
    out = capsys.readouterr().out
    assert 'slow_good' in out and '0.9150' in out and '95% CI' in out and 'n=2, too few for an interval' in out
    assert main(['results', '--dataset', 'digits', '--format', 'csv']) == 0
    csv = capsys.readouterr().out
    assert csv.splitlines()[0].startswith(
        'model,family,model_args,dataset,block_choices,budget,max_epochs,steps,n_seeds,mean')
    assert main(['results', '--dataset', 'digits', '--format', 'json']) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r['model'] for r in rows][0] == 'slow_good' and rows[0]['n_seeds'] == 4
    assert main(['results', '--dataset', 'digits', '--format', 'markdown', '--model', 'slow*']) == 0
    md = capsys.readouterr().out
    assert md.startswith('| model') and 'slow_bad' in md and 'fast' not in md
    png = tmp_path / 'p.png'
    assert main(['results', '--dataset', 'digits', '--plot', str(png)]) == 0
    assert png.stat().st_size > 1000
    capsys.readouterr()
    assert main(['results', '--runs', '--format', 'csv']) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 1 + len(R.runs())
    assert main(['results', '--metric', 'val/nothing']) == 2


def test_bench_db_writes_latency_rows(zoo_db, capsys):
    assert main(['bench', 'poolformer_tiny', '--repeats', '2', '--warmup', '1', '--time', '0', '--db', str(zoo_db)]) == 0
    lat = R.latency()
    assert lat.model.tolist() == ['poolformer_tiny'] and lat.batch_size.tolist() == [1]
    assert lat.median_ms[0] > 0 and lat.params[0] > 0 and lat.macs[0] > 0 and lat.arch_fingerprint[0]
    assert lat.input_shape[0] == 'x'.join(map(str, __import__('zoo').model_info('poolformer_tiny').input_size))
    assert lat.source[0] == 'bench' and lat.warmup[0] == 1 and lat.load_1m.notna()[0] and lat.cpus[0] >= 1


def test_results_on_a_missing_database_is_one_line_and_creates_nothing(zoo_db, tmp_path, capsys):
    missing = tmp_path / 'typo.db'
    assert main(['results', '--db', str(missing)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count('\n') == 0 and 'no results database at' in err and 'nothing was created' in err
    assert not missing.exists() and not zoo_db.exists()            # nor the default ($ZOO_DB)
    assert main(['results']) == 2 and not zoo_db.exists()
    # writers still create it
    assert main(['bench', 'poolformer_tiny', '--repeats', '2', '--time', '0', '--db', str(missing)]) == 0
    assert missing.exists() and main(['results', '--db', str(missing)]) == 0


@pytest.mark.parametrize('journal', ['wal', 'delete'])
def test_a_database_with_damaged_pages_is_one_line_and_kept(zoo_db, capsys, journal):
    """A real store whose header and schema are intact but whose row pages are damaged (a disk fault, a
    partial copy): the error shows only when a query reaches them. issue 15: a 74-line traceback. In a
    rollback-journal file (copied from elsewhere) a reader must not even switch the journal mode to WAL,
    which rewrites the header."""
    db = R.ResultsDB(str(zoo_db))
    for i in range(150):
        rid = db.start_run(f'net_{i % 5}', task='classification', dataset='digits', seed=i,
                           config={'pad': 'x' * 500})
        db.log_metrics(rid, {'val/acc1': 0.5}, final=True)
        db.finish_run(rid)
    db.close()
    import sqlite3
    con = sqlite3.connect(zoo_db)
    assert con.execute(f'PRAGMA journal_mode={journal}').fetchone()[0] == journal
    con.close()
    data = bytearray(zoo_db.read_bytes())
    pages = len(data) // 4096
    assert pages > 40
    for pg in range(pages // 2, pages // 2 + 10):                   # ten row pages in the middle
        data[pg * 4096:(pg + 1) * 4096] = bytes((i * 37 + pg) % 256 for i in range(4096))
    zoo_db.write_bytes(bytes(data))
    for argv in (['results', '--db', str(zoo_db)], ['results', '--runs', '--db', str(zoo_db)]):
        R.close_all()
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.count('\n') == 0 and 'corrupt' in err and 'left untouched' in err, err
        assert zoo_db.read_bytes() == bytes(data)


def test_import_zoo_does_not_load_sqlalchemy():
    code = 'import sys, zoo; print("sqlalchemy" in sys.modules, "zoo.eval.results" in sys.modules)'
    out = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.split() == ['False', 'False']


# ----------------------------------------------------------------------------------------- recording callback
def _tiny_system():
    import lightning.pytorch as pl

    class TinySystem(pl.LightningModule):
        """A stand-in recipe system: a small network, val/acc1 logged per epoch."""

        def __init__(self, lr: float = 0.05, fail_at_epoch: int | None = None, prune_at_epoch: int | None = None):
            super().__init__()
            self.save_hyperparameters()
            self.model_name = 'tiny_mlp'
            self.block_choices = {'act_layer': 'relu'}
            self.model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 8), torch.nn.ReLU(),
                                             torch.nn.Linear(8, 2))
            self.example_input_array = torch.zeros(2, 1, 4, 4)

        def forward(self, x):
            return self.model(x)

        def training_step(self, batch, _):
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self(x), y)
            self.log('train/loss', loss, on_epoch=True, on_step=False)
            return loss

        def validation_step(self, batch, _):
            x, y = batch
            self.log('val/acc1', (self(x).argmax(1) == y).float().mean(), on_epoch=True)
            if self.hparams.fail_at_epoch == self.current_epoch and not self.trainer.sanity_checking:
                raise RuntimeError('the loss went to NaN (on purpose)')

        def on_validation_epoch_end(self):
            if self.hparams.prune_at_epoch == self.current_epoch and not self.trainer.sanity_checking:
                import optuna
                raise optuna.TrialPruned('pruned on purpose')

        def test_step(self, batch, _):
            x, y = batch
            self.log('test/acc1', (self(x).argmax(1) == y).float().mean())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 1, 4, 4, generator=g)
    y = (x.mean((1, 2, 3)) > 0).long()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    return TinySystem, loader


def _trainer(**kw):
    import lightning.pytorch as pl
    from zoo.recipes.recording import ResultsLogger

    cb = ResultsLogger(latency_repeats=2, latency_warmup=1, **kw)
    return pl.Trainer(max_epochs=2, accelerator='cpu', devices=1, logger=[cb], enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False), cb


def test_callback_records_run_metrics_and_latency(monkeypatch):
    import lightning.pytorch as pl

    monkeypatch.setenv('ZOO_HEARTBEAT_S', '0.01')
    pl.seed_everything(3)
    System, loader = _tiny_system()
    trainer, cb = _trainer()
    system = System()
    trainer.fit(system, loader, loader)
    run = R.runs().iloc[0]
    assert run.status == 'finished' and run.model == 'tiny_mlp' and run.seed == 3 and run.stage == 'fit'
    assert run.hparams['lr'] == 0.05 and run.block_choices == {'act_layer': 'relu'} and run.max_epochs == 2
    assert run.env['torch'] == torch.__version__ and run.env['device'] == 'cpu' and run.host and run.pid
    assert run.arch_fingerprint == R.fingerprint(system.model) and run.params == 8 * 16 + 8 + 2 * 8 + 2
    assert run.macs == 16 * 8 + 8 * 2 and run.wall_s > 0
    assert run.heartbeat_s == 0.01 and cb.heartbeats > 0 and cb._heartbeat is None     # beat during fit, then stopped
    assert not any(t.name.startswith('zoo-heartbeat') for t in __import__('threading').enumerate())
    per_epoch = R.metrics(cb.run_id, name='val/acc1', final=False)
    assert per_epoch.epoch.tolist() == [0, 1]
    final = R.metrics(cb.run_id, final=True).set_index('name').value
    assert final['val/acc1'] == pytest.approx(trainer.callback_metrics['val/acc1'].item())
    assert 'train/loss' in final
    lat = R.latency()
    assert lat.run_id.tolist() == [cb.run_id] and lat.input_shape.tolist() == ['1x4x4'] and lat.macs[0] == 144
    # the controlled protocol: warm-up, at least the asked repeats, the load it was taken at, marked 'fit'
    assert lat.source[0] == 'fit' and lat.warmup[0] == 1 and lat.repeats[0] >= 2 and lat.load_1m.notna()[0]
    assert lat.cpus[0] >= 1 and lat.duration_s[0] > 0 and lat.threads[0] == torch.get_num_threads()

    trainer2, cb2 = _trainer()
    trainer2.test(system, loader)
    test_run = R.runs(id=cb2.run_id).iloc[0]
    assert test_run.stage == 'test' and test_run.status == 'finished' and 0 <= test_run['test/acc1'] <= 1
    assert len(R.latency()) == 1                     # latency is measured after training only


def test_epochs_without_validation_record_no_stale_val_metrics():
    """With ``check_val_every_n_epoch=2`` Lightning keeps the last validation's values in callback_metrics through
    the next epoch; the per-epoch rows must hold val/* only for the epochs that validated."""
    import lightning.pytorch as pl

    from zoo.recipes.recording import ResultsLogger

    System, loader = _tiny_system()
    cb = ResultsLogger(latency=False)
    trainer = pl.Trainer(max_epochs=4, check_val_every_n_epoch=2, accelerator='cpu', devices=1, logger=[cb],
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(System(), loader, loader)
    assert R.metrics(cb.run_id, name='val/acc1', final=False).epoch.tolist() == [1, 3]
    assert R.metrics(cb.run_id, name='train/loss', final=False).epoch.tolist() == [0, 1, 2, 3]


def test_callback_records_a_network_built_in_setup():
    """A system that builds its network in ``setup`` (``CausalLM`` takes vocab_size from the data module):
    the run's hparams and fingerprint are those of the network that trained, so ``zoo bench --db`` can
    rebuild it."""
    System, loader = _tiny_system()

    class LateSystem(System):
        def __init__(self, width: int | None = None):
            super().__init__()
            self.model = None

        def setup(self, stage):
            if self.model is None:
                self.hparams.width = 8
                self.model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, self.hparams.width),
                                                 torch.nn.ReLU(), torch.nn.Linear(self.hparams.width, 2))

    trainer, cb = _trainer(latency=False)
    system = LateSystem()
    trainer.fit(system, loader, loader)
    run = R.runs(id=cb.run_id).iloc[0]
    assert run.hparams['width'] == 8 and run.arch_fingerprint == R.fingerprint(system.model)
    assert run.params == sum(p.numel() for p in system.model.parameters())


def test_callback_marks_failed_and_pruned_runs():
    System, loader = _tiny_system()
    trainer, cb = _trainer(latency=False)
    with pytest.raises(RuntimeError, match='NaN'):
        trainer.fit(System(fail_at_epoch=1), loader, loader)
    failed = R.runs(id=cb.run_id).iloc[0]
    assert failed.status == 'failed' and 'NaN (on purpose)' in failed.error
    assert R.metrics(cb.run_id, name='val/acc1', final=False).epoch.tolist() == [0]   # the epoch it finished

    import optuna
    from zoo.recipes.recording import TrialContext
    trainer, cb = _trainer(latency=False, trial=TrialContext('s', 4))
    with pytest.raises(optuna.TrialPruned):
        trainer.fit(System(prune_at_epoch=0), loader, loader)
    pruned = R.runs(id=cb.run_id).iloc[0]
    assert pruned.status == 'pruned' and pruned.study_name == 's' and pruned.trial_number == 4
    assert not R.latency().run_id.isin([cb.run_id]).any()


# --------------------------------------------------------------------------------------------------- notebook
def test_compare_notebook_runs_top_to_bottom(fixture_db, capsys):
    import matplotlib
    import matplotlib.pyplot as plt
    matplotlib.use('Agg')

    nb = json.loads((ROOT / 'notebooks' / 'compare.ipynb').read_text())
    assert nb['nbformat'] == 4
    ns: dict = {}
    for cell in nb['cells']:
        if cell['cell_type'] == 'code':
            exec(compile(''.join(cell['source']), 'compare.ipynb', 'exec'), ns)
    out = capsys.readouterr().out
    assert 'classification / digits: 4 models ranked by val/acc1' in out
    assert "Pareto front: ['fast', 'mid', 'slow_good']" in out
    assert ns['board'].model.tolist()[0] == 'slow_good' and len(ns['seeds']) == 3 + 4 + 1 + 2
    assert ns['agg'].model.tolist()[0] == 'slow_good' and '| slow_good |' in out     # the across-tasks table
    plt.close('all')


# --------------------------------------------------------------------------------------- zoo fit records itself
def test_zoo_fit_records_run_metrics_and_latency(zoo_db, tmp_path, monkeypatch):
    monkeypatch.setenv('ZOO_RUNS', str(tmp_path / 'runs'))
    cfg = 'recipes/configs/poolformer/poolformer_tiny_digits_15e.yaml'
    fast = ['--trainer.max_epochs=2', '--trainer.limit_train_batches=2', '--trainer.limit_val_batches=1']
    monkeypatch.chdir(ROOT)
    assert main(['fit', '-c', cfg, *fast]) == 0
    run = R.runs().iloc[0]
    assert (run.model, run.family, run.variant, run.dataset, run.task) == (
        'poolformer_tiny', 'poolformer', 'tiny', 'digits', 'classification')
    assert run.status == 'finished' and run.recipe == cfg and run.seed == 0 and run.max_epochs == 2
    assert run.block_choices == {'token_mixer': 'pooling'}
    assert run.config['model']['init_args']['optimizer']['init_args']['lr'] == 0.004
    assert run.git_commit and run.params > 0 and run.macs > 0
    assert R.metrics(int(run.id), name='val/acc1', final=False).epoch.tolist() == [0, 1]
    lat = R.latency()
    assert lat.run_id.tolist() == [run.id] and lat.input_shape.tolist() == ['1x32x32']
    assert lat.arch_fingerprint.tolist() == [run.arch_fingerprint]
    # --db none: nothing recorded; --db PATH: recorded there
    other = tmp_path / 'other.db'
    one = ['--trainer.max_epochs=1', '--trainer.limit_train_batches=1', '--trainer.limit_val_batches=1']
    assert main(['fit', '-c', cfg, *one, '--db', 'none']) == 0
    monkeypatch.setenv('ZOO_DB', str(zoo_db))
    assert main(['fit', '-c', cfg, *one, '--db', str(other), '--seed_everything=1']) == 0
    assert len(R.runs()) == 1 and R.runs(db=str(other)).seed.tolist() == [1]


def test_zoo_fit_seeds_runs_repeats_that_pool_into_one_interval(zoo_db, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv('ZOO_RUNS', str(tmp_path / 'runs'))
    monkeypatch.setenv('ZOO_RECORD_LATENCY', '0')
    monkeypatch.chdir(ROOT)
    cfg = 'recipes/configs/poolformer/poolformer_tiny_digits_15e.yaml'
    assert main(['fit', '-c', cfg, '--seeds', '0,1,2', '--trainer.max_epochs=1', '--trainer.limit_train_batches=2',
                 '--trainer.limit_val_batches=1']) == 0
    runs = R.runs()
    assert sorted(runs.seed) == [0, 1, 2] and runs.config_key.nunique() == 1 and (runs.status == 'finished').all()
    row = R.leaderboard('classification', 'digits').iloc[0]
    assert row.n_seeds == 3 and row.run_ids == '1,2,3' and R.latency().empty
    with pytest.raises(SystemExit) as e:
        main(['fit', '-c', cfg, '--seeds', 'a,b'])
    assert e.value.code == 2 and 'comma-separated integers' in capsys.readouterr().err


# ------------------------------------------------------------------------------ every task (issue 24, item 5)
def _task_runs(db, task: str) -> None:
    """Two models of ``task`` with 3 seeds each, ranked by the task's primary metric, with a latency."""
    from zoo import tasks

    metric = tasks.get(task).metric
    for model, base, lat in ((f'{task}_a', 0.5, 3.0), (f'{task}_b', 0.7, 6.0)):
        for seed in range(3):
            rid = db.start_run(model, task=task, dataset=f'{task}_data', seed=seed, hparams={
                'model_args': {'backbone': 'poolformer_tiny', 'backbone_kwargs': {'dims': [32, 64, 128, 256]},
                               'neck_channels': [64, 128, 256]}})
            db.log_metrics(rid, {metric: base + 0.01 * seed, 'train/epoch_time_s': 2.0}, epoch=0)
            db.log_metrics(rid, {metric: base + 0.01 * seed}, final=True)
            db.finish_run(rid)
        db.add_latency(model, lat, input_shape=(3, 32, 32), batch_size=1)


@pytest.mark.parametrize('task', ['detection', 'language_modeling', 'denoising', 'classification', 'segmentation'])
def test_results_of_a_database_with_one_task(task, zoo_db, capsys, tmp_path):
    """A database with one task: `zoo results` ranks it by that task's primary metric, with or without --task."""
    from zoo import tasks

    primary_metric = tasks.get(task).metric
    _task_runs(R.open_db(), task)
    for args in ([], ['--task', task]):
        assert main(['results', *args]) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        assert f'{task}_b' in out and primary_metric in out
    board = R.leaderboard(task)
    assert board.attrs['metric'] == primary_metric and board.model.tolist() == [f'{task}_b', f'{task}_a']


def test_results_of_a_database_with_every_task(zoo_db, capsys, tmp_path):
    """Several tasks: one leaderboard per task (each by its own metric); csv/json as one table with a task column;
    one Pareto plot per task; a leaderboard() call without a task says to choose."""
    from zoo import tasks

    TASKS = tasks.names()
    db = R.open_db()
    for task in TASKS:
        _task_runs(db, task)
    assert main(['results']) == 0
    out = capsys.readouterr().out
    assert all(f'\n{t} (' in out for t in TASKS)
    assert main(['results', '--format', 'csv']) == 0
    import io

    import pandas as pd
    table = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert sorted(set(table.task)) == sorted(TASKS) and len(table) == 2 * len(TASKS)
    png = tmp_path / 'pareto.png'
    assert main(['results', '--plot', str(png)]) == 0
    assert all((tmp_path / f'pareto_{t}.png').stat().st_size > 1000 for t in TASKS)
    with pytest.raises(R.ResultsDBError, match=f'of {len(TASKS)} tasks'):
        R.leaderboard()
    assert set(R.leaderboards()) == set(TASKS)


def test_pareto_plot_stays_readable_with_one_model_and_long_arguments(zoo_db, tmp_path):
    """One point and a model-argument label longer than the axes: the axes span a readable range around it."""
    _task_runs(R.open_db(), 'detection')
    board = R.leaderboard('detection', model='detection_a')
    fig = R.plot_pareto(board, tmp_path / 'one.png')
    ax = fig.axes[0]
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    assert x0 < 3.0 < x1 and (x1 - x0) > 0.5 and y0 < 0.51 < y1 and (y1 - y0) > 0.05
    [label] = [t for t in ax.texts]
    assert '\n' in label.get_text()  # wrapped


def test_a_latency_failure_keeps_its_error_and_refuses_an_unknown_runtime():
    db = R.open_db()
    db.add_latency_failure('net', 'RuntimeError: broke', input_shape=(1, 32, 32), batch_size=16, runtime='compile',
                           arch_fingerprint='abc')
    f = db.latency_failures(model='n*')
    assert f[['model', 'input_shape', 'batch_size', 'runtime', 'error', 'arch_fingerprint']].values.tolist() == [
        ['net', '1x32x32', 16, 'compile', 'RuntimeError: broke', 'abc']]
    with pytest.raises(R.ResultsDBError, match='unknown runtime .onnx.; expected one of eager, compile'):
        db.add_latency_failure('net', 'x', input_shape='1x32x32', batch_size=1, runtime='onnx')
