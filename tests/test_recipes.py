"""Recipes from the command line: every config with fast_dev_run, training that learns, resume,
overrides, print_config, fine-tuning, bad input, DDP on CPU, and the import budget."""
from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import zoo
import zoo.datasets
import zoo.recipes
from zoo.recipes.main import main

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / 'recipes' / 'configs').glob('**/*.yaml'))
DEMO = ROOT / 'recipes' / 'configs' / 'poolformer' / 'poolformer_tiny_digits_15e.yaml'
QUIET = ['--trainer.enable_progress_bar', 'false', '--trainer.enable_model_summary', 'false']


def fit(*args, command='fit') -> int:
    return main([command, *map(str, args), *QUIET])


def run_dirs(root: Path, stem: str) -> list[Path]:
    return sorted(p for p in (root / stem).glob('*') if p.is_dir() and not p.is_symlink())


def metrics(run: Path) -> list[dict]:
    with open(run / 'metrics.csv') as f:
        return list(csv.DictReader(f))


def _data_overrides(cfg: dict, tmp_path: Path) -> list[str]:
    """Offline stand-ins for data a config downloads or reads from disk."""
    data = cfg.get('data', {}).get('class_path', '')
    if data.endswith(('CIFAR10DataModule', 'CIFAR100DataModule')):
        from test_datasets import write_cifar
        write_cifar(tmp_path / 'cifar', hundred=data.endswith('CIFAR100DataModule'), n_per_batch=4)
        return ['--data.root', str(tmp_path / 'cifar'), '--data.download', 'false', '--data.num_workers', '0',
                '--data.batch_size', '4']
    if data.endswith('ADE20KDataModule'):
        from test_segmentation_data import write_ade
        write_ade(tmp_path / 'ade')
        return ['--data.root', str(tmp_path / 'ade'), '--data.num_workers', '0', '--data.batch_size', '2']
    if data.endswith(('ShapesSegDataModule', 'DigitsSegDataModule')):  # workers draw every image in setup first
        return ['--data.num_workers', '0']
    if data.endswith('ImageFolderDataModule'):
        from test_datasets import _write_images
        _write_images(tmp_path / 'images')
        return ['--data.root', str(tmp_path / 'images'), '--data.num_workers', '0', '--data.batch_size', '2']
    return []


def _model_overrides(cfg: dict, tmp_path: Path) -> list[str]:
    """A checkpoint of the right architecture for recipes that start from one (fine-tuning)."""
    args = cfg.get('model', {}).get('init_args', {})
    overrides = []
    if args.get('checkpoint'):
        net = zoo.create(args['name'], num_classes=3, **(args.get('model_args') or {}))
        torch.save(net.state_dict(), tmp_path / 'start.pth')
        overrides += ['--model.checkpoint', str(tmp_path / 'start.pth')]
    distill = args.get('distill')
    if distill:  # a distillation recipe's teacher, trained by an earlier zoo fit: random weights of its architecture
        classes = (cfg.get('data', {}).get('init_args') or {}).get('num_classes')
        net = zoo.create(distill['teacher'], num_classes=classes, **(distill.get('model_args') or {}))
        torch.save(net.state_dict(), tmp_path / 'teacher.pth')
        overrides += ['--model.distill.checkpoint', str(tmp_path / 'teacher.pth')]
    name = args.get('name')
    if isinstance(name, str) and name in zoo.list_models():
        info = zoo.model_info(name)
        if info.tiny and info.tiny != name and (info.params or 0) > 5_000_000:  # a GPU recipe: CPU-sized stand-in
            overrides += ['--model.name', info.tiny]
            if 'img_size' in (cfg.get('data', {}).get('init_args') or {}):
                overrides += ['--data.img_size', str(zoo.model_info(info.tiny).input_size[-1])]
    return overrides


