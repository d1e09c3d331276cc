"""The results database and ``zoo sweep`` on a real PostgreSQL server (the many-machines set-up).

The server is the PyPI package ``pgserver`` (PostgreSQL 16 binaries in a wheel, in the ``test`` extra), started
once for this module in a temporary directory and stopped at its end. PostgreSQL refuses to run as root:
under root pgserver runs it as a system user ``pgserver`` it creates with ``useradd`` (and it makes the
folders above the data directory and its binaries world-traversable). Each test gets its own database.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import pytest
import sqlalchemy as sa

from zoo.recipes.main import main
from zoo.eval import results as R

from test_sweep import two_worker_gate

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / 'recipes' / 'configs' / 'poolformer' / 'poolformer_tiny_digits_15e.yaml'
FAST = '--trainer.max_epochs=1 --trainer.limit_train_batches=1 --trainer.limit_val_batches=1'


# one pytest-xdist worker runs the whole file (make test: --dist loadgroup), so the module fixture below
# is built once
pytestmark = pytest.mark.xdist_group(__name__)


@pytest.fixture(scope='module')
def pg_server():
    with warnings.catch_warnings():     # platformdirs: "XDG_RUNTIME_DIR is not set" (it uses /tmp/runtime-<uid>)
        warnings.simplefilter('ignore')
        import pgserver     # not skipped when missing: the test extra installs it, and CI must run these tests

        # Not under pytest's basetemp: pytest keeps that private (mode 0700, re-applied by every session),
        # and the server's own user must reach its data directory.
        root = Path(tempfile.mkdtemp(prefix='zoo-pg-'))
        srv = pgserver.get_server(root / 'data', cleanup_mode='delete')
    yield srv
    srv.cleanup()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_url(pg_server, request, monkeypatch, tmp_path):
    name = 'zoo_' + ''.join(c if c.isalnum() else '_' for c in request.node.name.lower())[:50]
    pg_server.psql(f'DROP DATABASE IF EXISTS {name};')
    pg_server.psql(f'CREATE DATABASE {name};')
    url = pg_server.get_uri(name).replace('postgresql://', 'postgresql+psycopg://', 1)
    monkeypatch.setenv('ZOO_DB', url)
    monkeypatch.setenv('ZOO_RUNS', str(tmp_path / 'runs'))
    yield url
    R.close_all()


def test_recording_queries_and_crash_detection_on_postgres(pg_url):
    db = R.open_db(pg_url)
    assert db.engine.dialect.name == 'postgresql' and db.schema_version() == R.SCHEMA_VERSION
    for model, accs in {'a': [0.8, 0.82, 0.84], 'b': [0.9, 0.91]}.items():
        for seed, acc in enumerate(accs):
            for dataset in ('digits', 'shapes'):
                rid = db.start_run(model, task='classification', dataset=dataset, seed=seed, hparams={'lr': 0.1},
                                   block_choices={'token_mixer': 'pooling'}, arch_fingerprint=f'fp_{model}')
                db.log_metrics(rid, {'val/acc1': acc - 0.1}, epoch=0)
                db.log_metrics(rid, {'val/acc1': acc}, final=True)
                db.finish_run(rid)
        db.add_latency(model, 3.0 if model == 'a' else 9.0, input_shape=(3, 8, 8), batch_size=1,
                       arch_fingerprint=f'fp_{model}')
    runs = R.runs()
    assert len(runs) == 10 and (runs.status == 'finished').all() and runs.block_choices[0] == {'token_mixer': 'pooling'}
    board = R.leaderboard('classification', 'digits')
    assert board.model.tolist() == ['b', 'a'] and board.latency_ms.tolist() == [9.0, 3.0]
    assert board.set_index('model').loc['a', 'mean'] == pytest.approx(0.82)
    agg = R.aggregate().set_index('model')
    assert agg.loc['a', 'n_runs'] == 6 and agg.loc['a', 'iqm'] == pytest.approx(0.82)
    with pytest.raises(R.ResultsDBError, match="unknown column 'colour'"):
        R.runs(colour='red')

    # a run killed outright is crashed when the store is next opened
    code = ('import os, signal\nfrom zoo.eval import results as R\n'
            'R.open_db().start_run("victim")\nos.kill(os.getpid(), signal.SIGKILL)\n')
    assert subprocess.run([sys.executable, '-c', code], cwd=ROOT, env={**os.environ, 'ZOO_DB': pg_url}).returncode == -9
    assert R.ResultsDB(pg_url).runs(model='victim').status.tolist() == ['crashed']


def test_an_older_schema_is_migrated_on_postgres_and_a_newer_one_refused(pg_url):
    from alembic.migration import MigrationContext
    from alembic.operations import Operations

    engine = sa.create_engine(pg_url)
    with engine.begin() as conn:            # a store at the previous version
        R.schema_table.create(conn)
        op = Operations(MigrationContext.configure(conn))
        for migration in R.MIGRATIONS[:R.SCHEMA_VERSION - 1]:
            migration(op)
        conn.execute(R.schema_table.insert().values(id=1, version=R.SCHEMA_VERSION - 1, updated_at=R.utcnow()))
        conn.execute(R.runs_table.insert().values(uid='old', model='net_old', status='finished',
                                                   started_at=R.utcnow(), seed=3))
    db = R.ResultsDB(pg_url)
    assert db.schema_version() == R.SCHEMA_VERSION
    assert db.runs().seed.tolist() == [3] and db.runs().heartbeat_s.isna().all()
    reference = sa.MetaData()
    reference.reflect(engine)
    assert set(reference.tables['zoo_runs'].c.keys()) == set(R.runs_table.c.keys())
    db.close()
    with engine.begin() as conn:
        conn.execute(R.schema_table.update().values(version=R.SCHEMA_VERSION + 1))
    with pytest.raises(R.ResultsDBError, match='newer than this zoo'):
        R.ResultsDB(pg_url)
    with engine.connect() as conn:
        assert conn.execute(sa.text('SELECT count(*) FROM zoo_runs')).scalar() == 1   # nothing lost
    engine.dispose()


def test_four_processes_recording_at_once_on_postgres(pg_url):
    code = ('import sys\nfrom zoo.eval import results as R\ndb = R.open_db()\nw = int(sys.argv[1])\n'
            'for i in range(10):\n'
            '    rid = db.start_run(f"w{w}", seed=i, dataset="digits", task="classification")\n'
            '    db.log_metrics(rid, {"val/acc1": i / 10}, final=True)\n'
            '    db.finish_run(rid)\n')
    procs = [subprocess.Popen([sys.executable, '-c', code, str(w)], cwd=ROOT, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, 'ZOO_DB': pg_url}) for w in range(4)]     # they also race on DDL
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read()[-3000:]
    df = R.runs()
    assert len(df) == 40 and (df.status == 'finished').all() and df.groupby('model').size().tolist() == [10] * 4


def test_a_sweep_with_two_worker_processes_on_postgres(pg_url, tmp_path):
    import optuna

    sweep = tmp_path / 'pg_sweep.py'
    sweep.write_text(f'BASE = {str(BASE)!r}\nMETRIC = "val/acc1"\n' + two_worker_gate(tmp_path / 'gate') +
                     'def space(trial):\n'
                     '    wait_for_both_workers()\n'
                     '    return {"model.init_args.optimizer.init_args.lr": trial.suggest_float("lr", 1e-3, 1e-2, log=True)}\n'
                     'def pruner():\n    import optuna\n    return optuna.pruners.NopPruner()\n')
    assert main(['sweep', str(sweep), '--n-trials', '3', '--n-jobs', '2', '--db', pg_url, '--trial-args', FAST]) == 0
    study = optuna.load_study(study_name='pg_sweep', storage=pg_url)
    assert len(study.trials) == 3 and all(t.state.name == 'COMPLETE' for t in study.trials)   # exactly 3
    rows = R.runs(study_name='pg_sweep')
    assert sorted(rows.trial_number) == [0, 1, 2] and (rows.status == 'finished').all()
    assert rows.pid.nunique() == 2                              # both worker processes ran trials (gate)
    assert rows['val/acc1'].between(0, 1).all() and len(R.latency()) == 3
    with sa.create_engine(pg_url).connect() as conn:             # Optuna's tables beside ours, in one database
        tables = set(sa.inspect(conn).get_table_names())
    assert {'zoo_runs', 'zoo_metrics', 'studies', 'trials'} <= tables
    # the same command resumes: the study is full, nothing is added
    assert main(['sweep', str(sweep), '--n-trials', '3', '--db', pg_url, '--trial-args', FAST]) == 0
    assert len(optuna.load_study(study_name='pg_sweep', storage=pg_url).trials) == 3


def test_two_benchmark_runners_share_a_postgres_database(pg_url, tmp_path):
    """`zoo benchmark run` on a server: two runner processes take the jobs under the advisory lock; each job runs
    once, and a third invocation finds nothing to do."""
    from test_benchmark import rows, write, zoo

    write(tmp_path, 'pg', {'pooling': 'pooling', 'identity': 'identity'})
    procs = [zoo('benchmark', 'run', 'pg', '--no-latency', '--db', pg_url, cwd=tmp_path, popen=True) for _ in range(2)]
    outs = [p.communicate(timeout=900)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    df = rows(pg_url)
    assert sorted(df.entry) == ['identity', 'pooling'] and set(df.status) == {'finished'}
    again = zoo('benchmark', 'run', 'pg', '--no-latency', '--db', pg_url, cwd=tmp_path)
    assert again.returncode == 0 and '0 to run' in again.stderr, again.stderr
