"""The ConvBN probe at the end of a fine-tuning fit (issue 43: You et al.'s memory and speed claims measured as the
paper does): bytes saved for backward and interleaved step time of the run's mode against Eval mode, recorded in
the results database; the probe on its own (copies only, a hand count of what Tune drops)."""
from __future__ import annotations

import copy
import functools
import math

import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch import Callback, Trainer

import zoo
import zoo.datasets
from zoo.eval import results
from zoo.eval.profile import convbn_probe, saved_bytes
from zoo.layers.convbn import ConvBN, set_mode
from zoo.recipes.finetune import PROBE_METRICS, FineTuner

from test_recipes import ROOT, fit

CONFIG = ROOT / 'recipes' / 'configs' / 'resnet' / 'resnet_tiny_digits_finetune_tune_5e.yaml'
BATCH = (64, 3, 32, 32)    # the recipe's batch: 64 digits at 32x32, 3 channels


@pytest.fixture(scope='module')
def start(tmp_path_factory):
    torch.manual_seed(0)
    net = zoo.create('resnet_tiny', num_classes=6)
    for m in net.modules():  # pretrained-looking statistics
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    path = tmp_path_factory.mktemp('start') / 'start.pth'
    torch.save(net.state_dict(), path)
    return path


@pytest.fixture(scope='module')
def recorded(start, tmp_path_factory):
    """One short recorded fit per entry (tune, eval, train, and tune with the probe off) in one database:
    ``{entry: (run row, {metric: final value}, [per-epoch rows])}``."""
    root = tmp_path_factory.mktemp('probe')
    db = root / 'results.db'
    mp = pytest.MonkeyPatch()
    mp.setenv('ZOO_DB', str(db))
    mp.setenv('ZOO_RUNS', str(root / 'runs'))
    mp.setenv('ZOO_RECORD_LATENCY', '0')
    mp.delenv('ZOO_RUN_DIR', raising=False)
    entries = {'tune': [], 'eval': [], 'train': [], 'off': ['--model.convbn_probe', 'false']}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # tiny steps: two threads on a shared 2-core machine only wait on each other
    try:
        for entry, extra in entries.items():
            mode = 'tune' if entry == 'off' else entry
            assert fit('-c', CONFIG, '--model.checkpoint', start, '--model.convbn_mode', mode,
                       '--trainer.max_epochs', 1, '--trainer.limit_train_batches', 2,
                       '--trainer.limit_val_batches', 1, *extra) == 0
    finally:
        mp.undo()
        torch.set_num_threads(threads)
    runs = results.runs(db=str(db)).sort_values('id')
    assert len(runs) == len(entries) and set(runs.status) == {'finished'}
    out = {}
    for entry, (_, row) in zip(entries, runs.iterrows()):
        rows = results.metrics(int(row.id), db=str(db))
        final = dict(zip(rows[rows.final].name, rows[rows.final].value))
        out[entry] = (row, final, rows[~rows.final])
    results.close_all()
    return out


@pytest.mark.parametrize('entry', ['tune', 'eval', 'train'])
def test_probe_metrics_recorded_for_every_mode(recorded, entry):
    row, final, per_epoch = recorded[entry]
    assert row.block_choices['convbn_mode'] == entry
    for name in PROBE_METRICS:
        assert name in final and math.isfinite(final[name]) and final[name] > 0, (entry, name)
        [logged] = per_epoch[per_epoch.name == name].itertuples()     # logged once, at the end of the fit
        assert logged.value == final[name] and logged.epoch == 0
    assert final['train/step_time_vs_eval'] < 20           # a ratio of two medians of the same step, not ms


