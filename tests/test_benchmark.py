"""``zoo benchmark run|report`` and ``results.data()`` on tiny benchmarks the tests write (the digits recipe, one
epoch of a few steps, a MetaFormer a few thousand parameters big); ``benchmarks/paper_blocks.yaml`` is only
checked (``--dry-run``) and its published report regenerated from its shipped database, never run here."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from zoo.eval import results as R
from zoo.recipes.main import main

ROOT = Path(__file__).resolve().parents[1]
SMALL = {'dims': [8, 8, 8, 8], 'depths': [1, 1, 1, 1]}
FAST = {'trainer.max_epochs': 1, 'trainer.limit_train_batches': 2, 'trainer.limit_val_batches': 1,
        'trainer.num_sanity_val_steps': 0, 'trainer.enable_model_summary': False, 'model.name': 'metaformer_tiny'}


def write(tmp: Path, name: str, entries: dict, seeds=(0,), extra: dict | None = None, claims=None) -> Path:
    group = {'task': 'classification', 'dataset': 'digits', 'recipe': 'poolformer/poolformer_tiny_digits_15e',
             'overrides': {**FAST, **(extra or {})}, 'seeds': list(seeds), 'batch_sizes': [1, 16],
             'entries': {e: {'model.model_args': {'token_mixer': m, **SMALL}} for e, m in entries.items()}}
    if claims:
        group['claims'] = claims
    path = tmp / 'benchmarks' / f'{name}.yaml'
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({'description': 'a test benchmark', 'groups': {'mixers': group}}, sort_keys=False))
    return path


def zoo(*args, cwd: Path, env: dict | None = None, popen: bool = False):
    """``zoo ARGS`` in a subprocess (the runner is a process of its own; the jobs are its children). With
    ``--no-latency`` the jobs' own end-of-fit latency is off too: those tests check the runner, never latency."""
    full = {**os.environ, 'PYTHONPATH': os.pathsep.join([str(ROOT / 'tests'), str(ROOT)]), 'OMP_NUM_THREADS': '1',
            'ZOO_RUNS': str(cwd / 'runs'), **({'ZOO_RECORD_LATENCY': '0'} if '--no-latency' in args else {}),
            **(env or {})}
    full.pop('ZOO_RUN_DIR', None)
    cmd = [sys.executable, '-m', 'zoo.recipes.main', *args]
    if popen:
        return subprocess.Popen(cmd, cwd=cwd, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
    return subprocess.run(cmd, cwd=cwd, env=full, capture_output=True, text=True, timeout=900)


def rows(db: Path):
    R.close_all()
    df = R.data(db=str(db), status=None)
    R.close_all()
    return df


# one pytest-xdist worker runs the whole file (make test: --dist loadgroup), so the module fixture below
# is built once
pytestmark = pytest.mark.xdist_group(__name__)


@pytest.fixture(scope='module')
def ran(tmp_path_factory):
    """One tiny benchmark (two mixers, one seed), run once by two worker threads, with latency."""
    tmp = tmp_path_factory.mktemp('bench')
    write(tmp, 'tiny', {'pooling': 'pooling', 'identity': 'identity'},
          claims=[{'claim': 'pooling beats identity', 'paper': 'MetaFormer', 'compare': '>',
                   'entries': ['pooling', 'identity']}])
    first = zoo('benchmark', 'run', 'tiny', '--time', '0', '--workers', '2', cwd=tmp)
    assert first.returncode == 0, first.stdout + first.stderr
    return tmp, first


def test_run_once_then_nothing_and_the_report_is_byte_identical(ran, monkeypatch, capsys):
    tmp, first = ran
    db = tmp / 'benchmarks' / 'tiny.db'
    assert '2 to run' in first.stderr and '2 finished' in first.stderr and '4 latency rows written' in first.stderr
    df = rows(db)
    assert sorted(zip(df.entry, df.seed)) == [('identity', 0), ('pooling', 0)]
    assert set(df.status) == {'finished'} and set(df.benchmark) == {'tiny'}
    lat = len(R.latency(db=str(db)))
    monkeypatch.chdir(tmp)
    assert main(['benchmark', 'run', 'tiny']) == 0
    err = capsys.readouterr().err
    assert '0 to run' in err and 'nothing to do' in err and 'latency rows written' not in err, err
    assert len(rows(db)) == 2 and len(R.latency(db=str(db))) == lat          # nothing new, not even latency
    R.close_all()
    out = []
    for _ in range(2):
        assert main(['benchmark', 'report', 'tiny']) == 0
        md, svg = tmp / 'docs' / 'benchmarks' / 'tiny.md', tmp / 'docs' / 'benchmarks' / 'tiny' / 'mixers.svg'
        out.append((md.read_bytes(), svg.read_bytes()))
        R.close_all()
    assert out[0] == out[1]
    text = out[0][0].decode()
    assert '| pooling |' in text and '| identity |' in text and 'eager b16 ms' in text
    assert 'zoo fit -c poolformer/poolformer_tiny_digits_15e' in text and '--seeds 0' in text
    assert 'pooling beats identity' in text and 'an interval needs two' in text and 'CPU:' in text
    assert '](tiny/mixers.svg)' in text and b'<svg' in out[0][1]


def test_a_failed_latency_is_recorded_reported_and_retried_on_request(ran, tmp_path, monkeypatch, capsys):
    """A runtime that fails on a network (here compile, made to fail) leaves a failure row with its error, a
    "failed" cell and its error under the group's table; the next invocation does not try it again, and
    ``--retry-failed`` does. On a copy of the ``ran`` benchmark with compile added: nothing is trained."""
    import shutil

    from zoo.eval import bench as zbench

    src, _ = ran
    (tmp_path / 'benchmarks').mkdir()
    shutil.copy(src / 'benchmarks' / 'tiny.db', tmp_path / 'benchmarks' / 'tiny.db')
    spec = yaml.safe_load((src / 'benchmarks' / 'tiny.yaml').read_text())
    spec['groups']['mixers']['runtimes'] = ['eager', 'compile']
    (tmp_path / 'benchmarks' / 'tiny.yaml').write_text(yaml.safe_dump(spec, sort_keys=False))
    tried = []

    def failing(model, runtime, *args, **kwargs):
        tried.append(runtime)
        raise RuntimeError('compile broke\nsecond line')
    monkeypatch.setattr(zbench, '_prepare', failing)
    monkeypatch.chdir(tmp_path)
    db = str(tmp_path / 'benchmarks' / 'tiny.db')

    assert main(['benchmark', 'run', 'tiny']) == 0
    assert tried == ['compile'] * 4                                   # 2 networks x batch 1 and 16
    assert 'in compile failed: RuntimeError: compile broke' in capsys.readouterr().err
    R.close_all()
    fails = R.open_db(db).latency_failures()
    assert sorted(zip(fails.batch_size, fails.runtime)) == [(1, 'compile')] * 2 + [(16, 'compile')] * 2
    assert set(fails.error) == {'RuntimeError: compile broke'} and fails.arch_fingerprint.notna().all()
    assert fails.cpu_model.notna().all()
    R.close_all()

    assert main(['benchmark', 'run', 'tiny']) == 0 and len(tried) == 4          # not again without asking
    assert main(['benchmark', 'report', 'tiny']) == 0
    text = (tmp_path / 'docs' / 'benchmarks' / 'tiny.md').read_text()
    assert 'compile b16 ms' in text and '| failed |' in text
    assert '- pooling: compile at batch 16 failed: RuntimeError: compile broke' in text
    R.close_all()
    assert main(['benchmark', 'run', 'tiny', '--retry-failed']) == 0 and len(tried) == 8
    R.close_all()
    assert len(R.open_db(db).latency_failures()) == 8                         # each attempt is kept
    R.close_all()


def test_data_has_the_documented_columns(ran):
    tmp, _ = ran
    df = rows(tmp / 'benchmarks' / 'tiny.db')
    assert list(df.columns[:len(R.DATA_COLUMNS)]) == R.DATA_COLUMNS
    assert {'blocks_token_mixer', 'val/acc1', 'train/epoch_time_s'} <= set(df.columns)
    r = df[df.entry == 'pooling'].iloc[0]
    assert r.metric == 'val/acc1' and r.final == r['val/acc1'] and r.best >= 0 and r.epochs == 1
    assert r.params > 0 and r.macs > 0 and r.size_mb > 0 and r.weighted_layers > 0 and r.leaf_modules > 0
    assert r.blocks_token_mixer == 4 and r.blocks['token_mixer'] == 4 and r.peak_activation_mb > 0
    assert r.input_shape == '1x32x32' and r.epoch_time_s > 0 and r.samples_per_s > 0
    assert r.latency_eager_ms > 0 and r.latency_eager_b16_ms > 0 and r.latency_cpu
    assert json.loads(r.hparams)['model_args']['token_mixer'] == 'pooling'
    R.close_all()
    best = R.data(db=str(tmp / 'benchmarks' / 'tiny.db'), only_best=True, model='metaformer*')
    R.close_all()
    assert sorted(best.entry) == ['identity', 'pooling']             # one run per model arguments
    capture = zoo('results', '--data', '--format', 'json', '--db', str(tmp / 'benchmarks' / 'tiny.db'), cwd=tmp)
    assert capture.returncode == 0, capture.stderr
    assert [r['run_id'] for r in json.loads(capture.stdout)] == sorted(df.run_id.tolist())


@pytest.mark.slow
def test_a_killed_runner_resumes_and_loses_only_the_run_in_progress(tmp_path):
    write(tmp_path, 'kill', {'pooling': 'pooling'},
          extra={'trainer.callbacks+': 'interrupt_callback.Sleep', 'trainer.callbacks.init_args.seconds': 3})
    db = tmp_path / 'benchmarks' / 'kill.db'
    proc = zoo('benchmark', 'run', 'kill', '--no-latency', cwd=tmp_path, popen=True)
    try:
        deadline = time.time() + 300
        while time.time() < deadline:      # wait until the job's zoo fit has taken its row over
            if db.exists():
                df = rows(db)
                if len(df) and (df.status == 'running').any() and (tmp_path / 'runs').exists() and any(
                        (tmp_path / 'runs').rglob('run.json')):
                    break
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGKILL)       # the runner and its zoo fit, as a power cut would
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    again = zoo('benchmark', 'run', 'kill', '--no-latency', cwd=tmp_path)
    assert again.returncode == 0 and '1 to run' in again.stderr, again.stderr
    df = rows(db)
    assert sorted(df.status) == ['crashed', 'finished']


