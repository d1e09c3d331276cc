"""The `zoo` console script (non-training commands)."""
from __future__ import annotations

import json

import pytest

from zoo.recipes.main import main


def test_list_and_info(capsys):
    assert main(['list', 'poolformer*']) == 0
    out = capsys.readouterr().out
    assert 'poolformer_s12' in out and '11.92' in out
    assert main(['list', '--blocks']) == 0
    assert 'pooling' in capsys.readouterr().out
    assert main(['info', 'poolformer_s12']) == 0
    assert json.loads(capsys.readouterr().out)['params'] == 11_915_176


def test_unknown_model_is_a_clear_error(capsys):
    assert main(['info', 'poolformer_s13']) == 2
    assert 'poolformer_s12' in capsys.readouterr().err


def test_bench_vs_reference_reports_ratio_and_equality(capsys):
    rc = main(['bench', 'poolformer_s12', '--vs', 'timm/poolformer_s12', '--img-size', '64', '--repeats', '2',
               '--warmup', '1', '--json'])
    assert rc == 0
    out = capsys.readouterr().out
    rows = json.loads(out[out.index('['):])
    ours = next(r for r in rows if r['model'] == 'poolformer_s12')
    assert ours['speedup'] > 0 and ours['max_abs_diff'] < 1e-4
    assert ours['macs'] == next(r for r in rows if r['model'] == 'timm/poolformer_s12')['macs']


def test_help_lists_every_command_and_version(capsys):
    """`zoo --help` names the training commands too (they are LightningCLI, dispatched before argparse)."""
    from zoo import __version__
    from zoo.recipes.main import main
    with pytest.raises(SystemExit) as e:
        main(['--help'])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for command in ('fit', 'validate', 'test', 'predict', 'list', 'info', 'bench', 'results', 'sweep'):
        assert f'    {command} ' in out, command
    with pytest.raises(SystemExit):
        main(['--version'])
    assert capsys.readouterr().out.strip() == f'zoo {__version__}'
