"""The task as one registered object (issue 44, item 3): ``zoo.tasks``.

The built-in tasks are checked against what the rest of zoo does with them, and a toy depth task (RMSE, lower
is better) is added the way a user adds one: one ``Task``, one DataModule, one system (and a model of the task),
all in this file. ``zoo fit`` then trains it, keeps the lowest-RMSE checkpoint as the best, records the run,
and the leaderboard, ``results.data(only_best=True)``, sweeps, bench and export treat it like any other task.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch import LightningDataModule
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import zoo
from zoo import tasks
from zoo.recipes.system import ZooSystem


# ------------------------------------------------------------------------------------------ built-in tasks
def test_the_built_in_tasks_know_their_metric_direction_and_input():
    assert tasks.names() == ('classification', 'detection', 'language_modeling', 'denoising', 'segmentation')
    seg = tasks.get('segmentation')
    assert (seg.metric, seg.mode, seg.higher_is_better, seg.direction) == ('val/miou', 'max', True, 'maximize')
    assert tasks.get('language_modeling').takes_tokens and not seg.takes_tokens
    assert tasks.get('denoising').output == 'denoised' and seg.output == 'logits'
    # every registered model's task is a registered task, and its system and DataModule resolve
    for name in tasks.names():
        t = tasks.get(name)
        assert t.load('system').task == name and t.load('datamodule').zoo_task == name
        assert callable(t.load('writer'))


def test_an_unknown_task_is_one_line_with_close_names():
    with pytest.raises(KeyError, match=r"unknown task 'segmentaton'; did you mean segmentation"):
        tasks.get('segmentaton')
    with pytest.raises(ValueError, match="unknown task 'detecton'"):   # also a ValueError, for arguments
        zoo.register_model(family='x', task='detecton')(lambda: None)
    with pytest.raises(ValueError, match="mode is 'max'"):
        tasks.Task('t', 'val/x', mode='lowest')


def test_one_input_size_and_one_example_input_for_every_kind_of_model():
    assert tasks.input_size('poolformer_tiny') == tuple(zoo.model_info('poolformer_tiny').input_size)
    assert tasks.input_size('poolformer_tiny', img_size=48, in_chans=1) == (1, 48, 48)
    assert tasks.input_size('timm/resnet18', img_size=64) == (3, 64, 64)
    assert tasks.input_size('llama_tiny', img_size=99, context_length=16) == (16,)   # tokens ignore image sizes
    built = zoo.create('poolformer_tiny', img_size=48)
    assert tasks.input_size(built) == built.pretrained_cfg['input_size'] == (3, 48, 48)  # what it was built for
    assert tasks.example_input(built, batch_size=2).shape == (2, 3, 48, 48)
    lm = zoo.create('llama_tiny')
    x = tasks.example_input(lm, batch_size=3)
    assert x.dtype == torch.long and x.shape == (3, *tasks.input_size('llama_tiny')) and x.max() < lm.vocab_size
    from zoo.eval.profile import example_input as profile_example_input
    from zoo._runtime import example_input as runtime_example_input
    assert profile_example_input is runtime_example_input is tasks.example_input   # one function, not three


# ----------------------------------------------------------------------------- a toy depth task, added here
class DepthNet(nn.Module):
    """Two convolutions: an image (B, C, H, W) -> a depth map (B, 1, H, W)."""

    def __init__(self, in_chans: int = 1, img_size: int = 8):
        super().__init__()
        self.in_chans, self.img_size = in_chans, img_size
        self.body = nn.Sequential(nn.Conv2d(in_chans, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 1, 3, padding=1))

    def forward(self, x):
        return self.body(x)


def depth_toy_tiny(in_chans: int = 1, img_size: int = 8) -> DepthNet:
    return DepthNet(in_chans, img_size)


class DepthData(LightningDataModule):
    """Random 1x8x8 images whose "depth" is their 3x3 box blur (a target a conv net learns in a few steps)."""

    zoo_task = 'depth'
    in_chans, img_size = 1, 8

    def __init__(self, batch_size: int = 16):
        super().__init__()
        self.batch_size = batch_size
        g = torch.Generator().manual_seed(0)
        x = torch.rand(96, 1, 8, 8, generator=g)
        y = F.avg_pool2d(x, 3, stride=1, padding=1)
        self.train_set, self.val_set = TensorDataset(x[:64], y[:64]), TensorDataset(x[64:], y[64:])

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.batch_size)


class DepthSystem(ZooSystem):
    """Regresses the depth map; validates its RMSE (lower is better, as the task says)."""

    task = 'depth'

    def __init__(self, name: str = 'depth_toy_tiny', **kwargs):
        kwargs.setdefault('optimizer', lambda params: torch.optim.Adam(params, lr=0.01))
        kwargs.setdefault('lr_scheduler', None)
        super().__init__(name, **kwargs)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.model(x), y)
        self.log_train(loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        out = self.eval_model(x)
        self.log('val/rmse', F.mse_loss(out, y).sqrt(), on_epoch=True, batch_size=len(x))
        self.log('val/mae', F.l1_loss(out, y), on_epoch=True, batch_size=len(x))


@pytest.fixture
def zoo_db(tmp_path, monkeypatch):
    """A results database of this test's own."""
    from zoo.eval import results as R

    monkeypatch.setenv('ZOO_DB', str(tmp_path / 'results.db'))
    yield tmp_path / 'results.db'
    R.close_all()