@pytest.mark.slow
def test_a_failure_is_recorded_and_retried_on_request(tmp_path):
    marker = tmp_path / 'FAIL'
    marker.write_text('')
    write(tmp_path, 'fails', {'pooling': 'pooling'},
          extra={'trainer.callbacks+': 'interrupt_callback.FailIfExists',
                 'trainer.callbacks.init_args.path': str(marker)})
    db = tmp_path / 'benchmarks' / 'fails.db'
    first = zoo('benchmark', 'run', 'fails', '--no-latency', cwd=tmp_path)
    assert first.returncode == 1 and '1 job(s) failed' in first.stderr and '--retry-failed' in first.stderr
    df = rows(db)
    assert list(df.status) == ['failed'] and 'failing while FAIL exists' in df.error.iloc[0]
    marker.unlink()
    assert '0 to run' in zoo('benchmark', 'run', 'fails', '--no-latency', cwd=tmp_path).stderr   # not without asking
    retry = zoo('benchmark', 'run', 'fails', '--no-latency', '--retry-failed', cwd=tmp_path)
    assert retry.returncode == 0, retry.stderr
    assert list(rows(db).status) == ['failed', 'finished']


@pytest.mark.slow
def test_two_workers_share_one_database_without_running_a_job_twice(tmp_path):
    write(tmp_path, 'shared', {'pooling': 'pooling', 'identity': 'identity'})
    procs = [zoo('benchmark', 'run', 'shared', '--no-latency', cwd=tmp_path, popen=True) for _ in range(2)]
    outs = [p.communicate(timeout=900)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    df = rows(tmp_path / 'benchmarks' / 'shared.db')
    assert sorted(df.entry) == ['identity', 'pooling'] and set(df.status) == {'finished'}


@pytest.mark.parametrize('edit, message', [
    (lambda g: g.update(tsak='classification'), "unknown key 'tsak'; did you mean task?"),
    (lambda g: g.update(task='clasification'), "unknown task 'clasification'; did you mean classification?"),
    (lambda g: g.update(runtimes=['onnx']), "unknown runtime 'onnx'; did you mean onnxruntime"),
    (lambda g: g.update(batch_sizes=[1, 8]), 'batch_sizes: 8 is not one of 1, 16'),
    (lambda g: g.update(recipe='poolformer/poolformer_tiny_digit_15e'), 'did you mean'),
    (lambda g: g['entries']['pooling'].update({'model.name': 'metaformer_tiyn'}), "Did you mean 'metaformer_tiny'"),
    (lambda g: g['entries']['pooling'].update({'model.model_args': {'token_mixer': 'poolin'}}), 'pooling'),
    (lambda g: g.update(pretrained_from={'group': 'mixer', 'entry': 'pooling'}), "did you mean mixers?"),
    (lambda g: g.update(claims=[{'claim': 'c', 'compare': '>', 'entries': ['pooling', 'pool']}]),
     "unknown entry 'pool'"),
])
def test_bad_benchmark_files_are_one_line_errors_with_close_matches(tmp_path, monkeypatch, capsys, edit, message):
    path = write(tmp_path, 'bad', {'pooling': 'pooling'})
    raw = yaml.safe_load(path.read_text())
    edit(raw['groups']['mixers'])
    path.write_text(yaml.safe_dump(raw))
    monkeypatch.chdir(tmp_path)
    assert main(['benchmark', 'run', 'bad', '--dry-run']) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / 'benchmarks' / 'bad.db').exists()