@pytest.mark.parametrize('config', CONFIGS, ids=[str(c.relative_to(ROOT / 'recipes' / 'configs')) for c in CONFIGS])
def test_every_config_runs_fast_dev_run(config, runs, tmp_path):
    cfg = yaml.safe_load(config.read_text())
    assert {'trainer', 'model', 'data'} <= set(cfg), f'{config} is not complete on its own'
    assert 'class_path' in cfg['model'] and 'class_path' in cfg['data'], 'configs use the subclass form'
    extra = _data_overrides(cfg, tmp_path) + _model_overrides(cfg, tmp_path)
    if (cfg['trainer'] or {}).get('sync_batchnorm'):  # GPU recipes (segmentation): SyncBatchNorm needs CUDA
        extra += ['--trainer.sync_batchnorm', 'false']
    rc = fit('-c', config, '--trainer.fast_dev_run', 'true', '--trainer.accelerator', 'cpu', '--trainer.devices', 1,
             '--trainer.precision', '32-true', *extra)
    assert rc == 0


def test_demo_learns_in_one_short_epoch(runs):
    rc = fit('-c', DEMO, '--trainer.max_epochs', 1, '--trainer.limit_train_batches', 16,
             '--trainer.log_every_n_steps', 1)
    assert rc == 0
    [run] = run_dirs(runs, DEMO.stem)
    rows = metrics(run)
    losses = [float(r['train/loss']) for r in rows if r.get('train/loss')]
    assert len(losses) == 16 and sum(losses[-4:]) < sum(losses[:4])  # the loss goes down
    acc = [float(r['val/acc1']) for r in rows if r.get('val/acc1')]
    assert acc and acc[-1] > 0.5  # 10 classes: chance is 0.1
    hp = torch.load(run / 'checkpoints' / 'last.ckpt', weights_only=False)['hyper_parameters']
    assert hp['num_classes'] == 10 and hp['in_chans'] == 1  # linked from the data module
    assert (run / 'checkpoints' / 'last.ckpt').is_file() and list(run.glob('checkpoints/best-*.ckpt'))
    assert (runs / DEMO.stem / 'latest').resolve() == run.resolve()


def test_resume_from_last_continues_the_step_count(runs):
    short = ['-c', DEMO, '--trainer.limit_train_batches', 3, '--trainer.limit_val_batches', 1]
    assert fit(*short, '--trainer.max_epochs', 1) == 0
    [first] = run_dirs(runs, DEMO.stem)
    before = {p.name: p.stat().st_mtime_ns for p in first.rglob('*')}
    assert torch.load(first / 'checkpoints' / 'last.ckpt', weights_only=False)['global_step'] == 3
    assert fit(*short, '--trainer.max_epochs', 2, '--ckpt_path', 'last') == 0
    runs_now = run_dirs(runs, DEMO.stem)
    assert len(runs_now) == 2  # a new folder; the first run is left as it was
    assert {p.name: p.stat().st_mtime_ns for p in first.rglob('*')} == before
    resumed = torch.load(runs_now[-1] / 'checkpoints' / 'last.ckpt', weights_only=False)
    assert resumed['global_step'] == 6 and resumed['epoch'] == 1
    steps = [int(r['step']) for r in metrics(runs_now[-1])]
    assert min(steps) >= 3  # it started from step 3, not from scratch


def test_ckpt_path_last_without_a_run_is_a_clear_error(runs, capsys):
    assert fit('-c', DEMO, '--ckpt_path', 'last') == 2
    assert 'no run of' in capsys.readouterr().err


def test_overrides_reach_model_data_and_trainer(runs):
    rc = fit('-c', DEMO, '--model.name', 'metaformer_tiny', '--model.model_args', '{token_mixer: identity}',
             '--trainer.max_epochs', 1, '--data.batch_size', 32, '--trainer.limit_train_batches', 2,
             '--trainer.limit_val_batches', 1)
    assert rc == 0
    [run] = run_dirs(runs, DEMO.stem)
    saved = yaml.safe_load((run / 'config.yaml').read_text())
    assert saved['model']['init_args']['name'] == 'metaformer_tiny'
    assert saved['data']['init_args']['batch_size'] == 32 and saved['trainer']['max_epochs'] == 1
    hp = torch.load(run / 'checkpoints' / 'last.ckpt', weights_only=False)['hyper_parameters']
    assert hp['name'] == 'metaformer_tiny' and hp['model_args'] == {'token_mixer': 'identity'}