def test_eval_ratio_is_one_and_tune_keeps_what_the_hand_count_says(recorded, one_thread):
    ev, tu, tr = (recorded[k][1] for k in ('eval', 'tune', 'train'))
    assert ev['train/saved_backward_vs_eval'] == 1.0        # eval against eval: the same count, exactly
    # Saved bytes depend on shapes only: recount on a fresh network at the recipe's batch (convbn_bench's count).
    torch.manual_seed(0)
    net = zoo.create('resnet_tiny', num_classes=10)
    x, y = torch.randn(*BATCH), torch.randint(0, 10, (BATCH[0],))
    loss = functools.partial(F.cross_entropy, label_smoothing=0.1)      # the recipe's
    outputs, channels = [], sum(m.bn.num_features for m in net.modules() if isinstance(m, ConvBN))
    hooks = [m.register_forward_hook(lambda mod, i, o: outputs.append(o.numel() * o.element_size()))
             for m in net.modules() if isinstance(m, ConvBN)]
    set_mode(net, 'eval')
    eval_bytes = saved_bytes(net, x, y, loss)
    for h in hooks:
        h.remove()
    set_mode(net, 'tune')
    tune_bytes = saved_bytes(net, x, y, loss)
    # By hand: Tune keeps each pair's input as Eval does but not the conv output BN's backward needs (12 pairs of
    # resnet_tiny), at the cost of a few per-channel vectors (the folded scale): eval - tune = sum of outputs - O(C).
    assert len(outputs) == 12
    assert abs(eval_bytes - tune_bytes - sum(outputs)) <= 4 * 4 * channels
    assert ev['train/saved_backward_mb'] == pytest.approx(eval_bytes / 2 ** 20, rel=1e-6)
    assert tu['train/saved_backward_mb'] == pytest.approx(tune_bytes / 2 ** 20, rel=1e-6)
    assert tu['train/saved_backward_vs_eval'] == pytest.approx(tune_bytes / eval_bytes, rel=1e-6)
    assert tu['train/saved_backward_vs_eval'] < 0.6          # 0.47 at this batch
    # train mode keeps what eval keeps (BN's input) plus batch statistics: about one
    assert tr['train/saved_backward_vs_eval'] == pytest.approx(1.0, abs=0.01)


def test_probe_switch_off_and_out_of_the_configuration_key(recorded):
    (tune, _, _), (off, final, per_epoch) = recorded['tune'], recorded['off']
    assert not set(PROBE_METRICS) & set(final) and not set(PROBE_METRICS) & set(per_epoch.name)
    assert tune.config_key == off.config_key and 'convbn_probe' not in tune.hparams


def test_probe_leaves_the_run_untouched_and_counts_train_mode_on_a_copy(one_thread):
    torch.manual_seed(0)
    net = zoo.create('resnet_tiny', num_classes=10).train()   # train mode: a probe on the network itself would
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))  # move its BN statistics and weights
    before = copy.deepcopy(net.state_dict())
    stats = convbn_probe(net, x, y, rounds=2, warmup=1)
    after = net.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in net.parameters())
    assert {m.mode for m in net.modules() if isinstance(m, ConvBN)} == {'train'}
    assert stats['saved_backward_mb'] == pytest.approx(stats['saved_backward_eval_mb'], rel=0.01)
    assert stats['step_ms'] > 0 and stats['step_eval_ms'] > 0
    set_mode(net, 'deploy')
    with pytest.raises(ValueError, match='deploy mode'):
        convbn_probe(net, x, y)


class _Snapshot(Callback):
    """The network's state just before the system's own ``on_train_end`` (callbacks run first) and after."""

    def on_train_end(self, trainer, pl_module):
        self.before = copy.deepcopy(pl_module.model.state_dict())

    def on_fit_end(self, trainer, pl_module):
        self.after = copy.deepcopy(pl_module.model.state_dict())


def test_fit_end_probe_leaves_the_weights_unchanged(start, tmp_path, one_thread):
    from lightning.pytorch.loggers import CSVLogger

    ft = FineTuner('resnet_tiny', str(start), num_classes=10, convbn_mode='train')
    assert ft.convbn_probe and 'convbn_probe' not in ft.hparams
    snap, logger = _Snapshot(), CSVLogger(tmp_path, name='probe')
    trainer = Trainer(accelerator='cpu', max_epochs=1, limit_train_batches=1, limit_val_batches=0, logger=logger,
                      callbacks=[snap], enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False)
    trainer.fit(ft, datamodule=zoo.datasets.DigitsDataModule(img_size=32, batch_size=16, in_chans=3))
    assert all(torch.equal(snap.before[k], snap.after[k]) for k in snap.before)
    logged = (tmp_path / 'probe' / 'version_0' / 'metrics.csv').read_text().splitlines()[0].split(',')
    assert set(PROBE_METRICS) <= set(logged)


def test_deploy_rejects_an_explicit_probe(start):
    with pytest.raises(ValueError, match='deploy has no BN'):
        FineTuner('resnet_tiny', str(start), num_classes=10, convbn_mode='deploy', convbn_probe=True)
    assert not FineTuner('resnet_tiny', str(start), num_classes=10, convbn_mode='deploy').convbn_probe
    assert not FineTuner('resnet_tiny', str(start), num_classes=10).convbn_probe
