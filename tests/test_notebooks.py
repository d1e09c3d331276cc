"""Every notebook under notebooks/ runs top to bottom in a real Jupyter kernel (nbclient), and is committed
without outputs.

The comparison notebooks read the snapshot in notebooks/data/ (or docs/measurements/) by default and the user's
results database when ``ZOO_DB`` is set; both paths are executed here. After the notebook's own cells a
check cell inspects every figure it drew: each needs a y-axis label and every panel an x-axis label or a
title (the notebooks' units live in those labels). No network, a few seconds per notebook.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip('nbformat', reason='the notebooks extra: pip install -e .[notebooks]')
nbclient = pytest.importorskip('nbclient', reason='the notebooks extra: pip install -e .[notebooks]')

import zoo  # noqa: E402
from zoo.eval import results as R  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / 'notebooks').glob('*.ipynb'))
REGENERATE = 'python -m experiments.notebook_data'

# Keep figures open (the inline backend closes them after each cell) so the last cell can inspect them.
SETUP = ("get_ipython().run_line_magic('matplotlib', 'inline')\n"
         "get_ipython().run_line_magic('config', 'InlineBackend.close_figures = False')\n"
         "import zoo as _zoo\nprint('ZOO_FILE', _zoo.__file__)")
CHECK_FIGURES = '''
import matplotlib.pyplot as _plt
_report = []
for _n in _plt.get_fignums():
    _fig = _plt.figure(_n)
    _axes = [a for a in _fig.axes if a.has_data()]
    _report.append(dict(ylabel=any(a.get_ylabel() for a in _axes),
                        panels_named=all(a.get_xlabel() or a.get_title() for a in _axes), panels=len(_axes)))
print('FIGURES', __import__('json').dumps(_report))
'''


def execute(path: Path, env: dict[str, str | None]) -> tuple[str, list[dict]]:
    """Run the notebook in a fresh kernel with ``env`` applied; return its printed text and the figure report.
    The kernel imports ``zoo`` from this checkout (the checkout root first on PYTHONPATH; its cwd is notebooks/),
    not from whichever checkout holds the editable install."""
    env = {'PYTHONPATH': os.pathsep.join(filter(None, (str(ROOT), os.environ.get('PYTHONPATH')))), **env}
    nb = nbformat.read(path, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(SETUP))
    nb.cells.append(nbformat.v4.new_code_cell(CHECK_FIGURES))
    saved = {k: os.environ.get(k) for k in env}
    try:
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        client = nbclient.NotebookClient(nb, timeout=300, kernel_name='python3',
                                         resources={'metadata': {'path': str(path.parent)}})
        client.execute()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    text = ''.join(o.get('text', '') for c in nb.cells if c.cell_type == 'code' for o in c.outputs)
    assert text.split('ZOO_FILE ', 1)[1].startswith(str(ROOT / 'zoo')), text[:500]
    report = json.loads(text.rsplit('FIGURES ', 1)[1].splitlines()[0])
    return text, report


def assert_readable(report: list[dict], name: str, at_least: int) -> None:
    assert len(report) >= at_least, f'{name}: expected at least {at_least} figures, drew {len(report)}'
    for i, fig in enumerate(report):
        assert fig['panels'] >= 1, f'{name}: figure {i} is empty'
        assert fig['ylabel'], f'{name}: figure {i} has no y-axis label'
        assert fig['panels_named'], f'{name}: a panel of figure {i} has neither an x-axis label nor a title'


def test_notebooks_are_committed_without_outputs():
    assert NOTEBOOKS, 'no notebooks found'
    for path in NOTEBOOKS:
        nb = json.loads(path.read_text())
        for i, cell in enumerate(nb['cells']):
            if cell['cell_type'] == 'code':
                assert not cell.get('outputs') and cell.get('execution_count') is None, (
                    f'{path.name} cell {i} has outputs: clear them before committing '
                    f'(jupyter nbconvert --clear-output --inplace {path.relative_to(ROOT)})')


def test_every_notebook_is_executed_here():
    """A new notebook needs its own test below (with the data path it reads)."""
    assert {p.name for p in NOTEBOOKS} == {'compare.ipynb', 'mixers.ipynb', 'conv_blocks.ipynb', 'canon.ipynb',
                                           'benchmark.ipynb'}


# ---------------------------------------------------------------------------------------------- token mixers
def test_mixers_notebook_on_the_shipped_snapshot_covers_every_registered_mixer():
    text, report = execute(ROOT / 'notebooks' / 'mixers.ipynb', {'ZOO_DB': None})
    assert 'snapshot: notebooks/data' in text
    table = text.split('token_mixer', 1)[1]
    missing = [m for m in zoo.layers.list_layers('token_mixer') if f' {m} ' not in table]
    assert not missing, f'no runs of {missing} in notebooks/data/mixers_runs.csv: regenerate with {REGENERATE}'
    assert 'Pareto front (batch 1):' in text and '1-min load average' in text
    assert_readable(report, 'mixers.ipynb', 4)


def _mixer_db(path: Path) -> None:
    """Two mixers x two seeds with per-epoch metrics, and one latency row per mixer at batch 1 and 64."""
    db = R.open_db(str(path))
    for mixer, accs, ms in (('pooling', (0.90, 0.92), 1.0), ('attention', (0.95, 0.97), 3.0)):
        fp = f'fp-{mixer}'
        for seed, acc in enumerate(accs):
            rid = db.start_run('metaformer_tiny', task='classification', dataset='digits', seed=seed,
                               block_choices={'token_mixer': mixer}, hparams={'lr': 0.004}, params=1000,
                               arch_fingerprint=fp)
            for epoch in range(3):
                db.log_metrics(rid, {'val/acc1': acc - 0.1 * (2 - epoch)}, epoch=epoch)
            db.log_metrics(rid, {'val/acc1': acc}, final=True)
            db.finish_run(rid)
        for bs in (1, 64):
            db.add_latency('metaformer_tiny', ms * bs, input_shape=(1, 32, 32), batch_size=bs, threads=1,
                           arch_fingerprint=fp, params=1000, macs=2_000_000)
    db.close()


def test_mixers_notebook_reads_the_users_database(tmp_path):
    path = tmp_path / 'results.db'
    _mixer_db(path)
    text, report = execute(ROOT / 'notebooks' / 'mixers.ipynb', {'ZOO_DB': str(path)})
    assert f'database: {path}' in text and '4 runs' in text
    assert "Pareto front (batch 1): ['pooling', 'attention']" in text      # faster vs better: both on the front
    assert '96.00' in text and '91.00' in text                                 # the means over seeds, in %
    assert_readable(report, 'mixers.ipynb', 4)


# ------------------------------------------------------------------------------------- conv blocks, Canon
def test_conv_blocks_notebook():
    text, report = execute(ROOT / 'notebooks' / 'conv_blocks.ipynb', {})
    assert 'weighted - standard (paired)' in text and 'mmengine' in text
    assert_readable(report, 'conv_blocks.ipynb', 2)


def test_canon_notebook():
    text, report = execute(ROOT / 'notebooks' / 'canon.ipynb', {})
    assert '1L RoPE+Canon' in text and 'acc_k1' in text and 'llama+ABCD' in text
    assert_readable(report, 'canon.ipynb', 5)


# ------------------------------------------------------------------------------------------------ compare
def test_compare_notebook_in_a_kernel(tmp_path):
    path = tmp_path / 'results.db'
    _mixer_db(path)
    text, report = execute(ROOT / 'notebooks' / 'compare.ipynb', {'ZOO_DB': str(path), 'ZOO_TASK': None,
                                                                 'ZOO_DATASET': None, 'ZOO_METRIC': None})
    assert 'classification / digits: 2 models ranked by val/acc1' in text      # a row per token mixer (issue 15.6)
    assert_readable(report, 'compare.ipynb', 3)


# ---------------------------------------------------------------------------------------------- benchmark
def _benchmark_db(tmp_path: Path) -> tuple[Path, Path]:
    """A benchmark file (two mixers x three seeds, one claim) and a database holding its runs, as
    `zoo benchmark run` records them (the job identity in hparams), with latency at batch 1 and 16."""
    import yaml

    spec = {'groups': {'mixers': {
        'task': 'classification', 'dataset': 'digits', 'recipe': 'poolformer/poolformer_tiny_digits_15e',
        'seeds': [0, 1, 2], 'batch_sizes': [1, 16],
        'entries': {m: {'model.name': 'metaformer_tiny', 'model.model_args': {'token_mixer': m}}
                    for m in ('pooling', 'attention')},
        'claims': [{'claim': 'attention beats pooling', 'compare': '>', 'entries': ['attention', 'pooling']}]}},
        'across': {'classification': {'groups': ['mixers'], 'reference': 'pooling'}}}
    path = tmp_path / 'benchmarks' / 'nb.yaml'
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(spec))
    from zoo.recipes.benchmark_spec import load
    bench = load(str(path))
    db_path = tmp_path / 'benchmarks' / 'nb.db'
    db = R.open_db(str(db_path))
    for mixer, accs, ms in (('pooling', (0.90, 0.91, 0.92), 1.0), ('attention', (0.95, 0.96, 0.97), 3.0)):
        for seed, acc in enumerate(accs):
            rid = db.start_run('metaformer_tiny', task='classification', dataset='digits', seed=seed,
                               hparams={'model_args': {'token_mixer': mixer}, 'benchmark': {
                                   'name': 'nb', 'group': 'mixers', 'entry': mixer,
                                   'key': bench.job('mixers', mixer, seed).key}},
                               params=1000, macs=2_000_000, arch_fingerprint=f'fp-{mixer}')
            db.log_metrics(rid, {'val/acc1': acc, 'train/epoch_time_s': 1.0}, epoch=0)
            db.log_metrics(rid, {'val/acc1': acc}, final=True)
            db.finish_run(rid)
        for bs in (1, 16):
            db.add_latency('metaformer_tiny', ms * bs, input_shape=(1, 32, 32), batch_size=bs, threads=1,
                           arch_fingerprint=f'fp-{mixer}', source='bench')
    R.close_all()
    return path, db_path


def test_benchmark_notebook_draws_the_report_from_a_database(tmp_path):
    spec, db = _benchmark_db(tmp_path)
    text, report = execute(ROOT / 'notebooks' / 'benchmark.ipynb', {'ZOO_BENCHMARK': str(spec), 'ZOO_DB': str(db)})
    assert 'benchmark: nb | 1 groups, 6 jobs' in text and "6 runs; {'finished': 6}" in text
    assert 'mixers: classification on digits, metric val/acc1' in text
    assert '0.9600 [' in text and 'attention beats pooling' in text and "verdicts: {'holds': 1}" in text
    assert 'classification: val/acc1 over mixers relative to pooling' in text and '1.055' in text   # 0.96 / 0.91
    assert_readable(report, 'benchmark.ipynb', 1)


def test_benchmark_notebook_without_a_database_says_how_to_make_one():
    text, report = execute(ROOT / 'notebooks' / 'benchmark.ipynb', {'ZOO_BENCHMARK': None, 'ZOO_DB': None})
    assert 'benchmark: paper_blocks' in text
    if not (ROOT / 'benchmarks' / 'paper_blocks.db').exists():
        assert 'zoo benchmark run paper_blocks` writes it' in text and report == []


# ------------------------------------------------------------------------------------------ optuna-dashboard
def test_optuna_dashboard_reads_the_studies_in_our_results_database(tmp_path):
    """`optuna-dashboard <URL>` on the results database: its WSGI app lists the studies `zoo sweep` keeps there
    (the zoo_ tables beside Optuna's do not disturb it) and serves their trials."""
    optuna = pytest.importorskip('optuna')
    dashboard = pytest.importorskip('optuna_dashboard', reason='the notebooks extra: pip install -e .[notebooks]')
    from wsgiref.util import setup_testing_defaults

    path = tmp_path / 'results.db'
    _mixer_db(path)                                   # runs and latency rows first: a real results database
    url = R.resolve_url(str(path))
    study = optuna.create_study(study_name='metaformer_digits_latency', storage=url,
                                directions=['maximize', 'minimize'])
    study.optimize(lambda t: (t.suggest_float('lr', 1e-4, 1e-2, log=True), 1.0), n_trials=2)
    app = dashboard.wsgi(url)

    def get(route: str) -> dict:
        env: dict = {}
        setup_testing_defaults(env)
        env.update(PATH_INFO=route, REQUEST_METHOD='GET')
        status = []
        body = b''.join(app(env, lambda s, headers, exc_info=None: status.append(s)))
        assert status == ['200 OK'], (route, status, body[:300])
        return json.loads(body)

    summaries = get('/api/studies')['study_summaries']
    assert [(s['study_name'], s['directions']) for s in summaries] == [
        ('metaformer_digits_latency', ['maximize', 'minimize'])]
    detail = get(f"/api/studies/{summaries[0]['study_id']}")
    assert len(detail['trials']) == 2


# -------------------------------------------------------------------------------------- the data script
def test_notebook_data_latency_only_rewrites_the_latency_and_keeps_the_runs(tmp_path, capsys):
    """What the lead runs on a quiet machine: no training database there, so only the latency CSV and its
    load record are written; the rows carry the fingerprints the shipped runs are joined by."""
    import pandas as pd

    from experiments import notebook_data

    out = tmp_path / 'data'
    out.mkdir()
    (out / 'mixers_runs.csv').write_text('kept\n')
    assert notebook_data.main(['--latency-only', '--mixers', 'pooling,identity', '--repeats', '2',
                               '--db', str(tmp_path / 'fresh.db'), '--out', str(out)]) == 0
    assert (out / 'mixers_runs.csv').read_text() == 'kept\n'
    lat = pd.read_csv(out / 'mixers_latency.csv')
    assert sorted(lat.batch_size) == [1, 1, 64, 64] and set(lat.threads) == {1}
    shipped = pd.read_csv(ROOT / 'notebooks' / 'data' / 'mixers_runs.csv')
    fps = set(shipped[shipped.token_mixer.isin(['pooling', 'identity'])].arch_fingerprint)
    assert set(lat.arch_fingerprint) == fps and len(fps) == 2
    meta = json.loads((out / 'mixers_latency_meta.json').read_text())
    assert set(meta['loadavg_1m_before_after']) == {'1', '64'} and meta['threads'] == 1
    assert (out / 'conv_dncnn.csv').exists() and (out / 'conv_convbn.csv').exists()
    with pytest.raises(SystemExit) as e:
        notebook_data.main(['--latency-only', '--mixers', 'poolin', '--out', str(out)])
    assert e.value.code == 2 and "unknown token mixer(s) ['poolin']" in capsys.readouterr().err