def test_print_config(runs, capsys):
    with pytest.raises(SystemExit) as e:  # jsonargparse prints and exits 0; run_lightning_cli turns it into rc
        raise SystemExit(fit('-c', DEMO, '--model.optimizer.lr', '0.01', '--print_config'))
    assert e.value.code == 0
    out = capsys.readouterr().out
    cfg = yaml.safe_load(out[out.index('seed_everything'):])
    assert cfg['model']['class_path'] == 'zoo.recipes.ImageClassifier'
    assert cfg['model']['init_args']['optimizer']['init_args']['lr'] == 0.01  # the injected optimizer's
    assert cfg['data']['class_path'] == 'zoo.datasets.DigitsDataModule'


@pytest.mark.parametrize('args, expected', [
    (['--model.name', 'poolformer_s13'], 'poolformer_s12'),  # unknown model: close matches
    (['--model.bogus', '1'], 'bogus'),  # unknown key: LightningCLI names it
    (['--data.batch_size', '5000', '--trainer.fast_dev_run', 'true'], 'larger than the training set'),
    (['--data.class_path', 'zoo.datasets.NoSuchData'], 'NoSuchData'),
])
def test_bad_input_is_a_clear_error(args, expected, runs, capsys):
    assert fit('-c', DEMO, *args) == 2
    err = capsys.readouterr().err
    assert expected in err


def test_missing_config_lists_the_recipes(runs, capsys):
    assert fit('-c', 'recipes/configs/poolformer/nope.yaml') == 2
    err = capsys.readouterr().err
    assert 'nope.yaml' in err and 'zoo list --recipes' in err
    assert fit('-c', 'poolformer/poolformer_tiny_digits_51e') == 2  # misspelt: the close names
    assert f'did you mean poolformer/{DEMO.stem}' in capsys.readouterr().err


class NaNAfterFirstEpoch(zoo.recipes.ImageClassifier):
    """Test double: the loss turns NaN from the fourth step on."""

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * float('nan') if self.global_step >= 3 else loss


def test_nan_loss_stops_with_a_message_and_keeps_the_last_good_checkpoint(runs, capsys):
    rc = fit('-c', DEMO, '--model.class_path', f'{__name__}.NaNAfterFirstEpoch', '--trainer.max_epochs', 3,
             '--trainer.limit_train_batches', 3, '--trainer.limit_val_batches', 1)
    assert rc == 2
    assert 'NaN' in capsys.readouterr().err
    [run] = run_dirs(runs, DEMO.stem)
    last = torch.load(run / 'checkpoints' / 'last.ckpt', weights_only=False)
    assert last['global_step'] == 3
    assert all(torch.isfinite(v).all() for v in last['state_dict'].values() if v.is_floating_point())


def test_checkpoint_of_another_model_is_rejected(tmp_path):
    torch.save(zoo.create('metaformer_tiny', token_mixer='attention').state_dict(), tmp_path / 'other.pth')
    with pytest.raises(ValueError, match='does not fit poolformer_tiny'):
        zoo.recipes.FineTuner('poolformer_tiny', str(tmp_path / 'other.pth'), num_classes=3)


def test_classifier_options_mixup_ema_sgd(runs):
    rc = fit('-c', DEMO, '--model.mixup_alpha', 0.8, '--model.cutmix_alpha', 1.0, '--model.ema_decay', 0.5,
             '--model.optimizer', 'torch.optim.SGD', '--model.optimizer.lr', 0.05, '--model.optimizer.momentum', 0.9,
             '--trainer.max_epochs', 1,
             '--trainer.limit_train_batches', 2, '--trainer.limit_val_batches', 1)
    assert rc == 0
    [run] = run_dirs(runs, DEMO.stem)
    sd = torch.load(run / 'checkpoints' / 'last.ckpt', weights_only=False)['state_dict']
    w = 'stem.conv.weight'
    assert not torch.equal(sd[f'ema.module.{w}'], sd[f'model.{w}'])  # the average lags the weights


def test_system_records_model_and_block_choices():
    s = zoo.recipes.ImageClassifier('metaformer_tiny', model_args={'token_mixer': 'identity'}, num_classes=4)
    assert s.model_name == 'metaformer_tiny' and s.block_choices == {'token_mixer': 'identity'}
    assert s.hparams.num_classes == 4 and s.model(torch.randn(2, 3, 32, 32)).shape == (2, 4)


