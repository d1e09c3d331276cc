"""Experiment trackers beside zoo's own records (issue 46, item 4): a fit with TensorBoard's or MLflow's Lightning
logger, alone or in a list, writes the tracker's files offline, and the run still has its run folder
(config.yaml, metrics.csv) and its results-database row."""
from __future__ import annotations

import json
import sqlite3

from zoo_cli import zoo_in_process

RECIPE = 'poolformer/poolformer_tiny_digits_15e'
SHORT = ['--trainer.max_epochs=1', '--trainer.limit_train_batches=2', '--trainer.limit_val_batches=1',
         '--trainer.log_every_n_steps=1', '--data.batch_size=16', '--trainer.enable_progress_bar=false',
         '--trainer.enable_model_summary=false']


def _zoo_records(cwd) -> None:
    """The fit kept zoo's own records: one finished row in the results database, and its run folder with the
    resolved config and metrics.csv (the CSV logger stays first, so Lightning's log_dir is the run folder)."""
    with sqlite3.connect(cwd / 'zoo-results.db') as con:
        rows = con.execute('select status, model from zoo_runs').fetchall()
    assert rows == [('finished', 'poolformer_tiny')], rows
    [run] = [p for p in (cwd / 'runs' / 'poolformer_tiny_digits_15e').iterdir() if not p.is_symlink()]
    assert (run / 'config.yaml').is_file() and 'val/acc1' in (run / 'metrics.csv').read_text()
    assert json.loads((run / 'run.json').read_text())['status'] == 'finished'


def test_tensorboard_logger_writes_its_events_beside_zoos_records(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    proc = zoo_in_process('fit', '-c', RECIPE, *SHORT, '--trainer.logger',
                          'lightning.pytorch.loggers.TensorBoardLogger', '--trainer.logger.save_dir', 'tb',
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [events] = (tmp_path / 'tb').rglob('events.out.tfevents.*')
    acc = EventAccumulator(str(events.parent))
    acc.Reload()
    assert {'train/loss', 'val/acc1', 'val/loss'} <= set(acc.Tags()['scalars'])
    _zoo_records(tmp_path)


def test_a_list_of_loggers_mlflow_in_a_local_file_store_and_tensorboard(tmp_path):
    store = tmp_path / 'mlruns'
    loggers = [{'class_path': 'lightning.pytorch.loggers.MLFlowLogger', 'init_args': {'experiment_name': 'zoo'}},
               {'class_path': 'lightning.pytorch.loggers.TensorBoardLogger', 'init_args': {'save_dir': 'tb'}}]
    # MLflow 3 keeps the file store behind MLFLOW_ALLOW_FILE_STORE (it recommends a database, sqlite:///...)
    proc = zoo_in_process('fit', '-c', RECIPE, *SHORT, '--trainer.logger', json.dumps(loggers), cwd=tmp_path,
                          env={'MLFLOW_TRACKING_URI': store.as_uri(), 'MLFLOW_ALLOW_FILE_STORE': 'true'})
    assert proc.returncode == 0, proc.stderr[-3000:]
    [run] = [p.parent for p in store.glob('*/*/meta.yaml')]  # <store>/<experiment id>/<run id>/
    assert 'zoo' in (run.parent / 'meta.yaml').read_text()
    acc1 = (run / 'metrics' / 'val' / 'acc1').read_text().split()  # "<timestamp> <value> <step>"
    assert len(acc1) == 3 and 0 <= float(acc1[1]) <= 1
    assert (run / 'params' / 'name').read_text() == 'poolformer_tiny'
    assert list((tmp_path / 'tb').rglob('events.out.tfevents.*'))
    _zoo_records(tmp_path)
