"""benchmarks/piip_bench.py compare: the side-by-side table of the CPU-scale PIIP comparison, read from a results
database that the test writes (two configurations, three seeds each, known metrics)."""
from __future__ import annotations

import math

import pytest

from benchmarks.piip_bench import compare_table, format_compare, main
from zoo.eval.results import ResultsDB

_ONE_BRANCH = {'img_sizes': [32], 'embed_dims': [64], 'depths': [1], 'num_heads': [2], 'drop_path_rates': [0.0],
               'num_interactions': 1}
_THREE = {'img_sizes': [16, 32, 32], 'embed_dims': [64, 32, 32], 'depths': [1, 1, 1], 'num_heads': [2, 2, 2],
          'drop_path_rates': [0.0, 0.0, 0.0], 'num_interactions': 1}


def _write_runs(path):
    db = ResultsDB(f'sqlite:///{path}')
    accs = {'piip3': [0.50, 0.60, 0.70], 'vit1': [0.40, 0.44, 0.48]}
    for label, args in (('piip3', _THREE), ('vit1', _ONE_BRANCH)):
        for seed, acc in enumerate(accs[label]):
            # a timm model records no task (no registry record): compare infers it from the metrics
            task = 'classification' if label == 'piip3' else None
            rid = db.start_run('piip_tiny', task=task, dataset='shapes', stage='fit', seed=seed,
                               max_epochs=2, recipe=f'recipes/configs/piip/{label}.yaml', macs=1_000_000,
                               hparams={'name': 'piip_tiny', 'model_args': args, 'num_classes': 6, 'in_chans': 3},
                               config={'data': {'init_args': {'img_size': 32}}})
            db.log_metrics(rid, {'val/acc1': acc}, final=True)
            db.finish_run(rid)
    rid = db.start_run('piip_tiny', task='classification', dataset='shapes', stage='fit', seed=9,  # not counted
                       recipe='recipes/configs/piip/vit1.yaml', hparams={'name': 'piip_tiny'})
    db.finish_run(rid, status='failed', error='boom')
    return accs


def test_compare_reads_the_seeds_and_puts_ratios_beside_them(tmp_path):
    path = tmp_path / 'cmp.db'
    accs = _write_runs(path)
    rows = {r['config']: r for r in compare_table(str(path))}
    assert set(rows) == {'piip3', 'vit1'}
    p, v = rows['piip3'], rows['vit1']
    assert (p['branches'], v['branches'], p['seeds'], p['side']) == (3, 1, [0, 1, 2], 32)
    assert v['seeds'] == [0, 1, 2]      # the failed run (seed 9) is left out
    acc = p['val/acc1']
    assert acc['values'] == pytest.approx(accs['piip3'])
    # Student t, 2 degrees of freedom: t_0.975 = 4.3027; sd of (0.5, 0.6, 0.7) = 0.1
    assert acc['mean'] == pytest.approx(0.6) and acc['half'] == pytest.approx(4.302653 * 0.1 / math.sqrt(3))
    # the runs' counter MACs plus the deformable sampling of the 3-branch model (2 units x 2 directions):
    # 5 MACs x points 4 x value width (D / 2) per query token
    sampling = 5 * 4 * (1 * 32 + 4 * 16) + 5 * 4 * (4 * 16 + 4 * 16)
    assert p['macs'] == 1_000_000 + sampling and v['macs'] == 1_000_000
    assert v['macs_ratio'] == 1.0 and p['macs_ratio'] == pytest.approx(p['macs'] / v['macs'])
    assert 'latency_ms' not in p
    table = format_compare(list(rows.values()), str(path))
    assert '60.0 ± 24.8 (50.0, 60.0, 70.0)' in table and 'to be measured' in table


def test_compare_measure_stores_latency_keyed_by_architecture(tmp_path):
    path = tmp_path / 'cmp.db'
    _write_runs(path)
    rows = {r['config']: r for r in compare_table(str(path), measure=True, repeats=2, warmup=1)}
    assert rows['vit1']['latency_ratio'] == 1.0 and rows['piip3']['latency_ratio'] > 0
    lat = ResultsDB(f'sqlite:///{path}').latency()
    assert len(lat) == 2 and lat.run_id.isna().all() and lat.arch_fingerprint.nunique() == 2
    again = {r['config']: r for r in compare_table(str(path))}   # read back, no timing
    assert again['piip3']['latency_ms'] == rows['piip3']['latency_ms']


def test_compare_cli_errors(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(['compare'])
    assert e.value.code == 2 and '--db' in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(['compare', '--db', str(tmp_path / 'missing.db')])
    assert e.value.code == 2 and 'no database' in capsys.readouterr().err
    ResultsDB(f'sqlite:///{tmp_path / "empty.db"}')
    assert main(['compare', '--db', str(tmp_path / 'empty.db')]) == 2
    assert 'no finished fit runs' in capsys.readouterr().err


def test_compare_detectors_count_their_backbones_apart(tmp_path):
    db = ResultsDB(f'sqlite:///{tmp_path / "det.db"}')
    for label, args in (('det3', _THREE), ('det1', _ONE_BRANCH)):
        rid = db.start_run('yolo_det', task='detection', dataset='shapes_det', stage='fit', seed=0, max_epochs=1,
                           recipe=f'{label}.yaml', config={'data': {'init_args': {'img_size': 64}}},
                           hparams={'name': 'yolo_det', 'num_classes': 3, 'in_chans': 3,
                                    'model_args': {'backbone': 'piip_tiny', 'backbone_kwargs': args,
                                                   'neck_channels': [32, 64, 64]}})
        db.log_metrics(rid, {'val/map50': 0.5, 'val/map': 0.25}, final=True)
        db.finish_run(rid)
    rows = {r['config']: r for r in compare_table(str(tmp_path / 'det.db'))}
    d3, d1 = rows['det3'], rows['det1']
    assert (d3['branches'], d1['branches']) == (3, 1)
    assert d3['val/map50']['values'] == [0.5] and math.isnan(d3['val/map']['half'])
    # the same neck and head on both: the whole detectors differ by what their backbones differ by
    assert 0 < d3['backbone_macs'] < d3['macs'] and 0 < d1['backbone_macs'] < d1['macs']
    assert d3['macs'] - d1['macs'] == d3['backbone_macs'] - d1['backbone_macs']