# -- fine-tuning ------------------------------------------------------------------------------------
@pytest.fixture
def pretrained(tmp_path):
    torch.manual_seed(0)
    net = zoo.create('poolformer_tiny', num_classes=6)
    path = tmp_path / 'pre.pth'
    torch.save(net.state_dict(), path)
    return net, path


def test_finetune_new_head_and_loaded_backbone(pretrained):
    net, path = pretrained
    ft = zoo.recipes.FineTuner('poolformer_tiny', str(path), num_classes=3)
    assert ft.model.head.fc.out_features == 3 and ft.new_head_keys == [k for k in net.state_dict() if k.startswith('head.fc.')]
    own, src = ft.model.state_dict(), net.state_dict()
    assert all(torch.equal(own[k], src[k]) for k in src if not k.startswith('head.fc.'))


def test_finetune_frozen_backbone_stays_frozen(pretrained, runs):
    net, path = pretrained
    assert fit('-c', DEMO, '--model.class_path', 'zoo.recipes.FineTuner', '--model.checkpoint', path,
               '--model.freeze_backbone', 'true', '--model.optimizer.lr', 0.01, '--data.in_chans', 3,
               '--trainer.max_epochs', 1, '--trainer.limit_train_batches', 3, '--trainer.limit_val_batches', 1) == 0
    [run] = run_dirs(runs, DEMO.stem)
    sd = torch.load(run / 'checkpoints' / 'last.ckpt', weights_only=False)['state_dict']
    src = net.state_dict()
    frozen = [k for k in src if not k.startswith('head.fc.')]
    assert all(torch.equal(sd[f'model.{k}'], src[k]) for k in frozen)  # weights and norm statistics unchanged
    ft = zoo.recipes.FineTuner('poolformer_tiny', str(path), num_classes=10, freeze_backbone=True)
    assert {n for n, p in ft.model.named_parameters() if p.requires_grad} == {'head.fc.weight', 'head.fc.bias'}
    assert sum(len(g['params']) for g in ft.param_groups()) == 2
    assert not torch.equal(sd['model.head.fc.weight'], ft.model.head.fc.weight)  # the head trained


def test_finetune_layerwise_lr_groups(pretrained):
    """Layer-wise lr decay: the injected optimizer's lr times each group's ``lr_scale`` (the head at 1)."""
    _, path = pretrained
    ft = zoo.recipes.FineTuner('poolformer_tiny', str(path), num_classes=3, layer_decay=0.5, lr_scheduler=None,
                               optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.05))
    groups = ft.configure_optimizers().param_groups
    by_layer = {g['layer']: g['lr'] for g in groups}
    layers = sorted(by_layer)
    assert layers[0] == 0 and by_layer[layers[-1]] == pytest.approx(1e-3)  # the head gets the full lr
    assert all(by_layer[a] == pytest.approx(by_layer[b] * 0.5) for a, b in zip(layers, layers[1:]))
    names = {id(p): n for n, p in ft.model.named_parameters()}
    stem = next(g for g in groups if g['layer'] == 0)
    assert all(names[id(p)].startswith('stem.') for p in stem['params'])
    assert sum(len(g['params']) for g in groups) == len(list(ft.model.parameters()))
    assert all(g['weight_decay'] == 0 for g in groups for p in g['params'] if p.ndim == 1)
    assert {g['weight_decay'] for g in groups if any(p.ndim > 1 for p in g['params'])} == {0.05}


def test_finetune_from_a_lightning_checkpoint(runs, tmp_path):
    assert fit('-c', DEMO, '--data.in_chans', 3, '--trainer.max_epochs', 1, '--trainer.limit_train_batches', 1,
               '--trainer.limit_val_batches', 1) == 0
    ckpt = run_dirs(runs, DEMO.stem)[0] / 'checkpoints' / 'last.ckpt'
    ft = zoo.recipes.FineTuner('poolformer_tiny', str(ckpt), num_classes=4)
    sd = torch.load(ckpt, weights_only=False)['state_dict']
    assert torch.equal(ft.model.stem.conv.weight, sd['model.stem.conv.weight']) and ft.model.head.fc.out_features == 4