def test_unknown_benchmarks_and_bad_yaml(tmp_path, monkeypatch, capsys):
    write(tmp_path, 'tiny', {'pooling': 'pooling'})
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'benchmarks' / 'broken.yaml').write_text('groups: {a: [1, 2}\n')
    assert main(['benchmark', 'run', 'broken']) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and 'not valid YAML (line 1)' in err
    assert main(['benchmark', 'report', 'tiny']) == 2          # no database yet: nothing to report, nothing made
    assert 'no results database' in capsys.readouterr().err and not (tmp_path / 'benchmarks' / 'tiny.db').exists()


def test_unknown_benchmark_names_close_matches(tmp_path, monkeypatch, capsys):
    write(tmp_path, 'tiny', {'pooling': 'pooling'})
    monkeypatch.chdir(tmp_path)
    assert main(['benchmark', 'run', 'tinny']) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no benchmark 'tinny'" in err and 'did you mean tiny' in err


def test_paper_blocks_passes_the_dry_run(capsys):
    assert main(['benchmark', 'run', str(ROOT / 'benchmarks' / 'paper_blocks.yaml'), '--dry-run',
                 '--db', 'none']) == 0
    out = capsys.readouterr().out
    groups = ('mixers_shapes', 'weighted_shapes', 'mlp_small_data', 'resnet_shapes', 'convbn_finetune',
              'detectors_shapes_det', 'canon_copy', 'dncnn_photos', 'piip_upernet', 'backbones_shapes64',
              'semfpn_pretrained')
    for group in groups:
        assert f'ok  {group}/' in out
    assert f'paper_blocks: {len(groups)} groups' in out and '\n      ' not in out   # one line per job


