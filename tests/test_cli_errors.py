"""Bad command-line input: one line on stderr (with close matches), exit code 2, nothing written to disk.
And a normal run is quiet: no advertisements, no warnings about our own set-up, no unmeasured FLOPs."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from zoo.recipes.main import DEMO, main

ROOT = Path(__file__).resolve().parents[1]
CONFIG = str(ROOT / DEMO)


def _one_error_line(capfd) -> str:
    """stderr at the file-descriptor level (Lightning's log handlers hold the real stderr): one line."""
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize('args, expected', [
    # a misspelt block inside --model.model_args: the registry's message, with its close match
    (['--model.model_args', '{token_mixer: poolng}'], "Did you mean 'pooling'"),
    # an unknown option: the close option names
    (['--trainer.max_epohcs', '2'], 'did you mean --trainer.max_epochs'),
    # an unknown argument of the system
    (['--model.lrr', '0.1'], 'did you mean lr?'),
    # a string where an int is expected (YAML quotes make '10' a string)
    (['--model.num_classes', "'10'"], "--model.num_classes expects int, got '10'"),
    (['--trainer.max_epochs', 'two'], '--trainer.max_epochs expects int, got two'),
    # a DataModule class that does not exist
    (['--data', 'zoo.datasets.DigitDataModule'], 'did you mean DigitsDataModule'),
])
def test_bad_fit_arguments(args, expected, runs, capfd, tmp_path, monkeypatch):
    db = tmp_path / 'results.db'
    monkeypatch.setenv('ZOO_DB', str(db))
    assert main(['fit', '-c', CONFIG, *args, '--trainer.fast_dev_run', '1']) == 2
    line = _one_error_line(capfd)
    assert line.startswith('zoo fit: error: ') and expected in line, line
    assert not runs.exists() and not db.exists()  # no run folder (nor the runs root), no database


@pytest.mark.parametrize('content', [os.urandom(3000), b'', b'\x80\x04K\x01.'])
def test_garbage_checkpoint(content, runs, capfd, tmp_path):
    ckpt = tmp_path / 'garbage.ckpt'
    ckpt.write_bytes(content)
    assert main(['test', '-c', CONFIG, '--ckpt_path', str(ckpt)]) == 2
    line = _one_error_line(capfd)
    assert 'is not a readable Lightning checkpoint' in line or 'is not a Lightning checkpoint' in line, line
    assert 'weights_only' not in line  # torch's advice to unpickle an untrusted file is not repeated
    assert ckpt.read_bytes() == content and not runs.exists()


def test_no_recipe(runs, capfd):
    assert main(['test']) == 2
    assert 'a recipe gives both: -c recipes/configs/<family>/<name>.yaml' in _one_error_line(capfd)


def test_condensing_never_fails(monkeypatch):
    """A report shaped in a way the condenser did not foresee still gives one line, with all its words."""
    from zoo.recipes import cli

    def unforeseen(text, parser):
        raise IndexError('unforeseen')
    monkeypatch.setattr(cli, '_one_line_error', unforeseen)
    assert cli.one_line_error('Parser key "model":\n  something new\n') == 'Parser key "model": something new'


@pytest.mark.parametrize('argv, expected', [
    (['lst'], "unknown command 'lst'; did you mean list?"),
    (['list', '--famly', 'metaformer'], 'zoo list: error: unknown option --famly; did you mean --family?'),
    (['sweep', 'recipes/sweeps/poolformer_digits.py', '--n-trails', '2'], 'did you mean --n-trials'),
    (['--vrsion'], 'did you mean --version?'),
])
def test_bad_commands_and_options(argv, expected, capfd):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert expected in _one_error_line(capfd)


def test_info_of_timm_models(capsys):
    assert main(['info', 'timm/resnet18']) == 0
    info = json.loads(capsys.readouterr().out)
    assert info['params'] == 11_689_512  # torchvision's resnet18 too
    assert info['pretrained_cfg']['input_size'] == [3, 224, 224] and info['pretrained_cfg']['num_classes'] == 1000
    assert main(['info', 'timm/resnt18']) == 2
    assert 'did you mean timm/resnet18' in capsys.readouterr().err


def test_a_run_is_quiet(runs, capfd):
    """No litlogger advertisement, no Lightning warnings about our own callbacks/set-up, no deprecation
    notes, no "Total FLOPs: 0" (Lightning counts FLOPs only with an example input): the summary has params."""
    assert main(['fit', '-c', CONFIG, '--trainer.fast_dev_run', '1', '--trainer.enable_progress_bar', 'false']) == 0
    out, err = capfd.readouterr()
    for noise in ('litlogger', 'FLOPs', 'deprecated', 'Deprecation', 'Warning', 'ckpt_path=None', 'Seed set',
                  'stepping batches'):
        assert noise not in out + err, noise
    assert 'MetaFormer' in out and 'params: 232 K' in out
