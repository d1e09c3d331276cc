"""issue 42, defect 2 and the results board's rough edges, through `zoo results` where a new user met them.

- Runs on two datasets (an ADE20K-layout folder and a VOC-layout folder, both called ``data``) are two
  datasets in the database and two rows of the segmentation board, in every output format.
- The board, ``results.data()`` and the benchmark report pick the same latency record of a network (one rule:
  ``results.pick_latency``, zoo bench first), and the board's header says that rule.
- A ``--task``, ``--dataset`` or ``--model`` that matches no run is a one-line error naming the close matches.
"""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image
from zoo_cli import error_line, tree, zoo, zoo_in_process

pytestmark = pytest.mark.xdist_group('test_new_user_results')


def _image(path: Path, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rgb = np.random.default_rng(seed).integers(0, 255, (32, 32, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(path)


def _mask(path: Path, values: tuple[int, ...], palette: list[int] | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    m = np.zeros((32, 32), np.uint8)
    for k, v in enumerate(values):       # one vertical band per class id
        m[:, k * 32 // len(values):(k + 1) * 32 // len(values)] = v
    im = Image.fromarray(m, mode='P' if palette else 'L')
    if palette:
        im.putpalette(palette)
    im.save(path)


def _ade(root: Path) -> Path:
    """An ADE20K-layout folder: images/ and annotations/, training and validation, 3 classes (1..3)."""
    for split, n in (('training', 4), ('validation', 2)):
        for i in range(n):
            _image(root / 'images' / split / f'ADE_{split}_{i:04d}.jpg', i)
            _mask(root / 'annotations' / split / f'ADE_{split}_{i:04d}.png', (0, 1, 2, 3))
    (root / 'objectInfo150.csv').write_text('Idx,Ratio,Train,Val,Name\n1,0.1,1,1,wall\n2,0.1,1,1,sky\n'
                                            '3,0.1,1,1,floor\n')
    return root


def _voc(root: Path) -> Path:
    """A VOC-layout folder: JPEGImages/, palette-indexed SegmentationClass/, ImageSets/Segmentation lists."""
    from zoo.datasets.segmentation import voc_palette

    palette = [c for rgb in voc_palette(256) for c in rgb]
    lists = root / 'ImageSets' / 'Segmentation'
    lists.mkdir(parents=True)
    for split, names in (('train', ['a', 'b', 'c', 'd']), ('val', ['e', 'f'])):
        (lists / f'{split}.txt').write_text('\n'.join(names) + '\n')
        for i, n in enumerate(names):
            _image(root / 'JPEGImages' / f'{n}.jpg', i)
            _mask(root / 'SegmentationClass' / f'{n}.png', (0, 15, 255), palette)
    return root


def _recipe(path: Path, data_class: str, data_args: dict) -> Path:
    cfg = {'seed_everything': 0,
           'trainer': {'accelerator': 'cpu', 'devices': 1, 'max_epochs': 1, 'limit_train_batches': 1,
                       'limit_val_batches': 1, 'enable_progress_bar': False, 'enable_model_summary': False},
           'model': {'class_path': 'zoo.recipes.Segmentation', 'init_args': {'name': 'semfpn_seg_tiny'}},
           'data': {'class_path': data_class, 'init_args': {'img_size': 32, 'batch_size': 2, **data_args}}}
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope='module')
def two_datasets(tmp_path_factory):
    """One tiny segmentation run on an ADE20K-layout folder and one on a VOC-layout folder, both named ``data``
    (a new user's first two datasets), recorded in one results database by ``zoo fit`` (in this process: the tests
    read what the fits recorded)."""
    work = tmp_path_factory.mktemp('two_datasets')
    ade, voc = _ade(work / 'ade' / 'data'), _voc(work / 'voc' / 'data')
    for name, cls, root in (('on_ade', 'zoo.datasets.ADE20KDataModule', ade),
                            ('on_voc', 'zoo.datasets.VOCSegDataModule', voc)):
        proc = zoo_in_process('fit', '-c', _recipe(work / f'{name}.yaml', cls, {'root': str(root)}), cwd=work)
        assert proc.returncode == 0, proc.stderr[-3000:]
    return work


def test_two_folders_of_one_name_are_two_datasets_in_the_database(two_datasets):
    """Both folders are called ``data``: their runs must not be recorded as one dataset (their layout, and a
    digest of where they are, tell them apart), yet each name still says the folder's name."""
    with sqlite3.connect(two_datasets / 'zoo-results.db') as con:
        names = [r[0] for r in con.execute("select dataset from zoo_runs where status = 'finished' order by id")]
    assert len(names) == 2 and len(set(names)) == 2, names
    assert names[0].startswith('ade20k:data@') and names[1].startswith('voc:data@'), names


def test_segmentation_board_keeps_each_dataset_in_every_format(two_datasets):
    """`zoo results --task segmentation` without --dataset: one row per (model, model args, dataset); the
    other dataset's run does not disappear behind the better value, and every format names the dataset."""
    from zoo.eval import results

    db = str(two_datasets / 'zoo-results.db')
    with sqlite3.connect(db) as con:
        ade, voc = [r[0] for r in con.execute('select dataset from zoo_runs order by id')]

    proc = zoo('results', '--task', 'segmentation', '--format', 'json', cwd=two_datasets)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert sorted(r['dataset'] for r in rows) == sorted([ade, voc]) and [r['n_seeds'] for r in rows] == [1, 1]
    # the table, with one Pareto plot per dataset (a front across two datasets compares nothing)
    proc = zoo('results', '--task', 'segmentation', '--plot', 'p.png', cwd=two_datasets)
    assert proc.returncode == 0, proc.stderr
    assert 'dataset' in proc.stdout and ade in proc.stdout and voc in proc.stdout, proc.stdout
    assert len(list(two_datasets.glob('p_*.png'))) == 2, proc.stderr

    board = results.leaderboard('segmentation', db=db)
    header, *lines = results.format_board(board, 'csv').strip().splitlines()
    assert 'dataset' in header.split(',') and len(lines) == 2
    assert sum(ade in ln for ln in lines) == 1 and sum(voc in ln for ln in lines) == 1
    markdown = results.format_board(board, 'markdown')
    assert '| dataset' in markdown and ade in markdown and voc in markdown
    results.close_all()


def _finished(db, model: str, dataset: str, task: str, metric: str, value: float, **fields) -> int:
    rid = db.start_run(model, task=task, dataset=dataset, seed=0, **fields)
    db.log_metrics(rid, {metric: value}, final=True)
    db.finish_run(rid)
    return rid


def test_classification_and_detection_boards_keep_datasets_apart(tmp_path):
    """The same board function: a model on two datasets is two rows of its task's board."""
    from zoo.eval import results

    db = results.ResultsDB(str(tmp_path / 'zoo-results.db'))
    for task, metric in (('classification', 'val/acc1'), ('detection', 'val/map')):
        _finished(db, f'{task}_tiny', 'first', task, metric, 0.9)
        _finished(db, f'{task}_tiny', 'second', task, metric, 0.4)
    db.close()
    proc = zoo('results', '--format', 'json', cwd=tmp_path)       # both tasks: one table with a task column
    assert proc.returncode == 0, proc.stderr
    assert sorted((r['task'], r['dataset'], r['mean']) for r in json.loads(proc.stdout)) == [
        ('classification', 'first', 0.9), ('classification', 'second', 0.4),
        ('detection', 'first', 0.9), ('detection', 'second', 0.4)]


def test_board_data_and_benchmark_report_pick_the_same_latency(tmp_path):
    """PIIP UperNet's case: the run's own after-training record (1 thread, 56.9 ms) and a `zoo bench` record of
    the same network (2 threads, 38.1 ms). The board and its plot, results.data() and the benchmark report
    (which reads results.data()) all take the zoo bench record, and the board's header says the rule."""
    from zoo.eval import results

    path = str(tmp_path / 'zoo-results.db')
    db = results.ResultsDB(path)
    rid = _finished(db, 'upernet_piip_tiny', 'shapes_seg', 'segmentation', 'val/miou', 0.5, arch_fingerprint='fp')
    for ms, source, threads in ((56.9, 'fit', 1), (38.1, 'bench', 2)):
        db.add_latency('upernet_piip_tiny', ms, input_shape=(3, 64, 64), batch_size=1, arch_fingerprint='fp',
                       run_id=rid if source == 'fit' else None, source=source, threads=threads, cpus=2, load_1m=0.2,
                       repeats=50)
    db.close()

    proc = zoo('results', '--format', 'json', cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    [row] = json.loads(proc.stdout)
    assert (row['latency_ms'], row['latency_source'], row['latency_threads']) == (38.1, 'bench', 2)
    [run] = results.data(db=path).to_dict('records')
    assert run['latency_eager_ms'] == row['latency_ms'] and run['latency_threads'] == '2'
    board = results.leaderboard(db=path)
    assert board.attrs['threads'] == 2       # what the plot's axis says
    assert 'pick_latency: zoo bench before after-training records' in ' '.join(results.format_board(board).split())
    results.close_all()


@pytest.fixture
def shapes_db(tmp_path):
    """A results database with one finished segmentation run on shapes_seg and a classification one on digits."""
    from zoo.eval import results

    db = results.ResultsDB(str(tmp_path / 'zoo-results.db'))
    _finished(db, 'semfpn_seg_tiny', 'shapes_seg', 'segmentation', 'val/miou', 0.6)
    _finished(db, 'resnet_tiny', 'digits', 'classification', 'val/acc1', 0.9)
    db.close()
    return tmp_path


@pytest.mark.parametrize('args, expected', [
    (['--dataset', 'shapes_sge'], "no run has dataset 'shapes_sge'; did you mean shapes_seg?"),
    (['--data', '--task', 'segmentaton'], "no run has task 'segmentaton'; did you mean segmentation?"),
])
def test_a_filter_that_matches_no_run_names_the_close_matches(shapes_db, args, expected):
    before = tree(shapes_db)
    proc = zoo('results', *args, cwd=shapes_db)
    assert proc.returncode == 2
    line = error_line(proc)
    assert line.startswith('zoo results: error: ') and expected in line, line
    assert tree(shapes_db) == before


@pytest.mark.parametrize('args, expected', [
    (['--task', 'segmentaton'], "no run has task 'segmentaton'; did you mean segmentation?"),
    (['--model', 'semfpn_seg_tny'], "no run has model 'semfpn_seg_tny'; did you mean semfpn_seg_tiny?"),
    (['--task', 'segmentation', '--dataset', 'digits'],
     "no run has dataset 'digits' among the runs of task 'segmentation'"),
    (['--runs', '--dataset', 'shapes_sge'], 'did you mean shapes_seg?'),
    (['--aggregate', '--dataset', 'shapes_sge'], 'did you mean shapes_seg?'),
])
def test_every_results_view_names_the_close_matches(shapes_db, args, expected, capsys):
    from zoo.eval import results
    from zoo.recipes.main import main

    assert main(['results', '--db', str(shapes_db / 'zoo-results.db'), *args]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith('zoo results: error: ') and expected in line, line
    results.close_all()


def test_results_data_from_python_names_the_close_matches(shapes_db):
    from zoo.eval import results

    with pytest.raises(ValueError, match="no run has task 'segmentaton'; did you mean segmentation"):
        results.data(db=str(shapes_db / 'zoo-results.db'), task='segmentaton')
    with pytest.raises(ValueError, match='did you mean shapes_seg'):
        results.leaderboard(db=str(shapes_db / 'zoo-results.db'), dataset='shapes_sge')
    results.close_all()