def test_the_published_paper_blocks_report_is_what_its_shipped_database_gives(tmp_path, monkeypatch):
    """docs/benchmarks/paper_blocks.md and its figures, regenerated from the committed benchmarks/paper_blocks.db,
    are the committed ones: the page byte-identical (it is the database's, not edited by hand, and a change to the
    report code shows here until the page is regenerated), the same figures (their bytes are matplotlib's, which
    may change with its version, so only their names and that they are SVG)."""
    from zoo.recipes.benchmark_report import write_report
    from zoo.recipes.benchmark_spec import load

    for limit in ('ZOO_BUSY_LOAD', 'ZOO_MAX_IQR_RATIO'):     # the page users get: the real trust limits
        monkeypatch.delenv(limit, raising=False)
    bench = load(str(ROOT / 'benchmarks' / 'paper_blocks.yaml'))
    db = tmp_path / 'paper_blocks.db'                 # a copy: the report only reads, but the shipped file stays
    db.write_bytes((ROOT / 'benchmarks' / 'paper_blocks.db').read_bytes())
    md = write_report(bench, str(db), out=tmp_path)
    R.close_all()
    published = ROOT / 'docs' / 'benchmarks'
    assert md.read_text() == (published / 'paper_blocks.md').read_text()
    # the README's front-page table is the page's "What the benchmark decides" block, word for word
    from zoo.recipes.benchmark_report import SUMMARY_BEGIN, SUMMARY_END

    def block(text):
        return text[text.index(SUMMARY_BEGIN):text.index(SUMMARY_END) + len(SUMMARY_END)]
    assert block((ROOT / 'README.md').read_text()) == block(md.read_text())
    figures = sorted(p.name for p in (tmp_path / 'paper_blocks').glob('*.svg'))
    assert figures == sorted(p.name for p in (published / 'paper_blocks').glob('*.svg')) and len(figures) >= 6
    for name in figures:
        assert (published / 'paper_blocks' / name).read_text().lstrip().startswith('<?xml')


