"""`--model.convbn_mode tune|eval|train` end to end on the ResNet fine-tuning recipe (zoo fit)."""
from __future__ import annotations

import pytest
import torch

import zoo
from zoo.layers.convbn import ConvBN

from test_recipes import ROOT, fit, run_dirs

CONFIG = ROOT / 'recipes' / 'configs' / 'resnet' / 'resnet_tiny_digits_finetune_tune_5e.yaml'


@pytest.fixture
def start(tmp_path):
    torch.manual_seed(0)
    net = zoo.create('resnet_tiny', num_classes=6)
    for m in net.modules():  # pretrained-looking statistics, so a frozen BN is distinguishable
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    path = tmp_path / 'start.pth'
    torch.save(net.state_dict(), path)
    return net.state_dict(), path


@pytest.mark.parametrize('mode', ['tune', 'eval', 'train'])
def test_finetune_convbn_mode(mode, start, runs):  # noqa: F811
    src, path = start
    assert fit('-c', CONFIG, '--model.checkpoint', path, '--model.convbn_mode', mode, '--trainer.max_epochs', 1,
               '--trainer.limit_train_batches', 3, '--trainer.limit_val_batches', 1) == 0
    [run] = run_dirs(runs, CONFIG.stem)
    ckpt = torch.load(run / 'checkpoints' / 'last.ckpt', weights_only=False)
    sd = ckpt['state_dict']
    stats = [k for k in src if k.endswith(('running_mean', 'running_var'))]
    frozen = all(torch.equal(sd[f'model.{k}'], src[k]) for k in stats)
    assert frozen == (mode != 'train')  # tune/eval keep the pretrained statistics through model.train()
    conv_w = 'stem.0.conv.weight'
    assert not torch.equal(sd[f'model.{conv_w}'], src[conv_w])  # the conv weights still train
    assert ckpt['hyper_parameters']['convbn_mode'] == mode
    ft = zoo.recipes.FineTuner('resnet_tiny', str(path), num_classes=10, convbn_mode=mode)
    assert {m.mode for m in ft.model.modules() if isinstance(m, ConvBN)} == {mode}
    assert ft.block_choices['convbn_mode'] == mode