@pytest.fixture
def depth_task():
    """The depth task, its model and nothing else, registered for one test and forgotten after it."""
    from zoo._registry import _MODELS

    task = tasks.register_task(tasks.Task(
        'depth', metric='val/rmse', mode='min', datamodule=f'{__name__}.DepthData', system=f'{__name__}.DepthSystem',
        board_columns=('val/mae',), doc='toy monocular depth (RMSE)'))
    zoo.list_models()   # the built-in families first, so the toy model is registered after them
    zoo.register_model(family='depth_toy', task='depth', input_size=(1, 8, 8))(depth_toy_tiny)
    yield task
    _MODELS.pop('depth_toy_tiny', None)
    tasks.unregister_task('depth')


def test_a_lower_is_better_task_is_added_by_registering_it(depth_task, zoo_db, tmp_path, monkeypatch, capsys):
    from zoo.eval import results as R
    from zoo.recipes.main import main

    assert depth_task.load('system') is DepthSystem and depth_task.direction == 'minimize'
    monkeypatch.setenv('ZOO_RUNS', str(tmp_path / 'runs'))
    monkeypatch.setenv('ZOO_RECORD_LATENCY', '1')   # the recording's example input goes through the task's spec
    torch.manual_seed(0)
    rc = main(['fit', '--model', f'{__name__}.DepthSystem', '--data', f'{__name__}.DepthData',
               '--trainer.max_epochs=4', '--trainer.enable_progress_bar=false', '--trainer.enable_model_summary=false',
               '--seed_everything=0'])
    assert rc == 0, capsys.readouterr().err

    # the best checkpoint is the lowest-RMSE epoch (monitor_mode 'min', from the task)
    run = R.runs().iloc[0]
    assert (run.task, run.model, run.status) == ('depth', 'depth_toy_tiny', 'finished')
    curve = R.metrics(int(run.id), name='val/rmse', final=False).sort_values('epoch')
    rmse = dict(zip(curve.epoch.astype(int), curve.value))
    assert len(rmse) == 4 and min(rmse, key=rmse.get) != max(rmse, key=rmse.get)
    best = sorted((tmp_path / 'runs').glob('**/checkpoints/best-*.ckpt'))
    assert len(best) == 1 and best[0].name.startswith(f'best-epoch{min(rmse, key=rmse.get)}-')
    ckpt = torch.load(best[0], map_location='cpu', weights_only=False)
    states = [v for k, v in ckpt['callbacks'].items() if "'monitor': 'val/rmse'" in k]
    assert [s['best_model_score'].item() for s in states] == [pytest.approx(min(rmse.values()), rel=1e-5)]

    # the run's recorded input: the task's input spec at the data's size
    assert tuple(run.hparams['network']['input_size']) == (1, 8, 8)
    assert R.latency().input_shape.tolist() == ['1x8x8']

    # the board ranks ascending, and results.data's best run is the lowest
    db = R.open_db()
    for model, rmse_value in (('depth_far', 0.9), ('depth_near', 0.01)):
        rid = db.start_run(model, task='depth', dataset='depthdata', seed=0)
        db.log_metrics(rid, {'val/rmse': rmse_value, 'val/mae': rmse_value / 2}, final=True)
        db.finish_run(rid)
    for seed, rmse_value in ((0, 0.3), (1, 0.2)):   # two runs of one model: the best of them is the lower
        rid = db.start_run('depth_pair', task='depth', dataset='pairs', seed=seed, hparams={'lr': seed})
        for epoch, value in enumerate((rmse_value + 0.1, rmse_value, rmse_value + 0.05)):  # best epoch: the lowest
            db.log_metrics(rid, {'val/rmse': value}, epoch=epoch)
        db.log_metrics(rid, {'val/rmse': rmse_value + 0.05}, final=True)
        db.finish_run(rid)
    best_runs = R.data(task='depth', dataset='pairs', only_best=True)
    assert best_runs.final.tolist() == [pytest.approx(0.25)] and best_runs.best.tolist() == [pytest.approx(0.2)]
    board = R.leaderboard('depth', 'depthdata')
    assert board.attrs['metric'] == 'val/rmse' and board.attrs['higher_is_better'] is False
    assert board.model.tolist()[0] == 'depth_near' and board.model.tolist()[-1] == 'depth_far'
    assert list(board['mean']) == sorted(board['mean'])
    assert board.attrs['board_columns'] == ['val/mae'] and board['val/mae'].iloc[0] == pytest.approx(0.005)
    text = R.format_board(board)
    assert 'lower is better' in text and 'val/mae' in text and '0.0050' in text
    assert R.board_tasks() == ['depth']
    assert R.data(task='depth').metric.unique().tolist() == ['val/rmse']
    assert main(['results', '--task', 'depth']) == 0 and 'depth_near' in capsys.readouterr().out