@pytest.mark.slow
def test_pretrained_from_fine_tunes_the_named_entrys_checkpoint(tmp_path):
    """convbn_finetune's shape: a group waits for the entry it starts from and gets its last checkpoint."""
    short = {'trainer.max_epochs': 1, 'trainer.limit_train_batches': 2, 'trainer.limit_val_batches': 1,
             'trainer.num_sanity_val_steps': 0, 'trainer.enable_model_summary': False}
    spec = {'groups': {
        'finetune': {'task': 'classification', 'dataset': 'digits', 'recipe': 'resnet/resnet_tiny_digits_finetune_tune_5e',
                     'overrides': short, 'pretrained_from': {'group': 'pretrain', 'entry': 'resnet'},
                     'entries': {'tune': {'model.convbn_mode': 'tune'}}},
        'pretrain': {'task': 'classification', 'dataset': 'shapes', 'recipe': 'resnet/resnet_tiny_shapes_10e',
                     'overrides': {**short, 'data.num_samples': 200}, 'entries': {'resnet': {}}}}}
    path = tmp_path / 'benchmarks' / 'ft.yaml'
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(spec, sort_keys=False))            # the dependent group first: it must wait
    done = zoo('benchmark', 'run', 'ft', '--no-latency', '--workers', '2', cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    df = rows(tmp_path / 'benchmarks' / 'ft.db').sort_values('run_id')
    assert list(zip(df.group, df.status)) == [('pretrain', 'finished'), ('finetune', 'finished')]
    R.close_all()
    cfg = R.runs(db=str(tmp_path / 'benchmarks' / 'ft.db')).config.iloc[-1]
    R.close_all()
    ckpt = cfg['model']['init_args']['checkpoint']
    assert ckpt.endswith('pretrain/resnet/seed0/resnet_tiny_shapes_10e/latest/checkpoints/last.ckpt'), ckpt
    # the latency phase rebuilds the tuned network with its ConvBN mode (without it, the fingerprint differs and
    # the network was skipped: paper_blocks' convbn_finetune had no latency)
    from zoo.eval import bench as zbench
    warned = []
    nets = zbench.recorded_networks(str(tmp_path / 'benchmarks' / 'ft.db'), warn=warned.append)
    R.close_all()
    assert not warned and sorted(n['label'] for n in nets) == [
        'resnet_tiny (conv_layer=standard)', 'resnet_tiny (conv_layer=standard, convbn_mode=tune)']


def test_network_stats_count_blocks_and_grow_with_the_input():
    import torch

    import zoo
    from zoo.eval.profile import network_stats

    mf = network_stats(zoo.create('metaformer_tiny', token_mixer='attention', depths=[1, 1, 2, 1]),
                       torch.randn(1, 3, 32, 32))
    assert mf['blocks']['token_mixer'] == 5 and mf['blocks']['channel_mixer'] == 5
    model = zoo.create('resnet_tiny', num_classes=10, conv_layer='weighted')
    small, large = (network_stats(model, torch.randn(1, 3, s, s)) for s in (16, 64))
    assert small['blocks']['conv'] > 0
    assert small['size_mb'] == pytest.approx(sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers())) / 2 ** 20)
    assert small['weighted_layers'] >= small['blocks']['conv'] and small['input_shape'] == [3, 16, 16]
    assert large['peak_activation_mb'] > 4 * small['peak_activation_mb'] > 0     # 16x the pixels