# -- DDP ---------------------------------------------------------------------------------------------
def test_ddp_on_cpu_trains_and_reduces_metrics_across_ranks(tmp_path):
    """Two gloo processes; the logged val/acc1 is the accuracy over the whole validation set,
    not over rank 0's half (an even-sized validation split, so DistributedSampler pads nothing)."""
    env = {**os.environ, 'ZOO_RUNS': str(tmp_path / 'runs'), 'PYTHONPATH': str(ROOT), 'OMP_NUM_THREADS': '1'}
    # a launch's own variables only: an address or port left in this process's environment by an earlier in-process
    # run (its store may still listen there) would make the two ranks rendezvous on a port already taken
    for var in ('ZOO_RUN_DIR', 'MASTER_ADDR', 'MASTER_PORT', 'RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'NODE_RANK'):
        env.pop(var, None)
    cmd = [sys.executable, '-m', 'zoo.recipes.main', 'fit', '-c', str(DEMO), '--trainer.strategy', 'ddp',
           '--trainer.devices', '2', '--trainer.accelerator', 'cpu', '--trainer.max_epochs', '1',
           '--trainer.limit_train_batches', '3', '--data.val_fraction', '0.2003', '--data.test_fraction', '0.1', *QUIET]
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [run] = run_dirs(tmp_path / 'runs', DEMO.stem)  # one folder for both ranks
    ckpt = torch.load(run / 'checkpoints' / 'last.ckpt', weights_only=False)
    assert ckpt['global_step'] == 3
    logged = [float(r['val/acc1']) for r in metrics(run) if r.get('val/acc1')][-1]
    # Recompute on one process over the whole validation split.
    hparams = {k: v for k, v in ckpt['hyper_parameters'].items() if not k.startswith('_')}  # LightningCLI's keys
    system = zoo.recipes.ImageClassifier(**hparams)
    system.load_state_dict(ckpt['state_dict'])
    dm = zoo.datasets.DigitsDataModule(val_fraction=0.2003, test_fraction=0.1)
    dm.setup('fit')
    assert len(dm.val_set) % 2 == 0
    with torch.no_grad():
        pred = system.eval().model(dm.val_set.images).argmax(-1)
    full = (pred == dm.val_set.labels).float().mean().item()
    assert logged == pytest.approx(full, abs=1e-6)


# -- import budget -----------------------------------------------------------------------------------
def test_imports_stay_light():
    code = ('import sys, zoo, zoo.recipes, zoo.datasets; '
            'print([m for m in ("lightning", "torchmetrics", "zoo.datasets.digits", "zoo.recipes.classification", '
            '"sklearn") if m in sys.modules])')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == '[]', out.stdout
    code = 'import sys, zoo; print([m for m in sys.modules if m.startswith(("zoo.datasets", "zoo.recipes"))])'
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == '[]', out.stdout


def test_demo_trains_tests_and_measures(runs, monkeypatch, tmp_path):
    from zoo.recipes.demo import train_demo
    monkeypatch.chdir(tmp_path)
    r = train_demo(extra=['--trainer.max_epochs', '1', '--trainer.limit_train_batches', '8', *QUIET[:2]])
    assert 0.1 < r['val_acc1'] <= 1 and 0.1 < r['test_acc1'] <= 1 and r['latency_ms'] > 0
    assert r['best'].is_file() and r['run'].parent == runs / DEMO.stem


def test_validate_and_predict_from_the_latest_run(runs):
    short = ['-c', DEMO, '--trainer.limit_train_batches', 2, '--trainer.limit_val_batches', 1]
    assert fit(*short, '--trainer.max_epochs', 1) == 0
    assert fit('-c', DEMO, '--ckpt_path', 'last', '--trainer.limit_val_batches', 2, command='validate') == 0
    assert fit('-c', DEMO, '--ckpt_path', 'best', '--trainer.limit_predict_batches', 2, command='predict') == 0
    fit_run, val_run, pred_run = run_dirs(runs, DEMO.stem)
    assert [r for r in metrics(val_run) if r.get('val/acc1')]
    probs = torch.load(pred_run / 'predictions.pt')
    assert probs.shape == (128, 10) and torch.allclose(probs.sum(-1), torch.ones(128), atol=1e-5)