def test_a_lower_is_better_task_in_sweeps_bench_and_export(depth_task, tmp_path):
    from zoo.eval.profile import benchmark
    from zoo.recipes.cli import monitor_of
    from zoo.recipes.sweep import SweepError, load_sweep

    system = DepthSystem()
    assert (system.monitor, system.monitor_mode) == ('val/rmse', 'min') == monitor_of(system)
    # a sweep over the task's metric minimises it unless told; told to maximise it, it refuses
    from test_recipes import DEMO
    sweep = tmp_path / 'depth_sweep.py'
    sweep.write_text(f"BASE = {str(DEMO)!r}\nMETRIC = 'val/rmse'\n\ndef space(trial):\n    return {{}}\n")
    assert load_sweep(sweep).directions == ('minimize',)
    sweep.write_text(sweep.read_text() + "DIRECTIONS = ('maximize',)\n")
    with pytest.raises(SweepError, match="lower val/rmse is better"):
        load_sweep(sweep)
    # bench and export draw the model's input from the task's input spec
    model = zoo.create('depth_toy_tiny', img_size=12).eval()
    assert tasks.input_size(model) == (1, 12, 12) and tasks.input_size('depth_toy_tiny') == (1, 8, 8)
    lat = benchmark({'depth': model}, input_size=tasks.input_size(model), repeats=1, warmup=0)['depth']
    assert tuple(lat.input_size) == (1, 12, 12)
    path = zoo.export(model, tmp_path / 'depth.pt2', tasks.example_input(model, batch_size=2), format='pt2')
    program = torch.export.load(str(path))
    x = tasks.example_input(model, batch_size=3)   # another batch: the exported batch is dynamic
    torch.testing.assert_close(program.module()(x), model(x))
    # and once forgotten, the task's metric has no known direction again
    tasks.unregister_task('depth')
    from zoo.eval.results import ResultsDBError, is_higher_better
    with pytest.raises(ResultsDBError, match='unknown direction'):
        is_higher_better('val/rmse')
    tasks.register_task(depth_task)