def test_pretrained_from_per_entry_sets_the_checkpoint_inside_a_mapping_override(tmp_path):
    """Two backbones, each fine-tuned from its own pretrained entry (a PoolFormer from the PoolFormer, a ResNet from
    the ResNet), with the checkpoint set inside ``model.model_args`` (the command line cannot override one key of
    a mapping argument); the job keys never hold the checkpoint's path."""
    from zoo.recipes.benchmark import Runner
    from zoo.recipes.benchmark_report import rerun_command
    from zoo.recipes.benchmark_spec import BenchmarkError, load, with_override

    arg = 'model.model_args.backbone_kwargs.checkpoint'
    spec = {'groups': {
        'pretrain': {'task': 'classification', 'recipe': 'resnet/resnet_tiny_shapes_10e',
                     'entries': {'pool': {'model.name': 'poolformer_tiny'}, 'conv': {'model.name': 'resnet_tiny'}}},
        'seg': {'task': 'segmentation', 'recipe': 'segmentation/compare_semfpn_poolformer_tiny_shapes_seg',
                'pretrained_from': {'group': 'pretrain', 'entry': {'pool': 'pool', 'conv': 'conv'}, 'arg': arg},
                'entries': {'pool': {'model.model_args': {'backbone': 'poolformer_tiny'}},
                            'conv': {'model.model_args': {'backbone': 'resnet_tiny',
                                                          'backbone_kwargs': {'stem': 'imagenet'}}}}}}}
    path = tmp_path / 'benchmarks' / 'ft.yaml'
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    bench = load(str(path))
    seg = bench.groups['seg']
    assert [seg.pretrained_entry(e) for e in ('pool', 'conv')] == ['pool', 'conv']
    job = bench.job('seg', 'conv', 3)
    argv = job.argv({arg: '/r/last.ckpt'})
    assert '--model.model_args={backbone: resnet_tiny, backbone_kwargs: {stem: imagenet, checkpoint: /r/last.ckpt}}' \
        in argv and argv[-1] == '--seed_everything=3'
    assert 'checkpoint' not in json.dumps(job.overrides)           # the job (and its key) is untouched
    runner = Runner(bench, str(tmp_path / 'ft.db'))
    deps = [runner._dependency(bench.job('seg', e, 0)) for e in ('conv', 'pool')]
    assert [(d.group, d.entry, d.seed) for d in deps] == [('pretrain', 'conv', 0), ('pretrain', 'pool', 0)]
    # a seed the sequential rule adds to the fine-tuning group brings its own pretraining job (the seed fixes the
    # checkpoint), where the pretraining group's cap allows that seed
    assert [(j.group, j.entry, j.seed) for j in runner._with_dependencies([bench.job('seg', 'pool', 1)])] == [
        ('seg', 'pool', 1)]                                          # pretrain's seeds are fixed at [0]
    R.close_all()
    for g in ('pretrain', 'seg'):
        spec['groups'][g]['seeds'] = {'min': 2, 'max': 3}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    bench = load(str(path))
    runner = Runner(bench, str(tmp_path / 'ft.db'))
    assert [(j.group, j.entry, j.seed) for j in runner._with_dependencies([bench.job('seg', 'pool', 2)])] == [
        ('pretrain', 'pool', 2), ('seg', 'pool', 2)]
    R.close_all()
    seg = bench.groups['seg']
    assert 'backbone_kwargs: {checkpoint: <checkpoint of pretrain/pool>}' in rerun_command(seg, 'pool')
    # an arg with no mapping above it is one more argument; a scalar in the way is an error, not a silent overwrite
    assert with_override({'trainer.max_epochs': 2}, 'model.checkpoint', 'c') == {'trainer.max_epochs': 2,
                                                                                'model.checkpoint': 'c'}
    with pytest.raises(BenchmarkError, match='backbone_kwargs'):
        with_override({'model.model_args': {'backbone_kwargs': 'x'}}, arg, 'c')
    # a mapping that leaves an entry out, or names an entry the pretraining group lacks, is one line
    for entry, message in (
            ({'pool': 'pool'}, "expected one pretrained entry for each of ['conv', 'pool']"),
            ({'pool': 'pool', 'conv': 'convv'}, "entry 'convv', not in group pretrain; did you mean conv?")):
        spec['groups']['seg']['pretrained_from']['entry'] = entry
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        with pytest.raises(BenchmarkError, match=message.replace('[', r'\[').replace(']', r'\]').replace('?', r'\?')):
            load(str(path))
