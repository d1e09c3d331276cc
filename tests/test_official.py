"""``zoo bench --vs official:SOURCE[:CALLABLE]`` (eval/official.py): the official implementation as the reference.

CI has no network, so the "official" modules here are the independent re-statements in tests/reference_*.py,
behind the official constructors' signatures. On the development machine the same path was run against the
fetched official code (okojoalg/raft-mlp ``libs/models.py: RaftMLP``, Med-Process/Strip_MLP
``models/strip_mlp.py: StripMLPNet``; see docs/mlp.md).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from zoo.eval import bench
from zoo.recipes.main import main

TESTS = Path(__file__).parent
RAFT = f'official:{TESTS / "reference_raftmlp.py"}:RaftMLP'
STRIP = f'official:{TESTS / "reference_stripmlp.py"}:StripMLPNet'


@pytest.mark.parametrize('name, spec', [('raftmlp_tiny', RAFT), ('stripmlp_tiny', STRIP)])
def test_bench_takes_the_official_implementation_as_reference(name, spec):
    rows = bench.run([name], vs=spec, batch_sizes=(1, 2), repeats=1, warmup=0)
    ours = [r for r in rows if r['model'] == name]
    ref = [r for r in rows if r['model'] == spec]
    assert [r['batch_size'] for r in ours] == [1, 2] and len(ref) == 2
    assert all(r['speedup'] > 0 and r['vs'] == spec for r in ours)
    assert ours[0]['max_abs_diff'] < 1e-5
    assert ours[0]['params'] == ref[0]['params']


def test_bench_vs_official_on_the_command_line(capsys):
    rc = main(['bench', 'stripmlp_tiny', '--vs', STRIP, '--repeats', '1', '--warmup', '0', '--mode', 'train',
               '--batch-size', '2', '--json'])
    assert rc == 0
    out = capsys.readouterr().out
    rows = json.loads(out[out.index('['):])
    assert {r['model'] for r in rows} == {'stripmlp_tiny', STRIP}
    assert all(r['mode'] == 'train' for r in rows)


def test_the_module_name_form_and_the_default_callable(monkeypatch):
    from zoo.eval.official import build_official
    import zoo
    monkeypatch.syspath_prepend(str(TESTS))
    model = zoo.create('raftmlp_tiny').eval()
    official = build_official('official:reference_raftmlp', model)  # the official class name RaftMLP by default
    assert type(official).__name__ == 'OfficialRaftMLP'


@pytest.mark.parametrize('argv, message', [
    (['bench', 'poolformer_s12', '--vs', RAFT], 'available for the families raftmlp, stripmlp'),
    (['bench', 'raftmlp_tiny', '--vs', 'official:/nonexistent/models.py'], 'not found: /nonexistent/models.py'),
    (['bench', 'raftmlp_tiny', '--vs', 'official:no_such_module_xyz'], "could not import"),
    (['bench', 'raftmlp_tiny', '--vs', RAFT.replace(':RaftMLP', ':Missing')], "has no 'Missing'"),
    (['bench', 'raftmlp_tiny', '--vs', STRIP], 'could not be built as raftmlp_tiny'),
])
def test_bad_official_references_are_clear_errors(argv, message, capsys):
    assert main(argv + ['--repeats', '1', '--warmup', '0']) == 2
    assert message in capsys.readouterr().err


def test_an_official_model_with_other_keys_or_other_logits_is_refused(tmp_path, capsys):
    (tmp_path / 'other_keys.py').write_text('from torch import nn\n\ndef RaftMLP(**kwargs):\n'
                                            '    return nn.Linear(2, 2)\n')
    (tmp_path / 'other_logits.py').write_text(
        'import sys\nsys.path.insert(0, %r)\nfrom reference_raftmlp import RaftMLP as _R\n\n'
        'def RaftMLP(**kwargs):\n    m = _R(**kwargs)\n    f = m.forward\n    m.forward = lambda x: f(x) + 1\n'
        '    return m\n' % str(TESTS))
    assert main(['bench', 'raftmlp_tiny', '--vs', f'official:{tmp_path / "other_keys.py"}']) == 2
    assert 'does not take raftmlp_tiny' in capsys.readouterr().err
    assert main(['bench', 'raftmlp_tiny', '--vs', f'official:{tmp_path / "other_logits.py"}']) == 2
    assert 'gives other logits' in capsys.readouterr().err
