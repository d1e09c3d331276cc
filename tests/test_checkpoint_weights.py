"""One checkpoint reader (issue 44, item 2): a ``zoo fit`` checkpoint's evaluated weights (the EMA when the run kept
one) are what ``zoo.create(checkpoint=)``, ``zoo export`` and ``zoo test`` (Lightning's own restore of the whole
system, whose ``eval_model`` is the EMA) run; ``weights='model'`` asks for the raw ones, ``'ema'`` of a checkpoint
without an EMA is one line."""
from __future__ import annotations

import json

import pytest
import torch

import zoo

NAME = 'resnet_tiny'


def _system(ema: bool):
    from zoo.recipes import ImageClassifier

    torch.manual_seed(0)
    return ImageClassifier(NAME, num_classes=4, ema_decay=0.9 if ema else None)


def _save(system, path):
    """A Lightning checkpoint written by Lightning itself (``Trainer.save_checkpoint``), as ``zoo fit`` writes it."""
    from lightning.pytorch import Trainer

    trainer = Trainer(accelerator='cpu', devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False)
    trainer.strategy.connect(system)
    trainer.save_checkpoint(path)
    return path


@pytest.fixture(scope='module')
def ema_run(tmp_path_factory):
    """A system whose EMA weights differ from its raw ones, saved; the raw and EMA networks to compare with."""
    system = _system(ema=True)
    with torch.no_grad():  # a training step's worth of difference: the raw weights moved, the average did not
        for p in system.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    path = _save(system, tmp_path_factory.mktemp('ema') / 'best.ckpt')
    return path, system.model.eval(), system.ema.module.eval()


def _out(net, x):
    with torch.no_grad():
        return net.eval()(x)


def test_create_loads_the_ema_weights_the_run_evaluated(ema_run):
    path, raw, ema = ema_run
    x = torch.randn(2, 3, 32, 32)
    assert not torch.allclose(_out(raw, x), _out(ema, x))           # the two copies compute different things
    net = zoo.create(NAME, num_classes=4, checkpoint=str(path))
    assert net.zoo_weights == 'ema'
    torch.testing.assert_close(_out(net, x), _out(ema, x))
    raw_net = zoo.create(NAME, num_classes=4, checkpoint=str(path), weights='model')
    assert raw_net.zoo_weights == 'model'
    torch.testing.assert_close(_out(raw_net, x), _out(raw, x))
    ema_net = zoo.create(NAME, num_classes=4, checkpoint=str(path), weights='ema')
    torch.testing.assert_close(_out(ema_net, x), _out(ema, x))


def test_zoo_test_restore_evaluates_the_same_weights(ema_run):
    """``zoo test --ckpt_path`` restores the whole system (Lightning), and evaluation runs ``eval_model``: the
    EMA, the weights ``zoo.create(checkpoint=)`` loads."""
    path, _, ema = ema_run
    system = _system(ema=True)
    system.load_state_dict(torch.load(path, map_location='cpu', weights_only=True)['state_dict'])
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(_out(system.eval_model, x), _out(ema, x))
    torch.testing.assert_close(_out(zoo.create(NAME, num_classes=4, checkpoint=str(path)), x),
                               _out(system.eval_model, x))


def test_checkpoint_without_ema_loads_raw_and_refuses_ema(tmp_path):
    system = _system(ema=False)
    path = _save(system, tmp_path / 'last.ckpt')
    x = torch.randn(2, 3, 32, 32)
    net = zoo.create(NAME, num_classes=4, checkpoint=str(path))
    assert net.zoo_weights == 'model'
    torch.testing.assert_close(_out(net, x), _out(system.model, x))
    with pytest.raises(ValueError, match=r"^weights='ema' but .*last\.ckpt holds no EMA copy .*; use "
                                         r"weights='model' or 'auto'$"):
        zoo.create(NAME, num_classes=4, checkpoint=str(path), weights='ema')


def test_export_of_ema_without_one_is_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    from zoo.recipes.main import main

    path = _save(_system(ema=False), tmp_path / 'last.ckpt')
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()  # Lightning's notes while saving
    code = main(['export', NAME, '--ckpt_path', str(path), '--weights', 'ema', '--out', str(tmp_path / 'x.pt2'),
                 '--format', 'pt2'])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and 'holds no EMA copy' in err[0]
    assert not (tmp_path / 'x.pt2').exists()


def test_read_weights_choices_and_errors(ema_run, tmp_path):
    path, raw, ema = ema_run
    for weights, want in (('auto', ('ema', ema)), ('ema', ('ema', ema)), ('model', ('model', raw))):
        sd, chosen = zoo.read_weights(path, weights)
        assert chosen == want[0]
        assert sd.keys() == want[1].state_dict().keys()
        assert all(torch.equal(sd[k], v) for k, v in want[1].state_dict().items())
    with pytest.raises(ValueError, match=r"^weights must be one of auto, ema, model .*got 'raw'$"):
        zoo.read_weights(path, 'raw')
    with pytest.raises(ValueError, match=r"^weights='model' chooses which weights of a checkpoint to load; pass "
                                         r"checkpoint= too$"):
        zoo.create(NAME, weights='model')
    # timm's train.py checkpoints: state_dict (raw) beside state_dict_ema, chosen the same way
    timm_style = tmp_path / 'timm.pth.tar'
    torch.save({'state_dict': raw.state_dict(), 'state_dict_ema': ema.state_dict(), 'epoch': 3}, timm_style)
    x = torch.randn(2, 3, 32, 32)
    assert zoo.read_weights(timm_style)[1] == 'ema'
    torch.testing.assert_close(_out(zoo.create(NAME, num_classes=4, checkpoint=str(timm_style), weights='model'), x),
                               _out(raw, x))
    bare = tmp_path / 'bare.pth'
    torch.save(raw.state_dict(), bare)
    assert zoo.read_weights(bare)[1] == 'model'
    with pytest.raises(ValueError, match='holds no EMA copy'):
        zoo.read_weights(bare, 'ema')


def test_export_card_says_which_weights(ema_run, tmp_path, monkeypatch):
    """``zoo export --ckpt_path FILE``: the EMA's graph, and the card's model.weights says 'ema';
    ``--weights model`` exports the raw weights and says so."""
    from zoo.recipes.main import main

    path, raw, ema = ema_run
    monkeypatch.chdir(tmp_path)
    x = torch.randn(2, 3, 32, 32)
    for weights, want in (('auto', ema), ('model', raw)):
        out = tmp_path / f'{weights}.pt2'
        code = main(['export', NAME, '--ckpt_path', str(path), '--format', 'pt2', '--img-size', '32', '--out', str(out),
                     '--weights', weights])
        assert code in (0, None)
        card = json.loads(out.with_name(out.name + '.json').read_text())
        assert card['model']['weights'] == ('ema' if weights == 'auto' else 'model')
        with torch.no_grad():
            got = torch.export.load(out).module()(x)
        torch.testing.assert_close(got, _out(want, x), rtol=1e-4, atol=1e-4)
